/* Finiteness checks and the per-step non-finite verdict (numerics.h).
 * SPDX-License-Identifier: MIT */
#include "runtime/numerics.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* x - x is 0 for every finite x and NaN for NaN and ±inf, so a sum of differences is NaN exactly when
 * some element is not finite; it vectorises (no branch per element) and stops per block on the first
 * bad block. The build's -ffast-math-free flags keep the arithmetic IEEE. */
bool mt_f32_all_finite(const float *x, size_t n) {
    enum { BLOCK = 4096 };
    for (size_t i0 = 0; i0 < n; i0 += BLOCK) {
        size_t e = i0 + BLOCK < n ? i0 + BLOCK : n;
        float acc = 0.0f;
        for (size_t i = i0; i < e; i++) {
            acc += x[i] - x[i];
        }
        if (acc != 0.0f) {
            return false;
        }
    }
    return true;
}

size_t mt_f32_first_nonfinite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) {
            return i;
        }
    }
    return n;
}

mt_status_t mt_nan_agree(MPI_Comm comm, bool local_finite, int local_module, mt_nan_verdict_t *v) {
    int me = 0;
    MPI_Comm_rank(comm, &me);
    /* [0] any rank bad, [1] highest module + 1 */
    int mine[2] = {local_finite ? 0 : 1, local_finite ? 0 : local_module + 1}, all[2] = {0, 0};
    int rc = MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MAX, comm);
    if (rc != MPI_SUCCESS) {
        return mt_error(MT_ERR_MPI, "agreeing on non-finite values: MPI_Allreduce failed (code %d)", rc);
    }
    v->finite = all[0] == 0;
    v->module = all[1] - 1;
    v->rank = -1;
    v->n_bad_ranks = 0;
    if (v->finite) {
        return MT_OK;
    }
    /* Who saw it: the lowest rank that found that module (or, if no module is known, any bad rank). */
    bool match = !local_finite && (v->module < 0 || local_module == v->module);
    int who[2] = {match ? me : INT32_MAX, local_finite ? 0 : 1}, res[2];
    int size = 0;
    MPI_Comm_size(comm, &size);
    rc = MPI_Allreduce(&who[0], &res[0], 1, MPI_INT, MPI_MIN, comm);
    if (rc == MPI_SUCCESS) {
        rc = MPI_Allreduce(&who[1], &res[1], 1, MPI_INT, MPI_SUM, comm);
    }
    if (rc != MPI_SUCCESS) {
        return mt_error(MT_ERR_MPI, "agreeing on non-finite values: MPI_Allreduce failed (code %d)", rc);
    }
    v->rank = res[0] == INT32_MAX ? -1 : res[0];
    v->n_bad_ranks = res[1];
    return MT_OK;
}

void mt_nan_describe(char *buf, size_t n, int64_t step, double loss, double grad_norm, const mt_nan_verdict_t *v,
                     const char *module_name, const char *last_checkpoint) {
    char where[256] = "";
    if (v->module >= 0) {
        snprintf(where, sizeof(where),
                 "; gradients went non-finite first in module %d '%s' (rank %d, %d rank%s "
                 "affected)",
                 v->module, module_name ? module_name : "?", v->rank, v->n_bad_ranks, v->n_bad_ranks == 1 ? "" : "s");
    } else if (v->rank >= 0) {
        snprintf(where, sizeof(where), "; first seen on rank %d (%d rank%s affected)", v->rank, v->n_bad_ranks,
                 v->n_bad_ranks == 1 ? "" : "s");
    }
    char ckpt[1200];
    if (last_checkpoint && *last_checkpoint) {
        snprintf(ckpt, sizeof(ckpt),
                 "last good checkpoint: %.1000s (resume from it with a lower optimizer.lr, "
                 "or set train.on_nan = \"skip\")",
                 last_checkpoint);
    } else {
        snprintf(ckpt, sizeof(ckpt),
                 "no checkpoint written yet (lower optimizer.lr, or set train.on_nan = "
                 "\"skip\")");
    }
    snprintf(buf, n,
             "step %lld: loss %g, gradient norm %g is not finite%s; stopping (train.on_nan = stop) "
             "without writing a checkpoint; %s",
             (long long)step, loss, grad_norm, where, ckpt);
}
