/* The C side of the CUDA kernels: status mapping for the launchers and their shape-check abort.
 * SPDX-License-Identifier: MIT */
#include "models/cuda/cuda_backend.h"

#include <stdatomic.h>

#include "runtime/tensor.h"

_Static_assert(MT_CU_F32 == (int)MT_F32 && MT_CU_BF16 == (int)MT_BF16 && MT_CU_F16 == (int)MT_F16,
               "mt_cuda.h dtype values must equal mt_dtype_t");

mt_status_t mt_cuda_status(cudaError_t e, const char *what) {
    if (e == cudaSuccess) {
        return MT_OK;
    }
    const char *detail = e == cudaErrorUnknown ? mt_cuda_error_detail() : ""; /* cuBLAS failures */
    return mt_error(e == cudaErrorMemoryAllocation ? MT_ERR_OOM : MT_ERR_CUDA, "%s failed: %s%s%s", what,
                    cudaGetErrorString(e), detail[0] ? "; " : "", detail);
}

/* MESHTRAIN_ATTN_TC: 0 keeps the bf16/f16 attention on CUDA cores, 2 on the WMMA tensor-core kernels only (to
 * compare the kernels); read here because MT_PARAM is C11 and the .cu files are C++. */
MT_PARAM(attn_tc, "ATTN_TC", 1)
int mt_cuda_attn_tc_param(void) {
    static atomic_int warned;
    int64_t v = mt_param_attn_tc();
    if (v == 0 || v == 1 || v == 2) {
        return (int)v;
    }
    if (!atomic_exchange(&warned, 1)) {
        MT_WARN("MESHTRAIN_ATTN_TC=%lld is not 0 (CUDA cores), 1 (tensor cores) or 2 (WMMA tensor-core kernels only): "
                "using 1; set one of those values",
                (long long)v);
    }
    return 1;
}

void mt_cuda_assert_fail(const char *file, int line, const char *cond) {
    mt_abort_impl(file, line, "CUDA launcher shape check failed: %s", cond);
}
