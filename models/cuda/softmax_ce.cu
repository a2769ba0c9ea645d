/* Fused softmax + cross-entropy on the device over the first V of Vp logit columns (padded vocabulary
 * columns are never read or written), ignore index -1. One block per row: a single pass keeps a running
 * (max, sum of exp) per thread, merged across the block; the probabilities are never stored. Backward
 * recomputes them from the saved log-sum-exp and writes the gradient in place over the logits.
 * Vocabulary-parallel (tensor parallelism): each rank's logits are the columns [v0, v0 + V) of the whole
 * vocabulary; the forward leaves per row this rank's (max, sum of exp, target logit), the tp group gathers
 * them and each rank merges them in rank order into the same lse and losses; backward takes v0.
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

/* lse = max + log sum_v exp(l_v - max);  loss = lse - l_target (0 for an ignored row). part non-NULL (a shard
 * of the vocabulary starting at global column col0): part[row] = (max, sum of exp(l - max), the target's logit
 * when it is one of these columns, else 0) instead. */
template <typename T, bool VEC>
static __global__ void softmax_ce_forward_kernel(float *losses, float *lse, float *part, const T *logits,
                                                 const int32_t *targets, int col0, int V, int Vp) {
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
        if (lane == 0 && part) {
            int t = targets[row] - col0;
            part[3 * row] = m;
            part[3 * row + 1] = s;
            part[3 * row + 2] = targets[row] >= 0 && t >= 0 && t < V ? to_f32(l[t]) : 0.0f;
        } else if (lane == 0) {
            float z = m + logf(s);
            int t = targets[row];
            lse[row] = z;
            losses[row] = t >= 0 ? z - to_f32(l[t]) : 0.0f;
        }
    }
}

/* The tp group's parts (P, N, 3) of each row merged in rank order: lse and loss as the whole-vocabulary kernel's. */
static __global__ void softmax_ce_combine_kernel(float *losses, float *lse, const float *parts, int P,
                                                 const int32_t *targets, int N) {
    for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
        float m = -INFINITY, s = 0.0f, tl = 0.0f;
        for (int p = 0; p < P; p++) {
            const float *q = parts + ((size_t)p * N + n) * 3;
            lse_merge(m, s, q[0], q[1]);
            tl += q[2];
        }
        float z = m + logf(s);
        lse[n] = z;
        losses[n] = targets[n] >= 0 ? z - tl : 0.0f;
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

/* dl_v = k (exp(l_v - lse) - [v0 + v == target]), k = scale / max(1, n_valid); 0 on ignored rows and v >= V. */
template <typename T, bool VEC>
static __global__ void softmax_ce_backward_kernel(T *dlogits, const T *logits, const float *lse, const int32_t *targets,
                                                  const int *n_valid, int v0, int V, int Vp, float scale) {
    int row = blockIdx.x;
    const T *l = logits + (size_t)row * Vp;
    T *d = dlogits + (size_t)row * Vp;
    int t = targets[row], tv = t - v0; /* t < 0: ignored; tv: the target's column here (maybe outside [0, V)) */
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
                float g = t >= 0 && v < V ? k * (__expf(to_f32(x.e[q]) - z) - (v == tv ? 1.0f : 0.0f)) : 0.0f;
                x.e[q] = from_f32<T>(g);
            }
            d4[i] = x.u; /* in place: read, then written by the same thread */
        }
    } else {
        for (int v = threadIdx.x; v < Vp; v += blockDim.x) {
            float g = 0.0f;
            if (t >= 0 && v < V) {
                g = k * (__expf(to_f32(l[v]) - z) - (v == tv ? 1.0f : 0.0f));
            }
            d[v] = from_f32<T>(g); /* in place: each element read once, then written by the same thread */
        }
    }
}

/* ======================================== launchers ======================================== */

/* The per-row pass: lse and losses (part NULL), or the shard's parts. */
static void ce_rows(float *losses, float *lse, float *part, const void *logits, const int32_t *targets, int v0, int N,
                    int V, int Vp, int dt, cudaStream_t s) {
    const void *ptrs[] = {logits};
    bool vec = Vp % (dt == MT_CU_F32 ? 4 : 8) == 0 && mt_cu_aligned16(ptrs, 1);
    MT_CU_DISPATCH(dt, T, {
        if (vec) {
            softmax_ce_forward_kernel<T, true>
                <<<(unsigned)N, CE_THREADS, 0, s>>>(losses, lse, part, (const T *)logits, targets, v0, V, Vp);
        } else {
            softmax_ce_forward_kernel<T, false>
                <<<(unsigned)N, CE_THREADS, 0, s>>>(losses, lse, part, (const T *)logits, targets, v0, V, Vp);
        }
    });
}

extern "C" cudaError_t mt_cuda_softmax_ce_forward(float *losses, float *lse, float *mean_loss, int *n_valid,
                                                  const void *logits, const int32_t *targets, int N, int V, int Vp,
                                                  int dt, void *stream) {
    MT_CU_CHECK_SHAPE(N > 0 && V > 0 && Vp >= V && losses && lse && !mean_loss == !n_valid && logits && targets);
    cudaStream_t s = (cudaStream_t)stream;
    ce_rows(losses, lse, NULL, logits, targets, 0, N, V, Vp, dt, s);
    if (mean_loss) {
        softmax_ce_mean_kernel<<<1, 256, 0, s>>>(mean_loss, n_valid, losses, targets, N);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t mt_cuda_softmax_ce_mean(float *mean_loss, int *n_valid, const float *losses,
                                               const int32_t *targets, int N, void *stream) {
    MT_CU_CHECK_SHAPE(N > 0 && mean_loss && n_valid && losses && targets);
    softmax_ce_mean_kernel<<<1, 256, 0, (cudaStream_t)stream>>>(mean_loss, n_valid, losses, targets, N);
    return cudaGetLastError();
}

extern "C" cudaError_t mt_cuda_softmax_ce_partial(float *part, const void *logits, const int32_t *targets, int v0,
                                                  int N, int V, int Vp, int dt, void *stream) {
    MT_CU_CHECK_SHAPE(N > 0 && V >= 0 && Vp >= V && v0 >= 0 && part && logits && targets);
    ce_rows(NULL, NULL, part, logits, targets, v0, N, V, Vp, dt, (cudaStream_t)stream);
    return cudaGetLastError();
}

extern "C" cudaError_t mt_cuda_softmax_ce_combine(float *losses, float *lse, float *mean_loss, int *n_valid,
                                                  const float *parts, int P, const int32_t *targets, int N,
                                                  void *stream) {
    MT_CU_CHECK_SHAPE(N > 0 && P > 0 && losses && lse && mean_loss && n_valid && parts && targets);
    cudaStream_t s = (cudaStream_t)stream;
    softmax_ce_combine_kernel<<<mt_cu_blocks((size_t)N, 256), 256, 0, s>>>(losses, lse, parts, P, targets, N);
    softmax_ce_mean_kernel<<<1, 256, 0, s>>>(mean_loss, n_valid, losses, targets, N);
    return cudaGetLastError();
}

extern "C" cudaError_t mt_cuda_softmax_ce_backward_shard(void *dlogits, const void *logits, const float *lse,
                                                         const int32_t *targets, const int *n_valid, int v0, int N,
                                                         int V, int Vp, float scale, int dt, void *stream) {
    MT_CU_CHECK_SHAPE(N > 0 && V >= 0 && Vp >= V && Vp > 0 && v0 >= 0 && dlogits && logits && lse && targets);
    cudaStream_t s = (cudaStream_t)stream;
    const void *ptrs[] = {logits, dlogits};
    bool vec = Vp % (dt == MT_CU_F32 ? 4 : 8) == 0 && mt_cu_aligned16(ptrs, 2);
    MT_CU_DISPATCH(dt, T, {
        if (vec) {
            softmax_ce_backward_kernel<T, true><<<(unsigned)N, CE_THREADS, 0, s>>>(
                (T *)dlogits, (const T *)logits, lse, targets, n_valid, v0, V, Vp, scale);
        } else {
            softmax_ce_backward_kernel<T, false><<<(unsigned)N, CE_THREADS, 0, s>>>(
                (T *)dlogits, (const T *)logits, lse, targets, n_valid, v0, V, Vp, scale);
        }
    });
    return cudaGetLastError();
}

extern "C" cudaError_t mt_cuda_softmax_ce_backward(void *dlogits, const void *logits, const float *lse,
                                                   const int32_t *targets, const int *n_valid, int N, int V, int Vp,
                                                   float scale, int dt, void *stream) {
    MT_CU_CHECK_SHAPE(V > 0);
    return mt_cuda_softmax_ce_backward_shard(dlogits, logits, lse, targets, n_valid, 0, N, V, Vp, scale, dt, stream);
}
