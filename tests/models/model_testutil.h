/* Helpers shared by the model tests: tiny configs, deterministic data, gradient snapshots.
 * SPDX-License-Identifier: MIT */
#ifndef MT_MODEL_TESTUTIL_H
#define MT_MODEL_TESTUTIL_H

#include <stdlib.h>
#include <string.h>

#include "models/model.h"
#include "testutil.h"

static inline mt_model_t tm_build(const mt_model_config_t *cfg) {
    mt_model_t m = NULL;
    mt_status_t st = mt_model_init(cfg, &m);
    if (st != MT_OK) {
        fprintf(stderr, "mt_model_init: %s\n", mt_last_error_msg());
        exit(1);
    }
    if (mt_model_alloc_params(m) != MT_OK || mt_model_alloc_grads(m) != MT_OK) {
        exit(1);
    }
    mt_model_init_weights(m);
    return m;
}

/* tokens/targets (B*T) in [0, V); targets[ignore_at] = -1 when ignore_at >= 0. */
static inline void tm_data(int32_t *tok, int32_t *tgt, int n, int V, int ignore_at, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        tok[i] = (int32_t)((seed >> 16) % (unsigned)V);
        seed = seed * 1103515245u + 12345u;
        tgt[i] = (int32_t)((seed >> 16) % (unsigned)V);
    }
    if (ignore_at >= 0) {
        tgt[ignore_at] = -1;
    }
}

static inline float *tm_grads_copy(mt_model_t m) {
    float *g = malloc(mt_model_numel(m) * sizeof(float));
    memcpy(g, mt_model_grads_flat(m), mt_model_numel(m) * sizeof(float));
    return g;
}

/* The fourth-order central difference of the loss along d at step eps:
 * (8 (L(+e) - L(-e)) - (L(+2e) - L(-2e))) / 12e, the tensor restored to keep after. */
static inline double tm_fd(mt_model_t m, mt_acts_t a, const int32_t *tok, const int32_t *tgt, mt_param_t *p,
                           const float *keep, const signed char *d, double eps) {
    float l[4];
    static const double at[4] = {1, -1, 2, -2};
    for (int j = 0; j < 4; j++) {
        for (size_t k = 0; k < p->numel; k++) {
            p->data[k] = (float)(keep[k] + at[j] * eps * d[k]);
        }
        CHECK_OK(mt_model_step(m, a, tok, tgt, false, &l[j]));
    }
    memcpy(p->data, keep, p->numel * sizeof(float));
    return (8.0 * ((double)l[0] - l[1]) - ((double)l[2] - l[3])) / (12 * eps);
}

/* Directional finite-difference check of every parameter tensor: random +-1 direction d, fourth-order central
 * differences against grad . d, |diff| <= 1e-2 |grad.d| + atol at step eps or, failing that, at 2 eps. One step
 * does not suit every tensor on every CPU: the f32 loss's rounding, which depends on the BLAS kernels the CPU
 * gets, puts a small grad.d's difference at eps = 1e-3 off by more than atol (GPT-2's h.1.attn.qkv.weight at 15x
 * weights on an AVX-512 Xeon: 2.98e-4 against 5.36e-4; at 2e-3, 5.27e-4), while at 4e-3 the truncation error of
 * the saturated model's bias directions exceeds 1e-2 relative. A wrong gradient fails at both steps. */
static inline void tm_grad_check(mt_model_t m, mt_acts_t a, const int32_t *tok, const int32_t *tgt, double eps,
                                 double atol) {
    float loss;
    mt_model_zero_grads(m);
    CHECK_OK(mt_model_step(m, a, tok, tgt, true, &loss));
    unsigned s = 7;
    for (int i = 0; i < mt_model_n_params(m); i++) {
        mt_param_t *p = mt_model_param(m, i);
        float *keep = malloc(p->numel * sizeof(float));
        signed char *d = malloc(p->numel);
        memcpy(keep, p->data, p->numel * sizeof(float));
        double gd = 0.0;
        for (size_t k = 0; k < p->numel; k++) {
            s = s * 1103515245u + 12345u;
            d[k] = (s >> 16) & 1 ? 1 : -1;
            gd += (double)p->grad[k] * d[k];
        }
        double tol = 1e-2 * fabs(gd) + atol;
        double fd = tm_fd(m, a, tok, tgt, p, keep, d, eps), fd2 = fd;
        if (fabs(fd - gd) > tol) {
            fd2 = tm_fd(m, a, tok, tgt, p, keep, d, 2 * eps);
        }
        CHECK(fabs(fd - gd) <= tol || fabs(fd2 - gd) <= tol,
              "gradient of %s: grad.d %.7g vs finite differences %.7g (step %g), %.7g (step %g)", p->name, gd, fd, eps,
              fd2, 2 * eps);
        free(keep);
        free(d);
    }
}

#endif
