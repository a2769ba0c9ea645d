/* The CPU's flat-buffer kernels (runtime/flat_ops.h).
 * SPDX-License-Identifier: MIT */
#include "runtime/flat_ops.h"

#include <math.h>

/* torch.optim.AdamW (foreach=False, amsgrad=False, maximize=False), per element, in fp32:
 *   p  = p * (1 - lr*wd)                        decoupled weight decay, before the moments
 *   m  = m + (g - m) * (1 - b1)                 torch's lerp_ form of b1*m + (1-b1)*g
 *   v  = v * b2 + (1 - b2) * g * g
 *   step_size = lr / (1 - b1^t)
 *   denom = sqrt(v) / sqrt(1 - b2^t) + eps
 *   p  = p - step_size * m / denom
 * The bias corrections are computed in double and rounded once, as torch does with Python floats. */
void mt_adamw_update(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                     float eps, float weight_decay, int64_t t, float grad_scale) {
    double bc1 = 1.0 - pow((double)beta1, (double)t);
    double bc2 = 1.0 - pow((double)beta2, (double)t);
    float step_size = (float)((double)lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float decay = (float)(1.0 - (double)lr * (double)weight_decay);
    float one_minus_b1 = (float)(1.0 - (double)beta1), one_minus_b2 = (float)(1.0 - (double)beta2);
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float p = param[i];
        if (weight_decay != 0.0f) {
            p *= decay;
        }
        float mi = m[i] + (g - m[i]) * one_minus_b1;
        float vi = v[i] * beta2 + one_minus_b2 * g * g;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        param[i] = p - step_size * (mi / denom);
    }
}

/* torch.optim.SGD (dampening 0, nesterov False), per element:
 *   g = g + wd * p                              L2 weight decay, coupled to the gradient
 *   buf = g (first step) | buf * mu + g          momentum
 *   p = p - lr * buf                             (buf = g when mu = 0) */
void mt_sgd_update(float *param, const float *grad, float *buf, size_t n, float lr, float momentum, float weight_decay,
                   bool first, float grad_scale) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        if (weight_decay != 0.0f) {
            g = g + weight_decay * param[i];
        }
        if (momentum != 0.0f && buf) {
            g = first ? g : buf[i] * momentum + g;
            buf[i] = g;
        }
        param[i] = param[i] - lr * g;
    }
}

/* ---- clipping ------------------------------------------------------------------------------------ */

double mt_clip_sumsq(const float *g, size_t n) {
    double s = 0.0;
#pragma omp parallel for reduction(+ : s) schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        s += (double)g[i] * (double)g[i];
    }
    return s;
}

float mt_clip_coef(double total_sumsq, float max_norm, double *norm) {
    double nrm = sqrt(total_sumsq);
    if (norm) {
        *norm = nrm;
    }
    if (max_norm <= 0.0f || !isfinite(nrm)) {
        return 1.0f;
    }
    /* torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1, computed in fp32 */
    float coef = max_norm / ((float)nrm + 1e-6f);
    return coef < 1.0f ? coef : 1.0f;
}
