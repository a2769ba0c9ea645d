/* Loss scaler and master weights (see precision.h). Small on purpose: the GPU path runs the same state
 * machine on the host and only the per-element work (rounding, inf checks, the update) is on the device.
 * SPDX-License-Identifier: MIT */
#include "precision.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "alloc.h"

static const char *prec_names[MT_PREC_COUNT] = {"fp32", "tf32", "bf16", "fp16"};

bool mt_prec_parse(const char *s, mt_prec_t *out) {
    for (int i = 0; s && i < MT_PREC_COUNT; i++) {
        if (!strcmp(s, prec_names[i])) {
            *out = (mt_prec_t)i;
            return true;
        }
    }
    return false;
}

const char *mt_prec_name(mt_prec_t p) {
    return (unsigned)p < MT_PREC_COUNT ? prec_names[p] : "?";
}

mt_dtype_t mt_prec_storage(mt_prec_t p) {
    return p == MT_PREC_BF16 ? MT_BF16 : p == MT_PREC_FP16 ? MT_F16 : MT_F32;
}

/* x rounded to bf16 in place (mt_bf16_round, branch-free so it vectorises), threaded over large arrays;
 * returns the non-finite results. */
static size_t round_bf16(float *x, size_t n) {
    size_t bad = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : bad) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        uint32_t r = (uint32_t)mt_bf16_round(x[i]) << 16;
        bad += (r & 0x7f800000u) == 0x7f800000u;
        x[i] = mt_bits_f32(r);
    }
    return bad;
}

/* x rounded to dt (f32: unchanged). */
static inline float round_dt(float x, mt_dtype_t dt) {
    if (dt == MT_BF16) {
        return mt_bits_f32((uint32_t)mt_bf16_round(x) << 16);
    }
    return dt == MT_F16 ? mt_f16_to_f32(mt_f32_to_f16(x)) : x;
}

size_t mt_prec_round(float *x, size_t n, mt_dtype_t dt) {
    size_t bad = 0;
    if (dt == MT_BF16) {
        bad = round_bf16(x, n);
    } else if (dt == MT_F16) {
        for (size_t i = 0; i < n; i++) {
            x[i] = round_dt(x[i], MT_F16);
            bad += !isfinite(x[i]);
        }
    } else {
        bad = mt_prec_count_nonfinite(x, n);
    }
    return bad;
}

void mt_prec_round_copy(float *dst, const float *src, size_t n, mt_dtype_t dt) {
    if (dt == MT_BF16) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; i++) {
            dst[i] = round_dt(src[i], MT_BF16);
        }
        return;
    }
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        dst[i] = round_dt(src[i], dt);
    }
}

void mt_prec_round_add(float *dst, const float *g, size_t n, mt_dtype_t dt) {
    if (dt == MT_BF16) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; i++) {
            dst[i] += round_dt(g[i], MT_BF16);
        }
        return;
    }
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        dst[i] += round_dt(g[i], dt);
    }
}

size_t mt_prec_count_nonfinite(const float *x, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        bad += !isfinite(x[i]);
    }
    return bad;
}

/* ---- loss scaler ---- */

mt_status_t mt_loss_scaler_init(mt_loss_scaler_t *s, mt_prec_t mode, float init_scale, int64_t window) {
    memset(s, 0, sizeof(*s));
    if ((unsigned)mode >= MT_PREC_COUNT) {
        return mt_error(MT_ERR_INVALID_ARG, "precision: unknown mode %d", (int)mode);
    }
    s->growth = 2.0f;
    s->backoff = 0.5f;
    s->min_scale = 1.0f;
    s->max_scale = 16777216.0f;
    s->scale = 1.0f;
    s->window = 1;
    if (mode != MT_PREC_FP16) {
        return MT_OK;
    }
    if (!(init_scale >= s->min_scale && init_scale <= s->max_scale)) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "precision.init_scale = %g is outside [1, 16777216] (use a power of two such as 65536)",
                        (double)init_scale);
    }
    if (window < 1) {
        return mt_error(MT_ERR_INVALID_ARG, "precision.scale_window = %lld must be >= 1", (long long)window);
    }
    s->dynamic = true;
    s->scale = init_scale;
    s->window = window;
    return MT_OK;
}

float mt_loss_scaler_scale(const mt_loss_scaler_t *s) {
    return s->scale;
}

float mt_loss_scaler_inv_scale(const mt_loss_scaler_t *s) {
    return 1.0f / s->scale;
}

bool mt_loss_scaler_update(mt_loss_scaler_t *s, int found_inf) {
    s->n_steps++;
    if (!s->dynamic) {
        return false;
    }
    if (found_inf) {
        s->n_skipped++;
        s->clean_steps = 0;
        float next = s->scale * s->backoff;
        s->scale = next < s->min_scale ? s->min_scale : next;
        MT_INFO(MT_LOG_TRAIN, "loss scale: overflow, skipping the step; scale now %g", (double)s->scale);
        return true;
    }
    if (++s->clean_steps >= s->window) {
        s->clean_steps = 0;
        float next = s->scale * s->growth;
        s->scale = next > s->max_scale ? s->max_scale : next;
        MT_INFO(MT_LOG_TRAIN, "loss scale: %lld clean steps; scale now %g", (long long)s->window, (double)s->scale);
    }
    return false;
}

/* ---- master weights ---- */

struct mt_master {
    mt_prec_t mode;
    float *params; /* the caller's buffer (rounded copy in bf16/fp16) */
    float *master; /* owned f32 copy (bf16/fp16) or == params */
    size_t n;
};

mt_status_t mt_master_init(mt_prec_t mode, float *params, size_t n, mt_master_t *out) {
    *out = NULL;
    if ((unsigned)mode >= MT_PREC_COUNT) {
        return mt_error(MT_ERR_INVALID_ARG, "precision: unknown mode %d", (int)mode);
    }
    if (!params && n > 0) {
        return mt_error(MT_ERR_INVALID_ARG, "precision: master weights of %zu parameters need a buffer", n);
    }
    struct mt_master *m = mt_calloc(sizeof(*m), MT_MEM_OTHER, "precision.master");
    if (!m) {
        return mt_error(MT_ERR_OOM, "precision: no memory for the master-weight state");
    }
    m->mode = mode;
    m->params = params;
    m->n = n;
    m->master = params;
    if (mt_prec_storage(mode) != MT_F32) {
        m->master = mt_alloc(n * sizeof(float), MT_MEM_OPTIMIZER, "precision.master_weights");
        if (!m->master) {
            mt_free(m);
            return mt_error(MT_ERR_OOM, "precision: no memory for %zu f32 master weights", n);
        }
        memcpy(m->master, params, n * sizeof(float));
        mt_master_publish(m);
    }
    *out = m;
    return MT_OK;
}

float *mt_master_weights(mt_master_t m) {
    return m->master;
}

void mt_master_publish(mt_master_t m) {
    mt_dtype_t dt = mt_prec_storage(m->mode);
    if (dt == MT_F32) {
        return;
    }
    memcpy(m->params, m->master, m->n * sizeof(float));
    mt_prec_round(m->params, m->n, dt);
}

int mt_master_prepare_grads(mt_master_t m, float *grads, size_t n) {
    return mt_prec_round(grads, n, mt_prec_storage(m->mode)) > 0;
}

mt_prec_t mt_master_mode(mt_master_t m) {
    return m->mode;
}

void mt_master_free(mt_master_t m) {
    if (!m) {
        return;
    }
    if (m->master != m->params) {
        mt_free(m->master);
    }
    mt_free(m);
}
