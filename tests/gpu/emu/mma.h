/* CPU emulation of the CUDA C++ warp matrix API (nvcuda::wmma) subset the kernels of models/cuda use: 16x16x16
 * fragments of __nv_bfloat16 / __half (matrix_a, matrix_b; row_major or col_major) and float accumulators,
 * fill_fragment, load_matrix_sync, store_matrix_sync (mem_row_major / mem_col_major) and mma_sync.
 * On a GPU a fragment is spread over the 32 lanes of a warp in an unspecified layout. Here EVERY lane holds
 * the whole 16x16 tile, in row-major order of the tile (x[r * cols + c]), and computes the whole product
 * itself (products and sums in f32, as the tensor cores' f32 accumulation). Element-wise use of
 * frag.x[i] over frag.num_elements is therefore consistent across lanes, and kernels that depend on the
 * hardware layout would compute wrong results here, which is what the tests are for. The collectives check
 * their warp-collective contract: store_matrix_sync waits for all 32 lanes of the warp (a lane that does not
 * call it leaves the block deadlocked, which the emulator reports), lane 0 writes the tile, and the warp
 * synchronises again before anyone continues, so the stores are race-free. Test-only.
 * SPDX-License-Identifier: MIT */
#ifndef MT_EMU_MMA_H
#define MT_EMU_MMA_H

#include <string.h>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace emu {
static inline float to_f(float v) { return v; }
static inline float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
static inline float to_f(__half v) { return __half2float(v); }
template <typename Use, int M, int N, int K> struct shape;
template <int M, int N, int K> struct shape<matrix_a, M, N, K> {
    static constexpr int rows = M, cols = K;
};
template <int M, int N, int K> struct shape<matrix_b, M, N, K> {
    static constexpr int rows = K, cols = N;
};
template <int M, int N, int K> struct shape<accumulator, M, N, K> {
    static constexpr int rows = M, cols = N;
};
template <typename L> struct is_col {
    static constexpr bool value = false;
};
template <> struct is_col<col_major> {
    static constexpr bool value = true;
};
/* Lane of the calling thread within its warp (threads numbered x fastest, as on the device). */
static inline unsigned lane() {
    return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) & 31u;
}
} // namespace emu

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulated wmma has the 16x16x16 shape only");
    static constexpr int rows = emu::shape<Use, M, N, K>::rows, cols = emu::shape<Use, M, N, K>::cols;
    enum { num_elements = rows * cols };
    typedef T element_type;
    T x[num_elements];
};

template <typename Use, int M, int N, int K, typename T, typename Layout>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout> &f, const T &v) {
    for (int i = 0; i < f.num_elements; i++) {
        f.x[i] = v;
    }
}

/* matrix_a / matrix_b: the memory layout is the fragment's (row_major: element (r, c) at p[r * ldm + c];
 * col_major: at p[c * ldm + r]). */
template <typename Use, int M, int N, int K, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout> &f, const T *p, unsigned ldm) {
    typedef fragment<Use, M, N, K, T, Layout> F;
    for (int r = 0; r < F::rows; r++) {
        for (int c = 0; c < F::cols; c++) {
            f.x[r * F::cols + c] = emu::is_col<Layout>::value ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
        }
    }
}

template <int M, int N, int K>
inline void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, const float *p, unsigned ldm, layout_t l) {
    for (int r = 0; r < M; r++) {
        for (int c = 0; c < N; c++) {
            f.x[r * N + c] = l == mem_col_major ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
        }
    }
}

template <int M, int N, int K>
inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &f, unsigned ldm, layout_t l) {
    __syncwarp();
    if (emu::lane() == 0) {
        for (int r = 0; r < M; r++) {
            for (int c = 0; c < N; c++) {
                (l == mem_col_major ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c]) = f.x[r * N + c];
            }
        }
    }
    __syncwarp();
}

namespace emu {
/* The last products one instantiation of mma_sync computed, with their operands: the lanes of a warp run one
 * after another, each through the same sequence of products up to its next warp synchronisation, so lanes 1-31
 * of a correct kernel find lane 0's (a lane whose fragments differ in any bit computes its own). */
template <int M, int N, int K, typename T> struct mma_memo {
    enum { SLOTS = 16 };
    struct entry {
        T a[M * K], b[K * N];
        float c[M * N], d[M * N];
    };
    entry e[SLOTS];
    int n = 0, next = 0;
};
} // namespace emu

/* d = a b + c (d may be c). */
template <int M, int N, int K, typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, M, N, K, float> &d, const fragment<matrix_a, M, N, K, T, LA> &a,
                     const fragment<matrix_b, M, N, K, T, LB> &b, const fragment<accumulator, M, N, K, float> &c) {
    static thread_local emu::mma_memo<M, N, K, T> memo; /* per instantiation, so per layout pair */
    for (int i = 0; i < memo.n; i++) {
        const typename emu::mma_memo<M, N, K, T>::entry &m = memo.e[i];
        if (!memcmp(m.a, a.x, sizeof(m.a)) && !memcmp(m.b, b.x, sizeof(m.b)) && !memcmp(m.c, c.x, sizeof(m.c))) {
            memcpy(d.x, m.d, sizeof(m.d));
            return;
        }
    }
    float bf[K * N];
    for (int i = 0; i < K * N; i++) {
        bf[i] = emu::to_f(b.x[i]);
    }
    float out[M * N];
    for (int r = 0; r < M; r++) {
        float ar[K];
        for (int k = 0; k < K; k++) {
            ar[k] = emu::to_f(a.x[r * K + k]);
        }
        for (int n = 0; n < N; n++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++) {
                s += ar[k] * bf[k * N + n];
            }
            out[r * N + n] = c.x[r * N + n] + s;
        }
    }
    typename emu::mma_memo<M, N, K, T>::entry &m = memo.e[memo.next];
    memcpy(m.a, a.x, sizeof(m.a));
    memcpy(m.b, b.x, sizeof(m.b));
    memcpy(m.c, c.x, sizeof(m.c));
    memcpy(m.d, out, sizeof(m.d));
    memo.next = (memo.next + 1) % memo.SLOTS;
    memo.n = memo.n < memo.SLOTS ? memo.n + 1 : memo.n;
    for (int i = 0; i < M * N; i++) {
        d.x[i] = out[i];
    }
}

} // namespace wmma
} // namespace nvcuda

#endif
