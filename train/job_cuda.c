/* The GPU engine of the training loop (runtime.device = "cuda"): GPT-2 or the MLP on this rank's GPU through
 * models/cuda/gpt2_cuda.h in precision.compute, and with dp > 1 replicas whose gradients are averaged over
 * NCCL on a stream of their own, bucket by bucket while backward still runs (parallel.engine = "ddp") or in
 * one all-reduce after it ("dp"). ZeRO-1 (parallel.engine = "zero", zero_stage = 1) shards the optimizer:
 * each rank keeps the master weights and AdamW moments of one slice of the flat layout, each bucket's
 * gradients are reduced to the slices' owners during backward, each rank updates its slice and the compute
 * copy is all-gathered after the step. ZeRO-2 also shards the gradients: backward writes each block into a
 * pooled slot, every micro-batch's runs are reduced to their owners at once and added to the owner's
 * slice. ZeRO-3 also shards the weights: each block's are broadcast from their owners into a slot before
 * its forward and backward (the next ones while a block computes), wte/wpe/ln_f once per step. With pp > 1
 * each rank trains one pipeline stage (GPipe or 1F1B, activations by NCCL send/recv, each micro-batch in
 * flight in its own activation set of the trainer), ZeRO slicing the stage's own layout over its dp group.
 * With tp > 1 each rank trains its tensor-parallel shard (Megatron-style, models/cuda/gpt2_cuda.h), the tp
 * group's all-reduces and gathers through NCCL on the compute stream; the model is built sharded by the
 * engine's setup_model. Pipeline and tensor parallelism live in train/job_cuda_mp.c. The loop's clipping,
 * NaN agreement, metrics and checkpoints work unchanged: the engine syncs twice per step (the loss after
 * backward, the gradient norm after the reductions). Built without CUDA, the engine only refuses, naming what
 * to use instead.
 * SPDX-License-Identifier: MIT */
#include "mt_build_config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/job.h"
#include "train/job_pieces.h"
#include "runtime/config.h"
#include "runtime/rt.h"

#if MT_HAVE_CUDA
#include "train/job_cuda_impl.h"
#include "models/cuda/gemm_peak.h"
#include "runtime/cuda_alloc.h"
#endif

#ifndef MT_CUDA_EMULATED
#define MT_CUDA_EMULATED 0
#endif
#ifndef MT_CUDA_EMU_NCCL /* the emulator with its emulated NCCL (tests/gpu/emu/emu_nccl.cpp) */
#define MT_CUDA_EMU_NCCL 0
#endif

/* Devices this rank sees (0 without CUDA, a driver or a device). */
static int cuda_devices(void) {
#if MT_HAVE_CUDA
    return mt_cuda_device_count();
#else
    return 0;
#endif
}

/* Whether two ranks of this host would drive one GPU, which NCCL refuses in a communicator: each rank takes the
 * visible device local_rank mod its device count (ce_init), named by its PCI bus id, gathered over the host's
 * ranks (so per-rank CUDA_VISIBLE_DEVICES or srun --gpus-per-task, one distinct GPU each, is fine). On a clash
 * *a and *b are the first two local ranks on one GPU and bus that device. *sharers (if not NULL): the host's
 * ranks on this rank's GPU, itself included; *first (if not NULL): no lower local rank is on it. Collective over
 * the host's ranks (mt_rt_world()->local_comm); false (sharers 1, first) without CUDA or a device. */
static bool gpu_shared(int n_dev, int *a, int *b, char *bus, size_t bus_len, int *sharers, bool *first) {
    enum { ID = 32 };
    const mt_world_t *w = mt_rt_world();
    char mine[ID] = "";
    if (sharers) {
        *sharers = 1;
    }
    if (first) {
        *first = true;
    }
#if MT_HAVE_CUDA
    if (n_dev > 0 && cudaDeviceGetPCIBusId(mine, ID, w->local_rank % n_dev) != cudaSuccess) {
        mine[0] = '\0';
        (void)cudaGetLastError(); /* handled here: not the next kernel launch's error */
    }
#else
    (void)n_dev;
#endif
    char *all = calloc((size_t)w->local_size, ID);
    if (!all || MPI_Allgather(mine, ID, MPI_CHAR, all, ID, MPI_CHAR, w->local_comm) != MPI_SUCCESS) {
        free(all);
        return false; /* cannot tell: the engine's NCCL set-up reports a clash itself */
    }
    bool shared = false;
    for (int i = 0; i < w->local_size; i++) {
        const char *x = all + (size_t)i * ID;
        for (int j = i + 1; j < w->local_size && x[0]; j++) {
            if (!strncmp(x, all + (size_t)j * ID, ID)) {
                if (!shared) {
                    *a = i;
                    *b = j;
                    snprintf(bus, bus_len, "%.*s", ID, x);
                }
                shared = true;
            }
        }
        if (mine[0] && i != w->local_rank && !strncmp(x, mine, ID)) {
            if (sharers) {
                (*sharers)++;
            }
            if (first && i < w->local_rank) {
                *first = false;
            }
        }
    }
    free(all);
    return shared;
}

mt_status_t mt_job_cuda_choose(const mt_config_t *cfg, MPI_Comm comm, bool *use, char *note, size_t note_len) {
    const char *dev = mt_config_str(cfg, "runtime.device");
    *use = false;
    if (note_len) {
        note[0] = '\0';
    }
    if (!strcmp(dev, "cpu")) {
        return MT_OK;
    }
    int n = cuda_devices(), rank = 0, world = 1, mine[2], all[2];
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &world);
    /* the fewest GPUs any rank sees; whether every rank has a GPU of its own (NCCL's rule, when ranks talk; auto
     * keeps to it unless runtime.gpu_comm = "mpi") */
    int la = 0, lb = 0;
    char bus[40];
    mine[0] = n;
    mine[1] = world == 1 || !gpu_shared(n, &la, &lb, bus, sizeof(bus), NULL, NULL);
    MT_MPI_CHECK(MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MIN, comm));
    int min_n = all[0];
    if (!strcmp(dev, "auto")) {
        if (min_n > 0 && (all[1] || !strcmp(mt_config_str(cfg, "runtime.gpu_comm"), "mpi"))) {
            *use = true;
        } else if (min_n > 0 && note_len) {
            snprintf(note, note_len,
                     "runtime.device = \"auto\": GPUs present, but two ranks of a host would share one (NCCL needs "
                     "one GPU per rank; runtime.device = \"cuda\" shares them through MPI); training on the CPU");
        }
        return MT_OK;
    }
    if (!MT_HAVE_CUDA) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "runtime.device = \"cuda\": this meshtrain was built without CUDA (configure it where the "
                        "CUDA Toolkit is installed), or set runtime.device = \"cpu\"");
    }
    if (n == 0) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "runtime.device = \"cuda\": rank %d (host %s) sees no CUDA device: run it on a GPU node, "
                        "check CUDA_VISIBLE_DEVICES, or set runtime.device = \"cpu\"",
                        rank, mt_rt_world()->hostname);
    }
    if (min_n == 0) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "runtime.device = \"cuda\": another rank sees no CUDA device (its message names it), or set "
                        "runtime.device = \"cpu\"");
    }
    *use = true;
    return MT_OK;
}

#if MT_HAVE_CUDA


/* The MFU denominator (docs/metrics.md): the GPU's rate on an N^3 cuBLASLt product in precision.compute,
 * measured once at the engine's start; MESHTRAIN_PEAK_GFLOPS_PER_GPU = G > 0 uses G instead, and
 * MESHTRAIN_GPU_PEAK_N = 0 measures nothing (no MFU). */
MT_PARAM(peak_gflops_gpu, "PEAK_GFLOPS_PER_GPU", 0)
MT_PARAM(gpu_peak_n, "GPU_PEAK_N", 8192)
enum { PEAK_REPS = 10 };

/* Fills e->peak and e->peak_src before the model is built, so the product's operands come from an empty
 * device and go back to the driver afterwards. A failed measurement leaves the peak unknown (a warning),
 * never the job. */
static void measure_peak(cuda_engine_t *e, int dev) {
    int64_t n = mt_param_gpu_peak_n();
    if (mt_param_peak_gflops_gpu() > 0) { /* ranks sharing a GPU share its peak: the job's sum counts it once */
        e->peak = (double)mt_param_peak_gflops_gpu() * 1e9 / e->gpu_sharers;
        snprintf(e->peak_src, sizeof(e->peak_src), "%.1f TFLOP/s per GPU from MESHTRAIN_PEAK_GFLOPS_PER_GPU%s",
                 (double)mt_param_peak_gflops_gpu() * 1e-3, e->gpu_sharers > 1 ? ", shared by its ranks" : "");
        return;
    }
    if (e->gpu_sharers > 1) { /* measured while the other ranks on it measure too, it would say nothing */
        snprintf(e->peak_src, sizeof(e->peak_src),
                 "of the GPU not measured: %d ranks share it (set MESHTRAIN_PEAK_GFLOPS_PER_GPU)", e->gpu_sharers);
        return;
    }
    if (MT_CUDA_EMULATED) { /* an emulated device's rate says nothing about a GPU's */
        snprintf(e->peak_src, sizeof(e->peak_src), "of the GPU not measured under the CPU emulator");
        return;
    }
    if (n <= 0) {
        snprintf(e->peak_src, sizeof(e->peak_src), "of the GPU not measured (MESHTRAIN_GPU_PEAK_N = 0)");
        return;
    }
    double t0 = mt_now(), f = 0.0;
    mt_status_t st = mt_cuda_gemm_peak(e->prec, (int)n, PEAK_REPS, NULL, &f);
    mt_dev_empty_cache();
    if (st != MT_OK || !(f > 0)) {
        MT_WARN("cuda engine: measuring the GPU's %s peak failed (%s): no MFU; set MESHTRAIN_PEAK_GFLOPS_PER_GPU "
                "to give it",
                mt_prec_name(e->prec), st != MT_OK ? mt_last_error_msg() : "no time measured");
        snprintf(e->peak_src, sizeof(e->peak_src), "of the GPU unknown (its measurement failed)");
        return;
    }
    e->peak = f;
    snprintf(e->peak_src, sizeof(e->peak_src),
             "%.1f TFLOP/s per GPU (cuBLASLt %lld^3 %s product on device %d, median of %d, measured in %.2f s)",
             f / 1e12, (long long)n, mt_prec_name(e->prec), dev, PEAK_REPS, mt_now() - t0);
}

static void ce_free(void *ctx) {
    cuda_engine_t *e = ctx;
    if (!e) {
        return;
    }
    if (e->cstream) {
        cudaStreamSynchronize(e->cstream);
    }
    if (e->comm_stream) {
        cudaStreamSynchronize(e->comm_stream);
    }
    mt_comm_free(e->gcomm);
    mt_comm_free(e->lcomm);
    if (e->embcomm != e->ppcomm) {
        mt_comm_free(e->embcomm);
    }
    mt_comm_free(e->ppcomm);
    mt_comm_free(e->pplcomm);
    mt_comm_free(e->tpcomm);
    mt_comm_free(e->normcomm);
    if (e->tpseam) {
        mt_tp_free(e->tpseam);
    }
    mt_comm_free(e->tplcomm);
    if (e->sendbuf) {
        mt_dev_free(e->sendbuf);
    }
    if (e->comm_stream) {
        cudaStreamDestroy(e->comm_stream);
    }
    if (e->ready) {
        cudaEventDestroy(e->ready);
    }
    if (e->comm_done) {
        cudaEventDestroy(e->comm_done);
    }
    if (e->loss_dev) {
        mt_dev_free(e->loss_dev);
    }
    if (e->loss_host) {
        cudaFreeHost(e->loss_host);
    }
    mt_gpt2_cuda_free(e->g);
    mt_free(e->h_m);
    mt_free(e->h_v);
    mt_nvml_close(e->nvml);
    free(e);
}

/* Per-rank bytes of a bandwidth-optimal algorithm over the dp group, as the CPU engines count them
 * (parallel/comm.c): all-reduce 2b(N-1)/N, reduce and broadcast b(N-1)/N of a b-byte buffer, all-gather
 * (N-1)/N of the whole gathered buffer. */
static double dp_frac(const cuda_engine_t *e) {
    return (double)(e->dp_size - 1) / (double)e->dp_size;
}

/* Averages gradients [lo, hi) over dp on the comm stream, ordered after everything enqueued on the compute
 * stream so far (the backward launches that completed them): all-reduced, or under ZeRO-1 each slice's part
 * reduced to the slice's owner (the other ranks' copies of it are not used again this step). A pipeline's
 * end stage under ZeRO all-reduces its tied wte (the layout's first elements) all the same, once per step:
 * after the dp reductions its two copies' gradients are summed over the stages (ce_finish_grads), and the
 * owners of an element differ between the stages' layouts. */
static mt_status_t launch_bucket(cuda_engine_t *e, size_t lo, size_t hi, float *grads) {
    if (hi <= lo) {
        return MT_OK;
    }
    CU(cudaEventRecord(e->ready, e->cstream));
    CU(cudaStreamWaitEvent(e->comm_stream, e->ready, 0));
    size_t whole = !e->zero ? hi : e->embcomm ? MT_MAX(lo, MT_MIN(hi, mt_model_param(e->model, 0)->numel)) : lo;
    if (whole > lo) { /* [lo, whole): all-reduced */
        MT_CHECK(
            mt_coll_all_reduce(e->gcomm, grads, grads, whole - lo, MT_COLL_F32, MT_REDOP_AVG, e->comm_stream, NULL));
        e->sent_dp += 2.0 * (double)(whole - lo) * 4.0 * dp_frac(e);
    }
    e->sent_dp += (double)(hi - whole) * 4.0 * dp_frac(e); /* [whole, hi): the reduces to the owners */
    for (size_t a = whole; e->zero && a < hi;) {
        int owner = (int)(a / e->sh_len);
        size_t b = MT_MIN(hi, (size_t)(owner + 1) * e->sh_len);
        float *part = grads + (a - lo);
        MT_CHECK(mt_coll_reduce(e->gcomm, part, part, b - a, MT_COLL_F32, MT_REDOP_AVG, owner, e->comm_stream, NULL));
        if (e->zero2 && owner == e->dp_rank) { /* this pass's average joins the slice's gradient */
            float *slice = mt_gpt2_cuda_grad_slice(e->g) + (a - e->sh_lo);
            CU(mt_cuda_residual_forward(slice, slice, part, b - a, MT_CU_F32, e->comm_stream));
        }
        a = b;
    }
    e->n_buckets++;
    return MT_OK;
}

/* The trainer's hook: runs of complete gradients arrive from the end of the flat layout to its start. Under
 * ZeRO-2 each run is launched at once (its pooled slot is written again two blocks later), but for a pipeline
 * end stage's tied wte, which accumulates over the passes and is all-reduced after the step's last
 * (launch_bucket; ce_finish_grads sums it over the end stages and hands the slice's part to the slice). */
static mt_status_t on_grads(void *arg, size_t lo, size_t hi, float *grads) {
    cuda_engine_t *e = arg;
    if (!e->comm_now) {
        return MT_OK;
    }
    if (e->zero2) {
        size_t tied = e->embcomm && !e->final_pass ? mt_model_param(e->model, 0)->numel : 0, a = MT_MAX(lo, tied);
        return a < hi ? launch_bucket(e, a, hi, grads + (a - lo)) : MT_OK;
    }
    if (e->pend_lo == e->pend_hi) {
        e->pend_hi = hi;
    }
    MT_ASSERT(hi == e->pend_lo || e->pend_lo == e->pend_hi);
    e->pend_lo = lo;
    bool last = lo == 0;
    if (last || (e->overlap && e->pend_hi - e->pend_lo >= e->bucket_elems)) {
        MT_CHECK(launch_bucket(e, e->pend_lo, e->pend_hi, mt_gpt2_cuda_grads(e->g) + e->pend_lo));
        e->pend_hi = e->pend_lo;
    }
    return MT_OK;
}

/* ZeRO-3, the trainer's weight hook: the compute copy's elements [lo, hi) into dst on every rank, each
 * slice's part broadcast by its owner from its slice, on the comm stream (the trainer orders it). */
static mt_status_t on_weights(void *arg, size_t lo, size_t hi, void *dst) {
    cuda_engine_t *e = arg;
    mt_dtype_t dt = mt_prec_storage(e->prec);
    size_t es = mt_dtype_size(dt);
    const char *slice = mt_gpt2_cuda_weight_slice(e->g);
    for (size_t a = lo; a < hi;) {
        int owner = (int)(a / e->sh_len);
        size_t b = MT_MIN(hi, (size_t)(owner + 1) * e->sh_len);
        char *to = (char *)dst + (a - lo) * es;
        const void *from = owner == e->dp_rank ? slice + (a - e->sh_lo) * es : to;
        MT_CHECK(mt_coll_broadcast(e->gcomm, from, to, b - a, (mt_coll_dtype_t)dt, owner, e->comm_stream, NULL));
        a = b;
    }
    e->sent_dp += (double)(hi - lo) * (double)es * dp_frac(e);
    return MT_OK;
}

mt_comm_params_t cuda_engine_dev_params(const cuda_engine_t *e, const char *name) {
    mt_comm_params_t p = MT_COMM_PARAMS_INIT;
    p.name = name;
    /* the emulator in a build without CUDA, whose collectives have no staged backend: host memory (which
     * emulated device memory is) */
    p.memory = MT_CUDA_EMULATED && !MT_HAVE_COLL_STAGED ? MT_COMM_MEM_HOST : MT_COMM_MEM_DEVICE;
    p.backend = e->comm_backend;
    return p;
}

/* The communicators of this rank's group along axis (the whole info->comm without a mesh): *dev for
 * gradients or activations (device memory, e->comm_backend's) and *host for scalars, checked to give this
 * rank index `rank` of `size` (what names the index in the error). Collective over the group. */
mt_status_t cuda_engine_axis_comms(const cuda_engine_t *e, const mt_job_info_t *info, mt_axis_t axis,
                                   const char *dev_name, const char *host_name, int size, int rank, const char *what,
                                   mt_comm_t *dev, mt_comm_t *host) {
    mt_comm_params_t cp = cuda_engine_dev_params(e, dev_name), lp = MT_COMM_PARAMS_INIT;
    lp.name = host_name;
    if (info->mesh) {
        MT_CHECK(mt_comm_init_mesh(info->comm, info->mesh, MT_AXIS_BIT(axis), &cp, dev));
        MT_CHECK(mt_comm_init_mesh(info->comm, info->mesh, MT_AXIS_BIT(axis), &lp, host));
    } else {
        MT_CHECK(mt_comm_init(info->comm, &cp, dev));
        MT_CHECK(mt_comm_init(info->comm, &lp, host));
    }
    if (mt_comm_size(*dev) != size || mt_comm_rank(*dev) != rank) {
        return mt_error(MT_ERR_INTERNAL, "cuda engine: %s communicator rank %d of %d, the job expects %s %d of %d",
                        dev_name, mt_comm_rank(*dev), mt_comm_size(*dev), what, rank, size);
    }
    return MT_OK;
}

/* The dp communicators (gradients on the device, losses), collectively over info->comm. */
static mt_status_t dp_comms_init(cuda_engine_t *e, const mt_job_info_t *info) {
    return cuda_engine_axis_comms(e, info, MT_AXIS_DP, "dp-grads", "dp-loss", e->dp_size, e->dp_rank, "dp rank",
                                  &e->gcomm, &e->lcomm);
}

/* Before the model is built: with tp > 1 the engine starts here, so the host model is this rank's shard (the
 * tensor-parallel GPT-2 of models/gpt2/gpt2_tp.c, over parallel/tp.c's seam on a host communicator of the tp
 * group; its weights are initialised as shards of the whole model's and uploaded by ce_init). */
static mt_status_t ce_setup_model(const mt_job_info_t *info, mt_model_config_t *mc, void **ctx) {
    *ctx = NULL;
    int tp = info->mesh ? mt_mesh_axis_size(info->mesh, MT_AXIS_TP) : 1;
    if (tp == 1) {
        return MT_OK;
    }
    if (mc->kind != MT_MODEL_GPT2) { /* before any collective: every rank refuses alike */
        return mt_error(MT_ERR_INVALID_ARG,
                        "parallel.tp = %d: tensor parallelism shards GPT-2 only (model.kind = \"mlp\" runs with "
                        "tp = 1)",
                        tp);
    }
    cuda_engine_t *e = calloc(1, sizeof(*e));
    if (!e) {
        return mt_error(MT_ERR_OOM, "cuda engine: out of memory");
    }
    *ctx = e; /* the job frees it (ce_free) whatever happens next */
    int me = 0, coords[MT_AXIS_N];
    MPI_Comm_rank(info->comm, &me);
    mt_mesh_coords(info->mesh, me, coords);
    e->tp = tp;
    e->tpr = coords[MT_AXIS_TP];
    mt_comm_params_t lp = MT_COMM_PARAMS_INIT;
    lp.name = "tp-host";
    MT_CHECK(mt_comm_init_mesh(info->comm, info->mesh, MT_AXIS_BIT(MT_AXIS_TP), &lp, &e->tplcomm));
    if (mt_comm_size(e->tplcomm) != tp || mt_comm_rank(e->tplcomm) != e->tpr) {
        return mt_error(MT_ERR_INTERNAL, "cuda engine: tp communicator rank %d of %d, the mesh says %d of %d",
                        mt_comm_rank(e->tplcomm), mt_comm_size(e->tplcomm), e->tpr, tp);
    }
    MT_CHECK(mt_tp_init(e->tplcomm, &e->tpseam));
    mt_tp_model_config(e->tpseam, info->set->par.sequence_parallel, mc);
    /* recompute = block: the device trainer's (repeating a block's forward collectives up to gelu(fc) in its
     * backward, as Megatron's full recomputation does); the host model of shards, which never runs a step here,
     * without it */
    e->recompute_block = mc->recompute == MT_RECOMPUTE_BLOCK;
    mc->recompute = MT_RECOMPUTE_NONE;
    return MT_OK;
}

static mt_status_t ce_init(const mt_job_info_t *info, void **ctx) {
    int ndev = mt_cuda_device_count();
    if (ndev == 0) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "runtime.device = \"%s\": rank %d sees no CUDA device: run it on a GPU node, check "
                        "CUDA_VISIBLE_DEVICES, or set runtime.device = \"cpu\"",
                        mt_config_str(info->cfg, "runtime.device"), mt_rt_world()->rank);
    }
    const mt_config_t *cfg = info->cfg;
    const mt_parallel_settings_t *par = &info->set->par;
    mt_gpt2_cuda_params_t gp = MT_GPT2_CUDA_PARAMS_INIT;
    gp.prec = info->set->prec.compute;
    bool from_setup = *ctx != NULL; /* tp > 1: ce_setup_model made it, and the job frees it */
    cuda_engine_t *e = from_setup ? *ctx : calloc(1, sizeof(*e));
    if (!e) {
        return mt_error(MT_ERR_OOM, "cuda engine: out of memory");
    }
    mt_status_t st = MT_OK;
    e->tp = from_setup ? e->tp : 1;
    e->model = info->model;
    e->optim = info->optim;
    e->prec = gp.prec;
    e->mb = info->micro_batch;
    e->T = info->seq_len;
    e->ga = info->grad_accum;
    e->dp_size = info->dp_size;
    e->dp_rank = info->dp_rank;
    e->zero = mt_settings_zero(par) > 0 && e->dp_size > 1;
    e->zero2 = e->zero && par->zero_stage >= 2;
    e->zero3 = e->zero && par->zero_stage == 3;
    e->overlap = e->zero || par->engine == MT_ENGINE_DDP;
    e->bucket_elems = (size_t)MT_MAX(1.0, par->bucket_mb * 1048576.0 / 4.0);
    if (mt_rt_world()->rank == 0 && e->zero2 && par->bucket_mb_set) {
        MT_WARN("cuda engine: parallel.bucket_mb = %g does not apply to ZeRO-%d on GPUs: each block's (the MLP: "
                "each hidden layer's) gradients are reduced together as backward leaves it (docs/gpu.md)",
                par->bucket_mb, e->zero3 ? 3 : 2);
    }
    if (mt_rt_world()->rank == 0 && e->zero3 && par->persist_threshold_set) {
        MT_WARN("cuda engine: parallel.zero_persist_threshold = %lld does not apply to ZeRO-3 on GPUs: the "
                "embedding's and the head's parameters stay whole on every rank and each block (the MLP: each hidden "
                "layer) is sharded (docs/gpu.md)",
                (long long)par->persist_threshold);
    }
    /* the pipeline: this rank's stage (the mesh's pp coordinate) and its blocks, from the CPU engines' split */
    e->pp = info->mesh ? mt_mesh_axis_size(info->mesh, MT_AXIS_PP) : 1;
    e->first = e->last = true;
    e->n_slots = 1;
    if (e->pp > 1) {
        int me = 0, coords[MT_AXIS_N], L = mt_model_config(e->model)->n_layer;
        MPI_Comm_rank(info->comm, &me);
        mt_mesh_coords(info->mesh, me, coords);
        e->stage = coords[MT_AXIS_PP];
        e->first = e->stage == 0;
        e->last = e->stage == e->pp - 1;
        e->sched = par->schedule;
        int *bounds = malloc((size_t)(e->pp + 1) * sizeof(int));
        st = bounds ? mt_pipeline_split(e->model, e->pp, par->stage_layers, bounds)
                    : mt_error(MT_ERR_OOM, "cuda engine: out of memory");
        if (st == MT_OK) { /* modules: 0 the embeddings, 1 .. L the blocks, L + 1 the head */
            gp.stage_lo = MT_MAX(bounds[e->stage], 1) - 1;
            gp.stage_hi = MT_MIN(bounds[e->stage + 1], L + 1) - 1;
            gp.stage_ends = (bounds[e->stage] == 0) | (bounds[e->stage + 1] == L + 2) << 1;
        }
        /* an activation set per micro-batch in flight: GPipe all of them, 1F1B min(pp - stage, m) */
        e->n_slots = mt_pipeline_max_in_flight(e->sched, e->pp, e->stage, (int)e->ga);
        gp.act_sets = e->n_slots;
        free(bounds);
        if (st != MT_OK) {
            goto fail;
        }
    }
    /* the rank's GPU: local rank modulo the visible devices (runtime/topo binds the CPUs near the same one).
     * NCCL cannot put two ranks of a communicator on one GPU: ranks that share one talk through MPI and pinned
     * host memory (the staged backend), as runtime.gpu_comm = "mpi" asks for everywhere; the emulator runs the
     * staged backend, device-memory calls and all, unless it has its emulated NCCL (MT_CUDA_EMU_NCCL). */
    st = mt_cuda_status(cudaSetDevice(mt_rt_world()->local_rank % ndev), "cudaSetDevice");
    bool multi = e->dp_size > 1 || e->pp > 1 || e->tp > 1;
    const char *gpu_comm = mt_config_str(cfg, "runtime.gpu_comm");
    int la = 0, lb = 0;
    char shared_bus[40];
    e->gpu_sharers = 1;
    e->gpu_first = true;
    bool shared = multi && (!MT_CUDA_EMULATED || MT_CUDA_EMU_NCCL) &&
                  gpu_shared(ndev, &la, &lb, shared_bus, sizeof(shared_bus), &e->gpu_sharers, &e->gpu_first);
    int staged = (MT_CUDA_EMULATED && !MT_CUDA_EMU_NCCL && MT_HAVE_COLL_STAGED) || shared || !strcmp(gpu_comm, "mpi");
    if (shared && !strcmp(gpu_comm, "nccl") && st == MT_OK) {
        st = mt_error(MT_ERR_INVALID_ARG,
                      "runtime.gpu_comm = \"nccl\": local ranks %d and %d on host %s would both drive GPU %s (each "
                      "rank takes visible device local_rank mod %d), and NCCL needs one GPU per rank: start one rank "
                      "per GPU (mpirun --map-by ppr:%d:node, srun --ntasks-per-node=%d or --gpus-per-task=1), or set "
                      "runtime.gpu_comm = \"mpi\" (slower: through host memory)",
                      la, lb, mt_rt_world()->hostname, shared_bus, ndev, ndev, ndev);
    } else if (shared && mt_rt_world()->local_rank == la) {
        MT_WARN("cuda engine: local ranks %d and %d on host %s share GPU %s, which NCCL refuses: their "
                "communication goes through MPI and host memory (runtime.gpu_comm = \"mpi\"; one rank per GPU "
                "for NCCL: mpirun --map-by ppr:%d:node or srun --gpus-per-task=1)",
                la, lb, mt_rt_world()->hostname, shared_bus, ndev);
    }
    if (multi) {
        /* The dp communicators are created collectively over info->comm: every rank must get there, so the
         * ranks agree on the device choice first and allocate only afterwards (a rank failing alone before a
         * collective would leave the others waiting in it). */
        int mine[2] = {st != MT_OK, staged}, any[2] = {1, 1};
        if (MPI_Allreduce(mine, any, 2, MPI_INT, MPI_MAX, info->comm) != MPI_SUCCESS) {
            any[0] = 1;
        }
        /* one backend for the whole job (NCCL on one host and MPI on another could never meet) */
        bool nccl_named = !strcmp(gpu_comm, "nccl") && (!MT_CUDA_EMULATED || MT_CUDA_EMU_NCCL);
        e->comm_backend = any[1] ? "staged" : nccl_named ? "nccl" : NULL;
        if (MT_CUDA_EMULATED && !MT_HAVE_COLL_STAGED) {
            e->comm_backend = NULL; /* host memory by priority, above */
        }
        if (any[1] && e->tp > 1 && par->tp_comm_chunks > 1 && mt_rt_world()->rank == 0) {
            MT_WARN("cuda engine: parallel.tp_comm_chunks = %d through MPI (the staged backend): each chunk's "
                    "collective blocks the host in turn, so nothing overlaps (NCCL, one rank per GPU, overlaps them)",
                    par->tp_comm_chunks);
        }
        if (any[0] && st == MT_OK) {
            st = mt_error(MT_ERR_CUDA, "cuda engine: another rank could not select its GPU (its message is above)");
        }
        if (st == MT_OK && e->dp_size > 1) {
            st = dp_comms_init(e, info);
        }
        if (st == MT_OK && e->pp > 1) {
            st = cuda_engine_pp_comms_init(e, info);
        }
        if (st == MT_OK && e->tp > 1) {
            st = cuda_engine_tp_comms_init(e, info);
        }
        if (st == MT_OK && (e->tp > 1 || (e->zero && e->pp > 1))) {
            st = cuda_engine_norm_comm_init(e, info);
        }
    }
    if (st != MT_OK) {
        goto fail;
    }
    measure_peak(e, mt_rt_world()->local_rank % ndev);
    mt_mem_reset_peak(MT_MEM_DEVICE); /* the job's device peaks are its own (one device engine per process) */
    /* host weights: the random init (model.init = llmc:PATH arrives through the checkpoint pieces), then
     * uploaded; the host copy stays as the checkpoints' staging */
    MT_CHECK_GOTO(mt_model_alloc_params(e->model), st, fail);
    mt_model_init_weights(e->model);
    gp.B = (int)e->mb;
    gp.T = (int)e->T;
    gp.init_scale = info->set->prec.init_scale;
    gp.scale_window = info->set->prec.scale_window;
    gp.shard_count = e->zero ? e->dp_size : 1;
    gp.shard_index = e->zero ? e->dp_rank : 0;
    gp.shard_grads = e->zero2;
    gp.shard_weights = e->zero3;
    gp.opt_state = mt_optim_state_buffers(&e->optim);
    if (e->tp > 1) {
        cuda_engine_tp_ops(e);
        gp.tp_ops = &e->tp_ops;
        gp.tp_chunks = par->tp_comm_chunks;
        gp.recompute_block = e->recompute_block;
    }
    MT_CHECK_GOTO(mt_gpt2_cuda_init(e->model, &gp, &e->g), st, fail);
    mt_gpt2_cuda_shard(e->g, &e->sh_lo, &e->sh_hi, &e->sh_len);
    e->numel = mt_gpt2_cuda_numel(e->g); /* the stage's parameters */
    e->cstream = (cudaStream_t)mt_gpt2_cuda_stream(e->g);
    /* a step's micro-batch losses, or an evaluation's (up to MT_JOB_EVAL_CHUNK batches read at once) */
    e->loss_slots = e->ga * MT_MAX(1, info->set->eval_chunk);
    size_t loss_bytes = (size_t)e->loss_slots * 4;
    MT_CHECK_GOTO(mt_dev_malloc((void **)&e->loss_dev, loss_bytes, MT_MEM_OTHER, "cuda engine losses", e->cstream), st,
                  fail);
    MT_CHECK_GOTO(mt_cuda_status(cudaMallocHost((void **)&e->loss_host, loss_bytes), "pinned losses"), st, fail);
    /* a pipeline message: the stage boundary's residual rows (with sequence parallelism this tp rank's share) */
    e->act_elems = (size_t)(e->mb * e->T) * (size_t)mt_model_config(e->model)->n_embd;
    e->act_elems /= mt_model_config(e->model)->sequence_parallel ? (size_t)e->tp : 1u;
    size_t act_bytes = e->act_elems * mt_dtype_size(mt_prec_storage(e->prec));
    if (e->pp > 1) {
        MT_CHECK_GOTO(mt_dev_malloc(&e->sendbuf, act_bytes, MT_MEM_COMM, "pipeline send buffer", e->cstream), st, fail);
    }
    if (e->dp_size > 1) {
        /* the comm stream at the device's greatest priority, so queued compute kernels do not starve the
         * collectives that backward overlaps with (lower numbers are higher priorities) */
        int least = 0, greatest = 0;
        MT_CHECK_GOTO(mt_cuda_status(cudaDeviceGetStreamPriorityRange(&least, &greatest), "stream priorities"), st,
                      fail);
        MT_CHECK_GOTO(
            mt_cuda_status(cudaStreamCreateWithPriority(&e->comm_stream, cudaStreamNonBlocking, greatest), "stream"),
            st, fail);
        MT_CHECK_GOTO(mt_cuda_status(cudaEventCreateWithFlags(&e->ready, cudaEventDisableTiming), "event"), st, fail);
        MT_CHECK_GOTO(mt_cuda_status(cudaEventCreateWithFlags(&e->comm_done, cudaEventDisableTiming), "event"), st,
                      fail);
        mt_gpt2_cuda_set_grad_hook(e->g, on_grads, e);
        mt_gpt2_cuda_set_comm_stream(e->g, e->comm_stream);
        mt_gpt2_cuda_set_weight_hook(e->g, on_weights, e);
    }
    /* energy: read-only NVML counter of this GPU, when the library and the counter are there */
    char bus[32] = "";
    int d = 0;
    bool have_bus = !MT_CUDA_EMULATED && cudaGetDevice(&d) == cudaSuccess &&
                    cudaDeviceGetPCIBusId(bus, (int)sizeof(bus), d) == cudaSuccess;
    if (!MT_CUDA_EMULATED && !have_bus) {
        (void)cudaGetLastError(); /* no energy figures: not the next kernel launch's error */
    }
    if (have_bus && mt_nvml_open(bus, 0, &e->nvml) == MT_OK &&
        mt_nvml_energy_mj(e->nvml, &e->energy.mj_change) != MT_OK) {
        mt_nvml_close(e->nvml);
        e->nvml = NULL;
    }
    if (e->nvml) {
        mt_energy_steps_init(&e->energy, e->energy.mj_change, mt_now());
    }
    if (!e->nvml) {
        MT_INFO(MT_LOG_INIT, "cuda engine: no NVML energy counter: step metrics carry no energy_j");
    }
    if (e->pp > 1) {
        MT_INFO(MT_LOG_INIT,
                "cuda engine: pipeline stage %d of %d (%s, blocks [%d, %d), %zu parameters), %d "
                "activation sets",
                e->stage, e->pp, mt_pp_schedule_name(e->sched), gp.stage_lo, gp.stage_hi, e->numel, e->n_slots);
    }
    MT_INFO(MT_LOG_INIT, "cuda engine: device %d, %s, tp %d, dp %d (%s), buckets of %zu floats", d,
            mt_prec_name(gp.prec), e->tp, e->dp_size,
            e->zero3     ? "zero-3: each block's weights gathered before use, gradients reduced to their owners"
            : e->zero2   ? "zero-2: each block's gradients reduced to their slices' owners in every backward"
            : e->zero    ? "zero-1: buckets reduced to their slices' owners during backward, weights all-gathered"
            : e->overlap ? "ddp: all-reduce per bucket during backward"
                         : "dp: one all-reduce after backward",
            e->bucket_elems);
    *ctx = e;
    return MT_OK;
fail:
    if (!from_setup) {
        ce_free(e);
    }
    return st;
}

static mt_status_t ce_zero_grads(void *ctx) {
    cuda_engine_t *e = ctx;
    e->sent_tp = e->sent_pp = e->sent_dp = e->sent_other = 0.0; /* a step starts */
    return mt_gpt2_cuda_zero_grads(e->g);
}

/* Queues forward (and backward) of batch b's micro-batches on the compute stream, micro-batch k's mean loss into
 * slots[k] on the device (the last stage's, under pp); waits for nothing but the pinned token slots (and, with
 * runtime.gpu_comm = "mpi", the staged collectives, which block the host). */
static mt_status_t queue_batch(cuda_engine_t *e, const mt_batch_t *b, bool backward, float *slots) {
    if (e->pp > 1) {
        return cuda_engine_pp_queue_batch(e, b, backward, slots);
    }
    size_t n = (size_t)(e->mb * e->T);
    for (int64_t k = 0; k < e->ga; k++) {
        MT_CHECK(mt_gpt2_cuda_forward(e->g, b->inputs + k * n, b->targets + k * n));
        CU(cudaMemcpyAsync(slots + k, mt_gpt2_cuda_loss_dev(e->g), 4, cudaMemcpyDeviceToDevice, e->cstream));
        if (backward) {
            /* the gradients are final in the last micro-batch; ZeRO-2 takes every micro-batch's away */
            e->final_pass = k + 1 == e->ga;
            e->comm_now = e->gcomm && (e->zero2 || e->final_pass);
            e->pend_lo = e->pend_hi = e->numel;
            mt_status_t st = mt_gpt2_cuda_backward(e->g, 1.0f / (float)e->ga);
            e->comm_now = false;
            MT_CHECK(st);
        }
    }
    return MT_OK;
}

/* The one wait of forward/backward (the all-reduces go on on their own stream): the micro-batch losses of the
 * n batches queued into the slots, through pinned memory; means[i] = batch i's mean loss (the pipeline's
 * last stage's, broadcast to every stage). */
static mt_status_t read_losses(cuda_engine_t *e, int64_t n, double *means) {
    if (n * e->ga > e->loss_slots) {
        return mt_error(MT_ERR_INVALID_USAGE, "cuda engine: %lld batches' losses, room for %lld", (long long)n,
                        (long long)(e->loss_slots / e->ga));
    }
    if (e->pp == 1 || e->last) {
        CU(cudaMemcpyAsync(e->loss_host, e->loss_dev, (size_t)(n * e->ga) * 4, cudaMemcpyDeviceToHost, e->cstream));
    }
    CU(cudaStreamSynchronize(e->cstream));
    for (int64_t i = 0; i < n; i++) {
        const float *l = e->loss_host + i * e->ga;
        double sum = 0.0;
        for (int64_t k = 0; (e->pp == 1 || e->last) && k < e->ga; k++) {
            sum += (double)l[k];
        }
        means[i] = sum / (double)e->ga;
    }
    if (e->pp > 1) {
        MT_CHECK(mt_coll_broadcast(e->pplcomm, means, means, (size_t)n, MT_COLL_F64, e->pp - 1, NULL, NULL));
        e->sent_other += e->last ? 8.0 * (double)n * (double)(e->pp - 1) / (double)e->pp : 0.0;
    }
    return MT_OK;
}

static mt_status_t ce_run_batch(void *ctx, const mt_batch_t *b, bool backward, double *loss) {
    cuda_engine_t *e = ctx;
    MT_CHECK(queue_batch(e, b, backward, e->loss_dev));
    return read_losses(e, 1, loss);
}

/* Evaluation: batch after batch on the compute stream, one wait for all their losses (MT_JOB_EVAL_CHUNK). */
static mt_status_t ce_eval_batch(void *ctx, const mt_batch_t *b, int64_t i) {
    cuda_engine_t *e = ctx;
    if (i < 0 || (i + 1) * e->ga > e->loss_slots) {
        return mt_error(MT_ERR_INVALID_USAGE, "cuda engine: evaluation slot %lld, room for %lld batches (sized from "
                        "train.eval_batches at init)", (long long)i, (long long)(e->loss_slots / e->ga));
    }
    return queue_batch(e, b, false, e->loss_dev + i * e->ga);
}

static mt_status_t ce_eval_losses(void *ctx, int64_t n, double *losses) {
    return read_losses(ctx, n, losses);
}

static mt_status_t ce_finish_grads(void *ctx) {
    cuda_engine_t *e = ctx;
    if (e->gcomm) { /* the optimizer (compute stream) waits for the last all-reduce on the device, not the host */
        CU(cudaEventRecord(e->comm_done, e->comm_stream));
        CU(cudaStreamWaitEvent(e->cstream, e->comm_done, 0));
        MT_CHECK(mt_comm_get_async_error(e->gcomm));
    }
    if (e->embcomm) { /* the tied wte: the first stage's (embedding) and the last's (head) gradients summed */
        size_t n = mt_model_param(e->model, 0)->numel;
        float *gw = mt_gpt2_cuda_wte_grad(e->g);
        MT_CHECK(mt_coll_all_reduce(e->embcomm, gw, gw, n, MT_COLL_F32, MT_REDOP_SUM, e->cstream, NULL));
        e->sent_pp += (double)n * 4.0; /* 2b(n-1)/n over 2 ranks */
        if (e->zero2 && e->sh_lo < n) { /* wte's part of the slice (the layout's first n elements) */
            size_t b = MT_MIN(n, e->sh_hi);
            CU(cudaMemcpyAsync(mt_gpt2_cuda_grad_slice(e->g), gw + e->sh_lo, (b - e->sh_lo) * 4,
                               cudaMemcpyDeviceToDevice, e->cstream));
        }
    }
    return MT_OK;
}

static mt_status_t ce_grad_sumsq(void *ctx, double *total) {
    cuda_engine_t *e = ctx;
    bool nonfinite = false;
    MT_CHECK(mt_gpt2_cuda_grad_stats(e->g, total, &nonfinite));
    /* each rank summed its slice (ZeRO) or its stage (pp; the tied wte once): the norm and the fp16 overflow
     * verdict are the group's */
    mt_comm_t over = e->normcomm ? e->normcomm : e->zero ? e->lcomm : e->pp > 1 ? e->pplcomm : NULL;
    if (over) {
        double v[2] = {*total, nonfinite ? 1.0 : 0.0};
        MT_CHECK(mt_coll_all_reduce(over, v, v, 2, MT_COLL_F64, MT_REDOP_SUM, NULL, NULL));
        e->sent_other += 2.0 * sizeof(v) * (double)(mt_comm_size(over) - 1) / (double)mt_comm_size(over);
        *total = v[0];
        nonfinite = v[1] > 0.0;
        mt_gpt2_cuda_set_nonfinite(e->g, nonfinite);
    }
    float scale = mt_gpt2_cuda_loss_scale(e->g);
    if (nonfinite && e->prec == MT_PREC_FP16) {
        /* fp16 loss scaling: an overflow is expected now and then; the step skips it and halves the scale.
         * The gradients are averaged (ZeRO-1: the verdict is agreed above), so every rank sees the same
         * overflow and takes the same decision. */
        MT_INFO(MT_LOG_TRAIN, "fp16: inf/NaN gradients at loss scale %g: the step is skipped, the scale halves",
                (double)scale);
        *total = 0.0;
    }
    return MT_OK;
}

static mt_status_t ce_step(void *ctx, float lr, float grad_scale) {
    cuda_engine_t *e = ctx;
    bool skipped = false;
    MT_CHECK(mt_gpt2_cuda_step_scaled(e->g, &e->optim, lr, grad_scale, &skipped));
    if (!e->zero || e->zero3 || skipped) { /* a skipped fp16 step changed no slice (and every rank skipped it);
                                            * ZeRO-3 gathers at the next use */
        return MT_OK;
    }
    /* ZeRO-1: every rank's updated slice of the compute copy to every rank, in place, on the comm stream
     * after the update; the next forward (compute stream) waits for it on the device */
    mt_dtype_t dt = mt_prec_storage(e->prec);
    char *w = mt_gpt2_cuda_weights(e->g);
    CU(cudaEventRecord(e->ready, e->cstream));
    CU(cudaStreamWaitEvent(e->comm_stream, e->ready, 0));
    MT_CHECK(mt_coll_all_gather(e->gcomm, w + (size_t)e->dp_rank * e->sh_len * mt_dtype_size(dt), w, e->sh_len,
                                (mt_coll_dtype_t)dt, e->comm_stream, NULL));
    e->sent_dp += (double)e->sh_len * (double)mt_dtype_size(dt) * (double)(e->dp_size - 1);
    CU(cudaEventRecord(e->comm_done, e->comm_stream));
    CU(cudaStreamWaitEvent(e->cstream, e->comm_done, 0));
    return mt_comm_get_async_error(e->gcomm);
}

static mt_status_t ce_reduce_loss(void *ctx, double *loss) {
    cuda_engine_t *e = ctx;
    if (!e->lcomm) {
        return MT_OK;
    }
    e->sent_other += 2.0 * sizeof(*loss) * dp_frac(e);
    return mt_coll_all_reduce(e->lcomm, loss, loss, 1, MT_COLL_F64, MT_REDOP_AVG, NULL, NULL);
}

/* The step's bytes as counted at each call (dp_frac; tp and pp as the CPU engines count theirs). */
static void ce_comm_bytes(void *ctx, double *model, double *other) {
    cuda_engine_t *e = ctx;
    *model = e->sent_tp + e->sent_pp + e->sent_dp;
    *other = e->sent_other;
}

static void ce_comm_bytes_groups(void *ctx, double *tp, double *pp, double *dp) {
    cuda_engine_t *e = ctx;
    *tp = e->sent_tp;
    *pp = e->sent_pp;
    *dp = e->sent_dp;
}

/* The parameters and their optimizer state (AdamW's moments "adamw.m" and "adamw.v", SGD's momentum
 * "sgd.momentum", plain SGD none: the CPU engines' names), staged in host memory: save copies the device state
 * there first and lists what this rank writes (dp rank 0 its stage's, the replicas being equal; under ZeRO every
 * rank the weights and state of its slice), a load lists what the rank holds (every weight of its stage, the
 * state of its slice) and ce_ckpt_loaded uploads them. */
static mt_status_t ce_ckpt_pieces(void *ctx, bool save, mt_ckpt_piece_t **pieces, int *n) {
    cuda_engine_t *e = ctx;
    *pieces = NULL;
    *n = 0;
    if (save && e->dp_rank != 0 && !e->zero) {
        return MT_OK;
    }
    size_t lo = e->sh_lo, hi = e->sh_hi;
    int n_state = mt_optim_state_buffers(&e->optim);
    const char *state_kind[2] = {e->optim.kind == MT_OPTIM_SGD ? "sgd.momentum" : "adamw.m", "adamw.v"};
    float **stage[2] = {&e->h_m, &e->h_v};
    for (int k = 0; k < n_state; k++) {
        if (!*stage[k]) {
            *stage[k] = mt_calloc(MT_MAX(hi - lo, 1) * 4, MT_MEM_OPTIMIZER, "cuda engine checkpoint staging");
            if (!*stage[k]) {
                return mt_error(MT_ERR_OOM, "checkpoint: no host memory to stage %zu optimizer values", hi - lo);
            }
        }
    }
    float *params = mt_model_params_flat(e->model);
    if (save) {
        MT_CHECK(mt_gpt2_cuda_get_state(e->g, params, e->h_m, e->h_v));
    }
    mt_plist_t l = {0};
    mt_status_t st = MT_OK;
    for (int i = 0; i < mt_model_n_params(e->model) && st == MT_OK; i++) {
        const mt_param_t *p = mt_model_param(e->model, i);
        size_t off = mt_gpt2_cuda_param_offset(e->g, i); /* in the trainer's layout (a stage's: its own) */
        if (off == SIZE_MAX || (save && i == 0 && e->last && !e->first) || (save && e->tpr != 0 && p->tp_dim < 0)) {
            continue; /* not on this stage; the last stage's copy of the tied wte: the first stage writes it; a
                       * parameter whole on every tp rank: tp rank 0 writes it */
        }
        size_t a = MT_MAX(off, lo) - off, b = MT_MIN(off + p->numel, hi);
        b = b > off ? b - off : 0; /* [a, b): the slice's part of p */
        /* the weights (in the model's host layout): the slice's part on save, whole on a load */
        size_t wa = save ? a : 0, wb = save ? b : p->numel;
        st = mt_plist_push_flat(&l, "param", p, e->tp, e->tpr, wa, wb, params + p->offset + wa);
        for (int k = 0; k < n_state && st == MT_OK && a < b; k++) {
            st = mt_plist_push_flat(&l, state_kind[k], p, e->tp, e->tpr, a, b, *stage[k] + (off + a - lo));
        }
    }
    if (st != MT_OK) {
        free(l.v);
        return st;
    }
    *pieces = l.v;
    *n = l.n;
    return MT_OK;
}

static int64_t ce_ckpt_get_step(void *ctx) {
    return mt_gpt2_cuda_get_step(((cuda_engine_t *)ctx)->g);
}

static void ce_ckpt_set_step(void *ctx, int64_t t) {
    mt_gpt2_cuda_set_step(((cuda_engine_t *)ctx)->g, t);
}

/* After a load (a checkpoint, or model.init = llmc:PATH with zero moments): the staged state goes up. */
static mt_status_t ce_ckpt_loaded(void *ctx) {
    cuda_engine_t *e = ctx;
    return mt_gpt2_cuda_set_state(e->g, mt_model_params_flat(e->model), e->h_m, e->h_v);
}

/* Device memory for the metrics: every device buffer of the engine comes from the caching allocator, which
 * accounts each block under its category (mt_mem_stats(MT_MEM_DEVICE) is its per-category statistics); the
 * allocator itself adds the bytes it holds from the driver. */
static void ce_device_mem(void *ctx, mt_mem_stats_t *stats, int64_t *reserved) {
    mt_mem_stats(MT_MEM_DEVICE, stats);
    mt_cuda_alloc_t a = NULL;
    mt_cuda_alloc_stats_t as = {0};
    if (mt_cuda_alloc_default(&a) == MT_OK) {
        mt_cuda_alloc_get_stats(a, &as);
    }
    *reserved = as.reserved_bytes;
}

/* fp16 scales on the device: the loop reports and checkpoints this scaler (the manifest's "precision"). */
static mt_loss_scaler_t *ce_loss_scaler(void *ctx) {
    return mt_gpt2_cuda_scaler(((cuda_engine_t *)ctx)->g);
}

static bool ce_step_energy(void *ctx, double *joules) {
    cuda_engine_t *e = ctx;
    uint64_t mj = 0;
    if (e->nvml && !e->gpu_first) { /* the GPU's first rank counts its energy (the job sums over ranks) */
        *joules = 0.0;
        return true;
    }
    if (!e->nvml || mt_nvml_energy_mj(e->nvml, &mj) != MT_OK) {
        return false;
    }
    unsigned mw = 0;
    double watts = mt_nvml_power_mw(e->nvml, &mw) == MT_OK ? mw * 1e-3 : -1.0;
    return mt_energy_steps_update(&e->energy, mj, mt_now(), watts, joules);
}

/* The peak measure_peak found at the start (the loop sums it over the ranks). */
static double ce_peak_flops(void *ctx, char *src, size_t len) {
    cuda_engine_t *e = ctx;
    snprintf(src, len, "%s", e->peak_src);
    return e->peak;
}

static const mt_job_engine_t cuda_engine = {
    .name = "cuda",
    .setup_model = ce_setup_model,
    .init = ce_init,
    .zero_grads = ce_zero_grads,
    .finish_grads = ce_finish_grads,
    .grad_sumsq = ce_grad_sumsq,
    .step = ce_step,
    .reduce_loss = ce_reduce_loss,
    .free = ce_free,
    .ckpt_pieces = ce_ckpt_pieces,
    .ckpt_get_step = ce_ckpt_get_step,
    .ckpt_set_step = ce_ckpt_set_step,
    .ckpt_loaded = ce_ckpt_loaded,
    .run_batch = ce_run_batch,
    .eval_batch = ce_eval_batch,
    .eval_losses = ce_eval_losses,
    .any_precision = true,
    .own_activations = true,
    .pipelines = true,
    .step_energy = ce_step_energy,
    .peak_flops = ce_peak_flops,
    .loss_scaler = ce_loss_scaler,
    .device_mem = ce_device_mem,
    .comm_bytes = ce_comm_bytes,
    .comm_bytes_groups = ce_comm_bytes_groups,
};

#else /* !MT_HAVE_CUDA */

static mt_status_t ce_init(const mt_job_info_t *info, void **ctx) {
    *ctx = NULL;
    return mt_error(MT_ERR_INVALID_ARG,
                    "runtime.device = \"%s\": this meshtrain was built without CUDA (configure it where the CUDA "
                    "Toolkit is installed), or set runtime.device = \"cpu\"",
                    mt_config_str(info->cfg, "runtime.device"));
}

static void ce_free(void *ctx) {}

/* tp > 1 reaches set-up before init: the same refusal there. */
static mt_status_t ce_setup_model(const mt_job_info_t *info, mt_model_config_t *mc, void **ctx) {
    (void)mc;
    return ce_init(info, ctx);
}

static const mt_job_engine_t cuda_engine = {
    .name = "cuda",
    .setup_model = ce_setup_model,
    .init = ce_init,
    .free = ce_free,
    .any_precision = true,
    .own_activations = true,
};

#endif

const mt_job_engine_t *mt_job_engine_cuda(void) {
    return &cuda_engine;
}
