/* The device's dense matrix-product peak for a precision: one timed cuBLASLt product, shared by the GPU
 * engine of `meshtrain train` (its MFU denominator, measured once at start) and bench/gpu_bench (`peak`).
 * SPDX-License-Identifier: MIT */
#ifndef MT_GEMM_PEAK_H
#define MT_GEMM_PEAK_H

#include "runtime/mt_core.h"
#include "runtime/precision.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The current device's rate on n x n x n matrix products in precision p (fp32: f32 arithmetic; tf32: f32
 * operands on TF32 tensor cores; bf16/fp16: tensor cores with f32 accumulation), the product the models'
 * matmul forward runs (mt_cuda_gemm_bench): one warm-up (algorithm choice), then the median of reps timed
 * products of 2 n^3 FLOPs each; *flops receives FLOP/s. Operands (pseudo-random values: a constant matrix
 * would let the hardware idle part of its datapath), an f32 staging matrix and a 32 MiB cuBLASLt workspace
 * come from the caching allocator under MT_MEM_OTHER on stream (a cudaStream_t; NULL: the default stream)
 * and are freed (left in its cache) before returning; n = 8192 needs about 1.1 GiB in fp32. Waits for the
 * device. Errors: MT_ERR_INVALID_ARG (n or reps < 1), MT_ERR_OOM (with the allocator's report),
 * MT_ERR_CUDA. */
mt_status_t mt_cuda_gemm_peak(mt_prec_t p, int n, int reps, void *stream, double *flops);

#ifdef __cplusplus
}
#endif
#endif /* MT_GEMM_PEAK_H */
