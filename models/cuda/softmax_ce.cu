/* Fused softmax + cross-entropy on the device over the first V of Vp logit columns (padded vocabulary
 * columns are never read or written), ignore index -1. One block per row: a single pass keeps a running
 * (max, sum of exp) per thread, merged across the block; the probabilities are never stored. Backward
 * recomputes them from the saved log-sum-exp and writes the gradient in place over the logits.
 * SPDX-License-Identifier: MIT */
#include "models/cuda/cuda_impl.h"

enum { CE_THREADS = 512 };

/* ======================================== kernels ======================================== */

/* Merges running (m, s) pairs, s = sum exp(l - m). */
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2) {
    float mx = fmaxf(m, m2);
    if (mx == -INFINITY) {
        return;
    }
    s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
    m = mx;
}

/* lse = max + log sum_v exp(l_v - max);  loss = lse - l_target (0 for an ignored row). */
template <typename T, bool VEC>
static __global__ void softmax_ce_forward_kernel(float *losses, float *lse, const T *logits, const int32_t *targets,
                                                 int V, int Vp) {
    __shared__ float sm[32], ss[32];
    int row = blockIdx.x;
    const T *l = logits + (size_t)row * Vp;
    float m = -INFINITY, s = 0.0f;
    int v0 = 0;
    if (VEC) { /* 16-byte vectors over the first V rounded down (the launcher checked alignment and Vp) */
        constexpr int P = vec16<T>::n;
        const uint4 *l4 = reinterpret_cast<const uint4 *>(l);
        for (int i = threadIdx.x; i < V / P; i += blockDim.x) {
            vec16<T> x;
            x.u = l4[i];
            float mx = m;
#pragma unroll
            for (int k = 0; k < P; k++) {
                mx = fmaxf(mx, to_f32(x.e[k]));
            }
            if (mx == -INFINITY) {
                continue;
            }
            float a = s * __expf(m - mx);
#pragma unroll
            for (int k = 0; k < P; k++) {
                a += __expf(to_f32(x.e[k]) - mx);
            }
            s = a;
            m = mx;
        }
        v0 = V / P * P;
    }
    for (int v = v0 + threadIdx.x; v < V; v += blockDim.x) {
        float x = to_f32(l[v]);
        if (x > m) {
            s = s * __expf(m - x) + 1.0f;
            m = x;
        } else {
            s += __expf(x - m);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    if (lane == 0) {
        sm[wid] = m;
        ss[wid] = s;
    }
    __syncthreads();
    if (wid == 0) {
        int nw = blockDim.x >> 5;
        m = lane < nw ? sm[lane] : -INFINITY;
        s = lane < nw ? ss[lane] : 0.0f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
            lse_merge(m, s, m2, s2);
        }
        if (lane == 0) {
            float z = m + logf(s);
            int t = targets[row];
            lse[row] = z;
            losses[row] = t >= 0 ? z - to_f32(l[t]) : 0.0f;
        }
    }
}

/* Mean over non-ignored rows, summed in row order by one block (each thread a contiguous chunk, then the
 * chunks in order) so the loss is bit-identical run to run. */
static __global__ void softmax_ce_mean_kernel(float *mean_loss, int *n_valid, const float *losses,
                                              const int32_t *targets, int N) {
    __shared__ double sh[256];
    __shared__ int sc[256];
    int chunk = (N + 255) / 256, lo = threadIdx.x * chunk, hi = min(N, lo + chunk);
    double s = 0.0;
    int c = 0;
    for (int n = lo; n < hi; n++) {
        if (targets[n] >= 0) {
            s += losses[n];
            c++;
        }
    }
    sh[threadIdx.x] = s;
    sc[threadIdx.x] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        double tot = 0.0;
        int cnt = 0;
        for (int i = 0; i < 256; i++) {
            tot += sh[i];
            cnt += sc[i];
        }
        *mean_loss = cnt > 0 ? (float)(tot / cnt) : 0.0f;
        *n_valid = cnt;
    }
}

/* dl_v = k (exp(l_v - lse) - [v == target]), k = scale / max(1, n_valid); 0 on ignored rows and v >= V. */
template <typename T, bool VEC>
static __global__ void softmax_ce_backward_kernel(T *dlogits, const T *logits, const float *lse, const int32_t *targets,
                                                  const int *n_valid, int V, int Vp, float scale) {
    int row = blockIdx.x;
    const T *l = logits + (size_t)row * Vp;
    T *d = dlogits + (size_t)row * Vp;
    int t = targets[row];
    float k = scale;
    if (n_valid) {
        int nv = *n_valid;
        k = scale / (float)(nv > 1 ? nv : 1);
    }
    float z = lse[row];
    if (VEC) { /* the whole padded row in 16-byte vectors (Vp a multiple of the vector, rows aligned) */
        constexpr int P = vec16<T>::n;
        const uint4 *l4 = reinterpret_cast<const uint4 *>(l);
        uint4 *d4 = reinterpret_cast<uint4 *>(d);
        for (int i = threadIdx.x; i < Vp / P; i += blockDim.x) {
            vec16<T> x;
            x.u = l4[i];
#pragma unroll
            for (int q = 0; q < P; q++) {
                int v = i * P + q;
                float g = t >= 0 && v < V ? k * (__expf(to_f32(x.e[q]) - z) - (v == t ? 1.0f : 0.0f)) : 0.0f;
                x.e[q] = from_f32<T>(g);
            }
            d4[i] = x.u; /* in place: read, then written by the same thread */
        }
    } else {
        for (int v = threadIdx.x; v < Vp; v += blockDim.x) {
            float g = 0.0f;
            if (t >= 0 && v < V) {
                g = k * (__expf(to_f32(l[v]) - z) - (v == t ? 1.0f : 0.0f));
            }
            d[v] = from_f32<T>(g); /* in place: each element read once, then written by the same thread */
        }
    }
}

/* ======================================== launchers ======================================== */

extern "C" cudaError_t mt_cuda_softmax_ce_forward(float *losses, float *lse, float *mean_loss, int *n_valid,
                                                  const void *logits, const int32_t *targets, int N, int V, int Vp,
                                                  int dt, void *stream) {
    MT_CU_CHECK_SHAPE(N > 0 && V > 0 && Vp >= V && losses && lse && mean_loss && n_valid && logits && targets);
    cudaStream_t s = (cudaStream_t)stream;
    const void *ptrs[] = {logits};
    bool vec = Vp % (dt == MT_CU_F32 ? 4 : 8) == 0 && mt_cu_aligned16(ptrs, 1);
    MT_CU_DISPATCH(dt, T, {
        if (vec) {
            softmax_ce_forward_kernel<T, true>
                <<<(unsigned)N, CE_THREADS, 0, s>>>(losses, lse, (const T *)logits, targets, V, Vp);
        } else {
            softmax_ce_forward_kernel<T, false>
                <<<(unsigned)N, CE_THREADS, 0, s>>>(losses, lse, (const T *)logits, targets, V, Vp);
        }
    });
    softmax_ce_mean_kernel<<<1, 256, 0, s>>>(mean_loss, n_valid, losses, targets, N);
    return cudaGetLastError();
}

extern "C" cudaError_t mt_cuda_softmax_ce_backward(void *dlogits, const void *logits, const float *lse,
                                                   const int32_t *targets, const int *n_valid, int N, int V, int Vp,
                                                   float scale, int dt, void *stream) {
    MT_CU_CHECK_SHAPE(N > 0 && V > 0 && Vp >= V && dlogits && logits && lse && targets);
    cudaStream_t s = (cudaStream_t)stream;
    const void *ptrs[] = {logits, dlogits};
    bool vec = Vp % (dt == MT_CU_F32 ? 4 : 8) == 0 && mt_cu_aligned16(ptrs, 2);
    MT_CU_DISPATCH(dt, T, {
        if (vec) {
            softmax_ce_backward_kernel<T, true><<<(unsigned)N, CE_THREADS, 0, s>>>((T *)dlogits, (const T *)logits, lse,
                                                                                   targets, n_valid, V, Vp, scale);
        } else {
            softmax_ce_backward_kernel<T, false><<<(unsigned)N, CE_THREADS, 0, s>>>(
                (T *)dlogits, (const T *)logits, lse, targets, n_valid, V, Vp, scale);
        }
    });
    return cudaGetLastError();
}
