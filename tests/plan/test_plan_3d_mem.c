/* The planner's memory against the allocator for tensor- and pipeline-parallel layouts: parallel3d.c runs
 * real steps of a small GPT-2 on 4 ranks (tp x pp x dp with the all-reduce path and the engines, both
 * schedules, sequence parallelism, bf16/fp16 emulated), and every rank compares its allocator's peak bytes
 * per category with mt_plan_stage_mem for its pipeline stage. Parameters, gradients, optimizer state and
 * activations must agree to the byte on the ranks the plan sizes (tp rank 0, dp rank 0 of each stage);
 * communication buffers and every rank's total within 10%.
 * SPDX-License-Identifier: MIT */
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "parallel/parallel3d.h"
#include "plan/plan.h"
#include "runtime/alloc.h"
#include "runtime/rt.h"
#include "testutil.h"

typedef struct {
    const char *name;
    int tp, pp, dp, micro_batch;
    mt_plan_sched_t sched;
    bool sp;
    mt_plan_engine_t engine;
    const char *prec; /* precision.compute (NULL: fp32) */
} case_t;

static void run_case(const case_t *c, int rank, int world) {
    char ov_mb[64];
    snprintf(ov_mb, sizeof(ov_mb), "--train.micro_batch=%d", c->micro_batch);
    char ov_prec[64];
    snprintf(ov_prec, sizeof(ov_prec), "--precision.compute=%s", c->prec ? c->prec : "fp32");
    char *ov[] = {"--model.n_layer=4",    "--model.n_head=4",        "--model.n_embd=64",
                  "--model.seq_len=32",   "--model.vocab_size=200",  "--train.global_batch=16",
                  "--train.grad_accum=0", "--optimizer.grad_clip=0", ov_mb,
                  ov_prec};
    mt_config_t *cfg = NULL;
    CHECK_OK(mt_config_load(NULL, (int)MT_ARRAY_LEN(ov), ov, 0, &cfg, rank == 0 ? stderr : NULL));
    if (!cfg) {
        return;
    }
    mt_plan_job_t job;
    CHECK_OK(mt_plan_job_from_config(cfg, &job));
    /* every rank here runs unbound on this machine's CPUs: a comm with more ranks than that is
     * oversubscribed, which sizes its shared-memory segment */
    cpu_set_t set;
    job.node_cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
    int m_count = (int)(job.global_batch / c->dp / c->micro_batch);
    mt_plan_layout_t l = {.tp = c->tp,
                          .pp = c->pp,
                          .dp = c->dp,
                          .engine = c->engine,
                          .schedule = c->sched,
                          .micro_batch = c->micro_batch,
                          .microbatches = m_count,
                          .sp = c->sp};
    snprintf(l.order, sizeof(l.order), "tp-dp-pp");

    mt_mem_stats_t before, after;
    mt_mem_stats(MT_MEM_HOST, &before);
    mt_mem_reset_peak(MT_MEM_HOST);
    mt_par3d_params_t p = MT_PAR3D_PARAMS_INIT;
    p.tp = c->tp;
    p.pp = c->pp;
    p.dp = c->dp;
    p.order = "tp-dp-pp";
    p.schedule = c->sched == MT_PLAN_GPIPE ? MT_PP_GPIPE : MT_PP_1F1B;
    p.microbatches = m_count;
    p.micro_batch = c->micro_batch;
    p.seq_len = job.seq_len;
    p.sequence_parallel = c->sp;
    p.dp_mode = c->engine == MT_PLAN_ALLREDUCE ? MT_P3D_ALLREDUCE : MT_P3D_ENGINE;
    p.engine_kind = c->engine == MT_PLAN_DDP ? MT_ENGINE_DDP : MT_ENGINE_ZERO;
    p.zero_stage = c->engine >= MT_PLAN_ZERO1 && c->engine <= MT_PLAN_ZERO3 ? (int)c->engine : 1;
    p.bucket_mb = job.bucket_mb;
    p.optim = job.optim;
    mt_par3d_t p3 = NULL;
    CHECK_OK(mt_par3d_init(MPI_COMM_WORLD, &job.model, &p, &p3));
    int coords[MT_AXIS_N] = {0, 0, 0};
    if (p3) { /* the compute dtype as train/job.c sets it on the model the 3-D engine drives */
        CHECK_OK(mt_model_set_compute(mt_par3d_model(p3), (int)mt_prec_storage(job.prec)));
        mt_par3d_coords(p3, coords);
        int row0 = 0, rows = 0;
        mt_par3d_rows(p3, &row0, &rows);
        static int32_t tok[16 * 32], tgt[16 * 32];
        for (int i = 0; i < rows * job.seq_len; i++) {
            tok[i] = (i * 7 + row0) % job.model.vocab_size;
            tgt[i] = (tok[i] * 3 + 1) % job.model.vocab_size;
        }
        for (int step = 0; step < 2; step++) {
            float loss = 0;
            CHECK_OK(mt_par3d_step(p3, tok, tgt, 1e-3f, &loss));
        }
    }
    mt_mem_stats(MT_MEM_HOST, &after);
    int stage = coords[MT_AXIS_PP];
    int64_t plan[MT_MEM_NCAT], plan_total = 0;
    CHECK_OK(mt_plan_stage_mem(&job, &l, stage, plan));
    /* the plan counts `meshtrain train`'s communicators (train/job_mp.c, with a tp-pp comm); this runs
     * parallel3d.c's, whose shared-memory segments differ */
    int64_t shm_train = 0, shm_3d = 0;
    CHECK_OK(mt_plan_stage_shm_bytes(&job, &l, stage, MT_PLAN_PATH_TRAIN, &shm_train));
    CHECK_OK(mt_plan_stage_shm_bytes(&job, &l, stage, MT_PLAN_PATH_TRAIN3D, &shm_3d));
    plan[MT_MEM_COMM] += shm_3d - shm_train;
    bool sized = coords[MT_AXIS_TP] == 0 && coords[MT_AXIS_DP] == 0;
    for (int k = 0; k < MT_MEM_COMM; k++) {
        int64_t measured = after.peak[k] - before.current[k];
        plan_total += plan[k];
        CHECK(!sized || plan[k] == measured, "%s, rank %d (stage %d): %s planned %lld, the allocator held at most %lld",
              c->name, rank, stage, mt_mem_cat_name((mt_mem_cat_t)k), (long long)plan[k], (long long)measured);
    }
    plan_total += plan[MT_MEM_COMM];
    int64_t peak = after.total_peak - before.total_current;
    double err = (double)(plan_total - peak) / (double)peak;
    CHECK(err > -0.10 && err < 0.10,
          "%s, rank %d (stage %d): planned %lld, measured peak %lld (%+.1f%%; comm %lld vs %lld)", c->name, rank, stage,
          (long long)plan_total, (long long)peak, 100 * err, (long long)plan[MT_MEM_COMM],
          (long long)(after.peak[MT_MEM_COMM] - before.current[MT_MEM_COMM]));
    if (sized) {
        printf("%-26s rank %d stage %d: planned %9lld B (activations %lld comm %lld)  measured peak %9lld B  %+.2f%%\n",
               c->name, rank, stage, (long long)plan_total, (long long)plan[MT_MEM_ACTIVATIONS],
               (long long)plan[MT_MEM_COMM], (long long)peak, 100 * err);
    }
    mt_par3d_free(p3);
    mt_config_free(cfg);
    (void)world;
}

int main(int argc, char **argv) {
    if (mt_rt_init(&argc, &argv) != MT_OK) {
        return 1;
    }
    const mt_world_t *w = mt_rt_world();
    static const case_t cases[] = {
        {"tp2 dp2", 2, 1, 2, 4, MT_PLAN_1F1B, false, MT_PLAN_ALLREDUCE, NULL},
        {"tp2 dp2 sp", 2, 1, 2, 2, MT_PLAN_1F1B, true, MT_PLAN_ALLREDUCE, NULL},
        {"pp2 dp2 1f1b", 1, 2, 2, 2, MT_PLAN_1F1B, false, MT_PLAN_ALLREDUCE, NULL},
        {"pp2 dp2 gpipe", 1, 2, 2, 2, MT_PLAN_GPIPE, false, MT_PLAN_ALLREDUCE, NULL},
        {"tp2 pp2 1f1b", 2, 2, 1, 4, MT_PLAN_1F1B, false, MT_PLAN_ALLREDUCE, NULL},
        {"pp4 1f1b", 1, 4, 1, 2, MT_PLAN_1F1B, false, MT_PLAN_ALLREDUCE, NULL},
        {"pp2 dp2 ddp", 1, 2, 2, 2, MT_PLAN_1F1B, false, MT_PLAN_DDP, NULL},
        {"pp2 dp2 zero-1", 1, 2, 2, 4, MT_PLAN_1F1B, false, MT_PLAN_ZERO1, NULL},
        {"pp2 dp2 zero-2", 1, 2, 2, 2, MT_PLAN_1F1B, false, MT_PLAN_ZERO2, NULL},
        {"pp2 dp2 zero-3", 1, 2, 2, 2, MT_PLAN_GPIPE, false, MT_PLAN_ZERO3, NULL},
        {"tp2 dp2 ddp", 2, 1, 2, 4, MT_PLAN_1F1B, false, MT_PLAN_DDP, NULL},
        /* bf16/fp16 emulation: its scratch is sized over the whole model's tp-rank shapes, on every stage */
        {"tp2 dp2 sp bf16", 2, 1, 2, 2, MT_PLAN_1F1B, true, MT_PLAN_ALLREDUCE, "bf16"},
        {"pp2 dp2 zero-3 fp16", 1, 2, 2, 2, MT_PLAN_GPIPE, false, MT_PLAN_ZERO3, "fp16"},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(cases); i++) {
        if (cases[i].tp * cases[i].pp * cases[i].dp == w->size) {
            run_case(&cases[i], w->rank, w->size);
        }
    }
    int rc = mt_test_finish_mpi("test_plan_3d_mem");
    mt_rt_finalize();
    return rc;
}
