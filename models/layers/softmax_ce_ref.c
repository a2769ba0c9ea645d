/* Reference softmax cross-entropy over the first V of Vp columns with ignore index -1, in double.
 * SPDX-License-Identifier: MIT */
#include <math.h>

#include "layers_ref.h"

double mt_softmax_ce_ref(double *losses, const double *logits, const int32_t *targets, int N, int V, int Vp) {
    double total = 0.0;
    int n_valid = 0;
    for (int n = 0; n < N; n++) {
        const double *l = logits + (size_t)n * Vp;
        double mx = -INFINITY, s = 0.0;
        for (int v = 0; v < V; v++) {
            mx = l[v] > mx ? l[v] : mx;
        }
        for (int v = 0; v < V; v++) {
            s += exp(l[v] - mx);
        }
        double loss = targets[n] >= 0 ? mx + log(s) - l[targets[n]] : 0.0;
        if (losses) {
            losses[n] = loss;
        }
        if (targets[n] >= 0) {
            total += loss;
            n_valid++;
        }
    }
    return n_valid ? total / n_valid : 0.0;
}
