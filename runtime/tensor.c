/* Tensor storage through the accounted allocators (host: runtime/alloc.h; device: the caching allocator of
 * runtime/cuda_alloc.h), and the float format conversions.
 * SPDX-License-Identifier: MIT */
#include "tensor.h"

#include <math.h>
#include <string.h>

#include "runtime/cuda_alloc.h"

size_t mt_dtype_size(mt_dtype_t dt) {
    return dt == MT_F32 ? 4 : 2;
}

const char *mt_dtype_name(mt_dtype_t dt) {
    static const char *names[] = {"f32", "bf16", "f16"};
    return (unsigned)dt < MT_DTYPE_COUNT ? names[dt] : "?";
}

int64_t mt_tensor_numel(const mt_tensor_t *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        n *= t->shape[i];
    }
    return n;
}

size_t mt_tensor_bytes(const mt_tensor_t *t) {
    return (size_t)mt_tensor_numel(t) * mt_dtype_size(t->dtype);
}

static mt_status_t check_shape(mt_dtype_t dt, int ndim, const int64_t *shape) {
    if ((unsigned)dt >= MT_DTYPE_COUNT) {
        return mt_error(MT_ERR_INVALID_ARG, "tensor: unknown dtype %d", (int)dt);
    }
    if (ndim < 0 || ndim > MT_TENSOR_MAX_DIM) {
        return mt_error(MT_ERR_INVALID_ARG, "tensor: ndim %d not in [0, %d]", ndim, MT_TENSOR_MAX_DIM);
    }
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            return mt_error(MT_ERR_INVALID_ARG, "tensor: dimension %d is negative (%lld)", i, (long long)shape[i]);
        }
        if (shape[i] > 0 && n > INT64_MAX / 4 / shape[i]) {
            return mt_error(MT_ERR_INVALID_ARG, "tensor: shape overflows at dimension %d", i);
        }
        n *= shape[i];
    }
    return MT_OK;
}

mt_tensor_t mt_tensor_view(void *data, mt_dtype_t dt, mt_device_t dev, int ndim, const int64_t *shape) {
    mt_tensor_t t;
    memset(&t, 0, sizeof(t));
    t.dtype = dt;
    t.device = dev;
    t.ndim = ndim;
    for (int i = 0; i < ndim && i < MT_TENSOR_MAX_DIM; i++) {
        t.shape[i] = shape[i];
    }
    t.cat = MT_MEM_OTHER;
    t.data = data;
    return t;
}

mt_status_t mt_tensor_alloc(mt_tensor_t *t, mt_dtype_t dt, mt_device_t dev, int ndim, const int64_t *shape,
                            mt_mem_cat_t cat, const char *owner) {
    memset(t, 0, sizeof(*t));
    MT_CHECK(check_shape(dt, ndim, shape));
    mt_tensor_t v = mt_tensor_view(NULL, dt, dev, ndim, shape);
    v.cat = cat;
    size_t bytes = mt_tensor_bytes(&v);
    if (dev == MT_DEV_CPU) {
        v.data = mt_alloc(bytes, cat, owner);
        if (!v.data) {
            return mt_error(MT_ERR_OOM, "tensor: cannot allocate %zu bytes of %s for %s", bytes, mt_mem_cat_name(cat),
                            owner ? owner : "?");
        }
    } else {
        /* the caching device allocator: accounted under cat, for use on the default stream (the tensor has no
         * stream of its own); a CPU-only build refuses with MT_ERR_INVALID_USAGE */
        mt_status_t st = mt_dev_malloc(&v.data, bytes, cat, owner ? owner : "tensor", NULL);
        if (st != MT_OK) {
            return mt_error(st, "tensor: %zu bytes of %s for %s on the device: %s", bytes, mt_mem_cat_name(cat),
                            owner ? owner : "?", mt_last_error_msg());
        }
    }
    v.owned = true;
    *t = v;
    return MT_OK;
}

void mt_tensor_free(mt_tensor_t *t) {
    if (t->owned && t->data) {
        if (t->device == MT_DEV_CPU) {
            mt_free(t->data);
        } else {
            mt_dev_free(t->data); /* back to the allocator's cache, its accounting released */
        }
    }
    memset(t, 0, sizeof(*t));
}

uint16_t mt_f32_to_bf16(float f) {
    return mt_bf16_round(f);
}

float mt_bf16_to_f32(uint16_t h) {
    return mt_bits_f32((uint32_t)h << 16);
}

uint16_t mt_f32_to_f16(float f) {
    uint32_t u = mt_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) {
        return (uint16_t)(sign | 0x7e00u);
    }
    if (abs >= 0x477ff000u) { /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (abs < 0x38800000u) { /* below the smallest normal 2^-14: subnormal or zero */
        float a = mt_bits_f32(abs);
        /* value in units of 2^-24, rounded to nearest even by the FPU */
        float q = nearbyintf(a * 16777216.0f);
        return (uint16_t)(sign | (uint32_t)q);
    }
    uint32_t e = ((abs >> 23) - 127 + 15) << 10;
    uint32_t mant = abs & 0x7fffffu;
    uint32_t h = e | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) {
        h++; /* may carry into the exponent, which is the correct rounding */
    }
    return (uint16_t)(sign | h);
}

float mt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (e == 0) {
        float v = (float)mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (e == 31) {
        return mt_bits_f32(sign | 0x7f800000u | (mant << 13));
    }
    return mt_bits_f32(sign | ((e - 15 + 127) << 23) | (mant << 13));
}

static float load(const void *src, mt_dtype_t dt, size_t i) {
    switch (dt) {
    case MT_BF16:
        return mt_bf16_to_f32(((const uint16_t *)src)[i]);
    case MT_F16:
        return mt_f16_to_f32(((const uint16_t *)src)[i]);
    default:
        return ((const float *)src)[i];
    }
}

void mt_convert(void *dst, mt_dtype_t dst_dt, const void *src, mt_dtype_t src_dt, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float f = load(src, src_dt, i);
        switch (dst_dt) {
        case MT_BF16:
            ((uint16_t *)dst)[i] = mt_f32_to_bf16(f);
            break;
        case MT_F16:
            ((uint16_t *)dst)[i] = mt_f32_to_f16(f);
            break;
        default:
            ((float *)dst)[i] = f;
            break;
        }
    }
}
