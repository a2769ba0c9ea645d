/* The CUDA kernels of the model operations, one launcher per operation, forward and backward side by side
 * in one .cu per op family (matmul.cu, layernorm.cu, elementwise.cu, embedding.cu, attention.cu,
 * softmax_ce.cu, adamw.cu). Conventions follow models/layers/layers.h (llm.c's: row-major, a weight is
 * (OC, C), out = inp @ W^T + b, N = B*T rows, backward ACCUMULATES (+=) into every gradient it is given,
 * a NULL gradient skips it), with these differences:
 *   - every pointer is device memory; work is enqueued on `stream` (a cudaStream_t, NULL = default) and
 *     nothing synchronises the host;
 *   - activations and weights used in compute are of storage dtype `dt` (MT_CU_F32 / _BF16 / _F16, the
 *     values of mt_dtype_t); parameter gradients, LayerNorm statistics, the log-sum-exp and losses are
 *     always f32; arithmetic and reductions are f32;
 *   - a launcher checks its shapes (a violation is a caller bug: it aborts naming the condition) and
 *     returns cudaGetLastError() after its launches (cudaSuccess or the launch error). cuBLAS failures
 *     return cudaErrorUnknown with the cuBLAS status in mt_cuda_error_detail().
 * This header is C (the launchers are extern "C"); the .cu files are compiled as C++ by nvcc.
 * SPDX-License-Identifier: MIT */
#ifndef MT_CUDA_H
#define MT_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Storage dtypes: the values of mt_dtype_t (runtime/tensor.h). */
enum { MT_CU_F32 = 0, MT_CU_BF16 = 1, MT_CU_F16 = 2 };

/* Number of usable CUDA devices; 0 when the driver or a device is missing (never fails). */
int mt_cuda_device_count(void);

/* Text of the last cuBLAS failure of this thread ("" if none). */
const char *mt_cuda_error_detail(void);

/* Called by the launchers' shape checks; prints file:line and the condition, then aborts (runtime/). */
#ifdef __cplusplus
[[noreturn]]
#else
_Noreturn
#endif
void mt_cuda_assert_fail(const char *file, int line, const char *cond);

/* ---- context: cuBLASLt handle, workspace, matrix-product mode (matmul.cu) ---- */

typedef struct mt_cuda_ctx *mt_cuda_ctx_t;

/* Creates a cuBLASLt handle for the current device. workspace (device, >= 4 MiB recommended, 32 MiB on
 * Hopper) stays owned by the caller and must outlive the context. tf32 = true lets f32 products use
 * tensor cores (precision.compute = tf32). */
cudaError_t mt_cuda_ctx_create(mt_cuda_ctx_t *out, void *workspace, size_t workspace_bytes, bool tf32);
void mt_cuda_ctx_destroy(mt_cuda_ctx_t ctx);

/* ---- matmul: matmul.cu ---- */

/* out (N, ldo) first OC columns = inp (N,C) @ w^T (OC,C) + bias (OC; NULL = none), all of dtype dt.
 * gelu_pre non-NULL: the fc layer's fused epilogue: gelu_pre (N, OC) = the pre-activation and out =
 * gelu(pre) (tanh approximation), in one cuBLASLt call when the library offers it, else a product and a
 * GELU kernel. ldo >= OC. */
cudaError_t mt_cuda_matmul_forward(mt_cuda_ctx_t ctx, void *out, int ldo, void *gelu_pre, const void *inp,
                                   const void *w, const void *bias, int N, int C, int OC, int dt, void *stream);
/* dinp (N,C, dt) += dout (N, ldo) @ w;  dw (OC,C, f32) += dout^T @ inp;  dbias (OC, f32) += sum_n dout.
 * scratch: mt_cuda_colsum_scratch_floats(OC) floats for dbias (may be NULL when dbias is). */
cudaError_t mt_cuda_matmul_backward(mt_cuda_ctx_t ctx, void *dinp, float *dw, float *dbias, const void *dout, int ldo,
                                    const void *inp, const void *w, int N, int C, int OC, int dt, float *scratch,
                                    void *stream);
/* The same with dinp = dout @ w (overwritten, its old contents never read: no zeroing before, no read of it in
 * the product); dw and dbias still accumulate. */
cudaError_t mt_cuda_matmul_backward_set(mt_cuda_ctx_t ctx, void *dinp, float *dw, float *dbias, const void *dout,
                                        int ldo, const void *inp, const void *w, int N, int C, int OC, int dt,
                                        float *scratch, void *stream);
/* out (N,OC, dt) = inp @ w^T with the plain fp32/tf32/bf16 path and no epilogue: for benchmarks of the
 * device's matrix rate (bench/). */
cudaError_t mt_cuda_gemm_bench(mt_cuda_ctx_t ctx, void *out, const void *inp, const void *w, int N, int C, int OC,
                               int dt, void *stream);

/* Column sums: dst (OC, f32) += sum over N rows of src (N, ld, dtype dt); deterministic (fixed order). */
size_t mt_cuda_colsum_scratch_floats(int OC);
cudaError_t mt_cuda_colsum(float *dst, const void *src, int ld, int N, int OC, int dt, float *scratch, void *stream);

/* ---- layernorm: layernorm.cu ---- */

/* out (N,C) = (inp - mean) * rstd * w + b, eps 1e-5, mean/rstd (N, f32) saved. */
cudaError_t mt_cuda_layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const void *w,
                                      const void *b, int N, int C, int dt, void *stream);
/* Fused residual + LayerNorm: res (N,C) = a + b_in; out = layernorm(res) (from res as stored in dt). */
cudaError_t mt_cuda_residual_layernorm_forward(void *res, void *out, float *mean, float *rstd, const void *a,
                                               const void *b_in, const void *w, const void *b, int N, int C, int dt,
                                               void *stream);
/* dinp (dt) += ..; dw, db (C, f32) += ... scratch: mt_cuda_layernorm_scratch_floats(C) floats (may be NULL
 * when dw and db are). */
size_t mt_cuda_layernorm_scratch_floats(int C);
cudaError_t mt_cuda_layernorm_backward(void *dinp, float *dw, float *db, const void *dout, const void *inp,
                                       const void *w, const float *mean, const float *rstd, int N, int C, int dt,
                                       float *scratch, void *stream);

/* ---- elementwise: elementwise.cu ---- */

cudaError_t mt_cuda_gelu_forward(void *out, const void *inp, size_t n, int dt, void *stream);
/* dinp += gelu'(inp) * dout */
cudaError_t mt_cuda_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n, int dt, void *stream);
/* dinp = gelu'(inp) * dout (overwritten) */
cudaError_t mt_cuda_gelu_backward_set(void *dinp, const void *inp, const void *dout, size_t n, int dt, void *stream);
cudaError_t mt_cuda_residual_forward(void *out, const void *a, const void *b, size_t n, int dt, void *stream);
/* da += dout; db += dout (either may be NULL) */
cudaError_t mt_cuda_residual_backward(void *da, void *db, const void *dout, size_t n, int dt, void *stream);
/* dst (dst_dt) = src (src_dt) * scale, converting with round-to-nearest-even. */
cudaError_t mt_cuda_convert(void *dst, int dst_dt, const void *src, int src_dt, size_t n, float scale, void *stream);
/* *flag (device int) |= 1 when any of x (n, dt) is inf or NaN. The caller zeroes flag first. */
cudaError_t mt_cuda_check_finite(int *flag, const void *x, size_t n, int dt, void *stream);
/* *out (device double) = sum of x^2 over n f32 (deterministic two-stage sum). scratch:
 * mt_cuda_sumsq_scratch_doubles() doubles. */
size_t mt_cuda_sumsq_scratch_doubles(void);
cudaError_t mt_cuda_sumsq(double *out, const float *x, size_t n, double *scratch, void *stream);
/* Device-side clipping coefficient: norm = sqrt(*sumsq) * inv_scale; *coef = max_norm > 0 ?
 * min(1, max_norm / (norm + 1e-6)) : 1 (as mt_clip_coef), times inv_scale (so the optimizer's gradient
 * multiplier also unscales fp16 gradients); *norm_out = norm. */
cudaError_t mt_cuda_clip_coef(float *coef, float *norm_out, const double *sumsq, float max_norm, float inv_scale,
                              void *stream);

/* ---- embedding: embedding.cu ---- */

/* out (B,T,C) = wte[tokens] + wpe[t] (wpe NULL: none); tokens int32 device, validated by the caller. */
cudaError_t mt_cuda_embedding_forward(void *out, const int32_t *tokens, const void *wte, const void *wpe, int B, int T,
                                      int C, int dt, void *stream);
/* dwte, dwpe (f32) += ; dwte through float atomics (the order of additions is not fixed). */
cudaError_t mt_cuda_embedding_backward(float *dwte, float *dwpe, const void *dout, const int32_t *tokens, int B, int T,
                                       int C, int dt, void *stream);
/* Vocabulary-parallel (tensor parallelism): wte (Vl, C) holds the rows [v0, v0 + Vl) of the whole table; a
 * token outside them contributes a zero row (the tp group's all-reduce sums the owners' rows; wpe given on
 * one rank only) and no gradient. Vl may be 0 (wte unused). */
cudaError_t mt_cuda_embedding_forward_shard(void *out, const int32_t *tokens, const void *wte, const void *wpe, int v0,
                                            int Vl, int B, int T, int C, int dt, void *stream);
cudaError_t mt_cuda_embedding_backward_shard(float *dwte, float *dwpe, const void *dout, const int32_t *tokens, int v0,
                                             int Vl, int B, int T, int C, int dt, void *stream);

/* ---- attention: attention.cu ---- */

/* Causal self-attention without the T x T matrix (FlashAttention-style: key tiles in shared memory, online
 * softmax). qkv (B,T,3C) as in layers.h, out (B,T,C), lse (B,NH,T) f32 natural-log log-sum-exp of the
 * scaled scores. Head size C/NH <= 128. */
cudaError_t mt_cuda_attention_forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH, int dt,
                                      void *stream);
/* dqkv (B,T,3C) += gradient, recomputing the probabilities from lse tile by tile. out is the forward's
 * output; scratch: mt_cuda_attention_scratch_floats(B,T,NH) floats. Deterministic (no atomics). */
size_t mt_cuda_attention_scratch_floats(int B, int T, int NH);
cudaError_t mt_cuda_attention_backward(void *dqkv, const void *dout, const void *qkv, const void *out, const float *lse,
                                       int B, int T, int C, int NH, int dt, float *scratch, void *stream);
/* Tensor cores: for storage dtypes bf16 and f16, with MESHTRAIN_ATTN_TC not 0, the forward runs a WMMA kernel
 * (f32 accumulation) when the head size is a multiple of 16 up to 128, and the backward WMMA kernels when it
 * is a multiple of 16 up to 64; otherwise each pass runs on CUDA cores (f32). The lse contract is the same,
 * so either forward pairs with either backward. mt_cuda_attention_tc_path says which kernel the forward
 * (backward = 0) or the backward (1) for (dt, head size hs) gets now: 1 tensor cores, 0 CUDA cores.
 * mt_cuda_attention_set_tc(mode) overrides the knob for the process (tests, benchmarks): 1 on, 0 off, -1
 * back to MESHTRAIN_ATTN_TC; ineligible dtypes and head sizes stay on CUDA cores. mt_cuda_attention_tc_launches
 * counts the forward (0) or backward (1) calls that ran the tensor-core kernels (process-wide).
 * mt_cuda_attn_tc_param is the knob's value (cuda_backend.c, read once). */
int mt_cuda_attention_tc_path(int dt, int hs, int backward);
void mt_cuda_attention_set_tc(int mode);
unsigned long mt_cuda_attention_tc_launches(int backward);
/* Of the tensor-core launches, those that ran the mma.sync kernels (attention_mma.cu: head sizes 32, 64 and 128
 * forward, 32 and 64 backward, C a multiple of 8, 16-byte aligned tensors), which the tensor-core path prefers;
 * mode 2 of mt_cuda_attention_set_tc (MESHTRAIN_ATTN_TC=2) keeps the WMMA kernels. */
unsigned long mt_cuda_attention_mma_launches(int backward);
int mt_cuda_attn_tc_param(void);
/* The plain version for comparison (tests, bench/): stores the probabilities att (B,NH,T,T, f32), one
 * thread per query row. Same out and lse. */
cudaError_t mt_cuda_attention_plain_forward(void *out, float *att, float *lse, const void *qkv, int B, int T, int C,
                                            int NH, int dt, void *stream);

/* ---- fused softmax + cross-entropy: softmax_ce.cu ---- */

/* logits (N, Vp, dt); columns >= V excluded; targets int32 (-1 ignored). losses, lse (N, f32);
 * *mean_loss (device f32) = mean over non-ignored rows (0 if none), summed in row order; *n_valid (device
 * int) = their number. mean_loss and n_valid both NULL: the rows only (a chunk of them, model.head_chunks),
 * mt_cuda_softmax_ce_mean then giving the mean of all of them, the same bits as one call over all rows. */
cudaError_t mt_cuda_softmax_ce_forward(float *losses, float *lse, float *mean_loss, int *n_valid, const void *logits,
                                       const int32_t *targets, int N, int V, int Vp, int dt, void *stream);
cudaError_t mt_cuda_softmax_ce_mean(float *mean_loss, int *n_valid, const float *losses, const int32_t *targets, int N,
                                    void *stream);
/* dlogits (N, Vp, dt) = (scale / max(1, *n_valid)) * (softmax - onehot) on non-ignored rows, 0 elsewhere
 * (OVERWRITES; may alias logits). n_valid NULL: scale is used as is. */
cudaError_t mt_cuda_softmax_ce_backward(void *dlogits, const void *logits, const float *lse, const int32_t *targets,
                                        const int *n_valid, int N, int V, int Vp, float scale, int dt, void *stream);
/* Vocabulary-parallel (tensor parallelism; the logits are never gathered): this rank's logits (N, Vp, dt) are
 * the global columns [v0, v0 + V) (V may be 0). partial: part (N, 3 f32) = per row this rank's max, sum of
 * exp(l - max) (-inf and 0 when V = 0) and the target's logit when it is one of these columns (else 0).
 * combine: parts (P, N, 3), every tp rank's part in rank order (an all-gather of part), merged in that order
 * into losses, lse, *mean_loss and *n_valid as mt_cuda_softmax_ce_forward leaves them (every rank the same
 * values). backward_shard: mt_cuda_softmax_ce_backward on these columns (the target subtracted where its
 * column is here). */
cudaError_t mt_cuda_softmax_ce_partial(float *part, const void *logits, const int32_t *targets, int v0, int N, int V,
                                       int Vp, int dt, void *stream);
cudaError_t mt_cuda_softmax_ce_combine(float *losses, float *lse, float *mean_loss, int *n_valid, const float *parts,
                                       int P, const int32_t *targets, int N, void *stream);
cudaError_t mt_cuda_softmax_ce_backward_shard(void *dlogits, const void *logits, const float *lse,
                                              const int32_t *targets, const int *n_valid, int v0, int N, int V, int Vp,
                                              float scale, int dt, void *stream);

/* ---- fused AdamW over flat buffers: adamw.cu ---- */

/* The update of mt_adamw_update (models/optim/optim.h) on n f32 master parameters, with the gradient
 * multiplier grad_scale * (*grad_scale_dev when non-NULL: the device clip coefficient). skip (device int,
 * may be NULL): when non-zero the kernel changes nothing (fp16 overflow, decided on the device). lowp
 * (may be NULL): also writes the updated parameters converted to lowp_dt (the compute copy). */
cudaError_t mt_cuda_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1,
                          float beta2, float eps, float weight_decay, int64_t t, float grad_scale,
                          const float *grad_scale_dev, const int *skip, void *lowp, int lowp_dt, void *stream);
/* The update of mt_sgd_update (torch.optim.SGD: L2 weight decay added to the gradient, momentum buffer buf =
 * g on the first step, then buf mu + g; buf may be NULL when momentum is 0), with mt_cuda_adamw's gradient
 * multiplier, skip flag and compute copy. */
cudaError_t mt_cuda_sgd(float *param, const float *grad, float *buf, size_t n, float lr, float momentum,
                        float weight_decay, bool first, float grad_scale, const float *grad_scale_dev, const int *skip,
                        void *lowp, int lowp_dt, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* MT_CUDA_H */
