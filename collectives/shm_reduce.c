/* The element loops of the shared-memory collectives: out = op over n input streams, in rank order,
 * accumulated in a block of 1024 elements that stays in L1 (f16/bf16 in f32, the other types in their
 * own). Written branch-free with restrict pointers so GCC vectorises every loop at -O3, the 16-bit
 * conversions included (bit-exact with mt_f16_to_f32 & co in coll_dtype.c; tests/shm checks that).
 * SPDX-License-Identifier: MIT */
#include <string.h>

#include "collectives/shm.h"

#define BLK 1024

static inline float bf16_load(uint16_t h) { return mt_bits_f32((uint32_t)h << 16); }

/* Round to nearest even; NaN stays a quiet NaN with its sign. */
static inline uint16_t bf16_store(float f) {
    uint32_t u = mt_f32_bits(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

/* Exact: normal numbers rebias, subnormals are man * 2^-24, exponent 31 is inf/NaN. */
static inline float f16_load(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t normal = (em << 13) + 0x38000000u;
    uint32_t infnan = (em << 13) | 0x7f800000u;
    uint32_t sub = mt_f32_bits((float)(int32_t)em * 5.9604644775390625e-8f);
    uint32_t r = em >= 0x7c00u ? infnan : (em < 0x400u ? sub : normal);
    return mt_bits_f32(r | sign);
}

/* Round to nearest even. Subnormal results: adding 0.5f (whose ulp is 2^-24, the f16 subnormal step)
 * lets the FPU do the rounding; normal ones round the 13 dropped mantissa bits by integer arithmetic. */
static inline uint16_t f16_store(float f) {
    uint32_t u = mt_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    uint32_t sub = mt_f32_bits(mt_bits_f32(a) + 0.5f) - 0x3f000000u;
    uint32_t n = a - 0x38000000u;
    n = (n + 0xfffu + ((n >> 13) & 1u)) >> 13;
    uint32_t r = a > 0x7f800000u ? 0x7e00u : (a >= 0x477ff000u ? 0x7c00u : (a < 0x38800000u ? sub : n));
    return (uint16_t)(sign | r);
}

float mt_shm_f16_to_f32(uint16_t h) { return f16_load(h); }
uint16_t mt_shm_f32_to_f16(float f) { return f16_store(f); }
float mt_shm_bf16_to_f32(uint16_t h) { return bf16_load(h); }
uint16_t mt_shm_f32_to_bf16(float f) { return bf16_store(f); }

/* One kernel per (type, combine): acc = in[0]; acc = combine(acc, in[r]) for r = 1..n-1; out = acc
 * (divided by div for avg: the sum rounded to T first, as coll.h specifies for f16/bf16; a no-op round
 * trip for the other types). */
#define DEF_KERNEL(NAME, T, ACC, LOAD, STORE, COMBINE)                                               \
    static void NAME(void *restrict out_, const void *const *in, int n, size_t count, int avg_div) { \
        T *restrict out = out_;                                                                      \
        ACC acc[BLK];                                                                                \
        for (size_t b = 0; b < count; b += BLK) {                                                    \
            size_t m = count - b < BLK ? count - b : BLK;                                            \
            const T *restrict a0 = (const T *)in[0] + b;                                             \
            for (size_t i = 0; i < m; i++) {                                                         \
                acc[i] = LOAD(a0[i]);                                                                \
            }                                                                                        \
            for (int r = 1; r < n; r++) {                                                            \
                const T *restrict ar = (const T *)in[r] + b;                                         \
                for (size_t i = 0; i < m; i++) {                                                     \
                    ACC x = acc[i], y = LOAD(ar[i]);                                                 \
                    acc[i] = COMBINE;                                                                \
                }                                                                                    \
            }                                                                                        \
            if (avg_div > 1) {                                                                       \
                ACC d = (ACC)avg_div;                                                                \
                for (size_t i = 0; i < m; i++) {                                                     \
                    acc[i] = (ACC)(LOAD(STORE(acc[i])) / d);                                         \
                }                                                                                    \
            }                                                                                        \
            T *restrict o = out + b;                                                                 \
            for (size_t i = 0; i < m; i++) {                                                         \
                o[i] = STORE(acc[i]);                                                                \
            }                                                                                        \
        }                                                                                            \
    }

#define ID(x) (x)
#define SUM (x + y)
#define PROD (x * y)
#define MAX (y > x ? y : x)
#define MIN (y < x ? y : x)
/* Integers wrap like MPI's: the arithmetic is done unsigned (signed overflow is undefined in C). */
#define USUM(U) ((__typeof__(x))((U)x + (U)y))
#define UPROD(U) ((__typeof__(x))((U)x * (U)y))

DEF_KERNEL(k_f32_sum, float, float, ID, ID, SUM)
DEF_KERNEL(k_f32_prod, float, float, ID, ID, PROD)
DEF_KERNEL(k_f32_max, float, float, ID, ID, MAX)
DEF_KERNEL(k_f32_min, float, float, ID, ID, MIN)
DEF_KERNEL(k_f64_sum, double, double, ID, ID, SUM)
DEF_KERNEL(k_f64_prod, double, double, ID, ID, PROD)
DEF_KERNEL(k_f64_max, double, double, ID, ID, MAX)
DEF_KERNEL(k_f64_min, double, double, ID, ID, MIN)
DEF_KERNEL(k_f16_sum, uint16_t, float, f16_load, f16_store, SUM)
DEF_KERNEL(k_f16_prod, uint16_t, float, f16_load, f16_store, PROD)
DEF_KERNEL(k_f16_max, uint16_t, float, f16_load, f16_store, MAX)
DEF_KERNEL(k_f16_min, uint16_t, float, f16_load, f16_store, MIN)
DEF_KERNEL(k_bf16_sum, uint16_t, float, bf16_load, bf16_store, SUM)
DEF_KERNEL(k_bf16_prod, uint16_t, float, bf16_load, bf16_store, PROD)
DEF_KERNEL(k_bf16_max, uint16_t, float, bf16_load, bf16_store, MAX)
DEF_KERNEL(k_bf16_min, uint16_t, float, bf16_load, bf16_store, MIN)
DEF_KERNEL(k_i32_sum, int32_t, int32_t, ID, ID, USUM(uint32_t))
DEF_KERNEL(k_i32_prod, int32_t, int32_t, ID, ID, UPROD(uint32_t))
DEF_KERNEL(k_i32_max, int32_t, int32_t, ID, ID, MAX)
DEF_KERNEL(k_i32_min, int32_t, int32_t, ID, ID, MIN)
DEF_KERNEL(k_i64_sum, int64_t, int64_t, ID, ID, USUM(uint64_t))
DEF_KERNEL(k_i64_prod, int64_t, int64_t, ID, ID, UPROD(uint64_t))
DEF_KERNEL(k_i64_max, int64_t, int64_t, ID, ID, MAX)
DEF_KERNEL(k_i64_min, int64_t, int64_t, ID, ID, MIN)
DEF_KERNEL(k_u8_sum, uint8_t, uint8_t, ID, ID, USUM(uint32_t))
DEF_KERNEL(k_u8_prod, uint8_t, uint8_t, ID, ID, UPROD(uint32_t))
DEF_KERNEL(k_u8_max, uint8_t, uint8_t, ID, ID, MAX)
DEF_KERNEL(k_u8_min, uint8_t, uint8_t, ID, ID, MIN)

typedef void (*kernel_fn)(void *restrict out, const void *const *in, int n, size_t count, int avg_div);

/* [dtype][sum, prod, max, min] */
static const kernel_fn kernels[MT_COLL_DTYPE_COUNT][4] = {
    [MT_COLL_F32] = {k_f32_sum, k_f32_prod, k_f32_max, k_f32_min},
    [MT_COLL_F64] = {k_f64_sum, k_f64_prod, k_f64_max, k_f64_min},
    [MT_COLL_F16] = {k_f16_sum, k_f16_prod, k_f16_max, k_f16_min},
    [MT_COLL_BF16] = {k_bf16_sum, k_bf16_prod, k_bf16_max, k_bf16_min},
    [MT_COLL_I32] = {k_i32_sum, k_i32_prod, k_i32_max, k_i32_min},
    [MT_COLL_I64] = {k_i64_sum, k_i64_prod, k_i64_max, k_i64_min},
    [MT_COLL_U8] = {k_u8_sum, k_u8_prod, k_u8_max, k_u8_min},
};

void mt_shm_reduce_kernel(void *restrict out, const void *const *in, int n, size_t count, mt_coll_dtype_t dtype,
                          mt_redop_t op, int div) {
    int k = 0;
    switch (op) {
    case MT_REDOP_SUM: k = 0; break;
    case MT_REDOP_AVG: k = 0; break;
    case MT_REDOP_PROD: k = 1; break;
    case MT_REDOP_MAX: k = 2; break;
    case MT_REDOP_MIN: k = 3; break;
    default: MT_ABORT("shm reduce: op %d not validated", (int)op);
    }
    MT_ASSERT((unsigned)dtype < MT_COLL_DTYPE_COUNT && n >= 1);
    kernels[dtype][k](out, in, n, count, op == MT_REDOP_AVG ? div : 1);
}
