/* Pipeline parallelism: the model's module list split into pp contiguous stages, one per rank of the
 * pipeline communicator, run over the step's gradient-accumulation micro-batches with the GPipe or 1F1B
 * schedule. Activations go to the next stage and their gradients back with send/recv on the pp
 * communicator, each message tagged with its micro-batch; the tied token embedding (first and last
 * stage) has its gradient summed over the embedding group. The schedules are in pipeline_sched.c.
 * SPDX-License-Identifier: MIT */
#ifndef MT_PIPELINE_H
#define MT_PIPELINE_H

#include <stdbool.h>
#include <stdint.h>

#include "collectives/coll.h"
#include "models/model.h"
#include "runtime/device.h"
#include "runtime/mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MT_PP_GPIPE = 0, MT_PP_1F1B = 1 } mt_pp_schedule_t;

/* "gpipe" / "1f1b" (parallel.schedule); false for anything else. */
bool mt_pp_schedule_parse(const char *s, mt_pp_schedule_t *out);
const char *mt_pp_schedule_name(mt_pp_schedule_t s);

/* Splits the model's modules [0, n) into pp contiguous non-empty stages: stage s runs modules
 * [bounds[s], bounds[s+1]), bounds has pp + 1 entries, bounds[0] = 0, bounds[pp] = n.
 * stage_layers NULL or "": balanced by compute, minimising the most expensive stage. The cost of a
 * module is the number of elements of the 2-D weights it multiplies by per token: its own 2-D
 * parameters, except those tied to another module (a tied weight is charged to the module that
 * multiplies by it: GPT-2's head reads wte as a matrix, the embedding only looks rows up), plus the
 * tied weights it reads, times 4/3 for the head under model.head_chunks > 1 (its product recomputed in
 * backward); a module without such weights costs as much as 1% of the average block.
 * stage_layers "3,3,2,2": the number of middle modules (GPT-2: transformer blocks) of each stage, one
 * entry per stage; the first stage also gets module 0 (the embedding) and the last the last module
 * (the head). Errors (MT_ERR_INVALID_ARG, naming the key parallel.stage_layers and the fix): wrong
 * number of entries, a non-integer or negative entry, counts not summing to the number of blocks, an
 * empty stage, or pp larger than the number of modules. */
mt_status_t mt_pipeline_split(mt_model_t model, int pp, const char *stage_layers, int *bounds);

typedef struct {
    size_t size;               /* sizeof(mt_pipeline_params_t) */
    mt_pp_schedule_t schedule; /* parallel.schedule */
    int microbatches;          /* m: micro-batches per step (the gradient-accumulation count), >= 1 */
    int micro_batch;           /* B: sequences per micro-batch */
    int seq_len;               /* T: tokens per sequence (<= the model's seq_len) */
    const char *stage_layers;  /* parallel.stage_layers; NULL or "" = balanced */
    double timeout_s;          /* longest wait for a neighbour's message; <= 0: the comm's default */
    /* Called on the step's last backward pass once module m's gradients are complete on this stage, before
     * the hooks that were installed when the pipeline was created (a data-parallel engine's) see them:
     * the place for reductions that must precede data-parallel gradient communication, e.g. the
     * sequence-parallel sum over tp. NULL: none. */
    mt_status_t (*grads_ready)(void *arg, int module);
    void *grads_ready_arg;
    /* Call grads_ready after every backward pass instead of the last only: for engines that take each
     * pass's gradients away into fresh buffers (ZeRO-2/3 reduce-scatter per micro-batch). */
    bool grads_ready_each_pass;
    /* The device table the stage's own memory lives on and its element-wise work runs on (runtime/device.h):
     * the parameter and gradient storage of mt_pipeline_alloc_params, the neighbour message buffers and their
     * tags, gradient zeroing and the norm's sums of squares; and its stream. NULL: the CPU table. Only devices
     * whose memory the host reads (mt_device_is_host) are accepted today: the model computes on host memory. */
    mt_device_table_t device;
    void *stream;
} mt_pipeline_params_t;

#define MT_PIPELINE_PARAMS_INIT                                                                                        \
    {                                                                                                                  \
        .size = sizeof(mt_pipeline_params_t), .schedule = MT_PP_1F1B, .microbatches = 1, .micro_batch = 1,             \
        .seq_len = 1, .stage_layers = NULL, .timeout_s = 0.0, .grads_ready = NULL, .grads_ready_arg = NULL,            \
        .grads_ready_each_pass = false, .device = NULL, .stream = NULL                                                 \
    }

typedef struct mt_pipeline *mt_pipeline_t;

/* Creates this rank's stage of the pipeline. model: built, identical on every stage (its parameters
 * need not be bound yet). The pipeline wraps the model's hooks: hooks installed before this call (a
 * data-parallel engine's) keep running around every module, after the pipeline's own work; they are
 * restored by mt_pipeline_free. pp_comm: the pipeline group; this rank's index in it is its stage (NULL or a
 * 1-rank comm: one stage runs the whole model). emb_comm: the embedding group (first and last stage,
 * mt_mesh_embedding_group) on those two stages, NULL elsewhere and when pp = 1. The model and comms are
 * borrowed and must outlive the pipeline. Collective over pp_comm (checks that every stage agrees on
 * the split and the shapes). Errors: MT_ERR_INVALID_ARG naming the bad field (m < 1, B < 1, T outside
 * [1, seq_len], a bad split), MT_ERR_OOM. */
mt_status_t mt_pipeline_init(mt_model_t model, mt_comm_t pp_comm, mt_comm_t emb_comm, const mt_pipeline_params_t *p,
                             mt_pipeline_t *out);

/* Frees the pipeline, its activations and buffers, and the parameter storage it allocated itself
 * (mt_pipeline_alloc_params); never storage bound by someone else. NULL is a no-op. */
void mt_pipeline_free(mt_pipeline_t pl);

int mt_pipeline_stage(mt_pipeline_t pl);
int mt_pipeline_n_stages(mt_pipeline_t pl);
/* This stage's modules [*lo, *hi). */
void mt_pipeline_range(mt_pipeline_t pl, int *lo, int *hi);
/* Whether this stage reads parameter i (it belongs to one of the stage's modules, or is tied to one),
 * and whether it owns it (its owning module is on this stage: the copy that counts once in norms and
 * that gathers report; a tied copy on the last stage is read but not owned). */
bool mt_pipeline_needs_param(mt_pipeline_t pl, int i);
bool mt_pipeline_owns_param(mt_pipeline_t pl, int i);

/* Allocates contiguous parameter (MT_MEM_PARAMS) and zeroed gradient (MT_MEM_GRADS) storage for the
 * parameters this stage needs, binds p->data / p->grad to it and writes the initial values (from
 * global element indices, so they equal the single-process model's). Parameters of other stages stay
 * unbound. For a stage not composed with a data-parallel engine that binds storage itself. */
mt_status_t mt_pipeline_alloc_params(mt_pipeline_t pl);

/* Zeroes the gradients of the stage's parameters: the storage of mt_pipeline_alloc_params through the
 * pipeline's device table, else every bound p->grad (mt_model_zero_grads). */
mt_status_t mt_pipeline_zero_grads(mt_pipeline_t pl);

/* One step's forward and backward over the m micro-batches with the configured schedule.
 *   tokens  (m*B, T) int32: this step's sequences, micro-batch k = rows [k*B, (k+1)*B). Read on the
 *           first stage only (may be NULL elsewhere).
 *   targets (m*B, T) int32: read on the last stage only (may be NULL elsewhere).
 *   loss    (may be NULL) on every stage: the mean of the m micro-batch losses, which equals the mean
 *           cross-entropy over the whole batch when no target is ignored (the last stage computes it
 *           and broadcasts it over pp_comm).
 * Gradients ACCUMULATE (+=) into the bound p->grad with loss_grad_scale 1/m, so after the step they
 * are the gradient of the batch mean, as in the single-process run; the caller zeroes them between
 * steps. The gradients of tied parameters are summed over emb_comm so both copies hold the same (whole)
 * gradient: on the owning (first) stage right after its last backward of the owning module, before the
 * wrapped hooks see it, on the other (last) stage after the schedule, so a data-parallel engine's
 * reduction, launched from its hooks or its finish, always sees the summed gradient. Collective over pp_comm and
 * emb_comm. Errors: the model's (bad token), MT_ERR_TIMEOUT naming the stage, peer and micro-batch a message was
 * awaited for, MT_ERR_INTERNAL for a message tagged with the wrong micro-batch, the comm's errors. */
mt_status_t mt_pipeline_step(mt_pipeline_t pl, const int32_t *tokens, const int32_t *targets, float *loss);

/* Forward only (evaluation) over the m micro-batches, GPipe order, no gradients, activations released as
 * each micro-batch finishes: *loss (may be NULL) on every stage as in mt_pipeline_step. Collective over
 * pp_comm. */
mt_status_t mt_pipeline_eval(mt_pipeline_t pl, const int32_t *tokens, const int32_t *targets, float *loss);

/* Sum of squares of the gradients this stage owns (tied copies counted once), summed over pp_comm:
 * the same total on every stage, for global-norm clipping (mt_clip_coef). Collective over pp_comm. */
mt_status_t mt_pipeline_grad_sumsq(mt_pipeline_t pl, double *total);

/* Copies parameter i's data from the stage that owns it to pp_comm rank root (out: numel floats, used
 * on root only). Collective over pp_comm. */
mt_status_t mt_pipeline_gather_param(mt_pipeline_t pl, int i, int root, float *out);

/* What the last step did on this stage. */
typedef struct {
    int max_in_flight;        /* most micro-batches whose activations were held at once */
    int n_acts;               /* activation objects allocated (the pool: m for GPipe, pp - stage for 1F1B) */
    double step_s;            /* wall time of mt_pipeline_step up to (not including) the loss broadcast */
    double compute_s;         /* time in forward and backward of the stage's modules */
    double comm_wait_s;       /* time in send/recv with the neighbours (includes waiting for them) */
    int64_t n_sends, n_recvs; /* point-to-point messages of the step */
    int n_backward;           /* backward passes run */
    int64_t bytes_sent;       /* activations and their gradients sent to the neighbours (payload + tag float) */
    int64_t bytes_tied;       /* the tied gradients' all-reduce over emb_comm (2b(n-1)/n, docs/metrics.md) */
    int64_t bytes_loss;       /* the loss broadcast from the last stage (b(n-1)/n) */
} mt_pipeline_stats_t;

void mt_pipeline_stats(mt_pipeline_t pl, mt_pipeline_stats_t *out);

/* The most micro-batches of activations the schedule holds at once on stage s of p with m micro-batches:
 * m for GPipe, min(p - s, m) for 1F1B. */
int mt_pipeline_max_in_flight(mt_pp_schedule_t schedule, int p, int s, int m);

#ifdef __cplusplus
}
#endif
#endif /* MT_PIPELINE_H */
