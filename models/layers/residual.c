/* Residual connection: out = a + b; its gradient flows unchanged to both inputs.
 * SPDX-License-Identifier: MIT */
#include "layers.h"

void mt_residual_forward(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        out[i] = a[i] + b[i];
    }
}

void mt_residual_backward(float *da, float *db, const float *dout, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        if (da) {
            da[i] += dout[i];
        }
        if (db) {
            db[i] += dout[i];
        }
    }
}
