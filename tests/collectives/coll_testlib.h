/* Shared helpers of the collectives tests: element get/set in any dtype through double (the test values
 * are small integers, exact in every dtype), and the expected result of each reduction.
 * SPDX-License-Identifier: MIT */
#ifndef MT_COLL_TESTLIB_H
#define MT_COLL_TESTLIB_H

#include <string.h>

#include "collectives/coll.h"

static inline void tl_set(void *buf, mt_coll_dtype_t d, size_t i, double v) {
    switch (d) {
    case MT_COLL_F32:
        ((float *)buf)[i] = (float)v;
        break;
    case MT_COLL_F64:
        ((double *)buf)[i] = v;
        break;
    case MT_COLL_F16:
        ((uint16_t *)buf)[i] = mt_f32_to_f16((float)v);
        break;
    case MT_COLL_BF16:
        ((uint16_t *)buf)[i] = mt_f32_to_bf16((float)v);
        break;
    case MT_COLL_I32:
        ((int32_t *)buf)[i] = (int32_t)v;
        break;
    case MT_COLL_I64:
        ((int64_t *)buf)[i] = (int64_t)v;
        break;
    default:
        ((uint8_t *)buf)[i] = (uint8_t)v;
        break;
    }
}

static inline double tl_get(const void *buf, mt_coll_dtype_t d, size_t i) {
    switch (d) {
    case MT_COLL_F32:
        return ((const float *)buf)[i];
    case MT_COLL_F64:
        return ((const double *)buf)[i];
    case MT_COLL_F16:
        return mt_f16_to_f32(((const uint16_t *)buf)[i]);
    case MT_COLL_BF16:
        return mt_bf16_to_f32(((const uint16_t *)buf)[i]);
    case MT_COLL_I32:
        return ((const int32_t *)buf)[i];
    case MT_COLL_I64:
        return (double)((const int64_t *)buf)[i];
    default:
        return ((const uint8_t *)buf)[i];
    }
}

static inline bool tl_signed(mt_coll_dtype_t d) {
    return d != MT_COLL_U8;
}

/* The value rank r contributes at index i for reduction op: small integers, negative ones for signed
 * types (so max/min see signs), only 1 and 2 for prod (so products of 4 ranks stay exact in bf16/u8). */
static inline double tl_val(int r, size_t i, mt_coll_dtype_t d, mt_redop_t op) {
    if (op == MT_REDOP_PROD) {
        return ((size_t)r + i) % 3 == 0 ? 2.0 : 1.0;
    }
    double v = (double)(((size_t)r * 3 + i * 5) % 11);
    return tl_signed(d) ? v - 4.0 : v;
}

/* Expected reduction over n ranks, rounded as the dtype's accumulation type would. */
static inline double tl_expect(int n, size_t i, mt_coll_dtype_t d, mt_redop_t op) {
    double acc = tl_val(0, i, d, op);
    for (int r = 1; r < n; r++) {
        double v = tl_val(r, i, d, op);
        switch (op) {
        case MT_REDOP_MAX:
            acc = v > acc ? v : acc;
            break;
        case MT_REDOP_MIN:
            acc = v < acc ? v : acc;
            break;
        case MT_REDOP_PROD:
            acc *= v;
            break;
        default:
            acc += v;
            break;
        }
    }
    if (op != MT_REDOP_AVG) {
        return acc;
    }
    switch (d) {
    case MT_COLL_F32:
        return (float)acc / (float)n;
    case MT_COLL_F64:
        return acc / n;
    case MT_COLL_F16:
        return mt_f16_to_f32(mt_f32_to_f16((float)acc / (float)n));
    case MT_COLL_BF16:
        return mt_bf16_to_f32(mt_f32_to_bf16((float)acc / (float)n));
    case MT_COLL_U8:
        return (double)((uint8_t)acc / n);
    default:
        return (double)((int64_t)acc / n);
    }
}

#endif
