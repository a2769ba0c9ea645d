/* Per-rank device memory of a layout on the GPU engine (train/job_cuda.c), by allocator category: the device
 * trainer's own allocations, sized by its init code run without a device (mt_gpt2_cuda_requests, registered by
 * builds with the GPU path), with the parameters the engine passes it, then the engine's (the losses, a
 * pipeline stage's send buffer), all replayed in order through the caching allocator (mt_cuda_alloc_replay) so
 * each counts as the block it would take; plus NCCL's scratch per device communicator.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "parallel/pipeline.h"
#include "plan/plan_impl.h"
#include "runtime/cuda_alloc.h"

static mt_plan_gpu_requests_fn gpu_requests;

void mt_plan_set_gpu_requests(mt_plan_gpu_requests_fn fn) {
    gpu_requests = fn;
}

/* Bytes NCCL's backend accounts per communicator (collectives/coll_nccl.c: its 256-byte scratch). */
#define NCCL_SCRATCH 256

mt_status_t plan_stage_mem_gpu(const mt_plan_job_t *job, mt_model_t m, const int *bounds, const mt_plan_layout_t *l,
                               int s, int64_t mem[MT_MEM_NCAT]) {
    memset(mem, 0, sizeof(int64_t) * MT_MEM_NCAT);
    if (!gpu_requests) {
        return mt_error(MT_ERR_INVALID_USAGE,
                        "plan: this meshtrain was built without the GPU path (CUDA), so it cannot size the GPU "
                        "engine's device memory: plan with a CUDA build, or set device.kind = \"cpu\" in the cluster "
                        "file");
    }
    const mt_model_config_t *mc = mt_model_config(m);
    int L = mc->n_layer;
    bool zero = l->engine >= MT_PLAN_ZERO1 && l->engine <= MT_PLAN_ZERO3 && l->dp > 1;
    /* ce_init's trainer parameters, for dp rank 0 (the largest ZeRO slice) */
    mt_gpt2_cuda_params_t gp = MT_GPT2_CUDA_PARAMS_INIT;
    gp.prec = job->prec;
    gp.B = l->micro_batch;
    gp.T = job->seq_len;
    gp.shard_count = zero ? l->dp : 1;
    gp.shard_index = 0;
    gp.shard_grads = zero && l->engine >= MT_PLAN_ZERO2;
    gp.shard_weights = zero && l->engine == MT_PLAN_ZERO3;
    gp.tp_chunks = MT_MAX(job->tp_chunks, 1);
    gp.opt_state = mt_optim_state_buffers(&job->optim);
    gp.recompute_block = l->recompute == MT_PLAN_RC_BLOCK || l->recompute == MT_PLAN_RC_BLOCK_ATTN;
    if (l->pp > 1) { /* modules: 0 the embeddings, 1 .. L the blocks, L + 1 the head */
        mt_pp_schedule_t sched = l->schedule == MT_PLAN_GPIPE ? MT_PP_GPIPE : MT_PP_1F1B;
        gp.act_sets = mt_pipeline_max_in_flight(sched, l->pp, s, l->microbatches);
        gp.stage_lo = MT_MAX(bounds[s], 1) - 1;
        gp.stage_hi = MT_MIN(bounds[s + 1], L + 1) - 1;
        gp.stage_ends = (bounds[s] == 0) | (bounds[s + 1] == L + 2) << 1;
    }
    enum { CAP = 64 };
    size_t bytes[CAP];
    mt_mem_cat_t cats[CAP];
    int n = 0;
    MT_CHECK(gpu_requests(m, &gp, bytes, cats, CAP - 2, &n));
    /* the engine's, after the trainer's and on its stream: each micro-batch's loss (of every batch an evaluation
     * reads at once), the pipeline's send buffer (the stage boundary's rows: with sequence parallelism this tp
     * rank's share) */
    bytes[n] = (size_t)l->microbatches * (size_t)MT_MAX(job->eval_batches, 1) * 4;
    cats[n++] = MT_MEM_OTHER;
    if (l->pp > 1) {
        size_t rows = (size_t)l->micro_batch * (size_t)job->seq_len / (mc->sequence_parallel ? (size_t)l->tp : 1u);
        bytes[n] = rows * (size_t)mc->n_embd * mt_dtype_size(mt_prec_storage(job->prec));
        cats[n++] = MT_MEM_COMM;
    }
    MT_CHECK(mt_cuda_alloc_replay(bytes, cats, n, mem, NULL));
    mem[MT_MEM_COMM] += (int64_t)plan_gpu_comms(job, m, l, s) * NCCL_SCRATCH;
    return MT_OK;
}

int plan_gpu_comms(const mt_plan_job_t *job, mt_model_t m, const mt_plan_layout_t *l, int s) {
    if (job->gpu_staged) {
        return 0;
    }
    bool end = (s == 0 || s == l->pp - 1) && mt_model_param(m, 0)->tied_module >= 0; /* the tied pair */
    return (l->dp > 1) + (l->pp > 1) + (l->pp > 2 && end) + (l->tp > 1);
}
