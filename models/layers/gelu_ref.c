/* Reference GELU (tanh approximation), in double.
 * SPDX-License-Identifier: MIT */
#include <math.h>

#include "layers_ref.h"

void mt_gelu_ref(double *out, const double *inp, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double x = inp[i];
        out[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    }
}
