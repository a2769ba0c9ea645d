/* Elementwise operations and small reductions on the device: GELU and residual (forward + backward),
 * dtype conversion, the inf/NaN check and the deterministic sum of squares behind gradient clipping.
 * Grid-stride loops; every element is independent, so these are memory-bound one-pass kernels.
 * SPDX-License-Identifier: MIT */
#include "models/cuda/cuda_impl.h"

/* ======================================== kernels ======================================== */

template <typename T> static __global__ void gelu_forward_kernel(T *out, const T *inp, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        out[i] = from_f32<T>(gelu_f(to_f32(inp[i])));
    }
}

/* dinp += gelu'(x) dout, gelu'(x) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) K (1 + 3 0.044715 x^2) */
template <typename T, bool ACC>
static __global__ void gelu_backward_kernel(T *dinp, const T *inp, const T *dout, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float d = gelu_grad_f(to_f32(inp[i])) * to_f32(dout[i]);
        dinp[i] = from_f32<T>(ACC ? to_f32(dinp[i]) + d : d);
    }
}

/* the same over nv 16-byte vectors (the launcher runs the scalar kernel on the tail) */
template <typename T, bool ACC>
static __global__ void gelu_backward_vec_kernel(T *dinp, const T *inp, const T *dout, size_t nv) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nv; i += (size_t)gridDim.x * blockDim.x) {
        vec16<T> x, d, a;
        x.u = reinterpret_cast<const uint4 *>(inp)[i];
        d.u = reinterpret_cast<const uint4 *>(dout)[i];
        if (ACC) {
            a.u = reinterpret_cast<const uint4 *>(dinp)[i];
        }
#pragma unroll
        for (int k = 0; k < vec16<T>::n; k++) {
            float g = gelu_grad_f(to_f32(x.e[k])) * to_f32(d.e[k]);
            a.e[k] = from_f32<T>(ACC ? to_f32(a.e[k]) + g : g);
        }
        reinterpret_cast<uint4 *>(dinp)[i] = a.u;
    }
}

template <typename T> static __global__ void residual_forward_kernel(T *out, const T *a, const T *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        out[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
    }
}

template <typename T> static __global__ void residual_backward_kernel(T *da, T *db, const T *dout, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float d = to_f32(dout[i]);
        if (da) {
            da[i] = from_f32<T>(to_f32(da[i]) + d);
        }
        if (db) {
            db[i] = from_f32<T>(to_f32(db[i]) + d);
        }
    }
}

template <typename D, typename S> static __global__ void convert_kernel(D *dst, const S *src, size_t n, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        dst[i] = from_f32<D>(to_f32(src[i]) * scale);
    }
}

template <typename T> static __global__ void check_finite_kernel(int *flag, const T *x, size_t n) {
    int bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        bad |= !isfinite(to_f32(x[i]));
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) {
        atomicOr(flag, 1);
    }
}

enum { SUMSQ_BLOCKS = 512, SUMSQ_THREADS = 256, SUMSQ_PER_THREAD = 8 };

/* Stage 1: block b sums x^2 over its grid-stride elements in double into partial[b]. Stage 2: one block sums
 * the partials in index order. The grid depends only on n (at most SUMSQ_BLOCKS blocks, at least
 * SUMSQ_PER_THREAD elements per thread), so the result is bit-identical run to run. */
static __global__ void sumsq_partial_kernel(double *partial, const float *x, size_t n) {
    __shared__ double shm[SUMSQ_THREADS];
    double s = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        double v = x[i];
        s += v * v;
    }
    shm[threadIdx.x] = s;
    __syncthreads();
    for (int o = SUMSQ_THREADS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) {
            shm[threadIdx.x] += shm[threadIdx.x + o];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = shm[0];
    }
}

static __global__ void sumsq_final_kernel(double *out, const double *partial, int n_partial) {
    __shared__ double shm[SUMSQ_THREADS];
    double s = 0.0;
    for (int i = threadIdx.x; i < n_partial; i += SUMSQ_THREADS) {
        s += partial[i];
    }
    shm[threadIdx.x] = s;
    __syncthreads();
    for (int o = SUMSQ_THREADS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) {
            shm[threadIdx.x] += shm[threadIdx.x + o];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        *out = shm[0];
    }
}

static __global__ void clip_coef_kernel(float *coef, float *norm_out, const double *sumsq, float max_norm,
                                        float inv_scale) {
    double norm = sqrt(*sumsq) * (double)inv_scale;
    float c = 1.0f;
    if (max_norm > 0.0f && isfinite(norm)) {
        double r = (double)max_norm / (norm + 1e-6);
        c = r < 1.0 ? (float)r : 1.0f;
    }
    *coef = c * inv_scale;
    if (norm_out) {
        *norm_out = (float)norm;
    }
}

/* ======================================== launchers ======================================== */

enum { EW_THREADS = 256 };

extern "C" cudaError_t mt_cuda_gelu_forward(void *out, const void *inp, size_t n, int dt, void *stream) {
    MT_CU_CHECK_SHAPE(out && inp);
    cudaStream_t s = (cudaStream_t)stream;
    MT_CU_DISPATCH(
        dt, T, gelu_forward_kernel<T><<<mt_cu_blocks(n, EW_THREADS), EW_THREADS, 0, s>>>((T *)out, (const T *)inp, n));
    return cudaGetLastError();
}

template <bool ACC>
static cudaError_t gelu_backward(void *dinp, const void *inp, const void *dout, size_t n, int dt, void *stream) {
    MT_CU_CHECK_SHAPE(dinp && inp && dout);
    cudaStream_t s = (cudaStream_t)stream;
    const void *ptrs[] = {dinp, inp, dout};
    size_t per = dt == MT_CU_F32 ? 4 : 8, nv = mt_cu_aligned16(ptrs, 3) ? n / per : 0, done = nv * per;
    /* 16-byte vectors over the aligned part (measured on an H200: 2-byte accesses reached 47% of the copy
     * bandwidth), the scalar kernel over the rest */
    if (nv > 0) {
        MT_CU_DISPATCH(dt, T,
                       gelu_backward_vec_kernel<T, ACC><<<mt_cu_blocks(nv, EW_THREADS), EW_THREADS, 0, s>>>(
                           (T *)dinp, (const T *)inp, (const T *)dout, nv));
    }
    if (done < n) {
        size_t es = dt == MT_CU_F32 ? 4 : 2, rest = n - done;
        MT_CU_DISPATCH(dt, T,
                       gelu_backward_kernel<T, ACC><<<mt_cu_blocks(rest, EW_THREADS), EW_THREADS, 0, s>>>(
                           (T *)((char *)dinp + done * es), (const T *)((const char *)inp + done * es),
                           (const T *)((const char *)dout + done * es), rest));
    }
    return cudaGetLastError();
}

extern "C" cudaError_t mt_cuda_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n, int dt,
                                             void *stream) {
    return gelu_backward<true>(dinp, inp, dout, n, dt, stream);
}

extern "C" cudaError_t mt_cuda_gelu_backward_set(void *dinp, const void *inp, const void *dout, size_t n, int dt,
                                                 void *stream) {
    return gelu_backward<false>(dinp, inp, dout, n, dt, stream);
}

extern "C" cudaError_t mt_cuda_residual_forward(void *out, const void *a, const void *b, size_t n, int dt,
                                                void *stream) {
    MT_CU_CHECK_SHAPE(out && a && b);
    cudaStream_t s = (cudaStream_t)stream;
    MT_CU_DISPATCH(dt, T,
                   residual_forward_kernel<T>
                   <<<mt_cu_blocks(n, EW_THREADS), EW_THREADS, 0, s>>>((T *)out, (const T *)a, (const T *)b, n));
    return cudaGetLastError();
}

extern "C" cudaError_t mt_cuda_residual_backward(void *da, void *db, const void *dout, size_t n, int dt, void *stream) {
    MT_CU_CHECK_SHAPE(dout);
    if (!da && !db) {
        return cudaSuccess;
    }
    cudaStream_t s = (cudaStream_t)stream;
    MT_CU_DISPATCH(dt, T,
                   residual_backward_kernel<T>
                   <<<mt_cu_blocks(n, EW_THREADS), EW_THREADS, 0, s>>>((T *)da, (T *)db, (const T *)dout, n));
    return cudaGetLastError();
}

extern "C" cudaError_t mt_cuda_convert(void *dst, int dst_dt, const void *src, int src_dt, size_t n, float scale,
                                       void *stream) {
    MT_CU_CHECK_SHAPE(dst && src);
    cudaStream_t s = (cudaStream_t)stream;
    unsigned g = mt_cu_blocks(n, EW_THREADS);
    MT_CU_DISPATCH(
        dst_dt, D,
        MT_CU_DISPATCH(src_dt, S, convert_kernel<D, S><<<g, EW_THREADS, 0, s>>>((D *)dst, (const S *)src, n, scale)));
    return cudaGetLastError();
}

extern "C" cudaError_t mt_cuda_check_finite(int *flag, const void *x, size_t n, int dt, void *stream) {
    MT_CU_CHECK_SHAPE(flag && x);
    cudaStream_t s = (cudaStream_t)stream;
    MT_CU_DISPATCH(
        dt, T, check_finite_kernel<T><<<mt_cu_blocks(n, EW_THREADS, 4096), EW_THREADS, 0, s>>>(flag, (const T *)x, n));
    return cudaGetLastError();
}

extern "C" size_t mt_cuda_sumsq_scratch_doubles(void) {
    return SUMSQ_BLOCKS;
}

extern "C" cudaError_t mt_cuda_sumsq(double *out, const float *x, size_t n, double *scratch, void *stream) {
    MT_CU_CHECK_SHAPE(out && x && scratch);
    cudaStream_t s = (cudaStream_t)stream;
    unsigned blocks = mt_cu_blocks(n, SUMSQ_THREADS * SUMSQ_PER_THREAD, SUMSQ_BLOCKS);
    sumsq_partial_kernel<<<blocks, SUMSQ_THREADS, 0, s>>>(scratch, x, n);
    sumsq_final_kernel<<<1, SUMSQ_THREADS, 0, s>>>(out, scratch, (int)blocks);
    return cudaGetLastError();
}

extern "C" cudaError_t mt_cuda_clip_coef(float *coef, float *norm_out, const double *sumsq, float max_norm,
                                         float inv_scale, void *stream) {
    MT_CU_CHECK_SHAPE(coef && sumsq);
    clip_coef_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(coef, norm_out, sumsq, max_norm, inv_scale);
    return cudaGetLastError();
}

extern "C" int mt_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}
