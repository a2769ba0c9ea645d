/* The device table itself, for the files that implement one (device.c: the CPU; models/cuda/device_cuda.c:
 * CUDA). Callers use runtime/device.h. Each entry is the call of the same name there, without the table;
 * the wrappers in device.c check nothing beyond a zero-length range, which they answer without a call.
 * SPDX-License-Identifier: MIT */
#ifndef MT_DEVICE_IMPL_H
#define MT_DEVICE_IMPL_H

#include "runtime/device.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mt_device {
    const char *name;
    bool host; /* memory the host reads directly; streams are NULL and every call is complete on return */
    mt_status_t (*alloc)(void **ptr, size_t bytes, mt_mem_cat_t cat, const char *owner, void *stream);
    void (*free)(void *ptr);
    mt_status_t (*copy)(void *dst, const void *src, size_t bytes, void *stream);
    mt_status_t (*zero)(void *ptr, size_t bytes, void *stream);
    mt_status_t (*order)(void *waiter, void *signaller);
    mt_status_t (*wait)(void *stream);
    mt_status_t (*add)(float *y, const float *x, size_t n, void *stream);
    mt_status_t (*sumsq)(double *sumsq, int *nonfinite, const float *x, size_t n, void *stream);
    mt_status_t (*clip_coef)(float *coef, float *norm_out, const double *sumsq, float max_norm, float inv_scale,
                             void *stream);
    mt_status_t (*step)(const mt_device_step_t *s, float *param, const float *grad, float *m, float *v, size_t n,
                        void *stream);
    mt_status_t (*round)(void *dst, const float *src, size_t n, mt_dtype_t dt, void *stream);
};

#ifdef __cplusplus
}
#endif
#endif /* MT_DEVICE_IMPL_H */
