/* User-defined MPI reductions for f16 and bf16: each pairwise combine converts both operands to f32,
 * combines in f32 and rounds once to the 16-bit type (round to nearest even). Compiled with -O3 and cloned
 * per vector ISA so the bf16 loops vectorise: they run over every byte an all-reduce moves.
 * SPDX-License-Identifier: MIT */
#include <pthread.h>
#include <string.h>

#include "collectives/coll_mpi.h"

/* f32 -> bf16 in the upper 16 bits (lower 16 zero): round to nearest even, NaN kept quiet. Branch-free
 * so the loops vectorise. */
static inline uint32_t round_hi(float f) {
    uint32_t u = mt_f32_bits(f);
    uint32_t r = u + 0x7fffu + ((u >> 16) & 1u);
    return ((u & 0x7fffffffu) > 0x7f800000u ? (u | 0x400000u) : r) & 0xffff0000u;
}

/* One build runs everywhere, yet uses AVX-512/AVX2 where the CPU has them: GCC/clang pick the clone at
 * load time (ifunc). */
#if defined(__x86_64__) && defined(__GNUC__)
#define MT_VEC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MT_VEC_CLONES
#endif

#define OP_SUM(x, y) ((x) + (y))
#define OP_PROD(x, y) ((x) * (y))
#define OP_MAX(x, y) ((x) > (y) ? (x) : (y))
#define OP_MIN(x, y) ((x) < (y) ? (x) : (y))

/* bf16 elements two at a time in a 32-bit word: the upper one is an f32 once the lower half is masked
 * off, the lower one once shifted up; no widening or narrowing shuffles, so a 512-bit vector combines 32
 * elements. This runs about 3-4x faster than element-wise conversion (docs/PERFORMANCE.md). */
#define BF16_OP(name, OP)                                                                                              \
    MT_VEC_CLONES static void name(void *in, void *inout, int *len, MPI_Datatype *dt) {                                \
        const unsigned char *restrict a = in;                                                                          \
        unsigned char *restrict b = inout;                                                                             \
        int n = *len, pairs = n / 2;                                                                                   \
        for (int i = 0; i < pairs; i++) {                                                                              \
            uint32_t x, y;                                                                                             \
            memcpy(&x, a + 4 * (size_t)i, 4);                                                                          \
            memcpy(&y, b + 4 * (size_t)i, 4);                                                                          \
            uint32_t hi = round_hi(OP(mt_bits_f32(x & 0xffff0000u), mt_bits_f32(y & 0xffff0000u)));                    \
            uint32_t lo = round_hi(OP(mt_bits_f32(x << 16), mt_bits_f32(y << 16)));                                    \
            uint32_t r = hi | (lo >> 16);                                                                              \
            memcpy(b + 4 * (size_t)i, &r, 4);                                                                          \
        }                                                                                                              \
        if (n & 1) {                                                                                                   \
            uint16_t x, y;                                                                                             \
            memcpy(&x, a + 4 * (size_t)pairs, 2);                                                                      \
            memcpy(&y, b + 4 * (size_t)pairs, 2);                                                                      \
            uint32_t w = round_hi(OP(mt_bits_f32((uint32_t)x << 16), mt_bits_f32((uint32_t)y << 16)));                 \
            uint16_t r = (uint16_t)(w >> 16);                                                                          \
            memcpy(b + 4 * (size_t)pairs, &r, 2);                                                                      \
        }                                                                                                              \
    }

#define F16_OP(name, expr)                                                                                             \
    static void name(void *in, void *inout, int *len, MPI_Datatype *dt) {                                              \
        const uint16_t *restrict a = in;                                                                               \
        uint16_t *restrict b = inout;                                                                                  \
        int n = *len;                                                                                                  \
        for (int i = 0; i < n; i++) {                                                                                  \
            float x = mt_f16_to_f32(a[i]), y = mt_f16_to_f32(b[i]);                                                    \
            b[i] = mt_f32_to_f16(expr);                                                                                \
        }                                                                                                              \
    }

/* max/min use the C comparison, as MPI's built-in MPI_MAX/MPI_MIN on floats do (NaN handling is
 * order-dependent there too). */
BF16_OP(bf16_sum, OP_SUM)
BF16_OP(bf16_prod, OP_PROD)
BF16_OP(bf16_max, OP_MAX)
BF16_OP(bf16_min, OP_MIN)
F16_OP(f16_sum, x + y)
F16_OP(f16_prod, x *y)
F16_OP(f16_max, x > y ? x : y)
F16_OP(f16_min, x < y ? x : y)

static MPI_Op ops16[2][MT_REDOP_COUNT];
static pthread_once_t ops_once = PTHREAD_ONCE_INIT;
static int ops_rc = MPI_SUCCESS;

static void create_ops(void) {
    MPI_User_function *fns[2][MT_REDOP_COUNT] = {
        {f16_sum, f16_sum, f16_max, f16_min, f16_prod},
        {bf16_sum, bf16_sum, bf16_max, bf16_min, bf16_prod},
    };
    for (int t = 0; t < 2; t++) {
        for (int o = 0; o < MT_REDOP_COUNT; o++) {
            int rc = MPI_Op_create(fns[t][o], 1, &ops16[t][o]);
            if (rc != MPI_SUCCESS) {
                ops_rc = rc;
            }
        }
    }
}

int mt_coll_mpi_redop_init(void) {
    pthread_once(&ops_once, create_ops);
    return ops_rc;
}

MPI_Op mt_coll_mpi_op16(mt_coll_dtype_t dtype, mt_redop_t op) {
    return ops16[dtype == MT_COLL_BF16][op];
}
