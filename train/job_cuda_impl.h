/* Private parts of the GPU engine shared by train/job_cuda.c (set-up, data parallelism, the step, checkpoints)
 * and train/job_cuda_mp.c (pipeline stages, tensor parallelism). Only in builds with CUDA (MT_HAVE_CUDA);
 * tests/gpu/emu builds both files again against the CPU emulator (MT_CUDA_EMULATED).
 * SPDX-License-Identifier: MIT */
#ifndef MT_JOB_CUDA_IMPL_H
#define MT_JOB_CUDA_IMPL_H

#include <cuda_runtime_api.h>

#include "collectives/coll.h"
#include "train/job.h"
#include "models/cuda/cuda_backend.h"
#include "models/cuda/gpt2_cuda.h"
#include "parallel/pipeline.h"
#include "parallel/tp.h"
#include "runtime/mesh.h"
#include "runtime/nvml.h"
#include "runtime/precision.h"

#ifndef MT_CUDA_EMULATED
#define MT_CUDA_EMULATED 0
#endif

typedef struct {
    mt_model_t model;
    mt_gpt2_cuda_t g;
    mt_optim_params_t optim;
    mt_prec_t prec;
    int64_t mb, T, ga;
    int dp_size, dp_rank;
    bool overlap;        /* "ddp", "zero": buckets during backward; "dp": one all-reduce after it */
    bool zero;           /* ZeRO-1/2 (dp > 1): each bucket reduced to the owners of its slices, weights gathered */
    bool zero2;          /* ZeRO-2/3: every micro-batch's runs reduced at once and added to the owner's slice */
    bool zero3;          /* ZeRO-3: weights gathered block by block from their owners, no all-gather */
    size_t sh_lo, sh_hi; /* ZeRO-1: this rank's slice of the flat layout (everything otherwise) */
    size_t sh_len;       /* ZeRO-1: the slice length: rank r owns [r * sh_len, (r + 1) * sh_len) */
    size_t bucket_elems; /* parallel.bucket_mb in floats */
    size_t numel;
    mt_comm_t gcomm;          /* dp > 1: the gradients' communicator (device memory) */
    mt_comm_t lcomm;          /* dp > 1: host communicator for the loss */
    cudaStream_t cstream;     /* the trainer's compute stream (borrowed) */
    cudaStream_t comm_stream; /* dp > 1: gradient all-reduces */
    cudaEvent_t ready;        /* recorded on cstream when a bucket's gradients are complete */
    cudaEvent_t comm_done;    /* recorded on comm_stream after the last bucket */
    bool comm_now;            /* the backward running hands its gradients to the dp group (on_grads) */
    bool final_pass;          /* the backward running is the last micro-batch of a training step */
    size_t pend_lo, pend_hi;  /* complete gradients not yet sent: [pend_lo, pend_hi) */
    int64_t n_buckets;        /* all-reduces launched (for the log) */
    double sent_tp, sent_pp;  /* bytes this rank sent in the step (docs/metrics.md): tp collectives, pipeline */
    double sent_dp;           /* ... and data-parallel gradients and weights (their sum: comm_bytes "model") */
    double sent_other;        /* ... and the rest (loss, norm) */
    float *loss_dev;          /* loss_slots floats on the device: each micro-batch's mean loss, batch after batch */
    float *loss_host;         /* pinned loss_slots floats */
    int64_t loss_slots;       /* ga x the most batches read at once (1; an evaluation's, up to MT_JOB_EVAL_CHUNK) */
    float *h_m, *h_v;         /* host staging of AdamW's moments for checkpoints (allocated on first use) */
    mt_nvml_t nvml;           /* NULL: no energy figures */
    mt_energy_steps_t energy; /* per-step energy from the counter (runtime/nvml.h) */
    int pp, stage;            /* pipeline stages and this rank's (pp = 1: the whole model) */
    bool first, last;         /* the stage embeds the tokens / computes the loss */
    mt_pp_schedule_t sched;   /* parallel.schedule */
    mt_comm_t ppcomm;         /* pp > 1: activations and their gradients, stage to stage (device memory) */
    mt_comm_t pplcomm;        /* pp > 1: host scalars over the pipeline (the loss, the norm) */
    mt_comm_t embcomm;        /* pp > 1, first and last stage: the tied wte's gradient (== ppcomm when pp = 2) */
    void *sendbuf;            /* what the pending send sends: a copy, since the next op rewrites the trainer's
                               * output or gradient buffer before the send is posted */
    int n_slots;              /* the trainer's activation sets: the most micro-batches in flight on the stage */
    size_t act_elems;         /* B x T x C: one activation message */
    int tp, tpr;              /* tensor parallelism: the group's size and this rank's index in it (1, 0: none) */
    bool recompute_block;     /* tp > 1 and model.recompute = "block": the device trainer recomputes, the host
                               * model of shards (which cannot) is built without it */
    mt_comm_t tpcomm;         /* tp > 1: activations and their gradients (device memory) */
    mt_comm_t tplcomm;        /* tp > 1: host communicator of the group (the CPU model's seam) */
    mt_tp_t tpseam;           /* tp > 1: parallel/tp.c over tplcomm, which the sharded host model is built with */
    mt_gpt2_cuda_tp_ops_t tp_ops; /* tp > 1: the trainer's collectives over tpcomm */
    mt_comm_t normcomm;       /* tp > 1 or ZeRO with pp > 1: host sums of the norm's parts (tp x pp, x dp: ZeRO) */
    const char *comm_backend; /* device communicators' backend: NULL = by priority (NCCL), "staged" (MPI) */
    int gpu_sharers;          /* ranks of the host on this rank's GPU, itself included (> 1: staged backend) */
    bool gpu_first;           /* no lower local rank shares the GPU: this rank counts its energy */
    double peak;              /* this GPU's dense peak in precision.compute, FLOP/s (0: unknown, no MFU) */
    char peak_src[200];       /* where peak comes from */
} cuda_engine_t;

#define CU(call) MT_CHECK(mt_cuda_status((call), #call))

/* job_cuda.c: the parameters of a device-memory communicator named name (e->comm_backend's); the
 * communicators of this rank's group along axis (see there). */
mt_comm_params_t cuda_engine_dev_params(const cuda_engine_t *e, const char *name);
mt_status_t cuda_engine_axis_comms(const cuda_engine_t *e, const mt_job_info_t *info, mt_axis_t axis,
                                   const char *dev_name, const char *host_name, int size, int rank, const char *what,
                                   mt_comm_t *dev, mt_comm_t *host);

/* job_cuda_mp.c: the pipeline's communicators (activations, scalars, the tied wte's pair), the tp group's
 * device communicator, the norm's host communicator (tp x pp, x dp under ZeRO), each collective over
 * info->comm; one batch through this rank's stage, queued (its losses into slots on the last stage);
 * e->tp_ops, the trainer's tp collectives. */
mt_status_t cuda_engine_pp_comms_init(cuda_engine_t *e, const mt_job_info_t *info);
mt_status_t cuda_engine_tp_comms_init(cuda_engine_t *e, const mt_job_info_t *info);
mt_status_t cuda_engine_norm_comm_init(cuda_engine_t *e, const mt_job_info_t *info);
mt_status_t cuda_engine_pp_queue_batch(cuda_engine_t *e, const mt_batch_t *b, bool backward, float *slots);
void cuda_engine_tp_ops(cuda_engine_t *e);

#endif /* MT_JOB_CUDA_IMPL_H */
