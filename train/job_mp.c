/* The training loop's model-parallel engine: tensor parallelism over the mesh's tp groups, a pipeline over
 * its pp groups (GPipe or 1F1B over the step's micro-batches; one stage when pp = 1) and data parallelism
 * over its dp groups, all from parallel/parallel3d.h, driven phase by phase by the loop. Gradients are
 * averaged over dp by a data-parallel engine (parallel.engine: DDP, ZeRO-1/2/3) holding only this stage's
 * parameters, or by one built-in all-reduce (parallel.dp_reduce). Checkpoints map each tensor-parallel
 * shard (and each engine shard of it) to boxes of the global tensor and are written by the copy that
 * counts in the norm (the owning stage, tp rank 0 for replicated parameters, dp rank 0 or the ZeRO owner),
 * so any layout can read them.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "train/job_impl.h"
#include "train/job_pieces.h"
#include "parallel/engine_impl.h"
#include "parallel/parallel3d.h"
#include "runtime/mesh.h"
#include "runtime/trace.h"

typedef struct {
    mt_par3d_t p3;
    mt_model_t model;
    mt_pipeline_t pl;
    bool sgd;
    int tp_size, tp_rank, dp_rank;
    mt_comm_t tp_comm;           /* p3's */
    const mt_tp_ops_t *tp_inner; /* parallel/tp.c's seam; the model gets tp_traced, which times it */
    mt_tp_ops_t tp_traced;
    double comm_s; /* blocked in tp collectives and pipeline messages since take_comm_s */
    char desc[160];
} mp_ctx_t;

static void mp_free(void *ctx) {
    mp_ctx_t *c = ctx;
    if (c) {
        mt_par3d_free(c->p3);
        free(c);
    }
}

/* ---- the tensor-parallel seam, timed and (while tracing) with spans: op, group, bytes, sequence ------- */

static void tp_done(mp_ctx_t *c, const char *op, size_t bytes, double w0, double t0) {
    c->comm_s += mt_now() - w0;
    if (t0 > 0.0) {
        char args[160];
        snprintf(args, sizeof(args), "\"op\": \"%s\", \"group\": \"tp\", \"bytes\": %zu, \"seq\": %llu", op, bytes,
                 (unsigned long long)mt_comm_seq_issued(c->tp_comm));
        mt_trace_span("comm", op, t0, mt_trace_now_us(), args);
    }
}

#define TP_BEGIN() double w0 = mt_now(), t0 = mt_trace_on() ? mt_trace_now_us() : 0.0

static mt_status_t tp_all_reduce_sum(void *ctx, float *buf, size_t count) {
    mp_ctx_t *c = ctx;
    TP_BEGIN();
    mt_status_t st = c->tp_inner->all_reduce_sum(c->tp_inner->ctx, buf, count);
    tp_done(c, "tp all_reduce", count * sizeof(float), w0, t0);
    return st;
}

static mt_status_t tp_all_gather(void *ctx, const float *send, float *recv, size_t count) {
    mp_ctx_t *c = ctx;
    TP_BEGIN();
    mt_status_t st = c->tp_inner->all_gather(c->tp_inner->ctx, send, recv, count);
    tp_done(c, "tp all_gather", count * sizeof(float), w0, t0);
    return st;
}

static mt_status_t tp_reduce_scatter_sum(void *ctx, const float *send, float *recv, size_t count) {
    mp_ctx_t *c = ctx;
    TP_BEGIN();
    mt_status_t st = c->tp_inner->reduce_scatter_sum(c->tp_inner->ctx, send, recv, count);
    tp_done(c, "tp reduce_scatter", count * sizeof(float) * (size_t)c->tp_size, w0, t0);
    return st;
}

static mt_status_t tp_all_reduce_max(void *ctx, float *buf, size_t count) {
    mp_ctx_t *c = ctx;
    TP_BEGIN();
    mt_status_t st = c->tp_inner->all_reduce_max(c->tp_inner->ctx, buf, count);
    tp_done(c, "tp all_reduce_max", count * sizeof(float), w0, t0);
    return st;
}

/* ---- set-up -------------------------------------------------------------------------------------------- */

/* parallel.* / train.* / optimizer.* -> parallel3d's parameters over the job's mesh. parallel.dp_reduce:
 * "engine" averages over dp with parallel.engine, "allreduce" with the built-in all-reduce, "auto" with
 * the engine when dp > 1 and not at all (the stage's own storage, no reduction) when dp = 1. */
static mt_status_t params_from_config(const mt_job_info_t *info, const mt_model_config_t *mc, mt_par3d_params_t *p) {
    const mt_parallel_settings_t *par = &info->set->par;
    const mt_mesh_t *mesh = info->mesh;
    p->tp = mt_mesh_axis_size(mesh, MT_AXIS_TP);
    p->pp = mt_mesh_axis_size(mesh, MT_AXIS_PP);
    p->dp = mt_mesh_axis_size(mesh, MT_AXIS_DP);
    p->mesh = mesh;
    p->schedule = par->schedule;
    p->microbatches = (int)info->grad_accum;
    p->micro_batch = (int)info->micro_batch;
    p->seq_len = mc->seq_len;
    p->stage_layers = par->stage_layers;
    p->sequence_parallel = par->sequence_parallel && p->tp > 1;
    p->engine_kind = par->engine;
    p->zero_stage = par->zero_stage;
    p->bucket_mb = par->bucket_mb;
    p->persist_threshold = par->persist_threshold;
    p->grad_clip = info->set->grad_clip;
    p->dp_mode = mt_settings_dp_engine(par, p->dp) ? MT_P3D_ENGINE : MT_P3D_ALLREDUCE;
    p->optim = info->set->optim;
    return MT_OK; /* parallel.microbatches = train.grad_accum (or 0): the config's load checked it */
}

static mt_status_t mp_setup_model(const mt_job_info_t *info, mt_model_config_t *mc, void **ctx) {
    *ctx = NULL;
    if (!info->mesh) {
        return mt_error(MT_ERR_INVALID_ARG, "model-parallel engine: the job has no device mesh (opts.mesh)");
    }
    mp_ctx_t *c = calloc(1, sizeof(*c));
    if (!c) {
        return mt_error(MT_ERR_OOM, "model-parallel engine: out of memory");
    }
    *ctx = c;
    mt_par3d_params_t p = MT_PAR3D_PARAMS_INIT;
    MT_CHECK(params_from_config(info, mc, &p));
    MT_CHECK(mt_par3d_setup(info->comm, mc, &p, &c->p3));
    int coords[MT_AXIS_N];
    mt_par3d_coords(c->p3, coords);
    c->tp_size = p.tp;
    c->tp_rank = coords[MT_AXIS_TP];
    c->dp_rank = coords[MT_AXIS_DP];
    c->tp_comm = mt_par3d_comm(c->p3, MT_AXIS_TP);
    if (mc->tp_ops) { /* the same seam, timed; NULL entries stay NULL */
        c->tp_inner = mc->tp_ops;
        c->tp_traced = *mc->tp_ops;
        c->tp_traced.ctx = c;
        c->tp_traced.all_reduce_sum = c->tp_inner->all_reduce_sum ? tp_all_reduce_sum : NULL;
        c->tp_traced.all_gather = c->tp_inner->all_gather ? tp_all_gather : NULL;
        c->tp_traced.reduce_scatter_sum = c->tp_inner->reduce_scatter_sum ? tp_reduce_scatter_sum : NULL;
        c->tp_traced.all_reduce_max = c->tp_inner->all_reduce_max ? tp_all_reduce_max : NULL;
        mc->tp_ops = &c->tp_traced;
    }
    return MT_OK;
}

static mt_status_t mp_init(const mt_job_info_t *info, void **ctx) {
    mp_ctx_t *c = *ctx;
    if (!c) {
        return mt_error(MT_ERR_INTERNAL, "model-parallel engine: init without setup_model");
    }
    c->model = info->model;
    c->sgd = info->optim.kind == MT_OPTIM_SGD;
    MT_CHECK(mt_par3d_attach(c->p3, c->model));
    int wrank = 0;
    MPI_Comm_rank(info->comm, &wrank);
    if (c->tp_size > 1 && wrank == 0 && info->set->par.tp_comm_chunks_set) {
        MT_WARN("parallel.tp_comm_chunks = %d applies to the GPU engine only (runtime.device = \"cuda\"): the CPU "
                "tensor-parallel engine sends each collective whole",
                info->set->par.tp_comm_chunks);
    }
    c->pl = mt_par3d_pipeline(c->p3);
    mt_engine_t e = mt_par3d_engine(c->p3);
    int dp = mt_comm_size(mt_par3d_comm(c->p3, MT_AXIS_DP));
    snprintf(c->desc, sizeof(c->desc), "tp %d x pp %d (%s), dp %d by %s%s%s", c->tp_size,
             mt_pipeline_n_stages(c->pl), mt_pp_schedule_name(info->set->par.schedule), dp,
             e ? "the " : "", e ? mt_engine_name(e) : dp > 1 ? "one all-reduce per step" : "nothing (one replica)",
             e ? " engine over each stage's parameters" : "");
    return MT_OK;
}

static const char *mp_describe(void *ctx) {
    return ((mp_ctx_t *)ctx)->desc;
}

/* ---- the step ------------------------------------------------------------------------------------------ */

static mt_status_t mp_zero_grads(void *ctx) {
    return mt_par3d_zero_grads(((mp_ctx_t *)ctx)->p3);
}

/* The schedule over the batch's micro-batches (the first stage reads the tokens, the last the targets);
 * without backward, forward only: *loss is this dp rank's mean loss on every stage. */
static mt_status_t mp_run_batch(void *ctx, const mt_batch_t *b, bool backward, double *loss) {
    mp_ctx_t *c = ctx;
    float l = 0.0f;
    if (!backward) {
        MT_CHECK(mt_pipeline_eval(c->pl, b->inputs, b->targets, &l));
    } else {
        MT_CHECK(mt_pipeline_step(c->pl, b->inputs, b->targets, &l));
        mt_pipeline_stats_t ps;
        mt_pipeline_stats(c->pl, &ps);
        c->comm_s += ps.comm_wait_s;
    }
    *loss = (double)l;
    return MT_OK;
}

static double mp_take_comm_s(void *ctx) {
    mp_ctx_t *c = ctx;
    double s = c->comm_s;
    c->comm_s = 0.0;
    return s;
}

static mt_status_t mp_finish_grads(void *ctx) {
    return mt_par3d_finish_grads(((mp_ctx_t *)ctx)->p3);
}

static mt_status_t mp_grad_sumsq(void *ctx, double *total) {
    return mt_par3d_grad_sumsq(((mp_ctx_t *)ctx)->p3, total);
}

static mt_status_t mp_step(void *ctx, float lr, float grad_scale) {
    return mt_par3d_apply(((mp_ctx_t *)ctx)->p3, lr, grad_scale);
}

static mt_status_t mp_reduce_loss(void *ctx, double *loss) {
    return mt_par3d_reduce_loss(((mp_ctx_t *)ctx)->p3, loss);
}

/* The step's bytes (mt_par3d_comm_bytes): model = what the parallel layout moves (tp collectives, pipeline
 * activations and gradients with the tied all-reduce, dp gradients and parameters), other = the scalars. */
static void mp_comm_bytes(void *ctx, double *model, double *other) {
    mt_par3d_bytes_t b;
    mt_par3d_comm_bytes(((mp_ctx_t *)ctx)->p3, &b);
    *model = b.tp + b.pp + b.dp;
    *other = b.other;
}

static void mp_comm_bytes_groups(void *ctx, double *tp, double *pp, double *dp) {
    mt_par3d_bytes_t b;
    mt_par3d_comm_bytes(((mp_ctx_t *)ctx)->p3, &b);
    *tp = b.tp;
    *pp = b.pp;
    *dp = b.dp;
}

/* ---- checkpoint pieces --------------------------------------------------------------------------------- */

/* The built-in path's storage: the stage's parameters whole (tp shards), one optimizer tensor each. */
static mt_status_t stage_pieces(mp_ctx_t *c, bool save, mt_ckpt_piece_t **pieces, int *n) {
    mt_plist_t l = {0};
    mt_status_t st = MT_OK;
    mt_optim_t opt = mt_par3d_optim(c->p3);
    int k = 0; /* optimizer tensor index: the needed parameters in order */
    for (int i = 0; i < mt_model_n_params(c->model) && st == MT_OK; i++) {
        mt_param_t *p = mt_model_param(c->model, i);
        unsigned f = mt_par3d_param_flags(c->p3, i);
        if (!(f & MT_ENGINE_PARAM_HELD)) {
            continue;
        }
        const char *name = NULL;
        size_t on = 0;
        float *m = NULL, *v = NULL;
        st = mt_optim_state(opt, k++, &name, &on, &m, &v);
        if (st == MT_OK && (on != p->numel || strcmp(name, p->name) != 0)) {
            st = mt_error(MT_ERR_INTERNAL, "checkpoint: optimizer tensor %d is %s, expected %s", k - 1, name, p->name);
        }
        if (st != MT_OK || (save && !(c->dp_rank == 0 && (f & MT_ENGINE_PARAM_NORM)))) {
            continue;
        }
        st = mt_plist_push_flat(&l, "param", p, c->tp_size, c->tp_rank, 0, p->numel, p->data);
        if (st == MT_OK && m) {
            st = mt_plist_push_flat(&l, c->sgd ? "sgd.momentum" : "adamw.m", p, c->tp_size, c->tp_rank, 0, p->numel,
                                    m);
        }
        if (st == MT_OK && v && !c->sgd) {
            st = mt_plist_push_flat(&l, "adamw.v", p, c->tp_size, c->tp_rank, 0, p->numel, v);
        }
    }
    if (st != MT_OK) {
        free(l.v);
        return st;
    }
    *pieces = l.v;
    *n = l.n;
    return MT_OK;
}

static mt_status_t mp_ckpt_pieces(void *ctx, bool save, mt_ckpt_piece_t **pieces, int *n) {
    mp_ctx_t *c = ctx;
    mt_engine_t e = mt_par3d_engine(c->p3);
    if (!e) {
        return stage_pieces(c, save, pieces, n);
    }
    int np = mt_model_n_params(c->model);
    uint8_t *flags = malloc((size_t)MT_MAX(np, 1));
    if (!flags) {
        return mt_error(MT_ERR_OOM, "checkpoint: out of memory");
    }
    for (int i = 0; i < np; i++) {
        flags[i] = (uint8_t)mt_par3d_param_flags(c->p3, i);
    }
    mt_status_t st = mt_job_engine_pieces(e, save, c->tp_size, c->tp_rank, flags, pieces, n);
    free(flags);
    return st;
}

static int64_t mp_ckpt_get_step(void *ctx) {
    mt_optim_t o = mt_par3d_optim(((mp_ctx_t *)ctx)->p3);
    return o ? mt_optim_get_step(o) : 0;
}

static void mp_ckpt_set_step(void *ctx, int64_t t) {
    mt_optim_t o = mt_par3d_optim(((mp_ctx_t *)ctx)->p3);
    if (o) {
        mt_optim_set_step(o, t);
    }
}

static mt_status_t mp_ckpt_loaded(void *ctx) {
    mt_engine_t e = mt_par3d_engine(((mp_ctx_t *)ctx)->p3);
    return e && e->stage == 3 ? eng_release_all_params(e) : MT_OK; /* no gathered copy may predate the load */
}

#define MP_ENGINE_FIELDS                                                                                               \
    .init = mp_init, .zero_grads = mp_zero_grads, .finish_grads = mp_finish_grads, .grad_sumsq = mp_grad_sumsq,        \
    .step = mp_step, .reduce_loss = mp_reduce_loss, .free = mp_free, .ckpt_pieces = mp_ckpt_pieces,                    \
    .ckpt_get_step = mp_ckpt_get_step, .ckpt_set_step = mp_ckpt_set_step, .ckpt_loaded = mp_ckpt_loaded,               \
    .setup_model = mp_setup_model, .run_batch = mp_run_batch, .take_comm_s = mp_take_comm_s, .describe = mp_describe,  \
    .comm_bytes = mp_comm_bytes, .comm_bytes_groups = mp_comm_bytes_groups, .own_activations = true /* the pipeline's */

static const mt_job_engine_t tp_engine = {.name = "tensor-parallel", MP_ENGINE_FIELDS};
static const mt_job_engine_t pp_engine = {.name = "pipeline", MP_ENGINE_FIELDS};

const mt_job_engine_t *mt_job_engine_model_parallel(int pp) {
    return pp > 1 ? &pp_engine : &tp_engine;
}
