/* Data-parallel engines: DP (the DataParallel baseline), DDP (replicas, bucketed all-reduce overlapped
 * with backward) and ZeRO stages 1-3 (optimizer state, gradients, parameters sharded over the group).
 * An engine owns parameter, gradient and optimizer storage, binds it into the model, hooks the model's
 * modules and runs the step's communication. The training loop drives every engine the same way; the
 * design, the layouts and the accounting formulas are in docs/parallel.md.
 * SPDX-License-Identifier: MIT */
#ifndef MT_ENGINE_H
#define MT_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "collectives/coll.h"
#include "models/model.h"
#include "models/optim/optim.h"
#include "runtime/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MT_ENGINE_DP = 0, MT_ENGINE_DDP = 1, MT_ENGINE_ZERO = 2 } mt_engine_kind_t;

typedef struct {
    size_t size;               /* sizeof(mt_engine_params_t) */
    mt_engine_kind_t kind;     /* parallel.engine */
    int zero_stage;            /* 1, 2 or 3 when kind == MT_ENGINE_ZERO (parallel.zero_stage) */
    int grad_accum;            /* micro-batches (backward passes) per step on this rank, >= 1 */
    double bucket_mb;          /* DDP / ZeRO-1/2 gradient bucket cap in MiB (parallel.bucket_mb) */
    double first_bucket_mb;    /* cap of the first bucket (the last parameters), so communication starts early */
    int64_t persist_threshold; /* ZeRO-3: parameters with fewer elements stay whole (parallel.zero_persist_threshold) */
    mt_optim_params_t optim;   /* the optimizer every engine runs over what its rank owns */
    /* Per parameter (mt_model_n_params entries, borrowed for the engine's life), MT_ENGINE_PARAM_* bits;
     * NULL: every parameter held and counted in the norm. A pipeline stage passes the parameters its
     * modules read, so it lays out (and allocates parameters, gradients and optimizer state for) only
     * those; parameters without HELD stay unbound. */
    const uint8_t *param_flags;
    /* The device table the engine's storage lives on and its element-wise work runs on (parameters,
     * gradients, shards, bucket and gather buffers, optimizer state; runtime/device.h), and its stream.
     * NULL: the CPU table. Only devices whose memory the host reads (mt_device_is_host) are accepted today:
     * models still hand the engine host memory (their initial values, their parameters' pointers). */
    mt_device_table_t device;
    void *stream;
} mt_engine_params_t;

#define MT_ENGINE_PARAM_HELD 1u /* laid out, bound and updated by this engine */
#define MT_ENGINE_PARAM_NORM 2u /* counted in mt_engine_grad_sumsq (a copy counted elsewhere: clear it) */
/* ZeRO-2/3: the gradient is reduce-scattered once per step instead of every backward pass, because it is
 * completed only after the last pass (a tied parameter whose other reader is on another pipeline stage:
 * the stages' sums over the embedding group must see whole-step gradients on both sides). */
#define MT_ENGINE_PARAM_ONCE 4u

#define MT_ENGINE_PARAMS_INIT                                                                                          \
    {                                                                                                                  \
        .size = sizeof(mt_engine_params_t), .kind = MT_ENGINE_DDP, .zero_stage = 1, .grad_accum = 1,                   \
        .bucket_mb = 25.0, .first_bucket_mb = 1.0, .persist_threshold = 0, .optim = MT_OPTIM_PARAMS_INIT,              \
        .param_flags = NULL, .device = NULL, .stream = NULL                                                            \
    }

typedef struct mt_engine *mt_engine_t;

/* Parses "dp" / "ddp" / "zero"; false on anything else. */
bool mt_engine_kind_parse(const char *s, mt_engine_kind_t *out);
/* "dp", "ddp", "zero-1", "zero-2", "zero-3". */
const char *mt_engine_name(mt_engine_t e);

/* Creates an engine over the data-parallel group dp (host-memory communicator; the caller keeps it and
 * frees it after mt_engine_free). Collective over dp. The model must be built with no storage bound:
 * the engine lays out parameters and gradients in its own flat buffers (units padded so every shard is
 * equal and 64-byte aligned), binds p->data / p->grad, writes the initial weights (layout-independent:
 * rank 0 initialises and broadcasts for replicated layouts, every rank initialises its own shard under
 * ZeRO-3), registers what this rank owns with its optimizer, and installs its model hooks. Every host
 * buffer is allocated with mt_alloc under its category (params, grads, optimizer, comm).
 * Errors: MT_ERR_INVALID_ARG naming the bad field (zero_stage, grad_accum, bucket sizes, a model with
 * storage already bound or tp_size > 1), MT_ERR_OOM, communicator errors. On error nothing is left
 * allocated and the model's hooks are removed. */
mt_status_t mt_engine_init(mt_model_t model, mt_comm_t dp, const mt_engine_params_t *params, mt_engine_t *out);

/* Removes the hooks and frees everything the engine allocated (the model's p->data/p->grad then
 * dangle: free the model next or bind new storage). Waits (with the comm's timeout) for outstanding
 * communication. NULL is a no-op. */
void mt_engine_free(mt_engine_t e);

/* ---- one step, as the training loop runs it ----------------------------------------------------
 *   mt_engine_zero_grads(e);                      begin the step
 *   for each of grad_accum micro-batches:
 *       [DP: mt_engine_scatter_batch(...) for tokens and targets]
 *       mt_model_forward(...); mt_model_backward(..., 1.0f / grad_accum);   (the hooks fire)
 *   mt_engine_finish_grads(e);                    outstanding gradient communication completes
 *   mt_engine_grad_sumsq(e, &total);              coef = mt_clip_coef(total, max_norm, &norm)
 *   mt_engine_reduce_loss(e, &loss);              the global-batch mean for reporting
 *   mt_engine_step(e, lr, coef);                  optimizer over what this rank owns, parameters whole again
 * Gradient communication: DP, DDP, ZeRO-1 communicate once per step (on the last micro-batch);
 * ZeRO-2/3 reduce-scatter every micro-batch, because they keep no full-size gradient to accumulate
 * into (docs/parallel.md). All blocking waits use the communicator's timeout (MT_ERR_TIMEOUT names
 * the operation). */

/* Begins a step: zeroes what this rank accumulates gradients into and resets the step's accounting. */
mt_status_t mt_engine_zero_grads(mt_engine_t e);

/* Whether the engine's root loads the whole batch and scatters it (DP: true). Otherwise every rank
 * loads its own contiguous slice of the global batch (rows [r*B/N, (r+1)*B/N)). */
bool mt_engine_root_loads_batch(mt_engine_t e);

/* DP's data path: root (dp rank 0) holds a micro-batch of the whole group, dp_size * n int32 values in
 * root_buf (rank order: rank r's rows at r*n); every rank receives its n values in buf (point-to-point
 * sends from the root, counted in the step's bytes_other). root_buf is read on the root only (NULL
 * elsewhere). Other engines load their slice directly: MT_ERR_INVALID_USAGE. */
mt_status_t mt_engine_scatter_batch(mt_engine_t e, const int32_t *root_buf, int32_t *buf, size_t n);

/* Completes the step's gradient communication (launching any bucket whose gradients were never
 * signalled complete, e.g. a module range that did not run); afterwards what this rank owns holds the
 * gradient of the global-batch mean loss. */
mt_status_t mt_engine_finish_grads(mt_engine_t e);

/* Sum of squares of the whole model's averaged gradient: each rank sums what it owns (replicas: an
 * equal 1/N share), combined with an all-reduce over dp, so every rank gets the same total. With
 * param_flags: only the held parameters marked MT_ENGINE_PARAM_NORM (the caller adds the other
 * pipeline stages' and tensor-parallel ranks' sums over its own groups). */
mt_status_t mt_engine_grad_sumsq(mt_engine_t e, double *total);

/* In place: this rank's mean loss of the step -> the mean over the group (all-reduce). */
mt_status_t mt_engine_reduce_loss(mt_engine_t e, double *loss);

/* Optimizer step over what this rank owns at lr, gradients multiplied by grad_scale (the clipping
 * coefficient), then the parameters are made whole again (ZeRO-1/2: all-gather of the updated shards;
 * DP: the root steps and broadcasts its parameters; ZeRO-3: gathered at their next use). */
mt_status_t mt_engine_step(mt_engine_t e, float lr, float grad_scale);

/* Copies the full parameters, in registration order (mt_model_numel floats, p->offset layout), into out
 * on dp rank root (out is not touched elsewhere and may be NULL there). Collective over dp; call it
 * between steps. For tests and checkpoints; its traffic is not counted in the step's bytes. */
mt_status_t mt_engine_gather_params(mt_engine_t e, int root, float *out);

/* Whether parameter i's gradient storage accumulates every backward pass of a step (DDP, ZeRO-1, replicated
 * units, MT_ENGINE_PARAM_ONCE units) rather than being moved into the rank's shard after each pass (ZeRO-2/3
 * sharded units); false for a parameter the engine does not hold. For callers that reduce gradients of each
 * pass before the engine sees them (the sequence-parallel sum over tp): accumulated ones are reduced once. */
bool mt_engine_grad_accumulates(mt_engine_t e, int i);

/* The optimizer over what this rank owns (NULL on DP's ranks other than 0); its step counter is the
 * same on every rank that has one (mt_optim_get_step / set_step for checkpoints). */
mt_optim_t mt_engine_optim(mt_engine_t e);

/* ---- state in the layout-free form (checkpoints) -------------------------------------------------
 * Parameters, or the optimizer's first moment (AdamW m, SGD momentum buffer) or second moment (AdamW
 * v), as mt_model_numel floats in registration order (p->offset), independent of engine, rank count
 * and bucket size: state gathered from one engine scatters into any other. Collective over dp; call
 * between steps; not counted in the step's bytes. */
typedef enum { MT_ENGINE_STATE_PARAMS = 0, MT_ENGINE_STATE_OPT_M = 1, MT_ENGINE_STATE_OPT_V = 2 } mt_engine_state_t;

/* Collects state `what` into out on dp rank root (out may be NULL elsewhere). MT_ERR_INVALID_ARG for a
 * moment the optimizer does not keep, or DP's optimizer state with a root other than 0. */
mt_status_t mt_engine_gather_state(mt_engine_t e, mt_engine_state_t what, int root, float *out);

/* The reverse: root's in (mt_model_numel floats) becomes this engine's state, every rank storing what it
 * keeps (replicas all of it, shards their slice). ZeRO-3 drops gathered copies first. */
mt_status_t mt_engine_scatter_state(mt_engine_t e, mt_engine_state_t what, int root, const float *in);

/* ---- accounting --------------------------------------------------------------------------------
 * Bytes sent per rank are counted at every collective the engine issues, as the per-rank average of a
 * bandwidth-optimal algorithm (what the nccl-tests bus bandwidth assumes), for a group of N ranks and
 * b bytes of buffer per rank:
 *   all_reduce(b)               2 b (N-1)/N
 *   reduce_scatter(b = N * c)   b (N-1)/N          (c bytes received per rank)
 *   all_gather(b = N * c)       b (N-1)/N
 *   broadcast(b), reduce(b)     b (N-1)/N          (a pipelined chain: N-1 of the N ranks send b)
 *   send(b)                     b                   (point-to-point: exactly what this rank sends)
 * so DDP and ZeRO-1/2 send 2Ψ(N-1)/N elements' worth per step (Ψ: parameters, padded per unit for
 * ZeRO), ZeRO-3 3Ψ(N-1)/N per micro-batch (plus 2x a tied parameter's unit, gathered again for the
 * module that shares it), DP 2Ψ(N-1)/N without any overlap, plus the batch its root scatters. */
typedef struct {
    double bytes_model;    /* gradients and parameters moved this step (the figure theory predicts) */
    double bytes_other;    /* loss, norm and batch traffic this step */
    int64_t n_calls;       /* collectives issued this step */
    double t_backward_end; /* mt_now() at the last post_backward of the step's last micro-batch */
    double t_comm_first;   /* launch of the first gradient collective of the last micro-batch */
    double t_comm_done;    /* completion of the last one (first observed: polled at every hook) */
    double comm_busy_s;    /* length of the union of [launch, done] of those gradient collectives */
    double comm_hidden_s;  /* the part of that union before t_backward_end */
    double wait_s;         /* time spent blocked on communication this step (finish, gathers, step) */
} mt_engine_comm_stats_t;

/* The figures of the last completed step (after mt_engine_step). */
void mt_engine_comm_stats(mt_engine_t e, mt_engine_comm_stats_t *out);

typedef struct {
    int64_t params, grads, optimizer, comm; /* bytes this engine holds now, by category (allocator sizes) */
    int64_t comm_peak;                      /* most comm bytes held at once (bucket and gather pools) */
    int64_t numel;                          /* Ψ: model parameters */
    int64_t numel_padded;                   /* Ψ rounded up per unit so every shard is equal and aligned */
    int64_t numel_persist;                  /* ZeRO-3: parameters kept whole (below persist_threshold) */
    int64_t max_unit;                       /* elements of the largest communication unit (bucket/module) */
    int n_units;                            /* buckets (DDP, ZeRO-1/2) or modules' units (ZeRO-3) */
    int n_tied_units;                       /* sharded units read by a second module (GPT-2's wte) */
    int max_module_units;                   /* most sharded units one module reads or writes */
    int grad_buffers, param_buffers;        /* ZeRO-2/3 pooled bucket / gathered-parameter buffers */
} mt_engine_mem_t;

/* Per-category bytes of the engine's storage, read from the allocator. */
void mt_engine_mem(mt_engine_t e, mt_engine_mem_t *out);

/* What an engine of these params over `size` ranks would hold on dp rank `rank` for model (built, no storage
 * bound), computed by the code that lays out and allocates it (bucket.c), without a communicator and without
 * allocating storage: params, grads and optimizer exactly as mt_engine_mem reports them after
 * mt_engine_init, comm at the most the pools can hold. For `meshtrain plan`. MT_ERR_INVALID_ARG on bad
 * arguments. */
mt_status_t mt_engine_plan_mem(mt_model_t model, int size, int rank, const mt_engine_params_t *params,
                               mt_engine_mem_t *out);

#ifdef __cplusplus
}
#endif
#endif /* MT_ENGINE_H */
