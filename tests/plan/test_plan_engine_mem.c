/* The planner's memory against the allocator on several ranks: data-parallel engines (DDP, ZeRO-1/2/3 of
 * parallel/engine.h) driving real forward/backward/optimizer steps of a small GPT-2 over the world, and
 * mt_plan_stage_mem's prediction for that layout (fp32, and bf16/fp16 emulated). Parameters, gradients, optimizer
 * state and activations must agree to the byte on dp rank 0 (the rank the plan sizes). ZeRO-2/3's communication
 * pools are planned at the bound the engine keeps to (how many buffers are in flight at once depends on timing), so
 * they may be planned higher than a run holds; the other engines hold none, and their total is within 10% on every
 * rank.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "models/model_config.h"
#include "parallel/engine.h"
#include "plan/plan.h"
#include "runtime/alloc.h"
#include "runtime/rt.h"
#include "testutil.h"

typedef struct {
    const char *name;
    mt_plan_engine_t engine;
    int micro_batch;
    mt_plan_rc_t rc;
    const char *prec; /* precision.compute (NULL: fp32) */
} case_t;

static void run_case(const case_t *c, mt_comm_t comm, int rank, int size) {
    char ov_mb[64], ov_rc[64], ov_attn[64], ov_prec[64];
    snprintf(ov_mb, sizeof(ov_mb), "--train.micro_batch=%d", c->micro_batch);
    snprintf(ov_prec, sizeof(ov_prec), "--precision.compute=%s", c->prec ? c->prec : "fp32");
    snprintf(ov_rc, sizeof(ov_rc), "--model.recompute=%s",
             c->rc == MT_PLAN_RC_BLOCK || c->rc == MT_PLAN_RC_BLOCK_ATTN ? "block" : "none");
    snprintf(ov_attn, sizeof(ov_attn), "--model.attn_recompute=%s",
             c->rc == MT_PLAN_RC_ATTN || c->rc == MT_PLAN_RC_BLOCK_ATTN ? "true" : "false");
    char *ov[] = {"--model.n_layer=3",
                  "--model.n_head=4",
                  "--model.n_embd=64",
                  "--model.seq_len=32",
                  "--model.vocab_size=200",
                  "--train.global_batch=16",
                  "--parallel.tp=1",
                  "--train.grad_accum=0",
                  "--parallel.bucket_mb=0.05",
                  ov_mb,
                  ov_rc,
                  ov_attn,
                  ov_prec};
    mt_config_t *cfg = NULL;
    CHECK_OK(mt_config_load(NULL, (int)MT_ARRAY_LEN(ov), ov, size, &cfg, rank == 0 ? stderr : NULL));
    if (!cfg) {
        return;
    }
    mt_plan_job_t job;
    CHECK_OK(mt_plan_job_from_config(cfg, &job));
    int m_count = (int)(job.global_batch / size / c->micro_batch);
    mt_plan_layout_t l = {.tp = 1,
                          .pp = 1,
                          .dp = size,
                          .engine = c->engine,
                          .schedule = MT_PLAN_1F1B,
                          .micro_batch = c->micro_batch,
                          .microbatches = m_count,
                          .recompute = c->rc};
    snprintf(l.order, sizeof(l.order), "tp-dp-pp");
    int64_t plan[MT_MEM_NCAT];
    CHECK_OK(mt_plan_stage_mem(&job, &l, 0, plan));
    /* the dp comm (and its shared-memory segment, which the plan counts) exists before the measurement */
    int64_t shm = 0;
    CHECK_OK(mt_plan_stage_shm_bytes(&job, &l, 0, MT_PLAN_PATH_TRAIN, &shm));
    CHECK(size < 2 || shm > 0 || getenv("MESHTRAIN_COLL_ALGO"), "%s: a %d-rank dp comm has a shm segment", c->name,
          size);
    plan[MT_MEM_COMM] -= shm;

    mt_mem_stats_t before, after;
    mt_mem_stats(MT_MEM_HOST, &before);
    mt_mem_reset_peak(MT_MEM_HOST);
    mt_model_t model = NULL;
    mt_engine_t e = NULL;
    mt_acts_t acts = NULL;
    CHECK_OK(mt_model_init(&job.model, &model));
    CHECK_OK(mt_model_set_compute(model, (int)mt_prec_storage(job.prec))); /* as train/job.c sets it */
    mt_engine_params_t ep = MT_ENGINE_PARAMS_INIT;
    ep.kind = c->engine == MT_PLAN_DDP ? MT_ENGINE_DDP : MT_ENGINE_ZERO;
    ep.zero_stage = c->engine == MT_PLAN_DDP ? 1 : (int)c->engine;
    ep.grad_accum = m_count;
    ep.bucket_mb = job.bucket_mb;
    ep.optim = job.optim;
    CHECK_OK(mt_engine_init(model, comm, &ep, &e));
    CHECK_OK(mt_acts_init(model, c->micro_batch, job.seq_len, &acts));
    int n = c->micro_batch * job.seq_len;
    int32_t tokens[4096], targets[4096];
    for (int step = 0; e && acts && step < 2; step++) {
        CHECK_OK(mt_engine_zero_grads(e));
        for (int k = 0; k < m_count; k++) {
            for (int i = 0; i < n; i++) {
                tokens[i] = (i * 7 + k * 13 + rank * 31 + step) % job.model.vocab_size;
                targets[i] = (tokens[i] * 3 + 1) % job.model.vocab_size;
            }
            float loss = 0;
            CHECK_OK(mt_model_forward(model, acts, 0, mt_model_n_modules(model), tokens, targets, NULL, NULL, &loss));
            CHECK_OK(mt_model_backward(model, acts, 0, mt_model_n_modules(model), NULL, NULL, 1.0f / (float)m_count));
        }
        double sumsq = 0;
        CHECK_OK(mt_engine_finish_grads(e));
        CHECK_OK(mt_engine_grad_sumsq(e, &sumsq));
        CHECK_OK(mt_engine_step(e, 1e-3f, 1.0f));
    }
    mt_mem_stats(MT_MEM_HOST, &after);
    int64_t measured[MT_MEM_NCAT], plan_total = 0;
    for (int k = 0; k < MT_MEM_NCAT; k++) {
        measured[k] = after.peak[k] - before.current[k];
    }
    for (int k = 0; k < MT_MEM_COMM; k++) {
        plan_total += plan[k];
        if (rank == 0) {
            CHECK(plan[k] == measured[k], "%s on %d ranks: %s planned %lld bytes, the allocator held at most %lld",
                  c->name, size, mt_mem_cat_name((mt_mem_cat_t)k), (long long)plan[k], (long long)measured[k]);
        }
    }
    plan_total += plan[MT_MEM_COMM];
    CHECK(plan[MT_MEM_COMM] >= measured[MT_MEM_COMM] - 4096, "%s: comm planned %lld, held %lld", c->name,
          (long long)plan[MT_MEM_COMM], (long long)measured[MT_MEM_COMM]);
    int64_t peak = after.total_peak - before.total_current;
    double err = (double)(plan_total - peak) / (double)peak;
    bool pools = c->engine == MT_PLAN_ZERO2 || c->engine == MT_PLAN_ZERO3;
    CHECK(pools || (err > -0.10 && err < 0.10), "%s on %d ranks, rank %d: planned %lld, measured peak %lld (%+.1f%%)",
          c->name, size, rank, (long long)plan_total, (long long)peak, 100 * err);
    CHECK(!pools || (err > -0.10 && plan[MT_MEM_COMM] <= 3 * measured[MT_MEM_COMM]),
          "%s on %d ranks, rank %d: planned %lld, measured peak %lld (comm %lld vs %lld)", c->name, size, rank,
          (long long)plan_total, (long long)peak, (long long)plan[MT_MEM_COMM], (long long)measured[MT_MEM_COMM]);
    if (rank == 0) {
        printf("%-22s %d ranks: planned %9lld B (params %lld grads %lld optimizer %lld activations %lld comm %lld)  "
               "measured peak %9lld B (comm %lld)  %+.2f%%\n",
               c->name, size, (long long)plan_total, (long long)plan[0], (long long)plan[1], (long long)plan[2],
               (long long)plan[3], (long long)plan[4], (long long)peak, (long long)measured[MT_MEM_COMM], 100 * err);
    }
    mt_acts_free(acts);
    mt_engine_free(e);
    mt_model_free(model);
    mt_config_free(cfg);
}

int main(int argc, char **argv) {
    if (mt_rt_init(&argc, &argv) != MT_OK) {
        return 1;
    }
    const mt_world_t *w = mt_rt_world();
    mt_comm_params_t cp = MT_COMM_PARAMS_INIT;
    mt_comm_t comm = NULL;
    CHECK_OK(mt_comm_init(w->comm, &cp, &comm));
    static const case_t cases[] = {
        {"ddp b4", MT_PLAN_DDP, 4, MT_PLAN_RC_NONE, NULL},
        {"ddp b1 attn-recompute", MT_PLAN_DDP, 1, MT_PLAN_RC_ATTN, NULL},
        {"zero-1 b2", MT_PLAN_ZERO1, 2, MT_PLAN_RC_NONE, NULL},
        {"zero-2 b2", MT_PLAN_ZERO2, 2, MT_PLAN_RC_NONE, NULL},
        {"zero-3 b4", MT_PLAN_ZERO3, 4, MT_PLAN_RC_NONE, NULL},
        {"zero-3 b2 block-recompute", MT_PLAN_ZERO3, 2, MT_PLAN_RC_BLOCK, NULL},
        {"zero-2 b8", MT_PLAN_ZERO2, 8, MT_PLAN_RC_NONE, NULL},
        {"zero-1 b1 attn-recompute", MT_PLAN_ZERO1, 1, MT_PLAN_RC_ATTN, NULL},
        /* bf16/fp16 emulation: its scratch holds a module's whole (for ZeRO-3 gathered) parameters */
        {"ddp b2 bf16", MT_PLAN_DDP, 2, MT_PLAN_RC_NONE, "bf16"},
        {"zero-3 b2 fp16", MT_PLAN_ZERO3, 2, MT_PLAN_RC_NONE, "fp16"},
    };
    for (size_t i = 0; comm && i < MT_ARRAY_LEN(cases); i++) {
        if (16 % (w->size * cases[i].micro_batch) == 0) {
            run_case(&cases[i], comm, w->rank, w->size);
        }
    }
    mt_comm_free(comm);
    int rc = mt_test_finish_mpi("test_plan_engine_mem");
    mt_rt_finalize();
    return rc;
}
