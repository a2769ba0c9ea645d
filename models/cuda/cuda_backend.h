/* C-side helpers of the CUDA path (C only, not for the .cu files): mapping CUDA/cuBLAS errors from the
 * launchers to mt_status_t with a message, and the checked-call macro.
 * SPDX-License-Identifier: MIT */
#ifndef MT_CUDA_BACKEND_H
#define MT_CUDA_BACKEND_H

#include "models/cuda/mt_cuda.h"
#include "runtime/mt_core.h"

/* MT_OK for cudaSuccess; otherwise MT_ERR_OOM (cudaErrorMemoryAllocation) or MT_ERR_CUDA, recorded with
 * mt_error naming what, the CUDA error text and, for cuBLAS failures, mt_cuda_error_detail(). */
mt_status_t mt_cuda_status(cudaError_t e, const char *what);

#define MT_CUDA_CHECK(call) MT_CHECK(mt_cuda_status((call), #call))

#endif /* MT_CUDA_BACKEND_H */
