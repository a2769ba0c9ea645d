/* Plain, obviously-correct double-precision forward references of the operations in layers.h, used only
 * by the tests: forward outputs are compared against them, and backward against their finite differences.
 * SPDX-License-Identifier: MIT */
#ifndef MT_LAYERS_REF_H
#define MT_LAYERS_REF_H

#include <stddef.h>
#include <stdint.h>

void mt_matmul_ref(double *out, const double *inp, const double *w, const double *bias, int N, int C, int OC);
void mt_layernorm_ref(double *out, const double *inp, const double *w, const double *b, int N, int C);
void mt_gelu_ref(double *out, const double *inp, size_t n);
void mt_residual_ref(double *out, const double *a, const double *b, size_t n);
void mt_embedding_ref(double *out, const int32_t *tokens, const double *wte, const double *wpe, int B, int T, int C);
void mt_attention_ref(double *out, const double *qkv, int B, int T, int C, int NH);
/* Returns the mean loss over non-ignored rows; losses (N) may be NULL. Reads only the first V columns. */
double mt_softmax_ce_ref(double *losses, const double *logits, const int32_t *targets, int N, int V, int Vp);

#endif
