/* Token + learned position embedding on the device: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
 * Backward: the position gradient is a sum over the batch per (t, c), done in a fixed order; the token
 * gradient scatters rows to repeated token ids, done with f32 atomics (order of additions not fixed).
 * SPDX-License-Identifier: MIT */
#include "models/cuda/cuda_impl.h"

/* ======================================== kernels ======================================== */

template <typename T>
static __global__ void embedding_forward_kernel(T *out, const int32_t *tokens, const T *wte, const T *wpe, int B,
                                                int T_, int C) {
    size_t n = (size_t)B * T_ * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T_);
        float v = to_f32(wte[(size_t)tokens[bt] * C + c]);
        if (wpe) {
            v += to_f32(wpe[(size_t)t * C + c]);
        }
        out[i] = from_f32<T>(v);
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

/* dwte[tokens[bt], c] += dout[bt, c] */
template <typename T>
static __global__ void embedding_backward_wte_kernel(float *dwte, const T *dout, const int32_t *tokens, int BT, int C) {
    size_t n = (size_t)BT * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C);
        atomicAdd(&dwte[(size_t)tokens[bt] * C + c], to_f32(dout[i]));
    }
}

/* ======================================== launchers ======================================== */

enum { EMB_THREADS = 256 };

extern "C" cudaError_t mt_cuda_embedding_forward(void *out, const int32_t *tokens, const void *wte, const void *wpe,
                                                 int B, int T, int C, int dt, void *stream) {
    MT_CU_CHECK_SHAPE(B > 0 && T > 0 && C > 0 && out && tokens && wte);
    cudaStream_t s = (cudaStream_t)stream;
    size_t n = (size_t)B * T * C;
    MT_CU_DISPATCH(dt, E,
                   embedding_forward_kernel<E><<<mt_cu_blocks(n, EMB_THREADS), EMB_THREADS, 0, s>>>(
                       (E *)out, tokens, (const E *)wte, (const E *)wpe, B, T, C));
    return cudaGetLastError();
}

extern "C" cudaError_t mt_cuda_embedding_backward(float *dwte, float *dwpe, const void *dout, const int32_t *tokens,
                                                  int B, int T, int C, int dt, void *stream) {
    MT_CU_CHECK_SHAPE(B > 0 && T > 0 && C > 0 && dout && tokens);
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
                       <<<mt_cu_blocks(n, EMB_THREADS), EMB_THREADS, 0, s>>>(dwte, (const E *)dout, tokens, B * T, C));
    }
    return cudaGetLastError();
}
