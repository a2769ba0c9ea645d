/* Shared helpers of the shared-memory collective tests: deterministic per-rank inputs in any dtype and
 * a scalar reference reduction written independently of collectives/shm_reduce.c (rank order 0..n-1,
 * f16/bf16 accumulated in f32 and rounded once, integers wrapping, avg = the sum rounded to the dtype / n).
 * SPDX-License-Identifier: MIT */
#ifndef MT_SHM_TESTLIB_H
#define MT_SHM_TESTLIB_H

#include <string.h>

#include "collectives/coll.h"

static inline uint64_t tl_hash(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Element i of rank r's input for op (seed separates calls). Floats: non-integers in [-4, 4) (prod: in
 * [0.75, 1.25)), stored rounded to the dtype; integers: [-1000, 1000] (prod: [-2, 2]); u8: any byte. */
static inline void tl_fill(void *buf, mt_coll_dtype_t d, mt_redop_t op, int r, uint64_t seed, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint64_t h = tl_hash(seed * 0x9e3779b97f4a7c15ull + (uint64_t)r * 0x100000001b3ull + i);
        double f = op == MT_REDOP_PROD ? 0.75 + (double)(h % 10007) / 20014.0
                                       : ((double)(h % 20011) - 10005.0) / 2501.0;
        int64_t k = op == MT_REDOP_PROD ? (int64_t)(h % 5) - 2 : (int64_t)(h % 2001) - 1000;
        switch (d) {
        case MT_COLL_F32: ((float *)buf)[i] = (float)f; break;
        case MT_COLL_F64: ((double *)buf)[i] = f; break;
        case MT_COLL_F16: ((uint16_t *)buf)[i] = mt_f32_to_f16((float)f); break;
        case MT_COLL_BF16: ((uint16_t *)buf)[i] = mt_f32_to_bf16((float)f); break;
        case MT_COLL_I32: ((int32_t *)buf)[i] = (int32_t)k; break;
        case MT_COLL_I64: ((int64_t *)buf)[i] = k * 1000003; break;
        default: ((uint8_t *)buf)[i] = (uint8_t)(h >> 8); break;
        }
    }
}

#define TL_COMB(acc, v, op)                                         \
    do {                                                            \
        switch (op) {                                               \
        case MT_REDOP_MAX: acc = (v) > acc ? (v) : acc; break;      \
        case MT_REDOP_MIN: acc = (v) < acc ? (v) : acc; break;      \
        case MT_REDOP_PROD: acc = acc * (v); break;                 \
        default: acc = acc + (v); break;                            \
        }                                                           \
    } while (0)

/* out[i] = reduction over ranks 0..n-1 of in[r][i]. */
static inline void tl_reference(void *out, const void *const *in, int n, size_t count, mt_coll_dtype_t d,
                                mt_redop_t op) {
    for (size_t i = 0; i < count; i++) {
        switch (d) {
        case MT_COLL_F32: {
            float acc = ((const float *)in[0])[i];
            for (int r = 1; r < n; r++) TL_COMB(acc, ((const float *)in[r])[i], op);
            ((float *)out)[i] = op == MT_REDOP_AVG ? acc / (float)n : acc;
            break;
        }
        case MT_COLL_F64: {
            double acc = ((const double *)in[0])[i];
            for (int r = 1; r < n; r++) TL_COMB(acc, ((const double *)in[r])[i], op);
            ((double *)out)[i] = op == MT_REDOP_AVG ? acc / (double)n : acc;
            break;
        }
        case MT_COLL_F16:
        case MT_COLL_BF16: {
            bool h = d == MT_COLL_F16;
#define TL_LD(p) (h ? mt_f16_to_f32(p) : mt_bf16_to_f32(p))
            float acc = TL_LD(((const uint16_t *)in[0])[i]);
            for (int r = 1; r < n; r++) TL_COMB(acc, TL_LD(((const uint16_t *)in[r])[i]), op);
#undef TL_LD
            if (op == MT_REDOP_AVG) { /* the sum rounded to 16 bits, then divided (coll.h) */
                acc = h ? mt_f16_to_f32(mt_f32_to_f16(acc)) / (float)n : mt_bf16_to_f32(mt_f32_to_bf16(acc)) / (float)n;
            }
            ((uint16_t *)out)[i] = h ? mt_f32_to_f16(acc) : mt_f32_to_bf16(acc);
            break;
        }
        case MT_COLL_I32: {
            uint32_t acc = (uint32_t)((const int32_t *)in[0])[i];
            for (int r = 1; r < n; r++) {
                int32_t v = ((const int32_t *)in[r])[i];
                if (op == MT_REDOP_MAX || op == MT_REDOP_MIN) {
                    int32_t a = (int32_t)acc;
                    TL_COMB(a, v, op);
                    acc = (uint32_t)a;
                } else {
                    TL_COMB(acc, (uint32_t)v, op);
                }
            }
            ((int32_t *)out)[i] = op == MT_REDOP_AVG ? (int32_t)acc / n : (int32_t)acc;
            break;
        }
        case MT_COLL_I64: {
            uint64_t acc = (uint64_t)((const int64_t *)in[0])[i];
            for (int r = 1; r < n; r++) {
                int64_t v = ((const int64_t *)in[r])[i];
                if (op == MT_REDOP_MAX || op == MT_REDOP_MIN) {
                    int64_t a = (int64_t)acc;
                    TL_COMB(a, v, op);
                    acc = (uint64_t)a;
                } else {
                    TL_COMB(acc, (uint64_t)v, op);
                }
            }
            ((int64_t *)out)[i] = op == MT_REDOP_AVG ? (int64_t)acc / n : (int64_t)acc;
            break;
        }
        default: {
            uint8_t acc = ((const uint8_t *)in[0])[i];
            for (int r = 1; r < n; r++) {
                uint8_t v = ((const uint8_t *)in[r])[i];
                TL_COMB(acc, v, op);
            }
            ((uint8_t *)out)[i] = op == MT_REDOP_AVG ? (uint8_t)(acc / n) : acc;
            break;
        }
        }
    }
}

#endif
