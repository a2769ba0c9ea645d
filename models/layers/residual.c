/* Residual connection: out = a + b; its gradient flows unchanged to both inputs.
 * SPDX-License-Identifier: MIT */
#include "kernel_isa.h"
#include "layers.h"

MT_KPROTO(void, mt_residual_forward_impl, (float *out, const float *a, const float *b, size_t n));
MT_KPROTO(void, mt_residual_backward_impl, (float *da, float *db, const float *dout, size_t n));

void MT_KNAME(mt_residual_forward_impl)(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        out[i] = a[i] + b[i];
    }
}

void MT_KNAME(mt_residual_backward_impl)(float *da, float *db, const float *dout, size_t n) {
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

#ifdef MT_KERNEL_DISPATCH
void mt_residual_forward(float *out, const float *a, const float *b, size_t n) {
    double t0 = mt_layers_prof_begin();
    MT_KCALL(mt_residual_forward_impl, (out, a, b, n));
    mt_layers_prof_end(MT_OP_RESIDUAL_FWD, t0);
}

void mt_residual_backward(float *da, float *db, const float *dout, size_t n) {
    double t0 = mt_layers_prof_begin();
    MT_KCALL(mt_residual_backward_impl, (da, db, dout, n));
    mt_layers_prof_end(MT_OP_RESIDUAL_BWD, t0);
}
#endif
