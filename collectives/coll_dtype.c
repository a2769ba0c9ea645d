/* Element types and reductions of the communicator API: names, sizes, parsing, the f16/bf16 <-> f32
 * conversions the 16-bit reductions accumulate through, and the division that turns a sum into avg.
 * SPDX-License-Identifier: MIT */
#include <string.h>
#include <strings.h>

#include "collectives/coll_backend.h"

static const struct {
    const char *name;
    size_t size;
    const char *aliases[3];
} dtypes[MT_DTYPE_COUNT] = {
    [MT_DTYPE_F32] = {"f32", 4, {"float32", "float", "fp32"}},
    [MT_DTYPE_F64] = {"f64", 8, {"float64", "double", "fp64"}},
    [MT_DTYPE_F16] = {"f16", 2, {"float16", "half", "fp16"}},
    [MT_DTYPE_BF16] = {"bf16", 2, {"bfloat16", NULL, NULL}},
    [MT_DTYPE_I32] = {"i32", 4, {"int32", "int", NULL}},
    [MT_DTYPE_I64] = {"i64", 8, {"int64", NULL, NULL}},
    [MT_DTYPE_U8] = {"u8", 1, {"uint8", "byte", NULL}},
};

static const char *redops[MT_REDOP_COUNT] = {"sum", "avg", "max", "min", "prod"};

size_t mt_dtype_size(mt_dtype_t dtype) { return (unsigned)dtype < MT_DTYPE_COUNT ? dtypes[dtype].size : 0; }

const char *mt_dtype_name(mt_dtype_t dtype) { return (unsigned)dtype < MT_DTYPE_COUNT ? dtypes[dtype].name : "?"; }

const char *mt_redop_name(mt_redop_t op) { return (unsigned)op < MT_REDOP_COUNT ? redops[op] : "?"; }

bool mt_dtype_parse(const char *s, mt_dtype_t *out) {
    if (!s) {
        return false;
    }
    for (int d = 0; d < MT_DTYPE_COUNT; d++) {
        bool hit = !strcasecmp(s, dtypes[d].name);
        for (int a = 0; a < 3 && !hit; a++) {
            hit = dtypes[d].aliases[a] && !strcasecmp(s, dtypes[d].aliases[a]);
        }
        if (hit) {
            *out = (mt_dtype_t)d;
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

/* ---- 16-bit floats ---------------------------------------------------------------------------- */

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float mt_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t mt_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN, sign kept */
    }
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float mt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) {
        return bits_f32(sign | 0x7f800000u | (man << 13)); /* inf / NaN */
    }
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 exactly */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t mt_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return (uint16_t)(sign | 0x7e00u); /* NaN */
    }
    if (a >= 0x477ff000u) {
        return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    }
    if (a < 0x38800000u) {
        /* result is subnormal or zero: round a * 2^24 to an integer, nearest even */
        float v = bits_f32(a) * 16777216.0f; /* exact: a power-of-two scaling */
        uint32_t i = (uint32_t)v;
        float frac = v - (float)i;
        if (frac > 0.5f || (frac == 0.5f && (i & 1u))) {
            i++;
        }
        return (uint16_t)(sign | i);
    }
    /* normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even */
    uint32_t r = a - 0x38000000u; /* exponent 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

/* ---- avg = sum / n ------------------------------------------------------------------------------ */

void mt_coll_divide(void *buf, size_t count, mt_dtype_t dtype, int n) {
    if (n == 1) {
        return;
    }
    switch (dtype) {
    case MT_DTYPE_F32: {
        float *p = buf, d = (float)n;
        for (size_t i = 0; i < count; i++) {
            p[i] /= d;
        }
        break;
    }
    case MT_DTYPE_F64: {
        double *p = buf, d = (double)n;
        for (size_t i = 0; i < count; i++) {
            p[i] /= d;
        }
        break;
    }
    case MT_DTYPE_F16: {
        uint16_t *p = buf;
        for (size_t i = 0; i < count; i++) {
            p[i] = mt_f32_to_f16(mt_f16_to_f32(p[i]) / (float)n);
        }
        break;
    }
    case MT_DTYPE_BF16: {
        uint16_t *p = buf;
        for (size_t i = 0; i < count; i++) {
            p[i] = mt_f32_to_bf16(mt_bf16_to_f32(p[i]) / (float)n);
        }
        break;
    }
    case MT_DTYPE_I32: {
        int32_t *p = buf;
        for (size_t i = 0; i < count; i++) {
            p[i] /= n;
        }
        break;
    }
    case MT_DTYPE_I64: {
        int64_t *p = buf;
        for (size_t i = 0; i < count; i++) {
            p[i] /= n;
        }
        break;
    }
    case MT_DTYPE_U8: {
        uint8_t *p = buf;
        for (size_t i = 0; i < count; i++) {
            p[i] = (uint8_t)(p[i] / n);
        }
        break;
    }
    default: MT_ABORT("mt_coll_divide: dtype %d not validated", (int)dtype);
    }
}

void mt_coll_local_copy(const void *send, void *recv, size_t bytes) {
    if (send != recv && bytes > 0) {
        memmove(recv, send, bytes);
    }
}
