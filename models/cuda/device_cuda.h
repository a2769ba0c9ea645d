/* The CUDA device table (runtime/device.h) over the current device: the caching allocator, streams and
 * events, and the kernels of models/cuda (elementwise.cu, adamw.cu). In builds with CUDA only.
 * SPDX-License-Identifier: MIT */
#ifndef MT_DEVICE_CUDA_H
#define MT_DEVICE_CUDA_H

#include "runtime/device.h"

#ifdef __cplusplus
extern "C" {
#endif

mt_device_table_t mt_device_cuda(void);

#ifdef __cplusplus
}
#endif
#endif /* MT_DEVICE_CUDA_H */
