/* 3-D parallelism: checks a tp x pp x dp combination, builds the mesh's communicators, the sharded model,
 * the pipeline stage and the data-parallel gradient path, and runs one optimizer step across all three,
 * as phases the training loop (train/job_mp.c) drives one by one or mt_par3d_step runs together.
 * Order of gradient reductions in a step (each linear, so the result is the serial gradient):
 *   1. tp  (sequence parallelism only): replicated parameters, per module on the last backward pass
 *   2. emb (pp > 1): the tied embedding, first stage after its last embedding backward, last stage after
 *      the schedule
 *   3. dp: the engine's buckets (launched from its hooks, which run after 1 and 2) or one all-reduce
 * The global gradient norm: each rank sums the squares of what it owns, counting every element of the
 * serial model once (tp shards on every tp rank, replicated parameters on tp rank 0, the tied embedding on
 * the stage that owns it), reduced over dp (inside the engine), tp and pp.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/parallel3d.h"
#include "parallel/tp_wait.h"
#include "runtime/alloc.h"

struct mt_par3d {
    mt_par3d_params_t p;
    mt_mesh_t *mesh;
    bool own_mesh, own_model;
    int rank, coords[MT_AXIS_N];
    mt_comm_t comm[MT_AXIS_N], emb;
    mt_tp_t tp;
    mt_model_t model;
    uint8_t *flags; /* per parameter: MT_ENGINE_PARAM_* as this rank's stage and tp rank see it */
    mt_engine_t engine;
    mt_optim_t opt;
    mt_pipeline_t pl;
    mt_device_table_t dev; /* p.device, or the CPU table */
    float *gbuf;           /* built-in dp all-reduce: the stage's gradients packed */
    size_t gbuf_n;
    int64_t n_steps;  /* steps run */
    double grad_norm; /* of the last step, before clipping */
    bool skipped;     /* the last step's update was skipped (non-finite) */
    float *flat;      /* engine mode, dp rank 0: whole parameters for gathers, valid at flat_step */
    int64_t flat_step;
    bool sp_each_pass;             /* sequence parallelism with ZeRO-2/3: grads_ready runs after every backward pass */
    int *sp_pass;                  /* then per module: the passes of this step grads_ready has seen */
    int64_t tp_bytes0;             /* the tp handle's byte count at the step's start */
    double dp_bytes, scalar_bytes; /* this step: the built-in dp all-reduce; loss and norm scalars */
};

/* Per-rank bytes of an all-reduce of `bytes` over a group of n (the bus convention of parallel/engine.h). */
static double allreduce_bytes(double bytes, int n) {
    return n > 1 ? 2.0 * bytes * (n - 1) / n : 0.0;
}

mt_status_t mt_par3d_check(const mt_par3d_params_t *p, int world, const mt_model_config_t *mc) {
    if (!p || p->size != sizeof(mt_par3d_params_t) || !mc) {
        return mt_error(MT_ERR_INVALID_ARG, "parallel3d: params NULL or not from MT_PAR3D_PARAMS_INIT");
    }
    int tp = p->tp, pp = p->pp, dp = p->dp;
    if (tp < 1 || pp < 1 || dp < 0) {
        return mt_error(MT_ERR_INVALID_ARG, "parallel.tp = %d, parallel.pp = %d must be >= 1, parallel.dp = %d >= 0",
                        tp, pp, dp);
    }
    if (dp == 0) {
        dp = world % (tp * pp) == 0 ? world / (tp * pp) : 0;
    }
    if (dp < 1 || tp * pp * dp != world) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "parallel.tp x parallel.pp x parallel.dp = %d x %d x %d does not make the %d ranks of the "
                        "job: choose sizes whose product is the world size",
                        tp, pp, p->dp, world);
    }
    if (p->microbatches < 1 || p->micro_batch < 1 || p->seq_len < 1 || p->seq_len > mc->seq_len) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "parallel3d: microbatches (%d), micro_batch (%d) must be >= 1 and seq_len (%d) in [1, %d]",
                        p->microbatches, p->micro_batch, p->seq_len, mc->seq_len);
    }
    if (tp > 1) {
        if (mc->kind != MT_MODEL_GPT2) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "parallel.tp = %d: tensor parallelism shards GPT-2 only (model.kind = "
                            "\"mlp\" runs with tp = 1)",
                            tp);
        }
        if (mc->n_head % tp != 0) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "model.n_head = %d is not divisible by parallel.tp = %d: tensor "
                            "parallelism gives each rank whole heads",
                            mc->n_head, tp);
        }
        int pv = mc->padded_vocab ? mc->padded_vocab : (mc->vocab_size + 128 * tp - 1) / (128 * tp) * (128 * tp);
        if (pv % tp != 0) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "model.padded_vocab = %d is not divisible by parallel.tp = %d: each tp "
                            "rank holds an equal slice of the vocabulary",
                            pv, tp);
        }
        if (mc->recompute != MT_RECOMPUTE_NONE) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "model.recompute = \"block\" with parallel.tp = %d: recomputing a "
                            "sharded block would repeat its collectives; set model.recompute = "
                            "\"none\"",
                            tp);
        }
        if (p->sequence_parallel && ((int64_t)p->micro_batch * p->seq_len) % tp != 0) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "parallel.sequence_parallel splits the train.micro_batch x seq_len = %d x %d rows over "
                            "parallel.tp = %d: choose sizes whose product divides by tp",
                            p->micro_batch, p->seq_len, tp);
        }
    }
    if (p->dp_mode == MT_P3D_ENGINE) {
        if (p->engine_kind == MT_ENGINE_DP && (tp > 1 || pp > 1)) {
            return mt_error(
                MT_ERR_INVALID_ARG,
                "parallel.engine = \"dp\" with parallel.tp = %d, parallel.pp = %d: the DataParallel baseline "
                "scatters every micro-batch from one root inside the training loop, which a pipeline "
                "stage or a tp group does not run; use parallel.engine = \"ddp\" or \"zero\"",
                tp, pp);
        }
    }
    return MT_OK;
}

/* The sequence-parallel sum over tp of module's replicated gradients, before the engine's hook sees them.
 * After every pass (ZeRO-2/3, whose sharded units move each pass's gradients away) the gradients the engine
 * instead accumulates over the step (ZeRO-3's persistent parameters) must be summed once, on the last pass:
 * summing the running total every pass would count earlier passes tp times. They are left out of the earlier
 * passes' sums by hiding their gradient (mt_tp_sync_module_grads skips parameters without one). */
static mt_status_t sp_grads_ready(void *arg, int module) {
    mt_par3d_t p3 = arg;
    if (!p3->sp_each_pass) {
        return mt_tp_sync_module_grads(p3->tp, p3->model, module, true);
    }
    bool last = ++p3->sp_pass[module] >= p3->p.microbatches;
    int first = 0, count = 0;
    mt_model_module_params(p3->model, module, &first, &count);
    float *hidden[64];
    int which[64], n_hidden = 0;
    for (int i = first; i < first + count && !last; i++) {
        mt_param_t *q = mt_model_param(p3->model, i);
        if (q->tp_dim < 0 && q->grad && mt_engine_grad_accumulates(p3->engine, i)) {
            MT_ASSERT(n_hidden < (int)MT_ARRAY_LEN(hidden));
            which[n_hidden] = i;
            hidden[n_hidden++] = q->grad;
            q->grad = NULL;
        }
    }
    mt_status_t st = mt_tp_sync_module_grads(p3->tp, p3->model, module, true);
    for (int k = 0; k < n_hidden; k++) {
        mt_model_param(p3->model, which[k])->grad = hidden[k];
    }
    return st;
}

static mt_status_t make_comms(mt_par3d_t p3, MPI_Comm world) {
    mt_comm_params_t cp = MT_COMM_PARAMS_INIT;
    cp.timeout_s = p3->p.timeout_s;
    const mt_axis_t axes[3] = {MT_AXIS_TP, MT_AXIS_DP, MT_AXIS_PP};
    for (int k = 0; k < 3; k++) {
        MT_CHECK(mt_comm_init_mesh(world, p3->mesh, MT_AXIS_BIT(axes[k]), &cp, &p3->comm[axes[k]]));
    }
    int er[2];
    int n = mt_mesh_embedding_group(p3->mesh, p3->rank, er);
    if (n == 2 && (er[0] == p3->rank || er[1] == p3->rank)) {
        cp.name = "emb";
        MT_CHECK(mt_comm_init_ranks(world, er, 2, &cp, &p3->emb));
    }
    return MT_OK;
}

mt_status_t mt_par3d_setup(MPI_Comm world, mt_model_config_t *mc, const mt_par3d_params_t *p, mt_par3d_t *out) {
    *out = NULL;
    int wsize = 0, wrank = 0;
    MT_MPI_CHECK(MPI_Comm_size(world, &wsize));
    MT_MPI_CHECK(MPI_Comm_rank(world, &wrank));
    MT_CHECK(mt_par3d_check(p, wsize, mc));
    MT_CHECK(mt_device_require_host(p->device, "parallel3d"));
    struct mt_par3d *p3 = calloc(1, sizeof(*p3));
    if (!p3) {
        return mt_error(MT_ERR_OOM, "parallel3d: out of memory");
    }
    mt_status_t st = MT_OK;
    p3->p = *p;
    p3->rank = wrank;
    p3->flat_step = -1;
    p3->dev = p->device ? p->device : mt_device_cpu();
    if (p->mesh) {
        p3->mesh = (mt_mesh_t *)p->mesh;
        if (mt_mesh_world(p3->mesh) != wsize || mt_mesh_axis_size(p3->mesh, MT_AXIS_TP) != p->tp ||
            mt_mesh_axis_size(p3->mesh, MT_AXIS_PP) != p->pp) {
            st = mt_error(MT_ERR_INVALID_ARG, "parallel3d: the given mesh is not tp %d x pp %d over %d ranks", p->tp,
                          p->pp, wsize);
            goto fail;
        }
    } else {
        MT_CHECK_GOTO(mt_mesh_create(wsize, p->tp, p->pp, p->dp, p->order ? p->order : "tp-dp-pp", &p3->mesh), st,
                      fail);
        p3->own_mesh = true;
    }
    p3->p.mesh = NULL; /* p3->mesh from here on */
    p3->p.dp = mt_mesh_axis_size(p3->mesh, MT_AXIS_DP);
    mt_mesh_coords(p3->mesh, wrank, p3->coords);
    MT_CHECK_GOTO(make_comms(p3, world), st, fail);
    MT_CHECK_GOTO(mt_tp_init(p3->comm[MT_AXIS_TP], &p3->tp), st, fail);
    MT_CHECK_GOTO(mt_tp_set_device(p3->tp, p3->dev, p->stream), st, fail); /* refuses a non-host table */
    mt_tp_model_config(p3->tp, p->sequence_parallel, mc);
    *out = p3;
    return MT_OK;
fail:
    mt_par3d_free(p3);
    return st;
}

void mt_par3d_stage_flags(mt_model_t model, const int *bounds, int pp, int stage, int tp_rank, uint8_t *flags) {
    for (int i = 0; i < mt_model_n_params(model); i++) {
        const mt_param_t *q = mt_model_param(model, i);
        int s_own = 0, s_tied = -1;
        for (int s = 0; s < pp; s++) {
            s_own = q->module >= bounds[s] && q->module < bounds[s + 1] ? s : s_own;
            s_tied = q->tied_module >= bounds[s] && q->tied_module < bounds[s + 1] ? s : s_tied;
        }
        bool owns = s_own == stage, needs = owns || s_tied == stage;
        uint8_t f = needs ? MT_ENGINE_PARAM_HELD : 0;
        f |= owns && (q->tp_dim >= 0 || tp_rank == 0) ? MT_ENGINE_PARAM_NORM : 0;
        f |= needs && s_tied >= 0 && s_tied != s_own ? MT_ENGINE_PARAM_ONCE : 0;
        flags[i] = f;
    }
}

static mt_status_t stage_flags(mt_par3d_t p3) {
    int np = mt_model_n_params(p3->model), pp = p3->p.pp;
    int *bounds = calloc((size_t)pp + 1, sizeof(int));
    p3->flags = calloc((size_t)MT_MAX(np, 1), 1);
    if (!bounds || !p3->flags) {
        free(bounds);
        return mt_error(MT_ERR_OOM, "parallel3d: out of memory");
    }
    mt_status_t st = mt_pipeline_split(p3->model, pp, p3->p.stage_layers, bounds);
    if (st == MT_OK) {
        mt_par3d_stage_flags(p3->model, bounds, pp, p3->coords[MT_AXIS_PP], p3->coords[MT_AXIS_TP], p3->flags);
    }
    free(bounds);
    return st;
}

mt_status_t mt_par3d_attach(mt_par3d_t p3, mt_model_t model) {
    const mt_par3d_params_t *p = &p3->p;
    p3->model = model;
    MT_CHECK(stage_flags(p3));
    if (p->dp_mode == MT_P3D_ENGINE) {
        mt_engine_params_t ep = MT_ENGINE_PARAMS_INIT;
        ep.kind = p->engine_kind;
        ep.zero_stage = p->zero_stage;
        ep.grad_accum = p->microbatches;
        ep.bucket_mb = p->bucket_mb;
        ep.persist_threshold = p->persist_threshold;
        ep.optim = p->optim;
        ep.param_flags = p->tp > 1 || p->pp > 1 ? p3->flags : NULL; /* the stage's parameters, the norm's share */
        ep.device = p3->dev;
        ep.stream = p->stream;
        MT_CHECK(mt_engine_init(p3->model, p3->comm[MT_AXIS_DP], &ep, &p3->engine));
    }
    mt_pipeline_params_t pp = MT_PIPELINE_PARAMS_INIT;
    pp.schedule = p->schedule;
    pp.microbatches = p->microbatches;
    pp.micro_batch = p->micro_batch;
    pp.seq_len = p->seq_len;
    pp.stage_layers = p->stage_layers;
    pp.timeout_s = p->timeout_s;
    pp.device = p3->dev;
    pp.stream = p->stream;
    if (p->sequence_parallel && p->tp > 1) {
        pp.grads_ready = sp_grads_ready;
        pp.grads_ready_arg = p3;
        /* ZeRO-2/3 move every pass's gradients into their shard: sum over tp before each such move. */
        pp.grads_ready_each_pass = p3->engine && p->engine_kind == MT_ENGINE_ZERO && p->zero_stage >= 2;
        p3->sp_each_pass = pp.grads_ready_each_pass;
        p3->sp_pass = calloc((size_t)mt_model_n_modules(p3->model), sizeof(int));
        if (!p3->sp_pass) {
            return mt_error(MT_ERR_OOM, "parallel3d: out of memory");
        }
    }
    MT_CHECK(mt_pipeline_init(p3->model, p3->comm[MT_AXIS_PP], p3->emb, &pp, &p3->pl));
    if (!p3->engine) {
        MT_CHECK(mt_pipeline_alloc_params(p3->pl));
        MT_CHECK(mt_optim_init(&p->optim, &p3->opt));
        MT_CHECK(mt_optim_set_device(p3->opt, p3->dev, p->stream));
        int np = mt_model_n_params(p3->model);
        for (int i = 0; i < np; i++) {
            mt_param_t *q = mt_model_param(p3->model, i);
            if (mt_pipeline_needs_param(p3->pl, i)) {
                MT_CHECK(mt_optim_add(p3->opt, q->name, q->data, q->grad, q->numel, q->is_weight2d, NULL));
                p3->gbuf_n += q->numel;
            }
        }
        if (p3->p.dp > 1) {
            MT_CHECK(mt_device_alloc(p3->dev, (void **)&p3->gbuf, p3->gbuf_n * sizeof(float), MT_MEM_COMM,
                                     "parallel3d dp gradients", p->stream));
        }
    }
    MT_INFO(MT_LOG_PAR, "parallel3d rank %d: tp %d/%d dp %d/%d pp %d/%d, %s", p3->rank, p3->coords[MT_AXIS_TP], p->tp,
            p3->coords[MT_AXIS_DP], p3->p.dp, p3->coords[MT_AXIS_PP], p->pp,
            p3->engine ? mt_engine_name(p3->engine) : "built-in dp all-reduce");
    return MT_OK;
}

mt_status_t mt_par3d_init(MPI_Comm world, const mt_model_config_t *mc, const mt_par3d_params_t *p, mt_par3d_t *out) {
    *out = NULL;
    mt_model_config_t cfg = *mc;
    mt_par3d_t p3 = NULL;
    MT_CHECK(mt_par3d_setup(world, &cfg, p, &p3));
    mt_model_t model = NULL;
    mt_status_t st = mt_model_init(&cfg, &model);
    if (st == MT_OK) {
        p3->own_model = true;
        st = mt_par3d_attach(p3, model);
    }
    if (st != MT_OK) {
        mt_par3d_free(p3); /* and the model, once it is p3's */
        return st;
    }
    *out = p3;
    return MT_OK;
}

void mt_par3d_free(mt_par3d_t p3) {
    if (!p3) {
        return;
    }
    mt_pipeline_free(p3->pl); /* restores the engine's hooks */
    mt_engine_free(p3->engine);
    mt_optim_free(p3->opt);
    if (p3->own_model) {
        mt_model_free(p3->model);
    }
    mt_tp_free(p3->tp);
    mt_device_free(p3->dev, p3->gbuf);
    mt_device_free(p3->dev, p3->flat);
    free(p3->flags);
    free(p3->sp_pass);
    mt_comm_free(p3->emb);
    for (int k = 0; k < MT_AXIS_N; k++) {
        mt_comm_free(p3->comm[k]);
    }
    if (p3->own_mesh) {
        mt_mesh_free(p3->mesh);
    }
    free(p3);
}

void mt_par3d_coords(mt_par3d_t p3, int coords[MT_AXIS_N]) {
    memcpy(coords, p3->coords, sizeof(p3->coords));
}
void mt_par3d_rows(mt_par3d_t p3, int *row0, int *rows) {
    *rows = p3->p.microbatches * p3->p.micro_batch;
    *row0 = p3->coords[MT_AXIS_DP] * *rows;
}
mt_model_t mt_par3d_model(mt_par3d_t p3) {
    return p3->model;
}
mt_pipeline_t mt_par3d_pipeline(mt_par3d_t p3) {
    return p3->pl;
}
mt_tp_t mt_par3d_tp(mt_par3d_t p3) {
    return p3->tp;
}
mt_comm_t mt_par3d_comm(mt_par3d_t p3, mt_axis_t axis) {
    return p3->comm[axis];
}

/* Built-in data parallelism: the mean of the stage's gradients over dp, one packed all-reduce. */
static mt_status_t dp_allreduce(mt_par3d_t p3) {
    mt_work_t w_ = NULL;
    if (p3->p.dp == 1) {
        return MT_OK;
    }
    int np = mt_model_n_params(p3->model);
    size_t off = 0;
    for (int i = 0; i < np; i++) {
        const mt_param_t *q = mt_model_param(p3->model, i);
        if (mt_pipeline_needs_param(p3->pl, i)) {
            MT_CHECK(mt_device_copy(p3->dev, p3->gbuf + off, q->grad, q->numel * sizeof(float), p3->p.stream));
            off += q->numel;
        }
    }
    p3->dp_bytes += allreduce_bytes((double)(off * sizeof(float)), p3->p.dp);
    MT_CHECK(mt_mp_wait(
        mt_coll_all_reduce(p3->comm[MT_AXIS_DP], p3->gbuf, p3->gbuf, off, MT_COLL_F32, MT_REDOP_AVG, NULL, &w_), &w_,
        -1.0));
    off = 0;
    for (int i = 0; i < np; i++) {
        mt_param_t *q = mt_model_param(p3->model, i);
        if (mt_pipeline_needs_param(p3->pl, i)) {
            MT_CHECK(mt_device_copy(p3->dev, q->grad, p3->gbuf + off, q->numel * sizeof(float), p3->p.stream));
            off += q->numel;
        }
    }
    return MT_OK;
}

mt_status_t mt_par3d_zero_grads(mt_par3d_t p3) {
    if (p3->sp_pass) {
        memset(p3->sp_pass, 0, (size_t)mt_model_n_modules(p3->model) * sizeof(int));
    }
    mt_tp_counts_t tc;
    mt_tp_counts(p3->tp, &tc);
    p3->tp_bytes0 = tc.bytes;
    p3->dp_bytes = p3->scalar_bytes = 0.0;
    if (p3->engine) {
        return mt_engine_zero_grads(p3->engine);
    }
    return mt_pipeline_zero_grads(p3->pl);
}

mt_status_t mt_par3d_finish_grads(mt_par3d_t p3) {
    return p3->engine ? mt_engine_finish_grads(p3->engine) : dp_allreduce(p3);
}

mt_status_t mt_par3d_reduce_loss(mt_par3d_t p3, double *loss) {
    if (p3->engine) {
        return mt_engine_reduce_loss(p3->engine, loss);
    }
    mt_work_t w_ = NULL;
    if (p3->p.dp > 1) {
        p3->scalar_bytes += allreduce_bytes(sizeof(double), p3->p.dp);
        MT_CHECK(mt_mp_wait(
            mt_coll_all_reduce(p3->comm[MT_AXIS_DP], loss, loss, 1, MT_COLL_F64, MT_REDOP_AVG, NULL, &w_), &w_, -1.0));
    }
    return MT_OK;
}

mt_status_t mt_par3d_grad_sumsq(mt_par3d_t p3, double *total) {
    double s = 0.0;
    if (p3->engine) { /* the stage's NORM parameters, summed over dp inside */
        MT_CHECK(mt_engine_grad_sumsq(p3->engine, &s));
    } else { /* averaged already: identical on every dp replica */
        int np = mt_model_n_params(p3->model);
        for (int i = 0; i < np; i++) {
            if (p3->flags[i] & MT_ENGINE_PARAM_NORM) {
                const mt_param_t *q = mt_model_param(p3->model, i);
                double qs = 0.0;
                MT_CHECK(mt_device_sumsq(p3->dev, &qs, NULL, q->grad, q->numel, p3->p.stream));
                s += qs;
            }
        }
    }
    mt_work_t w_ = NULL;
    for (int k = 0; k < 2; k++) {
        mt_comm_t c = p3->comm[k == 0 ? MT_AXIS_TP : MT_AXIS_PP];
        if (mt_comm_size(c) > 1) {
            p3->scalar_bytes += allreduce_bytes(sizeof(double), mt_comm_size(c));
            MT_CHECK(mt_mp_wait(mt_coll_all_reduce(c, &s, &s, 1, MT_COLL_F64, MT_REDOP_SUM, NULL, &w_), &w_, -1.0));
        }
    }
    *total = s;
    return MT_OK;
}

mt_status_t mt_par3d_apply(mt_par3d_t p3, float lr, float grad_scale) {
    MT_CHECK(p3->engine ? mt_engine_step(p3->engine, lr, grad_scale) : mt_optim_step(p3->opt, lr, grad_scale));
    p3->n_steps++;
    return MT_OK;
}

mt_engine_t mt_par3d_engine(mt_par3d_t p3) {
    return p3->engine;
}

mt_optim_t mt_par3d_optim(mt_par3d_t p3) {
    return p3->engine ? mt_engine_optim(p3->engine) : p3->opt;
}

unsigned mt_par3d_param_flags(mt_par3d_t p3, int i) {
    return i >= 0 && i < mt_model_n_params(p3->model) ? p3->flags[i] : 0u;
}

mt_status_t mt_par3d_eval(mt_par3d_t p3, const int32_t *tokens, const int32_t *targets, float *loss) {
    float l = 0.0f;
    MT_CHECK(mt_pipeline_eval(p3->pl, tokens, targets, &l));
    double dl = l;
    if (p3->p.dp > 1) {
        mt_work_t w_ = NULL;
        MT_CHECK(mt_mp_wait(mt_coll_all_reduce(p3->comm[MT_AXIS_DP], &dl, &dl, 1, MT_COLL_F64, MT_REDOP_AVG, NULL, &w_),
                            &w_, -1.0));
    }
    if (loss) {
        *loss = (float)dl;
    }
    return MT_OK;
}

double mt_par3d_last_grad_norm(mt_par3d_t p3) {
    return p3->grad_norm;
}

mt_status_t mt_par3d_step(mt_par3d_t p3, const int32_t *tokens, const int32_t *targets, float lr, float *loss) {
    float l = 0.0f;
    MT_CHECK(mt_par3d_zero_grads(p3));
    MT_CHECK(mt_pipeline_step(p3->pl, tokens, targets, &l));
    double dl = l, total = 0.0;
    MT_CHECK(mt_par3d_finish_grads(p3));
    MT_CHECK(mt_par3d_reduce_loss(p3, &dl));
    MT_CHECK(mt_par3d_grad_sumsq(p3, &total));
    float coef = mt_clip_coef(total, p3->p.grad_clip, &p3->grad_norm);
    /* A non-finite loss or norm skips the update when skip_nonfinite (the same verdict on every rank: both
     * are reduced), else stops. */
    p3->skipped = !(isfinite(dl) && isfinite(p3->grad_norm));
    if (p3->skipped && !p3->p.skip_nonfinite) {
        return mt_error(MT_ERR_INTERNAL,
                        "step %lld: loss %g, gradient norm %g is not finite: stopping (train.on_nan = stop; lower "
                        "optimizer.lr or set train.on_nan = \"skip\")",
                        (long long)p3->n_steps + 1, dl, p3->grad_norm);
    }
    if (!p3->skipped) {
        MT_CHECK(mt_par3d_apply(p3, lr, coef));
    } else {
        p3->n_steps++;
    }
    if (loss) {
        *loss = (float)dl;
    }
    return MT_OK;
}

void mt_par3d_comm_bytes(mt_par3d_t p3, mt_par3d_bytes_t *out) {
    mt_tp_counts_t tc;
    mt_tp_counts(p3->tp, &tc);
    mt_pipeline_stats_t ps;
    mt_pipeline_stats(p3->pl, &ps);
    out->tp = (double)(tc.bytes - p3->tp_bytes0);
    out->pp = (double)(ps.bytes_sent + ps.bytes_tied);
    out->dp = p3->dp_bytes;
    out->other = p3->scalar_bytes + (double)ps.bytes_loss;
    if (p3->engine) {
        mt_engine_comm_stats_t es;
        mt_engine_comm_stats(p3->engine, &es);
        out->dp += es.bytes_model;
        out->other += es.bytes_other;
    }
}

bool mt_par3d_last_skipped(mt_par3d_t p3) {
    return p3->skipped;
}

mt_status_t mt_par3d_gather_param(mt_par3d_t p3, int i, float *out) {
    const mt_param_t *q = mt_model_param(p3->model, i);
    if (!q) {
        return mt_error(MT_ERR_INVALID_ARG, "parallel3d: no parameter %d", i);
    }
    if (p3->engine && p3->flat_step != p3->n_steps) {
        /* Collective over dp: the engine assembles its parameters on dp rank 0 once per step. */
        if (!p3->flat && p3->coords[MT_AXIS_DP] == 0) {
            MT_CHECK(mt_device_alloc(p3->dev, (void **)&p3->flat, mt_model_numel(p3->model) * sizeof(float),
                                     MT_MEM_COMM, "parallel3d gather", p3->p.stream));
        }
        MT_CHECK(mt_engine_gather_params(p3->engine, 0, p3->flat));
        p3->flat_step = p3->n_steps;
    }
    if (p3->coords[MT_AXIS_DP] != 0) {
        return MT_OK;
    }
    int lo = 0, hi = 0;
    mt_pipeline_range(p3->pl, &lo, &hi);
    bool owner = mt_pipeline_owns_param(p3->pl, i);
    int stage = p3->coords[MT_AXIS_PP], tpr = p3->coords[MT_AXIS_TP];
    size_t n = (size_t)(q->global_shape[0] * q->global_shape[1]);
    /* Which stage owns it: the stage whose range holds the owning module (found with one max-reduce over pp). */
    int owner_stage = owner ? stage : -1;
    MT_CHECK(
        mt_coll_all_reduce(p3->comm[MT_AXIS_PP], &owner_stage, &owner_stage, 1, MT_COLL_I32, MT_REDOP_MAX, NULL, NULL));
    if (!owner && !(stage == 0 && tpr == 0)) {
        return MT_OK;
    }
    const float *local = q->data;
    if (p3->engine) {
        local = p3->flat + q->offset; /* the engine's whole parameters (ZeRO-3 keeps only shards bound) */
    }
    float *buf = out;
    if (owner && !(stage == 0 && tpr == 0)) {
        MT_CHECK(
            mt_device_alloc(p3->dev, (void **)&buf, n * sizeof(float), MT_MEM_COMM, "parallel3d gather", p3->p.stream));
    }
    mt_status_t st = MT_OK;
    if (owner) {
        st = mt_tp_gather_shard(p3->tp, q, local, buf);
    }
    if (st == MT_OK && owner_stage != 0 && tpr == 0) {
        mt_work_t w = NULL;
        if (owner) {
            st = mt_coll_send(p3->comm[MT_AXIS_PP], buf, n, MT_COLL_F32, 0, NULL, &w);
        } else {
            st = mt_coll_recv(p3->comm[MT_AXIS_PP], out, n, MT_COLL_F32, owner_stage, NULL, &w);
        }
        if (st == MT_OK) {
            st = mt_work_wait(w, -1.0);
        }
        mt_work_free(w);
    }
    if (buf != out) {
        mt_device_free(p3->dev, buf);
    }
    return st;
}
