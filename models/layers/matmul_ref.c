/* Reference linear layer: out[n][o] = bias[o] + sum_c inp[n][c] * w[o][c], in double.
 * SPDX-License-Identifier: MIT */
#include "layers_ref.h"

void mt_matmul_ref(double *out, const double *inp, const double *w, const double *bias, int N, int C, int OC) {
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++) {
                s += inp[n * C + c] * w[o * C + c];
            }
            out[n * OC + o] = s;
        }
    }
}
