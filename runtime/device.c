/* The device table's calls and the CPU table (runtime/device.h).
 * SPDX-License-Identifier: MIT */
#include "runtime/device_impl.h"

#include <math.h>
#include <string.h>

#include "runtime/flat_ops.h"
#include "runtime/precision.h"

/* ---- the CPU table --------------------------------------------------------------------------------------- */

static mt_status_t cpu_alloc(void **ptr, size_t bytes, mt_mem_cat_t cat, const char *owner, void *stream) {
    (void)stream;
    *ptr = mt_alloc(bytes, cat, owner);
    if (!*ptr) {
        return mt_error(MT_ERR_OOM, "cpu device: out of memory allocating %zu bytes for %s", bytes,
                        owner ? owner : "?");
    }
    return MT_OK;
}

static void cpu_free(void *ptr) {
    mt_free(ptr);
}

static mt_status_t cpu_copy(void *dst, const void *src, size_t bytes, void *stream) {
    (void)stream;
    memcpy(dst, src, bytes);
    return MT_OK;
}

static mt_status_t cpu_zero(void *ptr, size_t bytes, void *stream) {
    (void)stream;
    memset(ptr, 0, bytes);
    return MT_OK;
}

static mt_status_t cpu_order(void *waiter, void *signaller) {
    (void)waiter;
    (void)signaller;
    return MT_OK;
}

static mt_status_t cpu_wait(void *stream) {
    (void)stream;
    return MT_OK;
}

static mt_status_t cpu_add(float *y, const float *x, size_t n, void *stream) {
    (void)stream;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        y[i] += x[i];
    }
    return MT_OK;
}

static mt_status_t cpu_sumsq(double *sumsq, int *nonfinite, const float *x, size_t n, void *stream) {
    (void)stream;
    if (sumsq) {
        *sumsq = mt_clip_sumsq(x, n);
    }
    if (nonfinite && mt_prec_count_nonfinite(x, n) > 0) {
        *nonfinite |= 1;
    }
    return MT_OK;
}

static mt_status_t cpu_clip_coef(float *coef, float *norm_out, const double *sumsq, float max_norm, float inv_scale,
                                 void *stream) {
    (void)stream;
    /* mt_clip_coef's fp32 arithmetic on the unscaled norm (inv_scale 1: the CPU engines' coefficient, bit for bit) */
    double norm = sqrt(*sumsq) * (double)inv_scale;
    float c = 1.0f;
    if (max_norm > 0.0f && isfinite(norm)) {
        c = max_norm / ((float)norm + 1e-6f);
        c = c < 1.0f ? c : 1.0f;
    }
    *coef = c * inv_scale;
    if (norm_out) {
        *norm_out = (float)norm;
    }
    return MT_OK;
}

static mt_status_t cpu_step(const mt_device_step_t *s, float *param, const float *grad, float *m, float *v, size_t n,
                            void *stream) {
    (void)stream;
    if (s->skip && *s->skip) {
        return MT_OK;
    }
    float scale = s->grad_scale * (s->grad_scale_dev ? *s->grad_scale_dev : 1.0f);
    if (s->sgd) {
        mt_sgd_update(param, grad, m, n, s->lr, s->momentum, s->weight_decay, s->first, scale);
    } else {
        mt_adamw_update(param, grad, m, v, n, s->lr, s->beta1, s->beta2, s->eps, s->weight_decay, s->t, scale);
    }
    return MT_OK;
}

static mt_status_t cpu_round(void *dst, const float *src, size_t n, mt_dtype_t dt, void *stream) {
    (void)stream;
    if (dst != src) {
        memcpy(dst, src, n * sizeof(float));
    }
    mt_prec_round(dst, n, dt);
    return MT_OK;
}

static const struct mt_device cpu_device = {
    .name = "cpu",
    .host = true,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .order = cpu_order,
    .wait = cpu_wait,
    .add = cpu_add,
    .sumsq = cpu_sumsq,
    .clip_coef = cpu_clip_coef,
    .step = cpu_step,
    .round = cpu_round,
};

mt_device_table_t mt_device_cpu(void) {
    return &cpu_device;
}

/* ---- the calls ------------------------------------------------------------------------------------------- */

const char *mt_device_name(mt_device_table_t d) {
    return d->name;
}

bool mt_device_is_host(mt_device_table_t d) {
    return d->host;
}

mt_status_t mt_device_require_host(mt_device_table_t d, const char *who) {
    if (!d || d->host) {
        return MT_OK;
    }
    return mt_error(MT_ERR_INVALID_ARG,
                    "%s: device %s: only the CPU table or another host-memory device for now (the model computes on "
                    "host memory); run the GPU job with runtime.device = \"cuda\", which uses train/job_cuda.c",
                    who, d->name);
}

mt_status_t mt_device_alloc(mt_device_table_t d, void **ptr, size_t bytes, mt_mem_cat_t cat, const char *owner,
                            void *stream) {
    return d->alloc(ptr, bytes, cat, owner, stream);
}

void mt_device_free(mt_device_table_t d, void *ptr) {
    if (ptr) {
        d->free(ptr);
    }
}

mt_status_t mt_device_calloc(mt_device_table_t d, void **ptr, size_t bytes, mt_mem_cat_t cat, const char *owner,
                             void *stream) {
    *ptr = NULL;
    void *p = NULL;
    MT_CHECK(d->alloc(&p, bytes, cat, owner, stream));
    mt_status_t st = mt_device_zero(d, p, bytes, stream);
    if (st != MT_OK) {
        d->free(p);
        return st;
    }
    *ptr = p;
    return MT_OK;
}

mt_status_t mt_device_copy(mt_device_table_t d, void *dst, const void *src, size_t bytes, void *stream) {
    return bytes ? d->copy(dst, src, bytes, stream) : MT_OK;
}

mt_status_t mt_device_zero(mt_device_table_t d, void *ptr, size_t bytes, void *stream) {
    return bytes ? d->zero(ptr, bytes, stream) : MT_OK;
}

mt_status_t mt_device_order(mt_device_table_t d, void *waiter, void *signaller) {
    return waiter == signaller ? MT_OK : d->order(waiter, signaller);
}

mt_status_t mt_device_wait(mt_device_table_t d, void *stream) {
    return d->wait(stream);
}

mt_status_t mt_device_add(mt_device_table_t d, float *y, const float *x, size_t n, void *stream) {
    return n ? d->add(y, x, n, stream) : MT_OK;
}

mt_status_t mt_device_sumsq(mt_device_table_t d, double *sumsq, int *nonfinite, const float *x, size_t n,
                            void *stream) {
    if (n == 0) { /* the sum of nothing, and nothing non-finite */
        return sumsq ? d->zero(sumsq, sizeof(double), stream) : MT_OK;
    }
    return d->sumsq(sumsq, nonfinite, x, n, stream);
}

mt_status_t mt_device_clip_coef(mt_device_table_t d, float *coef, float *norm_out, const double *sumsq, float max_norm,
                                float inv_scale, void *stream) {
    return d->clip_coef(coef, norm_out, sumsq, max_norm, inv_scale, stream);
}

mt_status_t mt_device_step(mt_device_table_t d, const mt_device_step_t *s, float *param, const float *grad, float *m,
                           float *v, size_t n, void *stream) {
    return n ? d->step(s, param, grad, m, v, n, stream) : MT_OK;
}

mt_status_t mt_device_round(mt_device_table_t d, void *dst, const float *src, size_t n, mt_dtype_t dt, void *stream) {
    return n ? d->round(dst, src, n, dt, stream) : MT_OK;
}
