/* Which module's gradients went non-finite first, for train.on_nan's message, and the test knob that
 * injects a NaN gradient. Scanning after backward instead of in every post_backward hook costs nothing
 * on healthy steps (it runs only when the loss or the gradient norm is already non-finite) and finds the
 * same module: backward runs from the last module to the first, and a NaN produced in module k reaches
 * only the gradients of modules <= k, so the highest module with a non-finite gradient is where it began.
 * SPDX-License-Identifier: MIT */
#ifndef MT_GRAD_CHECK_H
#define MT_GRAD_CHECK_H

#include "models/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The highest module index with a non-finite element in the gradient of a parameter it owns (a tied
 * parameter counts for the later of its two modules, whose backward writes it first); -1 if every bound
 * gradient is finite. param (may be NULL, n bytes) receives that parameter's name. Parameters without a
 * bound gradient (an engine that keeps only shards) are skipped: pass what this rank holds. */
int mt_model_first_nonfinite_grad(mt_model_t m, char *param, size_t n);

/* Test knob (MESHTRAIN_TEST_NAN_STEP, 1-based; 0 = off): at that step, on rank MESHTRAIN_TEST_NAN_RANK
 * (default 0; -1 = every rank), writes NaN into the first gradient element of the first parameter of
 * module MESHTRAIN_TEST_NAN_MODULE (a module name such as "block.1"; default the last module). Call it
 * after backward. Returns true if it injected. */
bool mt_model_test_inject_nan(mt_model_t m, int64_t step, int rank);

#ifdef __cplusplus
}
#endif
#endif /* MT_GRAD_CHECK_H */
