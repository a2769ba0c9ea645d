/* Reference LayerNorm (biased variance, eps 1e-5), in double.
 * SPDX-License-Identifier: MIT */
#include <math.h>

#include "layers_ref.h"

void mt_layernorm_ref(double *out, const double *inp, const double *w, const double *b, int N, int C) {
    for (int n = 0; n < N; n++) {
        const double *x = inp + n * C;
        double mean = 0.0, var = 0.0;
        for (int i = 0; i < C; i++) {
            mean += x[i] / C;
        }
        for (int i = 0; i < C; i++) {
            var += (x[i] - mean) * (x[i] - mean) / C;
        }
        for (int i = 0; i < C; i++) {
            out[n * C + i] = (x[i] - mean) / sqrt(var + 1e-5) * w[i] + b[i];
        }
    }
}
