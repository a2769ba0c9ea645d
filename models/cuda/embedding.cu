/* Token + learned position embedding on the device: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
 * Backward: the position gradient is a sum over the batch per (t, c), done in a fixed order; the token
 * gradient scatters rows to repeated token ids, done with f32 atomics (order of additions not fixed).
 * Vocabulary-parallel (tensor parallelism): wte holds the rows [v0, v0 + Vl) of the whole table, a token
 * outside them contributes a zero row forward and nothing backward; the whole model is v0 = 0, Vl = V.
 * SPDX-License-Identifier: MIT */
#include <climits>

#include "models/cuda/cuda_impl.h"

/* ======================================== kernels ======================================== */

template <typename T>
static __global__ void embedding_forward_kernel(T *out, const int32_t *tokens, const T *wte, const T *wpe, int v0,
                                                int Vl, int B, int T_, int C) {
    size_t n = (size_t)B * T_ * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T_), v = tokens[bt] - v0;
        float y = v >= 0 && v < Vl ? to_f32(wte[(size_t)v * C + c]) : 0.0f;
        if (wpe) {
            y += to_f32(wpe[(size_t)t * C + c]);
        }
        out[i] = from_f32<T>(y);
    }
}

/* dwpe[t,c] += sum_b dout[b,t,c] (b in order) */
template <typename T>
static __global__ void embedding_backward_wpe_kernel(float *dwpe, const T *dout, int B, int T_, int C) {
    size_t n = (size_t)T_ * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int b = 0; b < B; b++) {
            s += to_f32(dout[(size_t)b * n + i]);
        }
        dwpe[i] += s;
    }
}

/* dwte[tokens[bt] - v0, c] += dout[bt, c] for the tokens in [v0, v0 + Vl) */
template <typename T>
static __global__ void embedding_backward_wte_kernel(float *dwte, const T *dout, const int32_t *tokens, int v0, int Vl,
                                                     int BT, int C) {
    size_t n = (size_t)BT * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), v = tokens[bt] - v0;
        if (v < 0 || v >= Vl) {
            continue;
        }
        atomicAdd(&dwte[(size_t)v * C + c], to_f32(dout[i]));
    }
}

/* ======================================== launchers ======================================== */

enum { EMB_THREADS = 256 };

extern "C" cudaError_t mt_cuda_embedding_forward_shard(void *out, const int32_t *tokens, const void *wte,
                                                       const void *wpe, int v0, int Vl, int B, int T, int C, int dt,
                                                       void *stream) {
    MT_CU_CHECK_SHAPE(B > 0 && T > 0 && C > 0 && v0 >= 0 && Vl >= 0 && out && tokens && (wte || Vl == 0));
    cudaStream_t s = (cudaStream_t)stream;
    size_t n = (size_t)B * T * C;
    MT_CU_DISPATCH(dt, E,
                   embedding_forward_kernel<E><<<mt_cu_blocks(n, EMB_THREADS), EMB_THREADS, 0, s>>>(
                       (E *)out, tokens, (const E *)wte, (const E *)wpe, v0, Vl, B, T, C));
    return cudaGetLastError();
}

extern "C" cudaError_t mt_cuda_embedding_forward(void *out, const int32_t *tokens, const void *wte, const void *wpe,
                                                 int B, int T, int C, int dt, void *stream) {
    MT_CU_CHECK_SHAPE(wte);
    return mt_cuda_embedding_forward_shard(out, tokens, wte, wpe, 0, INT_MAX, B, T, C, dt, stream);
}

extern "C" cudaError_t mt_cuda_embedding_backward_shard(float *dwte, float *dwpe, const void *dout,
                                                        const int32_t *tokens, int v0, int Vl, int B, int T, int C,
                                                        int dt, void *stream) {
    MT_CU_CHECK_SHAPE(B > 0 && T > 0 && C > 0 && v0 >= 0 && Vl >= 0 && dout && tokens);
    cudaStream_t s = (cudaStream_t)stream;
    if (dwpe) {
        size_t n = (size_t)T * C;
        MT_CU_DISPATCH(dt, E,
                       embedding_backward_wpe_kernel<E>
                       <<<mt_cu_blocks(n, EMB_THREADS), EMB_THREADS, 0, s>>>(dwpe, (const E *)dout, B, T, C));
    }
    if (dwte) {
        size_t n = (size_t)B * T * C;
        MT_CU_DISPATCH(dt, E,
                       embedding_backward_wte_kernel<E>
                       <<<mt_cu_blocks(n, EMB_THREADS), EMB_THREADS, 0, s>>>(dwte, (const E *)dout, tokens, v0, Vl,
                                                                             B * T, C));
    }
    return cudaGetLastError();
}

extern "C" cudaError_t mt_cuda_embedding_backward(float *dwte, float *dwpe, const void *dout, const int32_t *tokens,
                                                  int B, int T, int C, int dt, void *stream) {
    return mt_cuda_embedding_backward_shard(dwte, dwpe, dout, tokens, 0, INT_MAX, B, T, C, dt, stream);
}
