/* Token + learned position embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
 * SPDX-License-Identifier: MIT */
#include "layers.h"

static void mt_embedding_forward_impl(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B,
                                      int T, int C) {
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        int t = bt % T;
        const float *we = wte + (size_t)tokens[bt] * C;
        const float *pe = wpe ? wpe + (size_t)t * C : NULL;
        float *o = out + (size_t)bt * C;
        for (int i = 0; i < C; i++) {
            o[i] = we[i] + (pe ? pe[i] : 0.0f);
        }
    }
}

/* dwte[tok] += dout[b,t]; dwpe[t] += dout[b,t]. Tokens repeat, so threads split the channels instead of
 * the rows (no two threads write the same element; fixed summation order). */
static void mt_embedding_backward_impl(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B, int T,
                                       int C) {
    enum { CHUNK = 64 };
    int n_chunks = (C + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static)
    for (int k = 0; k < n_chunks; k++) {
        int c0 = k * CHUNK, c1 = c0 + CHUNK < C ? c0 + CHUNK : C;
        for (int bt = 0; bt < B * T; bt++) {
            const float *d = dout + (size_t)bt * C;
            if (dwte) {
                float *w = dwte + (size_t)tokens[bt] * C;
                for (int i = c0; i < c1; i++) {
                    w[i] += d[i];
                }
            }
            if (dwpe) {
                float *p = dwpe + (size_t)(bt % T) * C;
                for (int i = c0; i < c1; i++) {
                    p[i] += d[i];
                }
            }
        }
    }
}

void mt_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B, int T, int C) {
    double t0 = mt_layers_prof_begin();
    mt_embedding_forward_impl(out, tokens, wte, wpe, B, T, C);
    mt_layers_prof_end(MT_OP_EMBEDDING_FWD, t0);
}

void mt_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B, int T, int C) {
    double t0 = mt_layers_prof_begin();
    mt_embedding_backward_impl(dwte, dwpe, dout, tokens, B, T, C);
    mt_layers_prof_end(MT_OP_EMBEDDING_BWD, t0);
}
