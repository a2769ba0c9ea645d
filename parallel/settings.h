/* The job's layout and numerics, read once: every parallel.*, precision.* and optimizer.* setting parsed
 * (and the evaluation chunk the engines size their loss slots by) into typed fields by mt_settings_read
 * from a loaded config (runtime/config.h has validated each key's range and choices and the combinations,
 * and derived parallel.dp for the world it was loaded for). The training loop, the engine adapters, the
 * planner and the commands take these fields; none of them looks the keys up again. Strings point into
 * the config and live as long as it does.
 * SPDX-License-Identifier: MIT */
#ifndef MT_SETTINGS_H
#define MT_SETTINGS_H

#include <stdbool.h>
#include <stdint.h>

#include "models/optim/optim.h"
#include "parallel/engine.h"
#include "parallel/pipeline.h"
#include "runtime/config.h"
#include "runtime/matmul.h"
#include "runtime/precision.h"

#ifdef __cplusplus
extern "C" {
#endif

/* parallel.dp_reduce: how a model-parallel job (tp or pp > 1) averages gradients over dp. */
typedef enum {
    MT_DP_REDUCE_AUTO = 0,     /* the engine when dp > 1; nothing to average when dp = 1 */
    MT_DP_REDUCE_ENGINE = 1,   /* parallel.engine over each stage's parameters */
    MT_DP_REDUCE_ALLREDUCE = 2 /* one averaging all-reduce of the stage's gradients per step */
} mt_dp_reduce_t;

typedef struct {
    int tp, pp;                /* parallel.tp, parallel.pp */
    int dp;                    /* parallel.dp: derived from the world by the config's load; 0 = not known */
    const char *order;         /* parallel.order: "tp-dp-pp" and its permutations, or "auto" */
    mt_engine_kind_t engine;   /* parallel.engine */
    int zero_stage;            /* parallel.zero_stage, 1..3 (it applies when engine = zero) */
    double bucket_mb;          /* parallel.bucket_mb */
    int64_t persist_threshold; /* parallel.zero_persist_threshold */
    bool bucket_mb_set;        /* bucket_mb / persist_threshold were given (not the defaults) */
    bool persist_threshold_set;
    mt_pp_schedule_t schedule; /* parallel.schedule */
    int64_t microbatches;      /* parallel.microbatches: 0 or train.grad_accum (the load checks they agree) */
    const char *stage_layers;  /* parallel.stage_layers: "" = balanced */
    bool sequence_parallel;    /* parallel.sequence_parallel, as written (it acts only with tp > 1) */
    int tp_comm_chunks;        /* parallel.tp_comm_chunks */
    bool tp_comm_chunks_set;
    mt_dp_reduce_t dp_reduce; /* parallel.dp_reduce */
} mt_parallel_settings_t;

typedef struct {
    mt_prec_t compute;    /* precision.compute */
    float init_scale;     /* precision.init_scale (fp16) */
    int64_t scale_window; /* precision.scale_window (fp16) */
} mt_precision_settings_t;

/* How the CPU computes (the process-wide choices the training job applies at set-up). */
typedef struct {
    mt_matmul_lib_t matmul; /* runtime.matmul: who computes the matrix products (runtime/matmul.h) */
    bool baseline_kernels;  /* runtime.cpu_kernels = "baseline": not the AVX-512 build (models/layers/layers.h) */
} mt_cpu_settings_t;

typedef struct {
    mt_parallel_settings_t par;
    mt_precision_settings_t prec;
    mt_cpu_settings_t cpu;
    mt_optim_params_t optim; /* optimizer.kind, beta1, beta2, eps, weight_decay, momentum */
    mt_lr_sched_t lr;        /* optimizer.schedule, lr, min_lr, warmup_steps; total_steps = train.steps */
    float grad_clip;         /* optimizer.grad_clip (0: no clipping) */
    int64_t eval_chunk;      /* validation batches queued before one read of their losses: train.eval_batches
                              * up to MT_SETTINGS_EVAL_CHUNK; 0 without evaluation (train.eval_every = 0) */
} mt_settings_t;

/* The most validation batches an engine queues before reading their losses (its loss slots). */
#define MT_SETTINGS_EVAL_CHUNK 256
/* The GPU engine's pipeline (train/job_cuda_mp.c) runs at most this many micro-batches per step. */
#define MT_SETTINGS_GPU_MAX_PP_MICROBATCHES 2048

/* Fills *out from cfg. MT_ERR_INVALID_ARG naming the key for a value the schema would not have let through
 * (a config built by hand without mt_config_load). */
mt_status_t mt_settings_read(const mt_config_t *cfg, mt_settings_t *out);

/* Whether a model-parallel job averages gradients over dp with the engine (true) or with the built-in
 * all-reduce (false), for dp_reduce and the job's dp size. */
bool mt_settings_dp_engine(const mt_parallel_settings_t *p, int dp);

/* The ZeRO stage the data-parallel engine runs: zero_stage with engine = zero, else 0. */
static inline int mt_settings_zero(const mt_parallel_settings_t *p) {
    return p->engine == MT_ENGINE_ZERO ? p->zero_stage : 0;
}

#ifdef __cplusplus
}
#endif

#endif
