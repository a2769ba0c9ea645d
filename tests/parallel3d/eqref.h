/* Shared by the model-parallel equivalence tests: a tiny GPT-2, a deterministic batch per step that
 * does not depend on the layout, the single-process reference run (per-step losses and final
 * parameters), and the comparison of a gathered parameter against the reference.
 * SPDX-License-Identifier: MIT */
#ifndef MT_TEST_EQREF_H
#define MT_TEST_EQREF_H

#include <stdint.h>

#include "models/model.h"
#include "models/optim/optim.h"

typedef struct {
    mt_model_config_t model; /* tiny GPT-2 */
    int global_batch;        /* sequences per step */
    int seq_len;             /* T */
    int steps;
    mt_optim_params_t optim;
    float lr;
} eq_setup_t;

/* 4 layers, 4 heads, n_embd 32, seq 16, vocab 64 (padded to 128), global batch 8, 5 steps; SGD
 * (lr 0.5) when adamw is false, else AdamW (lr 1e-2, weight decay 0.1). */
void eq_setup_default(eq_setup_t *s, bool adamw);

/* Rows [row0, row0 + n) of step's global batch: tokens and targets (n, T), targets shifted by one.
 * The same for every layout. */
void eq_batch(const eq_setup_t *s, int step, int row0, int n, int32_t *tokens, int32_t *targets);

/* The single-process run: losses[steps] and the model with its final parameters bound (free with
 * mt_model_free). */
mt_status_t eq_serial_run(const eq_setup_t *s, double *losses, mt_model_t *out);

/* Relative error ||a - b||_2 / max(||b||_2, 1e-30) over n floats. */
double eq_rel_err(const float *a, const float *b, size_t n);

/* Registers every bound parameter of the model whose `use` flag is set (NULL: all) with opt. */
mt_status_t eq_optim_add_bound(mt_optim_t opt, mt_model_t m, const bool *use);

#endif
