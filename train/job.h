/* The training loop as a library: build the model from the config, then per step load the batch,
 * run forward/backward over the micro-batches (gradients averaged exactly as one big batch), clip by
 * global norm, step the optimizer, evaluate every train.eval_every steps and print a progress line.
 * Parallel engines plug in through mt_job_engine_t: they own parameter and gradient storage, hook the
 * model's modules, finish gradient communication, and compute the norm and the step over what their
 * rank owns. mt_job_run returns every step's loss so runs can be compared exactly.
 * SPDX-License-Identifier: MIT */
#ifndef MT_JOB_H
#define MT_JOB_H

#include <mpi.h>
#include <stdio.h>

#include "models/data/data.h"
#include "models/model.h"
#include "models/optim/optim.h"
#include "parallel/settings.h"
#include "runtime/config.h"
#include "runtime/precision.h"

#include "runtime/alloc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What an engine is told about the job when it is created. Pointers are valid for the whole run. */
typedef struct {
    const mt_config_t *cfg;
    const mt_settings_t *set; /* the parallel, precision and optimizer settings, read once from cfg */
    mt_model_t model;         /* built, no storage bound yet: the engine binds p->data / p->grad */
    mt_optim_params_t optim;  /* set->optim */
    const char *init_llmc;   /* model.init = "llmc:PATH": PATH, loaded after the random init; else NULL */
    int64_t global_batch;    /* sequences per step over all dp ranks */
    int64_t micro_batch;     /* sequences per micro-batch on this rank */
    int64_t grad_accum;      /* micro-batches per step on this rank */
    int64_t seq_len;
    int dp_rank, dp_size;       /* this rank's slice of the global batch */
    MPI_Comm comm;              /* the job's world communicator */
    const struct mt_mesh *mesh; /* the device mesh (opts.mesh); NULL: dp = the whole world */
} mt_job_info_t;

/* A piece of a global tensor held in an engine's storage, for checkpoints: the box [lo, hi) of the
 * tensor's global (unsharded) shape, stored contiguously in row-major order at data. A 1-D tensor has
 * ndim 1 and uses lo[0]/hi[0]. Tensor names: "param/NAME" for parameter NAME, "adamw.m/NAME",
 * "adamw.v/NAME" and "sgd.momentum/NAME" for the optimizer state of that parameter. */
#define MT_CKPT_NAME_MAX 96
typedef struct {
    char tensor[MT_CKPT_NAME_MAX];
    int ndim;
    int64_t shape[2];     /* global shape */
    int64_t lo[2], hi[2]; /* the box, 0 <= lo < hi <= shape per dimension */
    float *data;
    int64_t ld; /* 2-D: elements from one row of data to the next; 0 = the box's width (contiguous) */
} mt_ckpt_piece_t;

/* A data-parallel (or other) engine. The loop calls, per step:
 *   zero_grads; for each micro-batch: forward + backward of the whole model (the engine's model hooks
 *   run around every module); finish_grads; grad_sumsq; step(lr, clip coefficient); reduce_loss.
 * Every function returns a status; a failure stops the run with that status. */
typedef struct {
    const char *name;
    /* Binds p->data and p->grad of every parameter (storage the engine owns), writes the initial weights
     * (mt_model_init_weights / mt_model_param_init_values, then the checkpoint info->init_llmc), creates its optimizer
     * over what this rank owns, and installs its hooks with mt_model_set_hooks. *ctx is passed to everything below. */
    mt_status_t (*init)(const mt_job_info_t *info, void **ctx);
    /* Zeroes the gradients this rank accumulates into before the first micro-batch of a step. */
    mt_status_t (*zero_grads)(void *ctx);
    /* After the last micro-batch's backward: completes outstanding gradient communication so the
     * gradients of what this rank owns are the global-batch average. */
    mt_status_t (*finish_grads)(void *ctx);
    /* The sum of squares of the whole model's averaged gradient (over all ranks: each contributes the
     * partial sum of what it owns, combined with an all-reduce), so clipping uses the global norm. */
    mt_status_t (*grad_sumsq)(void *ctx, double *total);
    /* Optimizer step over what this rank owns at learning rate lr, each gradient multiplied by
     * grad_scale (the clipping coefficient), then whatever makes the parameters whole again. */
    mt_status_t (*step)(void *ctx, float lr, float grad_scale);
    /* Turns this rank's mean loss of the step into the global-batch mean (in place), for reporting. */
    mt_status_t (*reduce_loss)(void *ctx, double *loss);
    void (*free)(void *ctx);
    /* Checkpoints (NULL: this engine cannot be checkpointed; checkpoint.dir is then refused). Lists the
     * pieces of global tensors in this rank's storage: save = true the pieces this rank writes (over all
     * ranks, each element of each tensor written exactly once), save = false every piece it holds (a
     * load fills them all). *pieces is malloc'd; the caller frees it. */
    mt_status_t (*ckpt_pieces)(void *ctx, bool save, mt_ckpt_piece_t **pieces, int *n);
    /* The optimizer's step count (AdamW's t) for the manifest, and setting it on resume. */
    int64_t (*ckpt_get_step)(void *ctx);
    void (*ckpt_set_step)(void *ctx, int64_t t);
    /* After a load filled the pieces: whatever makes derived copies consistent again. May be NULL. */
    mt_status_t (*ckpt_loaded)(void *ctx);
    /* Optional (NULL: not needed), called before the model is built, with info's cfg, set, comm, mesh, dp,
     * batch (global_batch, micro_batch, grad_accum) and optim fields set: creates what the model needs (the tensor-parallel communicator) and fills the model
     * configuration's tensor-parallel fields. *ctx (NULL on entry) is then handed to init; whatever
     * happens, the loop frees it with free() at the end (so init leaves it in place on failure). */
    mt_status_t (*setup_model)(const mt_job_info_t *info, mt_model_config_t *mc, void **ctx);
    /* Optional (NULL: the loop runs forward/backward of the whole model itself): forward (and, with
     * backward, backward with gradients accumulated as the loop would) of one step's batch b over
     * info->grad_accum micro-batches, e.g. by a pipeline schedule; *loss = this rank's mean loss of the
     * batch before reduce_loss. */
    mt_status_t (*run_batch)(void *ctx, const mt_batch_t *b, bool backward, double *loss);
    /* Optional: seconds this rank spent blocked in communication inside forward and backward since the
     * last call (tensor-parallel collectives, pipeline messages); the loop reports them as exposed
     * communication instead of compute. */
    double (*take_comm_s)(void *ctx);
    /* Optional batch distribution (NULL: every rank loads its own rows of each training batch from its own
     * loader). Asked once after init: true when the engine's data path is the DataParallel one, where dp
     * rank 0 alone opens the training data and loads the rows of its whole dp group (the step's global
     * batch) and the other ranks open none. The loop then calls scatter_micro_batch, collectively over the
     * dp group, before the forward of each micro-batch k (0 <= k < grad_accum): group is the group's batch
     * on dp rank 0 (dp_size x micro_batch x grad_accum rows; rank r's rows are the contiguous block
     * [r * rows, (r+1) * rows) a per-rank loader would have given it) and NULL elsewhere; inputs and
     * targets (micro_batch x seq_len each, the loop's buffers) receive this rank's rows of micro-batch k.
     * The bytes sent count in the engine's step account (comm_bytes). Evaluation batches stay per rank. */
    bool (*root_loads_batch)(void *ctx);
    mt_status_t (*scatter_micro_batch)(void *ctx, const mt_batch_t *group, int64_t k, int32_t *inputs,
                                       int32_t *targets);
    /* Optional: bytes this rank sent in the last step, gradients and parameters (model) and everything
     * else: loss, norm, scattered batches (other), as the engine counts them; reported in the metrics. */
    void (*comm_bytes)(void *ctx, double *model, double *other);
    /* Optional, with comm_bytes: the same step's bytes by parallel group, tensor-parallel, pipeline and
     * data-parallel (model = tp + pp + dp), reported beside model and other. */
    void (*comm_bytes_groups)(void *ctx, double *tp, double *pp, double *dp);
    /* The engine computes in precision.compute (fp32, tf32, bf16, fp16) itself, rounding and (fp16) loss
     * scaling on its device; false: the loop does both (the model's CPU emulation and the loop's scaler). */
    bool any_precision;
    /* The engine holds the activations itself (on its device): the loop allocates none for the model. */
    bool own_activations;
    /* The engine runs pipeline stages itself over info->mesh's pp groups (tp = 1), in run_batch. */
    bool pipelines;
    /* Optional: joules this rank's device used since the last call (the loop calls it once per step);
     * false when unknown (no NVML, no energy counter): the step metrics then carry no energy figures. */
    bool (*step_energy)(void *ctx, double *joules);
    /* Optional (NULL: the CPU's sgemm rate): this rank's peak FLOP/s for MFU (0: unknown, no MFU), with
     * where it comes from in src (len bytes); the loop sums it over the ranks. */
    double (*peak_flops)(void *ctx, char *src, size_t len);
    /* Optional: more about the engine for the start-up line after its name (e.g. how gradients are
     * averaged over dp), or NULL; the string lives as long as ctx. */
    const char *(*describe)(void *ctx);
    /* Optional (NULL, or returning NULL: the loop's own): the dynamic loss scaler of an any_precision engine
     * that scales on its device (fp16). The loop reports its scale and the steps it skipped, and checkpoints
     * save and restore its scale and clean-step count in the manifest's "precision" section. */
    mt_loss_scaler_t *(*loss_scaler)(void *ctx);
    /* Optional (NULL: host memory is the job's memory): this rank's device memory, the statistics of the
     * engine's device allocator by category (current, peak, total peak, as mt_mem_stats) and the bytes it
     * holds from the driver (*reserved). The metrics then report device bytes in mem_bytes and in the
     * result's mem_peak, with the host's peak next to them. */
    void (*device_mem)(void *ctx, mt_mem_stats_t *stats, int64_t *reserved);
    /* Optional, both or neither (NULL: evaluation calls run_batch, or the loop's forward, batch by batch, and
     * reduce_loss after each chunk of them):
     * evaluation without a wait per batch. eval_batch queues the forward of validation batch b into slot i
     * (0 <= i < MT_JOB_EVAL_CHUNK) and returns without waiting for it; eval_losses waits once for slots
     * [0, n) and gives losses[i] = this rank's mean loss of slot i's batch, as run_batch's *loss, before
     * reduce_loss. The loop calls eval_losses after at most MT_JOB_EVAL_CHUNK eval_batch calls. */
    mt_status_t (*eval_batch)(void *ctx, const mt_batch_t *b, int64_t i);
    mt_status_t (*eval_losses)(void *ctx, int64_t n, double *losses);
} mt_job_engine_t;

/* Validation batches an engine with eval_batch holds in flight: one wait per this many (train.eval_batches). */
#define MT_JOB_EVAL_CHUNK MT_SETTINGS_EVAL_CHUNK

/* The engine of a single process: the model's own flat buffers, one optimizer over every parameter
 * (weight decay on 2-D weights), nothing to communicate. */
const mt_job_engine_t *mt_job_engine_local(void);

/* The data-parallel engines of parallel/engine.h (DP, DDP, ZeRO-1/2/3, chosen by parallel.engine and
 * parallel.zero_stage, shaped by parallel.bucket_mb and parallel.zero_persist_threshold) over the dp
 * group of info->mesh (the whole world without a mesh), with checkpoints in every layout: each rank
 * saves what it owns (replicated tensors once, by dp rank 0) and loads whatever its layout holds. */
const mt_job_engine_t *mt_job_engine_parallel(void);

/* Tensor parallelism over the mesh's tp groups and pipeline parallelism over its pp groups
 * (parallel.schedule, parallel.stage_layers, parallel.sequence_parallel; one stage when pp = 1), composed
 * with data parallelism by the engines of parallel/engine.h over each stage's parameters, or by one
 * averaging all-reduce (parallel.dp_reduce): parallel/parallel3d.h driven by the loop, run_batch running
 * the pipeline schedule. Needs opts.mesh. The two tables differ only in name ("tensor-parallel" for
 * pp = 1, "pipeline"). */
const mt_job_engine_t *mt_job_engine_model_parallel(int pp);

/* GPT-2 on this rank's GPU (runtime.device = "cuda"; train/job_cuda.c): models/cuda/gpt2_cuda.h in
 * precision.compute, and with dp > 1 whole replicas whose gradients are averaged over NCCL on their own
 * stream (parallel.engine = "ddp": bucket by bucket during backward; "dp": after it). Refuses (as
 * MT_ERR_INVALID_ARG naming the key) tp or pp > 1, ZeRO, SGD, the MLP, a build without CUDA, no device. */
const mt_job_engine_t *mt_job_engine_cuda(void);

/* Whether `meshtrain train` trains on the GPU: runtime.device = "cuda" -> yes, or MT_ERR_INVALID_ARG naming
 * what the GPU path cannot run (the config key and what to use instead; no device on some rank; a build
 * without CUDA); "auto" -> yes when every rank sees a GPU and the config is one the GPU path runs (else
 * no, with a one-line note when GPUs were present); "cpu" -> no. Collective over comm: every rank gets
 * the same *use and status. note (note_len bytes) receives the note or "". */
/* The GPU engine's pipeline runs at most this many micro-batches per step (train/job_cuda_mp.c). */
#define MT_JOB_CUDA_MAX_PP_MICROBATCHES MT_SETTINGS_GPU_MAX_PP_MICROBATCHES

mt_status_t mt_job_cuda_choose(const mt_config_t *cfg, MPI_Comm comm, bool *use, char *note, size_t note_len);

typedef struct {
    size_t size;                   /* sizeof(mt_job_opts_t) */
    const mt_job_engine_t *engine; /* NULL: mt_job_engine_local() (requires a world of one rank) */
    FILE *progress;                /* progress lines on rank 0; NULL: none (stdout in `meshtrain train`) */
    bool prefetch;                 /* background data loading (default true) */
    int dp_rank, dp_size;          /* this rank's data-parallel coordinate, from the caller's device mesh;
                                    * dp_size 0: dp = world size and dp_rank = world rank (tp = pp = 1) */
    const char *mesh_desc;         /* the mesh in words for the start-up lines; NULL: "N ranks = dp N" */
    const struct mt_mesh *mesh;    /* the device mesh engines build their communicators from (borrowed);
                                    * NULL: data parallel over the whole world */
    int64_t stop_after;            /* > 0: stop once this many steps are done, as an interrupted job would
                                    * (the schedule still spans train.steps; for resume tests) */
} mt_job_opts_t;

#define MT_JOB_OPTS_INIT                                                                                               \
    {                                                                                                                  \
        .size = sizeof(mt_job_opts_t), .engine = NULL, .progress = NULL, .prefetch = true, .dp_rank = 0, .dp_size = 0, \
        .mesh_desc = NULL, .mesh = NULL, .stop_after = 0                                                               \
    }

typedef struct {
    int64_t n_steps;   /* steps run (== train.steps unless stopped early) */
    double *loss;      /* [n_steps] training loss of each step: mean cross-entropy over the global batch */
    float *lr;         /* [n_steps] learning rate used */
    double *grad_norm; /* [n_steps] global gradient norm before clipping */
    int64_t n_evals;
    int64_t *eval_step;            /* [n_evals] evaluation after this many steps */
    double *val_loss;              /* [n_evals] mean validation loss over train.eval_batches batches */
    int stop_signal; /* signal the run stopped on at a step boundary (0: none); exit 128 + it */
    int64_t n_skipped;             /* steps skipped for a non-finite loss/gradient (train.on_nan = skip) */
    int64_t n_overflow;            /* fp16: steps skipped for overflowed gradients (the loss scale halved) */
    float loss_scale;              /* the loss scale after the last step (1 unless precision.compute = fp16) */
    int64_t n_params;              /* parameters of the model */
    double seconds;                /* wall time of the training steps (excluding set-up and evaluation) */
    double tokens_per_s;           /* global tokens per second over the run */
    int64_t first_step;            /* steps before it were not run (resumed from a checkpoint): loss[s] = NAN there */
    double steady_tokens_per_s;    /* mean over the steady state (the steps after the first tenth, at least 1) */
    double mfu;                    /* model FLOP utilisation over the steady state (0 when the peak is unknown) */
    int64_t mem_peak[MT_MEM_NCAT]; /* highest bytes per allocator category over the run, max over ranks
                                    * (device memory when the engine reports it: device_mem) */
    int64_t mem_peak_total;        /* highest total, max over ranks (device memory, as mem_peak) */
} mt_job_result_t;

/* Runs the job the config describes. res (may be NULL) receives the per-step figures; free them with
 * mt_job_result_free. Collective over the world communicator: every rank returns the same status.
 * Errors: MT_ERR_INVALID_ARG for bad input (model shape, data files, a layout the engine cannot run)
 * with a message saying which key or file and how to fix it; MT_ERR_INTERNAL when a loss or gradient
 * turns non-finite with train.on_nan = "stop"; anything the model, data or engine return. */
mt_status_t mt_job_run(const mt_config_t *cfg, const mt_job_opts_t *opts, mt_job_result_t *res);

void mt_job_result_free(mt_job_result_t *res);

/* Reads the weights of a checkpoint written under any layout: path is a step directory (holding
 * manifest.json) or a checkpoint.dir (its `latest` is used). Builds *model from the configuration
 * recorded in the checkpoint with its own full parameter storage and fills it from the shard files
 * (every piece's CRC32C checked); *cfg_out (may be NULL) receives that configuration and from (may be
 * NULL) the step directory read. Local: no MPI.
 * Errors: MT_ERR_INVALID_ARG naming the file and the problem (missing, malformed, corrupt, truncated). */
mt_status_t mt_job_ckpt_read_model(const char *path, mt_model_t *model, mt_config_t **cfg_out, char *from,
                                   size_t from_len);

/* Fills a model configuration from the model.* keys and train.seed (tp_size 1): mt_model_config_keys of
 * models/model_config.c, the one mapping (model.init is not looked at; the loop uses mt_model_config_from). */
void mt_job_model_config(const mt_config_t *cfg, mt_model_config_t *out);


#ifdef __cplusplus
}
#endif
#endif /* MT_JOB_H */
