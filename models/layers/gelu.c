/* GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
 * SPDX-License-Identifier: MIT */
#include <math.h>

#include "layers.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

void mt_gelu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x)));
    }
}

/* d/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) K (1 + 3*0.044715 x^2), u = K (x + 0.044715 x^3) */
void mt_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float th = tanhf(GELU_K * (x + 0.044715f * x * x * x));
        float d = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += d * dout[i];
    }
}
