/* The device's dense matrix-product peak for a precision (models/cuda/gemm_peak.h).
 * SPDX-License-Identifier: MIT */
#include "models/cuda/gemm_peak.h"

#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "models/cuda/cuda_backend.h"
#include "runtime/cuda_alloc.h"

#define WS_BYTES ((size_t)32 << 20)
#define CK(call) MT_CHECK_GOTO(mt_cuda_status((call), #call), st, done)

mt_status_t mt_cuda_gemm_peak(mt_prec_t p, int n, int reps, void *stream, double *flops) {
    *flops = 0.0;
    if (n < 1 || reps < 1) {
        return mt_error(MT_ERR_INVALID_ARG, "gemm peak: n = %d, reps = %d: both must be >= 1", n, reps);
    }
    int dt = (int)mt_prec_storage(p);
    size_t es = dt == MT_CU_F32 ? 4 : 2, elems = (size_t)n * (size_t)n, chunk = elems < 65536 ? elems : 65536;
    cudaStream_t s = (cudaStream_t)stream;
    mt_status_t st = MT_OK;
    void *a = NULL, *b = NULL, *c = NULL, *h = NULL, *ws = NULL;
    float *host = NULL;
    double *ms = NULL;
    mt_cuda_ctx_t ctx = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    MT_CHECK_GOTO(mt_dev_malloc(&a, elems * es, MT_MEM_OTHER, "gemm peak a", s), st, done);
    MT_CHECK_GOTO(mt_dev_malloc(&b, elems * es, MT_MEM_OTHER, "gemm peak b", s), st, done);
    MT_CHECK_GOTO(mt_dev_malloc(&c, elems * es, MT_MEM_OTHER, "gemm peak c", s), st, done);
    MT_CHECK_GOTO(mt_dev_malloc(&h, elems * 4, MT_MEM_OTHER, "gemm peak staging", s), st, done);
    MT_CHECK_GOTO(mt_dev_malloc(&ws, WS_BYTES, MT_MEM_OTHER, "gemm peak workspace", s), st, done);
    host = malloc(chunk * 4);
    ms = malloc(sizeof(double) * (size_t)reps);
    if (!host || !ms) {
        st = mt_error(MT_ERR_OOM, "gemm peak: out of host memory");
        goto done;
    }
    unsigned r = 1;
    for (size_t i = 0; i < chunk; i++) {
        r = r * 1664525u + 1013904223u;
        host[i] = (float)(r >> 9) / 8388608.0f - 0.5f;
    }
    for (size_t off = 0; off < elems; off += chunk) { /* the pseudo-random block repeated over the matrix */
        size_t k = elems - off < chunk ? elems - off : chunk;
        CK(cudaMemcpyAsync((float *)h + off, host, k * 4, cudaMemcpyHostToDevice, s));
    }
    CK(mt_cuda_convert(a, dt, h, MT_CU_F32, elems, 1.0f, s));
    CK(mt_cuda_convert(b, dt, h, MT_CU_F32, elems, 0.5f, s));
    CK(mt_cuda_ctx_create(&ctx, ws, WS_BYTES, p == MT_PREC_TF32));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(mt_cuda_gemm_bench(ctx, c, a, b, n, n, n, dt, s)); /* warm-up, algorithm choice */
    for (int k = 0; k < reps; k++) {
        float t = 0.0f;
        CK(cudaEventRecord(e0, s));
        CK(mt_cuda_gemm_bench(ctx, c, a, b, n, n, n, dt, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms[k] = (double)t;
    }
    double med = mt_median(ms, (size_t)reps) * 1e-3;
    *flops = med > 0 ? 2.0 * (double)n * (double)n * (double)n / med : 0.0;
done:
    (void)(s ? cudaStreamSynchronize(s) : cudaDeviceSynchronize()); /* before the blocks go back to the cache */
    if (e0) {
        cudaEventDestroy(e0);
    }
    if (e1) {
        cudaEventDestroy(e1);
    }
    if (ctx) {
        mt_cuda_ctx_destroy(ctx);
    }
    mt_dev_free(a);
    mt_dev_free(b);
    mt_dev_free(c);
    mt_dev_free(h);
    mt_dev_free(ws);
    free(host);
    free(ms);
    return st;
}
