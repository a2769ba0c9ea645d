/* Causal multi-head self-attention on strided views of qkv (B,T,3C): row-wise dot products and axpys over
 * the head dimension (vectorised with omp simd), only the causal half computed, OpenMP over rows. Two
 * variants: keep the probabilities att (B,NH,T,T) for backward, or keep only the per-row log-sum-exp
 * lse (B,NH,T) and recompute P = exp(S - lse) in backward (two rows of scratch per thread instead of
 * B*NH*T*T saved floats).
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "fastmath.h"
#include "kernel_isa.h"
#include "layers.h"

MT_KPROTO(void, mt_attention_forward_impl,
          (float *out, float *att, float *lse, const float *qkv, int B, int T, int C, int NH, float *scratch));
MT_KPROTO(void, mt_attention_backward_impl,
          (float *dqkv, const float *dout, const float *qkv, const float *att, const float *lse, int B, int T, int C,
           int NH, float *scratch));

#ifdef MT_KERNEL_DISPATCH
size_t mt_attention_scratch_floats(int T) {
    int nt = omp_get_max_threads();
    return 2 * (size_t)T * (size_t)(nt > 1 ? nt : 1); /* two rows of T per thread */
}
#endif

static inline float dot(const float *a, const float *b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) {
        s += a[i] * b[i];
    }
    return s;
}

static inline void axpy(float *y, float a, const float *x, int n) {
#pragma omp simd
    for (int i = 0; i < n; i++) {
        y[i] += a * x[i];
    }
}

/* Per (b, h, t): S_s = scale q_t.k_s for s <= t; P = softmax(S); out_t = sum_s P_s v_s.
 * Rows are independent: threads split (b, h, t). The causal half above the diagonal is never computed. */
void MT_KNAME(mt_attention_forward_impl)(float *out, float *att, float *lse, const float *qkv, int B, int T, int C,
                                         int NH, float *scratch) {
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                float *row =
                    att ? att + (((size_t)b * NH + h) * T + t) * T : scratch + 2 * (size_t)T * omp_get_thread_num();
                const float *q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                float mx = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    row[s] = scale * dot(q, qkv + ((size_t)b * T + s) * C3 + C + h * hs, hs);
                    mx = row[s] > mx ? row[s] : mx;
                }
                float sum = 0.0f;
                for (int s = 0; s <= t; s++) {
                    row[s] = mt_fast_expf(row[s] - mx);
                    sum += row[s];
                }
                float inv = 1.0f / sum;
                float *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) {
                    o[i] = 0.0f;
                }
                for (int s = 0; s <= t; s++) {
                    row[s] *= inv;
                    axpy(o, row[s], qkv + ((size_t)b * T + s) * C3 + 2 * C + h * hs, hs);
                }
                if (att) {
                    for (int s = t + 1; s < T; s++) {
                        row[s] = 0.0f;
                    }
                }
                if (lse) {
                    lse[((size_t)b * NH + h) * T + t] = mx + logf(sum);
                }
            }
        }
    }
}

/* With P the probabilities and dO the output gradient of one head, per row t:
 *   dV_s += P_s dO_t;  dP_s = dO_t.v_s;  dS_s = P_s (dP_s - sum_s' P_s' dP_s');
 *   dQ_t += scale sum_s dS_s k_s;  dK_s += scale dS_s q_t.
 * dK and dV of a position collect from many rows, so threads split (b, h) only. */
void MT_KNAME(mt_attention_backward_impl)(float *dqkv, const float *dout, const float *qkv, const float *att,
                                          const float *lse, int B, int T, int C, int NH, float *scratch) {
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            float *prow = scratch + 2 * (size_t)T * omp_get_thread_num(), *dp = prow + T;
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                const float *dO = dout + ((size_t)b * T + t) * C + h * hs;
                const float *p;
                if (att) {
                    p = att + (((size_t)b * NH + h) * T + t) * T;
                } else {
                    float l = lse[((size_t)b * NH + h) * T + t];
                    for (int s = 0; s <= t; s++) {
                        prow[s] = mt_fast_expf(scale * dot(q, qkv + ((size_t)b * T + s) * C3 + C + h * hs, hs) - l);
                    }
                    p = prow;
                }
                float pdp = 0.0f;
                for (int s = 0; s <= t; s++) {
                    const float *v = qkv + ((size_t)b * T + s) * C3 + 2 * C + h * hs;
                    axpy(dqkv + ((size_t)b * T + s) * C3 + 2 * C + h * hs, p[s], dO, hs);
                    dp[s] = dot(dO, v, hs);
                    pdp += p[s] * dp[s];
                }
                float *dq = dqkv + ((size_t)b * T + t) * C3 + h * hs;
                for (int s = 0; s <= t; s++) {
                    float ds = scale * p[s] * (dp[s] - pdp);
                    axpy(dq, ds, qkv + ((size_t)b * T + s) * C3 + C + h * hs, hs);
                    axpy(dqkv + ((size_t)b * T + s) * C3 + C + h * hs, ds, q, hs);
                }
            }
        }
    }
}

#ifdef MT_KERNEL_DISPATCH
void mt_attention_forward(float *out, float *att, float *lse, const float *qkv, int B, int T, int C, int NH,
                          float *scratch) {
    double t0 = mt_layers_prof_begin();
    MT_KCALL(mt_attention_forward_impl, (out, att, lse, qkv, B, T, C, NH, scratch));
    mt_layers_prof_end(MT_OP_ATTENTION_FWD, t0);
}

void mt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, const float *lse, int B,
                           int T, int C, int NH, float *scratch) {
    double t0 = mt_layers_prof_begin();
    MT_KCALL(mt_attention_backward_impl, (dqkv, dout, qkv, att, lse, B, T, C, NH, scratch));
    mt_layers_prof_end(MT_OP_ATTENTION_BWD, t0);
}
#endif
