/* The device GPT-2 trainer's optimizer step (fused AdamW or SGD over the slice, the device-side clip, the fp16 skip),
 * the gradient statistics an engine reduces over its ranks, the per-kernel profile, and the state engines and
 * checkpoints read and set (models/cuda/gpt2_cuda.c builds the trainer and runs forward and backward).
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <string.h>

#include "models/cuda/gpt2_cuda_impl.h"
#include "runtime/alloc.h"

static const char *prof_names[MT_GPT2_PROF_COUNT] = {"matmul fwd",    "matmul bwd",    "layernorm fwd", "layernorm bwd",
                                                     "attention fwd", "attention bwd", "gelu",          "embedding",
                                                     "softmax+ce",    "optimizer",     "memset/copy",   "tp comm"};

const char *mt_gpt2_prof_name(mt_gpt2_prof_t c) {
    return (unsigned)c < MT_GPT2_PROF_COUNT ? prof_names[c] : "?";
}

mt_status_t mt_gpt2_cuda_set_profile(mt_gpt2_cuda_t g, bool on) {
    if (on && !g->marks) {
        g->marks = mt_calloc(PROF_MARKS * sizeof(cudaEvent_t), MT_MEM_OTHER, "gpt2_cuda profile events");
        if (!g->marks) {
            return mt_error(MT_ERR_OOM, "gpt2_cuda: no memory for profile events");
        }
        for (int i = 0; i < PROF_MARKS; i++) {
            CK(cudaEventCreate(&g->marks[i]));
        }
    }
    g->prof = on;
    g->n_marks = 0;
    return MT_OK;
}

void mt_gpt2_cuda_profile(mt_gpt2_cuda_t g, double *ms, int64_t *steps) {
    memcpy(ms, g->prof_ms, sizeof(g->prof_ms));
    *steps = g->prof_steps;
}

/* After a synchronisation: adds every launch's time to its category and clears the marks. */
static mt_status_t prof_collect(mt_gpt2_cuda_t g) {
    for (int k = 1; k < g->n_marks; k++) {
        if (g->mark_cat[k] >= 0) {
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, g->marks[k - 1], g->marks[k]));
            g->prof_ms[g->mark_cat[k]] += ms;
        }
    }
    if (g->n_marks > 0) {
        g->prof_steps++;
    }
    g->n_marks = 0;
    return MT_OK;
}

/* The optimizer (op: params.opt_state's) as the CPU's mt_optim_step would run it, before g->t counts the step: its
 * state buffers allocated, or an error naming the mismatch. */
static mt_status_t check_optim(mt_gpt2_cuda_t g, const mt_optim_params_t *op) {
    int need = mt_optim_state_buffers(op);
    if (need != g->p.opt_state) {
        return mt_error(MT_ERR_INVALID_USAGE, "gpt2_cuda: the %s step keeps %d state buffer(s), the trainer was "
                        "built with params.opt_state = %d", op->kind == MT_OPTIM_SGD ? "SGD" : "AdamW", need,
                        g->p.opt_state);
    }
    return MT_OK;
}

/* The fused optimizer (AdamW, or SGD with or without momentum) over every parameter of the slice at step g->t: one
 * launch per run of consecutive parameters with the same weight-decay flag, each gradient times grad_scale (and
 * *coef when given on the device; skip: a device flag that, when set, makes the update change nothing),
 * refreshing the low-precision compute copy. */
static mt_status_t optim_all(mt_gpt2_cuda_t g, const mt_optim_params_t *op, float lr, float grad_scale,
                             const float *coef, const int *skip) {
    void *s = g->stream;
    for (int i = 0; i < g->n_params;) {
        int j = i + 1;
        while (j < g->n_params && g->decay[j] == g->decay[i]) {
            j++;
        }
        /* the run's part in this model's slice */
        size_t lo = MT_MAX(g->offs[i], g->sh_lo), hi = MT_MIN(j < g->n_params ? g->offs[j] : g->numel, g->sh_hi);
        if (lo < hi) {
            float wd = g->decay[i] ? op->weight_decay : 0.0f;
            size_t k = lo - g->sh_lo;
            /* the low-precision copy of these elements: in the whole copy, or ZeRO-3's slice of it */
            void *lp = g->dt == MT_CU_F32 ? NULL
                       : g->zero3         ? (char *)g->wslice + k * g->es
                                          : (char *)g->wc + lo * g->es;
            const float *gr = g->zero2 ? g->gshard + k : g->grads + lo;
            if (op->kind == MT_OPTIM_SGD) { /* the momentum buffer, if any, in adam_m; the first step sets it */
                OP(PROF_OPT, mt_cuda_sgd(g->master + k, gr, g->adam_m ? g->adam_m + k : NULL, hi - lo, lr,
                                         op->momentum, wd, g->t == 1, grad_scale, coef, skip, lp, g->dt, s));
            } else {
                OP(PROF_OPT, mt_cuda_adamw(g->master + k, gr, g->adam_m + k, g->adam_v + k, hi - lo, lr, op->beta1,
                                           op->beta2, op->eps, wd, g->t, grad_scale, coef, skip, lp, g->dt, s));
            }
        }
        i = j;
    }
    for (int k = 0; g->zero3 && k < 3; k++) { /* ZeRO-3: every gathered weight is now stale */
        g->wslot[k] = -1;
        g->outer_stale = true;
    }
    return MT_OK;
}

mt_status_t mt_gpt2_cuda_step(mt_gpt2_cuda_t g, const mt_optim_params_t *op, float lr, float max_norm) {
    MT_CHECK(check_optim(g, op));
    if (g->stepped) {
        return mt_error(MT_ERR_INVALID_USAGE, "gpt2_cuda: call mt_gpt2_cuda_step_result after each step");
    }
    if (g->sh_n > 1 || g->tp > 1) {
        return mt_error(MT_ERR_INVALID_USAGE,
                        "gpt2_cuda: a %s model's gradient norm spans its ranks: use mt_gpt2_cuda_grad_stats and "
                        "mt_gpt2_cuda_step_scaled",
                        g->tp > 1 ? "tensor-parallel" : "sharded");
    }
    void *s = g->stream;
    const int *skip = NULL;
    MT_CHECK(gpt2_cuda_prof_mark(g, MT_GPT2_PROF_START));
    if (g->scaler.dynamic) {
        OP(PROF_OTHER, cudaMemsetAsync(g->found_inf, 0, sizeof(int), g->stream));
        OP(PROF_OPT, mt_cuda_check_finite(g->found_inf, g->grads, g->numel, MT_CU_F32, s));
        skip = g->found_inf;
    }
    OP(PROF_OPT, mt_cuda_sumsq(g->sumsq, g->grads, g->numel, g->sumsq_scratch, s));
    OP(PROF_OPT, mt_cuda_clip_coef(g->coef, g->norm, g->sumsq, max_norm, mt_loss_scaler_inv_scale(&g->scaler), s));
    g->t++;
    MT_CHECK(optim_all(g, op, lr, 1.0f, g->coef, skip));
    g->stepped = true;
    return MT_OK;
}

mt_status_t mt_gpt2_cuda_step_result(mt_gpt2_cuda_t g, mt_gpt2_cuda_result_t *r) {
    struct gpt2_cuda_readback *rb = g->rb;
    CK(cudaMemcpyAsync(&rb->loss, g->A->mean_loss, 4, cudaMemcpyDeviceToHost, g->stream));
    CK(cudaMemcpyAsync(&rb->norm, g->norm, 4, cudaMemcpyDeviceToHost, g->stream));
    if (g->scaler.dynamic) {
        CK(cudaMemcpyAsync(&rb->found_inf, g->found_inf, 4, cudaMemcpyDeviceToHost, g->stream));
    }
    CK(cudaStreamSynchronize(g->stream));
    MT_CHECK(prof_collect(g));
    r->loss = rb->loss;
    r->grad_norm = rb->norm;
    int found = g->scaler.dynamic ? rb->found_inf : 0;
    r->skipped = false;
    if (g->stepped) {
        r->skipped = mt_loss_scaler_update(&g->scaler, found);
        if (r->skipped) {
            g->t--; /* the device left everything untouched: the step does not count (bias correction; SGD's
                     * first step) */
        }
        g->stepped = false;
    }
    r->loss_scale = mt_loss_scaler_scale(&g->scaler);
    return MT_OK;
}

mt_status_t mt_gpt2_cuda_loss(mt_gpt2_cuda_t g, float *loss) {
    CK(cudaMemcpyAsync(&g->rb->loss, g->A->mean_loss, 4, cudaMemcpyDeviceToHost, g->stream));
    CK(cudaStreamSynchronize(g->stream)); /* one wait: the copy rides the stream into pinned memory */
    *loss = g->rb->loss;
    return MT_OK;
}

mt_status_t mt_gpt2_cuda_get_grads(mt_gpt2_cuda_t g, float *host) {
    if (g->zero2) {
        return mt_error(MT_ERR_INVALID_USAGE, "gpt2_cuda: ZeRO-2 keeps no whole gradient to copy");
    }
    CK(cudaStreamSynchronize(g->stream));
    CK(cudaMemcpy(host, g->grads, g->numel * 4, cudaMemcpyDeviceToHost));
    return MT_OK;
}

mt_status_t mt_gpt2_cuda_get_params(mt_gpt2_cuda_t g, float *host) {
    if (g->zero3 || (g->sh_n > 1 && g->dt != MT_CU_F32)) {
        return mt_error(MT_ERR_INVALID_USAGE,
                        "gpt2_cuda: a sharded model in %s%s holds the master weights of its slice only: use "
                        "mt_gpt2_cuda_get_state",
                        mt_prec_name(g->p.prec), g->zero3 ? " under ZeRO-3" : "");
    }
    CK(cudaStreamSynchronize(g->stream));
    CK(cudaMemcpy(host, g->dt == MT_CU_F32 ? (float *)g->wc : g->master, g->numel * 4, cudaMemcpyDeviceToHost));
    return MT_OK;
}

void *mt_gpt2_cuda_stream(mt_gpt2_cuda_t g) {
    return g->stream;
}

size_t mt_gpt2_cuda_activation_bytes(mt_gpt2_cuda_t g) {
    return g->act_bytes;
}

void mt_gpt2_cuda_set_grad_hook(mt_gpt2_cuda_t g, mt_gpt2_cuda_grad_hook_t fn, void *arg) {
    g->hook = fn;
    g->hook_arg = arg;
}

float *mt_gpt2_cuda_grads(mt_gpt2_cuda_t g) {
    return g->grads;
}

float *mt_gpt2_cuda_wte_grad(mt_gpt2_cuda_t g) {
    return g->held[0] && (!g->zero2 || g->tied_acc > 0) ? G(0) : NULL;
}

float *mt_gpt2_cuda_grad_slice(mt_gpt2_cuda_t g) {
    return g->gshard;
}

void mt_gpt2_cuda_set_comm_stream(mt_gpt2_cuda_t g, void *stream) {
    g->consumer = (cudaStream_t)stream;
}

const float *mt_gpt2_cuda_loss_dev(mt_gpt2_cuda_t g) {
    return g->A->mean_loss;
}

mt_status_t mt_gpt2_cuda_grad_stats(mt_gpt2_cuda_t g, double *sumsq, bool *nonfinite) {
    void *s = g->stream;
    int found = 0;
    MT_CHECK(gpt2_cuda_prof_mark(g, MT_GPT2_PROF_START));
    const float *gs = g->zero2 ? g->gshard : g->grads + g->sh_lo;
    size_t n = g->sh_hi - g->sh_lo, a0 = g->sh_lo; /* gs holds the layout's [a0, a0 + n) */
    if (g->tied && g->last && !g->first && a0 < g->offs[1]) { /* the tied wte's second copy: the first stage's counts */
        size_t skip = MT_MIN(g->offs[1], a0 + n) - a0;
        gs += skip;
        n -= skip;
        a0 += skip;
    }
    if (g->scaler.dynamic) {
        OP(PROF_OTHER, cudaMemsetAsync(g->found_inf, 0, sizeof(int), g->stream));
        if (n > 0) {
            OP(PROF_OPT, mt_cuda_check_finite(g->found_inf, gs, n, MT_CU_F32, s));
        }
    }
    /* tp: the whole parameters' gradients are the same on every tp rank, and rank 0's count: another rank sums
     * its sharded runs only */
    bool shards_only = g->tp > 1 && g->tpr != 0;
    if (!shards_only && n > 0) {
        OP(PROF_OPT, mt_cuda_sumsq(g->sumsq, gs, n, g->sumsq_scratch, s));
    } else if (!shards_only) {
        OP(PROF_OTHER, cudaMemsetAsync(g->sumsq, 0, sizeof(double), g->stream));
    }
    if (shards_only && g->n_shd > 0) {
        OP(PROF_OTHER, cudaMemsetAsync(g->shd_sumsq, 0, (size_t)g->n_shd * sizeof(double), g->stream));
    }
    for (int k = 0; shards_only && k < g->n_shd; k++) {
        size_t lo = MT_MAX(g->shd_lo[k], a0), hi = MT_MIN(g->shd_hi[k], a0 + n);
        if (lo < hi) {
            OP(PROF_OPT, mt_cuda_sumsq(g->shd_sumsq + k, gs + (lo - a0), hi - lo, g->sumsq_scratch, s));
        }
    }
    /* the scalars into pinned memory behind the work, then the one wait */
    struct gpt2_cuda_readback *rb = g->rb;
    if (!shards_only) {
        CK(cudaMemcpyAsync(&rb->sumsq, g->sumsq, sizeof(double), cudaMemcpyDeviceToHost, g->stream));
    } else if (g->n_shd > 0) {
        CK(cudaMemcpyAsync(rb->shd, g->shd_sumsq, (size_t)g->n_shd * sizeof(double), cudaMemcpyDeviceToHost,
                           g->stream));
    }
    if (g->scaler.dynamic) {
        CK(cudaMemcpyAsync(&rb->found_inf, g->found_inf, sizeof(int), cudaMemcpyDeviceToHost, g->stream));
    }
    CK(cudaStreamSynchronize(g->stream));
    double ss = shards_only ? 0.0 : rb->sumsq;
    for (int k = 0; shards_only && k < g->n_shd; k++) {
        ss += rb->shd[k];
    }
    if (g->scaler.dynamic) {
        found = rb->found_inf;
    }
    double inv = mt_loss_scaler_inv_scale(&g->scaler);
    g->nonfinite = found != 0 || !isfinite(ss);
    *sumsq = ss * inv * inv;
    *nonfinite = g->nonfinite;
    return MT_OK;
}

void mt_gpt2_cuda_set_nonfinite(mt_gpt2_cuda_t g, bool nonfinite) {
    g->nonfinite = nonfinite;
}

void mt_gpt2_cuda_shard(mt_gpt2_cuda_t g, size_t *lo, size_t *hi, size_t *len) {
    *lo = g->sh_lo;
    *hi = g->sh_hi;
    *len = g->sh_len;
}

void *mt_gpt2_cuda_weights(mt_gpt2_cuda_t g) {
    return g->wc;
}

void *mt_gpt2_cuda_stage_input(mt_gpt2_cuda_t g) {
    return RES(g->lo);
}

void *mt_gpt2_cuda_stage_output(mt_gpt2_cuda_t g) {
    return RES(g->hi);
}

void *mt_gpt2_cuda_stage_grad(mt_gpt2_cuda_t g) {
    return g->dresid;
}

mt_status_t mt_gpt2_cuda_use_acts(mt_gpt2_cuda_t g, int k) {
    if (k < 0 || k >= g->n_sets) {
        return mt_error(MT_ERR_INVALID_ARG, "gpt2_cuda: activation set %d of %d", k, g->n_sets);
    }
    g->A = &g->sets[k];
    return MT_OK;
}

size_t mt_gpt2_cuda_numel(mt_gpt2_cuda_t g) {
    return g->numel;
}

size_t mt_gpt2_cuda_param_offset(mt_gpt2_cuda_t g, int i) {
    return i >= 0 && i < g->n_params && g->held[i] ? g->offs[i] : SIZE_MAX;
}

void *mt_gpt2_cuda_weight_slice(mt_gpt2_cuda_t g) {
    return g->wslice;
}

void mt_gpt2_cuda_set_weight_hook(mt_gpt2_cuda_t g, mt_gpt2_cuda_weight_hook_t fn, void *arg) {
    g->whook = fn;
    g->whook_arg = arg;
}

mt_status_t mt_gpt2_cuda_step_scaled(mt_gpt2_cuda_t g, const mt_optim_params_t *op, float lr, float grad_scale,
                                     bool *skipped) {
    MT_CHECK(check_optim(g, op));
    float inv = mt_loss_scaler_inv_scale(&g->scaler); /* the scale backward used, before the update */
    bool skip = false;
    if (g->scaler.dynamic) {
        skip = mt_loss_scaler_update(&g->scaler, g->nonfinite ? 1 : 0);
    }
    if (skipped) {
        *skipped = skip;
    }
    if (skip) {
        return MT_OK; /* nothing launched: parameters, moments and the step count stay */
    }
    g->t++;
    MT_CHECK(gpt2_cuda_prof_mark(g, MT_GPT2_PROF_START));
    return optim_all(g, op, lr, grad_scale * inv, NULL, NULL);
}

float mt_gpt2_cuda_loss_scale(mt_gpt2_cuda_t g) {
    return mt_loss_scaler_scale(&g->scaler);
}

mt_loss_scaler_t *mt_gpt2_cuda_scaler(mt_gpt2_cuda_t g) {
    return &g->scaler;
}

/* Copies on the compute stream, then waits: a pageable cudaMemcpy may return before its DMA lands, and
 * the non-blocking compute stream would not be ordered after it. */
mt_status_t mt_gpt2_cuda_get_state(mt_gpt2_cuda_t g, float *params, float *m, float *v) {
    size_t n = g->sh_hi - g->sh_lo;
    float *src[2] = {g->adam_m, g->adam_v}, *dst[2] = {m, v};
    for (int i = 0; i < 2; i++) {
        if (dst[i] && src[i]) {
            CK(cudaMemcpyAsync(dst[i], src[i], n * 4, cudaMemcpyDeviceToHost, g->stream));
        }
    }
    for (int i = 0; params && i < g->n_params; i++) { /* each parameter's part of the slice, to its host place */
        const mt_param_t *pp = mt_model_param(g->m, i);
        size_t a = MT_MAX(g->offs[i], g->sh_lo), b = MT_MIN(g->offs[i] + (g->held[i] ? pp->numel : 0), g->sh_hi);
        if (a < b) {
            CK(cudaMemcpyAsync(params + pp->offset + (a - g->offs[i]), g->master + (a - g->sh_lo), (b - a) * 4,
                               cudaMemcpyDeviceToHost, g->stream));
        }
    }
    CK(cudaStreamSynchronize(g->stream));
    return MT_OK;
}

mt_status_t mt_gpt2_cuda_set_state(mt_gpt2_cuda_t g, const float *params, const float *m, const float *v) {
    size_t n = g->sh_hi - g->sh_lo;
    if (params) {
        MT_CHECK(gpt2_cuda_upload_weights(g, params));
    }
    float *dst[2] = {g->adam_m, g->adam_v};
    const float *src[2] = {m, v};
    for (int i = 0; i < 2; i++) {
        if (src[i] && dst[i]) {
            CK(cudaMemcpyAsync(dst[i], src[i], n * 4, cudaMemcpyHostToDevice, g->stream));
        }
    }
    CK(cudaStreamSynchronize(g->stream));
    return MT_OK;
}

int64_t mt_gpt2_cuda_get_step(mt_gpt2_cuda_t g) {
    return g->t;
}

void mt_gpt2_cuda_set_step(mt_gpt2_cuda_t g, int64_t t) {
    g->t = t;
}
