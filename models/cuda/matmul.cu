/* Matrix products through cuBLASLt: forward with the bias (and, for the MLP's fc layer, bias + GELU) fused
 * into the epilogue, backward as two products accumulating into the gradients (beta = 1), the bias
 * gradient as a deterministic column sum. Row-major operands are handed to the column-major library as
 * their transposes: row-major X (R, C) is column-major X^T (C, R) with the same memory, so
 *     out (N,OC) = inp (N,C) @ w^T   becomes   out^T (OC,N) = op_T(w as (C,OC)) @ inp^T (C,N).
 * Precision: f32 storage computes in f32 (CUBLAS_COMPUTE_32F) or, with tf32 on, on tensor cores with
 * 10-bit mantissa inputs (CUBLAS_COMPUTE_32F_FAST_TF32); bf16/f16 storage multiplies on tensor cores
 * and accumulates in f32; weight gradients are written in f32 in every mode. Heuristic choices are
 * cached per shape, dtype, epilogue and pointer alignment.
 * SPDX-License-Identifier: MIT */
#include <cublasLt.h>
#include <stdio.h>
#include <string.h>

#include "models/cuda/cuda_impl.h"

enum { CS_SPLIT = 64, CS_COLS = 32, CS_ROWS = 8, ALGO_CACHE = 256 };

typedef struct {
    int transa, transb, m, n, k, lda, ldb, ldd, ab_type, d_type, epi, ldaux, compute, align;
} algo_key_t;

typedef struct {
    algo_key_t key;
    cublasLtMatmulAlgo_t algo;
    bool ok;
} algo_entry_t;

struct mt_cuda_ctx {
    cublasLtHandle_t lt;
    void *ws;
    size_t ws_bytes;
    bool tf32;
    algo_entry_t cache[ALGO_CACHE];
    int n_cache;
};

static thread_local char cublas_detail[256];

extern "C" const char *mt_cuda_error_detail(void) {
    return cublas_detail;
}

static cudaError_t cublas_fail(cublasStatus_t st, const char *what) {
    snprintf(cublas_detail, sizeof(cublas_detail), "%s: cuBLAS status %d (%s)", what, (int)st,
             cublasLtGetStatusString(st));
    return cudaErrorUnknown;
}

#define LT_CHECK(call)                                                                                                 \
    do {                                                                                                               \
        cublasStatus_t lt_st_ = (call);                                                                                \
        if (lt_st_ != CUBLAS_STATUS_SUCCESS) {                                                                         \
            err = cublas_fail(lt_st_, #call);                                                                          \
            goto exit;                                                                                                 \
        }                                                                                                              \
    } while (0)

/* ======================================== kernels ======================================== */

/* Stage 1 of the column sum: block (32-column group x, row slab y) -> partial[y][c]. */
template <typename T>
static __global__ void colsum_partial_kernel(float *partial, const T *src, int ld, int N, int OC) {
    __shared__ float sh[CS_ROWS][CS_COLS + 1];
    int tx = threadIdx.x % CS_COLS, ty = threadIdx.x / CS_COLS;
    int c = blockIdx.x * CS_COLS + tx;
    float a = 0.0f;
    if (c < OC) {
        for (int n = blockIdx.y * CS_ROWS + ty; n < N; n += gridDim.y * CS_ROWS) {
            a += to_f32(src[(size_t)n * ld + c]);
        }
    }
    sh[ty][tx] = a;
    __syncthreads();
    if (ty == 0 && c < OC) {
        for (int k = 1; k < CS_ROWS; k++) {
            a += sh[k][tx];
        }
        partial[(size_t)blockIdx.y * OC + c] = a;
    }
}

/* Stage 1 in 16-byte vectors (OC and ld multiples of the vector, src aligned): thread tx of block x covers the
 * V columns from (x * 32 + tx) V, rows as above; the 8 row lanes summed in order through shared memory.
 * Measured on an H200 (bf16, 16384 rows): the 2-byte version reached a quarter of the copy bandwidth. */
template <typename T>
static __global__ void colsum_partial_vec_kernel(float *partial, const T *src, int ld, int N, int OC) {
    constexpr int V = vec16<T>::n;
    __shared__ float sh[CS_ROWS][CS_COLS * V + 1];
    int tx = threadIdx.x % CS_COLS, ty = threadIdx.x / CS_COLS;
    int c0 = (blockIdx.x * CS_COLS + tx) * V;
    float a[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
        a[k] = 0.0f;
    }
    if (c0 < OC) {
#pragma unroll 4
        for (int n = blockIdx.y * CS_ROWS + ty; n < N; n += gridDim.y * CS_ROWS) {
            vec16<T> v;
            v.u = *reinterpret_cast<const uint4 *>(src + (size_t)n * ld + c0);
#pragma unroll
            for (int k = 0; k < V; k++) {
                a[k] += to_f32(v.e[k]);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < V; k++) {
        sh[ty][tx * V + k] = a[k];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < CS_COLS * V; c += blockDim.x) {
        int col = blockIdx.x * CS_COLS * V + c;
        if (col < OC) {
            float s = 0.0f;
            for (int k = 0; k < CS_ROWS; k++) {
                s += sh[k][c];
            }
            partial[(size_t)blockIdx.y * OC + col] = s;
        }
    }
}

/* out (N rows of OC columns, row stride ld) += bias, each row: the bias the epilogue could not take
 * (epilogue_bias). One rounding to T after the product's own, where the epilogue rounds once. Threads run along a
 * row's columns (coalesced), the grid's y dimension down the rows: no division per element. */
template <typename T> static __global__ void bias_add_kernel(T *out, int ld, const T *bias, int N, int OC) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < OC; c += gridDim.x * blockDim.x) {
        float b = to_f32(bias[c]);
        for (int r = blockIdx.y; r < N; r += gridDim.y) {
            T *o = out + (size_t)r * ld + c;
            *o = from_f32<T>(to_f32(*o) + b);
        }
    }
}

/* Stage 2: dst[c] += sum_y partial[y][c] in order. */
static __global__ void colsum_final_kernel(float *dst, const float *partial, int OC, int S) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < OC) {
        float a = 0.0f;
        for (int y = 0; y < S; y++) {
            a += partial[(size_t)y * OC + c];
        }
        dst[c] += a;
    }
}

/* ======================================== launchers ======================================== */

static cudaDataType_t cuda_type(int dt) {
    return dt == MT_CU_BF16 ? CUDA_R_16BF : dt == MT_CU_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* Largest power of two (<= 256) dividing the address: what the heuristic may assume. */
static int ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && (a % (uintptr_t)al) != 0) {
        al >>= 1;
    }
    return al;
}

extern "C" cudaError_t mt_cuda_ctx_create(mt_cuda_ctx_t *out, void *workspace, size_t workspace_bytes, bool tf32) {
    *out = NULL;
    mt_cuda_ctx_t c = (mt_cuda_ctx_t)calloc(1, sizeof(*c));
    if (!c) {
        return cudaErrorMemoryAllocation;
    }
    cublasStatus_t st = cublasLtCreate(&c->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(c);
        return cublas_fail(st, "cublasLtCreate");
    }
    c->ws = workspace;
    c->ws_bytes = workspace ? workspace_bytes : 0;
    c->tf32 = tf32;
    *out = c;
    return cudaSuccess;
}

extern "C" void mt_cuda_ctx_destroy(mt_cuda_ctx_t ctx) {
    if (ctx) {
        cublasLtDestroy(ctx->lt);
        free(ctx);
    }
}

/* Where a product's output width OC is split: cuBLASLt's heuristic picks a kernel several times slower when
 * the output width is not a multiple of 16 (measured on an H200 for the GPT-2 vocabulary, 50257 columns:
 * 13.4 ms against 1.9 ms at 50304; docs/PERFORMANCE.md), so such products run as an aligned part of
 * OC rounded down to 128 columns and a narrow remainder. Returns OC when no split is needed. */
static int aligned_part(int OC) {
    return OC > 256 && OC % 16 != 0 ? OC / 128 * 128 : OC;
}

/* Whether cuBLASLt's epilogue may read this bias: the heuristic's alignment preferences cover A, B, C and D but not
 * the bias pointer, and its kernels may assume 16 bytes (a misaligned-address fault reported by Marian's users on
 * A100s; pytorch/pytorch#194497, an open pull request, proposes the same fallback). A bias at an odd offset of the
 * flat parameter buffer (a tp shard's, or an MLP width not a multiple of 8 in bf16/f16) is added after the product
 * instead. */
static bool epilogue_bias(const void *bias) {
    return bias && (uintptr_t)bias % 16 == 0;
}

static cudaError_t bias_add(void *out, int ld, const void *bias, int N, int OC, int dt, cudaStream_t s) {
    if (N <= 0 || OC <= 0) {
        return cudaSuccess;
    }
    dim3 grid((unsigned)((OC + 255) / 256), (unsigned)min(N, 4096));
    MT_CU_DISPATCH(dt, T, bias_add_kernel<T><<<grid, 256, 0, s>>>((T *)out, ld, (const T *)bias, N, OC));
    return cudaGetLastError();
}

/* D (m,n; ldd) = alpha op(A) op(B) + beta D, column-major, with an optional epilogue (a bias only where
 * epilogue_bias allows it). */
static cudaError_t lt_matmul(mt_cuda_ctx_t ctx, bool transa, bool transb, int m, int n, int k, const void *A, int lda,
                             const void *B, int ldb, void *D, int ldd, int ab_dt, int d_dt, float beta,
                             cublasLtEpilogue_t epi, const void *bias, void *aux, int ldaux, cudaStream_t stream) {
    cudaError_t err = cudaSuccess;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t ad = NULL, bd = NULL, dd = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasComputeType_t compute = (ab_dt == MT_CU_F32 && ctx->tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasOperation_t ta = transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    float alpha = 1.0f;
    MT_CU_CHECK_SHAPE(!bias || epilogue_bias(bias));
    int al = ptr_align(A);
    al = min(al, ptr_align(B));
    al = min(al, ptr_align(D));
    if (aux) {
        al = min(al, ptr_align(aux));
    }
    algo_key_t key;
    memset(&key, 0, sizeof(key));
    key = {transa, transb, m, n, k, lda, ldb, ldd, ab_dt, d_dt, (int)epi, ldaux, (int)compute, al};
    algo_entry_t *hit = NULL;
    for (int i = 0; i < ctx->n_cache; i++) {
        if (!memcmp(&ctx->cache[i].key, &key, sizeof(key))) {
            hit = &ctx->cache[i];
            break;
        }
    }
    cublasLtMatmulAlgo_t algo;
    LT_CHECK(cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
        LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    }
    if (bias) {
        LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    if (aux) {
        int64_t ld64 = ldaux;
        LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
        LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld64, sizeof(ld64)));
    }
    LT_CHECK(cublasLtMatrixLayoutCreate(&ad, cuda_type(ab_dt), transa ? k : m, transa ? m : k, lda));
    LT_CHECK(cublasLtMatrixLayoutCreate(&bd, cuda_type(ab_dt), transb ? n : k, transb ? k : n, ldb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&dd, cuda_type(d_dt), m, n, ldd));
    if (hit) {
        if (!hit->ok) {
            err = cublas_fail(CUBLAS_STATUS_NOT_SUPPORTED, "no cuBLASLt algorithm for this product (cached)");
            goto exit;
        }
        algo = hit->algo;
    } else {
        uint32_t a32 = (uint32_t)al;
        LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ctx->ws_bytes,
                                                      sizeof(ctx->ws_bytes)));
        LT_CHECK(
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a32, sizeof(a32)));
        LT_CHECK(
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &a32, sizeof(a32)));
        LT_CHECK(
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &a32, sizeof(a32)));
        LT_CHECK(
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &a32, sizeof(a32)));
        cublasLtMatmulHeuristicResult_t res;
        int nres = 0;
        cublasStatus_t hst = cublasLtMatmulAlgoGetHeuristic(ctx->lt, op, ad, bd, dd, dd, pref, 1, &res, &nres);
        bool ok = hst == CUBLAS_STATUS_SUCCESS && nres > 0;
        if (ctx->n_cache < ALGO_CACHE) {
            algo_entry_t *e = &ctx->cache[ctx->n_cache++];
            e->key = key;
            e->ok = ok;
            if (ok) {
                e->algo = res.algo;
            }
        }
        if (!ok) {
            err = cublas_fail(hst == CUBLAS_STATUS_SUCCESS ? CUBLAS_STATUS_NOT_SUPPORTED : hst,
                              "cublasLtMatmulAlgoGetHeuristic found no algorithm");
            goto exit;
        }
        algo = res.algo;
    }
    LT_CHECK(
        cublasLtMatmul(ctx->lt, op, &alpha, A, ad, B, bd, &beta, D, dd, D, dd, &algo, ctx->ws, ctx->ws_bytes, stream));
exit:
    if (pref) {
        cublasLtMatmulPreferenceDestroy(pref);
    }
    if (dd) {
        cublasLtMatrixLayoutDestroy(dd);
    }
    if (bd) {
        cublasLtMatrixLayoutDestroy(bd);
    }
    if (ad) {
        cublasLtMatrixLayoutDestroy(ad);
    }
    if (op) {
        cublasLtMatmulDescDestroy(op);
    }
    return err;
}

extern "C" cudaError_t mt_cuda_matmul_forward(mt_cuda_ctx_t ctx, void *out, int ldo, void *gelu_pre, const void *inp,
                                              const void *w, const void *bias, int N, int C, int OC, int dt,
                                              void *stream) {
    MT_CU_CHECK_SHAPE(ctx && out && inp && w && N > 0 && C > 0 && OC > 0 && ldo >= OC);
    MT_CU_CHECK_SHAPE(!gelu_pre || ldo == OC);
    cudaStream_t s = (cudaStream_t)stream;
    const void *eb = epilogue_bias(bias) ? bias : NULL; /* the bias the epilogue adds; else bias_add after */
    cublasLtEpilogue_t epi = eb ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (gelu_pre) {
        /* fused: pre = inp w^T + b kept in aux, out = gelu(pre); the aux matrix needs ld % 8 == 0 */
        if (OC % 8 == 0 && eb == bias) {
            cublasLtEpilogue_t ge = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
            cudaError_t e =
                lt_matmul(ctx, true, false, OC, N, C, w, C, inp, C, out, ldo, dt, dt, 0.0f, ge, bias, gelu_pre, OC, s);
            if (e == cudaSuccess) {
                return cudaGetLastError();
            }
        }
        /* unfused fallback: the product with bias into pre, then the GELU kernel */
        cudaError_t e =
            lt_matmul(ctx, true, false, OC, N, C, w, C, inp, C, gelu_pre, OC, dt, dt, 0.0f, epi, eb, NULL, 0, s);
        if (e == cudaSuccess && bias != eb) {
            e = bias_add(gelu_pre, OC, bias, N, OC, dt, s);
        }
        if (e != cudaSuccess) {
            return e;
        }
        return mt_cuda_gelu_forward(out, gelu_pre, (size_t)N * OC, dt, stream);
    }
    size_t es = dt == MT_CU_F32 ? 4 : 2;
    int oa = aligned_part(OC);
    cudaError_t e = lt_matmul(ctx, true, false, oa, N, C, w, C, inp, C, out, ldo, dt, dt, 0.0f, epi, eb, NULL, 0, s);
    if (e == cudaSuccess && oa < OC) { /* the remaining columns: rows oa.. of w, columns oa.. of out (oa is a
                                          multiple of 128: the bias's part is as aligned as the bias) */
        e = lt_matmul(ctx, true, false, OC - oa, N, C, (const char *)w + (size_t)oa * C * es, C, inp, C,
                      (char *)out + (size_t)oa * es, ldo, dt, dt, 0.0f, epi,
                      eb ? (const char *)eb + (size_t)oa * es : NULL, NULL, 0, s);
    }
    if (e == cudaSuccess && bias != eb) {
        e = bias_add(out, ldo, bias, N, OC, dt, s);
    }
    return e != cudaSuccess ? e : cudaGetLastError();
}

extern "C" size_t mt_cuda_colsum_scratch_floats(int OC) {
    return (size_t)CS_SPLIT * (size_t)OC;
}

extern "C" cudaError_t mt_cuda_colsum(float *dst, const void *src, int ld, int N, int OC, int dt, float *scratch,
                                      void *stream) {
    MT_CU_CHECK_SHAPE(dst && src && scratch && N > 0 && OC > 0 && ld >= OC);
    cudaStream_t s = (cudaStream_t)stream;
    int split = (N + CS_ROWS - 1) / CS_ROWS < CS_SPLIT ? (N + CS_ROWS - 1) / CS_ROWS : CS_SPLIT;
    int per = dt == MT_CU_F32 ? 4 : 8;
    if (OC % per == 0 && ld % per == 0 && mt_cu_aligned16(&src, 1)) {
        dim3 gv((unsigned)((OC + CS_COLS * per - 1) / (CS_COLS * per)), (unsigned)split);
        MT_CU_DISPATCH(
            dt, T, colsum_partial_vec_kernel<T><<<gv, CS_COLS * CS_ROWS, 0, s>>>(scratch, (const T *)src, ld, N, OC));
    } else {
        dim3 g1((unsigned)((OC + CS_COLS - 1) / CS_COLS), (unsigned)split);
        MT_CU_DISPATCH(dt, T,
                       colsum_partial_kernel<T><<<g1, CS_COLS * CS_ROWS, 0, s>>>(scratch, (const T *)src, ld, N, OC));
    }
    colsum_final_kernel<<<(unsigned)((OC + 255) / 256), 256, 0, s>>>(dst, scratch, OC, split);
    return cudaGetLastError();
}

/* dinp_beta 1: dinp += ..., 0: dinp = ... (its old contents never read) */
static cudaError_t matmul_backward(mt_cuda_ctx_t ctx, void *dinp, float dinp_beta, float *dw, float *dbias,
                                   const void *dout, int ldo, const void *inp, const void *w, int N, int C, int OC,
                                   int dt, float *scratch, void *stream) {
    MT_CU_CHECK_SHAPE(ctx && dout && N > 0 && C > 0 && OC > 0 && ldo >= OC);
    MT_CU_CHECK_SHAPE((!dinp || w) && (!dw || inp) && (!dbias || scratch));
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t e;
    size_t es = dt == MT_CU_F32 ? 4 : 2;
    int oa = aligned_part(OC); /* OC split as in the forward: [0, oa) and [oa, OC) */
    const char *w_r = (const char *)w + (size_t)oa * C * es, *dout_r = (const char *)dout + (size_t)oa * es;
    if (dinp) { /* dinp^T (C,N) += w as (C,OC) @ dout^T (OC,N), the inner dimension OC in two parts */
        e = lt_matmul(ctx, false, false, C, N, oa, w, C, dout, ldo, dinp, C, dt, dt, dinp_beta,
                      CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0, s);
        if (e == cudaSuccess && oa < OC) { /* the remainder adds to the first part */
            e = lt_matmul(ctx, false, false, C, N, OC - oa, w_r, C, dout_r, ldo, dinp, C, dt, dt, 1.0f,
                          CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0, s);
        }
        if (e != cudaSuccess) {
            return e;
        }
    }
    if (dw) { /* dw^T (C,OC) += inp^T (C,N) @ op_T(dout^T as (OC,N)), columns [0, oa) and [oa, OC) */
        e = lt_matmul(ctx, false, true, C, oa, N, inp, C, dout, ldo, dw, C, dt, MT_CU_F32, 1.0f,
                      CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0, s);
        if (e == cudaSuccess && oa < OC) {
            e = lt_matmul(ctx, false, true, C, OC - oa, N, inp, C, dout_r, ldo, dw + (size_t)oa * C, C, dt, MT_CU_F32,
                          1.0f, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, 0, s);
        }
        if (e != cudaSuccess) {
            return e;
        }
    }
    if (dbias) {
        return mt_cuda_colsum(dbias, dout, ldo, N, OC, dt, scratch, stream);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t mt_cuda_matmul_backward(mt_cuda_ctx_t ctx, void *dinp, float *dw, float *dbias, const void *dout,
                                               int ldo, const void *inp, const void *w, int N, int C, int OC, int dt,
                                               float *scratch, void *stream) {
    return matmul_backward(ctx, dinp, 1.0f, dw, dbias, dout, ldo, inp, w, N, C, OC, dt, scratch, stream);
}

extern "C" cudaError_t mt_cuda_matmul_backward_set(mt_cuda_ctx_t ctx, void *dinp, float *dw, float *dbias,
                                                   const void *dout, int ldo, const void *inp, const void *w, int N,
                                                   int C, int OC, int dt, float *scratch, void *stream) {
    return matmul_backward(ctx, dinp, 0.0f, dw, dbias, dout, ldo, inp, w, N, C, OC, dt, scratch, stream);
}

extern "C" cudaError_t mt_cuda_gemm_bench(mt_cuda_ctx_t ctx, void *out, const void *inp, const void *w, int N, int C,
                                          int OC, int dt, void *stream) {
    MT_CU_CHECK_SHAPE(ctx && out && inp && w && N > 0 && C > 0 && OC > 0);
    return lt_matmul(ctx, true, false, OC, N, C, w, C, inp, C, out, OC, dt, dt, 0.0f, CUBLASLT_EPILOGUE_DEFAULT, NULL,
                     NULL, 0, (cudaStream_t)stream);
}
