/* The training loop's model-parallel engine: tensor parallelism (parallel/tp.h: the Megatron-sharded
 * GPT-2 behind the model's tp seam) and pipeline parallelism (parallel/pipeline.h: GPipe or 1F1B over
 * the step's micro-batches), composed with data parallelism by one averaging all-reduce of the stage's
 * gradients per step. Communicators come from the job's mesh: tp, pp, dp, the embedding group (first
 * and last stage) and tp x pp for the global gradient norm. Checkpoints map each tensor-parallel shard
 * to its boxes of the global tensor (one box per tp_parts block) and are written by dp rank 0 of the
 * stage that owns the parameter (replicated ones by tp rank 0), so any layout can read them.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "job_impl.h"
#include "parallel/pipeline.h"
#include "parallel/tp.h"
#include "parallel/tp_wait.h"
#include "runtime/mesh.h"
#include "runtime/trace.h"

typedef struct {
    const mt_job_info_t *info;
    mt_comm_t tp_comm, pp_comm, dp_comm, emb_comm, tppp_comm;
    mt_tp_t tp;
    bool sp; /* sequence parallelism */
    int tp_size, tp_rank, pp_size, stage, dp_size, dp_rank;
    mt_model_t model;
    mt_pipeline_t pl;
    mt_optim_t opt;
    bool sgd;
    float *gbuf; /* the stage's gradients packed for the dp all-reduce */
    size_t gbuf_n;
    const mt_tp_ops_t *tp_inner; /* parallel/tp.c's seam; the model gets tp_traced, which adds trace spans */
    mt_tp_ops_t tp_traced;
    double comm_s;       /* blocked in tp collectives and pipeline messages since take_comm_s */
    mt_acts_t eval_acts; /* pipeline evaluation: forward only, one micro-batch at a time */
    float *eval_in, *eval_out;
} mp_ctx_t;

/* Waits for a collective this engine issued (mt_mp_wait) and, while tracing, records it as a span
 * with its operation, group, bytes and sequence number. t0 is the trace clock before the call. */
static mt_status_t traced_wait(mt_status_t issued, mt_work_t *w, mt_comm_t comm, const char *op, size_t bytes,
                               double t0) {
    uint64_t seq = issued == MT_OK && *w ? mt_work_seq(*w) : 0;
    mt_status_t st = mt_mp_wait(issued, w, -1.0);
    if (mt_trace_on() && t0 > 0.0) {
        char args[160];
        snprintf(args, sizeof(args), "\"op\": \"%s\", \"group\": \"%s\", \"bytes\": %zu, \"seq\": %llu", op,
                 mt_comm_name(comm), bytes, (unsigned long long)seq);
        mt_trace_span("comm", op, t0, mt_trace_now_us(), args);
    }
    return st;
}

#define TRACE_T0() (mt_trace_on() ? mt_trace_now_us() : 0.0)

static void mp_free(void *ctx) {
    mp_ctx_t *c = ctx;
    if (!c) {
        return;
    }
    mt_pipeline_free(c->pl);
    mt_optim_free(c->opt);
    mt_acts_free(c->eval_acts);
    mt_free(c->eval_in);
    mt_free(c->eval_out);
    mt_free(c->gbuf);
    mt_tp_free(c->tp);
    mt_comm_free(c->emb_comm);
    mt_comm_free(c->tppp_comm);
    mt_comm_free(c->tp_comm);
    mt_comm_free(c->pp_comm);
    mt_comm_free(c->dp_comm);
    free(c);
}

static bool needs(const mp_ctx_t *c, int i) {
    return !c->pl || mt_pipeline_needs_param(c->pl, i);
}

static bool owns(const mp_ctx_t *c, int i) {
    return !c->pl || mt_pipeline_owns_param(c->pl, i);
}

/* ---- the tensor-parallel seam with trace spans (op, group, bytes, sequence number) ------------------- */

static void tp_span(mp_ctx_t *c, const char *op, size_t bytes, double t0) {
    char args[160];
    snprintf(args, sizeof(args), "\"op\": \"%s\", \"group\": \"tp\", \"bytes\": %zu, \"seq\": %llu", op, bytes,
             (unsigned long long)mt_comm_seq_issued(c->tp_comm));
    mt_trace_span("comm", op, t0, mt_trace_now_us(), args);
}

static mt_status_t tp_all_reduce_sum(void *ctx, float *buf, size_t count) {
    mp_ctx_t *c = ctx;
    double w0 = mt_now();
    if (!mt_trace_on()) {
        mt_status_t st = c->tp_inner->all_reduce_sum(c->tp_inner->ctx, buf, count);
        c->comm_s += mt_now() - w0;
        return st;
    }
    double t0 = mt_trace_now_us();
    mt_status_t st = c->tp_inner->all_reduce_sum(c->tp_inner->ctx, buf, count);
    c->comm_s += mt_now() - w0;
    tp_span(c, "tp all_reduce", count * sizeof(float), t0);
    return st;
}

static mt_status_t tp_all_gather(void *ctx, const float *send, float *recv, size_t count) {
    mp_ctx_t *c = ctx;
    double w0 = mt_now();
    if (!mt_trace_on()) {
        mt_status_t st = c->tp_inner->all_gather(c->tp_inner->ctx, send, recv, count);
        c->comm_s += mt_now() - w0;
        return st;
    }
    double t0 = mt_trace_now_us();
    mt_status_t st = c->tp_inner->all_gather(c->tp_inner->ctx, send, recv, count);
    c->comm_s += mt_now() - w0;
    tp_span(c, "tp all_gather", count * sizeof(float), t0);
    return st;
}

static mt_status_t tp_reduce_scatter_sum(void *ctx, const float *send, float *recv, size_t count) {
    mp_ctx_t *c = ctx;
    double w0 = mt_now();
    if (!mt_trace_on()) {
        mt_status_t st = c->tp_inner->reduce_scatter_sum(c->tp_inner->ctx, send, recv, count);
        c->comm_s += mt_now() - w0;
        return st;
    }
    double t0 = mt_trace_now_us();
    mt_status_t st = c->tp_inner->reduce_scatter_sum(c->tp_inner->ctx, send, recv, count);
    c->comm_s += mt_now() - w0;
    tp_span(c, "tp reduce_scatter", count * sizeof(float) * (size_t)c->tp_size, t0);
    return st;
}

static mt_status_t tp_all_reduce_max(void *ctx, float *buf, size_t count) {
    mp_ctx_t *c = ctx;
    double w0 = mt_now();
    if (!mt_trace_on()) {
        mt_status_t st = c->tp_inner->all_reduce_max(c->tp_inner->ctx, buf, count);
        c->comm_s += mt_now() - w0;
        return st;
    }
    double t0 = mt_trace_now_us();
    mt_status_t st = c->tp_inner->all_reduce_max(c->tp_inner->ctx, buf, count);
    c->comm_s += mt_now() - w0;
    tp_span(c, "tp all_reduce_max", count * sizeof(float), t0);
    return st;
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
    const mt_mesh_t *mesh = info->mesh;
    c->info = info;
    c->tp_size = mt_mesh_axis_size(mesh, MT_AXIS_TP);
    c->pp_size = mt_mesh_axis_size(mesh, MT_AXIS_PP);
    c->dp_size = mt_mesh_axis_size(mesh, MT_AXIS_DP);
    c->sp = mt_config_bool(info->cfg, "parallel.sequence_parallel") && c->tp_size > 1;
    int rank = 0;
    MT_MPI_CHECK(MPI_Comm_rank(info->comm, &rank));
    int coords[MT_AXIS_N];
    mt_mesh_coords(mesh, rank, coords);
    c->tp_rank = coords[MT_AXIS_TP];
    c->stage = coords[MT_AXIS_PP];
    c->dp_rank = coords[MT_AXIS_DP];
    mt_comm_params_t cp = MT_COMM_PARAMS_INIT;
    MT_CHECK(mt_comm_init_mesh(info->comm, mesh, MT_AXIS_BIT(MT_AXIS_TP), &cp, &c->tp_comm));
    MT_CHECK(mt_comm_init_mesh(info->comm, mesh, MT_AXIS_BIT(MT_AXIS_PP), &cp, &c->pp_comm));
    MT_CHECK(mt_comm_init_mesh(info->comm, mesh, MT_AXIS_BIT(MT_AXIS_DP), &cp, &c->dp_comm));
    MT_CHECK(
        mt_comm_init_mesh(info->comm, mesh, MT_AXIS_BIT(MT_AXIS_TP) | MT_AXIS_BIT(MT_AXIS_PP), &cp, &c->tppp_comm));
    int er[2];
    if (mt_mesh_embedding_group(mesh, rank, er) == 2 && (er[0] == rank || er[1] == rank)) {
        cp.name = "emb";
        MT_CHECK(mt_comm_init_ranks(info->comm, er, 2, &cp, &c->emb_comm));
    }
    MT_CHECK(mt_tp_init(c->tp_comm, &c->tp));
    mt_tp_model_config(c->tp, c->sp, mc);
    if (mc->tp_ops) { /* the same seam, traced; NULL entries stay NULL */
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

static mt_status_t sp_grads_ready(void *arg, int module) {
    mp_ctx_t *c = arg;
    return mt_tp_sync_module_grads(c->tp, c->model, module, true);
}

static mt_status_t mp_init(const mt_job_info_t *info, void **ctx) {
    mp_ctx_t *c = *ctx;
    if (!c) {
        return mt_error(MT_ERR_INTERNAL, "model-parallel engine: init without setup_model");
    }
    const mt_config_t *cfg = info->cfg;
    const char *kind = mt_config_str(cfg, "parallel.engine");
    if (strcmp(kind, "ddp") != 0 && c->dp_size > 1) { /* with dp = 1 there is nothing to choose */
        return mt_error(MT_ERR_INVALID_ARG,
                        "parallel.engine = \"%s\" with parallel.tp = %d, parallel.pp = %d: with tensor or pipeline "
                        "parallelism the training loop averages gradients over dp with one all-reduce per step "
                        "(set parallel.engine = \"ddp\"; ZeRO and DP run with tp = pp = 1)",
                        kind, c->tp_size, c->pp_size);
    }
    int64_t mb = mt_config_int(cfg, "parallel.microbatches");
    if (mb > 0 && mb != info->grad_accum) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "parallel.microbatches = %lld but the step has train.grad_accum = %lld micro-batches per "
                        "rank: make them agree (or leave parallel.microbatches = 0)",
                        (long long)mb, (long long)info->grad_accum);
    }
    c->model = info->model;
    c->sgd = info->optim.kind == MT_OPTIM_SGD;
    if (c->pp_size > 1) {
        mt_pipeline_params_t pp = MT_PIPELINE_PARAMS_INIT;
        if (!mt_pp_schedule_parse(mt_config_str(cfg, "parallel.schedule"), &pp.schedule)) {
            return mt_error(MT_ERR_INVALID_ARG, "parallel.schedule = \"%s\": expected \"gpipe\" or \"1f1b\"",
                            mt_config_str(cfg, "parallel.schedule"));
        }
        pp.microbatches = (int)info->grad_accum;
        pp.micro_batch = (int)info->micro_batch;
        pp.seq_len = (int)info->seq_len;
        pp.stage_layers = mt_config_str(cfg, "parallel.stage_layers");
        if (c->sp) {
            pp.grads_ready = sp_grads_ready;
            pp.grads_ready_arg = c;
        }
        MT_CHECK(mt_pipeline_init(c->model, c->pp_comm, c->emb_comm, &pp, &c->pl));
        MT_CHECK(mt_pipeline_alloc_params(c->pl));
    } else {
        MT_CHECK(mt_model_alloc_params(c->model));
        MT_CHECK(mt_model_alloc_grads(c->model));
        mt_model_init_weights(c->model);
    }
    MT_CHECK(mt_optim_init(&info->optim, &c->opt));
    for (int i = 0; i < mt_model_n_params(c->model); i++) {
        mt_param_t *p = mt_model_param(c->model, i);
        if (needs(c, i)) {
            MT_CHECK(mt_optim_add(c->opt, p->name, p->data, p->grad, p->numel, p->is_weight2d, NULL));
            c->gbuf_n += p->numel;
        }
    }
    if (c->dp_size > 1) {
        c->gbuf = mt_alloc(c->gbuf_n * sizeof(float), MT_MEM_COMM, "job dp gradients");
        if (!c->gbuf) {
            return mt_error(MT_ERR_OOM, "model-parallel engine: cannot allocate %zu bytes for the dp all-reduce",
                            c->gbuf_n * sizeof(float));
        }
    }
    return MT_OK;
}

static mt_status_t mp_zero_grads(void *ctx) {
    mp_ctx_t *c = ctx;
    mt_model_zero_grads(c->model);
    return MT_OK;
}

/* Forward only through the pipeline, one micro-batch at a time: receive the activation from the previous
 * stage, run this stage's modules, send to the next; the last stage's mean loss is broadcast over pp. */
static mt_status_t pipeline_eval(mp_ctx_t *c, const mt_batch_t *b, double *loss) {
    const mt_job_info_t *info = c->info;
    int lo = 0, hi = 0, n = mt_model_n_modules(c->model);
    mt_pipeline_range(c->pl, &lo, &hi);
    int64_t B = info->micro_batch, T = info->seq_len, W = mt_model_act_width(c->model);
    size_t act = (size_t)(B * T * W);
    if (!c->eval_acts) {
        MT_CHECK(mt_acts_init(c->model, (int)B, (int)T, &c->eval_acts));
        c->eval_in = mt_alloc(act * sizeof(float), MT_MEM_ACTIVATIONS, "job pipeline eval");
        c->eval_out = mt_alloc(act * sizeof(float), MT_MEM_ACTIVATIONS, "job pipeline eval");
        if (!c->eval_in || !c->eval_out) {
            return mt_error(MT_ERR_OOM, "pipeline evaluation: cannot allocate 2 x %zu bytes", act * sizeof(float));
        }
    }
    double sum = 0.0;
    mt_work_t w = NULL;
    for (int64_t k = 0; k < info->grad_accum; k++) {
        const int32_t *tok = b->inputs + k * B * T, *tgt = b->targets + k * B * T;
        if (lo > 0) {
            double t0 = TRACE_T0();
            MT_CHECK(traced_wait(mt_coll_recv(c->pp_comm, c->eval_in, act, MT_COLL_F32, c->stage - 1, NULL, &w), &w,
                                 c->pp_comm, "eval recv", act * sizeof(float), t0));
        }
        float l = 0.0f;
        MT_CHECK(mt_model_forward(c->model, c->eval_acts, lo, hi, lo == 0 ? tok : NULL, hi == n ? tgt : NULL,
                                  lo > 0 ? c->eval_in : NULL, hi < n ? c->eval_out : NULL, hi == n ? &l : NULL));
        if (hi < n) {
            double t0 = TRACE_T0();
            MT_CHECK(traced_wait(mt_coll_send(c->pp_comm, c->eval_out, act, MT_COLL_F32, c->stage + 1, NULL, &w), &w,
                                 c->pp_comm, "eval send", act * sizeof(float), t0));
        }
        sum += (double)l;
    }
    double mean = sum / (double)info->grad_accum;
    double t0 = TRACE_T0();
    MT_CHECK(traced_wait(mt_coll_broadcast(c->pp_comm, &mean, &mean, 1, MT_COLL_F64, c->pp_size - 1, NULL, &w), &w,
                         c->pp_comm, "broadcast", sizeof(double), t0));
    *loss = mean;
    return MT_OK;
}

static mt_status_t mp_run_batch(void *ctx, const mt_batch_t *b, bool backward, double *loss) {
    mp_ctx_t *c = ctx;
    if (!backward) {
        return pipeline_eval(c, b, loss);
    }
    float l = 0.0f;
    MT_CHECK(mt_pipeline_step(c->pl, b->inputs, b->targets, &l));
    mt_pipeline_stats_t ps;
    mt_pipeline_stats(c->pl, &ps);
    c->comm_s += ps.comm_wait_s;
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
    mp_ctx_t *c = ctx;
    if (c->sp && !c->pl) { /* replicated parameters saw only this rank's rows */
        MT_CHECK(mt_tp_finish_grads(c->tp, c->model, true));
    }
    if (c->dp_size == 1) {
        return MT_OK;
    }
    int np = mt_model_n_params(c->model);
    size_t off = 0;
    for (int i = 0; i < np; i++) {
        const mt_param_t *p = mt_model_param(c->model, i);
        if (needs(c, i)) {
            memcpy(c->gbuf + off, p->grad, p->numel * sizeof(float));
            off += p->numel;
        }
    }
    mt_work_t w = NULL;
    double t0 = TRACE_T0();
    MT_CHECK(traced_wait(mt_coll_all_reduce(c->dp_comm, c->gbuf, c->gbuf, off, MT_COLL_F32, MT_REDOP_AVG, NULL, &w), &w,
                         c->dp_comm, "all_reduce", off * sizeof(float), t0));
    off = 0;
    for (int i = 0; i < np; i++) {
        mt_param_t *p = mt_model_param(c->model, i);
        if (needs(c, i)) {
            memcpy(p->grad, c->gbuf + off, p->numel * sizeof(float));
            off += p->numel;
        }
    }
    return MT_OK;
}

/* Every element of the model's gradient counted once: tp shards summed over tp, replicated parameters
 * from tp rank 0 only, each parameter on the stage that owns it (the tied copy on the last stage is not
 * counted); dp replicas are equal after the all-reduce, so the sum runs over tp x pp. */
static mt_status_t mp_grad_sumsq(void *ctx, double *total) {
    mp_ctx_t *c = ctx;
    double s = 0.0;
    for (int i = 0; i < mt_model_n_params(c->model); i++) {
        const mt_param_t *p = mt_model_param(c->model, i);
        if (needs(c, i) && owns(c, i) && (p->tp_dim >= 0 || c->tp_rank == 0)) {
            s += mt_clip_sumsq(p->grad, p->numel);
        }
    }
    mt_work_t w = NULL;
    double t0 = TRACE_T0();
    MT_CHECK(traced_wait(mt_coll_all_reduce(c->tppp_comm, &s, &s, 1, MT_COLL_F64, MT_REDOP_SUM, NULL, &w), &w,
                         c->tppp_comm, "all_reduce", sizeof(double), t0));
    *total = s;
    return MT_OK;
}

static mt_status_t mp_step(void *ctx, float lr, float grad_scale) {
    return mt_optim_step(((mp_ctx_t *)ctx)->opt, lr, grad_scale);
}

static mt_status_t mp_reduce_loss(void *ctx, double *loss) {
    mp_ctx_t *c = ctx;
    if (c->dp_size == 1) {
        return MT_OK;
    }
    mt_work_t w = NULL;
    double t0 = TRACE_T0();
    return traced_wait(mt_coll_all_reduce(c->dp_comm, loss, loss, 1, MT_COLL_F64, MT_REDOP_AVG, NULL, &w), &w,
                       c->dp_comm, "all_reduce", sizeof(double), t0);
}

/* ---- checkpoint pieces --------------------------------------------------------------------------- */

typedef struct {
    mt_ckpt_piece_t *v;
    int n, cap;
} plist_t;

/* The boxes of the global tensor that this rank's local copy buf (the parameter's local layout) holds:
 * one per tp_parts block along tp_dim (rank r holds rows/columns [k*pl*tp + r*pl, +pl) of block k, the
 * layout mt_tp_gather_shard assembles), or the whole tensor when it is replicated. */
static mt_status_t push_param(plist_t *l, const mp_ctx_t *c, const char *kind, const mt_param_t *p, float *buf) {
    int parts = p->tp_dim >= 0 && c->tp_size > 1 ? MT_MAX(p->tp_parts, 1) : 1;
    for (int k = 0; k < parts; k++) {
        if (l->n == l->cap) {
            int cap = l->cap ? 2 * l->cap : 64;
            mt_ckpt_piece_t *v = realloc(l->v, (size_t)cap * sizeof(*v));
            if (!v) {
                return mt_error(MT_ERR_OOM, "checkpoint: out of memory listing pieces");
            }
            l->v = v;
            l->cap = cap;
        }
        mt_ckpt_piece_t *pc = &l->v[l->n++];
        memset(pc, 0, sizeof(*pc));
        snprintf(pc->tensor, sizeof(pc->tensor), "%s/%s", kind, p->name);
        pc->ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) {
            pc->shape[d] = p->global_shape[d];
            pc->lo[d] = 0;
            pc->hi[d] = p->global_shape[d];
        }
        pc->data = buf;
        if (p->tp_dim < 0 || c->tp_size == 1) {
            continue;
        }
        int d = p->tp_dim;
        int64_t pl = p->shape[d] / parts, g0 = (int64_t)k * pl * c->tp_size + (int64_t)c->tp_rank * pl;
        pc->lo[d] = g0;
        pc->hi[d] = g0 + pl;
        if (d == 0) {
            pc->data = buf + (size_t)(k * pl) * (size_t)(p->ndim == 2 ? p->shape[1] : 1);
        } else {
            pc->data = buf + k * pl;
            pc->ld = p->shape[1]; /* the local rows are wider than the box */
        }
    }
    return MT_OK;
}

static mt_status_t mp_ckpt_pieces(void *ctx, bool save, mt_ckpt_piece_t **pieces, int *n) {
    mp_ctx_t *c = ctx;
    plist_t l = {0};
    mt_status_t st = MT_OK;
    int k = 0; /* optimizer tensor index: the needed parameters in order */
    for (int i = 0; i < mt_model_n_params(c->model) && st == MT_OK; i++) {
        mt_param_t *p = mt_model_param(c->model, i);
        if (!needs(c, i)) {
            continue;
        }
        bool write = c->dp_rank == 0 && owns(c, i) && (p->tp_dim >= 0 || c->tp_rank == 0);
        const char *name = NULL;
        size_t on = 0;
        float *m = NULL, *v = NULL;
        st = mt_optim_state(c->opt, k++, &name, &on, &m, &v);
        if (st == MT_OK && (on != p->numel || strcmp(name, p->name) != 0)) {
            st = mt_error(MT_ERR_INTERNAL, "checkpoint: optimizer tensor %d is %s, expected %s", k - 1, name, p->name);
        }
        if (st != MT_OK || (save && !write)) {
            continue;
        }
        st = push_param(&l, c, "param", p, p->data);
        if (st == MT_OK && m) {
            st = push_param(&l, c, c->sgd ? "sgd.momentum" : "adamw.m", p, m);
        }
        if (st == MT_OK && v && !c->sgd) {
            st = push_param(&l, c, "adamw.v", p, v);
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

static int64_t mp_ckpt_get_step(void *ctx) {
    return mt_optim_get_step(((mp_ctx_t *)ctx)->opt);
}

static void mp_ckpt_set_step(void *ctx, int64_t t) {
    mt_optim_set_step(((mp_ctx_t *)ctx)->opt, t);
}

#define MP_ENGINE_FIELDS                                                                                               \
    .init = mp_init, .zero_grads = mp_zero_grads, .finish_grads = mp_finish_grads, .grad_sumsq = mp_grad_sumsq,        \
    .step = mp_step, .reduce_loss = mp_reduce_loss, .free = mp_free, .ckpt_pieces = mp_ckpt_pieces,                    \
    .ckpt_get_step = mp_ckpt_get_step, .ckpt_set_step = mp_ckpt_set_step, .setup_model = mp_setup_model,               \
    .take_comm_s = mp_take_comm_s

static const mt_job_engine_t tp_engine = {.name = "tensor-parallel", MP_ENGINE_FIELDS};
static const mt_job_engine_t pp_engine = {.name = "pipeline", MP_ENGINE_FIELDS, .run_batch = mp_run_batch};

const mt_job_engine_t *mt_job_engine_model_parallel(int pp) {
    return pp > 1 ? &pp_engine : &tp_engine;
}
