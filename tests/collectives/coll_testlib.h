/* Shared helpers of the collectives tests: the values each rank contributes (small integers, exact in
 * every dtype; read and written with mt_coll_elem_get/set of coll.h) and the expected result of each
 * reduction.
 * SPDX-License-Identifier: MIT */
#ifndef MT_COLL_TESTLIB_H
#define MT_COLL_TESTLIB_H

#include <string.h>

#include "collectives/coll.h"

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
        acc = mt_redop_apply(op, acc, tl_val(r, i, d, op));
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
