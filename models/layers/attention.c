/* Causal multi-head self-attention. Per (batch, head) the products are sgemm calls on strided views of
 * qkv (B,T,3C); the softmax is row-parallel with OpenMP. Two variants: keep the probabilities
 * att (B,NH,T,T) for backward, or keep only the per-row log-sum-exp lse (B,NH,T) and recompute
 * P = exp(S - lse) in backward (T*T floats of scratch instead of B*NH*T*T of saved activations).
 * sgemm is called from one thread (OpenBLAS threads it); OpenMP regions never call BLAS.
 * SPDX-License-Identifier: MIT */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "layers.h"

size_t mt_attention_scratch_floats(int T) {
    return 2 * (size_t)T * T; /* S/P and dP for one (b, h) */
}

/* In place over S (T,T), row t: P[t, s] = exp(S[t,s] - lse_t) for s <= t, 0 for s > t. Returns lse in lse_out. */
static void causal_softmax_rows(float *S, float *lse_out, int T) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *row = S + (size_t)t * T;
        float mx = -INFINITY;
        for (int s = 0; s <= t; s++) {
            mx = row[s] > mx ? row[s] : mx;
        }
        float sum = 0.0f;
        for (int s = 0; s <= t; s++) {
            row[s] = expf(row[s] - mx);
            sum += row[s];
        }
        float inv = 1.0f / sum;
        for (int s = 0; s <= t; s++) {
            row[s] *= inv;
        }
        for (int s = t + 1; s < T; s++) {
            row[s] = 0.0f;
        }
        if (lse_out) {
            lse_out[t] = mx + logf(sum);
        }
    }
}

/* S = scale * Q K^T; P = causal softmax(S); out_h = P V. */
void mt_attention_forward(float *out, float *att, float *lse, const float *qkv, int B, int T, int C, int NH,
                          float *scratch) {
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs;
            const float *k = q + C;
            const float *v = q + 2 * C;
            float *P = att ? att + ((size_t)b * NH + h) * T * T : scratch;
            float *l = lse ? lse + ((size_t)b * NH + h) * T : NULL;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3, 0.0f, P, T);
            causal_softmax_rows(P, l, T);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, P, T, v, C3, 0.0f,
                        out + (size_t)b * T * C + h * hs, C);
        }
    }
}

/* With P the probabilities and dO the output gradient of one head:
 *   dV += P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(P * dP));  dQ += scale dS K;  dK += scale dS^T Q. */
void mt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, const float *lse,
                           int B, int T, int C, int NH, float *scratch) {
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    float *Pbuf = scratch, *dP = scratch + (size_t)T * T;
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs;
            const float *k = q + C;
            const float *v = q + 2 * C;
            float *dq = dqkv + (size_t)b * T * C3 + h * hs;
            float *dk = dq + C;
            float *dv = dq + 2 * C;
            const float *dO = dout + (size_t)b * T * C + h * hs;
            const float *P;
            if (att) {
                P = att + ((size_t)b * NH + h) * T * T;
            } else {
                const float *l = lse + ((size_t)b * NH + h) * T;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3, 0.0f, Pbuf, T);
#pragma omp parallel for schedule(static)
                for (int t = 0; t < T; t++) {
                    float *row = Pbuf + (size_t)t * T;
                    for (int s = 0; s <= t; s++) {
                        row[s] = expf(row[s] - l[t]);
                    }
                    for (int s = t + 1; s < T; s++) {
                        row[s] = 0.0f;
                    }
                }
                P = Pbuf;
            }
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, P, T, dO, C, 1.0f, dv, C3);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dO, C, v, C3, 0.0f, dP, T);
#pragma omp parallel for schedule(static)
            for (int t = 0; t < T; t++) {
                const float *p = P + (size_t)t * T;
                float *d = dP + (size_t)t * T;
                float dot = 0.0f;
                for (int s = 0; s <= t; s++) {
                    dot += p[s] * d[s];
                }
                for (int s = 0; s <= t; s++) {
                    d[s] = p[s] * (d[s] - dot);
                }
                for (int s = t + 1; s < T; s++) {
                    d[s] = 0.0f;
                }
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, dP, T, k, C3, 1.0f, dq, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, dP, T, q, C3, 1.0f, dk, C3);
        }
    }
}
