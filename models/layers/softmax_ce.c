/* Fused softmax + cross-entropy over the first V of Vp logit columns (padded vocabulary rows are never
 * predicted: their logits are neither read nor written), with ignore index -1.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <string.h>

#include "fastmath.h"
#include "kernel_isa.h"
#include "layers.h"

MT_KPROTO(int, mt_softmax_ce_forward_impl,
          (float *losses, float *lse, float *mean_loss, const float *logits, const int32_t *targets, int N, int V,
           int Vp));
MT_KPROTO(void, mt_softmax_ce_backward_impl,
          (float *dlogits, const float *logits, const float *lse, const int32_t *targets, int N, int V, int Vp,
           float scale));

/* lse = max + log sum_v exp(l_v - max);  loss = lse - l_target. */
int MT_KNAME(mt_softmax_ce_forward_impl)(float *losses, float *lse, float *mean_loss, const float *logits,
                                         const int32_t *targets, int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * Vp;
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int v = 0; v < V; v++) {
            mx = l[v] > mx ? l[v] : mx;
        }
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int v = 0; v < V; v++) {
            s += mt_fast_expf(l[v] - mx);
        }
        float z = mx + logf(s);
        lse[n] = z;
        losses[n] = targets[n] >= 0 ? z - l[targets[n]] : 0.0f;
    }
    return mt_softmax_ce_mean(mean_loss, losses, targets, (size_t)N);
}

#ifdef MT_KERNEL_DISPATCH
int mt_softmax_ce_mean(float *mean_loss, const float *losses, const int32_t *targets, size_t N) {
    /* summed in row order, so the loss is bit-identical whatever the thread count */
    double total = 0.0;
    int n_valid = 0;
    for (size_t n = 0; n < N; n++) {
        if (targets[n] >= 0) {
            total += losses[n];
            n_valid++;
        }
    }
    *mean_loss = n_valid > 0 ? (float)(total / n_valid) : 0.0f;
    return n_valid;
}
#endif

/* dl_v = scale * (exp(l_v - lse) - [v == target]) */
void MT_KNAME(mt_softmax_ce_backward_impl)(float *dlogits, const float *logits, const float *lse,
                                           const int32_t *targets, int N, int V, int Vp, float scale) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * Vp;
        float *d = dlogits + (size_t)n * Vp;
        if (targets[n] < 0) {
            memset(d, 0, (size_t)Vp * sizeof(float));
            continue;
        }
        float z = lse[n];
#pragma omp simd
        for (int v = 0; v < V; v++) {
            d[v] = scale * mt_fast_expf(l[v] - z);
        }
        d[targets[n]] -= scale;
        for (int v = V; v < Vp; v++) {
            d[v] = 0.0f;
        }
    }
}

#ifdef MT_KERNEL_DISPATCH
int mt_softmax_ce_forward(float *losses, float *lse, float *mean_loss, const float *logits, const int32_t *targets,
                          int N, int V, int Vp) {
    double t0 = mt_layers_prof_begin();
    int r = MT_KCALL(mt_softmax_ce_forward_impl, (losses, lse, mean_loss, logits, targets, N, V, Vp));
    mt_layers_prof_end(MT_OP_SOFTMAX_CE_FWD, t0);
    return r;
}

void mt_softmax_ce_backward(float *dlogits, const float *logits, const float *lse, const int32_t *targets, int N, int V,
                            int Vp, float scale) {
    double t0 = mt_layers_prof_begin();
    MT_KCALL(mt_softmax_ce_backward_impl, (dlogits, logits, lse, targets, N, V, Vp, scale));
    mt_layers_prof_end(MT_OP_SOFTMAX_CE_BWD, t0);
}
#endif
