/* Device kernels of the NCCL backend: the division that turns an NCCL sum of floating-point data into
 * avg = sum / n rounded once in the accumulation type (ncclAvg would pre-scale every input by 1/n,
 * which is not the exact sum/n the API promises).
 * SPDX-License-Identifier: MIT */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "collectives/coll_nccl_kernels.h"

/* ---- kernels ---- */

template <typename T, typename A>
__global__ void divide_kernel(T *buf, size_t count, A n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        buf[i] = (T)((A)buf[i] / n);
    }
}

__global__ void divide_half_kernel(__half *buf, size_t count, float n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        buf[i] = __float2half_rn(__half2float(buf[i]) / n);
    }
}

__global__ void divide_bf16_kernel(__nv_bfloat16 *buf, size_t count, float n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        buf[i] = __float2bfloat16_rn(__bfloat162float(buf[i]) / n);
    }
}

/* ---- launchers ---- */

extern "C" int mt_coll_nccl_divide(void *buf, size_t count, int dtype_kind, int n, void *stream) {
    if (count == 0 || n == 1) {
        return 0;
    }
    cudaStream_t s = (cudaStream_t)stream;
    unsigned blocks = (unsigned)((count + 255) / 256 < 4096 ? (count + 255) / 256 : 4096);
    switch (dtype_kind) {
    case MT_COLL_NCCL_DIV_F32: divide_kernel<float, float><<<blocks, 256, 0, s>>>((float *)buf, count, (float)n); break;
    case MT_COLL_NCCL_DIV_F64:
        divide_kernel<double, double><<<blocks, 256, 0, s>>>((double *)buf, count, (double)n);
        break;
    case MT_COLL_NCCL_DIV_F16: divide_half_kernel<<<blocks, 256, 0, s>>>((__half *)buf, count, (float)n); break;
    case MT_COLL_NCCL_DIV_BF16:
        divide_bf16_kernel<<<blocks, 256, 0, s>>>((__nv_bfloat16 *)buf, count, (float)n);
        break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}
