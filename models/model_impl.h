/* Private parts of the model: the generic driver (model.c) and the model families (gpt2/, mlp/) share
 * these structs. Engines and the training loop use only model.h.
 * SPDX-License-Identifier: MIT */
#ifndef MT_MODEL_IMPL_H
#define MT_MODEL_IMPL_H

#include "models/model.h"

#define MT_MODULE_NAME_MAX 32
#define MT_MODEL_MAX_WORKSPACE 4

/* What a model family implements. Module buffers are one allocation per (acts, module), carved by the family. */
typedef struct {
    /* Floats the module keeps in an acts object of N = B*T rows (its saved activations). */
    size_t (*module_floats)(mt_model_t m, int module, int B, int T);
    /* Points a->mod_out[module] into the module's buffer (NULL for the head). */
    float *(*module_out)(mt_model_t m, mt_acts_t a, int module);
    /* Makes sure the model-level workspace fits B x T (recompute scratch, backward scratch) for a range of modules
     * that includes the head (head: its scratch too, e.g. a chunk of logits) or not. */
    mt_status_t (*ensure_workspace)(mt_model_t m, int B, int T, bool head);
    /* Floats of each model-level scratch buffer ensure_workspace allocates for a first call with B x T and head,
     * one entry per allocation (at most MT_MODEL_MAX_WORKSPACE); returns the count. Pure: ensure_workspace
     * sizes its buffers with this, so planning (mt_model_act_mem) and the allocation cannot disagree. */
    int (*workspace_floats)(mt_model_t m, int B, int T, bool head, size_t *floats);
    void (*free_impl)(mt_model_t m);
    /* Forward of one module: inp (B,T,W) (NULL for module 0). The head writes a->loss and a->n_valid. */
    void (*forward)(mt_model_t m, mt_acts_t a, int module, const float *inp);
    /* Backward of one module: dout (B,T,W) (NULL for the head), dinp (B,T,W) OVERWRITTEN (NULL for module 0). */
    void (*backward)(mt_model_t m, mt_acts_t a, int module, const float *inp, const float *dout, float *dinp,
                     float loss_grad_scale);
    /* Optional: the first error a forward/backward hit since the last call (a failed tp collective), then
     * cleared. NULL: the family cannot fail. */
    mt_status_t (*take_error)(mt_model_t m);
    /* Optional: rows of the activation between modules for B x T (NULL: B*T). */
    size_t (*act_rows)(mt_model_t m, int B, int T);
} mt_model_ops_t;

struct mt_model {
    mt_model_config_t cfg;
    const mt_model_ops_t *ops;
    int n_modules;
    char (*module_names)[MT_MODULE_NAME_MAX];
    int *mod_first, *mod_count;
    mt_param_t *params;
    int64_t *init_rows; /* per parameter: global rows initialised randomly; rows beyond are 0 (padded vocab) */
    int n_params, cap_params;
    size_t numel;
    float *params_flat, *grads_flat;
    mt_model_hooks_t hooks;
    int width;          /* activation width between modules */
    float *gbuf[2];     /* backward ping-pong gradients (activation floats of a micro-batch) */
    size_t gbuf_floats; /* floats each gbuf holds */
    void *impl;         /* family-specific state */
    /* Compute precision (mt_model_set_compute): the storage dtype modules compute with (MT_F32: no rounding),
     * the loss-gradient multiplier (fp16 loss scale), and the scratch the per-module wrapper swaps in. */
    int compute_dt;         /* mt_dtype_t */
    float loss_scale;       /* multiplies loss_grad_scale at the head; 1 unless fp16 */
    float *lp_w, *lp_g;     /* rounded weight copy (MT_MEM_PARAMS) and gradient staging (MT_MEM_GRADS) */
    size_t lp_floats;       /* floats each holds: the most any module reads */
    float **lp_saved;       /* per parameter: the engine's data (and grad) pointers while swapped out */
};

struct mt_acts {
    mt_model_t m;
    int B, T;
    int32_t *tokens, *targets; /* copies (B*T) */
    float *in;                 /* copy of in_act when a range starts at lo > 0 */
    float **mod_buf;           /* per module: its saved activations (one allocation) */
    float **mod_out;           /* per module: its output (B,T,W) inside mod_buf (or NULL) */
    const float **mod_inp;     /* per module: the input it saw at forward */
    bool *fwd_done;
    float loss;
    int n_valid;
};

/* Registration helpers for the families. */
mt_status_t mt_model_add_module(mt_model_t m, const char *name);
/* Registers a parameter owned by the last added module. shape is the global shape (tp_size 1: local too). */
mt_status_t mt_model_add_param(mt_model_t m, const char *name, int ndim, int64_t d0, int64_t d1, float init_std,
                               float init_const, int tp_dim, int tp_parts);

/* Allocates size floats of MT_MEM_ACTIVATIONS scratch into *p, freeing an old one (NULL keeps *p on OOM). */
mt_status_t mt_model_realloc_scratch(float **p, size_t floats, const char *owner);

mt_status_t mt_gpt2_build(mt_model_t m);
/* Tensor-parallel GPT-2 (gpt2_tp.c): replaces ops and impl of a GPT-2 registered by mt_gpt2_build. */
mt_status_t mt_gpt2_tp_attach(mt_model_t m);
mt_status_t mt_mlp_build(mt_model_t m);

#endif /* MT_MODEL_IMPL_H */
