/* Reference residual add, in double.
 * SPDX-License-Identifier: MIT */
#include "layers_ref.h"

void mt_residual_ref(double *out, const double *a, const double *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        out[i] = a[i] + b[i];
    }
}
