/* Causal multi-head attention on the device without the T x T matrix, in the manner of FlashAttention:
 * forward streams key/value tiles through shared memory and keeps, per query row, a running maximum, the
 * running sum of exponentials and the unnormalised output (online softmax), saving only the log-sum-exp;
 * backward recomputes the probabilities tile by tile from it. A query row (forward, dQ) or key row (dK,
 * dV) is owned by hs/32 threads holding 32 dimensions each in registers, while the tile it streams over is
 * read from shared memory as broadcasts. Scores are kept in base 2 (scaled by log2 e) so each exponential
 * is one exp2. Head size up to 128 (kernels specialised for 32, 64, 128).
 * A plain one-thread-per-row version that stores the probabilities is kept for tests and benchmarks.
 * SPDX-License-Identifier: MIT */
#include "models/cuda/cuda_impl.h"

#include <mma.h>

#include <atomic>
#include <stdint.h>
#include <type_traits>

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

/* A row of the head dimension (HSM, padded up from hs) is split over SPLIT = HSM/32 consecutive threads, 32
 * dimensions each, so the per-thread vectors fit in registers; dot products are summed over the group with
 * shuffles. Shared-memory rows are stored as SPLIT parts of 32 floats padded to 33, so the group's parts
 * fall in different banks. */
template <int HSM> struct attn_cfg {
    static constexpr int SPLIT = HSM / 32; /* threads per row */
    static constexpr int ROWS = 64;        /* rows (queries or keys) owned per block */
    static constexpr int THREADS = ROWS * SPLIT;
    static constexpr int BK = HSM <= 64 ? 64 : 32; /* key rows per shared-memory tile (forward, dQ) */
    static constexpr int BQT = 16;                 /* query rows per shared-memory tile (dK, dV) */
    static constexpr int LD = SPLIT * 33;          /* padded shared-memory row */
    static constexpr int CH = 8;                   /* keys per online-softmax update */
};

__device__ __forceinline__ int pad_idx(int d) {
    return (d >> 5) * 33 + (d & 31);
}

/* Sum over the SPLIT threads of a row (consecutive lanes, identical control flow). */
template <int SPLIT> __device__ __forceinline__ float group_sum(float v) {
    if (SPLIT > 1) {
        unsigned lane = threadIdx.x & 31u;
        unsigned mask = ((1u << SPLIT) - 1u) << (lane & ~(unsigned)(SPLIT - 1));
#pragma unroll
        for (int o = 1; o < SPLIT; o <<= 1) {
            v += __shfl_xor_sync(mask, v, o, SPLIT);
        }
    }
    return v;
}

/* Loads rows [r0, r0 + n) of the K and V parts of qkv (head base) into padded shared tiles. */
template <typename T, int HSM>
__device__ __forceinline__ void load_kv_tile(float *Ks, float *Vs, const T *base, int r0, int n, int T_, int C,
                                             int hs) {
    typedef attn_cfg<HSM> cfg;
    size_t C3 = 3 * (size_t)C;
    for (int idx = threadIdx.x; idx < n * HSM; idx += blockDim.x) {
        int r = idx / HSM, d = idx % HSM, key = r0 + r;
        bool ok = key < T_ && d < hs;
        Ks[r * cfg::LD + pad_idx(d)] = ok ? to_f32(base[(size_t)key * C3 + C + d]) : 0.0f;
        Vs[r * cfg::LD + pad_idx(d)] = ok ? to_f32(base[(size_t)key * C3 + 2 * C + d]) : 0.0f;
    }
}

/* ======================================== kernels ======================================== */

/* Per query row i of head (b, h):  s_j = scale q_i.k_j (j <= i),  m = max s,  l = sum exp(s_j - m),
 * out_i = sum_j exp(s_j - m) v_j / l,  lse_i = m + log l.  Keys arrive in chunks of CH; each chunk rescales
 * the running (m, l, acc) once. */
template <typename T, int HSM>
static __global__ void __launch_bounds__(attn_cfg<HSM>::THREADS)
    attention_forward_kernel(T *out, float *lse, const T *qkv, int T_, int C, int NH, int hs, float scale2) {
    typedef attn_cfg<HSM> cfg;
    __shared__ float Ks[cfg::BK * cfg::LD], Vs[cfg::BK * cfg::LD];
    int part = threadIdx.x % cfg::SPLIT, d0 = part * 32;
    int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * cfg::ROWS, i = q0 + threadIdx.x / cfg::SPLIT;
    size_t C3 = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * C3 + (size_t)h * hs;
    bool valid = i < T_;
    float q[32], acc[32];
#pragma unroll
    for (int d = 0; d < 32; d++) {
        q[d] = (valid && d0 + d < hs) ? to_f32(base[(size_t)i * C3 + d0 + d]) * scale2 : 0.0f;
        acc[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    int kend = min(T_, q0 + cfg::ROWS);
    for (int k0 = 0; k0 < kend; k0 += cfg::BK) {
        __syncthreads();
        load_kv_tile<T, HSM>(Ks, Vs, base, k0, cfg::BK, T_, C, hs);
        __syncthreads();
        if (!valid) {
            continue;
        }
        int jn = min(cfg::BK, i - k0 + 1); /* causal: keys k0 .. i */
        for (int j0 = 0; j0 < jn; j0 += cfg::CH) {
            float s[cfg::CH], mc = -INFINITY;
#pragma unroll
            for (int c = 0; c < cfg::CH; c++) {
                const float *kr = Ks + (j0 + c) * cfg::LD + part * 33;
                float dot = 0.0f;
#pragma unroll
                for (int d = 0; d < 32; d++) {
                    dot += q[d] * kr[d];
                }
                dot = group_sum<cfg::SPLIT>(dot);
                s[c] = (j0 + c < jn) ? dot : -INFINITY;
                mc = fmaxf(mc, s[c]);
            }
            float mn = fmaxf(m, mc); /* finite: the chunk holds at least key j0 < jn */
            float corr = exp2f(m - mn);
            l *= corr;
#pragma unroll
            for (int d = 0; d < 32; d++) {
                acc[d] *= corr;
            }
#pragma unroll
            for (int c = 0; c < cfg::CH; c++) {
                const float *vr = Vs + (j0 + c) * cfg::LD + part * 33;
                float p = exp2f(s[c] - mn);
                l += p;
#pragma unroll
                for (int d = 0; d < 32; d++) {
                    acc[d] += p * vr[d];
                }
            }
            m = mn;
        }
    }
    if (valid) {
        float inv = 1.0f / l;
        T *o = out + ((size_t)b * T_ + i) * C + (size_t)h * hs + d0;
#pragma unroll
        for (int d = 0; d < 32; d++) {
            if (d0 + d < hs) {
                o[d] = from_f32<T>(acc[d] * inv);
            }
        }
        if (part == 0) {
            lse[((size_t)b * NH + h) * T_ + i] = (m + log2f(l)) * LN2;
        }
    }
}

/* D_i = dO_i . O_i = sum_j P_ij dP_ij, the row term of the softmax backward. */
template <typename T>
static __global__ void attention_backward_d_kernel(float *Dv, const T *dout, const T *out, int B, int T_, int C, int NH,
                                                   int hs) {
    size_t n = (size_t)B * NH * T_;
    for (size_t r = blockIdx.x * (size_t)blockDim.x + threadIdx.x; r < n; r += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(r % T_);
        size_t bh = r / T_;
        int h = (int)(bh % NH), b = (int)(bh / NH);
        size_t off = ((size_t)b * T_ + t) * C + (size_t)h * hs;
        float s = 0.0f;
        for (int d = 0; d < hs; d++) {
            s += to_f32(dout[off + d]) * to_f32(out[off + d]);
        }
        Dv[r] = s;
    }
}

/* dK, dV of key j (SPLIT threads per key), over all queries i >= j in tiles of BQT:
 *   P_ij = exp(S_ij - lse_i),  dV_j += P_ij dO_i,  dP_ij = dO_i . v_j,  dS_ij = P_ij (dP_ij - D_i),
 *   dK_j += scale dS_ij q_i.  k_j, v_j, dK_j, dV_j live in registers; q_i and dO_i are broadcasts from the
 * shared tile. Each key row is owned by one block, so the sums are complete and written once (no atomics). */
template <typename T, int HSM>
static __global__ void __launch_bounds__(attn_cfg<HSM>::THREADS)
    attention_backward_dkv_kernel(T *dqkv, const T *qkv, const T *dout, const float *lse, const float *Dv, int T_,
                                  int C, int NH, int hs, float scale) {
    typedef attn_cfg<HSM> cfg;
    __shared__ float Qs[cfg::BQT * cfg::LD], dOs[cfg::BQT * cfg::LD], Ls[cfg::BQT], Ds[cfg::BQT];
    int part = threadIdx.x % cfg::SPLIT, d0 = part * 32;
    int b = blockIdx.z, h = blockIdx.y, k0 = blockIdx.x * cfg::ROWS, j = k0 + threadIdx.x / cfg::SPLIT;
    size_t C3 = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * C3 + (size_t)h * hs;
    const T *dob = dout + (size_t)b * T_ * C + (size_t)h * hs;
    const float *lrow = lse + ((size_t)b * NH + h) * T_, *drow = Dv + ((size_t)b * NH + h) * T_;
    float k[32], v[32], dk[32], dv[32];
#pragma unroll
    for (int d = 0; d < 32; d++) {
        bool ok = j < T_ && d0 + d < hs;
        k[d] = ok ? to_f32(base[(size_t)j * C3 + C + d0 + d]) : 0.0f;
        v[d] = ok ? to_f32(base[(size_t)j * C3 + 2 * C + d0 + d]) : 0.0f;
        dk[d] = 0.0f;
        dv[d] = 0.0f;
    }
    float scale2 = scale * LOG2E;
    for (int i0 = (k0 / cfg::BQT) * cfg::BQT; i0 < T_; i0 += cfg::BQT) {
        __syncthreads();
        for (int idx = threadIdx.x; idx < cfg::BQT * HSM; idx += blockDim.x) {
            int r = idx / HSM, d = idx % HSM, qi = i0 + r;
            bool ok = qi < T_ && d < hs;
            Qs[r * cfg::LD + pad_idx(d)] = ok ? to_f32(base[(size_t)qi * C3 + d]) : 0.0f;
            dOs[r * cfg::LD + pad_idx(d)] = ok ? to_f32(dob[(size_t)qi * C + d]) : 0.0f;
        }
        if (threadIdx.x < cfg::BQT) {
            int qi = i0 + threadIdx.x;
            Ls[threadIdx.x] = qi < T_ ? lrow[qi] * LOG2E : 0.0f;
            Ds[threadIdx.x] = qi < T_ ? drow[qi] : 0.0f;
        }
        __syncthreads();
        for (int r = 0; r < cfg::BQT; r++) {
            int qi = i0 + r;
            const float *qr = Qs + r * cfg::LD + part * 33, *dor = dOs + r * cfg::LD + part * 33;
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int d = 0; d < 32; d++) {
                s += qr[d] * k[d];
                dp += dor[d] * v[d];
            }
            s = group_sum<cfg::SPLIT>(s);
            dp = group_sum<cfg::SPLIT>(dp);
            bool ok = qi < T_ && j < T_ && j <= qi;
            float p = ok ? exp2f(s * scale2 - Ls[r]) : 0.0f;
            float ds = p * (dp - Ds[r]) * scale;
#pragma unroll
            for (int d = 0; d < 32; d++) {
                dv[d] += p * dor[d];
                dk[d] += ds * qr[d];
            }
        }
    }
    if (j < T_) {
        T *dkp = dqkv + ((size_t)b * T_ + j) * C3 + C + (size_t)h * hs + d0, *dvp = dkp + C;
#pragma unroll
        for (int d = 0; d < 32; d++) {
            if (d0 + d < hs) {
                dkp[d] = from_f32<T>(to_f32(dkp[d]) + dk[d]);
                dvp[d] = from_f32<T>(to_f32(dvp[d]) + dv[d]);
            }
        }
    }
}

/* dQ of query i (SPLIT threads per query), over keys j <= i in tiles: dQ_i += scale sum_j dS_ij k_j. */
template <typename T, int HSM>
static __global__ void __launch_bounds__(attn_cfg<HSM>::THREADS)
    attention_backward_dq_kernel(T *dqkv, const T *qkv, const T *dout, const float *lse, const float *Dv, int T_, int C,
                                 int NH, int hs, float scale) {
    typedef attn_cfg<HSM> cfg;
    __shared__ float Ks[cfg::BK * cfg::LD], Vs[cfg::BK * cfg::LD];
    int part = threadIdx.x % cfg::SPLIT, d0 = part * 32;
    int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * cfg::ROWS, i = q0 + threadIdx.x / cfg::SPLIT;
    size_t C3 = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * C3 + (size_t)h * hs;
    bool valid = i < T_;
    float q[32], dO[32], dq[32];
#pragma unroll
    for (int d = 0; d < 32; d++) {
        bool ok = valid && d0 + d < hs;
        q[d] = ok ? to_f32(base[(size_t)i * C3 + d0 + d]) : 0.0f;
        dO[d] = ok ? to_f32(dout[((size_t)b * T_ + i) * C + (size_t)h * hs + d0 + d]) : 0.0f;
        dq[d] = 0.0f;
    }
    float scale2 = scale * LOG2E;
    float L2 = valid ? lse[((size_t)b * NH + h) * T_ + i] * LOG2E : 0.0f;
    float Di = valid ? Dv[((size_t)b * NH + h) * T_ + i] : 0.0f;
    int kend = min(T_, q0 + cfg::ROWS);
    for (int k0 = 0; k0 < kend; k0 += cfg::BK) {
        __syncthreads();
        load_kv_tile<T, HSM>(Ks, Vs, base, k0, cfg::BK, T_, C, hs);
        __syncthreads();
        if (!valid) {
            continue;
        }
        int jn = min(cfg::BK, i - k0 + 1);
        for (int jj = 0; jj < jn; jj++) {
            const float *kr = Ks + jj * cfg::LD + part * 33, *vr = Vs + jj * cfg::LD + part * 33;
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int d = 0; d < 32; d++) {
                s += q[d] * kr[d];
                dp += dO[d] * vr[d];
            }
            s = group_sum<cfg::SPLIT>(s);
            dp = group_sum<cfg::SPLIT>(dp);
            float p = exp2f(s * scale2 - L2);
            float ds = p * (dp - Di) * scale;
#pragma unroll
            for (int d = 0; d < 32; d++) {
                dq[d] += ds * kr[d];
            }
        }
    }
    if (valid) {
        T *dqp = dqkv + ((size_t)b * T_ + i) * C3 + (size_t)h * hs + d0;
#pragma unroll
        for (int d = 0; d < 32; d++) {
            if (d0 + d < hs) {
                dqp[d] = from_f32<T>(to_f32(dqp[d]) + dq[d]);
            }
        }
    }
}

/* The plain version: one thread per (b, h, i) writes its full probability row att (zeros above the
 * diagonal) to global memory, then out_i = sum_j att_ij v_j. */
template <typename T, int HSM>
static __global__ void attention_plain_forward_kernel(T *out, float *att, float *lse, const T *qkv, int B, int T_,
                                                      int C, int NH, int hs, float scale) {
    size_t n = (size_t)B * NH * T_;
    size_t r = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (r >= n) {
        return;
    }
    int i = (int)(r % T_);
    int h = (int)((r / T_) % NH), b = (int)(r / T_ / NH);
    size_t C3 = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * C3 + (size_t)h * hs;
    float *row = att + r * T_;
    float mx = -INFINITY;
    for (int j = 0; j <= i; j++) {
        float s = 0.0f;
        for (int d = 0; d < hs; d++) {
            s += to_f32(base[(size_t)i * C3 + d]) * to_f32(base[(size_t)j * C3 + C + d]);
        }
        row[j] = s * scale;
        mx = fmaxf(mx, row[j]);
    }
    float sum = 0.0f;
    for (int j = 0; j <= i; j++) {
        row[j] = expf(row[j] - mx);
        sum += row[j];
    }
    float inv = 1.0f / sum;
    float acc[HSM];
#pragma unroll
    for (int d = 0; d < HSM; d++) {
        acc[d] = 0.0f;
    }
    for (int j = 0; j <= i; j++) {
        row[j] *= inv;
#pragma unroll
        for (int d = 0; d < HSM; d++) {
            if (d < hs) {
                acc[d] += row[j] * to_f32(base[(size_t)j * C3 + 2 * C + d]);
            }
        }
    }
    for (int j = i + 1; j < T_; j++) {
        row[j] = 0.0f;
    }
    T *o = out + ((size_t)b * T_ + i) * C + (size_t)h * hs;
#pragma unroll
    for (int d = 0; d < HSM; d++) {
        if (d < hs) {
            o[d] = from_f32<T>(acc[d]);
        }
    }
    lse[r] = mx + logf(sum);
}

/* ================================= tensor-core forward (bf16, fp16) ================================= */

/* The same online softmax with both products on tensor cores through the CUDA C++ warp matrix API
 * (nvcuda::wmma, 16x16x16 fragments, f32 accumulation). A block owns BQ = 64 queries, 16 per warp; per key
 * tile each warp computes its 16 x BK scores S = Q K^T into a private f32 shared-memory tile, then the two
 * lanes of each row (lane pair 2r, 2r+1 owns row r) run the online-softmax update on it, write the
 * probabilities P rounded to the storage type into a private shared tile, and the warp computes P V with
 * wmma in chunks of OW output columns, stored to the f32 tile and added to the row's output accumulator,
 * which the lane pair keeps in registers so each row can be rescaled by its own correction factor (the
 * element layout of an accumulator fragment is unspecified, so per-row scaling goes through memory). Q is
 * held in matrix_a fragments for the whole kernel. K and V tiles are staged in shared memory in the
 * storage type with rows padded by 8 elements (16 bytes) against bank conflicts of the fragment loads.
 * Head dimensions past hs and keys past T are zeros in shared memory; lse is the same natural-log
 * log-sum-exp as the scalar kernel's, so the backward is shared. The probabilities are summed as rounded,
 * so the output is exactly the P-weighted mean of V for the P that was multiplied. */
template <int HSM> struct tc_cfg {
    static constexpr int WARPS = 4;
    static constexpr int THREADS = WARPS * 32;
    static constexpr int BQ = WARPS * 16;          /* query rows per block */
    static constexpr int BK = HSM <= 64 ? 64 : 32; /* keys per shared-memory tile */
    static constexpr int LDK = HSM + 8;            /* padded row of the Q/K/V tiles (storage elements) */
    static constexpr int OW = HSM < 64 ? HSM : 64; /* output columns per P V chunk */
    static constexpr int SW = BK > OW ? BK : OW;   /* columns of the f32 scratch tile */
    static constexpr int LDS = SW + 4;             /* its padded row (floats; wmma needs a multiple of 4) */
    static constexpr int LDP = BK + 8;             /* padded row of the P tile (storage elements) */
    static_assert(2 * BK >= BQ, "the Q tile is staged in the K/V buffer");
    static_assert((BK & (BK - 1)) == 0 && (OW & (OW - 1)) == 0, "lane column rotation needs powers of two");
};

struct __align__(16) tc_vec8 { /* 8 storage elements of 2 bytes, one 16-byte access */
    unsigned int w[4];
};

/* Copies rows [r0, r0 + n) of one of q/k/v (src: the head's first element of row 0, row stride C3) into
 * dst (n x HSM, row stride LDK), zero past hs and past T. vec: 16-byte accesses (hs, C multiples of 8 and
 * the tensor 16-byte aligned, checked by the launcher). */
template <typename T, int HSM>
__device__ __forceinline__ void tc_load_rows(T *dst, const T *src, int r0, int n, int T_, size_t C3, int hs, bool vec) {
    typedef tc_cfg<HSM> cfg;
    if (vec) {
        for (int idx = threadIdx.x; idx < n * (HSM / 8); idx += blockDim.x) {
            int r = idx / (HSM / 8), d = (idx % (HSM / 8)) * 8, row = r0 + r;
            tc_vec8 v = {{0u, 0u, 0u, 0u}};
            if (row < T_ && d < hs) {
                v = *(const tc_vec8 *)(src + (size_t)row * C3 + d);
            }
            *(tc_vec8 *)(dst + r * cfg::LDK + d) = v;
        }
    } else {
        for (int idx = threadIdx.x; idx < n * HSM; idx += blockDim.x) {
            int r = idx / HSM, d = idx % HSM, row = r0 + r;
            dst[r * cfg::LDK + d] = (row < T_ && d < hs) ? src[(size_t)row * C3 + d] : from_f32<T>(0.0f);
        }
    }
}

/* Column j of the W columns a lane of row r (half = lane & 1) handles: its parity's columns, rotated by two
 * for rows 8..15 so that the 32 lanes of a warp hit 32 different banks at each j (row stride = 4 mod 32). */
template <int W> __device__ __forceinline__ int tc_col(int j, int half, int r) {
    return (2 * j + half + 2 * (r >> 3)) & (W - 1);
}

/* The warp's 16 x BK product A X^T: its 16 rows of A (qf, HSM / 16 fragments) against the BK rows of X (Ks, row
 * stride LDK), f32 accumulation, stored to Sw (row stride LDS floats): the scores Q K^T (forward, dQ), K Q^T
 * (dK/dV), dO V^T (dQ) and V dO^T (dK/dV). */
template <typename T, int HSM, int BK, int LDK, int LDS>
__device__ __forceinline__ void
tc_scores(float *Sw, const nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T, nvcuda::wmma::row_major> *qf,
          const T *Ks) {
    using namespace nvcuda;
#pragma unroll
    for (int n = 0; n < BK / 16; n++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> sf;
        wmma::fill_fragment(sf, 0.0f);
#pragma unroll
        for (int kk = 0; kk < HSM / 16; kk++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kf; /* K^T from K rows */
            wmma::load_matrix_sync(kf, Ks + n * 16 * LDK + kk * 16, LDK);
            wmma::mma_sync(sf, qf[kk], kf, sf);
        }
        wmma::store_matrix_sync(Sw + n * 16, sf, LDS, wmma::mem_row_major);
    }
}

template <typename T, int HSM>
static __global__ void __launch_bounds__(tc_cfg<HSM>::THREADS)
    attention_forward_tc_kernel(T *out, float *lse, const T *qkv, int T_, int C, int NH, int hs, float scale2,
                                int vec) {
    using namespace nvcuda;
    typedef tc_cfg<HSM> cfg;
    typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> frag_a;
    typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> frag_b;
    typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;
    __shared__ __align__(128) T KVs[2 * cfg::BK * cfg::LDK];
    __shared__ __align__(128) float Ss[cfg::WARPS * 16 * cfg::LDS];
    __shared__ __align__(128) T Ps[cfg::WARPS * 16 * cfg::LDP];
    T *Ks = KVs, *Vs = KVs + cfg::BK * cfg::LDK;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int qb = (int)(gridDim.x - 1 - blockIdx.x); /* the longest (last) query blocks start first */
    int b = blockIdx.z, h = blockIdx.y, q0 = qb * cfg::BQ, w0 = q0 + warp * 16;
    size_t C3 = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * C3 + (size_t)h * hs;
    float *Sw = Ss + warp * 16 * cfg::LDS;
    T *Pw = Ps + warp * 16 * cfg::LDP;

    /* Q: staged through the K/V buffer into fragments kept for the whole kernel */
    tc_load_rows<T, HSM>(KVs, base, q0, cfg::BQ, T_, C3, hs, vec != 0);
    __syncthreads();
    frag_a qf[HSM / 16];
#pragma unroll
    for (int kk = 0; kk < HSM / 16; kk++) {
        wmma::load_matrix_sync(qf[kk], KVs + warp * 16 * cfg::LDK + kk * 16, cfg::LDK);
    }

    int r = lane >> 1, half = lane & 1, i = w0 + r;
    float m = -INFINITY, l = 0.0f, o[HSM / 2];
#pragma unroll
    for (int j = 0; j < HSM / 2; j++) {
        o[j] = 0.0f;
    }
    int kend = min(T_, q0 + cfg::BQ);
    for (int k0 = 0; k0 < kend; k0 += cfg::BK) {
        __syncthreads(); /* the previous tile (or the Q staging) is no longer read */
        tc_load_rows<T, HSM>(Ks, base + C, k0, cfg::BK, T_, C3, hs, vec != 0);
        tc_load_rows<T, HSM>(Vs, base + 2 * (size_t)C, k0, cfg::BK, T_, C3, hs, vec != 0);
        __syncthreads();
        if (w0 + 15 < k0) {
            continue; /* every row of this warp is before the tile (causal); warp-uniform */
        }
        tc_scores<T, HSM, cfg::BK, cfg::LDK, cfg::LDS>(Sw, qf, Ks); /* S = Q K^T (16 x BK) */
        __syncwarp();
        /* online softmax of row r over this tile, in base 2; keys after i or past T are masked */
        constexpr int NJ = cfg::BK / 2;
        float s[NJ], mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            int c = tc_col<cfg::BK>(j, half, r), key = k0 + c;
            s[j] = (key <= i && key < T_) ? Sw[r * cfg::LDS + c] * scale2 : -INFINITY;
            mx = fmaxf(mx, s[j]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        float mn = fmaxf(m, mx); /* finite: the first tile holds key 0 <= i for every row */
        float corr = exp2f(m - mn), ls = 0.0f;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            T p = from_f32<T>(exp2f(s[j] - mn));
            Pw[r * cfg::LDP + tc_col<cfg::BK>(j, half, r)] = p;
            ls += to_f32(p);
        }
        ls += __shfl_xor_sync(0xffffffffu, ls, 1);
        l = l * corr + ls;
        m = mn;
        __syncwarp(); /* P written and S read by every lane before P V reuses Sw */
                      /* O = O corr + P V, OW output columns at a time */
#pragma unroll
        for (int c0 = 0; c0 < HSM; c0 += cfg::OW) {
            frag_c of[cfg::OW / 16];
#pragma unroll
            for (int n = 0; n < cfg::OW / 16; n++) {
                wmma::fill_fragment(of[n], 0.0f);
            }
#pragma unroll
            for (int kk = 0; kk < cfg::BK / 16; kk++) {
                frag_a pf;
                wmma::load_matrix_sync(pf, Pw + kk * 16, cfg::LDP);
#pragma unroll
                for (int n = 0; n < cfg::OW / 16; n++) {
                    frag_b vf;
                    wmma::load_matrix_sync(vf, Vs + kk * 16 * cfg::LDK + c0 + n * 16, cfg::LDK);
                    wmma::mma_sync(of[n], pf, vf, of[n]);
                }
            }
#pragma unroll
            for (int n = 0; n < cfg::OW / 16; n++) {
                wmma::store_matrix_sync(Sw + n * 16, of[n], cfg::LDS, wmma::mem_row_major);
            }
            __syncwarp();
#pragma unroll
            for (int j = 0; j < cfg::OW / 2; j++) {
                o[c0 / 2 + j] = o[c0 / 2 + j] * corr + Sw[r * cfg::LDS + tc_col<cfg::OW>(j, half, r)];
            }
            __syncwarp(); /* the chunk is read before the next store to Sw */
        }
    }
    /* out = O / l through Sw, so the warp writes each row's columns contiguously */
    float inv = 1.0f / l;
    T *ob = out + (size_t)b * T_ * C + (size_t)h * hs;
#pragma unroll
    for (int c0 = 0; c0 < HSM; c0 += cfg::OW) {
#pragma unroll
        for (int j = 0; j < cfg::OW / 2; j++) {
            Sw[r * cfg::LDS + tc_col<cfg::OW>(j, half, r)] = o[c0 / 2 + j] * inv;
        }
        __syncwarp();
        for (int idx = lane; idx < 16 * cfg::OW; idx += 32) {
            int rr = idx / cfg::OW, d = c0 + idx % cfg::OW;
            if (w0 + rr < T_ && d < hs) {
                ob[(size_t)(w0 + rr) * C + d] = from_f32<T>(Sw[rr * cfg::LDS + idx % cfg::OW]);
            }
        }
        __syncwarp();
    }
    if (half == 0 && i < T_) {
        lse[((size_t)b * NH + h) * T_ + i] = (m + log2f(l)) * LN2;
    }
}

/* ================================ tensor-core backward (bf16, fp16) ================================ */

/* The backward of the scalar kernels' contract (probabilities recomputed from lse, D_i = dO_i . O_i from
 * attention_backward_d_kernel, each gradient row owned by one block, no atomics) with the four products on
 * tensor cores. Per streamed tile a warp computes a 16 x 64 block of scores into its private f32 tile,
 * the lane pair of each row turns it into probabilities (kept in registers), then the next product into the
 * same tile gives dP, and dS = P (dP - D) scale; P and dS are written back over the f32 tile in the
 * storage type (row stride 2 * LDS elements; each lane reads all of its values before any lane writes,
 * separated by __syncwarp) to feed the next wmma products. The gradient accumulators never need per-row
 * rescaling, so they stay in accumulator fragments for the whole kernel and are added into dqkv once at
 * the end through the f32 tile. Head sizes up to 64 (with 128 the register budget of the fragments
 * held for the whole kernel would spill); larger head sizes keep the CUDA-core backward. */
template <int HSM> struct tcb_cfg {
    static_assert(HSM <= 64, "the tensor-core backward is for head sizes up to 64");
    static constexpr int WARPS = 4;
    static constexpr int THREADS = WARPS * 32;
    static constexpr int ROWS = WARPS * 16; /* gradient rows (keys or queries) owned per block */
    static constexpr int BT = 64;           /* rows of the streamed tile (queries or keys) */
    static constexpr int LDK = tc_cfg<HSM>::LDK;
    static constexpr int LDS = (BT > HSM ? BT : HSM) + 4; /* the f32 tile's row (floats) */
    static constexpr int LDT = 2 * LDS;                   /* the same row as storage elements */
};

/* acc (16 x HSM) += A X for the backward's products (dV += P^T dO, dK += dS^T Q, dQ += dS K): the lane's NJ
 * values p of row r of A (f32) are stored to the warp's tile Pw in the storage dtype (row stride LDT, the
 * columns tc_col gives), then A (16 x BT) times X (BT rows of HSM, row stride LDK, shared memory). Ends with
 * a warp barrier: A is loaded before the caller rewrites the tile. */
template <typename T, int HSM, int BT, int LDT, int LDK, int NJ>
__device__ __forceinline__ void
tcb_acc(nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> (&acc)[HSM / 16], T *Pw,
        const float (&p)[NJ], int r, int half, const T *X) {
    using namespace nvcuda;
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) {
        Pw[r * LDT + tc_col<BT>(jj, half, r)] = from_f32<T>(p[jj]);
    }
    __syncwarp();
#pragma unroll
    for (int kk = 0; kk < BT / 16; kk++) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::load_matrix_sync(a, Pw + kk * 16, LDT);
#pragma unroll
        for (int n = 0; n < HSM / 16; n++) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> xb;
            wmma::load_matrix_sync(xb, X + kk * 16 * LDK + n * 16, LDK);
            wmma::mma_sync(acc[n], a, xb, acc[n]);
        }
    }
    __syncwarp();
}

/* dst[(w0 + rr) * ld + d] += acc (16 x HSM) for rows < T and d < hs, through the warp's f32 tile Sw. */
template <typename T, int HSM>
__device__ __forceinline__ void
tcb_add_rows(T *dst, nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> (&acc)[HSM / 16], float *Sw,
             int w0, int T_, size_t ld, int hs, int lane) {
    typedef tcb_cfg<HSM> cfg;
#pragma unroll
    for (int n = 0; n < HSM / 16; n++) {
        nvcuda::wmma::store_matrix_sync(Sw + n * 16, acc[n], cfg::LDS, nvcuda::wmma::mem_row_major);
    }
    __syncwarp();
    for (int idx = lane; idx < 16 * HSM; idx += 32) {
        int rr = idx / HSM, d = idx % HSM;
        if (w0 + rr < T_ && d < hs) {
            T *p = dst + (size_t)(w0 + rr) * ld + d;
            *p = from_f32<T>(to_f32(*p) + Sw[rr * cfg::LDS + d]);
        }
    }
    __syncwarp();
}

/* dK, dV of a block's 64 keys (16 per warp), over the query tiles i0 >= k0:
 *   S^T = K Q^T,  P^T = exp2(S^T scale2 - lse2_i) (j <= i < T),  dV += P^T dO,  dP^T = V dO^T,
 *   dS^T = P^T (dP^T - D_i) scale,  dK += dS^T Q. K and V stay in matrix_a fragments. */
/* (At least 3 blocks per SM: without the bound nvcc takes 255 registers, leaving room for 2; with it 168.) */
template <typename T, int HSM>
static __global__ void __launch_bounds__(tcb_cfg<HSM>::THREADS, 3)
    attention_backward_dkv_tc_kernel(T *dqkv, const T *qkv, const T *dout, const float *lse, const float *Dv, int T_,
                                     int C, int NH, int hs, float scale, int vec) {
    using namespace nvcuda;
    typedef tcb_cfg<HSM> cfg;
    typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> frag_a;
    typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;
    __shared__ __align__(128) T Qs[cfg::BT * cfg::LDK], dOs[cfg::BT * cfg::LDK];
    __shared__ __align__(128) float Ss[cfg::WARPS * 16 * cfg::LDS];
    __shared__ float Ls[cfg::BT], Ds[cfg::BT];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int b = blockIdx.z, h = blockIdx.y, k0 = blockIdx.x * cfg::ROWS, w0 = k0 + warp * 16; /* first blocks: most work */
    size_t C3 = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * C3 + (size_t)h * hs;
    const T *dob = dout + (size_t)b * T_ * C + (size_t)h * hs;
    const float *lrow = lse + ((size_t)b * NH + h) * T_, *drow = Dv + ((size_t)b * NH + h) * T_;
    float *Sw = Ss + warp * 16 * cfg::LDS;
    T *Pw = (T *)Sw;
    float scale2 = scale * LOG2E;

    /* the block's K and V rows, staged through the Q/dO buffers into fragments */
    tc_load_rows<T, HSM>(Qs, base + C, k0, cfg::ROWS, T_, C3, hs, vec != 0);
    tc_load_rows<T, HSM>(dOs, base + 2 * (size_t)C, k0, cfg::ROWS, T_, C3, hs, vec != 0);
    __syncthreads();
    frag_a kf[HSM / 16], vf[HSM / 16];
    frag_c dk[HSM / 16], dv[HSM / 16];
#pragma unroll
    for (int kk = 0; kk < HSM / 16; kk++) {
        wmma::load_matrix_sync(kf[kk], Qs + warp * 16 * cfg::LDK + kk * 16, cfg::LDK);
        wmma::load_matrix_sync(vf[kk], dOs + warp * 16 * cfg::LDK + kk * 16, cfg::LDK);
        wmma::fill_fragment(dk[kk], 0.0f);
        wmma::fill_fragment(dv[kk], 0.0f);
    }
    int r = lane >> 1, half = lane & 1, j = w0 + r;
    for (int i0 = k0; i0 < T_; i0 += cfg::BT) {
        __syncthreads(); /* the previous tile (or the K/V staging) is no longer read */
        tc_load_rows<T, HSM>(Qs, base, i0, cfg::BT, T_, C3, hs, vec != 0);
        tc_load_rows<T, HSM>(dOs, dob, i0, cfg::BT, T_, (size_t)C, hs, vec != 0);
        for (int t = threadIdx.x; t < cfg::BT; t += blockDim.x) {
            Ls[t] = i0 + t < T_ ? lrow[i0 + t] * LOG2E : 0.0f;
            Ds[t] = i0 + t < T_ ? drow[i0 + t] : 0.0f;
        }
        __syncthreads();
        if (w0 > i0 + cfg::BT - 1) {
            continue; /* every key of this warp is after the tile's queries; warp-uniform */
        }
        /* S^T = K Q^T (16 keys x BT queries) */
        tc_scores<T, HSM, cfg::BT, cfg::LDK, cfg::LDS>(Sw, kf, Qs);
        __syncwarp();
        constexpr int NJ = cfg::BT / 2;
        float p[NJ];
#pragma unroll
        for (int jj = 0; jj < NJ; jj++) {
            int c = tc_col<cfg::BT>(jj, half, r), i = i0 + c;
            p[jj] = (j <= i && i < T_ && j < T_) ? exp2f(Sw[r * cfg::LDS + c] * scale2 - Ls[c]) : 0.0f;
        }
        __syncwarp(); /* every lane has read its scores before P overwrites the tile */
        /* dV += P^T dO; P is loaded before dP^T overwrites the tile */
        tcb_acc<T, HSM, cfg::BT, cfg::LDT, cfg::LDK, NJ>(dv, Pw, p, r, half, dOs);
        /* dP^T = V dO^T */
        tc_scores<T, HSM, cfg::BT, cfg::LDK, cfg::LDS>(Sw, vf, dOs);
        __syncwarp();
#pragma unroll
        for (int jj = 0; jj < NJ; jj++) {
            int c = tc_col<cfg::BT>(jj, half, r);
            p[jj] = p[jj] * (Sw[r * cfg::LDS + c] - Ds[c]) * scale;
        }
        __syncwarp();
        /* dK += dS^T Q; dS is loaded before the next tile's scores overwrite it */
        tcb_acc<T, HSM, cfg::BT, cfg::LDT, cfg::LDK, NJ>(dk, Pw, p, r, half, Qs);
    }
    T *db = dqkv + (size_t)b * T_ * C3 + (size_t)h * hs;
    tcb_add_rows<T, HSM>(db + C, dk, Sw, w0, T_, C3, hs, lane);
    tcb_add_rows<T, HSM>(db + 2 * (size_t)C, dv, Sw, w0, T_, C3, hs, lane);
}

/* dQ of a block's 64 queries (16 per warp), over the key tiles k0 <= the block's last query:
 *   S = Q K^T,  P = exp2(S scale2 - lse2_i),  dP = dO V^T,  dS = P (dP - D_i) scale,  dQ += dS K.
 * Q and dO stay in matrix_a fragments. */
template <typename T, int HSM>
static __global__ void __launch_bounds__(tcb_cfg<HSM>::THREADS)
    attention_backward_dq_tc_kernel(T *dqkv, const T *qkv, const T *dout, const float *lse, const float *Dv, int T_,
                                    int C, int NH, int hs, float scale, int vec) {
    using namespace nvcuda;
    typedef tcb_cfg<HSM> cfg;
    typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> frag_a;
    typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;
    __shared__ __align__(128) T Ks[cfg::BT * cfg::LDK], Vs[cfg::BT * cfg::LDK];
    __shared__ __align__(128) float Ss[cfg::WARPS * 16 * cfg::LDS];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int qb = (int)(gridDim.x - 1 - blockIdx.x); /* the longest (last) query blocks start first */
    int b = blockIdx.z, h = blockIdx.y, q0 = qb * cfg::ROWS, w0 = q0 + warp * 16;
    size_t C3 = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * C3 + (size_t)h * hs;
    const T *dob = dout + (size_t)b * T_ * C + (size_t)h * hs;
    float *Sw = Ss + warp * 16 * cfg::LDS;
    T *Pw = (T *)Sw;
    float scale2 = scale * LOG2E;

    tc_load_rows<T, HSM>(Ks, base, q0, cfg::ROWS, T_, C3, hs, vec != 0);
    tc_load_rows<T, HSM>(Vs, dob, q0, cfg::ROWS, T_, (size_t)C, hs, vec != 0);
    __syncthreads();
    frag_a qf[HSM / 16], of[HSM / 16];
    frag_c dq[HSM / 16];
#pragma unroll
    for (int kk = 0; kk < HSM / 16; kk++) {
        wmma::load_matrix_sync(qf[kk], Ks + warp * 16 * cfg::LDK + kk * 16, cfg::LDK);
        wmma::load_matrix_sync(of[kk], Vs + warp * 16 * cfg::LDK + kk * 16, cfg::LDK);
        wmma::fill_fragment(dq[kk], 0.0f);
    }
    int r = lane >> 1, half = lane & 1, i = w0 + r;
    float L2 = i < T_ ? lse[((size_t)b * NH + h) * T_ + i] * LOG2E : 0.0f;
    float Di = i < T_ ? Dv[((size_t)b * NH + h) * T_ + i] : 0.0f;
    int kend = min(T_, q0 + cfg::ROWS);
    for (int k0 = 0; k0 < kend; k0 += cfg::BT) {
        __syncthreads();
        tc_load_rows<T, HSM>(Ks, base + C, k0, cfg::BT, T_, C3, hs, vec != 0);
        tc_load_rows<T, HSM>(Vs, base + 2 * (size_t)C, k0, cfg::BT, T_, C3, hs, vec != 0);
        __syncthreads();
        if (w0 + 15 < k0) {
            continue; /* every row of this warp is before the tile (causal); warp-uniform */
        }
        tc_scores<T, HSM, cfg::BT, cfg::LDK, cfg::LDS>(Sw, qf, Ks); /* S = Q K^T */
        __syncwarp();
        constexpr int NJ = cfg::BT / 2;
        float p[NJ];
#pragma unroll
        for (int jj = 0; jj < NJ; jj++) {
            int c = tc_col<cfg::BT>(jj, half, r), key = k0 + c;
            p[jj] = (key <= i && key < T_ && i < T_) ? exp2f(Sw[r * cfg::LDS + c] * scale2 - L2) : 0.0f;
        }
        __syncwarp(); /* the scores are read before dP overwrites the tile */
        /* dP = dO V^T */
        tc_scores<T, HSM, cfg::BT, cfg::LDK, cfg::LDS>(Sw, of, Vs);
        __syncwarp();
#pragma unroll
        for (int jj = 0; jj < NJ; jj++) {
            p[jj] = p[jj] * (Sw[r * cfg::LDS + tc_col<cfg::BT>(jj, half, r)] - Di) * scale;
        }
        __syncwarp();
        /* dQ += dS K; dS is loaded before the next tile's scores overwrite it */
        tcb_acc<T, HSM, cfg::BT, cfg::LDT, cfg::LDK, NJ>(dq, Pw, p, r, half, Ks);
    }
    tcb_add_rows<T, HSM>(dqkv + (size_t)b * T_ * C3 + (size_t)h * hs, dq, Sw, w0, T_, C3, hs, lane);
}

/* ======================================== launchers ======================================== */

#define ATTN_DISPATCH_HS(hs, HSM, ...)                                                                                 \
    do {                                                                                                               \
        if ((hs) <= 32) {                                                                                              \
            constexpr int HSM = 32;                                                                                    \
            __VA_ARGS__;                                                                                               \
        } else if ((hs) <= 64) {                                                                                       \
            constexpr int HSM = 64;                                                                                    \
            __VA_ARGS__;                                                                                               \
        } else {                                                                                                       \
            constexpr int HSM = 128;                                                                                   \
            __VA_ARGS__;                                                                                               \
        }                                                                                                              \
    } while (0)

static void attn_check(const void *qkv, int B, int T, int C, int NH) {
    MT_CU_CHECK_SHAPE(qkv && B > 0 && T > 0 && NH > 0 && C > 0 && C % NH == 0);
    MT_CU_CHECK_SHAPE(C / NH <= 128);
}

static std::atomic<int> attn_tc_force(-1);
static std::atomic<unsigned long> attn_tc_count[2], attn_mma_count[2];

extern "C" void mt_cuda_attention_set_tc(int mode) {
    attn_tc_force.store(mode < 0 ? -1 : mode == 2 ? 2 : mode != 0);
}

/* 0 CUDA cores, 1 tensor cores (the mma.sync kernels where they apply, else WMMA), 2 tensor cores, WMMA only */
static int attn_mode(void) {
    int force = attn_tc_force.load();
    return force >= 0 ? force : mt_cuda_attn_tc_param();
}

extern "C" int mt_cuda_attention_tc_path(int dt, int hs, int backward) {
    return attn_mode() != 0 && (dt == MT_CU_BF16 || dt == MT_CU_F16) && hs > 0 && hs % 16 == 0 &&
           hs <= (backward ? 64 : 128);
}

extern "C" unsigned long mt_cuda_attention_tc_launches(int backward) {
    return attn_tc_count[backward ? 1 : 0].load();
}

extern "C" unsigned long mt_cuda_attention_mma_launches(int backward) {
    return attn_mma_count[backward ? 1 : 0].load();
}

template <typename E>
static void attention_forward_tc(E *out, float *lse, const E *qkv, int B, int T, int C, int NH, cudaStream_t s) {
    int hs = C / NH;
    float scale2 = LOG2E / sqrtf((float)hs);
    int vec = C % 8 == 0 && hs % 8 == 0 && (uintptr_t)qkv % 16 == 0;
    ATTN_DISPATCH_HS(hs, HSM, {
        typedef tc_cfg<HSM> cfg;
        dim3 g((unsigned)((T + cfg::BQ - 1) / cfg::BQ), (unsigned)NH, (unsigned)B);
        attention_forward_tc_kernel<E, HSM><<<g, cfg::THREADS, 0, s>>>(out, lse, qkv, T, C, NH, hs, scale2, vec);
    });
    attn_tc_count[0].fetch_add(1);
}

template <typename E>
static void attention_backward_tc(E *dqkv, const E *dout, const E *qkv, const float *lse, const float *Dv, int B, int T,
                                  int C, int NH, cudaStream_t s) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    int vec = C % 8 == 0 && hs % 8 == 0 && (uintptr_t)qkv % 16 == 0 && (uintptr_t)dout % 16 == 0;
    auto launch = [&](auto hsm) {
        constexpr int HSM = decltype(hsm)::value;
        typedef tcb_cfg<HSM> cfg;
        dim3 g((unsigned)((T + cfg::ROWS - 1) / cfg::ROWS), (unsigned)NH, (unsigned)B);
        attention_backward_dkv_tc_kernel<E, HSM>
            <<<g, cfg::THREADS, 0, s>>>(dqkv, qkv, dout, lse, Dv, T, C, NH, hs, scale, vec);
        attention_backward_dq_tc_kernel<E, HSM>
            <<<g, cfg::THREADS, 0, s>>>(dqkv, qkv, dout, lse, Dv, T, C, NH, hs, scale, vec);
    };
    if (hs <= 32) {
        launch(std::integral_constant<int, 32>());
    } else {
        launch(std::integral_constant<int, 64>());
    }
    attn_tc_count[1].fetch_add(1);
}

extern "C" cudaError_t mt_cuda_attention_forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH,
                                                 int dt, void *stream) {
    attn_check(qkv, B, T, C, NH);
    MT_CU_CHECK_SHAPE(out && lse);
    int hs = C / NH;
    float scale2 = LOG2E / sqrtf((float)hs);
    cudaStream_t s = (cudaStream_t)stream;
    const void *mma_ptrs[] = {out, qkv};
    if (mt_cuda_attention_tc_path(dt, hs, 0) && attn_mode() == 1 &&
        mt_cuda_attn_mma_eligible(dt, hs, 0, C, mma_ptrs, 2)) {
        mt_cuda_attn_mma_forward(out, lse, qkv, B, T, C, NH, dt, s);
        attn_tc_count[0].fetch_add(1);
        attn_mma_count[0].fetch_add(1);
        return cudaGetLastError();
    }
    if (mt_cuda_attention_tc_path(dt, hs, 0)) {
        if (dt == MT_CU_BF16) {
            attention_forward_tc<bf16_t>((bf16_t *)out, lse, (const bf16_t *)qkv, B, T, C, NH, s);
        } else {
            attention_forward_tc<f16_t>((f16_t *)out, lse, (const f16_t *)qkv, B, T, C, NH, s);
        }
        return cudaGetLastError();
    }
    dim3 grid((unsigned)((T + 63) / 64), (unsigned)NH, (unsigned)B);
    MT_CU_DISPATCH(dt, E,
                   ATTN_DISPATCH_HS(hs, HSM,
                                    attention_forward_kernel<E, HSM><<<grid, attn_cfg<HSM>::THREADS, 0, s>>>(
                                        (E *)out, lse, (const E *)qkv, T, C, NH, hs, scale2)));
    return cudaGetLastError();
}

extern "C" size_t mt_cuda_attention_scratch_floats(int B, int T, int NH) {
    return (size_t)B * (size_t)NH * (size_t)T;
}

extern "C" cudaError_t mt_cuda_attention_backward(void *dqkv, const void *dout, const void *qkv, const void *out,
                                                  const float *lse, int B, int T, int C, int NH, int dt, float *scratch,
                                                  void *stream) {
    attn_check(qkv, B, T, C, NH);
    MT_CU_CHECK_SHAPE(dqkv && dout && out && lse && scratch);
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    cudaStream_t s = (cudaStream_t)stream;
    size_t rows = (size_t)B * NH * T;
    MT_CU_DISPATCH(dt, E,
                   attention_backward_d_kernel<E>
                   <<<mt_cu_blocks(rows, 256), 256, 0, s>>>(scratch, (const E *)dout, (const E *)out, B, T, C, NH, hs));
    const void *mma_ptrs[] = {dqkv, dout, qkv};
    if (mt_cuda_attention_tc_path(dt, hs, 1) && attn_mode() == 1 &&
        mt_cuda_attn_mma_eligible(dt, hs, 1, C, mma_ptrs, 3)) {
        mt_cuda_attn_mma_backward(dqkv, dout, qkv, lse, scratch, B, T, C, NH, dt, s);
        attn_tc_count[1].fetch_add(1);
        attn_mma_count[1].fetch_add(1);
        return cudaGetLastError();
    }
    if (mt_cuda_attention_tc_path(dt, hs, 1)) {
        if (dt == MT_CU_BF16) {
            attention_backward_tc<bf16_t>((bf16_t *)dqkv, (const bf16_t *)dout, (const bf16_t *)qkv, lse, scratch, B, T,
                                          C, NH, s);
        } else {
            attention_backward_tc<f16_t>((f16_t *)dqkv, (const f16_t *)dout, (const f16_t *)qkv, lse, scratch, B, T, C,
                                         NH, s);
        }
        return cudaGetLastError();
    }
    MT_CU_DISPATCH(dt, E, ATTN_DISPATCH_HS(hs, HSM, {
                       typedef attn_cfg<HSM> cfg;
                       dim3 g((unsigned)((T + cfg::ROWS - 1) / cfg::ROWS), (unsigned)NH, (unsigned)B);
                       attention_backward_dkv_kernel<E, HSM><<<g, cfg::THREADS, 0, s>>>(
                           (E *)dqkv, (const E *)qkv, (const E *)dout, lse, scratch, T, C, NH, hs, scale);
                       attention_backward_dq_kernel<E, HSM><<<g, cfg::THREADS, 0, s>>>(
                           (E *)dqkv, (const E *)qkv, (const E *)dout, lse, scratch, T, C, NH, hs, scale);
                   }));
    return cudaGetLastError();
}

extern "C" cudaError_t mt_cuda_attention_plain_forward(void *out, float *att, float *lse, const void *qkv, int B, int T,
                                                       int C, int NH, int dt, void *stream) {
    attn_check(qkv, B, T, C, NH);
    MT_CU_CHECK_SHAPE(out && att && lse);
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t rows = (size_t)B * NH * T;
    cudaStream_t s = (cudaStream_t)stream;
    MT_CU_DISPATCH(dt, E,
                   ATTN_DISPATCH_HS(hs, HSM,
                                    attention_plain_forward_kernel<E, HSM><<<mt_cu_blocks(rows, 128), 128, 0, s>>>(
                                        (E *)out, att, lse, (const E *)qkv, B, T, C, NH, hs, scale)));
    return cudaGetLastError();
}
