/* The device table: what an engine does with device memory besides a model's math and the collectives,
 * as a dozen calls that every device answers the same way. One table per kind of device: the CPU's
 * (host memory, streams are NULL, every call completes before it returns, ordering is a no-op) and, in
 * builds with CUDA, the CUDA one (models/cuda/device_cuda.c: the caching allocator, the device's own
 * streams and events, the CUDA kernels). An engine written against it runs on both; `runtime.device`
 * chooses the table as the collectives choose a backend by where the memory is.
 *
 * Every call is ordered on `stream` (a cudaStream_t on CUDA, NULL on the CPU) after the work queued on it
 * before, and returns once the work is queued; only mt_device_wait blocks the host. Pointer arguments are
 * device memory of the table's device (on CUDA, pointers of other streams' work must be ordered with
 * mt_device_order first), except where an entry says host. Errors are MT_ERR_* statuses with a message
 * naming the call; after an error the stream's later results are undefined.
 * The interface in the manner of ggml's backends: this header, device_impl.h (the table), device.c (the
 * CPU table and the calls).
 * SPDX-License-Identifier: MIT */
#ifndef MT_DEVICE_H
#define MT_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/alloc.h"
#include "runtime/mt_core.h"
#include "runtime/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef const struct mt_device *mt_device_table_t;

/* The CPU table (always present). */
mt_device_table_t mt_device_cpu(void);

/* "cpu", "cuda". */
const char *mt_device_name(mt_device_table_t d);
/* True when the device's memory is host memory the caller may read directly (the CPU table). */
bool mt_device_is_host(mt_device_table_t d);
/* MT_OK for NULL (the CPU table) or a host-memory device; else MT_ERR_INVALID_ARG naming who and the device:
 * the parallel stack takes only host-memory tables until the models compute on device memory (issue 38). */
mt_status_t mt_device_require_host(mt_device_table_t d, const char *who);

/* ---- memory and order ---------------------------------------------------------------------------------- */

/* bytes of device memory for use on stream, accounted under cat with owner (a static string), 64-byte
 * aligned at least; zero bytes gives a valid unique block. CPU: runtime/alloc.h's mt_alloc; CUDA: the
 * caching allocator (runtime/cuda_alloc.h: a freed block is reused only by allocations on its stream). */
mt_status_t mt_device_alloc(mt_device_table_t d, void **ptr, size_t bytes, mt_mem_cat_t cat, const char *owner,
                            void *stream);
void mt_device_free(mt_device_table_t d, void *ptr); /* NULL is a no-op */
/* mt_device_alloc, then the block zeroed on stream; on failure nothing stays allocated and *ptr is NULL. */
mt_status_t mt_device_calloc(mt_device_table_t d, void **ptr, size_t bytes, mt_mem_cat_t cat, const char *owner,
                             void *stream);
/* bytes from src to dst, either of them device or host memory (CUDA: pinned or pageable host memory, a
 * pageable source is read before the call returns). Regions must not overlap. */
mt_status_t mt_device_copy(mt_device_table_t d, void *dst, const void *src, size_t bytes, void *stream);
mt_status_t mt_device_zero(mt_device_table_t d, void *ptr, size_t bytes, void *stream);
/* Work queued on `waiter` from now on runs after the work queued on `signaller` so far (the host does not
 * wait). waiter == signaller, and the CPU, are no-ops. */
mt_status_t mt_device_order(mt_device_table_t d, void *waiter, void *signaller);
/* The host waits for the work queued on stream. The CPU: returns at once (its work is done). */
mt_status_t mt_device_wait(mt_device_table_t d, void *stream);

/* ---- arithmetic over flat f32 ranges ------------------------------------------------------------------ */

/* y[i] += x[i] for i < n (gradient sums: a tied weight's two readers, micro-batch accumulation). */
mt_status_t mt_device_add(mt_device_table_t d, float *y, const float *x, size_t n, void *stream);
/* *sumsq (a device double) = sum of x[i]^2 over n, accumulated in double (deterministic for a given n: a
 * fixed order of partial sums on each device, not the same order on both); *nonfinite (a device int) |= 1
 * when any x[i] is inf or NaN (the caller zeroes it first). Either output may be NULL. */
mt_status_t mt_device_sumsq(mt_device_table_t d, double *sumsq, int *nonfinite, const float *x, size_t n, void *stream);
/* The gradient multiplier of global-norm clipping, on the device: norm = sqrt(*sumsq) * inv_scale and
 * *coef = min(1, max_norm / (norm + 1e-6)) (1 when max_norm <= 0 or norm is not finite; torch's
 * clip_grad_norm_, runtime/flat_ops.h's mt_clip_coef, in fp32 on the CPU; the CUDA kernel divides in double,
 * within an fp32 ulp of it), times inv_scale (so the step also unscales fp16 loss
 * scaling); *norm_out (a device float, may be NULL) = norm. */
mt_status_t mt_device_clip_coef(mt_device_table_t d, float *coef, float *norm_out, const double *sumsq, float max_norm,
                                float inv_scale, void *stream);

/* One optimizer step over a flat range of n f32 master parameters (runtime/flat_ops.h's mt_adamw_update or
 * mt_sgd_update, element for element). */
typedef struct {
    bool sgd;                    /* false: AdamW (m, v); true: SGD (m = the momentum buffer or NULL, v unused) */
    float lr, beta1, beta2, eps; /* AdamW */
    float momentum;              /* SGD */
    float weight_decay;          /* 0 for ranges without decay (biases, norms) */
    int64_t t;                   /* AdamW: the step number after incrementing, >= 1 */
    bool first;                  /* SGD: the momentum buffer's first step (buf = g) */
    float grad_scale;            /* every gradient is multiplied by grad_scale ... */
    const float *grad_scale_dev; /* ... and by this device float when not NULL (mt_device_clip_coef's) */
    const int *skip;             /* a device int, may be NULL: when non-zero the step changes nothing */
} mt_device_step_t;

mt_status_t mt_device_step(mt_device_table_t d, const mt_device_step_t *s, float *param, const float *grad, float *m,
                           float *v, size_t n, void *stream);

/* The compute copy of n master weights: dst = src rounded to nearest even in dt. Its storage is the
 * device's storage of dt: CUDA dt itself (n values of mt_dtype_size(dt) bytes); the CPU f32 holding values
 * of dt (runtime/precision.h's emulation, n floats). dst == src is allowed on the CPU only. */
mt_status_t mt_device_round(mt_device_table_t d, void *dst, const float *src, size_t n, mt_dtype_t dt, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* MT_DEVICE_H */
