/* Reference token + position embedding, in double.
 * SPDX-License-Identifier: MIT */
#include "layers_ref.h"

void mt_embedding_ref(double *out, const int32_t *tokens, const double *wte, const double *wpe, int B, int T, int C) {
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int i = 0; i < C; i++) {
                out[(b * T + t) * C + i] = wte[tokens[b * T + t] * C + i] + (wpe ? wpe[t * C + i] : 0.0);
            }
        }
    }
}
