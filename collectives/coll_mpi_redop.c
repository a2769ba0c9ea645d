/* User-defined MPI reductions for f16 and bf16: each pairwise combine converts both operands to f32,
 * combines in f32 and rounds once to the 16-bit type (round to nearest even). Compiled with -O3 so the
 * bf16 loops vectorise: they run over every byte an all-reduce moves.
 * SPDX-License-Identifier: MIT */
#include <pthread.h>
#include <string.h>

#include "collectives/coll_mpi.h"

static inline float bf16_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Branch-free round to nearest even (NaN kept quiet) so the loop vectorises. */
static inline uint16_t f32_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

#define BF16_OP(name, expr)                                                         \
    static void name(void *in, void *inout, int *len, MPI_Datatype *dt) {           \
        const uint16_t *restrict a = in;                                            \
        uint16_t *restrict b = inout;                                               \
        int n = *len;                                                               \
        for (int i = 0; i < n; i++) {                                               \
            float x = bf16_f32(a[i]), y = bf16_f32(b[i]);                           \
            b[i] = f32_bf16(expr);                                                  \
        }                                                                           \
    }

#define F16_OP(name, expr)                                                          \
    static void name(void *in, void *inout, int *len, MPI_Datatype *dt) {           \
        const uint16_t *restrict a = in;                                            \
        uint16_t *restrict b = inout;                                               \
        int n = *len;                                                               \
        for (int i = 0; i < n; i++) {                                               \
            float x = mt_f16_to_f32(a[i]), y = mt_f16_to_f32(b[i]);                 \
            b[i] = mt_f32_to_f16(expr);                                             \
        }                                                                           \
    }

/* max/min: NaN-propagating like the other reductions would be in f32 arithmetic is not required; use
 * the C comparison (a NaN operand yields the other operand's order-dependent result). */
BF16_OP(bf16_sum, x + y)
BF16_OP(bf16_prod, x *y)
BF16_OP(bf16_max, x > y ? x : y)
BF16_OP(bf16_min, x < y ? x : y)
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

MPI_Op mt_coll_mpi_op16(mt_dtype_t dtype, mt_redop_t op) { return ops16[dtype == MT_DTYPE_BF16][op]; }
