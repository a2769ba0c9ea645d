/* Private parts of the planner shared by plan.c (enumeration, time) and plan_mem.c (memory).
 * SPDX-License-Identifier: MIT */
#ifndef MT_PLAN_IMPL_H
#define MT_PLAN_IMPL_H

#include "plan/plan.h"

/* The model one tensor-parallel rank builds for the layout (tp shapes, recomputation); no storage. */
mt_status_t plan_build_model(const mt_plan_job_t *job, int tp, bool sp, mt_plan_rc_t rc, mt_model_t *out);
/* Pipeline stage boundaries: stage s runs modules [bounds[s], bounds[s+1]). */
mt_status_t plan_split(mt_model_t m, int pp, int *bounds);
/* Bytes by category on pipeline stage s (tp rank 0, dp rank 0) of layout l with model m split by bounds. */
mt_status_t plan_stage_mem_model(const mt_plan_job_t *job, mt_model_t m, const int *bounds, const mt_plan_layout_t *l,
                                 int s, int64_t mem[MT_MEM_NCAT]);

/* The same on the GPU engine: device memory (plan_mem_gpu.c). */
mt_status_t plan_stage_mem_gpu(const mt_plan_job_t *job, mt_model_t m, const int *bounds, const mt_plan_layout_t *l,
                               int s, int64_t mem[MT_MEM_NCAT]);

/* NCCL communicators of a rank of pipeline stage s on the GPU engine (none with its collectives through MPI): dp
 * gradients, pipeline activations (+ the tied embedding's pair on the end stages), tp. */
int plan_gpu_comms(const mt_plan_job_t *job, mt_model_t m, const mt_plan_layout_t *l, int s);

/* parallel3d's verdict on a tp / pp layout (mt_par3d_check), for the model and batch of job. */
mt_status_t plan_check_3d(const mt_plan_job_t *job, int world, const mt_plan_layout_t *l);

#endif
