/* LayerNorm on the device, eps 1e-5, optionally fused with the residual add that precedes it in a GPT-2
 * block (one read of each input, the sum written once and normalised while still in cache). One warp per
 * row for the row-wise work; the weight and bias gradients are column sums over all rows, done in two
 * deterministic stages (row slabs -> partial sums -> fixed-order total) instead of atomics.
 * SPDX-License-Identifier: MIT */
#include <type_traits>

#include "models/cuda/cuda_impl.h"

#define LN_EPS 1e-5f

enum {
    LN_ROWS_PER_BLOCK = 8,
    LN_THREADS = 32 * LN_ROWS_PER_BLOCK,
    LN_SPLIT = 64,
    LN_COLS = 32,
    LN_ROWS = 8,
    LN_FUSED_BLOCKS = 256, /* blocks (row groups) of the fused backward: its dw/db partials */
    LN_FUSED_MAX_C = 1024  /* widest row the fused backward keeps in registers */
};

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

/* The same with the row in registers and 16-byte accesses (C a multiple of 16 bytes, up to LN_FUSED_MAX_C,
 * aligned tensors): one read of the input (or of a and b_in, and one write of res) and one write of out. Measured
 * on an H200 at GPT-2 124M shapes, the element-wise version reached 39% of the copy bandwidth. */
template <typename T, bool FUSED, int VPL>
static __global__ void __launch_bounds__(LN_THREADS)
    layernorm_forward_vec_kernel(T *res, T *out, float *mean, float *rstd, const T *a, const T *b_in, const T *w,
                                 const T *b, int N, int C) {
    constexpr int V = vec16<T>::n;
    int row = blockIdx.x * LN_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31, nv = C / V;
    if (row >= N) {
        return;
    }
    size_t off = (size_t)row * C;
    vec16<T> x[VPL];
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < VPL; j++) {
        int v = lane + 32 * j;
        if (v < nv) {
            if (FUSED) {
                vec16<T> p, q;
                p.u = reinterpret_cast<const uint4 *>(a + off)[v];
                q.u = reinterpret_cast<const uint4 *>(b_in + off)[v];
#pragma unroll
                for (int k = 0; k < V; k++) {
                    x[j].e[k] = from_f32<T>(to_f32(p.e[k]) + to_f32(q.e[k]));
                }
                reinterpret_cast<uint4 *>(res + off)[v] = x[j].u;
            } else {
                x[j].u = reinterpret_cast<const uint4 *>(a + off)[v];
            }
#pragma unroll
            for (int k = 0; k < V; k++) {
                s += to_f32(x[j].e[k]);
            }
        }
    }
    float m = warp_sum(s) / C, var = 0.0f;
#pragma unroll
    for (int j = 0; j < VPL; j++) {
        if (lane + 32 * j < nv) {
#pragma unroll
            for (int k = 0; k < V; k++) {
                float d = to_f32(x[j].e[k]) - m;
                var += d * d;
            }
        }
    }
    float r = rsqrtf(warp_sum(var) / C + LN_EPS);
#pragma unroll
    for (int j = 0; j < VPL; j++) {
        int v = lane + 32 * j;
        if (v < nv) {
            vec16<T> wv, bv, o;
            wv.u = reinterpret_cast<const uint4 *>(w)[v];
            bv.u = reinterpret_cast<const uint4 *>(b)[v];
#pragma unroll
            for (int k = 0; k < V; k++) {
                o.e[k] = from_f32<T>((to_f32(x[j].e[k]) - m) * r * to_f32(wv.e[k]) + to_f32(bv.e[k]));
            }
            reinterpret_cast<uint4 *>(out + off)[v] = o.u;
        }
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

/* The whole backward in one pass for rows up to LN_FUSED_MAX_C wide (C a multiple of 16 bytes): one warp per
 * row, the row's dout and input held in registers (VPL 16-byte vectors per lane), dx written once, and the
 * warp's dw/db contributions kept in registers across the rows it handles (rows warp, warp + 8 gridDim.x,
 * ...); the block's eight warps are summed in shared memory in warp order into partial[blockIdx.x][c] (dw) and
 * partial[gridDim.x + blockIdx.x][c] (db). The row -> block assignment depends only on N and the grid, so the
 * sums are the same on every device and run. Measured on an H200 at GPT-2 124M shapes (docs/PERFORMANCE.md):
 * the two-kernel version took 0.40 + 0.05 ms per LayerNorm. */
template <typename T, int VPL>
static __global__ void __launch_bounds__(LN_THREADS)
    layernorm_backward_fused_kernel(T *dinp, float *partial, const T *dout, const T *inp, const T *w, const float *mean,
                                    const float *rstd, int N, int C) {
    constexpr int V = vec16<T>::n;
    __shared__ float sh[LN_ROWS_PER_BLOCK][LN_FUSED_MAX_C];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nv = C / V;
    float aw[VPL][V], ab[VPL][V];
#pragma unroll
    for (int j = 0; j < VPL; j++) {
#pragma unroll
        for (int k = 0; k < V; k++) {
            aw[j][k] = 0.0f, ab[j][k] = 0.0f;
        }
    }
    for (int row = blockIdx.x * LN_ROWS_PER_BLOCK + warp; row < N; row += gridDim.x * LN_ROWS_PER_BLOCK) {
        size_t off = (size_t)row * C;
        const uint4 *dy4 = (const uint4 *)(dout + off), *x4 = (const uint4 *)(inp + off);
        vec16<T> dy[VPL], x[VPL];
#pragma unroll
        for (int j = 0; j < VPL; j++) {
            int v = lane + 32 * j;
            if (v < nv) {
                dy[j].u = dy4[v];
                x[j].u = x4[v];
            }
        }
        float m = mean[row], r = rstd[row], sg = 0.0f, sgx = 0.0f;
#pragma unroll
        for (int j = 0; j < VPL; j++) {
            int v = lane + 32 * j;
            if (v < nv) {
                vec16<T> wv;
                wv.u = ((const uint4 *)w)[v];
#pragma unroll
                for (int k = 0; k < V; k++) {
                    float d = to_f32(dy[j].e[k]), xh = (to_f32(x[j].e[k]) - m) * r, g = d * to_f32(wv.e[k]);
                    sg += g;
                    sgx += g * xh;
                    aw[j][k] += d * xh;
                    ab[j][k] += d;
                }
            }
        }
        sg = warp_sum(sg) / C;
        sgx = warp_sum(sgx) / C;
        uint4 *dx4 = (uint4 *)(dinp + off);
#pragma unroll
        for (int j = 0; j < VPL; j++) {
            int v = lane + 32 * j;
            if (v < nv) {
                vec16<T> wv, acc;
                wv.u = ((const uint4 *)w)[v];
                acc.u = dx4[v];
#pragma unroll
                for (int k = 0; k < V; k++) {
                    float xh = (to_f32(x[j].e[k]) - m) * r;
                    float d = r * (to_f32(dy[j].e[k]) * to_f32(wv.e[k]) - sg - xh * sgx);
                    acc.e[k] = from_f32<T>(to_f32(acc.e[k]) + d);
                }
                dx4[v] = acc.u;
            }
        }
    }
    /* dw then db: each warp's sums into its row of sh, then the columns summed over the warps in order */
    for (int pass = 0; pass < 2; pass++) {
#pragma unroll
        for (int j = 0; j < VPL; j++) {
            int v = lane + 32 * j;
            if (v < nv) {
#pragma unroll
                for (int k = 0; k < V; k++) {
                    sh[warp][v * V + k] = pass ? ab[j][k] : aw[j][k];
                }
            }
        }
        __syncthreads();
        for (int c = threadIdx.x; c < C; c += LN_THREADS) {
            float a = 0.0f;
            for (int k = 0; k < LN_ROWS_PER_BLOCK; k++) {
                a += sh[k][c];
            }
            partial[(size_t)(pass * gridDim.x + blockIdx.x) * C + c] = a;
        }
        __syncthreads();
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

/* Vectors per lane for the fused backward (0: it does not apply: C not a multiple of 16 bytes, wider than
 * LN_FUSED_MAX_C, or a pointer not 16-byte aligned). */
static int fused_vpl(int C, size_t es, const void *const *ptrs, int n_ptrs) {
    size_t v = 16 / es;
    if ((size_t)C % v != 0 || C > LN_FUSED_MAX_C || !mt_cu_aligned16(ptrs, n_ptrs)) {
        return 0;
    }
    size_t per_lane = ((size_t)C / v + 31) / 32;
    return per_lane <= 4 ? (int)per_lane : per_lane <= 6 ? 6 : 8;
}

/* Calls f(std::integral_constant<int, V>()) for the vectors per lane fused_vpl chose (1, 2, 3, 4, 6 or 8): the
 * vectorised kernels are instantiated per value. */
template <typename F> static void with_vpl(int vpl, F &&f) {
    switch (vpl) {
    case 1:
        f(std::integral_constant<int, 1>());
        break;
    case 2:
        f(std::integral_constant<int, 2>());
        break;
    case 3:
        f(std::integral_constant<int, 3>());
        break;
    case 4:
        f(std::integral_constant<int, 4>());
        break;
    case 6:
        f(std::integral_constant<int, 6>());
        break;
    default:
        f(std::integral_constant<int, 8>());
    }
}

/* the forward on the vectorised kernel with vpl vectors per lane */
template <typename T, bool FUSED>
static void ln_forward_vec(int vpl, unsigned g, cudaStream_t s, T *res, T *out, float *mean, float *rstd, const T *a,
                           const T *b_in, const T *w, const T *b, int N, int C) {
    with_vpl(vpl, [&](auto v) {
        constexpr int VPL = decltype(v)::value;
        layernorm_forward_vec_kernel<T, FUSED, VPL><<<g, LN_THREADS, 0, s>>>(res, out, mean, rstd, a, b_in, w, b, N, C);
    });
}

extern "C" cudaError_t mt_cuda_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const void *w,
                                                 const void *b, int N, int C, int dt, void *stream) {
    MT_CU_CHECK_SHAPE(N > 0 && C > 0 && out && mean && rstd && inp && w && b);
    unsigned g = (unsigned)((N + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK);
    cudaStream_t s = (cudaStream_t)stream;
    const void *ptrs[] = {out, inp, w, b};
    int vpl = fused_vpl(C, dt == MT_CU_F32 ? 4 : 2, ptrs, 4);
    if (vpl) {
        MT_CU_DISPATCH(dt, T,
                       ln_forward_vec<T, false>(vpl, g, s, NULL, (T *)out, mean, rstd, (const T *)inp, NULL,
                                                (const T *)w, (const T *)b, N, C));
        return cudaGetLastError();
    }
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
    const void *ptrs[] = {res, out, a, b_in, w, b};
    int vpl = fused_vpl(C, dt == MT_CU_F32 ? 4 : 2, ptrs, 6);
    if (vpl) {
        MT_CU_DISPATCH(dt, T,
                       ln_forward_vec<T, true>(vpl, g, s, (T *)res, (T *)out, mean, rstd, (const T *)a, (const T *)b_in,
                                               (const T *)w, (const T *)b, N, C));
        return cudaGetLastError();
    }
    MT_CU_DISPATCH(dt, T,
                   layernorm_forward_kernel<T, true>
                   <<<g, LN_THREADS, 0, s>>>((T *)res, (T *)out, mean, rstd, (const T *)a, (const T *)b_in,
                                             (const T *)w, (const T *)b, N, C));
    return cudaGetLastError();
}

extern "C" size_t mt_cuda_layernorm_scratch_floats(int C) {
    return 2 * (size_t)(LN_FUSED_BLOCKS > LN_SPLIT ? LN_FUSED_BLOCKS : LN_SPLIT) * (size_t)C;
}

extern "C" cudaError_t mt_cuda_layernorm_backward(void *dinp, float *dw, float *db, const void *dout, const void *inp,
                                                  const void *w, const float *mean, const float *rstd, int N, int C,
                                                  int dt, float *scratch, void *stream) {
    MT_CU_CHECK_SHAPE(N > 0 && C > 0 && dout && inp && w && mean && rstd);
    MT_CU_CHECK_SHAPE(scratch || (!dw && !db));
    cudaStream_t s = (cudaStream_t)stream;
    size_t es = dt == MT_CU_F32 ? 4 : 2;
    const void *ptrs[] = {dinp, dout, inp, w};
    int vpl = dinp && (dw || db) ? fused_vpl(C, es, ptrs, 4) : 0;
    if (vpl) { /* one pass: dx, and the dw/db partials of LN_FUSED_BLOCKS row groups; then their fixed-order sum */
        int blocks = (N + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK;
        blocks = blocks < LN_FUSED_BLOCKS ? blocks : LN_FUSED_BLOCKS;
        MT_CU_DISPATCH(dt, T, with_vpl(vpl, [&](auto v) {
                           constexpr int VPL = decltype(v)::value;
                           layernorm_backward_fused_kernel<T, VPL><<<blocks, LN_THREADS, 0, s>>>(
                               (T *)dinp, scratch, (const T *)dout, (const T *)inp, (const T *)w, mean, rstd, N, C);
                       }));
        layernorm_backward_dwdb_final_kernel<<<(unsigned)((C + 255) / 256), 256, 0, s>>>(dw, db, scratch, C, blocks);
        return cudaGetLastError();
    }
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
