/* Private helpers of the .cu files (C++, nvcc only): storage-type conversions, dtype dispatch, warp and
 * block reductions, and the shape check every launcher uses.
 * SPDX-License-Identifier: MIT */
#ifndef MT_CUDA_IMPL_H
#define MT_CUDA_IMPL_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>

#include "models/cuda/mt_cuda.h"

#define MT_CU_CHECK_SHAPE(cond)                                  \
    do {                                                         \
        if (!(cond)) {                                           \
            mt_cuda_assert_fail(__FILE__, __LINE__, #cond);      \
        }                                                        \
    } while (0)

typedef __nv_bfloat16 bf16_t;
typedef __half f16_t;

template <typename T> __device__ __forceinline__ float to_f32(T x);
template <> __device__ __forceinline__ float to_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f32<bf16_t>(bf16_t x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_f32<f16_t>(f16_t x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16_t from_f32<bf16_t>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ f16_t from_f32<f16_t>(float x) { return __float2half_rn(x); }

/* Runs the statement with T bound to the storage type of dt. */
#define MT_CU_DISPATCH(dt, T, ...)                                  \
    do {                                                            \
        switch (dt) {                                               \
        case MT_CU_F32: {                                           \
            typedef float T;                                        \
            __VA_ARGS__;                                            \
            break;                                                  \
        }                                                           \
        case MT_CU_BF16: {                                          \
            typedef bf16_t T;                                       \
            __VA_ARGS__;                                            \
            break;                                                  \
        }                                                           \
        case MT_CU_F16: {                                           \
            typedef f16_t T;                                        \
            __VA_ARGS__;                                            \
            break;                                                  \
        }                                                           \
        default:                                                    \
            MT_CU_CHECK_SHAPE(!"dtype is one of MT_CU_F32/BF16/F16"); \
        }                                                           \
    } while (0)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result. shm: 32 floats. */
__device__ __forceinline__ float block_sum(float v, float *shm) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* shm may still be read by a previous call */
    if (lane == 0) {
        shm[wid] = v;
    }
    __syncthreads();
    v = lane < nw ? shm[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float *shm) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) {
        shm[wid] = v;
    }
    __syncthreads();
    v = lane < nw ? shm[lane] : -INFINITY;
    return warp_max(v);
}

/* tanh-approximation GELU and its derivative, as models/layers/gelu.c. */
#define MT_GELU_K 0.7978845608028654f
__device__ __forceinline__ float gelu_f(float x) {
    float u = MT_GELU_K * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_grad_f(float x) {
    float u = MT_GELU_K * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * MT_GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
}

/* 16 bytes of T (8 bf16/f16 or 4 f32): one 16-byte load or store of the vectorised kernels. */
template <typename T> struct vec16 {
    static constexpr int n = 16 / (int)sizeof(T);
    union {
        uint4 u;
        T e[n];
    };
};

/* whether every pointer is 16-byte aligned (the vectorised kernels' condition) */
static inline bool mt_cu_aligned16(const void *const *ptrs, int n) {
    for (int i = 0; i < n; i++) {
        if ((uintptr_t)ptrs[i] % 16 != 0) {
            return false;
        }
    }
    return true;
}

/* attention_mma.cu: the mma.sync attention kernels (bf16/f16). eligible: dtype, head size (32, 64, 128 forward;
 * 32, 64 backward), C a multiple of 8 and the tensors (ptrs) 16-byte aligned. The forward and backward have
 * the contracts of mt_cuda_attention_forward/backward (Dv: D_i = dO_i . O_i, computed by the caller). */
bool mt_cuda_attn_mma_eligible(int dt, int hs, int backward, int C, const void *const *ptrs, int n_ptrs);
void mt_cuda_attn_mma_forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH, int dt,
                              cudaStream_t s);
void mt_cuda_attn_mma_backward(void *dqkv, const void *dout, const void *qkv, const float *lse, const float *Dv, int B,
                               int T, int C, int NH, int dt, cudaStream_t s);

static inline unsigned mt_cu_blocks(size_t n, int threads, unsigned cap = 65535u * 16u) {
    size_t b = (n + (size_t)threads - 1) / (size_t)threads;
    if (b < 1) {
        b = 1;
    }
    return b > cap ? cap : (unsigned)b;
}

#endif /* MT_CUDA_IMPL_H */
