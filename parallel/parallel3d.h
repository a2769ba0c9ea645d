/* 3-D parallelism: tp x pp x dp = world. The world is laid out as a device mesh (runtime/mesh.h), one
 * communicator per axis group plus the embedding group; the model is built tensor-parallel over tp, run
 * as a pipeline stage over pp, and its gradients averaged over dp either by a data-parallel engine from
 * parallel/engine.h (DDP, ZeRO-1/2/3, holding only the stage's parameters) or by one built-in all-reduce
 * per step. Data: the same rows on every rank of a tp group, disjoint rows per dp rank; only the first
 * stage reads tokens, only the last targets. `meshtrain train` drives it phase by phase
 * (train/job_mp.c); mt_par3d_step runs one whole step. Combinations that cannot be run are refused by
 * mt_par3d_check with a message saying which and why.
 * SPDX-License-Identifier: MIT */
#ifndef MT_PARALLEL3D_H
#define MT_PARALLEL3D_H

#include <mpi.h>
#include <stdbool.h>

#include "models/model.h"
#include "models/optim/optim.h"
#include "parallel/engine.h"
#include "parallel/pipeline.h"
#include "parallel/tp.h"
#include "runtime/mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How gradients are averaged over the data-parallel group. */
typedef enum {
    MT_P3D_ALLREDUCE = 0, /* built in: one all-reduce of the stage's gradients per step, then the optimizer */
    MT_P3D_ENGINE = 1     /* a parallel/engine.h engine (engine_kind, zero_stage) */
} mt_p3d_dp_mode_t;

typedef struct {
    size_t size;               /* sizeof(mt_par3d_params_t) */
    int tp, pp, dp;            /* dp 0: world / (tp x pp) */
    const char *order;         /* mesh order, fastest first; NULL: "tp-dp-pp" */
    mt_pp_schedule_t schedule; /* parallel.schedule */
    int microbatches;          /* per dp rank per step (the gradient-accumulation count) */
    int micro_batch;           /* sequences per micro-batch */
    int seq_len;               /* tokens per sequence */
    const char *stage_layers;  /* parallel.stage_layers; NULL/"" balanced */
    bool sequence_parallel;    /* parallel.sequence_parallel */
    mt_p3d_dp_mode_t dp_mode;
    mt_engine_kind_t engine_kind; /* with MT_P3D_ENGINE: parallel.engine */
    int zero_stage;               /* with MT_ENGINE_ZERO */
    double bucket_mb;             /* engine gradient buckets (MiB) */
    mt_optim_params_t optim;
    float grad_clip;            /* clip to this global gradient norm (optimizer.grad_clip); 0 = off */
    bool skip_nonfinite;        /* train.on_nan = "skip": a non-finite loss or norm skips the update (else an error) */
    double timeout_s;           /* communicator timeout; <= 0: MESHTRAIN_COLL_TIMEOUT */
    int64_t persist_threshold;  /* ZeRO-3: parameters with fewer elements stay whole */
    const struct mt_mesh *mesh; /* borrowed, tp x pp x dp over world; NULL: built from tp, pp, dp and order */
    /* The device table every part's storage and element-wise work runs on (runtime/device.h): the engine's,
     * the pipeline's (stage storage, messages), the tp handle's buffers, the built-in all-reduce's buffer,
     * its optimizer and the norm's sums of squares; and its stream. NULL: the CPU table. Only devices whose
     * memory the host reads are accepted today (the model computes on host memory). */
    mt_device_table_t device;
    void *stream;
} mt_par3d_params_t;

#define MT_PAR3D_PARAMS_INIT                                                                                           \
    {                                                                                                                  \
        .size = sizeof(mt_par3d_params_t), .tp = 1, .pp = 1, .dp = 0, .order = NULL, .schedule = MT_PP_1F1B,           \
        .microbatches = 1, .micro_batch = 1, .seq_len = 1, .stage_layers = NULL, .sequence_parallel = false,           \
        .dp_mode = MT_P3D_ALLREDUCE, .engine_kind = MT_ENGINE_DDP, .zero_stage = 1, .bucket_mb = 25.0,                 \
        .optim = MT_OPTIM_PARAMS_INIT, .grad_clip = 0.0f, .skip_nonfinite = false, .timeout_s = 0.0,                   \
        .persist_threshold = 0, .mesh = NULL, .device = NULL, .stream = NULL                                           \
    }

/* Checks a combination before anything is allocated; pure arithmetic, so every rank reaches the same
 * verdict. MT_ERR_INVALID_ARG with a message naming the keys and the reason for: tp x pp x dp != world;
 * n_head or the padded vocabulary not divisible by tp; tp > 1 with a non-GPT-2 model or recompute;
 * sequence parallelism with micro_batch x seq_len not divisible by tp; engine "dp" (the DataParallel
 * baseline scatters batches from one root) with tp or pp > 1; a stage split that does not fit. Every
 * other engine composes with tp and pp, clipping included. */
mt_status_t mt_par3d_check(const mt_par3d_params_t *p, int world_size, const mt_model_config_t *mc);

typedef struct mt_par3d *mt_par3d_t;

/* Builds this rank's part: mesh, communicators (tp, pp, dp, embedding), the tensor-parallel model from
 * mc (tp fields filled here), its storage (engine, or the pipeline's own), the optimizer and the pipeline.
 * Initial weights equal the single-process model's. Collective over world. */
mt_status_t mt_par3d_init(MPI_Comm world, const mt_model_config_t *mc, const mt_par3d_params_t *p, mt_par3d_t *out);

/* mt_par3d_init in two halves, for a caller that builds the model itself (the training loop):
 * mt_par3d_setup checks p, creates the mesh (or borrows p->mesh) and communicators and fills mc's
 * tensor-parallel fields; the caller builds the model from mc (mt_model_init, no storage bound) and hands it
 * to mt_par3d_attach, which binds storage for this stage's parameters only (the engine's with param_flags,
 * or mt_pipeline_alloc_params), the optimizer and the pipeline. The model stays the caller's: free it after
 * mt_par3d_free. Both collective over world; on failure free p3 with mt_par3d_free. */
mt_status_t mt_par3d_setup(MPI_Comm world, mt_model_config_t *mc, const mt_par3d_params_t *p, mt_par3d_t *out);
mt_status_t mt_par3d_attach(mt_par3d_t p3, mt_model_t model);
void mt_par3d_free(mt_par3d_t p3);

/* This rank's mesh coordinates (MT_AXIS_TP, MT_AXIS_DP, MT_AXIS_PP) and the rows of the step's global
 * batch it reads: [*row0, *row0 + microbatches * micro_batch). */
void mt_par3d_coords(mt_par3d_t p3, int coords[MT_AXIS_N]);
void mt_par3d_rows(mt_par3d_t p3, int *row0, int *rows);
mt_model_t mt_par3d_model(mt_par3d_t p3);
mt_pipeline_t mt_par3d_pipeline(mt_par3d_t p3);
mt_tp_t mt_par3d_tp(mt_par3d_t p3);
/* The group communicator along one axis (MT_AXIS_TP, MT_AXIS_DP, MT_AXIS_PP). */
mt_comm_t mt_par3d_comm(mt_par3d_t p3, mt_axis_t axis);

/* One optimizer step: zero gradients, the pipeline over this rank's rows (tokens/targets (rows, T), read on
 * the first / last stage only; NULL elsewhere), gradient averaging over dp (with sequence parallelism the
 * replicated gradients are first summed over tp, module by module on the last backward pass), clipping
 * to grad_clip by the global norm (mt_par3d_grad_sumsq), the optimizer at lr. *loss (may be NULL): the
 * global batch's mean loss, on every rank. Collective over world. It is these phases, in this order:
 *   mt_par3d_zero_grads; mt_pipeline_step(mt_par3d_pipeline(p3), ...); mt_par3d_finish_grads;
 *   mt_par3d_reduce_loss; mt_par3d_grad_sumsq -> mt_clip_coef; mt_par3d_apply. */
mt_status_t mt_par3d_step(mt_par3d_t p3, const int32_t *tokens, const int32_t *targets, float lr, float *loss);

mt_status_t mt_par3d_zero_grads(mt_par3d_t p3);
/* After the schedule: the stage's gradients become the global batch's mean (engine or all-reduce). */
mt_status_t mt_par3d_finish_grads(mt_par3d_t p3);
/* In place: this dp rank's mean loss -> the mean over dp. */
mt_status_t mt_par3d_reduce_loss(mt_par3d_t p3, double *loss);
/* Sum of squares of the serial model's gradient, every element counted once (tp shards once each,
 * replicated parameters on tp rank 0, the tied embedding on the stage that owns it), the same on every
 * rank: reduced over dp (the engine's shards), tp and pp. */
mt_status_t mt_par3d_grad_sumsq(mt_par3d_t p3, double *total);
/* The optimizer over what this rank owns, gradients times grad_scale; parameters whole again after. */
mt_status_t mt_par3d_apply(mt_par3d_t p3, float lr, float grad_scale);

/* Per parameter of model, the MT_ENGINE_PARAM_* bits of stage `stage` of the split bounds (pp + 1 entries,
 * mt_pipeline_split) on tp rank tp_rank: HELD when the stage reads it (its modules' and the tied copy),
 * NORM when the stage owns it and it is sharded over tp or tp_rank is 0 (the copy counted in the norm and
 * written to checkpoints), ONCE when it is read on two stages (its gradient is complete only after the
 * schedule). Pure: the planner sizes an engine's stage storage with it. */
void mt_par3d_stage_flags(mt_model_t model, const int *bounds, int pp, int stage, int tp_rank, uint8_t *flags);

/* The engine (NULL with the built-in all-reduce), the optimizer over what this rank updates (the
 * engine's or the built-in one), and parameter i's MT_ENGINE_PARAM_* bits on this rank (HELD: its
 * stage reads it; NORM: this rank's copy is the one counted, and saved, for its dp replica). */
mt_engine_t mt_par3d_engine(mt_par3d_t p3);
mt_optim_t mt_par3d_optim(mt_par3d_t p3);
unsigned mt_par3d_param_flags(mt_par3d_t p3, int i);

/* Bytes this rank sent since mt_par3d_zero_grads (after mt_par3d_apply: the step's), each collective counted
 * as the per-rank bytes of a bandwidth-optimal algorithm (parallel/engine.h, accounting: an all-reduce of b
 * bytes over n ranks 2b(n-1)/n, a broadcast b(n-1)/n, a send b). Evaluation is not part of a step. */
typedef struct {
    double tp;    /* the tp group: the sharded layers' f/g collectives and the vocabulary-parallel cross-entropy's
                   * partials (max, sums) in forward and backward, the sequence-parallel gradient sums */
    double pp;    /* the pipeline: activations and their gradients sent to neighbouring stages (each message
                   * B*T*C floats plus one tag float), the all-reduce of the tied embedding's gradient */
    double dp;    /* the data-parallel group's gradients and parameters: the engine's (its bytes_model) or the
                   * built-in all-reduce of the stage's gradients */
    double other; /* scalars: the loss (pp broadcast, dp mean) and the norm (tp and pp sums), the engine's other */
} mt_par3d_bytes_t;

void mt_par3d_comm_bytes(mt_par3d_t p3, mt_par3d_bytes_t *out);

/* Whether the last step's update was skipped for a non-finite loss or norm (skip_nonfinite). A
 * non-finite step without skip_nonfinite fails with MT_ERR_INTERNAL (on every rank: the loss and norm
 * are reduced), leaving the parameters as they were. */
bool mt_par3d_last_skipped(mt_par3d_t p3);

/* Forward only over this rank's rows of an evaluation batch (as mt_par3d_step): *loss = the global batch's
 * mean loss on every rank. No gradients, no update. Collective over world. */
mt_status_t mt_par3d_eval(mt_par3d_t p3, const int32_t *tokens, const int32_t *targets, float *loss);

/* The global gradient norm of mt_par3d_step's last step before clipping (every rank the same). */
double mt_par3d_last_grad_norm(mt_par3d_t p3);

/* The whole parameter i on world rank 0 (out: global numel floats, used there only): from the dp-rank-0
 * replica of the stage that owns it, its tp shards assembled. Collective over world. */
mt_status_t mt_par3d_gather_param(mt_par3d_t p3, int i, float *out);

#ifdef __cplusplus
}
#endif
#endif /* MT_PARALLEL3D_H */
