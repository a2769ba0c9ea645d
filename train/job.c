/* The training loop behind `meshtrain train` and the equivalence tests: config -> model, data, engine;
 * then per step: batch, micro-batch forward/backward, global-norm clip, optimizer step, evaluation and
 * a progress line. The single-process engine lives here too; parallel engines plug in through
 * mt_job_engine_t without changing the loop.
 * SPDX-License-Identifier: MIT */
#include "train/job.h"

#include "train/job_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/data/data.h"
#include "models/grad_check.h"
#include "models/layers/layers.h"
#include "models/llmc.h"
#include "models/model_config.h"
#include "runtime/alloc.h"
#include "runtime/blas.h"
#include "runtime/matmul.h"
#include "runtime/numerics.h"
#include "runtime/watchdog.h"
#include "runtime/rt.h"
#include "runtime/trace.h"

/* Test knob (docs/params.md): at this step (1-based) the rank MESHTRAIN_TEST_OVERFLOW_RANK multiplies its
 * fp16 loss scale by 2^24 for backward, so its gradients genuinely overflow f16 inside backward and the
 * infs travel through the engine's gradient communication as a real overflow would. */
MT_PARAM(test_overflow_step, "TEST_OVERFLOW_STEP", 0)
MT_PARAM(test_overflow_rank, "TEST_OVERFLOW_RANK", 0)

/* ---- config -> component parameters ---------------------------------------------------------- */

void mt_job_model_config(const mt_config_t *cfg, mt_model_config_t *out) {
    mt_model_config_keys(cfg, out); /* the one mapping: models/model_config.c */
}

/* ---- the single-process engine ---------------------------------------------------------------- */

typedef struct {
    mt_model_t model;
    mt_optim_t opt;
    bool sgd; /* optimizer state is the momentum buffer (else AdamW's m and v) */
} local_engine_t;

static void local_free(void *ctx) {
    local_engine_t *e = ctx;
    if (e) {
        mt_optim_free(e->opt);
        free(e);
    }
}

static mt_status_t local_init(const mt_job_info_t *info, void **ctx) {
    *ctx = NULL;
    if (info->dp_size != 1) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "the single-process engine runs one data-parallel rank, but dp = %d: run with one rank or "
                        "choose a data-parallel engine (parallel.engine)",
                        info->dp_size);
    }
    local_engine_t *e = calloc(1, sizeof(*e));
    if (!e) {
        return mt_error(MT_ERR_OOM, "local engine: out of memory");
    }
    e->model = info->model;
    e->sgd = info->optim.kind == MT_OPTIM_SGD;
    mt_status_t st = MT_OK;
    MT_CHECK_GOTO(mt_model_alloc_params(e->model), st, fail);
    MT_CHECK_GOTO(mt_model_alloc_grads(e->model), st, fail);
    mt_model_init_weights(e->model);
    if (info->init_llmc) {
        MT_CHECK_GOTO(mt_llmc_load(e->model, info->init_llmc), st, fail);
    }
    MT_CHECK_GOTO(mt_optim_init(&info->optim, &e->opt), st, fail);
    for (int i = 0; i < mt_model_n_params(e->model); i++) {
        mt_param_t *p = mt_model_param(e->model, i);
        MT_CHECK_GOTO(mt_optim_add(e->opt, p->name, p->data, p->grad, p->numel, p->is_weight2d, NULL), st, fail);
    }
    *ctx = e;
    return MT_OK;
fail:
    local_free(e);
    return st;
}

static mt_status_t local_zero_grads(void *ctx) {
    local_engine_t *e = ctx;
    mt_model_zero_grads(e->model);
    return MT_OK;
}

static mt_status_t local_finish_grads(void *ctx) {
    return MT_OK; /* one rank: the accumulated gradient is already the batch mean */
}

static mt_status_t local_grad_sumsq(void *ctx, double *total) {
    local_engine_t *e = ctx;
    double s = 0.0;
    for (int i = 0; i < mt_model_n_params(e->model); i++) {
        const mt_param_t *p = mt_model_param(e->model, i);
        s += mt_clip_sumsq(p->grad, p->numel);
    }
    *total = s;
    return MT_OK;
}

static mt_status_t local_step(void *ctx, float lr, float grad_scale) {
    local_engine_t *e = ctx;
    return mt_optim_step(e->opt, lr, grad_scale);
}

static mt_status_t local_reduce_loss(void *ctx, double *loss) {
    return MT_OK;
}

/* Checkpoint pieces of the single process: every parameter and its optimizer state, whole. */
static mt_status_t local_ckpt_pieces(void *ctx, bool save, mt_ckpt_piece_t **pieces, int *n) {
    local_engine_t *e = ctx;
    (void)save; /* one rank writes and holds everything */
    int np = mt_model_n_params(e->model), cap = 3 * np, k = 0;
    mt_ckpt_piece_t *out = calloc((size_t)cap, sizeof(*out));
    if (!out) {
        return mt_error(MT_ERR_OOM, "checkpoint: out of memory listing %d parameters", np);
    }
    for (int i = 0; i < np; i++) {
        const mt_param_t *p = mt_model_param(e->model, i);
        const char *oname = NULL;
        size_t on = 0;
        float *m = NULL, *v = NULL;
        MT_CHECK(mt_optim_state(e->opt, i, &oname, &on, &m, &v));
        float *bufs[3] = {p->data, m, v};
        const char *kinds[3] = {"param", e->sgd ? "sgd.momentum" : "adamw.m", e->sgd ? NULL : "adamw.v"};
        for (int b = 0; b < 3; b++) {
            if (!bufs[b] || !kinds[b]) {
                continue;
            }
            mt_ckpt_piece_t *pc = &out[k++];
            snprintf(pc->tensor, sizeof(pc->tensor), "%s/%s", kinds[b], p->name);
            pc->ndim = p->ndim;
            for (int d = 0; d < p->ndim; d++) {
                pc->shape[d] = p->global_shape[d];
                pc->lo[d] = 0;
                pc->hi[d] = p->global_shape[d];
            }
            pc->data = bufs[b];
        }
    }
    *pieces = out;
    *n = k;
    return MT_OK;
}

static int64_t local_ckpt_get_step(void *ctx) {
    return mt_optim_get_step(((local_engine_t *)ctx)->opt);
}

static void local_ckpt_set_step(void *ctx, int64_t t) {
    mt_optim_set_step(((local_engine_t *)ctx)->opt, t);
}

static const mt_job_engine_t local_engine = {
    .name = "local",
    .init = local_init,
    .zero_grads = local_zero_grads,
    .finish_grads = local_finish_grads,
    .grad_sumsq = local_grad_sumsq,
    .step = local_step,
    .reduce_loss = local_reduce_loss,
    .free = local_free,
    .ckpt_pieces = local_ckpt_pieces,
    .ckpt_get_step = local_ckpt_get_step,
    .ckpt_set_step = local_ckpt_set_step,
};

const mt_job_engine_t *mt_job_engine_local(void) {
    return &local_engine;
}

/* ---- the loop ------------------------------------------------------------------------------------ */

static mt_status_t check_layout(const mt_settings_t *set, const mt_job_opts_t *opts, int world) {
    int tp = set->par.tp, pp = set->par.pp;
    bool runs = opts->engine && (opts->engine->setup_model || (tp == 1 && opts->engine->pipelines));
    if ((tp != 1 || pp != 1) && !runs) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "parallel.tp = %d, parallel.pp = %d: the \"%s\" engine runs tp = 1 and pp = 1 (set "
                        "--parallel.tp=1 --parallel.pp=1, or use the model-parallel engine)",
                        tp, pp, opts->engine ? opts->engine->name : "local");
    }
    if (!opts->engine && world != 1) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "%d ranks but no data-parallel engine: the single-process loop runs on one rank (start "
                        "it without mpirun, or with -np 1)",
                        world);
    }
    return MT_OK;
}

static mt_status_t open_data(job_t *j, bool val, mt_data_t *out) {
    const mt_config_t *cfg = j->cfg;
    mt_data_params_t p = MT_DATA_PARAMS_INIT;
    const char *kind = mt_config_str(cfg, "data.kind");
    if (!mt_data_kind_parse(kind, &p.kind)) {
        return mt_error(MT_ERR_INVALID_ARG, "data.kind = \"%s\": expected \"synthetic\" or \"shards\"", kind);
    }
    if (!mt_data_order_parse(mt_config_str(cfg, "data.order"), &p.order)) {
        return mt_error(MT_ERR_INVALID_ARG, "data.order = \"%s\": expected \"random\" or \"sequential\"",
                        mt_config_str(cfg, "data.order"));
    }
    p.glob = mt_config_str(cfg, val ? "data.val" : "data.train");
    p.what = val ? "data.val" : "data.train";
    if (val) {
        p.order = MT_DATA_SEQUENTIAL; /* every evaluation reads the same first eval_batches windows */
    }
    p.seed = (uint64_t)mt_config_int(cfg, "train.seed");
    p.split = val ? 1 : 0;
    p.global_batch = j->info.global_batch;
    p.seq_len = j->info.seq_len;
    p.vocab_size = mt_model_config(j->model)->vocab_size;
    p.dp_rank = j->info.dp_rank;
    p.dp_size = j->info.dp_size;
    if (!val && j->scatter) { /* the dp root reads the rows of its whole group: the global batch */
        p.dp_rank = 0;
        p.dp_size = 1;
    }
    p.prefetch = j->opts->prefetch;
    return mt_data_open(&p, out);
}

/* Forward (and backward) of one step's batch over its micro-batches; *loss = mean of the micro-batch
 * means, which is the mean over the whole batch because every micro-batch has B*T targets. Backward
 * scales each micro-batch's loss gradient by 1/grad_accum so the accumulated gradient is that mean's. */
static mt_status_t run_batch(job_t *j, const mt_batch_t *b, bool backward, double *loss, mt_step_rec_t *rec) {
    if (j->engine->run_batch) { /* the engine schedules forward and backward itself (pipelines) */
        double t0 = mt_now();
        MT_CHECK(j->engine->run_batch(j->ectx, b, backward, loss));
        if (rec) {
            rec->bwd_s += mt_now() - t0; /* one figure: a schedule interleaves forward and backward */
        }
        return MT_OK;
    }
    int n = mt_model_n_modules(j->model);
    int64_t mb = j->info.micro_batch, T = j->info.seq_len, ga = j->info.grad_accum;
    double sum = 0.0;
    for (int64_t k = 0; k < ga; k++) {
        const int32_t *tok = NULL, *tgt = NULL;
        if (j->scatter && backward) { /* training batches: the dp root's group batch, scattered (b NULL elsewhere) */
            double ts = mt_now();
            MT_CHECK(j->engine->scatter_micro_batch(j->ectx, b, k, j->mb_buf, j->mb_buf + mb * T));
            tok = j->mb_buf;
            tgt = j->mb_buf + mb * T;
            if (rec) {
                rec->comm_s += mt_now() - ts;
            }
        } else {
            tok = b->inputs + k * mb * T;
            tgt = b->targets + k * mb * T;
        }
        float l = 0.0f;
        double t0 = mt_now();
        MT_CHECK(mt_model_forward(j->model, j->acts, 0, n, tok, tgt, NULL, NULL, &l));
        double t1 = mt_now();
        if (backward) {
            MT_CHECK(mt_model_backward(j->model, j->acts, 0, n, NULL, NULL, 1.0f / (float)ga));
        }
        if (rec) {
            rec->fwd_s += t1 - t0;
            rec->bwd_s += mt_now() - t1;
        }
        sum += (double)l;
    }
    *loss = sum / (double)ga;
    return MT_OK;
}

/* The validation loss: the mean over train.eval_batches batches of each batch's global mean loss. An engine with
 * eval_batch queues up to MT_JOB_EVAL_CHUNK batches back to back and reads their losses with one wait; others run
 * a chunk's batches one by one. Each loss is then reduced on its own, as before, so the figure is the same either
 * way; the chunk's reductions come after its batches on every rank alike, so each communicator still sees one
 * order of collectives on all ranks. */
static mt_status_t evaluate(job_t *j, double *val_loss) {
    int64_t nb = mt_config_int(j->cfg, "train.eval_batches");
    bool queued = j->engine->eval_batch && j->engine->eval_losses;
    double sum = 0.0, ls[MT_JOB_EVAL_CHUNK];
    for (int64_t i0 = 0; i0 < nb; i0 += MT_JOB_EVAL_CHUNK) {
        int64_t n = MT_MIN(nb - i0, (int64_t)MT_JOB_EVAL_CHUNK);
        for (int64_t i = 0; i < n; i++) {
            const mt_batch_t *b = NULL;
            MT_CHECK(mt_data_get(j->val, i0 + i, &b));
            MT_CHECK(queued ? j->engine->eval_batch(j->ectx, b, i) : run_batch(j, b, false, &ls[i], NULL));
        }
        if (queued) {
            MT_CHECK(j->engine->eval_losses(j->ectx, n, ls));
        }
        for (int64_t i = 0; i < n; i++) {
            MT_CHECK(j->engine->reduce_loss(j->ectx, &ls[i]));
            sum += ls[i];
        }
    }
    *val_loss = sum / (double)nb;
    if (j->engine->take_comm_s) {
        j->engine->take_comm_s(j->ectx); /* evaluation's communication is no step's */
    }
    return MT_OK;
}

static mt_status_t result_alloc(mt_job_result_t *r, int64_t steps, int64_t evals) {
    memset(r, 0, sizeof(*r));
    r->loss = calloc((size_t)MT_MAX(steps, 1), sizeof(double));
    r->lr = calloc((size_t)MT_MAX(steps, 1), sizeof(float));
    r->grad_norm = calloc((size_t)MT_MAX(steps, 1), sizeof(double));
    r->eval_step = calloc((size_t)MT_MAX(evals, 1), sizeof(int64_t));
    r->val_loss = calloc((size_t)MT_MAX(evals, 1), sizeof(double));
    if (!r->loss || !r->lr || !r->grad_norm || !r->eval_step || !r->val_loss) {
        mt_job_result_free(r);
        return mt_error(MT_ERR_OOM, "training results for %lld steps: out of memory", (long long)steps);
    }
    for (int64_t i = 0; i < steps; i++) {
        r->loss[i] = NAN; /* steps a resumed job does not run */
        r->grad_norm[i] = NAN;
    }
    return MT_OK;
}

void mt_job_result_free(mt_job_result_t *r) {
    if (!r) {
        return;
    }
    free(r->loss);
    free(r->lr);
    free(r->grad_norm);
    free(r->eval_step);
    free(r->val_loss);
    memset(r, 0, sizeof(*r));
}

/* The training data: every rank its own rows, or (an engine that scatters) the dp root the rows of its
 * whole group and the other ranks nothing, with a buffer for the micro-batch they receive. */
static mt_status_t open_train_data(job_t *j) {
    j->scatter = j->engine->root_loads_batch && j->engine->root_loads_batch(j->ectx);
    if (j->scatter && !j->engine->scatter_micro_batch) {
        return mt_error(MT_ERR_INTERNAL, "engine %s: root_loads_batch without scatter_micro_batch", j->engine->name);
    }
    if (j->scatter) {
        size_t n = 2 * (size_t)(j->info.micro_batch * j->info.seq_len);
        j->mb_buf = mt_alloc(n * sizeof(int32_t), MT_MEM_OTHER, "scattered micro-batch");
        if (!j->mb_buf) {
            return mt_error(MT_ERR_OOM, "training: out of memory for a %zu-token micro-batch", n);
        }
        if (j->info.dp_rank != 0) {
            return MT_OK; /* the root reads for this rank */
        }
    }
    return open_data(j, false, &j->train);
}

static mt_status_t setup(job_t *j) {
    const mt_config_t *cfg = j->cfg;
    mt_model_config_t mc;
    mt_job_info_t *info = &j->info;
    MT_CHECK(mt_model_config_from(cfg, &mc)); /* model.init = "llmc:PATH": the architecture is the file's */
    info->init_llmc = mt_model_config_llmc_path(cfg);
    info->cfg = cfg;
    info->set = &j->set;
    info->comm = mt_rt_world()->comm;
    info->mesh = j->opts->mesh;
    if (j->opts->dp_size > 0) {
        info->dp_size = j->opts->dp_size;
        info->dp_rank = j->opts->dp_rank;
    } else {
        info->dp_size = mt_rt_world()->size;
        info->dp_rank = j->rank;
    }
    info->optim = j->set.optim;
    j->sched = j->set.lr;
    info->global_batch = mt_config_int(cfg, "train.global_batch");
    info->micro_batch = mt_config_int(cfg, "train.micro_batch");
    info->grad_accum = mt_config_int(cfg, "train.grad_accum");
    mt_model_config_t whole_cfg = mc; /* the model as configured, before any tensor-parallel padding */
    if (j->engine->setup_model) {
        MT_CHECK(j->engine->setup_model(info, &mc, &j->ectx));
    }
    MT_CHECK(mt_model_init(&mc, &j->model));
    info->model = j->model;
    /* Mixed precision (docs/training.md): on the CPU, bf16/fp16 round weights, activations and gradients
     * to the storage dtype around every module (the model's wrapper, under any engine's hooks); tf32 is
     * fp32 arithmetic. fp16 adds the dynamic loss scaler below. */
    j->prec = j->set.prec.compute;
    if (j->engine->any_precision) { /* a device engine rounds and scales on its device: no CPU emulation here */
        j->prec = MT_PREC_FP32;
    }
    MT_CHECK(mt_loss_scaler_init(&j->scaler, j->prec, j->set.prec.init_scale, j->set.prec.scale_window));
    MT_CHECK(mt_model_set_compute(j->model, (int)mt_prec_storage(j->prec)));
    MT_CHECK(mt_matmul_init(j->set.cpu.matmul)); /* the same on every rank: a refusal stops each one */
    mt_layers_set_isa(!j->set.cpu.baseline_kernels);
    info->seq_len = mt_model_config(j->model)->seq_len; /* the checkpoint's when model.init = llmc:PATH */
    if (info->dp_rank < 0 || info->dp_rank >= info->dp_size) {
        return mt_error(MT_ERR_INVALID_ARG, "data-parallel rank %d outside [0, %d)", info->dp_rank, info->dp_size);
    }
    if (info->micro_batch * info->grad_accum * info->dp_size != info->global_batch) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "train.global_batch = %lld but micro_batch x grad_accum x dp = %lld x %lld x %d: make them "
                        "agree",
                        (long long)info->global_batch, (long long)info->micro_batch, (long long)info->grad_accum,
                        info->dp_size);
    }
    /* Local set-up (allocations, the validation files) can fail on one rank alone; the ranks agree on it
     * before the engine's collective set-up, so no rank is left waiting in a communicator's creation. */
    mt_status_t local = MT_OK;
    if (!j->engine->own_activations) { /* a device engine keeps its activations on the device */
        local = mt_acts_init(j->model, (int)info->micro_batch, (int)info->seq_len, &j->acts);
    }
    if (local == MT_OK && mt_config_int(cfg, "train.eval_every") > 0) {
        bool synthetic = !strcmp(mt_config_str(cfg, "data.kind"), "synthetic");
        if (synthetic || mt_config_str(cfg, "data.val")[0] != '\0') {
            local = open_data(j, true, &j->val);
        } else if (j->out) {
            fprintf(j->out, "note: train.eval_every = %lld but data.val is empty: no validation\n",
                    (long long)mt_config_int(cfg, "train.eval_every"));
        }
    }
    MT_CHECK(mt_job_agree(&j->sync, "agree_local_setup", local));
    MT_CHECK(j->engine->init(info, &j->ectx));
    MT_CHECK(open_train_data(j));
    /* Model FLOPs per token of the whole model as configured, whatever slice of it this rank holds (the
     * same figure in every layout, so their MFU compare). */
    mt_model_t whole = NULL;
    MT_CHECK(mt_model_init(&whole_cfg, &whole));
    j->flops_per_token = mt_model_flops_per_token(whole, (int)info->seq_len);
    j->n_params = (int64_t)mt_model_numel(whole);
    mt_model_free(whole);
    return MT_OK;
}

/* The parts that need the engine built, every rank having agreed on set-up: checkpoint resume,
 * metrics, profiling hooks. Collective: the ranks agree after each part, so a rank that fails locally
 * (a file it cannot create) never leaves the others waiting in the next part's collectives. */
static mt_status_t setup_services(job_t *j) {
    if (j->engine != mt_job_engine_local()) {
        MT_CHECK(mt_job_agree(&j->sync, "agree_llmc_init", mt_job_init_llmc(j)));
    }
    MT_CHECK(mt_job_agree(&j->sync, "agree_ckpt_init", mt_job_ckpt_init(j, &j->ckpt)));
    MT_CHECK(mt_job_agree(&j->sync, "agree_ckpt_resume", mt_job_ckpt_resume(j->ckpt, j)));
    if (j->out && mt_job_ckpt_resumed_from(j->ckpt)) { /* said once every rank has loaded its part */
        fprintf(j->out, "resumed from checkpoint %s (after step %lld)\n", mt_job_ckpt_resumed_from(j->ckpt),
                (long long)j->start_step);
    }
    MT_CHECK(mt_job_agree(&j->sync, "agree_metrics_init", mt_job_metrics_init(j, &j->metrics)));
    MT_CHECK(mt_job_agree(&j->sync, "agree_profile_init", mt_job_profile_init(j, &j->profile)));
    mt_job_profile_hooks(j->profile, j);
    return MT_OK;
}

static void print_header(job_t *j) {
    const mt_config_t *cfg = j->cfg;
    fprintf(j->out, "effective configuration:\n");
    mt_config_print(cfg, j->out);
    if (j->opts->mesh_desc) {
        fprintf(j->out, "mesh: %s\n", j->opts->mesh_desc);
    } else {
        fprintf(j->out, "mesh: %d rank%s = dp %d x tp 1 x pp 1\n", j->world, j->world == 1 ? "" : "s", j->info.dp_size);
    }
    if (!j->engine->peak_flops) { /* the CPU engine: its matrix products are OpenBLAS's */
        fprintf(j->out, "matrix library: %s\n", mt_blas_describe());
        fprintf(j->out, "matrix products: %s\n", mt_matmul_describe());
        fprintf(j->out, "cpu kernels: %s\n", mt_layers_isa());
    }
    double n = (double)j->n_params;
    fprintf(j->out,
            "meshtrain train: %s (n_layer %lld, n_embd %lld), %.3fM parameters | %lld steps of %lld x %lld tokens "
            "(micro-batch %lld x %lld) | %s lr %g %s | data %s | engine %s\n",
            mt_config_str(cfg, "model.kind"), (long long)mt_model_config(j->model)->n_layer,
            (long long)mt_model_config(j->model)->n_embd, n / 1e6, (long long)mt_config_int(cfg, "train.steps"),
            (long long)j->info.global_batch, (long long)j->info.seq_len, (long long)j->info.micro_batch,
            (long long)j->info.grad_accum, j->set.optim.kind == MT_OPTIM_SGD ? "sgd" : "adamw", j->sched.lr,
            j->sched.kind == MT_LR_CONSTANT ? "constant" : "cosine", mt_config_str(cfg, "data.kind"), j->engine->name);
    const char *more = j->engine->describe ? j->engine->describe(j->ectx) : NULL;
    if (more) {
        fprintf(j->out, "engine %s: %s\n", j->engine->name, more);
    }
    if (j->info.init_llmc) {
        fprintf(j->out, "initial weights: llm.c checkpoint %s\n", j->info.init_llmc);
    }
    const char *src = NULL;
    double peak = mt_job_metrics_peak(j->metrics, &src);
    bool why = peak <= 0 && j->engine->peak_flops && src[0]; /* a device engine says why it has no peak */
    fprintf(j->out, "model FLOPs %.3g per token (6N + attention); peak %s%s%s%s%s\n", j->flops_per_token,
            peak > 0 ? "" : "unknown: no MFU", peak > 0 ? src : "", why ? " (peak " : "", why ? src : "",
            why ? ")" : "");
    if (j->scatter) {
        fprintf(j->out,
                "data: dp rank 0 loads the %lld rows of each step for its %d-rank group and scatters every "
                "micro-batch (%lld rows per rank); the other ranks open no training data\n",
                (long long)j->info.global_batch, j->info.dp_size, (long long)j->info.micro_batch);
    }
    if (j->start_step > 0) {
        fprintf(j->out, "resuming after step %lld\n", (long long)j->start_step);
    }
    if (!strcmp(mt_config_str(cfg, "data.kind"), "synthetic")) {
        int64_t v = mt_model_config(j->model)->vocab_size;
        fprintf(j->out,
                "synthetic data: Markov chain with %d successors per token; a perfect model reaches loss "
                "%.4f, a uniform guess %.4f\n",
                (int)MT_MIN((int64_t)MT_SYNTH_BRANCH, v), mt_synth_entropy(v), log((double)v));
    }
    fflush(j->out);
}

static mt_status_t train(job_t *j, mt_job_result_t *r) {
    const mt_config_t *cfg = j->cfg;
    int64_t steps = mt_config_int(cfg, "train.steps"), eval_every = mt_config_int(cfg, "train.eval_every");
    float clip = j->set.grad_clip;
    bool skip_nan = !strcmp(mt_config_str(cfg, "train.on_nan"), "skip");
    double tokens = (double)(j->info.global_batch * j->info.seq_len), train_s = 0.0;
    r->first_step = j->start_step;
    for (int64_t s = j->start_step; s < steps; s++) {
        mt_job_profile_step_begin(j->profile, s);
        mt_step_rec_t rec = {.step = s + 1};
        MT_TRACE_BEGIN(t_step);
        double t0 = mt_now();
        mt_watchdog_test_fault(s + 1, j->rank); /* MESHTRAIN_TEST_HANG_STEP / _KILL_STEP (tests only) */
        const mt_batch_t *b = NULL;
        MT_TRACE_BEGIN(t_data);
        if (j->train) { /* NULL on the ranks an engine's root loads for */
            MT_CHECK(mt_data_get(j->train, s, &b));
            rec.data_rows = b->rows;
        }
        MT_TRACE_END(t_data, "data", "data");
        rec.data_s = mt_now() - t0;
        MT_CHECK(j->engine->zero_grads(j->ectx));
        double loss = 0.0, sumsq = 0.0, norm = 0.0;
        float scale = mt_loss_scaler_scale(&j->scaler); /* 1 unless fp16 */
        rec.loss_scale = mt_loss_scaler_scale(mt_job_scaler(j)); /* a device engine's own scaler in fp16 */
        bool force_overflow = j->scaler.dynamic && s + 1 == mt_param_test_overflow_step() &&
                              (mt_param_test_overflow_rank() < 0 || mt_param_test_overflow_rank() == j->rank);
        if (force_overflow) {
            MT_WARN("test knob: loss scale x 2^24 on rank %d at step %lld (an fp16 overflow)", j->rank,
                    (long long)s + 1);
        }
        mt_model_set_loss_scale(j->model, force_overflow ? scale * 16777216.0f : scale);
        MT_CHECK(run_batch(j, b, true, &loss, &rec));
        if (j->engine->take_comm_s) { /* communication inside forward/backward is not compute */
            double c = j->engine->take_comm_s(j->ectx), fb = rec.fwd_s + rec.bwd_s;
            c = fb > 0 ? MT_MIN(c, fb) : 0.0;
            if (fb > 0) {
                rec.fwd_s -= c * rec.fwd_s / fb;
                rec.bwd_s -= c * rec.bwd_s / fb;
            }
            rec.comm_s += c;
        }
        double tc = mt_now();
        MT_TRACE_BEGIN(t_comm);
        MT_CHECK(j->engine->finish_grads(j->ectx));
        mt_model_test_inject_nan(j->model, s + 1, j->rank); /* MESHTRAIN_TEST_NAN_STEP (tests only) */
        MT_CHECK(j->engine->grad_sumsq(j->ectx, &sumsq));
        /* fp16: the gradients carry the loss scale. grad_sumsq is all-reduced, so an inf/NaN in any rank's
         * share makes it non-finite everywhere (the verdict is still agreed below, for a copy only one rank
         * holds). The norm and the clip coefficient are of the unscaled gradient; 1/scale is folded into the
         * step's gradient multiplier. */
        bool overflow = j->scaler.dynamic && !isfinite(sumsq);
        double inv_scale = 1.0 / (double)scale; /* exact for a power-of-two scale (the default) */
        float coef = mt_clip_coef(sumsq * inv_scale * inv_scale, clip, &norm);
        float lr = mt_lr_at(&j->sched, s);
        MT_CHECK(j->engine->reduce_loss(j->ectx, &loss));
        MT_TRACE_END(t_comm, "comm", "gradients: finish, norm, loss");
        rec.comm_s += mt_now() - tc;
        /* Every rank takes the same decision, naming the module whose gradients went non-finite first. In
         * fp16 non-finite gradients are the loss scaler's business (agreed separately, so a rank whose own
         * copy alone went bad still skips with the others) and only a non-finite loss is train.on_nan's. */
        bool local_ok = isfinite(loss) && (j->scaler.dynamic || isfinite(norm));
        mt_nan_verdict_t nv;
        uint64_t nan_call = mt_job_sync_begin(&j->sync, "nan_agree", 2 * sizeof(int)); /* watched like the rest */
        MT_CHECK(mt_nan_agree(j->comm, local_ok, local_ok ? -1 : mt_model_first_nonfinite_grad(j->model, NULL, 0),
                              &nv));
        mt_job_sync_end(&j->sync, nan_call);
        if (j->scaler.dynamic && nv.finite) {
            mt_nan_verdict_t gv;
            uint64_t inf_call = mt_job_sync_begin(&j->sync, "fp16_overflow", 2 * sizeof(int));
            MT_CHECK(mt_nan_agree(j->comm, isfinite(sumsq), -1, &gv));
            mt_job_sync_end(&j->sync, inf_call);
            overflow = !gv.finite;
        }
        const char *bad_module = nv.module >= 0 ? mt_model_module_name(j->model, nv.module) : "?";
        if (nv.finite && mt_loss_scaler_update(&j->scaler, overflow)) {
            rec.skipped = true; /* fp16 overflow: no update, the scale halved (the same on every rank) */
            r->n_overflow++;
            MT_WARN("step %lld: fp16 gradients overflowed at loss scale %g (inf/NaN on some rank): update skipped, "
                    "loss scale now %g",
                    (long long)s + 1, (double)scale, (double)mt_loss_scaler_scale(&j->scaler));
        } else if (nv.finite) {
            double to = mt_now();
            MT_TRACE_BEGIN(t_opt);
            int64_t skips = mt_job_scaler(j)->n_skipped; /* an engine scaling on its device skips in its step */
            MT_CHECK(j->engine->step(j->ectx, lr, (float)((double)coef * inv_scale)));
            if (mt_job_scaler(j)->n_skipped > skips) {
                rec.skipped = true;
                r->n_overflow++;
            }
            MT_TRACE_END(t_opt, "optimizer", "optimizer");
            rec.opt_s = mt_now() - to;
            if (j->engine->comm_bytes) {
                rec.has_bytes = true;
                j->engine->comm_bytes(j->ectx, &rec.bytes_model, &rec.bytes_other);
                rec.has_groups = j->engine->comm_bytes_groups != NULL;
                if (rec.has_groups) {
                    j->engine->comm_bytes_groups(j->ectx, &rec.bytes_tp, &rec.bytes_pp, &rec.bytes_dp);
                }
            }
        } else if (skip_nan) {
            rec.skipped = true;
            r->n_skipped++;
            MT_WARN("step %lld: loss %g, gradient norm %g (non-finite gradients first in module '%s'): skipping the "
                    "update (train.on_nan = skip)", (long long)s + 1, loss, norm, bad_module);
        } else {
            r->loss[s] = loss;
            r->n_steps = s + 1;
            char msg[2048]; /* no checkpoint is written for this step: the loop stops before it */
            mt_nan_describe(msg, sizeof(msg), s + 1, loss, norm, &nv, bad_module, mt_job_ckpt_last(j->ckpt));
            return mt_error(MT_ERR_INTERNAL, "%s", msg);
        }
        double dt = mt_now() - t0;
        if (j->engine->step_energy) {
            rec.has_energy = j->engine->step_energy(j->ectx, &rec.energy_j);
        }
        if (mt_trace_on()) {
            char args[64];
            snprintf(args, sizeof(args), "\"step\": %lld", (long long)s + 1);
            mt_trace_span("step", "step", t_step, mt_trace_now_us(), args);
        }
        train_s += dt;
        r->loss[s] = loss;
        r->lr[s] = lr;
        r->grad_norm[s] = norm;
        r->n_steps = s + 1;
        rec.loss = loss;
        rec.lr = lr;
        rec.grad_norm = norm;
        rec.step_s = dt;
        if (j->val && eval_every > 0 && ((s + 1) % eval_every == 0 || s + 1 == steps)) {
            double vl = 0.0;
            MT_TRACE_BEGIN(t_eval);
            MT_CHECK(evaluate(j, &vl));
            MT_TRACE_END(t_eval, "eval", "validation");
            r->eval_step[r->n_evals] = s + 1;
            r->val_loss[r->n_evals++] = vl;
            rec.has_val = true;
            rec.val_loss = vl;
        }
        MT_CHECK(mt_job_metrics_step(j->metrics, j, &rec, s + 1 == steps));
        MT_CHECK(mt_job_ckpt_after_step(j->ckpt, j, s, s + 1 == steps));
        MT_CHECK(mt_job_profile_step_end(j->profile, j, s)); /* after the checkpoint, so the trace shows it */
        if (j->opts->stop_after > 0 && s + 1 >= j->opts->stop_after && s + 1 < steps) {
            break; /* interrupted on purpose (tests of resuming) */
        }
    }
    int64_t ran = r->n_steps - j->start_step;
    r->loss_scale = mt_loss_scaler_scale(mt_job_scaler(j));
    r->seconds = train_s;
    r->tokens_per_s = train_s > 0 ? tokens * (double)ran / train_s : 0.0;
    return MT_OK;
}

mt_status_t mt_job_run(const mt_config_t *cfg, const mt_job_opts_t *opts_in, mt_job_result_t *res) {
    mt_job_opts_t opts = MT_JOB_OPTS_INIT;
    if (opts_in) {
        if (opts_in->size != sizeof(mt_job_opts_t)) {
            return mt_error(MT_ERR_INVALID_ARG, "mt_job_run: opts.size not set (use MT_JOB_OPTS_INIT)");
        }
        opts = *opts_in;
    }
    const mt_world_t *w = mt_rt_world();
    job_t j = {.cfg = cfg,
               .opts = &opts,
               .engine = opts.engine ? opts.engine : mt_job_engine_local(),
               .rank = w->rank,
               .world = w->size,
               .comm = w->comm};
    j.out = w->rank == 0 ? opts.progress : NULL;
    mt_job_result_t r = {0};
    int64_t steps = mt_config_int(cfg, "train.steps"), eval_every = mt_config_int(cfg, "train.eval_every");
    int64_t evals = eval_every > 0 ? steps / eval_every + 1 : 0;
    mt_job_sync_init(&j.sync, w->comm);
    /* The hang watchdog, from the first agreement on: it watches every communicator the engine creates and
     * the loop's own calls (job_sync.c), with runtime.watchdog_s (docs/reliability.md), unless the caller
     * runs one already; its report lands next to the trace. */
    bool own_wd = false;
    mt_status_t st = MT_OK;
    if (!mt_watchdog_running()) {
        mt_watchdog_params_t wp = MT_WATCHDOG_PARAMS_INIT;
        wp.timeout_s = mt_config_float(cfg, "runtime.watchdog_s");
        char report[1100] = "";
        if (mt_config_str(cfg, "profile.trace")[0]) {
            snprintf(report, sizeof(report), "%s.desync.json", mt_config_str(cfg, "profile.trace"));
            wp.report_path = report; /* copied by mt_watchdog_start */
        }
        st = mt_watchdog_start(&wp);
        own_wd = st == MT_OK;
    }
    if (st == MT_OK) {
        st = mt_settings_read(cfg, &j.set);
    }
    if (st == MT_OK) {
        st = check_layout(&j.set, &opts, w->size);
    }
    if (st == MT_OK) {
        st = result_alloc(&r, steps, evals);
    }
    if (st == MT_OK) {
        st = setup(&j);
        if (st == MT_ERR_IO) {
            st = MT_ERR_INVALID_ARG; /* an input file (data, checkpoint) that cannot be read is bad input */
        }
    }
    st = mt_job_agree(&j.sync, "agree_setup", st);
    if (st == MT_OK) {
        st = setup_services(&j);
        if (st == MT_ERR_IO) {
            st = MT_ERR_INVALID_ARG;
        }
        st = mt_job_agree(&j.sync, "agree_services", st);
    }
    if (st == MT_OK) {
        r.n_params = j.n_params;
        if (j.out) {
            print_header(&j);
        }
        st = train(&j, &r);
        st = mt_job_agree(&j.sync, "agree_train", st);
        r.stop_signal = j.stop_signal;
        if (st == MT_OK) {
            st = mt_job_agree(&j.sync, "agree_finish", mt_job_metrics_finish(j.metrics, &j, &r));
        }
    }
    if (own_wd) {
        mt_watchdog_stop(); /* collective: every rank gets here (the statuses were agreed) */
    }
    mt_job_profile_free(j.profile, &j);
    mt_job_metrics_free(j.metrics);
    mt_job_ckpt_free(j.ckpt);
    if (j.ectx) {
        j.engine->free(j.ectx);
    }
    mt_data_close(j.train);
    mt_data_close(j.val);
    mt_free(j.mb_buf);
    mt_acts_free(j.acts);
    mt_model_free(j.model);
    mt_matmul_release();
    mt_job_sync_free(&j.sync);
    if (res) {
        *res = r; /* on failure: the steps that ran */
    } else {
        mt_job_result_free(&r);
    }
    return st;
}
