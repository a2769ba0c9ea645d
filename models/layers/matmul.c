/* Linear layer (matmul + bias) on runtime/matmul.h's products (OpenBLAS sgemm; bf16 on oneDNN where the
 * CPU multiplies bf16). Weight layout (llm.c): w is (OC, C) row-major and out = inp @ w^T + b, so a weight
 * row is one output channel (what tensor parallelism splits).
 * SPDX-License-Identifier: MIT */
#include <string.h>

#include "layers.h"
#include "runtime/matmul.h"

/* The precision of the products (mt_layers_set_product_dtype). */
static mt_dtype_t product_dt = MT_F32;

int mt_layers_set_product_dtype(int dt) {
    int prev = (int)product_dt;
    product_dt = dt == (int)MT_BF16 ? MT_BF16 : MT_F32;
    return prev;
}

/* out[n, o] = sum_c inp[n, c] * w[o, c] + bias[o] */
static void mt_matmul_forward_impl(float *out, int ldo, const float *inp, const float *w, const float *bias, int N,
                                   int C, int OC) {
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            memcpy(out + (size_t)n * ldo, bias, (size_t)OC * sizeof(float));
        }
    }
    mt_gemm(false, true, N, OC, C, inp, C, w, C, bias ? 1.0f : 0.0f, out, ldo, product_dt);
}

/* dbias[o] += sum_n dout[n, o]. Threads split the channels so the sum order per channel is fixed. */
void mt_bias_backward(float *dbias, const float *dout, int ldo, int N, int OC) {
    enum { CHUNK = 64 };
    int n_chunks = (OC + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static)
    for (int k = 0; k < n_chunks; k++) {
        int o0 = k * CHUNK, o1 = o0 + CHUNK < OC ? o0 + CHUNK : OC;
        float acc[CHUNK] = {0};
        for (int n = 0; n < N; n++) {
            const float *row = dout + (size_t)n * ldo;
            for (int o = o0; o < o1; o++) {
                acc[o - o0] += row[o];
            }
        }
        for (int o = o0; o < o1; o++) {
            dbias[o] += acc[o - o0];
        }
    }
}

/* dinp = dout @ w (N,OC)x(OC,C);  dw = dout^T @ inp (OC,N)x(N,C);  dbias = column sums of dout. */
static void mt_matmul_backward_impl(float *dinp, float *dw, float *dbias, const float *dout, int ldo, const float *inp,
                                    const float *w, int N, int C, int OC) {
    if (dinp) {
        mt_gemm(false, false, N, C, OC, dout, ldo, w, C, 1.0f, dinp, C, product_dt);
    }
    if (dw) {
        mt_gemm(true, false, OC, C, N, dout, ldo, inp, C, 1.0f, dw, C, product_dt);
    }
    if (dbias) {
        mt_bias_backward(dbias, dout, ldo, N, OC);
    }
}

void mt_matmul_forward(float *out, int ldo, const float *inp, const float *w, const float *bias, int N, int C, int OC) {
    double t0 = mt_layers_prof_begin();
    mt_matmul_forward_impl(out, ldo, inp, w, bias, N, C, OC);
    mt_layers_prof_end(MT_OP_MATMUL_FWD, t0);
}

void mt_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, int ldo, const float *inp,
                        const float *w, int N, int C, int OC) {
    double t0 = mt_layers_prof_begin();
    mt_matmul_backward_impl(dinp, dw, dbias, dout, ldo, inp, w, N, C, OC);
    mt_layers_prof_end(MT_OP_MATMUL_BWD, t0);
}
