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
    float grad_clip; /* global-norm clipping (0 = off, the default) */
} eq_setup_t;

/* The tiny GPT-2 of the model-parallel tests: 4 layers, 4 heads, n_embd 32, seq 16, vocab 64 (padded_vocab
 * 128, whatever tp), seed 42. */
mt_model_config_t eq_tiny_gpt2(void);

/* eq_tiny_gpt2, global batch 8, 5 steps; SGD (lr 0.5) when adamw is false, else AdamW (lr 1e-2, weight
 * decay 0.1). */
void eq_setup_default(eq_setup_t *s, bool adamw);

/* Rows [row0, row0 + n) of step's global batch: tokens and targets (n, T), targets shifted by one.
 * The same for every layout. */
void eq_batch(const eq_setup_t *s, int step, int row0, int n, int32_t *tokens, int32_t *targets);

/* The single-process run (clipping to grad_clip by the global norm when > 0): losses[steps] and the model with its
 * final parameters bound (free with mt_model_free). */
mt_status_t eq_serial_run(const eq_setup_t *s, double *losses, mt_model_t *out);

/* Relative error ||a - b||_2 / max(||b||_2, 1e-30) over n floats. */
double eq_rel_err(const float *a, const float *b, size_t n);

/* Compares a whole (gathered) parameter with the reference's: the relative error ||a - b|| / ||b||
 * must be <= tol. One exception, by the math and not by the layout: the key third of GPT-2's
 * attn.qkv.bias gets a gradient that is exactly zero in exact arithmetic (softmax is invariant to the
 * constant q.b_k that a key bias adds to every score of a row), so its value is accumulated rounding
 * noise that differs between any two summation orders (AdamW even normalises that noise to steps of
 * about lr). That third is only checked to stay within key_bound in both runs (SGD: 1e-5, where the noise
 * stays ~1e-12; AdamW: 1.1 lr steps, all that its steps allow, i.e. for AdamW it is not compared); the
 * query and value thirds get the relative test. *err receives the relative error compared. */
bool eq_param_close(const char *name, const float *got, const float *ref, size_t n, int n_embd, double tol,
                    double key_bound, double *err);

/* key_bound for eq_param_close: 1e-5 for SGD, 1.1 lr steps for AdamW. */
double eq_key_bound(const eq_setup_t *s);

/* Registers every bound parameter of the model whose `use` flag is set (NULL: all) with opt. */
mt_status_t eq_optim_add_bound(mt_optim_t opt, mt_model_t m, const bool *use);

#endif
