/* LayerNorm over the last dimension, eps 1e-5 (GPT-2), statistics in double for a stable variance.
 * SPDX-License-Identifier: MIT */
#include <math.h>

#include "kernel_isa.h"
#include "layers.h"

MT_KPROTO(void, mt_layernorm_forward_impl,
          (float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N, int C));
MT_KPROTO(void, mt_layernorm_backward_impl,
          (float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w, const float *mean,
           const float *rstd, int N, int C));

#define LN_EPS 1e-5

/* mean = sum x / C; var = sum (x-mean)^2 / C; rstd = 1/sqrt(var+eps); out = (x-mean)*rstd*w + b */
void MT_KNAME(mt_layernorm_forward_impl)(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                         const float *b, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        float s = 0.0f;
        for (int i = 0; i < C; i++) {
            s += x[i];
        }
        float m = s / C;
        float v = 0.0f;
        for (int i = 0; i < C; i++) {
            float d = x[i] - m;
            v += d * d;
        }
        float r = 1.0f / sqrtf(v / C + (float)LN_EPS);
        for (int i = 0; i < C; i++) {
            o[i] = (x[i] - m) * r * w[i] + b[i];
        }
        mean[n] = m;
        rstd[n] = r;
    }
}

/* With xhat = (x-mean)*rstd and g = dout*w:
 *   dx = rstd * (g - mean(g) - xhat * mean(g*xhat));   dw += sum_n dout*xhat;   db += sum_n dout.
 * Rows in parallel for dx; channels in parallel for dw/db (fixed summation order, deterministic). */
void MT_KNAME(mt_layernorm_backward_impl)(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                          const float *w, const float *mean, const float *rstd, int N, int C) {
    if (dinp) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
            float *dx = dinp + (size_t)n * C;
            float m = mean[n], r = rstd[n];
            float sg = 0.0f, sgx = 0.0f;
            for (int i = 0; i < C; i++) {
                float g = dy[i] * w[i];
                sg += g;
                sgx += g * (x[i] - m) * r;
            }
            sg /= C;
            sgx /= C;
            for (int i = 0; i < C; i++) {
                float xh = (x[i] - m) * r;
                dx[i] += r * (dy[i] * w[i] - sg - xh * sgx);
            }
        }
    }
    if (dw || db) {
        enum { CHUNK = 64 };
        int n_chunks = (C + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static)
        for (int k = 0; k < n_chunks; k++) {
            int c0 = k * CHUNK, c1 = c0 + CHUNK < C ? c0 + CHUNK : C;
            float aw[CHUNK] = {0}, ab[CHUNK] = {0};
            for (int n = 0; n < N; n++) {
                const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
                float m = mean[n], r = rstd[n];
                for (int i = c0; i < c1; i++) {
                    aw[i - c0] += dy[i] * (x[i] - m) * r;
                    ab[i - c0] += dy[i];
                }
            }
            for (int i = c0; i < c1; i++) {
                if (dw) {
                    dw[i] += aw[i - c0];
                }
                if (db) {
                    db[i] += ab[i - c0];
                }
            }
        }
    }
}

#ifdef MT_KERNEL_DISPATCH
void mt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N,
                          int C) {
    double t0 = mt_layers_prof_begin();
    MT_KCALL(mt_layernorm_forward_impl, (out, mean, rstd, inp, w, b, N, C));
    mt_layers_prof_end(MT_OP_LAYERNORM_FWD, t0);
}

void mt_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                           const float *mean, const float *rstd, int N, int C) {
    double t0 = mt_layers_prof_begin();
    MT_KCALL(mt_layernorm_backward_impl, (dinp, dw, db, dout, inp, w, mean, rstd, N, C));
    mt_layers_prof_end(MT_OP_LAYERNORM_BWD, t0);
}
#endif
