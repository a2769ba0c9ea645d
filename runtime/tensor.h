/* Tensors: dtype (f32, bf16, f16), device (CPU, CUDA) and shape over storage from the runtime allocator,
 * tagged with a memory category so the accounting stays exact. Plus the f32 <-> bf16/f16 conversions.
 * SPDX-License-Identifier: MIT */
#ifndef MT_TENSOR_H
#define MT_TENSOR_H

#include <string.h>

#include "alloc.h"
#include "mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MT_F32 = 0, MT_BF16 = 1, MT_F16 = 2, MT_DTYPE_COUNT } mt_dtype_t;
typedef enum { MT_DEV_CPU = 0, MT_DEV_CUDA = 1 } mt_device_t;

#define MT_TENSOR_MAX_DIM 4

typedef struct {
    mt_dtype_t dtype;
    mt_device_t device;
    int ndim;
    int64_t shape[MT_TENSOR_MAX_DIM];
    mt_mem_cat_t cat;
    void *data;
    bool owned; /* data allocated by mt_tensor_alloc (freed by mt_tensor_free) */
} mt_tensor_t;

/* Bytes per element: 4, 2, 2. */
size_t mt_dtype_size(mt_dtype_t dt);
/* "f32", "bf16", "f16". */
const char *mt_dtype_name(mt_dtype_t dt);

/* Number of elements (1 for ndim 0). */
int64_t mt_tensor_numel(const mt_tensor_t *t);
size_t mt_tensor_bytes(const mt_tensor_t *t);

/* Allocates a tensor of the given shape (ndim <= MT_TENSOR_MAX_DIM, every dim >= 0) under category cat.
 * CPU: mt_alloc (aligned, accounted). CUDA: a block of the caching device allocator (mt_dev_malloc,
 * runtime/cuda_alloc.h; 512-byte aligned, accounted under cat in its statistics and mt_mem_stats(MT_MEM_DEVICE))
 * for use on the default stream: work on another stream that uses the tensor must be ordered before
 * mt_tensor_free, after which the block may be handed out again at once. In a CPU-only build
 * MT_ERR_INVALID_USAGE. Errors: MT_ERR_INVALID_ARG (bad shape or dtype, naming it), MT_ERR_OOM (with the
 * allocator's report), MT_ERR_CUDA. The tensor's data is uninitialised. */
mt_status_t mt_tensor_alloc(mt_tensor_t *t, mt_dtype_t dt, mt_device_t dev, int ndim, const int64_t *shape,
                            mt_mem_cat_t cat, const char *owner);

/* A tensor viewing memory it does not own (never freed by mt_tensor_free). */
mt_tensor_t mt_tensor_view(void *data, mt_dtype_t dt, mt_device_t dev, int ndim, const int64_t *shape);

/* Frees owned storage and clears the tensor; a view or a zeroed struct is a no-op. */
void mt_tensor_free(mt_tensor_t *t);

/* The bits of an f32, and the f32 of 32 bits (memcpy: no aliasing question; compiles to a register move,
 * so vectorised loops may use them). */
static inline uint32_t mt_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float mt_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* f32 to bf16, round to nearest even, a NaN kept as a quiet NaN: written without branches so the loops that
 * call it vectorise (the CPU bf16 products' input pass, mt_prec_round); mt_f32_to_bf16 is this. */
static inline uint16_t mt_bf16_round(float f) {
    uint32_t u = mt_f32_bits(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
}

/* Round-to-nearest-even conversions (NaN stays NaN, overflow to inf for f16). */
uint16_t mt_f32_to_bf16(float f);
float mt_bf16_to_f32(uint16_t h);
uint16_t mt_f32_to_f16(float f);
float mt_f16_to_f32(uint16_t h);

/* Copies n elements between host buffers of any two dtypes, converting. */
void mt_convert(void *dst, mt_dtype_t dst_dt, const void *src, mt_dtype_t src_dt, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* MT_TENSOR_H */
