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

/* Directional finite-difference check of every parameter tensor: random +-1 direction d,
 * fourth-order central differences against grad . d, |diff| <= 1e-2 |grad.d| + atol. */
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
        /* fourth-order central difference: (8 (L(+e) - L(-e)) - (L(+2e) - L(-2e))) / 12e */
        float l[4];
        static const double at[4] = {1, -1, 2, -2};
        for (int j = 0; j < 4; j++) {
            for (size_t k = 0; k < p->numel; k++) {
                p->data[k] = (float)(keep[k] + at[j] * eps * d[k]);
            }
            CHECK_OK(mt_model_step(m, a, tok, tgt, false, &l[j]));
        }
        memcpy(p->data, keep, p->numel * sizeof(float));
        double fd = (8.0 * ((double)l[0] - l[1]) - ((double)l[2] - l[3])) / (12 * eps);
        CHECK(fabs(fd - gd) <= 1e-2 * fabs(gd) + atol, "gradient of %s: grad.d %.7g vs finite difference %.7g", p->name,
              gd, fd);
        free(keep);
        free(d);
    }
}

#endif
