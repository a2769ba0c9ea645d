/* The CUDA device table (models/cuda/device_cuda.h): each entry of runtime/device_impl.h as one or two
 * stream-ordered CUDA calls. No entry waits on the host except wait.
 * SPDX-License-Identifier: MIT */
#include "models/cuda/device_cuda.h"

#include <cuda_runtime_api.h>

#include "models/cuda/cuda_backend.h"
#include "runtime/cuda_alloc.h"
#include "runtime/device_impl.h"

static mt_status_t cu_alloc(void **ptr, size_t bytes, mt_mem_cat_t cat, const char *owner, void *stream) {
    return mt_dev_malloc(ptr, bytes, cat, owner, stream);
}

static void cu_free(void *ptr) {
    mt_dev_free(ptr);
}

static mt_status_t cu_copy(void *dst, const void *src, size_t bytes, void *stream) {
    return mt_cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream),
                          "cuda device: copy");
}

static mt_status_t cu_zero(void *ptr, size_t bytes, void *stream) {
    return mt_cuda_status(cudaMemsetAsync(ptr, 0, bytes, (cudaStream_t)stream), "cuda device: zero");
}

/* One event per call: recorded on the signaller, waited for by the waiter and released at once (CUDA keeps
 * it alive until the wait is done). */
static mt_status_t cu_order(void *waiter, void *signaller) {
    cudaEvent_t ev;
    MT_CHECK(mt_cuda_status(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cuda device: order (event)"));
    mt_status_t st = mt_cuda_status(cudaEventRecord(ev, (cudaStream_t)signaller), "cuda device: order (record)");
    if (st == MT_OK) {
        st = mt_cuda_status(cudaStreamWaitEvent((cudaStream_t)waiter, ev, 0), "cuda device: order (wait)");
    }
    cudaEventDestroy(ev);
    return st;
}

static mt_status_t cu_wait(void *stream) {
    return mt_cuda_status(cudaStreamSynchronize((cudaStream_t)stream), "cuda device: wait");
}

static mt_status_t cu_add(float *y, const float *x, size_t n, void *stream) {
    return mt_cuda_status(mt_cuda_residual_forward(y, y, x, n, MT_F32, stream), "cuda device: add");
}

static mt_status_t cu_sumsq(double *sumsq, int *nonfinite, const float *x, size_t n, void *stream) {
    if (sumsq) { /* the two-stage sum's partials, on this stream: reusable by its next allocation as soon as freed */
        double *scratch = NULL;
        MT_CHECK(mt_dev_malloc((void **)&scratch, mt_cuda_sumsq_scratch_doubles() * sizeof(double), MT_MEM_OTHER,
                               "cuda device: sumsq scratch", stream));
        mt_status_t st = mt_cuda_status(mt_cuda_sumsq(sumsq, x, n, scratch, stream), "cuda device: sumsq");
        mt_dev_free(scratch);
        MT_CHECK(st);
    }
    if (nonfinite) {
        MT_CHECK(mt_cuda_status(mt_cuda_check_finite(nonfinite, x, n, MT_F32, stream), "cuda device: non-finite"));
    }
    return MT_OK;
}

static mt_status_t cu_clip_coef(float *coef, float *norm_out, const double *sumsq, float max_norm, float inv_scale,
                                void *stream) {
    return mt_cuda_status(mt_cuda_clip_coef(coef, norm_out, sumsq, max_norm, inv_scale, stream),
                          "cuda device: clip coefficient");
}

static mt_status_t cu_step(const mt_device_step_t *s, float *param, const float *grad, float *m, float *v, size_t n,
                           void *stream) {
    cudaError_t e = s->sgd ? mt_cuda_sgd(param, grad, m, n, s->lr, s->momentum, s->weight_decay, s->first,
                                         s->grad_scale, s->grad_scale_dev, s->skip, NULL, 0, stream)
                           : mt_cuda_adamw(param, grad, m, v, n, s->lr, s->beta1, s->beta2, s->eps, s->weight_decay,
                                           s->t, s->grad_scale, s->grad_scale_dev, s->skip, NULL, 0, stream);
    return mt_cuda_status(e, s->sgd ? "cuda device: sgd step" : "cuda device: adamw step");
}

static mt_status_t cu_round(void *dst, const float *src, size_t n, mt_dtype_t dt, void *stream) {
    return mt_cuda_status(mt_cuda_convert(dst, (int)dt, src, MT_F32, n, 1.0f, stream), "cuda device: round");
}

static const struct mt_device cuda_device = {
    .name = "cuda",
    .host = false,
    .alloc = cu_alloc,
    .free = cu_free,
    .copy = cu_copy,
    .zero = cu_zero,
    .order = cu_order,
    .wait = cu_wait,
    .add = cu_add,
    .sumsq = cu_sumsq,
    .clip_coef = cu_clip_coef,
    .step = cu_step,
    .round = cu_round,
};

mt_device_table_t mt_device_cuda(void) {
    return &cuda_device;
}
