/* A small training driver shared by the parallel-engine tests and benchmarks: the serial reference and
 * the engine run use the same model, optimizer and data code, and the same batch of every step (from
 * the synthetic loader's layout-independent rows), so any difference is the engine's.
 * SPDX-License-Identifier: MIT */
#ifndef MT_TEST_PARALLEL_DRIVER_H
#define MT_TEST_PARALLEL_DRIVER_H

#include "parallel/engine.h"
#include "runtime/alloc.h"

#define DRV_MAX_STEPS 16

typedef struct {
    mt_model_config_t model; /* built once per run */
    mt_optim_params_t optim;
    int global_batch; /* B: sequences per step over all ranks */
    int grad_accum;   /* micro-batches per step per rank */
    int seq_len;      /* T */
    int steps;
    float lr;
    float clip; /* max global norm; 0 = off */
    uint64_t data_seed;
    bool replica_sums; /* parallel: every rank also gathers the parameters to itself (checksums) */
    int split_at;      /* parallel: > 0 runs modules [0, split_at) and [split_at, n) as two ranges (as
                        * two pipeline stages would), passing activations and their gradients */
} drv_cfg_t;

typedef struct {
    int steps;
    double loss[DRV_MAX_STEPS]; /* global-batch mean loss of each step */
    double norm[DRV_MAX_STEPS]; /* global gradient norm before clipping */
    float *params;              /* final parameters in registration order (serial; parallel: root only) */
    size_t numel;
    double seconds;                             /* wall time of the steps */
    mt_engine_comm_stats_t comm[DRV_MAX_STEPS]; /* parallel: per-step accounting */
    mt_engine_mem_t mem;                        /* parallel: the engine's storage after the last step */
    mt_mem_stats_t mem_base, mem_end; /* parallel: allocator figures before mt_engine_init / after the last step */
    double replica_sum;               /* with replica_sums: checksum of this rank's own copy of the parameters */
} drv_result_t;

/* Tiny models for the equivalence tests. */
void drv_cfg_gpt2_tiny(drv_cfg_t *c);
void drv_cfg_mlp_tiny(drv_cfg_t *c);

/* One process: the model's own buffers, one optimizer over every parameter (as the single-process
 * training loop does). */
mt_status_t drv_run_serial(const drv_cfg_t *c, drv_result_t *r);

/* The engine over dp (every rank of dp calls it). ep->grad_accum and ep->optim are taken from c. */
mt_status_t drv_run_engine(const drv_cfg_t *c, mt_comm_t dp, const mt_engine_params_t *ep, drv_result_t *r);

void drv_result_free(drv_result_t *r);

#endif
