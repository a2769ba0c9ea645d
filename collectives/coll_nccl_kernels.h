/* Launchers of the NCCL backend's device kernels (coll_nccl_kernels.cu), callable from C.
 * SPDX-License-Identifier: MIT */
#ifndef MT_COLL_NCCL_KERNELS_H
#define MT_COLL_NCCL_KERNELS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { MT_COLL_NCCL_DIV_F32 = 0, MT_COLL_NCCL_DIV_F64, MT_COLL_NCCL_DIV_F16, MT_COLL_NCCL_DIV_BF16 };

/* buf[i] /= n on stream, rounded once in the type's accumulation type (f32 for f16/bf16). Returns a
 * cudaError_t value (0 = cudaSuccess). */
int mt_coll_nccl_divide(void *buf, size_t count, int dtype_kind, int n, void *stream);

#ifdef __cplusplus
}
#endif
#endif
