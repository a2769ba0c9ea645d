/* LayerNorm on the device, eps 1e-5, optionally fused with the residual add that precedes it in a GPT-2
 * block (one read of each input, the sum written once and normalised while still in cache). One warp per
 * row for the row-wise work; the weight and bias gradients are column sums over all rows, done in two
 * deterministic stages (row slabs -> partial sums -> fixed-order total) instead of atomics.
 * SPDX-License-Identifier: MIT */
#include "models/cuda/cuda_impl.h"

#define LN_EPS 1e-5f

enum { LN_ROWS_PER_BLOCK = 8, LN_THREADS = 32 * LN_ROWS_PER_BLOCK, LN_SPLIT = 64, LN_COLS = 32, LN_ROWS = 8 };

/* ======================================== kernels ======================================== */

/* mean = sum x / C; var = sum (x - mean)^2 / C; rstd = 1/sqrt(var + eps); out = (x - mean) rstd w + b.
 * Fused: x = a + b_in is first rounded to T and stored in res, and the statistics use the stored value,
 * so the fused and unfused paths give the same bits. */
template <typename T, bool FUSED>
static __global__ void layernorm_forward_kernel(T *res, T *out, float *mean, float *rstd, const T *a, const T *b_in,
                                                const T *w, const T *b, int N, int C) {
    int row = blockIdx.x * LN_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) {
        return;
    }
    size_t off = (size_t)row * C;
    const T *x = FUSED ? res + off : a + off;
    float s = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float v;
        if (FUSED) {
            T r = from_f32<T>(to_f32(a[off + i]) + to_f32(b_in[off + i]));
            res[off + i] = r;
            v = to_f32(r);
        } else {
            v = to_f32(x[i]);
        }
        s += v;
    }
    float m = warp_sum(s) / C;
    float var = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float d = to_f32(x[i]) - m;
        var += d * d;
    }
    float r = rsqrtf(warp_sum(var) / C + LN_EPS);
    T *o = out + off;
    for (int i = lane; i < C; i += 32) {
        o[i] = from_f32<T>((to_f32(x[i]) - m) * r * to_f32(w[i]) + to_f32(b[i]));
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

/* With xhat = (x - mean) rstd and g = dout w:  dx += rstd (g - mean(g) - xhat mean(g xhat)). */
template <typename T>
static __global__ void layernorm_backward_dx_kernel(T *dinp, const T *dout, const T *inp, const T *w, const float *mean,
                                                    const float *rstd, int N, int C) {
    int row = blockIdx.x * LN_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) {
        return;
    }
    size_t off = (size_t)row * C;
    float m = mean[row], r = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float g = to_f32(dout[off + i]) * to_f32(w[i]);
        sg += g;
        sgx += g * (to_f32(inp[off + i]) - m) * r;
    }
    sg = warp_sum(sg) / C;
    sgx = warp_sum(sgx) / C;
    for (int i = lane; i < C; i += 32) {
        float xh = (to_f32(inp[off + i]) - m) * r;
        float d = r * (to_f32(dout[off + i]) * to_f32(w[i]) - sg - xh * sgx);
        dinp[off + i] = from_f32<T>(to_f32(dinp[off + i]) + d);
    }
}

/* Stage 1 of dw/db: block (x = 32-column group, y = row slab) sums dout xhat and dout over its rows
 * (rows y*8+ty, stepping by gridDim.y*8), reduces over ty, writes partial[y][c] (dw) and
 * partial[gridDim.y + y][c] (db). */
template <typename T>
static __global__ void layernorm_backward_dwdb_partial_kernel(float *partial, const T *dout, const T *inp,
                                                              const float *mean, const float *rstd, int N, int C) {
    __shared__ float sw[LN_ROWS][LN_COLS + 1], sb[LN_ROWS][LN_COLS + 1];
    int tx = threadIdx.x % LN_COLS, ty = threadIdx.x / LN_COLS;
    int c = blockIdx.x * LN_COLS + tx;
    float aw = 0.0f, ab = 0.0f;
    if (c < C) {
        for (int n = blockIdx.y * LN_ROWS + ty; n < N; n += gridDim.y * LN_ROWS) {
            float dy = to_f32(dout[(size_t)n * C + c]);
            aw += dy * (to_f32(inp[(size_t)n * C + c]) - mean[n]) * rstd[n];
            ab += dy;
        }
    }
    sw[ty][tx] = aw;
    sb[ty][tx] = ab;
    __syncthreads();
    if (ty == 0 && c < C) {
        for (int k = 1; k < LN_ROWS; k++) {
            aw += sw[k][tx];
            ab += sb[k][tx];
        }
        partial[(size_t)blockIdx.y * C + c] = aw;
        partial[(size_t)(gridDim.y + blockIdx.y) * C + c] = ab;
    }
}

/* Stage 2: dw[c] += sum_y partial[y][c]; db[c] += sum_y partial[S + y][c], y in order. */
static __global__ void layernorm_backward_dwdb_final_kernel(float *dw, float *db, const float *partial, int C, int S) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) {
        return;
    }
    float aw = 0.0f, ab = 0.0f;
    for (int y = 0; y < S; y++) {
        aw += partial[(size_t)y * C + c];
        ab += partial[(size_t)(S + y) * C + c];
    }
    if (dw) {
        dw[c] += aw;
    }
    if (db) {
        db[c] += ab;
    }
}

/* ======================================== launchers ======================================== */

extern "C" cudaError_t mt_cuda_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const void *w,
                                                 const void *b, int N, int C, int dt, void *stream) {
    MT_CU_CHECK_SHAPE(N > 0 && C > 0 && out && mean && rstd && inp && w && b);
    unsigned g = (unsigned)((N + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK);
    cudaStream_t s = (cudaStream_t)stream;
    MT_CU_DISPATCH(dt, T,
                   layernorm_forward_kernel<T, false><<<g, LN_THREADS, 0, s>>>(
                       NULL, (T *)out, mean, rstd, (const T *)inp, NULL, (const T *)w, (const T *)b, N, C));
    return cudaGetLastError();
}

extern "C" cudaError_t mt_cuda_residual_layernorm_forward(void *res, void *out, float *mean, float *rstd, const void *a,
                                                          const void *b_in, const void *w, const void *b, int N, int C,
                                                          int dt, void *stream) {
    MT_CU_CHECK_SHAPE(N > 0 && C > 0 && res && out && mean && rstd && a && b_in && w && b);
    unsigned g = (unsigned)((N + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK);
    cudaStream_t s = (cudaStream_t)stream;
    MT_CU_DISPATCH(dt, T,
                   layernorm_forward_kernel<T, true>
                   <<<g, LN_THREADS, 0, s>>>((T *)res, (T *)out, mean, rstd, (const T *)a, (const T *)b_in,
                                             (const T *)w, (const T *)b, N, C));
    return cudaGetLastError();
}

extern "C" size_t mt_cuda_layernorm_scratch_floats(int C) {
    return 2 * (size_t)LN_SPLIT * (size_t)C;
}

extern "C" cudaError_t mt_cuda_layernorm_backward(void *dinp, float *dw, float *db, const void *dout, const void *inp,
                                                  const void *w, const float *mean, const float *rstd, int N, int C,
                                                  int dt, float *scratch, void *stream) {
    MT_CU_CHECK_SHAPE(N > 0 && C > 0 && dout && inp && w && mean && rstd);
    MT_CU_CHECK_SHAPE(scratch || (!dw && !db));
    cudaStream_t s = (cudaStream_t)stream;
    if (dinp) {
        unsigned g = (unsigned)((N + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK);
        MT_CU_DISPATCH(dt, T,
                       layernorm_backward_dx_kernel<T><<<g, LN_THREADS, 0, s>>>(
                           (T *)dinp, (const T *)dout, (const T *)inp, (const T *)w, mean, rstd, N, C));
    }
    if (dw || db) {
        int split = (N + LN_ROWS - 1) / LN_ROWS < LN_SPLIT ? (N + LN_ROWS - 1) / LN_ROWS : LN_SPLIT;
        dim3 g1((unsigned)((C + LN_COLS - 1) / LN_COLS), (unsigned)split);
        MT_CU_DISPATCH(dt, T,
                       layernorm_backward_dwdb_partial_kernel<T>
                       <<<g1, LN_COLS * LN_ROWS, 0, s>>>(scratch, (const T *)dout, (const T *)inp, mean, rstd, N, C));
        layernorm_backward_dwdb_final_kernel<<<(unsigned)((C + 255) / 256), 256, 0, s>>>(dw, db, scratch, C, split);
    }
    return cudaGetLastError();
}
