/* Causal attention on the tensor cores through mma.sync (m16n8k16, bf16/f16 inputs, f32 accumulation), in the
 * manner of FlashAttention-2: the scores, the online softmax and the probabilities stay in registers. The
 * accumulator of one m16n8 product holds, for lane (g = lane / 4, t = lane % 4), rows g and g + 8 at columns
 * 2t and 2t + 1 (PTX ISA, "Matrix Fragments for mma.m16n8k16"), which is also where the A operand of the next
 * product wants its elements: two score tiles of 8 keys become one 16-key A fragment of probabilities without
 * going through shared memory (the WMMA kernels of attention.cu must, their layout being unspecified).
 *
 * Same contract as the other kernels (attention.cu): lse in natural log, the probabilities rounded to the
 * storage type before they multiply V (and l sums them as rounded), the backward recomputing them from lse
 * with D_i = dO_i . O_i from attention_backward_d_kernel, each gradient row owned by one block (no atomics,
 * deterministic). Blocks of 4 warps own 64 rows (16 per warp) and stream tiles of 64 rows through shared
 * memory (rows padded by 8 elements: the fragment loads of the 32 lanes hit 32 banks). Head sizes 32, 64 and
 * 128 (forward) and 32 and 64 (backward), exactly; C a multiple of 8 and the tensors 16-byte aligned (the
 * tiles are copied in 16-byte vectors). attention.cu selects these kernels where they apply.
 *
 * On the device mma.sync is one PTX instruction; under the CPU emulator (tests/gpu/emu) mma16816 computes the
 * same product from the lanes' fragments with warp shuffles, so the layout bookkeeping above is what the
 * emulated tests check.
 * SPDX-License-Identifier: MIT */
#include <stdint.h>

#include "models/cuda/cuda_impl.h"

namespace {

constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
constexpr int kThreads = 128, kRows = 64, kTile = 64; /* 4 warps x 16 rows; streamed tile rows */

template <typename T> __device__ __forceinline__ uint16_t bits16(T v) {
    return *reinterpret_cast<const uint16_t *>(&v);
}
template <typename T> __device__ __forceinline__ float from_bits16(uint32_t u) {
    uint16_t x = (uint16_t)u;
    return to_f32(*reinterpret_cast<const T *>(&x));
}
/* (lo, hi) rounded to T and packed as one 32-bit fragment register (lo in the low half) */
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    return (uint32_t)bits16(from_f32<T>(lo)) | ((uint32_t)bits16(from_f32<T>(hi)) << 16);
}
/* p[0], p[1] (adjacent) as one register */
template <typename T> __device__ __forceinline__ uint32_t ld_pair(const T *p) {
    return *reinterpret_cast<const uint32_t *>(p);
}
/* p[0], p[ld] (a column pair) as one register */
template <typename T> __device__ __forceinline__ uint32_t ld_colpair(const T *p, int ld) {
    return (uint32_t)bits16(p[0]) | ((uint32_t)bits16(p[ld]) << 16);
}

/* d (16 x 8, f32) += a (16 x 16, row) b (16 x 8, col) in the mma.m16n8k16 fragment layouts. */
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
#if defined(__CUDA_ARCH__)
template <>
__device__ __forceinline__ void mma16816<bf16_t>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<f16_t>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#else
/* The emulated product: lane (g, t) needs rows g, g + 8 of a (held by lanes 4g..4g+3: registers 0/2 row g,
 * 1/3 row g + 8, k pairs 2t and 2t + 8) and columns 2t, 2t + 1 of b (held by lanes 4n..4n+3: register 0 k < 8,
 * 1 k >= 8). */
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint32_t b[2] = {b0, b1};
    for (int kp = 0; kp < 8; kp++) { /* k = 2 kp, 2 kp + 1 */
        int hi = kp >> 2, src = kp & 3;
        uint32_t r0 = __shfl_sync(0xffffffffu, a[2 * hi], g * 4 + src);
        uint32_t r1 = __shfl_sync(0xffffffffu, a[2 * hi + 1], g * 4 + src);
        uint32_t c0 = __shfl_sync(0xffffffffu, b[hi], 2 * t * 4 + src);
        uint32_t c1 = __shfl_sync(0xffffffffu, b[hi], (2 * t + 1) * 4 + src);
        float a0l = from_bits16<T>(r0), a0h = from_bits16<T>(r0 >> 16);
        float a1l = from_bits16<T>(r1), a1h = from_bits16<T>(r1 >> 16);
        float b0l = from_bits16<T>(c0), b0h = from_bits16<T>(c0 >> 16);
        float b1l = from_bits16<T>(c1), b1h = from_bits16<T>(c1 >> 16);
        d[0] += a0l * b0l + a0h * b0h;
        d[1] += a0l * b1l + a0h * b1h;
        d[2] += a1l * b0l + a1h * b0h;
        d[3] += a1l * b1l + a1h * b1h;
    }
}
#endif

/* Asynchronous 16-byte copies global -> shared (cp.async, sm_80+), src_bytes 0 = zero fill; a group is committed
 * per tile and waited for before the barrier that publishes it. The emulator copies at once. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
#if defined(__CUDA_ARCH__)
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes));
#else
    uint4 v = {0u, 0u, 0u, 0u};
    if (src_bytes) {
        v = *reinterpret_cast<const uint4 *>(src);
    }
    *reinterpret_cast<uint4 *>(dst) = v;
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
/* waits until at most N committed groups are still in flight */
template <int N> __device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

/* rows [r0, r0 + kTile) of one of q/k/v/dO (src: the head's element 0 of row 0; row stride ld) into dst (row
 * stride HS + 8), zero past T, in 16-byte vectors: plain loads and stores, or (ASYNC) cp.async copies that the
 * caller commits and waits for (rows past T zero-filled, their source clamped to a valid address) */
template <typename T, int HS, bool ASYNC = false>
__device__ __forceinline__ void load_tile(T *dst, const T *src, int r0, int T_, size_t ld) {
    constexpr int LD = HS + 8, VPR = HS / 8;
    for (int idx = threadIdx.x; idx < kTile * VPR; idx += kThreads) {
        int r = idx / VPR, c = (idx % VPR) * 8, row = r0 + r;
        const T *g = src + (size_t)min(row, T_ - 1) * ld + c;
        if (ASYNC) {
            cp_async16(dst + r * LD + c, g, row < T_ ? 16 : 0);
        } else {
            uint4 v = {0u, 0u, 0u, 0u};
            if (row < T_) {
                v = *reinterpret_cast<const uint4 *>(g);
            }
            *reinterpret_cast<uint4 *>(dst + r * LD + c) = v;
        }
    }
}

/* The K and V rows [k0, k0 + kTile) of the head (base: its q column of row 0) into Kd, Vd: one cp.async group */
template <typename T, int HS>
__device__ __forceinline__ void fetch_kv(T *Kd, T *Vd, const T *base, int k0, int T_, int C) {
    size_t C3 = 3 * (size_t)C;
    load_tile<T, HS, true>(Kd, base + C, k0, T_, C3);
    load_tile<T, HS, true>(Vd, base + 2 * (size_t)C, k0, T_, C3);
    cp_async_commit();
}

/* Before the warps use the current key tile: with `more`, first starts copying the tile at k1 into Kn, Vn (the
 * other buffers), then waits for every group but that one; else waits for all. The caller's barrier publishes. */
template <typename T, int HS>
__device__ __forceinline__ void kv_wait_prefetch(T *Kn, T *Vn, const T *base, int k1, bool more, int T_, int C) {
    if (more) {
        fetch_kv<T, HS>(Kn, Vn, base, k1, T_, C);
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
}

/* the A fragments (16 rows from row0 of a tile, HS columns) */
template <typename T, int HS>
__device__ __forceinline__ void load_a(uint32_t (&f)[HS / 16][4], const T *tile, int row0, int g, int t) {
    constexpr int LD = HS + 8;
#pragma unroll
    for (int ks = 0; ks < HS / 16; ks++) {
        const T *p = tile + (row0 + g) * LD + ks * 16 + 2 * t;
        f[ks][0] = ld_pair(p);
        f[ks][1] = ld_pair(p + 8 * LD);
        f[ks][2] = ld_pair(p + 8);
        f[ks][3] = ld_pair(p + 8 * LD + 8);
    }
}

/* Four B fragments (two n-tiles of 8 x two k halves) in one ldmatrix.x4 from a tile X (row stride LD elements,
 * 16-byte aligned rows). rows: X's rows are the n index and its columns k (the products' K^T, V^T, dO^T
 * operands): b[0], b[1] serve n rows row0..row0+7, b[2], b[3] rows row0+8..row0+15, k = col0..col0+15. trans:
 * X's rows are k and its columns n (the V, dO, Q, K operands of the P X products): b[0], b[1] serve columns
 * col0..col0+7, b[2], b[3] columns col0+8..col0+15, k = row0..row0+15. Matrix i of the instruction has its rows
 * addressed by lanes 8i..8i+7. The emulator reads what each lane receives directly. */
template <bool TRANS, typename T>
__device__ __forceinline__ void ldsm4(uint32_t (&b)[4], const T *X, int LD, int row0, int col0, int g, int t) {
#if defined(__CUDA_ARCH__)
    int lane = threadIdx.x & 31, i = lane >> 3;
    int r = row0 + (TRANS ? (i & 1) : (i >> 1)) * 8 + (lane & 7), c = col0 + (TRANS ? (i >> 1) : (i & 1)) * 8;
    unsigned addr = (unsigned)__cvta_generic_to_shared(X + r * LD + c);
    if (TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                     : "r"(addr));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                     : "r"(addr));
    }
#else
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int r = row0 + (TRANS ? (i & 1) : (i >> 1)) * 8, c = col0 + (TRANS ? (i >> 1) : (i & 1)) * 8;
        /* lane (g, t) receives row g, columns 2t, 2t + 1 of matrix i; transposed: rows 2t, 2t + 1 of column g */
        b[i] = TRANS ? ld_colpair(X + (r + 2 * t) * LD + c + g, LD) : ld_pair(X + (r + g) * LD + c + 2 * t);
    }
#endif
}

/* s (16 x kTile) = A X^T: A the warp's fragments, X the tile's kTile rows (B columns: contiguous pairs) */
template <typename T, int HS>
__device__ __forceinline__ void scores(float (&s)[kTile / 8][4], const uint32_t (&a)[HS / 16][4], const T *X, int g,
                                       int t) {
    constexpr int LD = HS + 8;
#pragma unroll
    for (int nt = 0; nt < kTile / 8; nt++) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
    }
#pragma unroll
    for (int ks = 0; ks < HS / 16; ks++) {
#pragma unroll
        for (int nt = 0; nt < kTile / 8; nt += 2) {
            uint32_t b[4];
            ldsm4<false>(b, X, LD, nt * 8, ks * 16, g, t);
            mma16816<T>(s[nt], a[ks], b[0], b[1]);
            mma16816<T>(s[nt + 1], a[ks], b[2], b[3]);
        }
    }
}

/* acc (16 x HS) += P X: P (16 x kTile) from the lanes' score-layout values, rounded to T (tiles 2kk, 2kk + 1 are
 * the A fragment of k block kk), X the tile's kTile rows of HS columns (B rows: column pairs) */
template <typename T, int HS>
__device__ __forceinline__ void accumulate(float (&acc)[HS / 8][4], const float (&p)[kTile / 8][4], const T *X, int g,
                                           int t) {
    constexpr int LD = HS + 8;
#pragma unroll
    for (int kk = 0; kk < kTile / 16; kk++) {
        uint32_t a[4] = {pack2<T>(p[2 * kk][0], p[2 * kk][1]), pack2<T>(p[2 * kk][2], p[2 * kk][3]),
                         pack2<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]), pack2<T>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int ot = 0; ot < HS / 8; ot += 2) {
            uint32_t b[4];
            ldsm4<true>(b, X, LD, kk * 16, ot * 8, g, t);
            mma16816<T>(acc[ot], a, b[0], b[1]);
            mma16816<T>(acc[ot + 1], a, b[2], b[3]);
        }
    }
}

/* dst rows row0 + g, row0 + g + 8 (those < T), columns 2t, 2t + 1 of each 8-column group, += acc */
template <typename T, int HS>
__device__ __forceinline__ void add_rows(T *dst, const float (&acc)[HS / 8][4], int row0, int T_, size_t ld, int g,
                                         int t) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
        int row = row0 + g + 8 * half;
        if (row >= T_) {
            continue;
        }
#pragma unroll
        for (int ot = 0; ot < HS / 8; ot++) {
            uint32_t *p = reinterpret_cast<uint32_t *>(dst + (size_t)row * ld + ot * 8 + 2 * t);
            uint32_t old = *p;
            *p = pack2<T>(from_bits16<T>(old) + acc[ot][2 * half], from_bits16<T>(old >> 16) + acc[ot][2 * half + 1]);
        }
    }
}

/* STAGES = 2: the next K/V tile is copied (cp.async) while the warps compute on the current one; 1 where two
 * would pass the 48 KiB of static shared memory (head size 128). */
template <int HS> struct mma_stages { static constexpr int value = HS <= 64 ? 2 : 1; };

template <typename T, int HS>
__global__ void __launch_bounds__(kThreads)
    attn_mma_forward_kernel(T *out, float *lse, const T *qkv, int T_, int C, int NH, float scale2) {
    constexpr int LD = HS + 8, NT = kTile / 8, S = mma_stages<HS>::value;
    __shared__ __align__(16) T Ks[S][kTile * LD], Vs[S][kTile * LD];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int qb = (int)(gridDim.x - 1 - blockIdx.x); /* the longest (last) query blocks start first */
    int b = blockIdx.z, h = blockIdx.y, q0 = qb * kRows, w0 = q0 + warp * 16;
    size_t C3 = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * C3 + (size_t)h * HS;
    load_tile<T, HS>(Ks[0], base, q0, T_, C3); /* Q, staged through the K buffer */
    __syncthreads();
    uint32_t qa[HS / 16][4];
    load_a<T, HS>(qa, Ks[0], warp * 16, g, t);
    __syncthreads(); /* Q is in registers before the first tile overwrites the buffer */
    float o[HS / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int ot = 0; ot < HS / 8; ot++) {
        o[ot][0] = o[ot][1] = o[ot][2] = o[ot][3] = 0.0f;
    }
    int row[2] = {w0 + g, w0 + g + 8};
    int kend = min(T_, q0 + kRows);
    fetch_kv<T, HS>(Ks[0], Vs[0], base, 0, T_, C);
    for (int k0 = 0, it = 0; k0 < kend; k0 += kTile, it++) {
        int cur = S == 2 ? it & 1 : 0, nxt = (cur + 1) % S;
        /* with two buffers the next tile is copied into the other one while this one is used */
        kv_wait_prefetch<T, HS>(Ks[nxt], Vs[nxt], base, k0 + kTile, S == 2 && k0 + kTile < kend, T_, C);
        __syncthreads();     /* this tile has landed for every thread */
        if (w0 + 15 >= k0) { /* else every row of this warp is before the tile (causal); warp-uniform */
            float s[NT][4];
            scores<T, HS>(s, qa, Ks[cur], g, t);
            /* online softmax in base 2; keys after the row or past T masked. Each row's values are spread over
             * the 4 lanes of its group: maxima reduced over them, sums kept per lane until the end */
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = k0 + nt * 8 + 2 * t + (e & 1), r = e >> 1;
                    s[nt][e] = (key <= row[r] && key < T_) ? s[nt][e] * scale2 : -INFINITY;
                    mx[r] = fmaxf(mx[r], s[nt][e]);
                }
            }
            float corr[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                float mn = fmaxf(m[r], mx[r]); /* finite: the first tile holds key 0 <= row for every row */
                corr[r] = exp2f(m[r] - mn);
                m[r] = mn;
                l[r] *= corr[r];
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = to_f32(from_f32<T>(exp2f(s[nt][e] - m[e >> 1]))); /* as the product will see it */
                    s[nt][e] = p;
                    l[e >> 1] += p;
                }
            }
#pragma unroll
            for (int ot = 0; ot < HS / 8; ot++) {
                o[ot][0] *= corr[0], o[ot][1] *= corr[0], o[ot][2] *= corr[1], o[ot][3] *= corr[1];
            }
            accumulate<T, HS>(o, s, Vs[cur], g, t); /* O += P V */
        }
        __syncthreads(); /* every warp is done with this buffer before it is refilled */
        if (S == 1 && k0 + kTile < kend) {
            fetch_kv<T, HS>(Ks[0], Vs[0], base, k0 + kTile, T_, C);
        }
    }
    T *ob = out + (size_t)b * T_ * C + (size_t)h * HS;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        if (row[r] >= T_) {
            continue;
        }
        float inv = 1.0f / l[r];
#pragma unroll
        for (int ot = 0; ot < HS / 8; ot++) {
            *reinterpret_cast<uint32_t *>(ob + (size_t)row[r] * C + ot * 8 + 2 * t) =
                pack2<T>(o[ot][2 * r] * inv, o[ot][2 * r + 1] * inv);
        }
        if (t == 0) {
            lse[((size_t)b * NH + h) * T_ + row[r]] = (m[r] + log2f(l[r])) * kLn2;
        }
    }
}

/* dK, dV of a block's 64 keys (16 per warp), over the query tiles from the block's first key on:
 *   S^T = K Q^T,  P^T = exp2(S^T scale2 - lse2_i) (j <= i < T),  dV += P^T dO,  dP^T = V dO^T,
 *   dS^T = P^T (dP^T - D_i) scale,  dK += dS^T Q. */
template <typename T, int HS>
__global__ void __launch_bounds__(kThreads) attn_mma_dkv_kernel(T *dqkv, const T *qkv, const T *dout, const float *lse,
                                                                const float *Dv, int T_, int C, int NH, float scale) {
    constexpr int LD = HS + 8, NT = kTile / 8;
    __shared__ __align__(16) T Qs[2][kTile * LD], dOs[2][kTile * LD]; /* double-buffered query tiles */
    __shared__ float Ls[2][kTile], Ds[2][kTile];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int b = blockIdx.z, h = blockIdx.y, k0 = blockIdx.x * kRows, w0 = k0 + warp * 16; /* first blocks: most work */
    size_t C3 = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * C3 + (size_t)h * HS;
    const T *dob = dout + (size_t)b * T_ * C + (size_t)h * HS;
    const float *lrow = lse + ((size_t)b * NH + h) * T_, *drow = Dv + ((size_t)b * NH + h) * T_;
    float scale2 = scale * kLog2e;
    /* the block's K and V rows, staged through the query buffers into A fragments kept for the whole kernel */
    load_tile<T, HS>(Qs[0], base + C, k0, T_, C3);
    load_tile<T, HS>(dOs[0], base + 2 * (size_t)C, k0, T_, C3);
    __syncthreads();
    uint32_t ka[HS / 16][4], va[HS / 16][4];
    load_a<T, HS>(ka, Qs[0], warp * 16, g, t);
    load_a<T, HS>(va, dOs[0], warp * 16, g, t);
    __syncthreads(); /* K, V are in registers before the first query tile overwrites the buffers */
    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int ot = 0; ot < HS / 8; ot++) {
        dk[ot][0] = dk[ot][1] = dk[ot][2] = dk[ot][3] = 0.0f;
        dv[ot][0] = dv[ot][1] = dv[ot][2] = dv[ot][3] = 0.0f;
    }
    int key[2] = {w0 + g, w0 + g + 8};
    /* a query tile: Q and dO by cp.async, lse (base 2) and D by plain loads */
    auto fetch = [&](int buf, int i0) {
        load_tile<T, HS, true>(Qs[buf], base, i0, T_, C3);
        load_tile<T, HS, true>(dOs[buf], dob, i0, T_, (size_t)C);
        cp_async_commit();
        for (int c = threadIdx.x; c < kTile; c += kThreads) {
            Ls[buf][c] = i0 + c < T_ ? lrow[i0 + c] * kLog2e : 0.0f;
            Ds[buf][c] = i0 + c < T_ ? drow[i0 + c] : 0.0f;
        }
    };
    fetch(0, k0);
    for (int i0 = k0, it = 0; i0 < T_; i0 += kTile, it++) {
        int cur = it & 1;
        if (i0 + kTile < T_) { /* the next query tile, into the other buffers, while this one is used */
            fetch(cur ^ 1, i0 + kTile);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();            /* this tile has landed for every thread */
        if (w0 <= i0 + kTile - 1) { /* else every key of this warp is after the tile's queries; warp-uniform */
            const T *Q = Qs[cur], *dO = dOs[cur];
            float s[NT][4], dp[NT][4];
            scores<T, HS>(s, ka, Q, g, t); /* S^T = K Q^T: rows keys, columns queries */
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int c = nt * 8 + 2 * t + (e & 1), q = i0 + c, j = key[e >> 1];
                    s[nt][e] = (j <= q && q < T_ && j < T_) ? exp2f(s[nt][e] * scale2 - Ls[cur][c]) : 0.0f;
                }
            }
            accumulate<T, HS>(dv, s, dO, g, t); /* dV += P^T dO */
            scores<T, HS>(dp, va, dO, g, t);    /* dP^T = V dO^T */
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int c = nt * 8 + 2 * t + (e & 1);
                    s[nt][e] = s[nt][e] * (dp[nt][e] - Ds[cur][c]) * scale;
                }
            }
            accumulate<T, HS>(dk, s, Q, g, t); /* dK += dS^T Q */
        }
        __syncthreads(); /* every warp is done with this buffer before it is refilled */
    }
    T *db = dqkv + (size_t)b * T_ * C3 + (size_t)h * HS;
    add_rows<T, HS>(db + C, dk, w0, T_, C3, g, t);
    add_rows<T, HS>(db + 2 * (size_t)C, dv, w0, T_, C3, g, t);
}

/* dQ of a block's 64 queries (16 per warp), over the key tiles up to the block's last query:
 *   S = Q K^T,  P = exp2(S scale2 - lse2_i),  dP = dO V^T,  dS = P (dP - D_i) scale,  dQ += dS K. */
template <typename T, int HS>
__global__ void __launch_bounds__(kThreads) attn_mma_dq_kernel(T *dqkv, const T *qkv, const T *dout, const float *lse,
                                                               const float *Dv, int T_, int C, int NH, float scale) {
    constexpr int LD = HS + 8, NT = kTile / 8;
    __shared__ __align__(16) T Ks[2][kTile * LD], Vs[2][kTile * LD]; /* double-buffered key tiles */
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int qb = (int)(gridDim.x - 1 - blockIdx.x); /* the longest (last) query blocks start first */
    int b = blockIdx.z, h = blockIdx.y, q0 = qb * kRows, w0 = q0 + warp * 16;
    size_t C3 = 3 * (size_t)C;
    const T *base = qkv + (size_t)b * T_ * C3 + (size_t)h * HS;
    const T *dob = dout + (size_t)b * T_ * C + (size_t)h * HS;
    float scale2 = scale * kLog2e;
    load_tile<T, HS>(Ks[0], base, q0, T_, C3);
    load_tile<T, HS>(Vs[0], dob, q0, T_, (size_t)C);
    __syncthreads();
    uint32_t qa[HS / 16][4], oa[HS / 16][4];
    load_a<T, HS>(qa, Ks[0], warp * 16, g, t);
    load_a<T, HS>(oa, Vs[0], warp * 16, g, t);
    __syncthreads(); /* Q, dO are in registers before the first key tile overwrites the buffers */
    int row[2] = {w0 + g, w0 + g + 8};
    float L2[2], Di[2], dq[HS / 8][4];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        L2[r] = row[r] < T_ ? lse[((size_t)b * NH + h) * T_ + row[r]] * kLog2e : 0.0f;
        Di[r] = row[r] < T_ ? Dv[((size_t)b * NH + h) * T_ + row[r]] : 0.0f;
    }
#pragma unroll
    for (int ot = 0; ot < HS / 8; ot++) {
        dq[ot][0] = dq[ot][1] = dq[ot][2] = dq[ot][3] = 0.0f;
    }
    int kend = min(T_, q0 + kRows);
    fetch_kv<T, HS>(Ks[0], Vs[0], base, 0, T_, C);
    for (int k0 = 0, it = 0; k0 < kend; k0 += kTile, it++) {
        int cur = it & 1; /* the next key tile is copied into the other buffers while this one is used */
        kv_wait_prefetch<T, HS>(Ks[cur ^ 1], Vs[cur ^ 1], base, k0 + kTile, k0 + kTile < kend, T_, C);
        __syncthreads();     /* this tile has landed for every thread */
        if (w0 + 15 >= k0) { /* else every row of this warp is before the tile (causal); warp-uniform */
            float s[NT][4], dp[NT][4];
            scores<T, HS>(s, qa, Ks[cur], g, t); /* S = Q K^T */
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = k0 + nt * 8 + 2 * t + (e & 1), r = e >> 1;
                    s[nt][e] = (key <= row[r] && key < T_ && row[r] < T_) ? exp2f(s[nt][e] * scale2 - L2[r]) : 0.0f;
                }
            }
            scores<T, HS>(dp, oa, Vs[cur], g, t); /* dP = dO V^T */
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[nt][e] = s[nt][e] * (dp[nt][e] - Di[e >> 1]) * scale;
                }
            }
            accumulate<T, HS>(dq, s, Ks[cur], g, t); /* dQ += dS K */
        }
        __syncthreads(); /* every warp is done with this buffer before it is refilled */
    }
    add_rows<T, HS>(dqkv + (size_t)b * T_ * C3 + (size_t)h * HS, dq, w0, T_, C3, g, t);
}

template <typename T> void forward(T *out, float *lse, const T *qkv, int B, int T_, int C, int NH, cudaStream_t s) {
    int hs = C / NH;
    float scale2 = kLog2e / sqrtf((float)hs);
    dim3 g((unsigned)((T_ + kRows - 1) / kRows), (unsigned)NH, (unsigned)B);
    if (hs == 32) {
        attn_mma_forward_kernel<T, 32><<<g, kThreads, 0, s>>>(out, lse, qkv, T_, C, NH, scale2);
    } else if (hs == 64) {
        attn_mma_forward_kernel<T, 64><<<g, kThreads, 0, s>>>(out, lse, qkv, T_, C, NH, scale2);
    } else {
        attn_mma_forward_kernel<T, 128><<<g, kThreads, 0, s>>>(out, lse, qkv, T_, C, NH, scale2);
    }
}

template <typename T>
void backward(T *dqkv, const T *dout, const T *qkv, const float *lse, const float *Dv, int B, int T_, int C, int NH,
              cudaStream_t s) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    dim3 g((unsigned)((T_ + kRows - 1) / kRows), (unsigned)NH, (unsigned)B);
    if (hs == 32) {
        attn_mma_dkv_kernel<T, 32><<<g, kThreads, 0, s>>>(dqkv, qkv, dout, lse, Dv, T_, C, NH, scale);
        attn_mma_dq_kernel<T, 32><<<g, kThreads, 0, s>>>(dqkv, qkv, dout, lse, Dv, T_, C, NH, scale);
    } else {
        attn_mma_dkv_kernel<T, 64><<<g, kThreads, 0, s>>>(dqkv, qkv, dout, lse, Dv, T_, C, NH, scale);
        attn_mma_dq_kernel<T, 64><<<g, kThreads, 0, s>>>(dqkv, qkv, dout, lse, Dv, T_, C, NH, scale);
    }
}

} // namespace

bool mt_cuda_attn_mma_eligible(int dt, int hs, int backward, int C, const void *const *ptrs, int n_ptrs) {
    return (dt == MT_CU_BF16 || dt == MT_CU_F16) && C % 8 == 0 && (hs == 32 || hs == 64 || (hs == 128 && !backward)) &&
           mt_cu_aligned16(ptrs, n_ptrs);
}

void mt_cuda_attn_mma_forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH, int dt,
                              cudaStream_t s) {
    if (dt == MT_CU_BF16) {
        forward<bf16_t>((bf16_t *)out, lse, (const bf16_t *)qkv, B, T, C, NH, s);
    } else {
        forward<f16_t>((f16_t *)out, lse, (const f16_t *)qkv, B, T, C, NH, s);
    }
}

void mt_cuda_attn_mma_backward(void *dqkv, const void *dout, const void *qkv, const float *lse, const float *Dv, int B,
                               int T, int C, int NH, int dt, cudaStream_t s) {
    if (dt == MT_CU_BF16) {
        backward<bf16_t>((bf16_t *)dqkv, (const bf16_t *)dout, (const bf16_t *)qkv, lse, Dv, B, T, C, NH, s);
    } else {
        backward<f16_t>((f16_t *)dqkv, (const f16_t *)dout, (const f16_t *)qkv, lse, Dv, B, T, C, NH, s);
    }
}
