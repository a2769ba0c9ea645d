/* The model interface the training loop and the parallel engines build on: a model is an ordered list
 * of modules (GPT-2: embedding, n_layer blocks, head+loss; MLP: embedding, layers, head+loss) whose
 * parameters are registered by name. Engines rebind parameter/gradient storage, run module ranges
 * (pipeline stages) on per-micro-batch activation objects, and get hooks around every module. They
 * never need to know what a transformer is.
 * SPDX-License-Identifier: MIT */
#ifndef MT_MODEL_H
#define MT_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- configuration -------------------------------------------------------------------------- */

typedef enum { MT_MODEL_GPT2 = 0, MT_MODEL_MLP = 1 } mt_model_kind_t;
typedef enum { MT_RECOMPUTE_NONE = 0, MT_RECOMPUTE_BLOCK = 1 } mt_recompute_t;

/* Tensor-parallel seam (issue #7). parallel/ supplies these; models/ never calls MPI/NCCL itself.
 * With tp_size == 1 no callback is used and the table may be NULL. */
typedef struct {
    void *ctx;
    /* Sums buf (count floats, host memory) over the tp group, in place. */
    mt_status_t (*all_reduce_sum)(void *ctx, float *buf, size_t count);
    /* Gathers count floats from every tp rank into recv (tp_size * count floats, rank order). */
    mt_status_t (*all_gather)(void *ctx, const float *send, float *recv, size_t count);
    /* Sums send (tp_size * count floats) over the tp group; this rank receives block tp_rank of the sum
     * (count floats) in recv. Needed with sequence_parallel. */
    mt_status_t (*reduce_scatter_sum)(void *ctx, const float *send, float *recv, size_t count);
    /* Elementwise maximum of buf (count floats) over the tp group, in place. */
    mt_status_t (*all_reduce_max)(void *ctx, float *buf, size_t count);
} mt_tp_ops_t;

/* The model is built from this plain struct; the training loop fills it from the config keys model.*
 * (mt_model_config_from(), models/model_config.c). Start from MT_MODEL_CONFIG_INIT. */
typedef struct {
    size_t size;              /* sizeof(mt_model_config_t), so the struct can grow */
    mt_model_kind_t kind;     /* model.kind */
    int n_layer;              /* gpt2: transformer blocks; mlp: hidden layers */
    int n_head;               /* gpt2 only */
    int n_embd;               /* gpt2: channels C; mlp: hidden width */
    int seq_len;              /* gpt2: maximum T (rows of wpe); mlp: maximum T */
    int vocab_size;           /* V: tokens are in [0, V) */
    int padded_vocab;         /* Vp >= V (rows of wte); 0 = round V up to a multiple of 128 */
    mt_recompute_t recompute; /* model.recompute */
    bool attn_recompute;      /* attention keeps only per-row softmax statistics, recomputes P in backward */
    /* model.head_chunks = k: the head computes its logits (B*T, V) in k chunks of rows and keeps only each row's
     * loss and log-sum-exp; backward recomputes each chunk's logits (one more product of the head's weight), so
     * no micro-batch holds its logits and the model holds one chunk's. 1: the whole logits, kept from forward
     * to backward. The same function either way (mt_model_head_chunk). */
    int head_chunks;
    uint64_t seed;            /* initialisation seed (train.seed) */
    int tp_rank, tp_size;     /* tensor parallel (GPT-2): Megatron sharding over tp_size ranks, see gpt2_tp.c */
    const mt_tp_ops_t *tp_ops;
    /* Tensor parallel: LayerNorm/residual regions and the activations between modules split along the
     * B*T rows over the tp ranks (all-gather / reduce-scatter instead of all-reduce). B*T % tp_size == 0. */
    bool sequence_parallel;
} mt_model_config_t;

#define MT_MODEL_CONFIG_INIT                                                                                           \
    {                                                                                                                  \
        .size = sizeof(mt_model_config_t), .kind = MT_MODEL_GPT2, .n_layer = 4, .n_head = 4, .n_embd = 128,            \
        .seq_len = 64, .vocab_size = 256, .padded_vocab = 0, .recompute = MT_RECOMPUTE_NONE, .attn_recompute = false,  \
        .head_chunks = 1, .seed = 1234, .tp_rank = 0, .tp_size = 1, .tp_ops = NULL,                                                      \
        .sequence_parallel = false                                                                                     \
    }

/* ---- parameters ----------------------------------------------------------------------------- */

#define MT_PARAM_NAME_MAX 64
#define MT_PARAM_MAX_DIM 2

/* One registered parameter. Shapes are the LOCAL shard (equal to the global shape when tp_size == 1).
 * `data` and `grad` may be rebound by an engine at any time between calls (to slices of its own flat
 * buffer, or to a gathered buffer before a module's forward for ZeRO-3): the model reads them at use
 * time and never caches them. Every other field is read-only for engines. */
typedef struct {
    char name[MT_PARAM_NAME_MAX]; /* "wte", "h.3.attn.qkv.weight", "ln_f.bias", "fc.0.weight" */
    int ndim;
    int64_t shape[MT_PARAM_MAX_DIM];        /* local shape */
    int64_t global_shape[MT_PARAM_MAX_DIM]; /* shape of the whole (unsharded) parameter */
    size_t numel;                           /* local elements */
    size_t offset;                          /* element offset of this parameter in registration order (flat layout) */
    int module;                             /* owning module: gradients complete after this module's backward */
    int tied_module;  /* another module that also reads this parameter (GPT-2 head reads wte), or -1 */
    bool is_weight2d;      /* every 2-D parameter (wte, wpe, matrices): weight decay applies; not biases/LayerNorm */
    int tp_dim;       /* tensor parallel: dimension split over tp ranks, -1 = replicated */
    int tp_parts;     /* number of interleaved blocks along tp_dim (3 for qkv: Q|K|V each split), 1 else */
    float init_std;   /* 0 with init_const for constants */
    float init_const; /* value when init_std == 0 */
    float *data;      /* numel floats; NULL until bound */
    float *grad;      /* numel floats; NULL until bound */
} mt_param_t;

typedef struct mt_model *mt_model_t;

/* Builds a model from cfg (copied). Registers parameters and modules; allocates NOTHING for parameter or
 * gradient storage (see mt_model_alloc_params / mt_model_alloc_grads, or bind your own). Errors:
 * MT_ERR_INVALID_ARG naming the bad field (e.g. n_embd % n_head != 0; with tp_size > 1: n_head or the
 * padded vocabulary not divisible by tp_size, tp_ops missing a callback, an MLP model, recompute = block). */
mt_status_t mt_model_init(const mt_model_config_t *cfg, mt_model_t *out);

/* Frees the model and any storage it allocated itself (never storage an engine bound). NULL is a no-op. */
void mt_model_free(mt_model_t m);

/* The effective configuration (padded_vocab resolved). */
const mt_model_config_t *mt_model_config(mt_model_t m);

int mt_model_n_modules(mt_model_t m);
/* "embedding", "block.3", "head" (gpt2); "embedding", "fc.2", "head" (mlp). */
const char *mt_model_module_name(mt_model_t m, int module);
/* Parameters owned by a module are contiguous in registration order: [*first, *first + *count). */
void mt_model_module_params(mt_model_t m, int module, int *first, int *count);

int mt_model_n_params(mt_model_t m);
mt_param_t *mt_model_param(mt_model_t m, int i);
/* Index of the parameter with that name, or -1. */
int mt_model_find_param(mt_model_t m, const char *name);
/* Sum of numel over all parameters (local). */
size_t mt_model_numel(mt_model_t m);

/* Allocates one contiguous buffer for all parameters (MT_MEM_PARAMS) in registration order and binds
 * every p->data to its slice (at p->offset). Does not initialise values. The model owns the buffer. */
mt_status_t mt_model_alloc_params(mt_model_t m);
/* Same for gradients (MT_MEM_GRADS), zero-filled. */
mt_status_t mt_model_alloc_grads(mt_model_t m);
/* The flat buffers allocated above (NULL if not allocated); *numel = mt_model_numel(). */
float *mt_model_params_flat(mt_model_t m);
float *mt_model_grads_flat(mt_model_t m);

/* Zeroes every bound p->grad. */
void mt_model_zero_grads(mt_model_t m);

/* Writes the GPT-2 / MLP initial values into every bound p->data: each element from (cfg.seed, name,
 * GLOBAL element index) with a counter-based generator, so the values do not depend on the layout. */
void mt_model_init_weights(mt_model_t m);

/* Initial values of local elements [start, start + count) of parameter i into out (for an engine that
 * stores only a shard, e.g. ZeRO-3). Equal to what mt_model_init_weights writes there. */
void mt_model_param_init_values(mt_model_t m, int i, size_t start, size_t count, float *out);

/* model.head_chunks: rows [*j0, *j0 + n) of N are chunk j of k (j0 = floor(N j / k)), n returned (0 for an empty
 * chunk when k > N); no chunk has more than mt_model_head_chunk_rows(N, k) = ceil(N / k) rows. */
size_t mt_model_head_chunk(size_t N, int k, int j, size_t *j0);
size_t mt_model_head_chunk_rows(size_t N, int k);

/* Model FLOPs per token of one training step (forward + backward) for sequence length T, PaLM appendix B:
 * 6*N + 12*L*H*Q*T, N = parameters taking part in matmuls (see docs/models.md), L layers, H heads,
 * Q head dim. MLP: 6*N. */
double mt_model_flops_per_token(mt_model_t m, int T);

/* ---- hooks ---------------------------------------------------------------------------------- */

/* Called around every module by forward/backward; any may be NULL. A non-OK status aborts the call and
 * is returned. post_backward(module) runs when that module's gradients (of the parameters it owns) are
 * complete. */
typedef struct {
    mt_status_t (*pre_forward)(void *arg, int module);
    mt_status_t (*post_forward)(void *arg, int module);
    mt_status_t (*pre_backward)(void *arg, int module);
    mt_status_t (*post_backward)(void *arg, int module);
    void *arg;
} mt_model_hooks_t;

/* Installs hooks (copied); NULL removes them. */
void mt_model_set_hooks(mt_model_t m, const mt_model_hooks_t *hooks);
/* The installed hooks (all NULL if none), so a wrapper can chain to them. */
void mt_model_get_hooks(mt_model_t m, mt_model_hooks_t *out);

/* ---- compute precision (CPU emulation of mixed precision) ------------------------------------ */

/* Makes every module compute as with weights and activations stored in dt, an mt_dtype_t of
 * runtime/tensor.h (not included here: its names clash with topo.h's): MT_F32 (plain f32, the default),
 * MT_BF16 / MT_F16 (precision.compute bf16 / fp16, see mt_prec_storage), whatever engine drives the model. Around each
 * module's forward and backward (inside the engine's hooks, so parameters a hook gathered are seen) the
 * wrapper copies the parameters the module reads into a scratch buffer rounded to dt and swaps p->data to
 * it for the call; the module's output and, in backward, the gradient it passes to the previous module are
 * rounded to dt; each module's parameter gradients are computed into zeroed scratch, rounded to dt and
 * then added to p->grad (the master gradients stay f32, as the master weights and optimizer state do).
 * Arithmetic stays f32. Scratch: two buffers of the most floats any one module reads, accounted as
 * MT_MEM_PARAMS (the rounded weight copy) and MT_MEM_GRADS (the gradient staging). Errors:
 * MT_ERR_INVALID_ARG for another dtype. */
mt_status_t mt_model_set_compute(mt_model_t m, int dt);
int mt_model_compute(mt_model_t m);

/* Floats in each of the two scratch buffers mt_model_set_compute's wrapper allocates (once, at the first
 * forward or backward with a dtype other than MT_F32): the most parameter floats any one module of the
 * whole model reads (its own and tied parameters, in this rank's tensor-parallel shapes), at least 1;
 * independent of the micro-batch, since activations and passed gradients are rounded in place. A plan
 * accounts mt_alloc_accounted(floats * 4) under MT_MEM_PARAMS and again under MT_MEM_GRADS. Pure. */
size_t mt_model_lowp_floats(mt_model_t m);

/* Multiplies the loss gradient of every backward through the head by scale (fp16 dynamic loss scaling;
 * the parameter gradients then carry the factor and the caller unscales them). Default 1. */
void mt_model_set_loss_scale(mt_model_t m, float scale);

/* ---- execution ------------------------------------------------------------------------------ */

/* Saved activations of one micro-batch of B sequences of T tokens (T <= seq_len). Several can be in
 * flight (1F1B). Buffers are allocated (MT_MEM_ACTIVATIONS) the first time a module runs forward on
 * this object and kept for reuse. */
typedef struct mt_acts *mt_acts_t;
mt_status_t mt_acts_init(mt_model_t m, int B, int T, mt_acts_t *out);
void mt_acts_free(mt_acts_t a);
int mt_acts_B(mt_acts_t a);
int mt_acts_T(mt_acts_t a);

/* Floats of the activation one module passes to the next for a B x T micro-batch on this rank:
 * B*T*W, or (B*T/tp_size)*W with sequence parallelism (each tp rank holds its slice of the rows). */
size_t mt_model_act_floats(mt_model_t m, int B, int T);

/* Activation memory of running modules [lo, hi) forward and backward on micro-batches of B x T, in the
 * bytes the allocator accounts (MT_MEM_ACTIVATIONS), computed by the functions that size those
 * allocations (the families' module_floats / workspace_floats and mt_alloc_accounted), so a plan and a
 * run agree to the byte. Pure: allocates nothing. Errors: MT_ERR_INVALID_ARG for a bad range or B, T. */
typedef struct {
    int64_t per_acts;  /* one mt_acts_t: token and target copies, the stage input (lo > 0), module buffers */
    int64_t workspace; /* shared by all of a model's micro-batches: family scratch + backward gradient buffers */
} mt_model_act_mem_t;
mt_status_t mt_model_act_mem(mt_model_t m, int lo, int hi, int B, int T, mt_model_act_mem_t *out);

/* Width of the activation passed between modules (C for gpt2, hidden width for mlp): in_act/out_act
 * and dout/din are (B, T, mt_model_act_width()) floats. */
int mt_model_act_width(mt_model_t m);

/* Runs forward of modules [lo, hi) (0 <= lo < hi <= n_modules) on micro-batch a.
 *   tokens  (B,T) int32 in [0, V): required when lo == 0.
 *   targets (B,T) int32 in [0, V) or -1 (ignored): required when hi == n_modules.
 * Activations between modules are mt_model_act_floats() floats ((B,T,W), or this rank's rows of it with
 * sequence parallelism); with tp_size > 1 the call is collective over the tp group (tp_ops).
 *   in_act  (B,T,W) from the previous stage: required when lo > 0 (copied; the caller may reuse it).
 *   out_act (B,T,W) to the next stage: written when hi < n_modules (may be NULL then, e.g. eval).
 *   loss    mean cross-entropy over the non-ignored targets (0 if none): written when hi == n_modules.
 * Errors: MT_ERR_INVALID_ARG for a bad range, a missing input, a token/target out of range (naming it),
 * or an unbound parameter; MT_ERR_OOM. */
mt_status_t mt_model_forward(mt_model_t m, mt_acts_t a, int lo, int hi, const int32_t *tokens, const int32_t *targets,
                             const float *in_act, float *out_act, float *loss);

/* Backward of modules [lo, hi), which must be the range of the last forward on a. ACCUMULATES (+=) into
 * every p->grad. When hi == n_modules the gradient starts at the loss, scaled by loss_grad_scale (1 for
 * one micro-batch, 1/n to average over n) and dout must be NULL; else dout (B,T,W) is required. When
 * lo > 0, din (B,T,W) receives (overwrites) the gradient for the previous stage. */
mt_status_t mt_model_backward(mt_model_t m, mt_acts_t a, int lo, int hi, const float *dout, float *din,
                              float loss_grad_scale);

/* Whole-model convenience: forward [0, n) then (if do_backward) backward with scale 1. */
mt_status_t mt_model_step(mt_model_t m, mt_acts_t a, const int32_t *tokens, const int32_t *targets, bool do_backward,
                          float *loss);

#ifdef __cplusplus
}
#endif
#endif /* MT_MODEL_H */
