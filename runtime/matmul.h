/* The matrix products of the CPU models: which library computes them, and in which precision.
 * `runtime.matmul = "auto"` (the default): f32 products on oneDNN's matmul primitive wherever oneDNN has a
 * native (JIT) kernel for the CPU, so the products and the OpenMP kernels around them share one thread pool
 * (OpenBLAS's own pool beside OpenMP's fought for the cores: the fp32 GPT-2 step ran twice as long,
 * docs/PERFORMANCE.md); products the model computes in bf16 (precision.compute = "bf16") on oneDNN too where
 * the CPU multiplies bf16 natively (AMX or AVX512-BF16): the inputs rounded to bf16 (nearest even), the
 * products accumulated in f32, the result f32, as on GPUs. Elsewhere bf16 stays the emulation of
 * runtime/precision.h (weights and module outputs rounded to bf16 values, f32 products), and without oneDNN
 * everything is OpenBLAS sgemm. "openblas": every product on OpenBLAS (bf16 emulated). "onednn": every product
 * on oneDNN, bf16 ones as bf16 products wherever oneDNN can make one at all (oneDNN 2.6 cannot below AVX-512:
 * there bf16 is emulated on its f32 products); an error in a build without it. oneDNN primitives are created once
 * per shape and kept (a few dozen per model).
 * SPDX-License-Identifier: MIT */
#ifndef MT_MATMUL_H
#define MT_MATMUL_H

#include <stdbool.h>

#include "runtime/mt_core.h"
#include "runtime/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MT_MATMUL_AUTO = 0, MT_MATMUL_OPENBLAS = 1, MT_MATMUL_ONEDNN = 2 } mt_matmul_lib_t;
#define MT_MATMUL_CHOICES "auto|openblas|onednn"

/* "auto", "openblas", "onednn"; false on anything else. */
bool mt_matmul_parse(const char *s, mt_matmul_lib_t *out);
/* Whether this build has oneDNN. */
bool mt_matmul_have_onednn(void);

/* Chooses the libraries for this process (runtime.matmul; every rank the same). auto: as above, each
 * precision on oneDNN only where oneDNN picks a native kernel (not its reference code) and small products
 * match a double reference, else everything on OpenBLAS. onednn: both precisions on oneDNN (bf16 as above);
 * MT_ERR_INVALID_ARG naming the fix when the build lacks it, it cannot make an f32 product, or its self-check
 * fails. Called again, it chooses again (tests). Without a call, the first product chooses auto. */
mt_status_t mt_matmul_init(mt_matmul_lib_t request);
/* The library that computes products in dt (MT_F32 or MT_BF16; f16 and tf32 products are f32 ones). For
 * MT_BF16, MT_MATMUL_ONEDNN means real bf16 products; MT_MATMUL_OPENBLAS means the emulation, whose f32
 * products run where mt_matmul_lib(MT_F32) says. */
mt_matmul_lib_t mt_matmul_lib(mt_dtype_t dt);
/* One line for start-up and `meshtrain version`: "f32 oneDNN 2.6.3 brg:avx512_core, bf16
 * brg:avx512_core_amx_bf16 (auto; products checked against a double reference)". */
const char *mt_matmul_describe(void);

/* C = op(A) op(B) + beta C, row-major, op(X) = X^T when tX: A is (M, K) (ta: stored (K, M)), B (K, N) (tb:
 * stored (N, K)), leading dimensions lda, ldb, ldc in elements, beta 0 or 1, f32 in memory. dt = MT_BF16
 * with bf16 on oneDNN: A and B rounded to bf16, products accumulated in f32. Otherwise an f32 product by
 * mt_matmul_lib(MT_F32)'s library. Should oneDNN fail at run time the product
 * is computed by OpenBLAS and the failure reported once on stderr. */
void mt_gemm(bool ta, bool tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb, float beta,
             float *C, int ldc, mt_dtype_t dt);

/* FLOP/s of an n^3 product of bf16 inputs through the library that computes bf16 products, on values in
 * [1, 2) (AMX's rate depends on the data, docs/PERFORMANCE.md: bench_gemm), the best of up to 8 timed runs
 * after a warm-up (at most ~0.3 s past the third); 0 when bf16 products are not on oneDNN or the run failed.
 * Its buffers are the measurement's (malloc, not accounted as the job's memory) and are freed. For MFU. */
double mt_matmul_bf16_rate(int n);

/* Frees the bf16 input copies (accounted MT_MEM_OTHER, "bf16 product inputs": the largest product's two
 * inputs in bf16) and the kept primitives; the next product makes them again. The training job calls it
 * when it ends, so a run gives back every byte it took. */
void mt_matmul_release(void);

/* The largest error of small products through mt_gemm in dt (odd sizes, every transpose, beta 0 and 1)
 * against a double reference of the same (for bf16: bf16-rounded) inputs, relative to the sum of |a||b|
 * terms of each entry: ~1e-7 for a correct f32 accumulation. */
double mt_matmul_selfcheck(mt_dtype_t dt);

#ifdef __cplusplus
}
#endif
#endif /* MT_MATMUL_H */
