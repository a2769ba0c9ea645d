/* Element types and reductions of the communicator API: names, sizes, parsing, and the division that
 * turns a sum into avg (f16/bf16 through the f32 conversions of runtime/tensor.h).
 * SPDX-License-Identifier: MIT */
#include <string.h>
#include <strings.h>

#include "collectives/coll_backend.h"

static const struct {
    const char *name;
    size_t size;
    const char *aliases[3];
} dtypes[MT_COLL_DTYPE_COUNT] = {
    [MT_COLL_F32] = {"f32", 4, {"float32", "float", "fp32"}}, [MT_COLL_F64] = {"f64", 8, {"float64", "double", "fp64"}},
    [MT_COLL_F16] = {"f16", 2, {"float16", "half", "fp16"}},  [MT_COLL_BF16] = {"bf16", 2, {"bfloat16", NULL, NULL}},
    [MT_COLL_I32] = {"i32", 4, {"int32", "int", NULL}},       [MT_COLL_I64] = {"i64", 8, {"int64", NULL, NULL}},
    [MT_COLL_U8] = {"u8", 1, {"uint8", "byte", NULL}},
};

static const char *redops[MT_REDOP_COUNT] = {"sum", "avg", "max", "min", "prod"};

size_t mt_coll_dtype_size(mt_coll_dtype_t dtype) {
    return (unsigned)dtype < MT_COLL_DTYPE_COUNT ? dtypes[dtype].size : 0;
}

const char *mt_coll_dtype_name(mt_coll_dtype_t dtype) {
    return (unsigned)dtype < MT_COLL_DTYPE_COUNT ? dtypes[dtype].name : "?";
}

const char *mt_redop_name(mt_redop_t op) {
    return (unsigned)op < MT_REDOP_COUNT ? redops[op] : "?";
}

bool mt_coll_dtype_parse(const char *s, mt_coll_dtype_t *out) {
    if (!s) {
        return false;
    }
    for (int d = 0; d < MT_COLL_DTYPE_COUNT; d++) {
        bool hit = !strcasecmp(s, dtypes[d].name);
        for (int a = 0; a < 3 && !hit; a++) {
            hit = dtypes[d].aliases[a] && !strcasecmp(s, dtypes[d].aliases[a]);
        }
        if (hit) {
            *out = (mt_coll_dtype_t)d;
            return true;
        }
    }
    return false;
}

bool mt_redop_parse(const char *s, mt_redop_t *out) {
    for (int o = 0; s && o < MT_REDOP_COUNT; o++) {
        if (!strcasecmp(s, redops[o])) {
            *out = (mt_redop_t)o;
            return true;
        }
    }
    return false;
}

/* ---- single elements as double ------------------------------------------------------------------ */

double mt_coll_elem_get(const void *buf, mt_coll_dtype_t dtype, size_t i) {
    switch (dtype) {
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
    case MT_COLL_U8:
        return ((const uint8_t *)buf)[i];
    default:
        MT_ABORT("mt_coll_elem_get: dtype %d not validated", (int)dtype);
    }
}

void mt_coll_elem_set(void *buf, mt_coll_dtype_t dtype, size_t i, double v) {
    switch (dtype) {
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
    case MT_COLL_U8:
        ((uint8_t *)buf)[i] = (uint8_t)v;
        break;
    default:
        MT_ABORT("mt_coll_elem_set: dtype %d not validated", (int)dtype);
    }
}

double mt_redop_apply(mt_redop_t op, double acc, double v) {
    switch (op) {
    case MT_REDOP_MAX:
        return v > acc ? v : acc;
    case MT_REDOP_MIN:
        return v < acc ? v : acc;
    case MT_REDOP_PROD:
        return acc * v;
    default:
        return acc + v;
    }
}

/* ---- avg = sum / n ------------------------------------------------------------------------------ */

void mt_coll_divide(void *buf, size_t count, mt_coll_dtype_t dtype, int n) {
    if (n == 1) {
        return;
    }
    switch (dtype) {
    case MT_COLL_F32: {
        float *p = buf, d = (float)n;
        for (size_t i = 0; i < count; i++) {
            p[i] /= d;
        }
        break;
    }
    case MT_COLL_F64: {
        double *p = buf, d = (double)n;
        for (size_t i = 0; i < count; i++) {
            p[i] /= d;
        }
        break;
    }
    case MT_COLL_F16: {
        uint16_t *p = buf;
        for (size_t i = 0; i < count; i++) {
            p[i] = mt_f32_to_f16(mt_f16_to_f32(p[i]) / (float)n);
        }
        break;
    }
    case MT_COLL_BF16: {
        uint16_t *p = buf;
        for (size_t i = 0; i < count; i++) {
            p[i] = mt_f32_to_bf16(mt_bf16_to_f32(p[i]) / (float)n);
        }
        break;
    }
    case MT_COLL_I32: {
        int32_t *p = buf;
        for (size_t i = 0; i < count; i++) {
            p[i] /= n;
        }
        break;
    }
    case MT_COLL_I64: {
        int64_t *p = buf;
        for (size_t i = 0; i < count; i++) {
            p[i] /= n;
        }
        break;
    }
    case MT_COLL_U8: {
        uint8_t *p = buf;
        for (size_t i = 0; i < count; i++) {
            p[i] = (uint8_t)(p[i] / n);
        }
        break;
    }
    default:
        MT_ABORT("mt_coll_divide: dtype %d not validated", (int)dtype);
    }
}

void mt_coll_local_copy(const void *send, void *recv, size_t bytes) {
    if (send != recv && bytes > 0) {
        memmove(recv, send, bytes);
    }
}
