/* Reference causal multi-head attention, one score at a time, in double: for each head, position t
 * attends to s <= t with weights softmax_s(q_t . k_s / sqrt(hs)).
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdlib.h>

#include "layers_ref.h"

void mt_attention_ref(double *out, const double *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    double *w = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double mx = -INFINITY, sum = 0.0;
                for (int s = 0; s <= t; s++) {
                    const double *k = qkv + ((size_t)b * T + s) * 3 * C + C + h * hs;
                    double d = 0.0;
                    for (int i = 0; i < hs; i++) {
                        d += q[i] * k[i];
                    }
                    w[s] = d / sqrt((double)hs);
                    mx = w[s] > mx ? w[s] : mx;
                }
                for (int s = 0; s <= t; s++) {
                    w[s] = exp(w[s] - mx);
                    sum += w[s];
                }
                for (int i = 0; i < hs; i++) {
                    double o = 0.0;
                    for (int s = 0; s <= t; s++) {
                        o += w[s] / sum * qkv[((size_t)b * T + s) * 3 * C + 2 * C + h * hs + i];
                    }
                    out[((size_t)b * T + t) * C + h * hs + i] = o;
                }
            }
        }
    }
    free(w);
}
