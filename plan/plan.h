/* The planner behind `meshtrain plan`: given a job (model, batch, optimizer) and a cluster (nodes x devices,
 * device memory and rate, links, or measured collective curves), enumerate every layout meshtrain can run
 * (tp, pp, dp, engine, schedule, micro-batch, sequence parallelism, recomputation, mesh order) and predict
 * per-rank memory by allocator category and the step time (compute + exposed communication + pipeline
 * bubble + optimizer). Memory is sized by the functions that size the real allocations (models/,
 * models/optim/, runtime/alloc.h); docs/planning.md describes the time model and its calibration.
 * SPDX-License-Identifier: MIT */
#ifndef MT_PLAN_H
#define MT_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "models/cuda/gpt2_cuda.h"
#include "models/model.h"
#include "models/optim/optim.h"
#include "parallel/settings.h"
#include "runtime/alloc.h"
#include "runtime/config.h"
#include "runtime/precision.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- cluster ---------------------------------------------------------------------------------- */

/* One link class: latency of a message and the bandwidth one rank gets for a collective over it (the
 * nccl-tests bus bandwidth: a ring all-reduce of b bytes takes latency*steps + 2(n-1)/n * b / bw). */
typedef struct {
    double latency_s;
    double bw; /* bytes/s */
} mt_plan_link_t;

/* A measured curve: `meshtrain bench coll --json` results of one op on `ranks` ranks: time (s) by size. */
#define MT_PLAN_MAX_CURVES 64
typedef struct {
    char op[24]; /* "allreduce", "reduce_scatter", "allgather", "sendrecv", ... */
    int ranks;
    bool inter; /* measured across nodes (bench.inter_json) rather than inside one (bench.intra_json) */
    int n;
    double *size; /* bytes, increasing */
    double *time; /* seconds */
} mt_plan_curve_t;

typedef struct {
    char name[128];
    char path[512];
    int nodes, devices_per_node;
    bool shared_node;             /* CPU nodes: rate, memory and bandwidth are the node's, split among its ranks */
    bool gpu;                     /* device.kind = "gpu": jobs run on the GPU engine (memory: plan_mem_gpu.c) */
    int cores_per_node;            /* shared nodes: cores; a rank runs on cores / ranks of them */
    double multithread_efficiency; /* a rank on k > 1 cores computes at k x this x one core's rate */
    double mem_bytes;             /* per device (per node when shared_node) */
    double peak_flops[MT_PREC_COUNT]; /* FLOP/s per device (per node when shared_node); 0 = not supported */
    double efficiency;            /* achieved fraction of peak on large matrix products (calibrated) */
    double eff_half_work;         /* B*T*C*(C/tp), the multiply-adds of one C x C/tp product of a micro-batch, at
                                   * which the efficiency is half of `efficiency` (smaller products run slower,
                                   * efficiency * w / (w + half)); 0 = flat */
    double attention_efficiency;  /* attention's products run at this fraction of the matrix-product efficiency */
    double mem_bw;                /* device memory bytes/s (the optimizer step is memory-bound) */
    mt_plan_link_t intra, inter;  /* inside a node, between nodes */
    double overlap_dp;            /* fraction of backward time that can hide data-parallel gradient traffic */
    double reserve_bytes;         /* memory per device the plan leaves free (runtime, CUDA context, fragmentation) */
    double nccl_comm_bytes;       /* GPU: device memory NCCL takes per communicator outside meshtrain's allocator
                                   * (its buffers; with NVLS, more); 0: left to reserve_bytes */
    int n_curves;
    mt_plan_curve_t curves[MT_PLAN_MAX_CURVES];
} mt_plan_cluster_t;

/* Reads a cluster file (TOML; launch/clusters/ has examples and docs/planning.md every key). Measured
 * curves named by bench.intra_json / bench.inter_json (paths relative to the cluster file) are loaded.
 * Every problem is written to errors (one line each, naming the file, line and key, and the fix); returns
 * MT_ERR_INVALID_ARG if there was any, MT_ERR_IO if a file cannot be read. */
mt_status_t mt_plan_cluster_load(const char *path, mt_plan_cluster_t *out, FILE *errors);
void mt_plan_cluster_free(mt_plan_cluster_t *c);

/* Loads `meshtrain bench coll --json` output into curves (inter: measured across nodes). */
mt_status_t mt_plan_cluster_add_bench(mt_plan_cluster_t *c, const char *json_path, bool inter);

/* ---- layouts ---------------------------------------------------------------------------------- */

/* How gradients are averaged over dp: a parallel/engine.h engine (DDP, ZeRO-1/2/3; with a single rank the
 * training loop's local engine), or (tp or pp > 1) the 3-D path's one all-reduce per step of the stage's
 * gradients (parallel.dp_reduce = "allreduce"; "auto" with dp = 1, where nothing is averaged). */
typedef enum {
    MT_PLAN_DDP = 0,
    MT_PLAN_ZERO1,
    MT_PLAN_ZERO2,
    MT_PLAN_ZERO3,
    MT_PLAN_ALLREDUCE,
    MT_PLAN_NENG
} mt_plan_engine_t;
typedef enum { MT_PLAN_GPIPE = 0, MT_PLAN_1F1B = 1 } mt_plan_sched_t;
/* Recomputation: none; attention probabilities (model.attn_recompute); whole blocks (model.recompute =
 * "block"); both. */
typedef enum {
    MT_PLAN_RC_NONE = 0,
    MT_PLAN_RC_ATTN,
    MT_PLAN_RC_BLOCK,
    MT_PLAN_RC_BLOCK_ATTN,
    MT_PLAN_NRC
} mt_plan_rc_t;

typedef struct {
    int tp, pp, dp;
    mt_plan_engine_t engine;
    mt_plan_sched_t schedule;
    int micro_batch, microbatches; /* sequences per micro-batch per dp rank, micro-batches per step */
    bool sp;                       /* sequence parallelism */
    mt_plan_rc_t recompute;
    char order[16]; /* mesh order, fastest first ("tp-dp-pp") */
} mt_plan_layout_t;

/* The layout a job's parallel settings describe: tp, pp, dp, order, sp, the schedule (1f1b when pp = 1) and
 * the engine (ddp for dp and ddp, zero-N, or the built-in all-reduce where a model-parallel job averages
 * with it, mt_settings_dp_engine). The batch shape and recompute are the caller's. */
void mt_plan_layout_from_settings(const mt_parallel_settings_t *p, mt_plan_layout_t *l);
/* The config override line that selects the layout ("--parallel.tp=8 --parallel.pp=4 ..."). */
void mt_plan_layout_overrides(const mt_plan_layout_t *l, char *buf, size_t len);
/* "tp8 pp4 dp2 zero-1 1f1b b1 m16 sp rc=attn tp-dp-pp" */
void mt_plan_layout_str(const mt_plan_layout_t *l, char *buf, size_t len);
const char *mt_plan_engine_name(mt_plan_engine_t e);
const char *mt_plan_rc_name(mt_plan_rc_t rc);

/* ---- job -------------------------------------------------------------------------------------- */

typedef struct {
    mt_model_config_t model; /* model.* (tp fields and recomputation set per layout) */
    mt_optim_params_t optim;
    int64_t global_batch;
    int seq_len;
    mt_prec_t prec;
    double bucket_mb;
    double grad_clip;          /* optimizer.grad_clip (engines with tp or pp > 1 need 0) */
    int64_t persist_threshold; /* parallel.zero_persist_threshold */
    int64_t eval_batches;      /* the GPU engine's loss slots in batches: mt_settings_t.eval_chunk (0: a step's only) */
    int tp_chunks;             /* parallel.tp_comm_chunks (0: 1); the GPU engine's buffers depend on it */
    /* Placement, for the shared-memory collectives' segments (mt_plan_stage_shm_bytes); the planner sets
     * them from the cluster, mt_plan_job_from_config to 0. */
    int node_ranks; /* ranks per node, placed in world-rank blocks (0: every rank on one node) */
    int node_cpus;  /* CPUs each rank may run on (0: at least as many as ranks per node) */
    /* The engine: the GPU engine (train/job_cuda.c) when the cluster's devices are GPUs (the planner sets it)
     * unless runtime.device = "cpu" (cpu_only); its device communicators through MPI (runtime.gpu_comm =
     * "mpi": no NCCL scratch) or NCCL. */
    bool gpu, cpu_only, gpu_staged;
} mt_plan_job_t;

/* The planning inputs of a job config. MT_ERR_INVALID_ARG for a model the planner cannot build. */
mt_status_t mt_plan_job_from_config(const mt_config_t *cfg, mt_plan_job_t *out);

/* ---- predictions ------------------------------------------------------------------------------ */

typedef struct {
    mt_plan_layout_t l;
    int64_t mem[MT_MEM_NCAT]; /* bytes on the fullest rank, by category */
    int64_t mem_total;
    int mem_stage; /* pipeline stage of that rank */
    int64_t nccl;  /* NCCL's own buffers on the rank that needs the most with them: its communicators x
                    * nccl_comm_bytes, not in mem (meshtrain's allocator does not hold them) */
    int64_t over;  /* bytes over the device's memory (0 when it fits), NCCL's buffers included */
    bool fits;
    double t_compute; /* forward + backward (+ recomputation) of the stage's share of the model FLOPs */
    double t_tp;      /* tensor-parallel collectives (never hidden) */
    double t_pp;      /* activation sends between stages on the critical path */
    double t_dp;      /* data-parallel gradient/parameter traffic not hidden behind backward */
    double t_bubble;  /* (p-1)/(m+p-1) of the pipelined part */
    double t_optim;   /* optimizer step over what the rank owns */
    double t_step;
    bool tp_cross_node, dp_cross_node, pp_cross_node;
} mt_plan_pred_t;

typedef struct {
    int world;       /* ranks planned for (default: every device of the cluster) */
    int micro_batch; /* only this micro-batch size; 0: every divisor of global_batch / dp */
} mt_plan_opts_t;

/* Predicts one layout. MT_ERR_INVALID_ARG (with the reason in mt_last_error_msg) when meshtrain cannot run it. */
mt_status_t mt_plan_predict(const mt_plan_job_t *job, const mt_plan_cluster_t *c, int world, const mt_plan_layout_t *l,
                            mt_plan_pred_t *out);

/* Replaces l->order "auto" by the order the runtime resolves it to on this cluster's nodes (block placement,
 * mt_topo_auto_order); other orders are kept. */
void mt_plan_resolve_order(const mt_plan_cluster_t *c, int world, mt_plan_layout_t *l);

/* Every valid layout for `world` ranks, predicted, sorted: fitting layouts by step time, then the rest by
 * how much they are over. *out is malloc'd (free()). */
mt_status_t mt_plan_enumerate(const mt_plan_job_t *job, const mt_plan_cluster_t *c, const mt_plan_opts_t *o,
                              mt_plan_pred_t **out, int *n_out);

/* The training path whose host communicators a plan counts: `meshtrain train` (train/job_mp.c when tp or
 * pp > 1: parallel/parallel3d.c's tp, dp, pp and the embedding pair; train/job_parallel.c otherwise: dp)
 * or parallel/parallel3d.c run directly (MT_PLAN_PATH_TRAIN3D: tp, dp, pp and the embedding pair at any
 * tp and pp; `meshtrain train3d` is `meshtrain train`). */
typedef enum { MT_PLAN_PATH_TRAIN = 0, MT_PLAN_PATH_TRAIN3D } mt_plan_path_t;

/* Bytes the shared-memory collectives backend accounts (MT_MEM_COMM) on pipeline stage `stage`'s planned
 * rank (tp rank 0, dp rank 0) for the host communicators `path` creates, each sized by
 * mt_coll_shm_plan_bytes from its placement under l->order (an unparsable order, e.g. "auto": tp-dp-pp)
 * and job->node_ranks / node_cpus; 0 for every comm when MESHTRAIN_COLL_ALGO=mpi. mt_plan_stage_mem's comm
 * bytes include it for MT_PLAN_PATH_TRAIN. */
mt_status_t mt_plan_stage_shm_bytes(const mt_plan_job_t *job, const mt_plan_layout_t *l, int stage,
                                    mt_plan_path_t path, int64_t *bytes);

/* The device allocations the GPU trainer's init would make (models/cuda/gpt2_cuda.h mt_gpt2_cuda_requests, whose
 * header is plain C). A build with the GPU path registers it (meshtrain plan, the GPU engine's tests): the
 * planner itself links no CUDA code; without it, planning for GPUs is refused naming the build. */
typedef mt_status_t (*mt_plan_gpu_requests_fn)(mt_model_t m, const mt_gpt2_cuda_params_t *p, size_t *bytes,
                                                mt_mem_cat_t *cats, int cap, int *n);
void mt_plan_set_gpu_requests(mt_plan_gpu_requests_fn fn);

/* The ranks of one stage's memory: per-rank bytes by category of pipeline stage `stage` (tp rank 0, dp
 * rank 0), for tests that compare with a run's allocator (job->gpu: the GPU engine's device memory). */
mt_status_t mt_plan_stage_mem(const mt_plan_job_t *job, const mt_plan_layout_t *l, int stage, int64_t mem[MT_MEM_NCAT]);

#ifdef __cplusplus
}
#endif
#endif /* MT_PLAN_H */
