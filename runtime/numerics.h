/* Non-finite values (NaN, ±inf) in training: fast finiteness checks of float buffers, and the verdict
 * every rank agrees on each step (one tiny all-reduce), so train.on_nan acts identically everywhere and
 * names the module whose gradients went non-finite first. The per-module gradient scan lives in
 * models/grad_check.h (models never call MPI; this file never sees a model).
 * SPDX-License-Identifier: MIT */
#ifndef MT_NUMERICS_H
#define MT_NUMERICS_H

#include <mpi.h>

#include "mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* True if every x[i] (i < n) is finite. One pass, vectorisable. */
bool mt_f32_all_finite(const float *x, size_t n);

/* Index of the first non-finite element of x, or n if there is none. */
size_t mt_f32_first_nonfinite(const float *x, size_t n);

typedef struct {
    bool finite;     /* loss, gradient norm and scanned gradients finite on every rank */
    int module;      /* the module whose gradients went non-finite first in backward order (the highest
                      * module index any rank reported), -1 if none was found */
    int rank;        /* the lowest rank that reported that module (else the lowest non-finite rank); -1 */
    int n_bad_ranks; /* ranks whose local view was non-finite */
} mt_nan_verdict_t;

/* Collective over comm: every rank passes whether its loss / gradient norm / gradients are finite and
 * (when not) the module its scan found (-1 if unknown); every rank receives the same verdict. A healthy
 * step costs one all-reduce of two ints; a bad one two more. Errors: MT_ERR_MPI. */
mt_status_t mt_nan_agree(MPI_Comm comm, bool local_finite, int local_module, mt_nan_verdict_t *v);

/* The message of a run stopped by train.on_nan = "stop": the step, the values, the module (module_name
 * may be NULL) and the rank, and the last good checkpoint (NULL or "": none written yet), with what to
 * do about it. Writes at most n bytes, NUL-terminated. */
void mt_nan_describe(char *buf, size_t n, int64_t step, double loss, double grad_norm, const mt_nan_verdict_t *v,
                     const char *module_name, const char *last_checkpoint);

#ifdef __cplusplus
}
#endif
#endif /* MT_NUMERICS_H */
