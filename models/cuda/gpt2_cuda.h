/* GPT-2 training on one GPU from the CUDA kernels: the same model as models/gpt2 (same parameters, same
 * registration order and flat layout, same math; the CPU code stays the reference it is tested against), and
 * the same for the MLP of models/mlp (model.kind = "mlp": its hidden layers take the blocks' place, no tp),
 * with f32 master weights, gradients and AdamW state on the device, compute in precision.compute
 * (fp32 / tf32 / bf16 / fp16 with dynamic loss scaling), and a step that never waits on the device except
 * where the caller reads a result (mt_gpt2_cuda_step_result). Used by the GPU engine of `meshtrain train`
 * (train/job_cuda.c), bench/ and the GPU tests (see docs/gpu.md for what the device path covers).
 * SPDX-License-Identifier: MIT */
#ifndef MT_GPT2_CUDA_H
#define MT_GPT2_CUDA_H

#include "models/model.h"
#include "models/optim/optim.h"
#include "runtime/precision.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tensor parallelism (a model built with tp_size > 1 holds this rank's shards in models/gpt2/gpt2_tp.c's layout):
 * the collectives the trainer issues over the tp group, every rank in the same order, each enqueued on `stream`
 * (the compute stream, so it is ordered after the launches that wrote its input and before those that read its
 * output), count elements of dtype dt (MT_CU_*) per rank: an in-place sum all-reduce, an all-gather (recv: the
 * ranks' parts in rank order) and, for sequence parallelism, a sum reduce-scatter (send: tp x count, rank r keeps
 * the sum of part r). A failing call stops the pass with its status. */
typedef struct {
    void *ctx;
    mt_status_t (*all_reduce_sum)(void *ctx, void *buf, size_t count, int dt, void *stream);
    mt_status_t (*all_gather)(void *ctx, const void *send, void *recv, size_t count, int dt, void *stream);
    mt_status_t (*reduce_scatter_sum)(void *ctx, const void *send, void *recv, size_t count, int dt, void *stream);
} mt_gpt2_cuda_tp_ops_t;

typedef struct {
    size_t size;          /* sizeof(mt_gpt2_cuda_params_t) */
    mt_prec_t prec;       /* precision.compute */
    int B, T;             /* micro-batch shape (T <= seq_len) */
    float init_scale;     /* fp16: precision.init_scale */
    int64_t scale_window; /* fp16: precision.scale_window */
    bool fused_gelu;      /* the fc layer's GELU in the cuBLASLt epilogue (default true) */
    int shard_count;      /* ZeRO-1 over shard_count ranks (1: unsharded): see mt_gpt2_cuda_shard */
    int shard_index;      /* this rank's shard, 0 <= shard_index < shard_count */
    bool shard_grads;     /* ZeRO-2 (shard_count >= 2): no whole gradient, see mt_gpt2_cuda_grad_slice */
    bool shard_weights;   /* ZeRO-3 (with shard_grads): no whole weights, see mt_gpt2_cuda_set_weight_hook */
    int stage_lo;         /* a pipeline stage: blocks [stage_lo, stage_hi) (see mt_gpt2_cuda_stage_input) */
    int stage_hi;         /* -1: n_layer (with stage_lo 0: the whole model) */
    int stage_ends;       /* the model's ends on the stage: bit 0 the embedding, bit 1 the head (gpt2: ln_f and the
                           * head); -1: stage_lo == 0 and stage_hi == n_layer say it, which cannot tell a first
                           * stage without blocks (blocks [0, 0)) from the next (blocks [0, k)): a pipeline engine
                           * sets it from its module split */
    int act_sets;         /* micro-batches whose activations are kept at once (mt_gpt2_cuda_use_acts) */
    const mt_gpt2_cuda_tp_ops_t *tp_ops; /* the tp group's collectives: required when the model's tp_size > 1 */
    int tp_chunks; /* tp: forward's row-parallel products and their reductions (and with sequence parallelism
                    * the gathers before the column-parallel ones, and backward's before the row-parallel ones) in
                    * this many row chunks (1-64), each chunk's collective overlapping a neighbouring chunk's
                    * products; 1: unchunked */
    bool recompute_block; /* model.recompute = "block" whatever the model's config says: a tensor-parallel host
                           * model holds the shards but does not recompute (models/gpt2/gpt2_tp.c refuses it),
                           * while this trainer does, repeating the block's forward collectives */
    int opt_state; /* optimizer state buffers of the slice (mt_optim_state_buffers): 2 AdamW's moments, 1 SGD's
                    * momentum, 0 plain SGD; the step's optimizer must match */
} mt_gpt2_cuda_params_t;

#define MT_GPT2_CUDA_PARAMS_INIT                                                                                       \
    {                                                                                                                  \
        .size = sizeof(mt_gpt2_cuda_params_t), .prec = MT_PREC_FP32, .B = 4, .T = 64, .init_scale = 65536.0f,          \
        .scale_window = 1000, .fused_gelu = true, .shard_count = 1, .shard_index = 0, .shard_grads = false,            \
        .shard_weights = false, .stage_lo = 0, .stage_hi = -1, .stage_ends = -1, .act_sets = 1, .tp_ops = NULL,        \
        .tp_chunks = 1, .recompute_block = false, .opt_state = 2                                                       \
    }

typedef struct mt_gpt2_cuda *mt_gpt2_cuda_t;

/* Builds the device model from m (a GPT-2, or an MLP, whose parameters are bound and initialised on the host; a
 * GPT-2 with tp_size > 1: this rank's shards, trained Megatron-style as models/gpt2/gpt2_tp.c does on the CPU:
 * attention heads, MLP columns and vocabulary rows split over the tp group, one all-reduce of the activations (or their
 * gradients) per attention and per MLP forward and backward, the embedding's sum, and the cross-entropy's per-row
 * statistics gathered; the row-parallel biases added by tp rank 0; with the model's sequence_parallel the residual
 * stream and LayerNorms on B*T/tp rows, each all-reduce an all-gather and a reduce-scatter, the stage
 * input/output/gradient buffers of those rows):
 * uploads the parameters as f32 master weights, allocates the compute copy (bf16/fp16), gradients, AdamW moments and
 * the activations of one B x T micro-batch through the caching allocator. With model.recompute = "block" the
 * activations are the block inputs plus one block's internals, which backward recomputes block by block (the last
 * block's are still those of the forward); categories as on the CPU (everything a micro-batch needs under ACTIVATIONS).
 * Errors: MT_ERR_INVALID_ARG / MT_ERR_INVALID_USAGE naming the unsupported setting, MT_ERR_OOM (with the allocator's
 * report), MT_ERR_CUDA. */
mt_status_t mt_gpt2_cuda_init(mt_model_t m, const mt_gpt2_cuda_params_t *p, mt_gpt2_cuda_t *out);

/* The device allocations mt_gpt2_cuda_init(m, p) makes, in order: *n requests of bytes[i] under cats[i], all on
 * its stream (at most cap are written; more than cap is MT_ERR_INTERNAL with *n the number needed). Sized by
 * init's own code run with every device call skipped: no device is needed, nothing is allocated, m needs no
 * parameter data and p->tp_ops may be NULL. For the planner (mt_cuda_alloc_replay turns them into the bytes the
 * allocator accounts). Other errors: init's checks of m and p. */
mt_status_t mt_gpt2_cuda_requests(mt_model_t m, const mt_gpt2_cuda_params_t *p, size_t *bytes, mt_mem_cat_t *cats,
                                  int cap, int *n);
void mt_gpt2_cuda_free(mt_gpt2_cuda_t g);

/* Zeroes the gradients (enqueued). */
mt_status_t mt_gpt2_cuda_zero_grads(mt_gpt2_cuda_t g);

/* Forward of one micro-batch: tokens, targets (B*T host int32, tokens in [0, V), targets in [0, V) or -1)
 * are validated on the host (MT_ERR_INVALID_ARG naming the first bad one) and copied; the loss stays on the
 * device. */
mt_status_t mt_gpt2_cuda_forward(mt_gpt2_cuda_t g, const int32_t *tokens, const int32_t *targets);

/* Backward of the last forward, ACCUMULATING into the f32 gradients; the loss gradient starts at
 * loss_grad_scale (1/n_micro to average) times the fp16 loss scale. */
mt_status_t mt_gpt2_cuda_backward(mt_gpt2_cuda_t g, float loss_grad_scale);

/* Optimizer step (enqueued, no host wait): global-norm clipping at max_norm (<= 0: off) on the unscaled
 * gradients, the fp16 overflow check (a step with inf/NaN gradients changes nothing), fused AdamW on the
 * master weights (weight decay on 2-D weights only, as the CPU optimizer) refreshing the compute copy.
 * Unsharded models only (a sharded or tensor-parallel one's norm spans ranks: its engine uses
 * mt_gpt2_cuda_grad_stats and mt_gpt2_cuda_step_scaled). */
mt_status_t mt_gpt2_cuda_step(mt_gpt2_cuda_t g, const mt_optim_params_t *op, float lr, float max_norm);

typedef struct {
    float loss;       /* mean loss of the last forward */
    float grad_norm;  /* unscaled global gradient norm of the last step */
    bool skipped;     /* fp16: the last step overflowed and was skipped */
    float loss_scale; /* the scale the next backward uses */
} mt_gpt2_cuda_result_t;

/* Waits for the stream and reads the last step's figures; also advances the fp16 loss scaler (so call it
 * once per step, after mt_gpt2_cuda_step). This is the one device-to-host synchronisation of a step. */
mt_status_t mt_gpt2_cuda_step_result(mt_gpt2_cuda_t g, mt_gpt2_cuda_result_t *r);

/* Waits and reads the loss of the last forward (no step needed). */
mt_status_t mt_gpt2_cuda_loss(mt_gpt2_cuda_t g, float *loss);

/* Copies the f32 gradients (refused under ZeRO-2: MT_ERR_INVALID_USAGE) / master parameters (numel floats,
 * flat layout) to host memory (waits). A sharded
 * model in bf16/fp16 holds only its shard of the master weights: get_params is refused there
 * (MT_ERR_INVALID_USAGE; mt_gpt2_cuda_get_state reads the shard). */
mt_status_t mt_gpt2_cuda_get_grads(mt_gpt2_cuda_t g, float *host);
mt_status_t mt_gpt2_cuda_get_params(mt_gpt2_cuda_t g, float *host);

/* Per-kernel time breakdown: with profiling on, an event is recorded after every launch of forward,
 * backward and step, and mt_gpt2_cuda_step_result adds each launch's time (from the previous event) to its
 * category. Costs one event record per launch. */
typedef enum {
    MT_GPT2_PROF_MATMUL_FWD,
    MT_GPT2_PROF_MATMUL_BWD,
    MT_GPT2_PROF_LN_FWD, /* LayerNorm, fused with the residual add before it */
    MT_GPT2_PROF_LN_BWD,
    MT_GPT2_PROF_ATTN_FWD,
    MT_GPT2_PROF_ATTN_BWD,
    MT_GPT2_PROF_GELU, /* the unfused GELU forward and the GELU backward */
    MT_GPT2_PROF_EMBED,
    MT_GPT2_PROF_CE,    /* fused softmax + cross-entropy, forward and backward */
    MT_GPT2_PROF_OPT,   /* inf check, norm, clip coefficient, AdamW */
    MT_GPT2_PROF_OTHER, /* memsets and copies */
    MT_GPT2_PROF_TP,    /* tensor parallelism: the tp group's all-reduces and gathers (time on the stream) */
    MT_GPT2_PROF_COUNT
} mt_gpt2_prof_t;
mt_status_t mt_gpt2_cuda_set_profile(mt_gpt2_cuda_t g, bool on);
/* Milliseconds per category summed over *steps profiled steps (ms has MT_GPT2_PROF_COUNT entries). */
void mt_gpt2_cuda_profile(mt_gpt2_cuda_t g, double *ms, int64_t *steps);
const char *mt_gpt2_prof_name(mt_gpt2_prof_t c);

/* The compute stream (cudaStream_t) every launch of g is ordered on. */
void *mt_gpt2_cuda_stream(mt_gpt2_cuda_t g);

/* ---- for a training engine (train/job_cuda.c): gradient communication and a host-side clip ---- */

/* Called during mt_gpt2_cuda_backward each time the gradients of a run of parameters are complete for that
 * backward, right after their last launch was enqueued on the compute stream (so an event recorded on it
 * then orders a consumer after them): elements [lo, hi) of the flat layout, stored contiguously at grads.
 * The runs come in backward order and tile the layout from the end: ln_f, block L-1, ..., block 0, then wte
 * and wpe (the MLP: the head, layer L-1, ..., layer 0, then wte) (wte's gradient is complete only after the
 * embedding's backward); each run's hi is the previous run's lo. A failing hook stops the backward with its
 * status. fn NULL: none.
 * Without ZeRO-2, grads is mt_gpt2_cuda_grads() + lo and backward accumulates there over micro-batches.
 * Under ZeRO-2 (params.shard_grads) it is a pool: each backward pass writes fresh gradients (not
 * accumulated) into one of two block-sized slots (block l: slot l % 2) or the buffer of wte, wpe and ln_f,
 * so the consumer must take every pass's runs (reduce them and add its slice to mt_gpt2_cuda_grad_slice),
 * enqueuing its reads on the stream given to mt_gpt2_cuda_set_comm_stream, after which the trainer records
 * an event there and waits for it before the slot is written again (two blocks later, or the next pass).
 * One exception: on a pipeline's end stage the tied wte's gradient (mt_gpt2_cuda_wte_grad) accumulates over
 * the step's passes as without ZeRO-2, since it is summed with the other end stage's once per step: its
 * elements are still part of each pass's last run, and the consumer takes them after the step's last pass. */
typedef mt_status_t (*mt_gpt2_cuda_grad_hook_t)(void *arg, size_t lo, size_t hi, float *grads);
void mt_gpt2_cuda_set_grad_hook(mt_gpt2_cuda_t g, mt_gpt2_cuda_grad_hook_t fn, void *arg);

/* ZeRO-2/3: the stream (cudaStream_t) the hooks enqueue their work on (required): the engine's comm stream. */
void mt_gpt2_cuda_set_comm_stream(mt_gpt2_cuda_t g, void *stream);

/* ZeRO-3 (params.shard_weights): the trainer keeps the compute copy of its slice only
 * (mt_gpt2_cuda_weight_slice), plus wte, wpe and ln_f whole and three block-sized slots. Before a block's
 * forward or backward it asks the hook to enqueue on the comm stream the gathering of the compute copy's
 * elements [lo, hi) (a block; after a step also wte/wpe and ln_f) into dst, in the storage dtype, each
 * rank's part coming from its slice; the trainer orders the comm stream after the slot's last reader and
 * the compute stream after the gather with events, and gathers block l + 2 (forward; l - 2 backward) while
 * block l computes. Gathered weights stay valid until the next step (micro-batches and evaluation reuse
 * them). A failing hook stops the forward/backward with its status. */
typedef mt_status_t (*mt_gpt2_cuda_weight_hook_t)(void *arg, size_t lo, size_t hi, void *dst);
void mt_gpt2_cuda_set_weight_hook(mt_gpt2_cuda_t g, mt_gpt2_cuda_weight_hook_t fn, void *arg);

/* ZeRO-3: the compute copy of the slice [lo, hi), hi - lo elements in the storage dtype (the f32 master
 * weights themselves in fp32/tf32), which the step updates; NULL otherwise. */
void *mt_gpt2_cuda_weight_slice(mt_gpt2_cuda_t g);

/* ZeRO-2: the device f32 gradient of the slice [lo, hi) (mt_gpt2_cuda_shard), hi - lo floats: the consumer
 * adds each pass's averaged gradient there; mt_gpt2_cuda_zero_grads clears it, grad_stats and the step
 * read it. NULL without ZeRO-2. */
float *mt_gpt2_cuda_grad_slice(mt_gpt2_cuda_t g);

/* The device f32 gradient of the stage's copy of wte (the layout's first elements; the tied embedding, which a
 * pipeline's end stages sum once per step): in mt_gpt2_cuda_grads(), or under ZeRO-2 on a pipeline's end stage
 * its accumulator in the pool (see mt_gpt2_cuda_grad_hook_t), cleared by mt_gpt2_cuda_zero_grads. NULL on a
 * stage without wte and under ZeRO-2 on the whole model (each pass's wte is the hook's alone). */
float *mt_gpt2_cuda_wte_grad(mt_gpt2_cuda_t g);

/* The device f32 gradients (numel floats, flat layout; NULL under ZeRO-2) and the device f32 mean loss of
 * the last forward, for communication and copies ordered on the caller's streams. */
float *mt_gpt2_cuda_grads(mt_gpt2_cuda_t g);
const float *mt_gpt2_cuda_loss_dev(mt_gpt2_cuda_t g);

/* Enqueues the sum of squares of the gradients this model updates (all of them; a sharded model's shard
 * [lo, hi) only; the last pipeline stage's without its copy of wte, which the first stage's counts; under tensor
 * parallelism the parameters every tp rank holds whole only on tp rank 0, as the CPU engines count them) and,
 * with fp16 loss scaling, their inf/NaN check, waits, and returns the sum of squares of the UNSCALED
 * gradients and whether any of them is inf/NaN. */
mt_status_t mt_gpt2_cuda_grad_stats(mt_gpt2_cuda_t g, double *sumsq, bool *nonfinite);

/* Replaces the inf/NaN verdict of the last mt_gpt2_cuda_grad_stats by one the ranks agreed on (a sharded
 * model sees only its shard; every shard must skip the same fp16 steps). */
void mt_gpt2_cuda_set_nonfinite(mt_gpt2_cuda_t g, bool nonfinite);

/* ZeRO-1 (params shard_count > 1): the flat layout is cut into shard_count slices of *len elements (a
 * multiple of 64; the last ones may reach past numel), and this model keeps the f32 master weights (in
 * bf16/fp16; in fp32/tf32 they are the compute copy, which stays whole) and AdamW's moments of its slice
 * [*lo, *hi) = [shard_index * len, ...) clipped to numel only; its step updates that slice of the master
 * weights and of the compute copy. The gradients (ZeRO-1; ZeRO-2 keeps the slice's, see the hook) and the
 * compute copy stay whole: the engine reduces each rank's slice of the gradients to it before the step,
 * and all-gathers the compute copy after it (in place: mt_gpt2_cuda_weights holds shard_count * len
 * elements). Unsharded: 0, numel, numel. */
void mt_gpt2_cuda_shard(mt_gpt2_cuda_t g, size_t *lo, size_t *hi, size_t *len);

/* The device compute copy of the weights in the storage dtype of precision.compute (f32, bf16 or f16),
 * shard_count * len elements of the flat layout (padding after numel), for the engine's all-gather; NULL
 * under ZeRO-3. */
void *mt_gpt2_cuda_weights(mt_gpt2_cuda_t g);

/* Optimizer step with a multiplier chosen on the host (the training loop's clipping coefficient; the fp16
 * unscaling is added here): fused AdamW, enqueued, no host wait. With fp16 loss scaling, a step whose last
 * mt_gpt2_cuda_grad_stats found inf/NaN is skipped (nothing launched, AdamW's count unchanged) and the
 * scale halves; clean steps advance the scaler (*skipped says which; may be NULL). */
mt_status_t mt_gpt2_cuda_step_scaled(mt_gpt2_cuda_t g, const mt_optim_params_t *op, float lr, float grad_scale,
                                     bool *skipped);

/* The fp16 loss scale the next backward uses (1 without loss scaling). */
float mt_gpt2_cuda_loss_scale(mt_gpt2_cuda_t g);

/* The dynamic loss scaler itself (fixed at 1 unless fp16), owned by g: a training loop reports from it and
 * a checkpoint saves and restores its scale and clean-step count (set them between steps only). */
mt_loss_scaler_t *mt_gpt2_cuda_scaler(mt_gpt2_cuda_t g);

/* Checkpoint state (any pointer may be NULL; waits). get: the f32 master weights of the model's slice [lo, hi)
 * (mt_gpt2_cuda_shard; everything when unsharded) into params[lo .. hi) of a numel-float array, and AdamW's m
 * and v (SGD: the momentum in m; a buffer params.opt_state does not hold is neither read nor written) of the
 * slice into hi - lo floats each. set: params whole (numel floats: the compute copy is whole; the master
 * weights take their slice; the gradients are zeroed), m and v of the slice (hi - lo floats each). The step
 * count (AdamW's bias correction, SGD's first step): get / set. */
mt_status_t mt_gpt2_cuda_get_state(mt_gpt2_cuda_t g, float *params, float *m, float *v);
mt_status_t mt_gpt2_cuda_set_state(mt_gpt2_cuda_t g, const float *params, const float *m, const float *v);
int64_t mt_gpt2_cuda_get_step(mt_gpt2_cuda_t g);
void mt_gpt2_cuda_set_step(mt_gpt2_cuda_t g, int64_t t);

/* ---- pipeline stages (params.stage_lo, stage_hi; ZeRO-1/2/3 over shard_count slices of the stage's layout) ----
 * A stage holds the parameters it computes with: blocks [lo, hi), wte and wpe on the first stage (lo = 0),
 * ln_f on the last (hi = n_layer), and wte on the last too (the tied head reads it; the two copies' gradients
 * are the engine's to sum: mt_gpt2_cuda_wte_grad). Its flat layout (gradients, hook ranges, AdamW state,
 * get_grads/get_params) is the model's with the absent parameters left out, in the same order;
 * mt_gpt2_cuda_get_state / set_state still take the model's host layout. forward: the first stage embeds the tokens, a later stage reads its
 * input x_lo from mt_gpt2_cuda_stage_input (N x C in the storage dtype, written by the caller in the compute
 * stream's order) and tokens may be NULL; a stage before the last leaves x_hi (the residual stream before the
 * next block's ln_1) at mt_gpt2_cuda_stage_output and targets may be NULL; only the last computes the loss.
 * backward: a stage before the last reads d x_hi from mt_gpt2_cuda_stage_grad (written by the caller), a
 * stage after the first leaves d x_lo there. A stage computes exactly what the whole model does on its
 * blocks: the same kernels, the unfused ln_1 at its first block normalising the same stored residual. */
void *mt_gpt2_cuda_stage_input(mt_gpt2_cuda_t g);
void *mt_gpt2_cuda_stage_output(mt_gpt2_cuda_t g);
void *mt_gpt2_cuda_stage_grad(mt_gpt2_cuda_t g);

/* Selects activation set k (0 <= k < params.act_sets; 0 at init) for the following forwards and backwards:
 * a pipeline keeps each micro-batch in flight in its own set, so its backward finds its forward's
 * activations (and the stage input/output buffers are the set's). Under model.recompute = "block" the sets
 * share one block's internals (each keeps its block inputs), refilled by every block's backward unless the
 * set is the last forward's. MT_ERR_INVALID_ARG for k out of range. */
mt_status_t mt_gpt2_cuda_use_acts(mt_gpt2_cuda_t g, int k);

/* Parameter i's offset in g's flat layout, SIZE_MAX when it is not on g's stage; the layout's length. */
size_t mt_gpt2_cuda_param_offset(mt_gpt2_cuda_t g, int i);
size_t mt_gpt2_cuda_numel(mt_gpt2_cuda_t g);

/* Device bytes of g by role, for reports. */
size_t mt_gpt2_cuda_activation_bytes(mt_gpt2_cuda_t g);

#ifdef __cplusplus
}
#endif
#endif /* MT_GPT2_CUDA_H */
