/* CPU operations of the models, each a forward/backward pair in its own file (matmul.c, layernorm.c,
 * gelu.c, attention.c, embedding.c, residual.c, softmax_ce.c). Conventions (llm.c): row-major, a weight
 * is (OC, C) and out = inp @ W^T + b; N = B*T rows. Backward ACCUMULATES (+=) into every gradient it is
 * given (inputs and weights alike); a NULL gradient pointer skips that gradient. All pointers are host
 * memory; OpenMP inside, runtime/matmul.h's mt_gemm for matrix products. Not reentrant across caller threads.
 * SPDX-License-Identifier: MIT */
#ifndef MT_LAYERS_H
#define MT_LAYERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- matmul (+ bias): matmul.c ---- */
/* out (N, ldo) first OC columns = inp (N,C) @ w^T (OC,C) + bias (OC; NULL = none). ldo >= OC (padded vocab). */
void mt_matmul_forward(float *out, int ldo, const float *inp, const float *w, const float *bias, int N, int C, int OC);
/* dinp (N,C) += dout @ w;  dw (OC,C) += dout^T @ inp;  dbias (OC) += sum_n dout. dout is (N, ldo). */
void mt_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, int ldo, const float *inp,
                        const float *w, int N, int C, int OC);
/* dbias (OC) += sum over N rows of dout (N, ldo): the bias op's backward on its own. */
void mt_bias_backward(float *dbias, const float *dout, int ldo, int N, int OC);
/* The precision of the matmul products from now on (process-wide; an mt_dtype_t): MT_BF16 computes them in
 * bf16 with f32 accumulation where runtime/matmul.h puts bf16 on oneDNN (the inputs rounded to bf16), any
 * other value in f32. Returns the previous value. The model's compute-precision wrapper sets it around each
 * module (mt_model_set_compute). */
int mt_layers_set_product_dtype(int dt);

/* ---- which build of the kernels runs: isa.c ---- */
/* attention, layernorm, GELU, residual and softmax + cross-entropy are compiled twice (kernel_isa.h): for
 * x86-64's baseline and, on x86-64, for AVX-512. "avx512" where the CPU executes it, else "baseline". */
const char *mt_layers_isa(void);
/* false: the baseline kernels from now on, even where AVX-512 runs (tests, benchmarks); true: back to the
 * default. Returns whether the AVX-512 kernels run after the call. */
bool mt_layers_set_isa(bool allow_avx512);

/* ---- layernorm: layernorm.c ---- */
/* out (N,C) = (inp - mean) * rstd * w + b, rstd = 1/sqrt(var + 1e-5) (biased var); mean, rstd (N) saved. */
void mt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N,
                          int C);
void mt_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                           const float *mean, const float *rstd, int N, int C);

/* ---- GELU, tanh approximation: gelu.c ---- */
void mt_gelu_forward(float *out, const float *inp, size_t n);
void mt_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* ---- residual: residual.c ---- */
/* out = a + b (n); backward: da += dout, db += dout (da, db may alias each other only if the caller wants 2x). */
void mt_residual_forward(float *out, const float *a, const float *b, size_t n);
void mt_residual_backward(float *da, float *db, const float *dout, size_t n);

/* ---- token + position embedding: embedding.c ---- */
/* out (B,T,C) = wte[tokens[b,t]] + wpe[t] (wpe NULL: no position term). Tokens must be validated by the
 * caller (0 <= tok < rows of wte). */
void mt_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B, int T, int C);
void mt_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B, int T, int C);

/* ---- causal multi-head self-attention: attention.c ---- */
/* qkv (B,T,3C) holds Q|K|V, head h at columns [h*hs, (h+1)*hs) of each; out (B,T,C) = softmax(QK^T/sqrt(hs),
 * causal) V per head. Saved: att (B,NH,T,T) probabilities (zero above the diagonal) when keep_probs, else
 * lse (B,NH,T) per-row log-sum-exp of the scaled scores, from which backward recomputes the probabilities.
 * scratch: mt_attention_scratch_floats(T, C / NH) floats (per thread: the head's packed keys and values and one
 * tile's scores, about (2 Tp + 4 T) hs floats; size it after setting the thread count). */
size_t mt_attention_scratch_floats(int T, int hs);
void mt_attention_forward(float *out, float *att, float *lse, const float *qkv, int B, int T, int C, int NH,
                          float *scratch);
/* dqkv (B,T,3C) += gradient; uses att when non-NULL, else recomputes from lse. */
void mt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, const float *lse, int B,
                           int T, int C, int NH, float *scratch);

/* ---- fused softmax + cross-entropy over the first V of Vp columns: softmax_ce.c ---- */
/* logits (N, Vp); columns >= V (padded vocabulary) are excluded. losses (N) = -log p[target], 0 for an
 * ignored target (-1); lse (N) saved. Returns the number of non-ignored rows; *mean_loss their mean (0 if none). */
int mt_softmax_ce_forward(float *losses, float *lse, float *mean_loss, const float *logits, const int32_t *targets,
                          int N, int V, int Vp);
/* The mean of losses (N) over the non-ignored rows (0 if none), summed in row order as mt_softmax_ce_forward does
 * (so rows computed in chunks give its bits); returns their count. */
int mt_softmax_ce_mean(float *mean_loss, const float *losses, const int32_t *targets, size_t N);
/* dlogits (N, Vp) = scale * (softmax - onehot(target)) for non-ignored rows, 0 elsewhere (OVERWRITES; may
 * alias logits, computing in place). scale is typically loss_grad_scale / n_valid. */
void mt_softmax_ce_backward(float *dlogits, const float *logits, const float *lse, const int32_t *targets, int N, int V,
                            int Vp, float scale);

/* ---- per-operation timers (bench/): prof.c ---- */
typedef enum {
    MT_OP_MATMUL_FWD,
    MT_OP_MATMUL_BWD,
    MT_OP_LAYERNORM_FWD,
    MT_OP_LAYERNORM_BWD,
    MT_OP_GELU_FWD,
    MT_OP_GELU_BWD,
    MT_OP_RESIDUAL_FWD,
    MT_OP_RESIDUAL_BWD,
    MT_OP_EMBEDDING_FWD,
    MT_OP_EMBEDDING_BWD,
    MT_OP_ATTENTION_FWD,
    MT_OP_ATTENTION_BWD,
    MT_OP_SOFTMAX_CE_FWD,
    MT_OP_SOFTMAX_CE_BWD,
    MT_OP_COUNT
} mt_op_t;
/* Process-wide, not thread-safe; off by default. */
void mt_layers_prof_enable(bool on);
void mt_layers_prof_reset(void);
/* Seconds spent in op since the last reset; *calls (may be NULL) the number of calls. */
double mt_layers_prof_seconds(mt_op_t op, long *calls);
const char *mt_layers_op_name(mt_op_t op);
double mt_layers_prof_begin(void);
void mt_layers_prof_end(mt_op_t op, double t0);

#ifdef __cplusplus
}
#endif
#endif /* MT_LAYERS_H */
