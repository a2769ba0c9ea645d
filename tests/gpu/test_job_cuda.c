/* The GPU engine of the training loop (train/job_cuda.c) against the CPU engines on a small GPT-2 over
 * synthetic data, 5 steps of AdamW with 2 micro-batches per step:
 *   - fp32 losses within 1e-3 (relative) of the CPU run at every step (the single-process engine on one
 *     rank, the CPU DDP engine on two), the same tolerance as test_gpt2_cuda;
 *   - bucketed all-reduces during backward (parallel.engine = "ddp", buckets of ~1 KiB: one per run of
 *     parameters) and one all-reduce after backward ("dp") give the same losses (dp = 2 exercises them);
 *   - model.recompute = "block" gives the losses of the run without it;
 *   - bf16 trains (loss falls) within 3e-2 of the CPU; fp16 (loss scale 1024) within 1e-2; fp16 from a
 *     loss scale of 2^24 overflows, skips those steps (gradient norm 0) and trains on;
 *   - a checkpoint written after step 3 and resumed gives the losses of the uninterrupted run, and resumed
 *     on the CPU engine, those of the CPU run (1e-3);
 *   "the same losses": 1e-6 relative under the emulator (in practice equal), 1e-4 on a device (SAME_TOL);
 *   - metrics.jsonl carries energy_j and tokens_per_j exactly when NVML reads this GPU's energy counter
 *     (never under the CPU emulator, whose device has no NVML): absent, not zero, otherwise;
 *   - its mem_bytes are device memory ("mem_space": "device"): every category and the peak equal the caching
 *     allocator's statistics (mt_mem_stats(MT_MEM_DEVICE), whose peaks the engine restarts at its start),
 *     mem_reserved its reserved bytes, and the result's mem_peak the same peaks;
 *   - MFU: the engine's peak is known, so the result's MFU is positive: on a device measured at the start
 *     (MESHTRAIN_GPU_PEAK_N = 2048 keeps it short), under the emulator given by MESHTRAIN_PEAK_GFLOPS_PER_GPU
 *     (the engine measures nothing there: an emulated rate means nothing); mt_cuda_gemm_peak itself runs
 *     on both (a small product under the emulator), returns a positive rate and gives its memory back;
 *   - ZeRO-1, -2 and -3 (parallel.engine = "zero"; slices of the optimizer state, from stage 2 of the
 *     gradients, at stage 3 of the weights, per dp rank; buckets reduced to their owners, the compute copy
 *     all-gathered, or under ZeRO-3 gathered block by block) give the losses of the DDP run in fp32 and bf16,
 *     and in fp16 from 2^24 the same skipped steps; each rank holds 1/dp of AdamW's moments (device
 *     optimizer bytes summed over the ranks equal DDP's per rank, to the allocator's rounding); with 16
 *     blocks on 2 ranks ZeRO-2's and ZeRO-3's gradient bytes and ZeRO-3's weight bytes are below 0.8 of
 *     DDP's (slots, wte/wpe/ln_f and half the layout, against the whole layout); a ZeRO checkpoint resumed
 *     under the same stage gives the uninterrupted run's losses, resumed on the CPU DDP engine the CPU run's
 *     (1e-3); a DDP checkpoint resumed under ZeRO the DDP run's;
 *   - fp16 with precision.scale_window = 3 from loss scales 2^20 and 2^21 (a doubling after step 3, then an
 *     overflow; an overflow at step 1, then a doubling after step 4), interrupted after step 3 and resumed,
 *     continues with the loss scale and clean-step count its manifest's "precision" section saved: the same
 *     losses, gradient norms, skipped steps and final loss scale as the uninterrupted run.
 * Built three times: against the CUDA runtime (label gpu; exits 77 printing "skipped: no CUDA device" without a
 * device, or with fewer devices than ranks unless --staged), against the CPU emulator (labels unit;emu), where
 * device-memory communication goes through the staged backend (MPI through host memory) as with --staged
 * (runtime.gpu_comm = "mpi"), which on a device lets several ranks share one GPU: the multi-rank engine on a
 * one-GPU machine (there the GPU's peak is not measured, so MFU is n/a), and against the emulator with its
 * emulated NCCL (MT_CUDA_EMU_NCCL, tests/gpu/emu/emu_nccl.cpp; one emulated device per rank): the engine over
 * collectives/coll_nccl.c, as on a multi-GPU node. Its mode nccl_shared (fewer emulated devices than ranks):
 * runtime.gpu_comm = "nccl" refused, "auto" through MPI; its mode host_waits: the host waits of a training step
 * (the emulator's count) by layout, exactly those docs/gpu.md states.
 * SPDX-License-Identifier: MIT */
#include "mt_build_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/job.h"
#include "train/job_json.h"
#include "models/cuda/gemm_peak.h"
#include "models/cuda/mt_cuda.h"
#include "plan/plan.h"
#include "runtime/cuda_alloc.h"
#include "runtime/mesh.h"
#include "runtime/nvml.h"
#include "runtime/rt.h"
#include "job_cuda_base.h"
#include "testutil.h"

#ifndef MT_CUDA_EMULATED
#define MT_CUDA_EMULATED 0
#endif
#ifndef MT_CUDA_EMU_NCCL /* built with the emulated NCCL (tests/gpu/emu/emu_nccl.cpp): one device per rank */
#define MT_CUDA_EMU_NCCL 0
#endif

enum { STEPS = 5 };

/* Runs that compute the same function: exact under the emulator; on a device dwte's float atomics add in
 * a run-dependent order, which AdamW can magnify in near-zero gradients over the steps. */
#define SAME_TOL (MT_CUDA_EMULATED ? 1e-6 : 1e-4)
/* ZeRO-2/3 against DDP in bf16: they add each micro-batch's average to the slice where DDP averages the
 * accumulated sum, a different f32 rounding, which a bf16 weight can turn into a different bf16 value
 * (measured under the emulator: 2.7e-5 at step 4; fp32 and fp16 stay within SAME_TOL). */
#define ZERO2_BF16_TOL 1e-4
/* parallel.tp_comm_chunks in bf16 against one chunk: exact under the emulator; on a device cuBLASLt may pick
 * another kernel for a chunk's fewer rows, whose f32 sums round differently, and a bf16 activation can then round
 * to its neighbour (not measured yet; the bf16 runs' tolerance against the CPU is 3e-2) */
#define CHUNK_BF16_TOL (MT_CUDA_EMULATED ? SAME_TOL : 1e-2)

static const char *base[] = {MT_JOB_CUDA_BASE_ARGS};

/* --staged: the GPU engine's communication through MPI and host memory (runtime.gpu_comm = "mpi"), ranks free to
 * share a GPU; --shared: ranks free to share a GPU with runtime.gpu_comm = "auto", which must then choose MPI
 * by itself (sharing: more ranks on the host than GPUs). */
static bool staged, shared_ok, sharing;

#if MT_CUDA_EMULATED
static size_t run_waits[MT_EMU_WAIT_KINDS]; /* the host waits of run_mesh's last job (mt_job_run), by kind */
#endif

/* The planner's device memory for the run's layout (plan/plan_mem_gpu.c: the trainer's init sized without a
 * device, the engine's buffers, the allocator's blocks) against what this rank's allocator accounted (its device
 * peaks, restarted at the engine's start), category by category, for this rank's stage: equal on dp rank 0 (the
 * plan's rank, the largest ZeRO slice), at most that on the others; and the most over the stages equal to the
 * run's result, the most over the ranks. */
static void plan_matches(const mt_config_t *cfg, int tp, int pp, const mt_job_result_t *r) {
    const mt_world_t *w = mt_rt_world();
    mt_plan_job_t job;
    CHECK_OK(mt_plan_job_from_config(cfg, &job));
    job.gpu = true;
    /* the staged backend has no device scratch */
    job.gpu_staged = (MT_CUDA_EMULATED && !MT_CUDA_EMU_NCCL) || staged || sharing;
    mt_settings_t set;
    CHECK_OK(mt_settings_read(cfg, &set));
    int zs = mt_settings_zero(&set.par);
    mt_plan_layout_t l = {.tp = tp, .pp = pp, .dp = w->size / (tp * pp)};
    l.engine = zs ? (mt_plan_engine_t)(MT_PLAN_ZERO1 + zs - 1) : MT_PLAN_DDP; /* the GPU engine's dp, any tp/pp */
    l.schedule = set.par.schedule == MT_PP_GPIPE ? MT_PLAN_GPIPE : MT_PLAN_1F1B;
    l.micro_batch = (int)mt_config_int(cfg, "train.micro_batch");
    l.microbatches = (int)mt_config_int(cfg, "train.grad_accum");
    l.sp = set.par.sequence_parallel;
    l.recompute = strcmp(mt_config_str(cfg, "model.recompute"), "block") ? MT_PLAN_RC_NONE : MT_PLAN_RC_BLOCK;
    snprintf(l.order, sizeof(l.order), "tp-dp-pp");
    int coords[MT_AXIS_N] = {0};
    coords[MT_AXIS_DP] = w->rank;
    mt_mesh_t *mesh = NULL;
    if (tp > 1 || pp > 1) {
        CHECK_OK(mt_mesh_create(w->size, tp, pp, l.dp, l.order, &mesh));
        mt_mesh_coords(mesh, w->rank, coords);
        mt_mesh_free(mesh);
    }
    int64_t most[MT_MEM_NCAT] = {0}, mine[MT_MEM_NCAT] = {0};
#if MT_CUDA_EMULATED
    size_t calls = mt_emu_api_calls();
#endif
    for (int st = 0; st < pp; st++) {
        int64_t mem[MT_MEM_NCAT];
        CHECK_OK(mt_plan_stage_mem(&job, &l, st, mem));
        for (int k = 0; k < MT_MEM_NCAT; k++) {
            most[k] = MT_MAX(most[k], mem[k]);
            mine[k] = st == coords[MT_AXIS_PP] ? mem[k] : mine[k];
        }
    }
#if MT_CUDA_EMULATED /* the trainer's dry init (mt_gpt2_cuda_requests) touches no device */
    CHECK(mt_emu_api_calls() == calls, "planning %d stage(s) made %zu device calls", pp, mt_emu_api_calls() - calls);
#endif
    mt_mem_stats_t ds;
    mt_mem_stats(MT_MEM_DEVICE, &ds);
    bool exact = coords[MT_AXIS_DP] == 0 || l.engine == MT_PLAN_DDP;
    static const char *names[] = {"params", "grads", "optimizer", "activations", "comm", "other"};
    static const mt_mem_cat_t cats[] = {MT_MEM_PARAMS,      MT_MEM_GRADS, MT_MEM_OPTIMIZER,
                                        MT_MEM_ACTIVATIONS, MT_MEM_COMM,  MT_MEM_OTHER};
    char lay[96];
    mt_plan_layout_str(&l, lay, sizeof(lay));
    for (size_t k = 0; k < MT_ARRAY_LEN(cats); k++) {
        int64_t plan = mine[cats[k]], run = ds.peak[cats[k]];
        CHECK(exact ? plan == run : run <= plan, "plan %s, rank %d (stage %d, dp rank %d): device %s %lld bytes, the "
              "rank's peak %lld", lay, w->rank, coords[MT_AXIS_PP], coords[MT_AXIS_DP], names[k], (long long)plan,
              (long long)run);
        CHECK(most[cats[k]] == r->mem_peak[cats[k]], "plan %s: device %s %lld bytes on the fullest stage, the run's "
              "peak %lld (max over ranks)", lay, names[k], (long long)most[cats[k]], (long long)r->mem_peak[cats[k]]);
    }
}

/* Runs the job with base + extra on the world over a tp x dp x pp mesh (tp-dp-pp order) when tp or pp > 1; device
 * "cuda" takes the GPU engine, else the CPU engine the layout calls for (the model-parallel one for tp or pp > 1);
 * the GPU engine's device memory is checked against the planner's (plan_matches) unless parallel.stage_layers
 * splits the pipeline by hand. */

static mt_status_t run_mesh(const char *device, int tp, int pp, int n_extra, const char *const *extra,
                            mt_job_result_t *res) {
    const mt_world_t *w = mt_rt_world();
    char *args[64], gb[64], dev[64];
    int n = 0, dp = w->size / (tp * pp);
    for (size_t i = 0; i < MT_ARRAY_LEN(base); i++) {
        args[n++] = (char *)base[i];
    }
    char ppa[64], tpa[64];
    snprintf(gb, sizeof(gb), "--train.global_batch=%d", 4 * dp);
    snprintf(ppa, sizeof(ppa), "--parallel.pp=%d", pp);
    snprintf(tpa, sizeof(tpa), "--parallel.tp=%d", tp);
    args[n++] = ppa;
    args[n++] = tpa;
    snprintf(dev, sizeof(dev), "--runtime.device=%s", device);
    args[n++] = gb;
    args[n++] = dev;
    if (staged) {
        args[n++] = "--runtime.gpu_comm=mpi";
    }
    int64_t stop_after = 0;
    for (int i = 0; i < n_extra; i++) {
        if (!strncmp(extra[i], "--stop-after=", 13)) { /* not a config key: the test's interruption */
            stop_after = atoll(extra[i] + 13);
        } else {
            args[n++] = (char *)extra[i];
        }
    }
    mt_config_t *cfg = NULL;
    mt_status_t st = mt_config_load(NULL, n, args, w->size, &cfg, stderr);
    CHECK(st == MT_OK, "config: %s", mt_last_error_msg());
    if (st != MT_OK) {
        memset(res, 0, sizeof(*res));
        return st;
    }
    mt_job_opts_t opts = MT_JOB_OPTS_INIT;
    opts.progress = w->rank == 0 ? stdout : NULL;
    opts.prefetch = false;
    mt_mesh_t *mesh = NULL;
    if (tp > 1 || pp > 1) {
        CHECK_OK(mt_mesh_create(w->size, tp, pp, dp, "tp-dp-pp", &mesh));
        int coords[MT_AXIS_N];
        mt_mesh_coords(mesh, w->rank, coords);
        opts.mesh = mesh;
        opts.dp_rank = coords[MT_AXIS_DP];
        opts.dp_size = dp;
    }
    if (!strcmp(device, "cuda")) {
        opts.engine = mt_job_engine_cuda();
    } else if (tp > 1 || pp > 1) {
        opts.engine = mt_job_engine_model_parallel(pp);
    } else if (w->size > 1) {
        opts.engine = mt_job_engine_parallel();
    }
    opts.stop_after = stop_after;
    if (!strcmp(device, "cuda")) {
        mt_dev_empty_cache(); /* a job starts from an empty allocator, as in a fresh process (and the plan) */
    }
#if MT_CUDA_EMULATED
    size_t w0[MT_EMU_WAIT_KINDS];
    for (int k = 0; k < MT_EMU_WAIT_KINDS; k++) {
        w0[k] = mt_emu_host_waits(k);
    }
#endif
    st = mt_job_run(cfg, &opts, res);
#if MT_CUDA_EMULATED
    for (int k = 0; k < MT_EMU_WAIT_KINDS; k++) {
        run_waits[k] = mt_emu_host_waits(k) - w0[k];
    }
#endif
    if (st == MT_OK && !strcmp(device, "cuda") && !*mt_config_str(cfg, "parallel.stage_layers")) {
        plan_matches(cfg, tp, pp, res); /* the planner splits by compute: a split by hand is not planned */
    }
    mt_config_free(cfg);
    mt_mesh_free(mesh);
    return st;
}

static mt_status_t run_pp(const char *device, int pp, int n_extra, const char *const *extra, mt_job_result_t *res) {
    return run_mesh(device, 1, pp, n_extra, extra, res);
}

static mt_status_t run(const char *device, int n_extra, const char *const *extra, mt_job_result_t *res) {
    return run_pp(device, 1, n_extra, extra, res);
}

/* Every step's loss of a within tol (relative) of b's. */
static void same_losses(const char *what, const mt_job_result_t *a, const mt_job_result_t *b, double tol) {
    CHECK(a->n_steps == STEPS && b->n_steps == STEPS, "%s: %lld and %lld steps", what, (long long)a->n_steps,
          (long long)b->n_steps);
    for (int64_t s = 0; s < a->n_steps && s < b->n_steps; s++) {
        double d = fabs(a->loss[s] - b->loss[s]) / fabs(b->loss[s]);
        CHECK(d <= tol, "%s: step %lld loss %.9g vs %.9g (relative %.2e > %.0e)", what, (long long)s + 1, a->loss[s],
              b->loss[s], d, tol);
    }
}

/* Every step's gradient norm of a within tol (relative) of b's. */
static void same_norms(const char *what, const mt_job_result_t *a, const mt_job_result_t *b, double tol) {
    for (int64_t s = 0; s < STEPS && s < a->n_steps && s < b->n_steps; s++) {
        double d = fabs(a->grad_norm[s] - b->grad_norm[s]) / b->grad_norm[s];
        CHECK(d <= tol, "%s: step %lld gradient norm %.9g vs %.9g (relative %.2e > %.0e)", what, (long long)s + 1,
              a->grad_norm[s], b->grad_norm[s], d, tol);
    }
}

/* Both ran the same evaluations, each validation loss of a within tol (relative) of b's. */
static void same_evals(const char *what, const mt_job_result_t *a, const mt_job_result_t *b, double tol) {
    CHECK(a->n_evals == b->n_evals && a->n_evals >= 1, "%s: %lld and %lld evaluations", what, (long long)a->n_evals,
          (long long)b->n_evals);
    for (int64_t v = 0; v < a->n_evals && v < b->n_evals; v++) {
        double d = fabs(a->val_loss[v] - b->val_loss[v]) / b->val_loss[v];
        CHECK(d <= tol, "%s: evaluation %lld %.9g vs %.9g (relative %.2e > %.0e)", what, (long long)v + 1,
              a->val_loss[v], b->val_loss[v], d, tol);
    }
}

/* A run resumed from the checkpoint after step 3: it starts there, runs to STEPS, and its losses are ref's
 * within tol. */
static void resumed_losses(const char *what, const mt_job_result_t *r, const mt_job_result_t *ref, double tol) {
    CHECK(r->first_step == 3 && r->n_steps == STEPS, "%s: resumed after step %lld, ran to %lld", what,
          (long long)r->first_step, (long long)r->n_steps);
    for (int64_t s = 3; s < STEPS && s < r->n_steps && s < ref->n_steps; s++) {
        double d = fabs(r->loss[s] - ref->loss[s]) / ref->loss[s];
        CHECK(d <= tol, "%s, step %lld: %.9g vs %.9g", what, (long long)s + 1, r->loss[s], ref->loss[s]);
    }
}

/* `meshtrain plan` on a GPU cluster lists only what the GPU engine runs (no attn_recompute variants, no all-reduce
 * path with dp > 1), ZeRO-2/3 with a pipeline among them and tp with recompute = block (which the CPU engines
 * refuse), each layout once, with the device memory of its fullest stage as mt_plan_stage_mem sizes it. */
static void plan_gpu_layouts(void) {
    mt_plan_cluster_t c;
    CHECK_OK(mt_plan_cluster_load(MT_SOURCE_DIR "/tests/plan/data/tiny_gpu_cluster.toml", &c, stderr));
    const char *args[MT_ARRAY_LEN(base) + 3];
    int na = 0;
    for (size_t k = 0; k < MT_ARRAY_LEN(base); k++) {
        args[na++] = base[k];
    }
    args[na++] = "--precision.compute=bf16";
    args[na++] = "--train.global_batch=16";
    args[na++] = "--train.grad_accum=0"; /* derived for the 4 ranks */
    mt_config_t *cfg = NULL;
    CHECK_OK(mt_config_load(NULL, na, (char **)args, 4, &cfg, stderr));
    mt_plan_job_t job;
    CHECK_OK(mt_plan_job_from_config(cfg, &job));
    mt_plan_opts_t o = {.world = 4};
    mt_plan_pred_t *v = NULL;
    int n = 0;
    CHECK_OK(mt_plan_enumerate(&job, &c, &o, &v, &n));
    CHECK(n > 10, "%d GPU layouts of 4 ranks", n);
    job.gpu = true; /* as the planner places it on this cluster */
    int zero_pp = 0, tp_rc = 0;
    for (int i = 0; i < n; i++) {
        const mt_plan_layout_t *l = &v[i].l;
        char name[96];
        mt_plan_layout_str(l, name, sizeof(name));
        CHECK(l->recompute != MT_PLAN_RC_ATTN && l->recompute != MT_PLAN_RC_BLOCK_ATTN, "%s: attn_recompute", name);
        zero_pp += l->pp > 1 && (l->engine == MT_PLAN_ZERO2 || l->engine == MT_PLAN_ZERO3);
        tp_rc += l->tp > 1 && l->recompute == MT_PLAN_RC_BLOCK;
        CHECK(!(l->engine == MT_PLAN_ALLREDUCE && l->dp > 1), "%s: the all-reduce path", name);
        int64_t mem[MT_MEM_NCAT], total = 0;
        CHECK_OK(mt_plan_stage_mem(&job, l, v[i].mem_stage, mem));
        for (int k = 0; k < MT_MEM_NCAT; k++) {
            total += mem[k];
        }
        CHECK(total == v[i].mem_total, "%s: total %lld, stage %d sized %lld", name, (long long)v[i].mem_total,
              v[i].mem_stage, (long long)total);
    }
    CHECK(zero_pp >= 2, "%d GPU layouts with ZeRO-2/3 and a pipeline", zero_pp);
    CHECK(tp_rc >= 1, "%d GPU layouts with tp > 1 and recompute = block", tp_rc);
    free(v);
    mt_config_free(cfg);
    mt_plan_cluster_free(&c);
}

/* runtime.device and runtime.gpu_comm on ranks that would share a GPU (shared: more ranks on the host than GPUs,
 * as under the emulator's one device): "auto" trains on the CPU with a note naming the sharing unless
 * gpu_comm = "mpi"; "cuda" takes the GPU (the engine then talks through MPI). One GPU per rank: the GPU. */
static void device_choice(bool shared) {
    static const struct {
        const char *device, *gpu_comm;
        bool use_shared;
    } cases[] = {{"auto", "auto", false}, {"auto", "mpi", true}, {"cuda", "auto", true}, {"auto", "nccl", false}};
    for (size_t i = 0; i < MT_ARRAY_LEN(cases); i++) {
        char dev[64], gc[64], note[512];
        snprintf(dev, sizeof(dev), "--runtime.device=%s", cases[i].device);
        snprintf(gc, sizeof(gc), "--runtime.gpu_comm=%s", cases[i].gpu_comm);
        const char *args[MT_ARRAY_LEN(base) + 2];
        int n = 0;
        for (size_t k = 0; k < MT_ARRAY_LEN(base); k++) {
            args[n++] = base[k];
        }
        args[n++] = dev;
        args[n++] = gc;
        mt_config_t *cfg = NULL;
        CHECK_OK(mt_config_load(NULL, n, (char **)args, mt_rt_world()->size, &cfg, stderr));
        bool use = false;
        CHECK_OK(mt_job_cuda_choose(cfg, mt_rt_world()->comm, &use, note, sizeof(note)));
        bool want = shared ? cases[i].use_shared : true;
        CHECK(use == want, "runtime.device = %s, gpu_comm = %s, GPU %s: use %d, expected %d (%s)", cases[i].device,
              cases[i].gpu_comm, shared ? "shared" : "per rank", use, want, note);
        if (shared && !use) {
            CHECK(strstr(note, "would share one") != NULL, "the note names the sharing: %s", note);
        }
        mt_config_free(cfg);
    }
}

static mt_status_t run_cuda(int n, const char *const *extra, mt_job_result_t *r) {
    return run("cuda", n, extra, r);
}

/* Ranks that share a GPU (the emulated NCCL with fewer devices than ranks): runtime.gpu_comm = "nccl" is refused
 * on every rank with the message naming the clash and the fix; "auto" trains through MPI (the staged backend)
 * and gives the CPU's losses (DDP on both). */
static void nccl_shared(void) {
    mt_job_result_t r, cpu, gpu;
    const char *nccl[] = {"--runtime.gpu_comm=nccl"};
    mt_status_t st = run_cuda(1, nccl, &r);
    CHECK(st == MT_ERR_INVALID_ARG && strstr(mt_last_error_msg(), "would both drive GPU") &&
              strstr(mt_last_error_msg(), "NCCL needs one GPU per rank") &&
              strstr(mt_last_error_msg(), "runtime.gpu_comm = \"mpi\""),
          "gpu_comm = nccl on a shared GPU: %s (%s)", mt_status_str(st), mt_last_error_msg());
    if (st == MT_OK) {
        mt_job_result_free(&r);
    }
    CHECK_OK(run("cpu", 0, NULL, &cpu));
    CHECK_OK(run_cuda(0, NULL, &gpu));
    same_losses("gpu_comm = auto on a shared GPU (through MPI) vs cpu", &gpu, &cpu, 1e-3);
    mt_job_result_free(&cpu);
    mt_job_result_free(&gpu);
}

/* Host waits per training step over NCCL (the emulator's count, mt_emu_host_waits: calls that block the host until
 * device work is done), each layout run for 3 and for 5 steps and the difference halved: the two stream
 * synchronisations docs/gpu.md states (the micro-batch losses; the gradient's sum of squares, with the fp16
 * overflow flag, read from pinned memory, no synchronous copy after them) and each forward's guard of its pinned
 * token slot (one per micro-batch); no event or device synchronisation else, no synchronous copy, no cudaFree.
 * And a 3-step run with an evaluation of 3 batches at its end against one without: the evaluation's batches
 * queued back to back and one stream synchronisation for all their losses (each forward's token guard aside). */
static void host_waits(void) {
#if MT_CUDA_EMULATED
    const mt_world_t *w = mt_rt_world();
    static const char *kinds[] = {"stream", "event", "device", "copy", "free"};
    struct {
        const char *name;
        int tp, pp, ga;
        const char *extra[4];
        bool big_eval; /* also an evaluation of 300 batches: two reads of the losses (MT_JOB_EVAL_CHUNK) */
    } lay[] = {
        {"ddp", 1, 1, 2, {"--parallel.engine=ddp", "--parallel.bucket_mb=0.001"}, false},
        {"dp", 1, 1, 2, {"--parallel.engine=dp"}, false},
        {"ddp, 4 micro-batches", 1, 1, 4, {"--train.grad_accum=4", "--train.global_batch=16"}, false},
        {"fp16", 1, 1, 2, {"--precision.compute=fp16"}, false},
        {"bf16", 1, 1, 2, {"--precision.compute=bf16"}, false},
        {"zero-1", 1, 1, 2, {"--parallel.engine=zero", "--parallel.zero_stage=1"}, false},
        {"zero-2", 1, 1, 2, {"--parallel.engine=zero", "--parallel.zero_stage=2"}, false},
        {"zero-3", 1, 1, 2, {"--parallel.engine=zero", "--parallel.zero_stage=3", "--precision.compute=fp16"}, false},
        {"pp 2, 1f1b", 1, 2, 2, {"--parallel.schedule=1f1b"}, true},
        {"pp 2, gpipe", 1, 2, 2, {"--parallel.schedule=gpipe", "--precision.compute=fp16"}, false},
        {"tp 2", 2, 1, 2, {"--precision.compute=fp16"}, false},
        {"tp 2, sp", 2, 1, 2, {"--parallel.sequence_parallel=true"}, false},
        {"tp 2, sp, 3 comm chunks", 2, 1, 2, {"--parallel.sequence_parallel=true", "--parallel.tp_comm_chunks=3"},
         false},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(lay); i++) {
        size_t got[4][MT_EMU_WAIT_KINDS];
        /* 3 steps, 5 steps, 3 steps and an evaluation of 3 batches at the end (and of 300) */
        for (int r = 0; r < (lay[i].big_eval ? 4 : 3); r++) {
            const char *extra[8] = {r == 1 ? "--train.steps=5" : "--train.steps=3"};
            int n = 1;
            while (n < 5 && lay[i].extra[n - 1]) {
                extra[n] = lay[i].extra[n - 1];
                n++;
            }
            if (r >= 2) {
                extra[n++] = "--train.eval_every=100";
                extra[n++] = r == 2 ? "--train.eval_batches=3" : "--train.eval_batches=300";
            }
            mt_job_result_t res;
            memset(run_waits, 0, sizeof(run_waits));
            mt_status_t st = run_mesh("cuda", lay[i].tp, lay[i].pp, n, extra, &res);
            CHECK(st == MT_OK, "%s: %s (%s)", lay[i].name, mt_status_str(st), mt_last_error_msg());
            memcpy(got[r], run_waits, sizeof(run_waits));
            if (st == MT_OK && r == 3) { /* 300 batches in two reads: the CPU engine's validation loss */
                mt_job_result_t cpu;
                CHECK_OK(run_mesh("cpu", lay[i].tp, lay[i].pp, n, extra, &cpu));
                CHECK(res.n_evals == 1 && cpu.n_evals == 1 &&
                          fabs(res.val_loss[0] - cpu.val_loss[0]) <= 1e-3 * cpu.val_loss[0],
                      "%s: an evaluation of 300 batches: %lld evaluations, validation loss %.9g, cpu %.9g",
                      lay[i].name, (long long)res.n_evals, res.n_evals ? res.val_loss[0] : 0.0,
                      cpu.n_evals ? cpu.val_loss[0] : 0.0);
                mt_job_result_free(&cpu);
            }
            if (st == MT_OK) {
                mt_job_result_free(&res);
            }
        }
        char line[512];
        int len = snprintf(line, sizeof(line), "host waits per step, %s:", lay[i].name);
        for (int k = 0; k < MT_EMU_WAIT_KINDS; k++) {
            size_t d = got[1][k] - got[0][k];
            size_t want = k == MT_EMU_WAIT_STREAM ? 2 : k == MT_EMU_WAIT_EVENT ? (size_t)lay[i].ga : 0;
            CHECK(got[1][k] >= got[0][k] && d == 2 * want, "%s, rank %d: %zu %s waits in steps 4-5, want %zu per step",
                  lay[i].name, w->rank, d, kinds[k], want);
            len += snprintf(line + len, sizeof(line) - (size_t)len, " %s %.1f", kinds[k], (double)d / 2);
        }
        /* the evaluation queues its batches back to back: one stream synchronisation for the 3 batches' losses */
        len += snprintf(line + len, sizeof(line) - (size_t)len, "; evaluation of 3 batches:");
        for (int k = 0; k < MT_EMU_WAIT_KINDS; k++) {
            size_t d = got[2][k] - got[0][k];
            size_t want = k == MT_EMU_WAIT_STREAM ? 1 : k == MT_EMU_WAIT_EVENT ? 3 * (size_t)lay[i].ga : 0;
            CHECK(got[2][k] >= got[0][k] && d == want, "%s, rank %d: an evaluation of 3 batches made %zu %s waits, "
                  "want %zu", lay[i].name, w->rank, d, kinds[k], want);
            len += snprintf(line + len, sizeof(line) - (size_t)len, " %s %zu", kinds[k], d);
        }
        /* 300 batches: read in two chunks of at most MT_JOB_EVAL_CHUNK (256 + 44), one synchronisation each */
        for (int k = 0; k < MT_EMU_WAIT_KINDS && lay[i].big_eval; k++) {
            size_t d = got[3][k] - got[0][k];
            size_t want = k == MT_EMU_WAIT_STREAM ? 2 : k == MT_EMU_WAIT_EVENT ? 300 * (size_t)lay[i].ga : 0;
            CHECK(got[3][k] >= got[0][k] && d == want, "%s, rank %d: an evaluation of 300 batches made %zu %s waits, "
                  "want %zu", lay[i].name, w->rank, d, kinds[k], want);
            len += snprintf(line + len, sizeof(line) - (size_t)len, "%s %s %zu", k ? "" : "; of 300:", kinds[k], d);
        }
        if (w->rank == 0) {
            printf("%s\n", line);
        }
    }
#else
    CHECK(false, "host_waits counts the CPU emulator's waits: run it in an emulated build");
#endif
}

/* Whether this rank's GPU has an NVML energy counter (never under the emulator). */
static bool nvml_energy(void) {
    if (MT_CUDA_EMULATED) {
        return false;
    }
    char bus[32];
    int d = 0;
    mt_nvml_t h = NULL;
    uint64_t mj = 0;
    bool ok = cudaGetDevice(&d) == cudaSuccess && cudaDeviceGetPCIBusId(bus, (int)sizeof(bus), d) == cudaSuccess &&
              mt_nvml_open(bus, 0, &h) == MT_OK && mt_nvml_energy_mj(h, &mj) == MT_OK;
    mt_nvml_close(h);
    return ok;
}

/* Lines of path holding key (-1: the file cannot be read). */
static int lines_with(const char *path, const char *key, int *lines) {
    FILE *f = fopen(path, "r");
    if (!f) {
        return -1;
    }
    char buf[4096];
    int n = 0;
    *lines = 0;
    while (fgets(buf, sizeof(buf), f)) {
        (*lines)++;
        n += strstr(buf, key) != NULL;
    }
    fclose(f);
    return n;
}

/* The last line of a metrics file, parsed (NULL: unreadable). */
static mt_json_t *last_line(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        return NULL;
    }
    char buf[4096], last[4096] = "";
    while (fgets(buf, sizeof(buf), f)) {
        if (buf[0] == '{') {
            memcpy(last, buf, sizeof(last));
        }
    }
    fclose(f);
    mt_json_t *o = NULL;
    return mt_json_parse(last, strlen(last), path, &o) == MT_OK ? o : NULL;
}

/* The metrics of the GPU run just finished report the device allocator's statistics (the categories are
 * allocated once at the engine's start, so each category's peak is its value at every step). */
static void check_device_mem(const char *metrics, const mt_job_result_t *r) {
    mt_mem_stats_t ds;
    mt_mem_stats(MT_MEM_DEVICE, &ds);
    mt_cuda_alloc_t a = NULL;
    mt_cuda_alloc_stats_t as = {0};
    CHECK_OK(mt_cuda_alloc_default(&a));
    mt_cuda_alloc_get_stats(a, &as);
    mt_json_t *o = last_line(metrics);
    CHECK(o != NULL, "%s: no parsable last line", metrics);
    if (!o) {
        return;
    }
    const char *space = mt_json_get_str(o, "mem_space");
    CHECK(space && !strcmp(space, "device"), "mem_space = %s, want device", space ? space : "(absent)");
    const mt_json_t *mb = mt_json_get(o, "mem_bytes");
    static const char *keys[] = {"params", "grads", "optimizer", "activations", "comm", "other"};
    static const mt_mem_cat_t cats[] = {MT_MEM_PARAMS,      MT_MEM_GRADS, MT_MEM_OPTIMIZER,
                                        MT_MEM_ACTIVATIONS, MT_MEM_COMM,  MT_MEM_OTHER};
    for (int k = 0; k < 6; k++) {
        int64_t v = -1;
        CHECK(mb && mt_json_get_int(mb, keys[k], &v) && v == ds.peak[cats[k]],
              "mem_bytes.%s = %lld, the device allocator's %s = %lld", keys[k], (long long)v, keys[k],
              (long long)ds.peak[cats[k]]);
        CHECK(r->mem_peak[cats[k]] == ds.peak[cats[k]], "result mem_peak.%s = %lld, device peak %lld", keys[k],
              (long long)r->mem_peak[cats[k]], (long long)ds.peak[cats[k]]);
    }
    int64_t peak = -1, reserved = -1, host = -1;
    CHECK(mb && mt_json_get_int(mb, "peak", &peak) && peak == ds.total_peak && r->mem_peak_total == ds.total_peak,
          "mem_bytes.peak = %lld, result %lld, device total peak %lld", (long long)peak, (long long)r->mem_peak_total,
          (long long)ds.total_peak);
    CHECK(mt_json_get_int(o, "mem_reserved", &reserved) && reserved == as.reserved_bytes && reserved >= peak,
          "mem_reserved = %lld, the allocator holds %lld (peak %lld)", (long long)reserved,
          (long long)as.reserved_bytes, (long long)peak);
    CHECK(mt_json_get_int(o, "host_mem_peak", &host) && host > 0, "host_mem_peak = %lld", (long long)host);
    CHECK(ds.peak[MT_MEM_PARAMS] > 0 && ds.peak[MT_MEM_GRADS] > 0 && ds.peak[MT_MEM_OPTIMIZER] > 0 &&
              ds.peak[MT_MEM_ACTIVATIONS] > 0,
          "device categories: params %lld grads %lld optimizer %lld activations %lld",
          (long long)ds.peak[MT_MEM_PARAMS], (long long)ds.peak[MT_MEM_GRADS], (long long)ds.peak[MT_MEM_OPTIMIZER],
          (long long)ds.peak[MT_MEM_ACTIVATIONS]);
    mt_json_free(o);
}

/* ZeRO stage 1 or 2 on the GPU engine against the DDP runs (ddp fp32, bf bf16, f16o fp16 from 2^24) and the
 * CPU run. */
static void zero_stage(const char *dir, int stage, const mt_job_result_t *ddp, const mt_job_result_t *bf,
                       const mt_job_result_t *f16o, const mt_job_result_t *cpu) {
    const mt_world_t *w = mt_rt_world();
    mt_job_result_t z, zb, zh, zpart, zres, zcpu, dpart, dres;
    char st_arg[64], what[64];
    snprintf(st_arg, sizeof(st_arg), "--parallel.zero_stage=%d", stage);
    const char *zf[] = {"--parallel.engine=zero", st_arg, "--parallel.bucket_mb=0.001"};
    CHECK_OK(run_cuda(3, zf, &z));
    snprintf(what, sizeof(what), "zero-%d vs ddp, fp32", stage);
    same_losses(what, &z, ddp, SAME_TOL);
    /* the moments are split over the ranks: their sum is one replica's (each buffer rounded to 512 bytes) */
    int64_t mine = z.mem_peak[MT_MEM_OPTIMIZER], sum = 0, whole = ddp->mem_peak[MT_MEM_OPTIMIZER];
    MPI_Allreduce(&mine, &sum, 1, MPI_INT64_T, MPI_SUM, w->comm);
    CHECK(llabs(sum - whole) <= 2 * 512 * (w->size + 1) && (w->size == 1 || mine < whole * 3 / 4),
          "zero-%d device optimizer bytes: this rank %lld, all ranks %lld, a ddp replica %lld", stage, (long long)mine,
          (long long)sum, (long long)whole);
    if (w->rank == 0) {
        printf("zero-%d over %d ranks: device optimizer state %lld B per rank (ddp %lld B), gradients %lld B (ddp "
               "%lld B)\n",
               stage, w->size, (long long)mine, (long long)whole, (long long)z.mem_peak[MT_MEM_GRADS],
               (long long)ddp->mem_peak[MT_MEM_GRADS]);
    }
    const char *zbf[] = {zf[0], zf[1], zf[2], "--precision.compute=bf16"};
    CHECK_OK(run_cuda(4, zbf, &zb));
    snprintf(what, sizeof(what), "zero-%d vs ddp, bf16", stage);
    same_losses(what, &zb, bf, stage >= 2 ? MT_MAX(SAME_TOL, ZERO2_BF16_TOL) : SAME_TOL);
    const char *zh16[] = {zf[0], zf[1], zf[2], "--precision.compute=fp16", "--precision.init_scale=16777216"};
    CHECK_OK(run_cuda(5, zh16, &zh));
    snprintf(what, sizeof(what), "zero-%d vs ddp, fp16 from 2^24", stage);
    same_losses(what, &zh, f16o, SAME_TOL);
    for (int64_t s = 0; s < zh.n_steps && s < f16o->n_steps; s++) {
        CHECK((zh.grad_norm[s] == 0.0) == (f16o->grad_norm[s] == 0.0), "zero-%d fp16 step %lld: norm %g, ddp %g", stage,
              (long long)s + 1, zh.grad_norm[s], f16o->grad_norm[s]);
    }
    CHECK(zh.n_overflow == f16o->n_overflow && zh.loss_scale == f16o->loss_scale,
          "zero-%d fp16: %lld overflows, final scale %g; ddp %lld, %g", stage, (long long)zh.n_overflow,
          (double)zh.loss_scale, (long long)f16o->n_overflow, (double)f16o->loss_scale);
    /* checkpoints: ZeRO -> ZeRO, ZeRO -> CPU DDP, GPU DDP -> ZeRO */
    char zarg[300], darg[300];
    snprintf(zarg, sizeof(zarg), "--checkpoint.dir=%s/zckpt%d", dir, stage);
    snprintf(darg, sizeof(darg), "--checkpoint.dir=%s/dckpt%d", dir, stage);
    const char *zstop[] = {zf[0], zf[1], zf[2], zarg, "--checkpoint.every=3", "--stop-after=3"};
    CHECK_OK(run_cuda(6, zstop, &zpart));
    const char *zr[] = {zf[0], zf[1], zf[2], zarg, "--checkpoint.every=3"};
    CHECK_OK(run_cuda(5, zr, &zres));
    char zstep3[320];
    snprintf(zstep3, sizeof(zstep3), "--checkpoint.resume=%s/zckpt%d/step-00000003", dir, stage);
    const char *zc[] = {zstep3, "--parallel.engine=ddp"};
    CHECK_OK(run("cpu", 2, zc, &zcpu));
    const char *dstop[] = {"--parallel.engine=ddp", "--parallel.bucket_mb=0.001", darg, "--checkpoint.every=3",
                           "--stop-after=3"};
    CHECK_OK(run_cuda(5, dstop, &dpart));
    const char *dr[] = {zf[0], zf[1], zf[2], darg};
    CHECK_OK(run_cuda(4, dr, &dres));
    const struct {
        const char *what;
        const mt_job_result_t *r, *ref;
        double tol;
    } res[] = {{"zero checkpoint resumed under the same stage", &zres, ddp, SAME_TOL},
               {"zero checkpoint resumed on the cpu", &zcpu, cpu, 1e-3},
               {"ddp checkpoint resumed under zero", &dres, ddp, SAME_TOL}};
    for (size_t i = 0; i < MT_ARRAY_LEN(res); i++) {
        const mt_job_result_t *r = res[i].r, *ref = res[i].ref;
        CHECK(r->first_step == 3 && r->n_steps == STEPS, "zero-%d: %s: resumed after step %lld, ran to %lld", stage,
              res[i].what, (long long)r->first_step, (long long)r->n_steps);
        for (int64_t s = 3; s < STEPS && s < r->n_steps; s++) {
            double d = fabs(r->loss[s] - ref->loss[s]) / ref->loss[s];
            CHECK(d <= res[i].tol, "zero-%d: %s, step %lld: %.9g vs %.9g", stage, res[i].what, (long long)s + 1,
                  r->loss[s], ref->loss[s]);
        }
    }
    mt_job_result_t *all[] = {&z, &zb, &zh, &zpart, &zres, &zcpu, &dpart, &dres};
    for (size_t i = 0; i < MT_ARRAY_LEN(all); i++) {
        mt_job_result_free(all[i]);
    }
}

/* The last step's comm_bytes of group (tp, pp or dp) in the metrics at path; -1 without them. */
static double group_bytes(const char *path, const char *group) {
    mt_json_t *o = last_line(path);
    const mt_json_t *cb = o ? mt_json_get(o, "comm_bytes") : NULL;
    double v = -1.0;
    if (!cb || !mt_json_get_num(cb, group, &v)) {
        v = -1.0;
    }
    mt_json_free(o);
    return v;
}

/* comm_bytes {model, other} of a metrics file's last step (false: absent or unreadable). */
static bool step_bytes(const char *path, double *model, double *other) {
    mt_json_t *o = last_line(path);
    const mt_json_t *cb = o ? mt_json_get(o, "comm_bytes") : NULL;
    bool ok = cb && mt_json_get_num(cb, "model", model) && mt_json_get_num(cb, "other", other);
    mt_json_free(o);
    return ok;
}

/* The bytes each dp engine of the GPU sends in a step (2 ranks, 2 micro-batches, fp32, the second step),
 * against the formulas of parallel/comm.c: with f = (N-1)/N and n the parameters (from the CPU DDP run's
 * all-reduce, 2 * 4n * f), GPU DDP sends what CPU DDP does; ZeRO-1 4n * f (reduces) + 4 len (N-1) (the
 * all-gather of the padded slices); ZeRO-2 reduces every micro-batch, 2 * 4n * f + 4 len (N-1); ZeRO-3
 * 2 * 4n * f + 4n * f (each weight gathered once: the slots outlive the micro-batches); other: the loss
 * all-reduce, 2 * 8 f, plus under ZeRO the norm and inf flag, 2 * 16 f. */
static void zero_comm_bytes(const char *dir) {
    const mt_world_t *w = mt_rt_world();
    if (w->size != 2) {
        return;
    }
    char paths[5][300], args[5][320];
    const char *dev[5] = {"cpu", "cuda", "cuda", "cuda", "cuda"};
    static const char *const engines[5][2] = {{"--parallel.engine=ddp", "--parallel.zero_stage=1"},
                                              {"--parallel.engine=ddp", "--parallel.zero_stage=1"},
                                              {"--parallel.engine=zero", "--parallel.zero_stage=1"},
                                              {"--parallel.engine=zero", "--parallel.zero_stage=2"},
                                              {"--parallel.engine=zero", "--parallel.zero_stage=3"}};
    double model[5] = {0}, other[5] = {0};
    for (int i = 0; i < 5; i++) {
        snprintf(paths[i], sizeof(paths[i]), "%s/bytes%d.jsonl", dir, i);
        snprintf(args[i], sizeof(args[i]), "--metrics.jsonl=%s", paths[i]);
        const char *a[] = {engines[i][0], engines[i][1], args[i], "--train.steps=2"};
        mt_job_result_t r;
        CHECK_OK(run(dev[i], 4, a, &r));
        mt_job_result_free(&r);
        CHECK(step_bytes(paths[i], &model[i], &other[i]), "%s: no comm_bytes", paths[i]);
    }
    double f = 0.5, n = model[0] / (2.0 * 4.0 * f);
    double len = (double)(MT_DIV_UP(MT_DIV_UP((size_t)n, 2), 64) * 64);
    double want[5] = {model[0], model[0], 4 * n * f + 4 * len, 2 * 4 * n * f + 4 * len, 2 * 4 * n * f + 4 * n * f};
    for (int i = 1; i < 5; i++) {
        double want_other = 2 * 8 * f + (i >= 2 ? 2 * 16 * f : 0.0);
        CHECK(model[i] == want[i] && other[i] == want_other,
              "comm_bytes of %s %s on the GPU: model %.0f (want %.0f), other %.0f (want %.0f)", engines[i][0],
              engines[i][1], model[i], want[i], other[i], want_other);
    }
    if (w->rank == 0) {
        printf("comm_bytes per step, 2 ranks, %.0f parameters: cpu ddp %.0f, gpu ddp %.0f, zero-1 %.0f, zero-2 %.0f, "
               "zero-3 %.0f\n",
               n, model[0], model[1], model[2], model[3], model[4]);
    }
}

/* Pipeline parallelism on the GPU engine (the ranks as that many stages, 4 blocks: 2 stages of 2 ranks in the
 * whole program, 4 stages in `test_job_cuda pipeline` on 4 ranks, where 1F1B has fewer micro-batches than
 * stages and the end stages hold no block or one; the CPU pipeline is the reference,
 * itself tested equal to the single process): the GPipe and 1F1B schedules give the CPU pipeline's losses
 * and gradient norms (1e-3; the norm counts the tied wte once) and each other's (SAME_TOL: the same
 * operations in another order), model.recompute = "block" (the activation sets sharing one block's internals)
 * 1F1B's, and evaluation (forward only, 70 batches queued and read with one wait) the CPU pipeline's
 * validation losses, with their loss slots in the planner's device memory; a
 * pipeline checkpoint resumes on the GPU pipeline (SAME_TOL) and on the
 * CPU pipeline (1e-3); each stage holds only its parameters (device parameter bytes below 0.75 of the whole
 * model's on one GPU); ZeRO-2 with dp = 1 trains as without it (ZeRO over dp with a pipeline: `test_job_cuda
 * tensor` on 4 ranks). */
static void pipeline(const char *dir) {
    const mt_world_t *w = mt_rt_world();
    int pp = w->size;
    if (pp < 2) {
        return;
    }
    mt_job_result_t cpu, g1, gg, part, res, rcpu, z, whole;
    const char *l4[] = {"--model.n_layer=4", "--parallel.schedule=1f1b"};
    CHECK_OK(run("cuda", 1, l4, &whole)); /* dp 2: the whole model on each GPU */
    const char *l4g[] = {"--model.n_layer=4", "--parallel.schedule=gpipe"};
    const char *l4e[] = {"--model.n_layer=4", "--parallel.schedule=1f1b", "--train.eval_every=4",
                         "--train.eval_batches=70"}; /* 140 loss slots: 560 bytes, past one 512-byte block */
    CHECK_OK(run_pp("cpu", pp, 4, l4e, &cpu));
    CHECK_OK(run_pp("cuda", pp, 4, l4e, &g1));
    /* evaluation runs the pipeline's forward only: the CPU pipeline's validation losses */
    CHECK(g1.n_evals == cpu.n_evals && g1.n_evals >= 2, "pp 2: %lld evaluations, cpu pipeline %lld",
          (long long)g1.n_evals, (long long)cpu.n_evals);
    for (int64_t v = 0; v < g1.n_evals && v < cpu.n_evals; v++) {
        double d = fabs(g1.val_loss[v] - cpu.val_loss[v]) / cpu.val_loss[v];
        CHECK(d <= 1e-3, "pp 2 evaluation %lld: %.9g, cpu pipeline %.9g", (long long)v + 1, g1.val_loss[v],
              cpu.val_loss[v]);
    }
    CHECK_OK(run_pp("cuda", pp, 2, l4g, &gg));
    same_losses("pp 2, 1f1b: gpu vs cpu", &g1, &cpu, 1e-3);
    same_losses("pipeline: gpipe vs 1f1b on the gpu", &gg, &g1, SAME_TOL);
    /* recompute = block: the activation sets share one block's internals */
    mt_job_result_t rcb;
    const char *l4r[] = {"--model.n_layer=4", "--parallel.schedule=1f1b", "--model.recompute=block"};
    CHECK_OK(run_pp("cuda", pp, 3, l4r, &rcb));
    same_losses("pipeline: recompute = block vs none on the gpu", &rcb, &g1, SAME_TOL);
    mt_job_result_free(&rcb);
    /* model.head_chunks under GPipe (every micro-batch's set in flight at once on the last stage, none holding its
     * logits) */
    const char *l4h[] = {l4g[0], l4g[1], "--model.head_chunks=3"};
    CHECK_OK(run_pp("cuda", pp, 3, l4h, &rcb));
    same_losses("pipeline: gpipe, head_chunks = 3 vs 1 on the gpu", &rcb, &gg, SAME_TOL);
    same_norms("pipeline: gpipe, head_chunks = 3 vs 1 on the gpu", &rcb, &gg, SAME_TOL);
    mt_job_result_free(&rcb);
    same_norms("pp 2", &g1, &cpu, 1e-3);
    CHECK(g1.mem_peak[MT_MEM_PARAMS] > 0 && g1.mem_peak[MT_MEM_PARAMS] * 4 < whole.mem_peak[MT_MEM_PARAMS] * 3,
          "pp 2: device parameter bytes %lld per stage, the whole model %lld", (long long)g1.mem_peak[MT_MEM_PARAMS],
          (long long)whole.mem_peak[MT_MEM_PARAMS]);
    char carg[300], step3[320];
    snprintf(carg, sizeof(carg), "--checkpoint.dir=%s/ppckpt", dir);
    snprintf(step3, sizeof(step3), "--checkpoint.resume=%s/ppckpt/step-00000003", dir);
    const char *stop[] = {l4[0], l4[1], carg, "--checkpoint.every=3", "--stop-after=3"};
    CHECK_OK(run_pp("cuda", pp, 5, stop, &part));
    const char *oncpu[] = {l4[0], l4[1], step3};
    CHECK_OK(run_pp("cpu", pp, 3, oncpu, &rcpu));
    const char *again[] = {l4[0], l4[1], carg};
    CHECK_OK(run_pp("cuda", pp, 3, again, &res));
    resumed_losses("pp 2 checkpoint resumed on the gpu pipeline", &res, &g1, SAME_TOL);
    resumed_losses("pp 2 gpu checkpoint resumed on the cpu pipeline", &rcpu, &cpu, 1e-3);
    if (pp == 3 || pp == 4) { /* the end stages without blocks: the embedding alone (blocks [0, 0)) before a stage
                               * from block 0, ln_f and the head alone ([L, L)) after one to block L */
        const char *sl = pp == 3 ? "--parallel.stage_layers=0,4,0" : "--parallel.stage_layers=0,2,2,0";
        mt_job_result_t ec, eg;
        const char *e0[] = {l4[0], l4[1], sl};
        CHECK_OK(run_pp("cpu", pp, 3, e0, &ec));
        CHECK_OK(run_pp("cuda", pp, 3, e0, &eg));
        same_losses("pipeline, end stages without blocks: gpu vs cpu", &eg, &ec, 1e-3);
        same_norms("pipeline, end stages without blocks: gpu vs cpu", &eg, &ec, 1e-3);
        mt_job_result_free(&ec);
        mt_job_result_free(&eg);
    }
    /* ZeRO with dp = 1 has nothing to shard: the stage trains as without it */
    const char *zp[] = {l4[0], l4[1], "--parallel.engine=zero", "--parallel.zero_stage=2"};
    CHECK_OK(run_pp("cuda", pp, 4, zp, &z));
    same_losses("pipeline, dp 1: zero-2 vs ddp on the gpu", &z, &g1, SAME_TOL);
    if (w->rank == 0) {
        printf("pp %d on the gpu: losses %.6f .. %.6f (cpu pipeline %.6f .. %.6f), device parameters %lld B on stage "
               "0\n",
               pp, g1.loss[0], g1.loss[STEPS - 1], cpu.loss[0], cpu.loss[STEPS - 1],
               (long long)g1.mem_peak[MT_MEM_PARAMS]);
    }
    mt_job_result_t *all[] = {&cpu, &g1, &gg, &part, &res, &rcpu, &z, &whole};
    for (size_t i = 0; i < MT_ARRAY_LEN(all); i++) {
        mt_job_result_free(all[i]);
    }
}

/* model.kind = "mlp" on the GPU engine (the device trainer's MLP, models/cuda/gpt2_cuda.c): on dp = the world,
 * fp32 against the CPU engine (losses, gradient norms, validation losses), recompute = block as without it, bf16
 * and fp16 close to the CPU, ZeRO-1/2/3 as DDP, a checkpoint resumed on the GPU and on the CPU; with pp > 1
 * (pipeline mode: the world as stages, and on 4 ranks pp 2 x dp 2 under ZeRO-2 and ZeRO-3; else pp 2 when the
 * world is even) against the CPU pipeline. A vocabulary of 37: the head's odd width, and its bias, in one
 * product. */
static void mlp(const char *dir, bool pipeline_only) {
    const mt_world_t *w = mt_rt_world();
    mt_job_result_t cpu, g, r;
    const char *a[] = {"--model.kind=mlp",           "--model.n_layer=3",     "--model.vocab_size=37",
                       "--parallel.engine=ddp",      "--parallel.bucket_mb=0.001", "--train.eval_every=2",
                       "--train.eval_batches=3",     "",                           "",
                       ""};
    enum { NA = 7 }; /* a's fixed keys; up to 3 more */
    if (!pipeline_only) {
        CHECK_OK(run("cpu", NA, a, &cpu));
        CHECK_OK(run_cuda(NA, a, &g));
        same_losses("mlp: fp32 gpu vs cpu", &g, &cpu, 1e-3);
        same_norms("mlp: fp32 gpu vs cpu", &g, &cpu, 1e-3);
        same_evals("mlp: fp32 gpu vs cpu", &g, &cpu, 1e-3);
        CHECK(g.loss[STEPS - 1] < g.loss[0], "mlp trains on the gpu: %g -> %g", g.loss[0], g.loss[STEPS - 1]);
        a[NA] = "--model.recompute=block";
        CHECK_OK(run_cuda(NA + 1, a, &r));
        same_losses("mlp: recompute = block vs none", &r, &g, SAME_TOL);
        mt_job_result_free(&r);
        a[NA] = "--model.head_chunks=5"; /* the head's product (with its bias) per chunk, again in backward */
        CHECK_OK(run_cuda(NA + 1, a, &r));
        same_losses("mlp: head_chunks = 5 vs 1", &r, &g, SAME_TOL);
        same_norms("mlp: head_chunks = 5 vs 1", &r, &g, SAME_TOL);
        same_evals("mlp: head_chunks = 5 vs 1", &r, &g, SAME_TOL);
        mt_job_result_free(&r);
        a[NA] = "--precision.compute=bf16";
        CHECK_OK(run_cuda(NA + 1, a, &r));
        same_losses("mlp: bf16 gpu vs cpu fp32", &r, &cpu, 3e-2);
        mt_job_result_free(&r);
        a[NA] = "--precision.compute=fp16";
        a[NA + 1] = "--precision.init_scale=1024";
        CHECK_OK(run_cuda(NA + 2, a, &r));
        same_losses("mlp: fp16 gpu vs cpu fp32", &r, &cpu, 1e-2);
        mt_job_result_free(&r);
        a[NA] = "--parallel.engine=zero";
        static const char *const stage[] = {"--parallel.zero_stage=1", "--parallel.zero_stage=2",
                                            "--parallel.zero_stage=3"};
        for (int zs = 1; zs <= 3 && w->size > 1; zs++) {
            a[NA + 1] = stage[zs - 1];
            CHECK_OK(run_cuda(NA + 2, a, &r));
            char what[64];
            snprintf(what, sizeof(what), "mlp: zero-%d vs ddp on the gpu", zs);
            same_losses(what, &r, &g, SAME_TOL);
            mt_job_result_free(&r);
        }
        char carg[300], step3[320];
        snprintf(carg, sizeof(carg), "--checkpoint.dir=%s/mlpckpt", dir);
        snprintf(step3, sizeof(step3), "--checkpoint.resume=%s/mlpckpt/step-00000003", dir);
        a[NA] = carg;
        a[NA + 1] = "--checkpoint.every=3";
        a[NA + 2] = "--stop-after=3";
        CHECK_OK(run_cuda(NA + 3, a, &r));
        CHECK(r.n_steps == 3, "mlp: interrupted run: %lld steps", (long long)r.n_steps);
        mt_job_result_free(&r);
        a[NA] = step3;
        CHECK_OK(run("cpu", NA + 1, a, &r));
        resumed_losses("mlp: gpu checkpoint resumed on the cpu", &r, &cpu, 1e-3);
        mt_job_result_free(&r);
        a[NA] = carg;
        CHECK_OK(run_cuda(NA + 2, a, &r));
        resumed_losses("mlp: gpu checkpoint resumed on the gpu", &r, &g, SAME_TOL);
        mt_job_result_free(&r);
        mt_job_result_free(&g);
        mt_job_result_free(&cpu);
        if (w->size == 2) { /* no tensor-parallel MLP: refused on every rank, naming the key */
            mt_status_t st = run_mesh("cuda", 2, 1, NA, a, &r);
            CHECK(st == MT_ERR_INVALID_ARG && strstr(mt_last_error_msg(), "parallel.tp = 2: tensor parallelism shards "
                                                                        "GPT-2 only"),
                  "mlp with tp 2 on the gpu: %s: %s", mt_status_str(st), mt_last_error_msg());
            mt_job_result_free(&r);
        }
    }
    int pp = pipeline_only ? w->size : 2;
    if (w->size < 2 || w->size % pp != 0) {
        return;
    }
    a[NA] = "--parallel.schedule=1f1b";
    CHECK_OK(run_pp("cpu", pp, NA + 1, a, &cpu));
    CHECK_OK(run_pp("cuda", pp, NA + 1, a, &g));
    char what[80];
    snprintf(what, sizeof(what), "mlp: pp %d gpu vs cpu pipeline", pp);
    same_losses(what, &g, &cpu, 1e-3);
    same_norms(what, &g, &cpu, 1e-3);
    same_evals(what, &g, &cpu, 1e-3);
    a[NA + 1] = "--model.recompute=block";
    CHECK_OK(run_pp("cuda", pp, NA + 2, a, &r));
    snprintf(what, sizeof(what), "mlp: pp %d, recompute = block vs none", pp);
    same_losses(what, &r, &g, SAME_TOL);
    mt_job_result_free(&r);
    mt_job_result_free(&g);
    if (pipeline_only && w->size == 4) { /* pp 2 x dp 2: ZeRO-2 and ZeRO-3 across the stages' slices */
        mt_job_result_free(&cpu);
        CHECK_OK(run_pp("cpu", 2, NA + 1, a, &cpu));
        a[NA] = "--parallel.engine=zero";
        static const char *const stage[] = {"--parallel.zero_stage=2", "--parallel.zero_stage=3"};
        for (int k = 0; k < 2; k++) {
            a[NA + 1] = stage[k];
            CHECK_OK(run_pp("cuda", 2, NA + 2, a, &r));
            snprintf(what, sizeof(what), "mlp: pp 2 x dp 2, zero-%d gpu vs cpu pipeline", k + 2);
            same_losses(what, &r, &cpu, 1e-3);
            mt_job_result_free(&r);
        }
    }
    mt_job_result_free(&cpu);
}

/* The tp collectives' bytes per step (tp 2 on 2 ranks, dp 1, fp32, 2 micro-batches of N = 32 rows, C = 32, L = 2,
 * the second step's comm_bytes), in the bus convention of parallel/tp.c: per micro-batch 2(1 + 2L) all-reduces of
 * N x C floats (the embedding and 2 per block, forward and backward; 2b(n-1)/n each) and the cross-entropy's
 * gather of 3N floats ((n-1) x 12N bytes), which the CPU engine's max and sum all-reduces of the same N and 2N
 * floats equal at tp 2: the CPU engine's model bytes exactly. With sequence parallelism each all-reduce is a
 * reduce-scatter and an all-gather of the same total, plus per micro-batch the LayerNorm gradients' all-reduce
 * (2L + 1 LayerNorms of 2C floats). */
static void tp_comm_bytes(const char *dir) {
    enum { N = 32, C = 32, L = 2, GA = 2 };
    char paths[3][300], args[3][320];
    const char *dev[3] = {"cpu", "cuda", "cuda"};
    double model[3] = {0}, other[3] = {0};
    for (int i = 0; i < 3; i++) {
        snprintf(paths[i], sizeof(paths[i]), "%s/tpbytes%d.jsonl", dir, i);
        snprintf(args[i], sizeof(args[i]), "--metrics.jsonl=%s", paths[i]);
        const char *a[] = {args[i], "--train.steps=2", "--model.padded_vocab=48",
                           i == 2 ? "--parallel.sequence_parallel=true" : "--parallel.sequence_parallel=false"};
        mt_job_result_t r;
        CHECK_OK(run_mesh(dev[i], 2, 1, 4, a, &r));
        mt_job_result_free(&r);
        CHECK(step_bytes(paths[i], &model[i], &other[i]), "%s: no comm_bytes", paths[i]);
        mt_json_t *o = last_line(paths[i]); /* the split by group: all of it tp's */
        const mt_json_t *cb = o ? mt_json_get(o, "comm_bytes") : NULL;
        double tpb = -1, ppb = -1, dpb = -1;
        CHECK(cb && mt_json_get_num(cb, "tp", &tpb) && mt_json_get_num(cb, "pp", &ppb) &&
                  mt_json_get_num(cb, "dp", &dpb) && tpb == model[i] && ppb == 0 && dpb == 0,
              "%s: comm_bytes by group tp %.0f, pp %.0f, dp %.0f (model %.0f)", paths[i], tpb, ppb, dpb, model[i]);
        mt_json_free(o);
    }
    double ar = 2.0 * N * C * 4 * 0.5, want = GA * (2 * (1 + 2 * L) * ar + 12.0 * N);
    double want_sp = want + GA * (2 * L + 1) * (2.0 * 2 * C * 4 * 0.5);
    CHECK(model[1] == want && model[0] == want && model[2] == want_sp,
          "tp 2 comm_bytes per step: cpu %.0f, gpu %.0f (want %.0f), gpu with sp %.0f (want %.0f)", model[0], model[1],
          want, model[2], want_sp);
    if (mt_rt_world()->rank == 0) {
        printf("tp 2 comm_bytes per step: cpu %.0f, gpu %.0f, gpu with sp %.0f\n", model[0], model[1], model[2]);
    }
}

/* Tensor parallelism on the GPU engine (`test_job_cuda tensor`: tp 2 over pairs of ranks, dp = world / 2; the CPU
 * model-parallel engine in the same layout is the reference, itself tested equal to the single process): fp32
 * losses, validation losses and gradient norms within 1e-3 of the CPU's (the norm counts the parameters every tp
 * rank holds whole once; a padded vocabulary of 48 gives tp rank 0 rows 0-23 and rank 1 rows 24-31 with 16 padding
 * rows; the default padding, 256, leaves rank 1 no real row, whose logits and cross-entropy are the empty shard's,
 * also within 1e-3); bf16 trains within 3e-2 of the CPU's fp32; fp16 from a loss scale of 2^24 skips its
 * overflowing steps (counted as overflows) and trains on; a tp checkpoint resumes on the
 * GPU (SAME_TOL) and on the CPU engine (1e-3); each rank's device parameters are below 0.75 of the whole model's on
 * one GPU; sequence parallelism gives the CPU's losses, norms and validation losses (1e-3) and the run without it
 * (SAME_TOL) with fewer activation bytes. With 4 ranks: pp 2 x dp 2 under ZeRO-1 (each stage's optimizer state
 * sliced over dp) gives the DDP pipeline's losses (SAME_TOL), the CPU engine's losses and norms (1e-3) with under
 * 3/4 of DDP's optimizer bytes, and its checkpoint resumes under DDP; so do ZeRO-2 and ZeRO-3 (the losses and
 * norms; ZeRO-2's checkpoint resumes under ZeRO-2, ZeRO-3's under DDP; ZeRO-2 in bf16 under GPipe gives DDP's
 * losses), stage 0's dp bytes under ZeRO-2 are ZeRO-1's plus one micro-batch's reduces of all but wte, and with
 * 16 blocks a stage ZeRO-2 holds under 0.8 of ZeRO-1's gradient bytes and
 * ZeRO-3 under 0.8 of its weight bytes; tp 2 x dp 2: ZeRO-1, -2 and -3 over each tp
 * rank's shard give the DDP losses (SAME_TOL, ZeRO-2 also with sequence parallelism), and tp 2 x pp 2 (4 blocks,
 * 1F1B), with and without sequence parallelism (with it also in 3 tp comm chunks), the CPU's losses and norms
 * (1e-3). */
static void tensor(const char *dir) {
    const mt_world_t *w = mt_rt_world();
    CHECK(w->size % 2 == 0, "test_job_cuda tensor runs tp 2 over an even number of ranks, not %d", w->size);
    if (w->size % 2 != 0) {
        return;
    }
    mt_job_result_t cpu, g, whole, bf, part, res, rcpu, sp, spc, ecpu, eg;
    const char *ev[] = {"--train.eval_every=2", "--model.padded_vocab=48"};
    CHECK_OK(run_mesh("cpu", 2, 1, 2, ev, &cpu));
    CHECK_OK(run_mesh("cuda", 2, 1, 2, ev, &g));
    same_losses("tp 2: gpu vs cpu", &g, &cpu, 1e-3);
    CHECK(g.n_evals == cpu.n_evals && g.n_evals >= 2, "tp 2: %lld evaluations, cpu %lld", (long long)g.n_evals,
          (long long)cpu.n_evals);
    for (int64_t v = 0; v < g.n_evals && v < cpu.n_evals; v++) {
        double d = fabs(g.val_loss[v] - cpu.val_loss[v]) / cpu.val_loss[v];
        CHECK(d <= 1e-3, "tp 2 evaluation %lld: %.9g, cpu %.9g", (long long)v + 1, g.val_loss[v], cpu.val_loss[v]);
    }
    same_norms("tp 2", &g, &cpu, 1e-3);
    CHECK_OK(run_mesh("cpu", 2, 1, 1, ev, &ecpu)); /* the default padding: rank 1 holds no real vocabulary row */
    CHECK_OK(run_mesh("cuda", 2, 1, 1, ev, &eg));
    same_losses("tp 2, an empty vocabulary shard: gpu vs cpu", &eg, &ecpu, 1e-3);
    CHECK_OK(run("cuda", 1, ev + 1, &whole)); /* tp 1: the whole model on each GPU */
    CHECK(g.mem_peak[MT_MEM_PARAMS] > 0 && g.mem_peak[MT_MEM_PARAMS] * 4 < whole.mem_peak[MT_MEM_PARAMS] * 3,
          "tp 2: device parameter bytes %lld per rank, the whole model %lld", (long long)g.mem_peak[MT_MEM_PARAMS],
          (long long)whole.mem_peak[MT_MEM_PARAMS]);
    const char *b16[] = {"--precision.compute=bf16", ev[1]};
    CHECK_OK(run_mesh("cuda", 2, 1, 2, b16, &bf));
    same_losses("tp 2: bf16 gpu vs cpu fp32", &bf, &cpu, 3e-2);
    CHECK(bf.n_steps == STEPS && bf.loss[STEPS - 1] < bf.loss[0], "tp 2 bf16 trains: %g -> %g", bf.loss[0],
          bf.loss[bf.n_steps > 0 ? bf.n_steps - 1 : 0]);
    /* fp16 from 2^24: the first steps overflow on some rank's shard; the group agrees, skips them and trains on */
    mt_job_result_t h16;
    const char *f16[] = {"--precision.compute=fp16", "--precision.init_scale=16777216", ev[1]};
    CHECK_OK(run_mesh("cuda", 2, 1, 3, f16, &h16));
    int skipped = 0;
    for (int64_t s = 0; s < h16.n_steps; s++) {
        skipped += h16.grad_norm[s] == 0.0;
    }
    CHECK(h16.n_steps == STEPS && skipped >= 1 && skipped < STEPS && h16.n_overflow == skipped &&
              isfinite(h16.loss[STEPS - 1]),
          "tp 2 fp16 from 2^24: %d of %lld steps skipped (norm 0), %lld overflows counted", skipped,
          (long long)h16.n_steps, (long long)h16.n_overflow);
    mt_job_result_free(&h16);
    /* a checkpoint after step 3: resumed on the GPU and on the CPU engine */
    char carg[300], step3[320];
    snprintf(carg, sizeof(carg), "--checkpoint.dir=%s/tpckpt", dir);
    snprintf(step3, sizeof(step3), "--checkpoint.resume=%s/tpckpt/step-00000003", dir);
    const char *stop[] = {ev[0], ev[1], carg, "--checkpoint.every=3", "--stop-after=3"};
    CHECK_OK(run_mesh("cuda", 2, 1, 5, stop, &part));
    const char *oncpu[] = {ev[0], ev[1], step3};
    CHECK_OK(run_mesh("cpu", 2, 1, 3, oncpu, &rcpu));
    const char *again[] = {ev[0], ev[1], carg};
    CHECK_OK(run_mesh("cuda", 2, 1, 3, again, &res));
    resumed_losses("tp 2 checkpoint resumed on the gpu", &res, &g, SAME_TOL);
    resumed_losses("tp 2 gpu checkpoint resumed on the cpu", &rcpu, &cpu, 1e-3);
    /* sequence parallelism: the CPU's function (and the run without it), fewer activation bytes per rank */
    const char *spa[] = {ev[0], ev[1], "--parallel.sequence_parallel=true"};
    CHECK_OK(run_mesh("cpu", 2, 1, 3, spa, &spc));
    CHECK_OK(run_mesh("cuda", 2, 1, 3, spa, &sp));
    same_losses("tp 2 + sp: gpu vs cpu", &sp, &spc, 1e-3);
    same_losses("tp 2 + sp vs tp 2 on the gpu", &sp, &g, SAME_TOL);
    same_norms("tp 2 + sp", &sp, &spc, 1e-3);
    for (int64_t v = 0; v < sp.n_evals && v < spc.n_evals; v++) {
        double d = fabs(sp.val_loss[v] - spc.val_loss[v]) / spc.val_loss[v];
        CHECK(d <= 1e-3, "tp 2 + sp evaluation %lld: %.9g, cpu %.9g", (long long)v + 1, sp.val_loss[v],
              spc.val_loss[v]);
    }
    CHECK(sp.mem_peak[MT_MEM_ACTIVATIONS] > 0 && sp.mem_peak[MT_MEM_ACTIVATIONS] < g.mem_peak[MT_MEM_ACTIVATIONS],
          "tp 2: device activation bytes %lld with sequence parallelism, %lld without",
          (long long)sp.mem_peak[MT_MEM_ACTIVATIONS], (long long)g.mem_peak[MT_MEM_ACTIVATIONS]);
    { /* model.head_chunks with tp (each rank's vocabulary columns a chunk of rows at a time, the statistics of all
       * rows gathered once) and sequence parallelism (the chunks' rows of the gathered ln_f output), and with the
       * default padding (rank 1 holds no real vocabulary row: no product, a zero d lnf) */
        mt_job_result_t hc, hce;
        const char *hca[] = {ev[0], ev[1], "--parallel.sequence_parallel=true", "--model.head_chunks=3"};
        CHECK_OK(run_mesh("cuda", 2, 1, 4, hca, &hc));
        same_losses("tp 2 + sp, head_chunks = 3 vs 1", &hc, &sp, SAME_TOL);
        same_norms("tp 2 + sp, head_chunks = 3 vs 1", &hc, &sp, SAME_TOL);
        same_evals("tp 2 + sp, head_chunks = 3 vs 1", &hc, &sp, SAME_TOL);
        CHECK(hc.mem_peak[MT_MEM_ACTIVATIONS] < sp.mem_peak[MT_MEM_ACTIVATIONS],
              "tp 2 + sp: device activation bytes %lld with head chunks, %lld without",
              (long long)hc.mem_peak[MT_MEM_ACTIVATIONS], (long long)sp.mem_peak[MT_MEM_ACTIVATIONS]);
        /* and with the tp collectives in 3 pieces (the head's gather in pieces, the chunks after it) */
        mt_job_result_t hcc;
        const char *hcc_a[] = {ev[0], ev[1], "--parallel.sequence_parallel=true", "--parallel.tp_comm_chunks=3",
                               "--model.head_chunks=5"};
        CHECK_OK(run_mesh("cuda", 2, 1, 5, hcc_a, &hcc));
        same_losses("tp 2 + sp, tp_comm_chunks = 3, head_chunks = 5 vs 1", &hcc, &sp, SAME_TOL);
        same_norms("tp 2 + sp, tp_comm_chunks = 3, head_chunks = 5 vs 1", &hcc, &sp, SAME_TOL);
        mt_job_result_free(&hcc);
        const char *hce_a[] = {ev[0], "--model.head_chunks=4"};
        CHECK_OK(run_mesh("cuda", 2, 1, 2, hce_a, &hce));
        same_losses("tp 2, an empty vocabulary shard, head_chunks = 4 vs 1", &hce, &eg, SAME_TOL);
        same_norms("tp 2, an empty vocabulary shard, head_chunks = 4 vs 1", &hce, &eg, SAME_TOL);
        mt_job_result_free(&hc);
        mt_job_result_free(&hce);
    }
    { /* recompute = block: the trainer refills a sharded block's internals, its forward collectives again, in
       * backward (the CPU engine refuses it): the run without it, with fewer activation bytes */
        mt_job_result_t rc;
        const char *rca[] = {ev[0], ev[1], "--model.recompute=block"};
        CHECK_OK(run_mesh("cuda", 2, 1, 3, rca, &rc));
        same_losses("tp 2, recompute = block vs none on the gpu", &rc, &g, SAME_TOL);
        same_norms("tp 2, recompute = block vs none on the gpu", &rc, &g, SAME_TOL);
        same_evals("tp 2, recompute = block vs none on the gpu", &rc, &g, SAME_TOL);
        CHECK(rc.mem_peak[MT_MEM_ACTIVATIONS] > 0 && rc.mem_peak[MT_MEM_ACTIVATIONS] < g.mem_peak[MT_MEM_ACTIVATIONS],
              "tp 2: device activation bytes %lld with recompute = block, %lld without",
              (long long)rc.mem_peak[MT_MEM_ACTIVATIONS], (long long)g.mem_peak[MT_MEM_ACTIVATIONS]);
        mt_job_result_free(&rc);
    }
    /* parallel.tp_comm_chunks: forward's row-parallel products and their collectives, and with sequence parallelism
     * the LayerNorm outputs' gathers and the column-parallel products after them and backward's gathers of the
     * row-parallel products' output gradients and their input gradients, in row chunks, each chunk's collective on
     * the tp stream: the unchunked runs' function. 3 chunks cut unevenly (32 rows: 10, 11, 11; with sequence
     * parallelism 5, 5, 6 of each rank's 16, one product per rank): fp32 without sequence parallelism, and bf16
     * (rows of 2-byte elements) with it, against the same runs unchunked; 40 chunks of each rank's 16 rows (24
     * empty) with sequence parallelism, recompute = block (backward's recomputation chunked as the forward) and
     * the default padding (rank 1 holds no vocabulary row: the head gathers ln_f and computes no product) against
     * the unchunked run without sequence parallelism and recomputation (which give the same losses, above). */
    {
        mt_job_result_t c32, bsp, cbsp, c40;
        const char *ch[] = {ev[0], ev[1], "--parallel.tp_comm_chunks=3"};
        CHECK_OK(run_mesh("cuda", 2, 1, 3, ch, &c32));
        same_losses("tp 2, 3 comm chunks vs 1", &c32, &g, SAME_TOL);
        same_norms("tp 2, 3 comm chunks vs 1", &c32, &g, SAME_TOL);
        same_evals("tp 2, 3 comm chunks vs 1", &c32, &g, SAME_TOL);
        const char *bs[] = {b16[0], b16[1], spa[0], spa[2], ch[2]};
        CHECK_OK(run_mesh("cuda", 2, 1, 4, bs, &bsp));
        CHECK_OK(run_mesh("cuda", 2, 1, 5, bs, &cbsp));
        same_losses("tp 2 + sp bf16, 3 comm chunks vs 1", &cbsp, &bsp, CHUNK_BF16_TOL);
        same_norms("tp 2 + sp bf16, 3 comm chunks vs 1", &cbsp, &bsp, CHUNK_BF16_TOL);
        same_evals("tp 2 + sp bf16, 3 comm chunks vs 1", &cbsp, &bsp, CHUNK_BF16_TOL);
        const char *c40a[] = {ev[0], spa[2], "--parallel.tp_comm_chunks=40", "--model.recompute=block"};
        CHECK_OK(run_mesh("cuda", 2, 1, 4, c40a, &c40));
        const char *c40w = "tp 2 + sp + recompute, 40 comm chunks, an empty vocabulary shard, vs 1 chunk without sp";
        same_losses(c40w, &c40, &eg, SAME_TOL);
        same_evals(c40w, &c40, &eg, SAME_TOL);
        mt_job_result_t *cr[] = {&c32, &bsp, &cbsp, &c40};
        for (size_t i = 0; i < MT_ARRAY_LEN(cr); i++) {
            mt_job_result_free(cr[i]);
        }
    }
    if (w->size == 2) {
        tp_comm_bytes(dir);
    }
    if (w->size >= 4) { /* pp 2 x dp 2 under ZeRO-1; tp 2 x dp 2: ZeRO over each shard; tp 2 x pp 2 */
        mt_job_result_t pd, pz, pzc, pzpart, pzres;
        /* a vocabulary of 1024: wte crosses the slice boundaries, which differ between the two stages' layouts */
        const char *p2[] = {"--model.n_layer=4", "--parallel.schedule=1f1b", "--model.vocab_size=1024"};
        const char *p2z[] = {p2[0], p2[1], p2[2], "--parallel.engine=zero", "--parallel.zero_stage=1"};
        char mp[3][300], ma[3][320]; /* metrics of DDP, ZeRO-1, ZeRO-2: their dp bytes */
        for (int i = 0; i < 3; i++) {
            snprintf(mp[i], sizeof(mp[i]), "%s/ppz_bytes%d.jsonl", dir, i);
            snprintf(ma[i], sizeof(ma[i]), "--metrics.jsonl=%s", mp[i]);
        }
        const char *p2m[] = {p2[0], p2[1], p2[2], ma[0]};
        const char *p2zm[] = {p2z[0], p2z[1], p2z[2], p2z[3], p2z[4], ma[1]};
        CHECK_OK(run_mesh("cuda", 1, 2, 4, p2m, &pd));
        CHECK_OK(run_mesh("cuda", 1, 2, 6, p2zm, &pz));
        CHECK_OK(run_mesh("cpu", 1, 2, 5, p2z, &pzc));
        same_losses("pp 2 x dp 2: zero-1 vs ddp on the gpu", &pz, &pd, SAME_TOL);
        same_losses("pp 2 x dp 2, zero-1: gpu vs cpu", &pz, &pzc, 1e-3);
        same_norms("pp 2 x dp 2 zero-1", &pz, &pzc, 1e-3);
        int64_t oz = pz.mem_peak[MT_MEM_OPTIMIZER], od = pd.mem_peak[MT_MEM_OPTIMIZER];
        CHECK(oz > 0 && oz * 4 < od * 3,
              "pp 2 x dp 2: device optimizer bytes %lld under zero-1, %lld under ddp",
              (long long)oz, (long long)od);
        /* its checkpoint (each rank its slice of its stage) resumes under DDP */
        char zarg[300];
        snprintf(zarg, sizeof(zarg), "--checkpoint.dir=%s/ppzckpt", dir);
        const char *zstop[] = {p2z[0], p2z[1], p2z[2], p2z[3], p2z[4], zarg, "--checkpoint.every=3", "--stop-after=3"};
        CHECK_OK(run_mesh("cuda", 1, 2, 8, zstop, &pzpart));
        const char *zres[] = {p2[0], p2[1], p2[2], zarg};
        CHECK_OK(run_mesh("cuda", 1, 2, 4, zres, &pzres));
        resumed_losses("pp 2 zero-1 checkpoint resumed under ddp", &pzres, &pz, SAME_TOL);
        /* ZeRO-2 and -3 on each stage: every micro-batch's gradients reduced to their owners but for the tied wte,
         * all-reduced once per step and summed over the end stages (whose slices of it differ), ZeRO-3's weights
         * gathered per block and micro-batch; a ZeRO-3 checkpoint resumes under DDP */
        for (int zs = 2; zs <= 3; zs++) {
            char zst[64], what[96], zca[300];
            snprintf(zst, sizeof(zst), "--parallel.zero_stage=%d", zs);
            snprintf(zca, sizeof(zca), "--checkpoint.dir=%s/ppz%dckpt", dir, zs);
            const char *pzs[] = {p2[0], p2[1], p2[2], "--parallel.engine=zero", zst, ma[2]};
            mt_job_result_t zg, zc;
            CHECK_OK(run_mesh("cuda", 1, 2, zs == 2 ? 6 : 5, pzs, &zg));
            CHECK_OK(run_mesh("cpu", 1, 2, 5, pzs, &zc));
            snprintf(what, sizeof(what), "pp 2 x dp 2: zero-%d vs ddp on the gpu", zs);
            same_losses(what, &zg, &pd, SAME_TOL);
            snprintf(what, sizeof(what), "pp 2 x dp 2, zero-%d: gpu vs cpu", zs);
            same_losses(what, &zg, &zc, 1e-3);
            same_norms(what, &zg, &zc, 1e-3);
            { /* the checkpoint after step 3: ZeRO-2's resumed under ZeRO-2, ZeRO-3's under DDP */
                const char *zstop[] = {pzs[0], pzs[1], pzs[2], pzs[3], pzs[4], zca, "--checkpoint.every=3",
                                       "--stop-after=3"};
                mt_job_result_t zpart, zres;
                CHECK_OK(run_mesh("cuda", 1, 2, 8, zstop, &zpart));
                const char *zr[] = {p2[0], p2[1], p2[2], zca, pzs[3], pzs[4]};
                CHECK_OK(run_mesh("cuda", 1, 2, zs == 2 ? 6 : 4, zr, &zres));
                resumed_losses(zs == 2 ? "pp 2 zero-2 checkpoint resumed under zero-2"
                                       : "pp 2 zero-3 checkpoint resumed under ddp",
                               &zres, zs == 2 ? &zg : &pd, SAME_TOL);
                mt_job_result_free(&zpart);
                mt_job_result_free(&zres);
            }
            mt_job_result_free(&zg);
            mt_job_result_free(&zc);
        }
        /* bf16 under GPipe: ZeRO-2 (the tied wte staged through its accumulator at the upload) trains as DDP */
        {
            const char *gb[] = {p2[0], "--parallel.schedule=gpipe", p2[2], "--precision.compute=bf16"};
            const char *gz[] = {gb[0], gb[1], gb[2], gb[3], "--parallel.engine=zero", "--parallel.zero_stage=2"};
            mt_job_result_t bd, bz;
            CHECK_OK(run_mesh("cuda", 1, 2, 4, gb, &bd));
            CHECK_OK(run_mesh("cuda", 1, 2, 6, gz, &bz));
            same_losses("pp 2 x dp 2, gpipe, bf16: zero-2 vs ddp", &bz, &bd, MT_MAX(SAME_TOL, ZERO2_BF16_TOL));
            mt_job_result_free(&bd);
            mt_job_result_free(&bz);
        }
        /* the dp bytes of stage 0 (rank 0; f = 1/2, 2 micro-batches, n parameters from DDP's all-reduce 2 * 4n * f,
         * wte's w): ZeRO-2 reduces the first micro-batch's gradients too, but for wte's, all-reduced once a step:
         * ZeRO-1's bytes + 4 (n - w) f */
        double dd = group_bytes(mp[0], "dp"), d1 = group_bytes(mp[1], "dp"), d2 = group_bytes(mp[2], "dp");
        double np0 = dd / 4.0, wte = 1024.0 * 32.0;
        CHECK(np0 > wte && d1 > 0 && d2 == d1 + 4.0 * (np0 - wte) * 0.5,
              "pp 2 x dp 2 dp bytes of stage 0: ddp %.0f (%.0f parameters), zero-1 %.0f, zero-2 %.0f (want %.0f)", dd,
              np0, d1, d2, d1 + 4.0 * (np0 - wte) * 0.5);
        /* 32 blocks, 16 a stage: ZeRO-2 holds under 0.8 of ZeRO-1's gradient bytes (a slice and two block slots
         * for the whole stage), ZeRO-3 also under 0.8 of its weight bytes, training the same function */
        mt_job_result_t zm[3];
        for (int zs = 1; zs <= 3; zs++) {
            char zst[64];
            snprintf(zst, sizeof(zst), "--parallel.zero_stage=%d", zs);
            const char *big[] = {"--model.n_layer=32", "--train.steps=2", "--parallel.engine=zero", zst};
            CHECK_OK(run_mesh("cuda", 1, 2, 4, big, &zm[zs - 1]));
        }
        int64_t g1b = zm[0].mem_peak[MT_MEM_GRADS], g2b = zm[1].mem_peak[MT_MEM_GRADS];
        int64_t w1b = zm[0].mem_peak[MT_MEM_PARAMS], w3b = zm[2].mem_peak[MT_MEM_PARAMS];
        CHECK(g2b > 0 && g2b * 5 < g1b * 4 && w3b > 0 && w3b * 5 < w1b * 4,
              "pp 2 x dp 2, 32 blocks: device gradient bytes %lld (zero-2) vs %lld (zero-1), weight bytes %lld "
              "(zero-3) vs %lld (zero-1)", (long long)g2b, (long long)g1b, (long long)w3b, (long long)w1b);
        for (int k = 1; k < 3; k++) {
            for (int64_t s = 0; s < zm[k].n_steps && s < zm[0].n_steps; s++) {
                CHECK(fabs(zm[k].loss[s] - zm[0].loss[s]) <= SAME_TOL * zm[0].loss[s],
                      "pp 2 x dp 2, 32 blocks, step %lld: zero-%d loss %.9g, zero-1 %.9g", (long long)s + 1, k + 1,
                      zm[k].loss[s], zm[0].loss[s]);
            }
        }
        if (w->rank == 0) {
            printf("pp 2 x dp 2 on the gpu, 32 blocks: gradient bytes zero-1 %lld, zero-2 %lld; weight bytes zero-1 "
                   "%lld, zero-3 %lld\n",
                   (long long)g1b, (long long)g2b, (long long)w1b, (long long)w3b);
        }
        mt_job_result_t *pall[] = {&pd, &pz, &pzc, &pzpart, &pzres, &zm[0], &zm[1], &zm[2]};
        for (size_t i = 0; i < MT_ARRAY_LEN(pall); i++) {
            mt_job_result_free(pall[i]);
        }
        for (int zs = 1; zs <= 3; zs++) {
            char stage[64], what[64];
            snprintf(stage, sizeof(stage), "--parallel.zero_stage=%d", zs);
            snprintf(what, sizeof(what), "tp 2 x dp 2: zero-%d vs ddp", zs);
            const char *za[] = {ev[0], ev[1], "--parallel.engine=zero", stage};
            mt_job_result_t z;
            CHECK_OK(run_mesh("cuda", 2, 1, 4, za, &z));
            same_losses(what, &z, &g, SAME_TOL);
            same_norms(what, &z, &g, SAME_TOL); /* slices x tp shards */
            mt_job_result_free(&z);
        }
        mt_job_result_t z2sp;
        const char *zsp[] = {spa[0], spa[1], spa[2], "--parallel.engine=zero", "--parallel.zero_stage=2"};
        CHECK_OK(run_mesh("cuda", 2, 1, 5, zsp, &z2sp));
        same_losses("tp 2 + sp x dp 2: zero-2 vs ddp", &z2sp, &sp, SAME_TOL);
        mt_job_result_free(&z2sp);
        for (int with_sp = 0; with_sp < 2; with_sp++) { /* tp 2 x pp 2, without and with sequence parallelism */
            mt_job_result_t pc, pg;
            const char *l4[] = {"--model.n_layer=4", "--parallel.schedule=1f1b", ev[1], spa[2]};
            CHECK_OK(run_mesh("cpu", 2, 2, 3 + with_sp, l4, &pc));
            CHECK_OK(run_mesh("cuda", 2, 2, 3 + with_sp, l4, &pg));
            const char *what = with_sp ? "tp 2 x pp 2 + sp: gpu vs cpu" : "tp 2 x pp 2: gpu vs cpu";
            same_losses(what, &pg, &pc, 1e-3);
            same_norms(what, &pg, &pc, 1e-3);
            if (with_sp) { /* and in 3 tp comm chunks: a stage's received output gradient gathered in chunks */
                mt_job_result_t pk;
                const char *l4k[] = {l4[0], l4[1], l4[2], l4[3], "--parallel.tp_comm_chunks=3"};
                CHECK_OK(run_mesh("cuda", 2, 2, 5, l4k, &pk));
                same_losses("tp 2 x pp 2 + sp, 3 comm chunks: gpu vs cpu", &pk, &pc, 1e-3);
                same_norms("tp 2 x pp 2 + sp, 3 comm chunks: gpu vs cpu", &pk, &pc, 1e-3);
                mt_job_result_free(&pk);
            }
            mt_job_result_free(&pc);
            mt_job_result_free(&pg);
        }
    }
    if (w->rank == 0) {
        printf("tp 2 on the gpu (%d ranks): losses %.6f .. %.6f (cpu %.6f .. %.6f), device parameters %lld B per rank "
               "(whole model %lld B)\n",
               w->size, g.loss[0], g.loss[STEPS - 1], cpu.loss[0], cpu.loss[STEPS - 1],
               (long long)g.mem_peak[MT_MEM_PARAMS], (long long)whole.mem_peak[MT_MEM_PARAMS]);
    }
    mt_job_result_t *all[] = {&cpu, &g, &whole, &bf, &part, &res, &rcpu, &sp, &spc, &ecpu, &eg};
    for (size_t i = 0; i < MT_ARRAY_LEN(all); i++) {
        mt_job_result_free(all[i]);
    }
}

/* optimizer.kind = "sgd" on the GPU (mt_cuda_sgd: mt_sgd_update's arithmetic, torch.optim.SGD's): with momentum
 * 0.9 and L2 weight decay the CPU engine's losses and gradient norms (1e-3), plain SGD (no state buffer) the CPU's
 * losses; device optimizer bytes half of AdamW's (adamw: that run) with momentum and fewer without; a checkpoint
 * after step 3 (the momentum under the CPU engines' name, "sgd.momentum") resumes on the GPU with the
 * uninterrupted run's losses and on the CPU with the CPU's; on 2 ranks ZeRO-1, -2 and -3 give DDP's losses. */
static void sgd(const char *dir, const mt_job_result_t *adamw) {
    const mt_world_t *w = mt_rt_world();
    mt_job_result_t c, g, pc, pg, part, res, oncpu;
    char carg[300], step3[320];
    snprintf(carg, sizeof(carg), "--checkpoint.dir=%s/sgdckpt", dir);
    snprintf(step3, sizeof(step3), "--checkpoint.resume=%s/sgdckpt/step-00000003", dir);
    const char *mom[] = {"--optimizer.kind=sgd", "--optimizer.momentum=0.9", "--optimizer.weight_decay=0.1",
                         "--optimizer.lr=0.2", carg, "--checkpoint.every=3"};
    CHECK_OK(run("cpu", 4, mom, &c));
    CHECK_OK(run_cuda(6, mom, &g));
    same_losses("sgd with momentum: gpu vs cpu", &g, &c, 1e-3);
    same_norms("sgd with momentum: gpu vs cpu", &g, &c, 1e-3);
    CHECK(g.loss[STEPS - 1] < g.loss[0], "sgd with momentum trains on the gpu: %g -> %g", g.loss[0],
          g.loss[STEPS - 1]);
    int64_t og = g.mem_peak[MT_MEM_OPTIMIZER], oa = adamw->mem_peak[MT_MEM_OPTIMIZER];
    CHECK(og > 0 && 2 * og == oa, "device optimizer bytes: %lld with sgd's momentum, %lld with adamw's moments",
          (long long)og, (long long)oa);
    const char *plain[] = {"--optimizer.kind=sgd", "--optimizer.lr=0.2"};
    CHECK_OK(run("cpu", 2, plain, &pc));
    CHECK_OK(run_cuda(2, plain, &pg));
    same_losses("plain sgd: gpu vs cpu", &pg, &pc, 1e-3);
    CHECK(pg.mem_peak[MT_MEM_OPTIMIZER] < og, "device optimizer bytes: %lld with plain sgd, %lld with momentum",
          (long long)pg.mem_peak[MT_MEM_OPTIMIZER], (long long)og);
    /* the checkpoint the momentum run wrote after step 3: resumed on the GPU, and on the CPU */
    const char *again[] = {mom[0], mom[1], mom[2], mom[3], step3};
    CHECK_OK(run_cuda(5, again, &res));
    CHECK_OK(run("cpu", 5, again, &oncpu));
    resumed_losses("sgd checkpoint resumed on the gpu", &res, &g, SAME_TOL);
    resumed_losses("sgd gpu checkpoint resumed on the cpu", &oncpu, &c, 1e-3);
    if (w->size > 1) { /* ZeRO over dp: the slices' momentum */
        for (int zs = 1; zs <= 3; zs++) {
            char stage[64];
            snprintf(stage, sizeof(stage), "--parallel.zero_stage=%d", zs);
            const char *z[] = {mom[0], mom[1], mom[2], mom[3], "--parallel.engine=zero", stage};
            CHECK_OK(run_cuda(6, z, &part));
            char what[64];
            snprintf(what, sizeof(what), "sgd with momentum: zero-%d vs ddp on the gpu", zs);
            same_losses(what, &part, &g, SAME_TOL);
            mt_job_result_free(&part);
        }
    }
    mt_job_result_t *all[] = {&c, &g, &pc, &pg, &res, &oncpu};
    for (size_t i = 0; i < MT_ARRAY_LEN(all); i++) {
        mt_job_result_free(all[i]);
    }
}

/* Tensor parallelism as wide as the world (`test_job_cuda tensor_wide`, 8 ranks: tp 8, 8 heads of size 4, the MLP's
 * 4C/tp columns fewer than C, one rank holding every real vocabulary row): fp32 losses and gradient norms within
 * 1e-3 of the CPU model-parallel engine, with and without sequence parallelism (4 rows per rank), and with it in
 * 3 `parallel.tp_comm_chunks` (rows 1, 1, 2: backward's packed chunks outgrow the MLP's (N, 4C/tp) buffer that
 * holds them, which grows to (N, C), as the planner's sizing says; the CPU engine ignores the key). */
static void tensor_wide(void) {
    const mt_world_t *w = mt_rt_world();
    static const char *what[] = {"tp = world: gpu vs cpu", "tp = world + sp: gpu vs cpu",
                                 "tp = world + sp, 3 comm chunks: gpu vs cpu"};
    for (int v = 0; v < 3; v++) {
        mt_job_result_t c, g;
        const char *a[] = {"--model.n_head=8", v ? "--parallel.sequence_parallel=true" : "--train.log_every=1",
                           "--parallel.tp_comm_chunks=3"};
        CHECK_OK(run_mesh("cpu", w->size, 1, v == 2 ? 3 : 2, a, &c));
        CHECK_OK(run_mesh("cuda", w->size, 1, v == 2 ? 3 : 2, a, &g));
        same_losses(what[v], &g, &c, 1e-3);
        same_norms(what[v], &g, &c, 1e-3);
        if (w->rank == 0) {
            printf("%s: losses %.6f .. %.6f (cpu %.6f .. %.6f)\n", what[v], g.loss[0], g.loss[STEPS - 1], c.loss[0],
                   c.loss[STEPS - 1]);
        }
        mt_job_result_free(&c);
        mt_job_result_free(&g);
    }
}

/* Device memory with 16 blocks on 2 ranks, two steps (with the same losses): ZeRO-2's gradients (two block
 * slots, wte/wpe/ln_f and its slice of the layout) and ZeRO-3's weights (three block slots, wte/wpe/ln_f and
 * its slice) against DDP's whole layout; ZeRO-3's gradients are ZeRO-2's. */
static void zero_memory(void) {
    const mt_world_t *w = mt_rt_world();
    if (w->size != 2) {
        return;
    }
    mt_job_result_t d, z2, z3;
    const char *dd[] = {"--model.n_layer=16", "--train.steps=2"};
    const char *a2[] = {dd[0], dd[1], "--parallel.engine=zero", "--parallel.zero_stage=2"};
    const char *a3[] = {dd[0], dd[1], "--parallel.engine=zero", "--parallel.zero_stage=3"};
    CHECK_OK(run_cuda(2, dd, &d));
    CHECK_OK(run_cuda(4, a2, &z2));
    CHECK_OK(run_cuda(4, a3, &z3));
    int64_t gd = d.mem_peak[MT_MEM_GRADS], g2 = z2.mem_peak[MT_MEM_GRADS], g3 = z3.mem_peak[MT_MEM_GRADS];
    int64_t pd = d.mem_peak[MT_MEM_PARAMS], p2 = z2.mem_peak[MT_MEM_PARAMS], p3 = z3.mem_peak[MT_MEM_PARAMS];
    CHECK(g2 > 0 && (double)g2 < 0.8 * (double)gd && g3 == g2,
          "16 blocks, 2 ranks: gradients ddp %lld B, zero-2 "
          "%lld B, zero-3 %lld B",
          (long long)gd, (long long)g2, (long long)g3);
    CHECK(p3 > 0 && (double)p3 < 0.8 * (double)pd && p2 == pd,
          "16 blocks, 2 ranks: weights ddp %lld B, zero-2 "
          "%lld B, zero-3 %lld B",
          (long long)pd, (long long)p2, (long long)p3);
    for (int64_t s = 0; s < 2; s++) { /* the slots cycle over 16 blocks, forward and backward */
        double e2 = fabs(z2.loss[s] - d.loss[s]) / d.loss[s], e3 = fabs(z3.loss[s] - d.loss[s]) / d.loss[s];
        CHECK(z2.n_steps == 2 && z3.n_steps == 2 && e2 <= SAME_TOL && e3 <= SAME_TOL,
              "16 blocks, step %lld: loss ddp %.9g, zero-2 %.9g, zero-3 %.9g", (long long)s + 1, d.loss[s], z2.loss[s],
              z3.loss[s]);
    }
    if (w->rank == 0) {
        printf("16 blocks, 2 ranks, fp32, per rank: gradients ddp %lld B, zero-2 %lld B, zero-3 %lld B; weights ddp "
               "%lld B, zero-3 %lld B\n",
               (long long)gd, (long long)g2, (long long)g3, (long long)pd, (long long)p3);
    }
    mt_job_result_free(&d);
    mt_job_result_free(&z2);
    mt_job_result_free(&z3);
}

/* fp16 with precision.scale_window = 3 from init (a --precision.init_scale= argument): the run interrupted
 * after step 3 and resumed from its checkpoint (dir/sub) against the uninterrupted run. */
static void fp16_resume(const char *dir, const char *sub, const char *init) {
    const mt_world_t *w = mt_rt_world();
    char ckpt_arg[300];
    snprintf(ckpt_arg, sizeof(ckpt_arg), "--checkpoint.dir=%s/%s", dir, sub);
    mt_job_result_t hw, hpart, hres;
    const char *f16w[] = {"--precision.compute=fp16", init, "--precision.scale_window=3"};
    CHECK_OK(run_cuda(3, f16w, &hw));
    const char *f16stop[] = {f16w[0], f16w[1], f16w[2], ckpt_arg, "--checkpoint.every=3", "--stop-after=3"};
    CHECK_OK(run_cuda(6, f16stop, &hpart));
    const char *f16res[] = {f16w[0], f16w[1], f16w[2], ckpt_arg, "--checkpoint.every=3"};
    CHECK_OK(run_cuda(5, f16res, &hres));
    if (w->rank == 0) {
        printf("fp16 %s, scale_window 3: %lld overflow steps, final loss scale %g; interrupted after step 3 with "
               "scale %g; resumed: %lld overflow steps, final %g\n",
               init, (long long)hw.n_overflow, (double)hw.loss_scale, (double)hpart.loss_scale,
               (long long)hres.n_overflow, (double)hres.loss_scale);
    }
    CHECK(hpart.n_steps == 3, "the interrupted fp16 run stopped after %lld steps", (long long)hpart.n_steps);
    if (w->rank == 0) { /* the manifest holds the device scaler's state */
        char man[400];
        snprintf(man, sizeof(man), "%s/%s/step-00000003/manifest.json", dir, sub);
        FILE *f = fopen(man, "r");
        char text[65536];
        size_t len = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
        if (f) {
            fclose(f);
        }
        text[len] = '\0';
        mt_json_t *mo = NULL;
        CHECK(len > 0 && mt_json_parse(text, len, man, &mo) == MT_OK, "%s unreadable", man);
        const mt_json_t *pr = mo ? mt_json_get(mo, "precision") : NULL;
        const char *mode = pr ? mt_json_get_str(pr, "compute") : NULL;
        double scale = 0;
        int64_t clean = -1;
        CHECK(mode && !strcmp(mode, "fp16") && mt_json_get_num(pr, "loss_scale", &scale) &&
                  mt_json_get_int(pr, "clean_steps", &clean) && scale == (double)hpart.loss_scale && clean >= 0,
              "%s: precision %s, loss_scale %g (the run's %g), clean_steps %lld", man, mode ? mode : "(absent)", scale,
              (double)hpart.loss_scale, (long long)clean);
        mt_json_free(mo);
    }
    CHECK(hres.first_step == 3 && hres.n_steps == STEPS, "fp16 resumed after step %lld, ran to %lld",
          (long long)hres.first_step, (long long)hres.n_steps);
    CHECK(hres.loss_scale == hw.loss_scale && hpart.n_overflow + hres.n_overflow == hw.n_overflow,
          "fp16 resumed: final scale %g (uninterrupted %g), overflows %lld + %lld (uninterrupted %lld)",
          (double)hres.loss_scale, (double)hw.loss_scale, (long long)hpart.n_overflow, (long long)hres.n_overflow,
          (long long)hw.n_overflow);
    for (int64_t s = 3; s < STEPS && s < hres.n_steps && hw.n_steps == STEPS; s++) {
        double d = fabs(hres.loss[s] - hw.loss[s]) / hw.loss[s];
        CHECK(d <= SAME_TOL && (hres.grad_norm[s] == 0.0) == (hw.grad_norm[s] == 0.0),
              "fp16 resumed step %lld: loss %.9g vs %.9g, norm %g vs %g", (long long)s + 1, hres.loss[s], hw.loss[s],
              hres.grad_norm[s], hw.grad_norm[s]);
    }
    mt_job_result_free(&hw);
    mt_job_result_free(&hpart);
    mt_job_result_free(&hres);
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    const mt_world_t *w = mt_rt_world();
    const char *mode = "";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--staged")) {
            staged = true;
        } else if (!strcmp(argv[i], "--shared")) {
            shared_ok = true;
        } else {
            mode = argv[i];
        }
    }
    int ndev = mt_cuda_device_count();
    if (ndev == 0 || (!MT_CUDA_EMULATED && !staged && !shared_ok && ndev < w->local_size)) {
        if (w->rank == 0) {
            printf("skipped: no CUDA device%s\n", ndev ? " for every rank (NCCL needs one GPU per rank)" : "");
        }
        MPI_Finalize();
        return MT_TEST_SKIP;
    }
    mt_plan_set_gpu_requests(mt_gpt2_cuda_requests);
    /* ranks on one GPU (more ranks than devices; --staged only): no peak measured, the energy counted once */
    sharing = (!MT_CUDA_EMULATED || MT_CUDA_EMU_NCCL) && ndev < w->local_size;
    /* read once per process by the engine: set before the first job */
    if (MT_CUDA_EMULATED) {
        setenv("MESHTRAIN_PEAK_GFLOPS_PER_GPU", "1000", 1);
    } else {
        setenv("MESHTRAIN_GPU_PEAK_N", "2048", 0);
    }
    { /* the shared peak measurement: a positive rate, its memory back in the cache, bad sizes refused */
        mt_mem_stats_t before, after;
        mt_mem_stats(MT_MEM_DEVICE, &before);
        double f = 0.0;
        CHECK_OK(mt_cuda_gemm_peak(MT_PREC_BF16, MT_CUDA_EMULATED ? 64 : 2048, 3, NULL, &f));
        mt_mem_stats(MT_MEM_DEVICE, &after);
        CHECK(f > 0 && isfinite(f), "gemm peak: %g FLOP/s", f);
        CHECK(after.total_current == before.total_current, "gemm peak left %lld device bytes allocated",
              (long long)(after.total_current - before.total_current));
        CHECK(mt_cuda_gemm_peak(MT_PREC_FP32, 0, 3, NULL, &f) == MT_ERR_INVALID_ARG, "gemm peak n = 0 accepted");
    }
    char dir[] = "/tmp/mt_job_cuda_XXXXXX";
    if (w->rank == 0) {
        CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    }
    MPI_Bcast(dir, (int)sizeof(dir), MPI_CHAR, 0, w->comm);
    char metrics[256], ckpt[256], metrics_arg[300], ckpt_arg[300];
    snprintf(metrics, sizeof(metrics), "%s/metrics.jsonl", dir);
    snprintf(ckpt, sizeof(ckpt), "%s/ckpt", dir);
    snprintf(metrics_arg, sizeof(metrics_arg), "--metrics.jsonl=%s", metrics);
    snprintf(ckpt_arg, sizeof(ckpt_arg), "--checkpoint.dir=%s", ckpt);
    if (!strcmp(mode, "pipeline")) { /* the pipeline alone, the world as its stages */
        pipeline(dir);
        mlp(dir, true);
        goto cleanup;
    }
    if (!strcmp(mode, "tensor")) { /* tensor parallelism alone, tp 2 x dp world / 2 */
        tensor(dir);
        goto cleanup;
    }
    if (!strcmp(mode, "nccl_shared")) { /* ranks sharing a GPU where NCCL would be used */
        CHECK(sharing, "nccl_shared: %d ranks on this host, %d GPUs: they must share", w->local_size, ndev);
        nccl_shared();
        goto cleanup;
    }
    if (!strcmp(mode, "host_waits")) { /* host waits per step, by layout */
        host_waits();
        goto cleanup;
    }
    if (!strcmp(mode, "tensor_wide")) { /* tp = the world */
        tensor_wide();
        goto cleanup;
    }

    if (w->size > 1) {
        device_choice(ndev < w->local_size);
    } else {
        plan_gpu_layouts();
    }
    /* fp32 against the CPU; dp = 2 with many buckets */
    mt_job_result_t cpu, gpu, one, rc, bf, part, resumed;
    const char *ddp[] = {"--parallel.engine=ddp", "--parallel.bucket_mb=0.001", metrics_arg};
    CHECK_OK(run("cpu", 1, ddp, &cpu));
    CHECK_OK(run_cuda(3, ddp, &gpu));
    same_losses("fp32 gpu vs cpu", &gpu, &cpu, 1e-3);
    if (sharing) {
        CHECK(gpu.mfu == 0, "GPU MFU %g with ranks sharing a GPU: its peak is not measured (n/a)", gpu.mfu);
    } else {
        CHECK(gpu.mfu > 0 && isfinite(gpu.mfu), "GPU MFU %g: the engine's peak should be known", gpu.mfu);
    }
    if (w->rank == 0) {
        int lines = 0, n = lines_with(metrics, "\"energy_j\": ", &lines);
        bool want = nvml_energy();
        CHECK(lines == STEPS && n == (want ? STEPS : 0), "metrics.jsonl: %d of %d lines carry energy_j (NVML %s)", n,
              lines, want ? "present" : "absent");
        int tpj = lines_with(metrics, "\"tokens_per_j\": ", &lines);
        CHECK(tpj == n, "tokens_per_j on %d lines, energy_j on %d", tpj, n);
        check_device_mem(metrics, &gpu);
    }
    /* one all-reduce after backward: the same averages */
    const char *dp[] = {"--parallel.engine=dp"};
    CHECK_OK(run_cuda(1, dp, &one));
    same_losses("dp (one all-reduce) vs ddp (buckets)", &one, &gpu, SAME_TOL);
    /* recompute = block */
    const char *rcb[] = {"--model.recompute=block"};
    CHECK_OK(run_cuda(1, rcb, &rc));
    same_losses("recompute = block vs none", &rc, &gpu, SAME_TOL);
    { /* model.head_chunks: the logits in 3 chunks (and in more chunks than a micro-batch's rows, some empty),
       * recomputed in backward: the whole-logits run's function with fewer activation bytes (plan_matches: the
       * planner's, to the byte) */
        mt_job_result_t hc;
        static const char *const hks[] = {"--model.head_chunks=3", "--model.head_chunks=200"};
        for (size_t i = 0; i < MT_ARRAY_LEN(hks); i++) {
            CHECK_OK(run_cuda(1, hks + i, &hc));
            same_losses(hks[i], &hc, &gpu, SAME_TOL);
            same_norms(hks[i], &hc, &gpu, SAME_TOL);
            CHECK(hc.mem_peak[MT_MEM_ACTIVATIONS] > 0 &&
                      hc.mem_peak[MT_MEM_ACTIVATIONS] < gpu.mem_peak[MT_MEM_ACTIVATIONS],
                  "%s: device activation bytes %lld, %lld with the whole logits", hks[i],
                  (long long)hc.mem_peak[MT_MEM_ACTIVATIONS], (long long)gpu.mem_peak[MT_MEM_ACTIVATIONS]);
            mt_job_result_free(&hc);
        }
    }
    /* bf16 trains */
    const char *b16[] = {"--precision.compute=bf16"};
    CHECK_OK(run_cuda(1, b16, &bf));
    same_losses("bf16 gpu vs cpu fp32", &bf, &cpu, 3e-2);
    CHECK(bf.n_steps == STEPS && bf.loss[STEPS - 1] < bf.loss[0], "bf16 trains: %g -> %g", bf.loss[0],
          bf.loss[bf.n_steps > 0 ? bf.n_steps - 1 : 0]);
    /* fp16: with a moderate loss scale it tracks the CPU; from 2^24 the first steps overflow, are skipped
     * (reported with gradient norm 0, parameters untouched) while the scale halves, and training goes on */
    mt_job_result_t h16, h16o;
    const char *f16[] = {"--precision.compute=fp16", "--precision.init_scale=1024"};
    CHECK_OK(run_cuda(2, f16, &h16));
    same_losses("fp16 gpu vs cpu fp32", &h16, &cpu, 1e-2);
    const char *f16o[] = {"--precision.compute=fp16", "--precision.init_scale=16777216"};
    CHECK_OK(run_cuda(2, f16o, &h16o));
    int zero_norm = 0;
    for (int64_t s = 0; s < h16o.n_steps; s++) {
        zero_norm += h16o.grad_norm[s] == 0.0;
    }
    CHECK(h16o.n_steps == STEPS && zero_norm >= 1 && zero_norm < STEPS && isfinite(h16o.loss[STEPS - 1]),
          "fp16 from 2^24: %d of %lld steps skipped (norm 0), last loss %g", zero_norm, (long long)h16o.n_steps,
          h16o.n_steps == STEPS ? h16o.loss[STEPS - 1] : NAN);
    for (int zs = 1; zs <= 3; zs++) {
        zero_stage(dir, zs, &gpu, &bf, &h16o, &cpu);
    }
    zero_memory();
    zero_comm_bytes(dir);
    pipeline(dir);
    mlp(dir, false);
    sgd(dir, &gpu);
    /* fp16 resumed: the loss scale and its clean-step count come back from the checkpoint. Under the
     * emulator, from 2^20 steps 1-3 are clean, the scale doubles and step 4 overflows (a resume at the
     * initial scale would not skip it); from 2^21 step 1 overflows, steps 2-4 are clean and the scale
     * doubles for step 5 (a resume without the clean-step count would not). */
    fp16_resume(dir, "ckpt3", "--precision.init_scale=1048576");
    fp16_resume(dir, "ckpt4", "--precision.init_scale=2097152");
    mt_job_result_free(&h16);
    mt_job_result_free(&h16o);
    /* checkpoint after step 3, resume */
    const char *stop[] = {ckpt_arg, "--checkpoint.every=3", "--stop-after=3"};
    CHECK_OK(run_cuda(3, stop, &part));
    CHECK(part.n_steps == 3, "interrupted run: %lld steps", (long long)part.n_steps);
    const char *res[] = {ckpt_arg, "--checkpoint.every=3"};
    CHECK_OK(run_cuda(2, res, &resumed));
    CHECK(resumed.first_step == 3, "resumed after step %lld", (long long)resumed.first_step);
    for (int64_t s = 3; s < STEPS && s < resumed.n_steps; s++) {
        double d = fabs(resumed.loss[s] - gpu.loss[s]) / gpu.loss[s];
        CHECK(d <= SAME_TOL, "resumed step %lld: %.9g vs %.9g", (long long)s + 1, resumed.loss[s], gpu.loss[s]);
    }
    /* the GPU checkpoint resumed on the CPU: the layout is the CPU engines' */
    char ckpt2_arg[300];
    snprintf(ckpt2_arg, sizeof(ckpt2_arg), "--checkpoint.dir=%s/ckpt2", dir);
    mt_job_result_t part2, on_cpu;
    const char *stop2[] = {ckpt2_arg, "--checkpoint.every=3", "--stop-after=3"};
    CHECK_OK(run_cuda(3, stop2, &part2));
    const char *res2[] = {ckpt2_arg, "--parallel.engine=ddp"};
    CHECK_OK(run("cpu", 2, res2, &on_cpu));
    CHECK(on_cpu.first_step == 3 && on_cpu.n_steps == STEPS, "cpu resumed after step %lld, ran to %lld",
          (long long)on_cpu.first_step, (long long)on_cpu.n_steps);
    for (int64_t s = 3; s < STEPS && s < on_cpu.n_steps; s++) {
        double d = fabs(on_cpu.loss[s] - cpu.loss[s]) / cpu.loss[s];
        CHECK(d <= 1e-3, "gpu checkpoint resumed on the cpu, step %lld: %.9g vs %.9g", (long long)s + 1, on_cpu.loss[s],
              cpu.loss[s]);
    }
    mt_job_result_t *all[] = {&cpu, &gpu, &one, &rc, &bf, &part, &resumed, &part2, &on_cpu};
    for (size_t i = 0; i < MT_ARRAY_LEN(all); i++) {
        mt_job_result_free(all[i]);
    }
cleanup:
    MPI_Barrier(w->comm);
    if (w->rank == 0) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        CHECK(system(cmd) == 0, "%s", cmd);
    }
    return mt_test_finish_mpi("test_job_cuda");
}
