/* GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
 * SPDX-License-Identifier: MIT */
#include <math.h>

#include "fastmath.h"
#include "kernel_isa.h"
#include "layers.h"

MT_KPROTO(void, mt_gelu_forward_impl, (float *out, const float *inp, size_t n));
MT_KPROTO(void, mt_gelu_backward_impl, (float *dinp, const float *inp, const float *dout, size_t n));

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* tanh(u) = 1 - 2 / (exp(2u) + 1): one vectorisable exp instead of tanhf; exact
 * limits at +-inf, absolute error ~1e-7 (what matters here, as tanh is added to 1). */
static inline float fast_tanh(float u) {
    return 1.0f - 2.0f / (mt_fast_expf(2.0f * u) + 1.0f);
}

void MT_KNAME(mt_gelu_forward_impl)(float *out, const float *inp, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + fast_tanh(GELU_K * (x + 0.044715f * x * x * x)));
    }
}

/* d/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) K (1 + 3*0.044715 x^2), u = K (x + 0.044715 x^3) */
void MT_KNAME(mt_gelu_backward_impl)(float *dinp, const float *inp, const float *dout, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float th = fast_tanh(GELU_K * (x + 0.044715f * x * x * x));
        float d = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += d * dout[i];
    }
}

#ifdef MT_KERNEL_DISPATCH
void mt_gelu_forward(float *out, const float *inp, size_t n) {
    double t0 = mt_layers_prof_begin();
    MT_KCALL(mt_gelu_forward_impl, (out, inp, n));
    mt_layers_prof_end(MT_OP_GELU_FWD, t0);
}

void mt_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    double t0 = mt_layers_prof_begin();
    MT_KCALL(mt_gelu_backward_impl, (dinp, inp, dout, n));
    mt_layers_prof_end(MT_OP_GELU_BWD, t0);
}
#endif
