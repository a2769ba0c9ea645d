/* 3-D composition: tp x pp x dp = world ranks train the tiny GPT-2 for 5 steps and must match the
 * single-process run in every step's loss and in the final parameters (SGD 1e-5, AdamW 1e-4 relative; see
 * eq_param_close), with each dp rank reading its own rows of the global batch and a tp group sharing them.
 * 8 ranks: 2x2x2 with the built-in dp all-reduce, with sequence parallelism, with AdamW; pp 2 x dp 4 with
 * DDP, ZeRO-1, ZeRO-2 and ZeRO-3. 4 ranks: pp 2 x dp 2 with DDP and ZeRO-1/2/3, tp 2 x pp 2, tp 2 x dp 2
 * with sequence parallelism. Replicas must also agree bit for bit across dp, and each rank's parameter
 * storage (the allocator's MT_MEM_PARAMS) must be its stage's share, not the whole model.
 * With the argument "engine-tp" it runs the engine cases with tp > 1 instead (2x2x2 with DDP, ZeRO-1/2/3,
 * with sequence parallelism and clipping; tp 2 x dp 2 with ZeRO-2/3; tp 2 x pp 2 with DDP and clipping).
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "eqref.h"
#include "parallel/parallel3d.h"
#include "runtime/alloc.h"
#include "runtime/rt.h"
#include "testutil.h"

typedef struct {
    const char *name;
    int world, tp, pp, dp, m;
    mt_pp_schedule_t sched;
    bool sp, adamw;
    mt_p3d_dp_mode_t mode;
    mt_engine_kind_t kind;
    int zero_stage;
    float clip;      /* optimizer.grad_clip (0: off) */
    int64_t persist; /* ZeRO-3: parallel.zero_persist_threshold */
} case_t;

static const case_t CASES[] = {
    {"2x2x2 allreduce 1f1b", 8, 2, 2, 2, 2, MT_PP_1F1B, false, false, MT_P3D_ALLREDUCE, MT_ENGINE_DDP, 1, 0.0f, 0},
    {"2x2x2 allreduce gpipe adamw", 8, 2, 2, 2, 4, MT_PP_GPIPE, false, true, MT_P3D_ALLREDUCE, MT_ENGINE_DDP,
     1, 0.0f, 0},
    {"2x2x2 sequence-parallel", 8, 2, 2, 2, 2, MT_PP_1F1B, true, false, MT_P3D_ALLREDUCE, MT_ENGINE_DDP, 1, 0.0f, 0},
    {"2x2x2 sequence-parallel clipped adamw", 8, 2, 2, 2, 2, MT_PP_1F1B, true, true, MT_P3D_ALLREDUCE, MT_ENGINE_DDP, 1,
     0.05f, 0},
    {"tp2 pp2 dp1 clipped", 4, 2, 2, 1, 2, MT_PP_GPIPE, false, false, MT_P3D_ALLREDUCE, MT_ENGINE_DDP, 1, 0.05f, 0},
    {"tp1 pp1 dp4 ddp clipped", 4, 1, 1, 4, 1, MT_PP_1F1B, false, false, MT_P3D_ENGINE, MT_ENGINE_DDP, 1, 0.05f, 0},
    {"2x2x2 ddp", 8, 2, 2, 2, 2, MT_PP_1F1B, false, false, MT_P3D_ENGINE, MT_ENGINE_DDP, 1, 0.0f, 0},
    {"2x2x2 zero-1", 8, 2, 2, 2, 2, MT_PP_1F1B, false, false, MT_P3D_ENGINE, MT_ENGINE_ZERO, 1, 0.0f, 0},
    {"2x2x2 zero-1 sequence-parallel adamw", 8, 2, 2, 2, 2, MT_PP_1F1B, true, true, MT_P3D_ENGINE, MT_ENGINE_ZERO, 1,
     0.0f, 0},
    {"tp2 dp2 zero-3", 4, 2, 1, 2, 2, MT_PP_1F1B, false, false, MT_P3D_ENGINE, MT_ENGINE_ZERO, 3, 0.0f, 0},
    {"tp2 dp2 zero-2 sequence-parallel", 4, 2, 1, 2, 2, MT_PP_1F1B, true, false, MT_P3D_ENGINE, MT_ENGINE_ZERO, 2,
     0.0f, 0},
    {"2x2x2 ddp clipped", 8, 2, 2, 2, 2, MT_PP_1F1B, false, false, MT_P3D_ENGINE, MT_ENGINE_DDP, 1, 0.05f, 0},
    {"2x2x2 zero-1 clipped adamw", 8, 2, 2, 2, 2, MT_PP_GPIPE, false, true, MT_P3D_ENGINE, MT_ENGINE_ZERO, 1, 0.05f, 0},
    {"2x2x2 zero-2 sequence-parallel clipped", 8, 2, 2, 2, 2, MT_PP_1F1B, true, false, MT_P3D_ENGINE, MT_ENGINE_ZERO, 2,
     0.05f, 0},
    {"2x2x2 zero-3 clipped", 8, 2, 2, 2, 2, MT_PP_1F1B, false, false, MT_P3D_ENGINE, MT_ENGINE_ZERO, 3, 0.05f, 0},
    {"2x2x2 zero-3 sp persistent adamw", 8, 2, 2, 2, 2, MT_PP_1F1B, true, true, MT_P3D_ENGINE, MT_ENGINE_ZERO, 3,
     0.05f, 100},
    {"tp2 dp2 zero-3 clipped", 4, 2, 1, 2, 2, MT_PP_1F1B, false, false, MT_P3D_ENGINE, MT_ENGINE_ZERO, 3, 0.05f, 0},
    {"tp2 dp2 zero-3 sp persistent", 4, 2, 1, 2, 2, MT_PP_1F1B, true, false, MT_P3D_ENGINE, MT_ENGINE_ZERO, 3, 0.05f,
     100},
    {"tp2 pp2 dp1 ddp clipped", 4, 2, 2, 1, 2, MT_PP_1F1B, false, false, MT_P3D_ENGINE, MT_ENGINE_DDP, 1, 0.05f, 0},
    {"tp1 pp2 dp4 ddp", 8, 1, 2, 4, 2, MT_PP_1F1B, false, false, MT_P3D_ENGINE, MT_ENGINE_DDP, 1, 0.0f, 0},
    {"tp1 pp2 dp4 zero-2 clipped", 8, 1, 2, 4, 2, MT_PP_1F1B, false, false, MT_P3D_ENGINE, MT_ENGINE_ZERO, 2, 0.05f, 0},
    {"tp1 pp2 dp4 zero-3 gpipe clipped", 8, 1, 2, 4, 2, MT_PP_GPIPE, false, false, MT_P3D_ENGINE, MT_ENGINE_ZERO, 3,
     0.05f, 0},
    {"tp1 pp2 dp2 zero-2 clipped", 4, 1, 2, 2, 4, MT_PP_1F1B, false, false, MT_P3D_ENGINE, MT_ENGINE_ZERO, 2, 0.05f, 0},
    {"tp1 pp2 dp2 zero-3 clipped adamw", 4, 1, 2, 2, 2, MT_PP_1F1B, false, true, MT_P3D_ENGINE, MT_ENGINE_ZERO, 3,
     0.05f, 0},
    {"tp1 pp2 dp2 ddp clipped", 4, 1, 2, 2, 2, MT_PP_GPIPE, false, false, MT_P3D_ENGINE, MT_ENGINE_DDP, 1, 0.05f, 0},
    {"tp1 pp2 dp4 zero-1", 8, 1, 2, 4, 2, MT_PP_1F1B, false, false, MT_P3D_ENGINE, MT_ENGINE_ZERO, 1, 0.0f, 0},
    {"tp1 pp2 dp2 ddp", 4, 1, 2, 2, 2, MT_PP_1F1B, false, false, MT_P3D_ENGINE, MT_ENGINE_DDP, 1, 0.0f, 0},
    {"tp1 pp2 dp2 zero-1 adamw", 4, 1, 2, 2, 4, MT_PP_GPIPE, false, true, MT_P3D_ENGINE, MT_ENGINE_ZERO, 1, 0.0f, 0},
    {"tp2 pp2 dp1", 4, 2, 2, 1, 4, MT_PP_1F1B, false, false, MT_P3D_ALLREDUCE, MT_ENGINE_DDP, 1, 0.0f, 0},
    {"tp2 pp1 dp2 sequence-parallel", 4, 2, 1, 2, 2, MT_PP_1F1B, true, false, MT_P3D_ALLREDUCE,
     MT_ENGINE_DDP, 1, 0.0f, 0},
};

/* A stage allocates parameters (and gradients) for its own parameters only: the allocator's MT_MEM_PARAMS
 * bytes of this rank's set-up are its share (the parameters its stage reads, tp shards; ZeRO-3: 1/dp of
 * them) up to the engine's padding, and with pp > 1 clearly less than the whole model's. */
static void check_stage_memory(const case_t *c, mt_par3d_t p3, int64_t params, int64_t grads, int rank) {
    mt_model_t m = mt_par3d_model(p3);
    double held = 0.0, whole = 0.0;
    for (int i = 0; i < mt_model_n_params(m); i++) {
        double n = (double)mt_model_param(m, i)->numel * sizeof(float);
        whole += n;
        held += (mt_par3d_param_flags(p3, i) & MT_ENGINE_PARAM_HELD) ? n : 0.0;
    }
    mt_engine_t e = mt_par3d_engine(p3);
    double share = c->mode == MT_P3D_ENGINE && c->kind == MT_ENGINE_ZERO && c->zero_stage == 3 ? held / c->dp : held;
    double slack = 4096.0; /* allocator rounding */
    if (e) {
        mt_engine_mem_t em;
        mt_engine_mem(e, &em);
        slack += (double)em.n_units * 16 * c->dp * sizeof(float) * 2; /* units padded to dp x 64 bytes */
        CHECK(params == em.params, "%s: MT_MEM_PARAMS grew by %lld, the engine holds %lld", c->name, (long long)params,
              (long long)em.params);
    }
    CHECK(params >= share - slack && params <= share + slack,
          "%s: rank %d's MT_MEM_PARAMS is %lld bytes, its stage's share %.0f (whole model %.0f)", c->name, rank,
          (long long)params, share, whole);
    CHECK(grads > 0 && grads <= held + slack, "%s: MT_MEM_GRADS %lld bytes for a stage share of %.0f", c->name,
          (long long)grads, held);
    if (c->pp > 1) {
        CHECK(params < 0.8 * whole, "%s: a stage holds %lld of the whole model's %.0f parameter bytes", c->name,
              (long long)params, whole);
    }
    if (rank == 0) {
        printf("%s: rank 0 holds %lld parameter bytes (its share %.0f, the whole model %.0f)\n", c->name,
               (long long)params, share, whole);
    }
}

static void run_case(const case_t *c, int rank) {
    eq_setup_t s;
    eq_setup_default(&s, c->adamw);
    s.grad_clip = c->clip;
    double tol = c->adamw ? 1e-4 : 1e-5;
    double ref_loss[16] = {0};
    mt_model_t ref = NULL;
    if (rank == 0) {
        CHECK_OK(eq_serial_run(&s, ref_loss, &ref));
    }
    mt_par3d_params_t p = MT_PAR3D_PARAMS_INIT;
    p.tp = c->tp;
    p.pp = c->pp;
    p.dp = c->dp;
    p.schedule = c->sched;
    p.microbatches = c->m;
    p.micro_batch = s.global_batch / (c->dp * c->m);
    p.seq_len = s.seq_len;
    p.sequence_parallel = c->sp;
    p.dp_mode = c->mode;
    p.engine_kind = c->kind;
    p.zero_stage = c->zero_stage;
    p.optim = s.optim;
    p.grad_clip = c->clip;
    p.persist_threshold = c->persist;
    p.timeout_s = 60.0;
    mt_par3d_t p3 = NULL;
    mt_mem_stats_t m0, m1;
    mt_mem_stats(MT_MEM_HOST, &m0);
    mt_status_t st = mt_par3d_init(MPI_COMM_WORLD, &s.model, &p, &p3);
    mt_mem_stats(MT_MEM_HOST, &m1);
    CHECK(st == MT_OK, "%s: mt_par3d_init: %s", c->name, mt_last_error_msg());
    if (!p3) {
        mt_model_free(ref);
        return;
    }
    check_stage_memory(c, p3, m1.current[MT_MEM_PARAMS] - m0.current[MT_MEM_PARAMS],
                       m1.current[MT_MEM_GRADS] - m0.current[MT_MEM_GRADS], rank);
    int row0 = 0, rows = 0;
    mt_par3d_rows(p3, &row0, &rows);
    int32_t *tok = malloc((size_t)rows * s.seq_len * sizeof(int32_t));
    int32_t *tgt = malloc((size_t)rows * s.seq_len * sizeof(int32_t));
    for (int step = 0; step < s.steps; step++) {
        eq_batch(&s, step, row0, rows, tok, tgt); /* this dp rank's rows, the same across its tp group */
        float loss = -1.0f;
        CHECK_OK(mt_par3d_step(p3, tok, tgt, s.lr, &loss));
        if (rank == 0) {
            CHECK_CLOSE(loss, ref_loss[step], tol, 0.0);
            if (step == s.steps - 1) {
                printf("%s: step %d loss %.7f (serial %.7f), gradient norm %.4f\n", c->name, step, loss, ref_loss[step],
                       mt_par3d_last_grad_norm(p3));
            }
        }
    }
    mt_model_t m = mt_par3d_model(p3);
    for (int i = 0; i < mt_model_n_params(m); i++) {
        const mt_param_t *q = mt_model_param(m, i);
        size_t n = (size_t)(q->global_shape[0] * q->global_shape[1]);
        float *g = rank == 0 ? malloc(n * sizeof(float)) : NULL;
        CHECK_OK(mt_par3d_gather_param(p3, i, g));
        if (rank == 0) {
            double e = 0.0;
            const mt_param_t *r = mt_model_param(ref, i);
            bool ok =
                r->numel == n && eq_param_close(q->name, g, r->data, n, s.model.n_embd, tol, eq_key_bound(&s), &e);
            CHECK(ok, "%s: parameter %s differs by %.3g (tol %.0e)", c->name, q->name, e, tol);
        }
        free(g);
        /* Replicas agree bit for bit across the dp group. */
        if (q->data && mt_pipeline_needs_param(mt_par3d_pipeline(p3), i) && c->dp > 1) {
            float *mn = malloc(q->numel * sizeof(float)), *mx = malloc(q->numel * sizeof(float));
            mt_comm_t dpc = mt_par3d_comm(p3, MT_AXIS_DP);
            CHECK_OK(mt_coll_all_reduce(dpc, q->data, mn, q->numel, MT_COLL_F32, MT_REDOP_MIN, NULL, NULL));
            CHECK_OK(mt_coll_all_reduce(dpc, q->data, mx, q->numel, MT_COLL_F32, MT_REDOP_MAX, NULL, NULL));
            CHECK(memcmp(mn, mx, q->numel * sizeof(float)) == 0, "%s: %s differs across dp replicas", c->name, q->name);
            free(mn);
            free(mx);
        }
    }
    free(tok);
    free(tgt);
    mt_par3d_free(p3);
    mt_model_free(ref);
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    const mt_world_t *w = mt_rt_world();
    bool engine_tp = argc > 1 && strcmp(argv[1], "engine-tp") == 0;
    int ran = 0;
    for (size_t k = 0; k < sizeof(CASES) / sizeof(CASES[0]); k++) {
        const case_t *c = &CASES[k];
        if (c->world != w->size || engine_tp != (c->tp > 1 && c->mode == MT_P3D_ENGINE)) {
            continue;
        }
        run_case(c, w->rank);
        ran++;
    }
    CHECK(ran > 0, "no case for a world of %d ranks", w->size);
    return mt_test_finish_mpi("test_3d");
}
