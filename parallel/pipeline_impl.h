/* Private state of a pipeline stage, shared by pipeline.c (split, storage, gathers) and
 * pipeline_sched.c (the GPipe and 1F1B schedules and the neighbour messages).
 * SPDX-License-Identifier: MIT */
#ifndef MT_PIPELINE_IMPL_H
#define MT_PIPELINE_IMPL_H

#include "parallel/pipeline.h"

struct mt_pipeline {
    mt_model_t model;
    mt_comm_t pp_comm, emb_comm; /* borrowed; pp_comm NULL for a single stage */
    mt_pipeline_params_t p;
    mt_device_table_t dev; /* p.device, or the CPU table */
    int stage, n_stages;
    int lo, hi, n_modules; /* this stage runs modules [lo, hi) of n_modules */
    int *bounds;           /* n_stages + 1 */
    bool *needs, *owns;    /* per parameter */
    /* Storage allocated by mt_pipeline_alloc_params (NULL when someone else binds). */
    float *params_flat, *grads_flat;
    size_t flat_floats; /* floats in each */
    /* Activation pool: n_acts objects, micro-batch k uses slot k % n_acts; busy[slot] = micro-batch
     * whose activations the slot holds, or -1. */
    mt_acts_t *acts;
    int n_acts, *busy, in_flight;
    /* Message buffers: payload (mt_model_act_floats) followed by one tag float. */
    size_t msg_floats;
    float *act_send, *act_recv, *grad_send, *grad_recv;
    float loss_sum;
    mt_pipeline_stats_t stats;
    mt_model_hooks_t inner; /* hooks installed before the pipeline, chained to */
    bool final_pass;        /* the step's last backward pass is running */
    bool hooks_installed;
};

/* Sets up the final pass of the step (the last micro-batch's backward) before it runs. */
void mt_pipeline_begin_final_pass(mt_pipeline_t pl);

/* Runs the configured schedule over the step's micro-batches (pipeline_sched.c). */
mt_status_t mt_pipeline_run_schedule(mt_pipeline_t pl, const int32_t *tokens, const int32_t *targets);
/* Forward only over the micro-batches (pipeline_sched.c). */
mt_status_t mt_pipeline_run_forward(mt_pipeline_t pl, const int32_t *tokens, const int32_t *targets);

#endif /* MT_PIPELINE_IMPL_H */
