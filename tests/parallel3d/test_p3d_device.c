/* The pipeline, tensor parallelism and their 3-D composition run over the device table they are given
 * (mt_par3d_params_t.device, runtime/device.h), not over the host allocator and the flat kernels directly.
 * On 4 ranks, each layout trains the tiny GPT-2 for 3 steps on the default (CPU) table and on a recording
 * table (tests/rec_device.h: the CPU table's entries, each counted, every live block tracked). Asserted:
 * - the two runs are bit-identical: every step's loss and gradient norm, and every final parameter as
 *   mt_par3d_gather_param assembles it on rank 0;
 * - the parameter, gradient and optimizer bytes this rank holds after set-up (the allocator's MT_MEM_PARAMS,
 *   MT_MEM_GRADS, MT_MEM_OPTIMIZER) were allocated through the table, and so were the pipeline's message
 *   buffers and the built-in all-reduce's buffer (MT_MEM_COMM);
 * - gradient zeroing, the norm's sums of squares and the optimizer update went through the table on every
 *   step, and with pp > 1 the messages' tags were written and read through it;
 * - every block allocated through the table went back to it when the composition was freed;
 * - a device whose memory the host cannot read is refused (mt_par3d_init, mt_pipeline_init, mt_tp_set_device)
 *   with MT_ERR_INVALID_ARG naming it, before anything is allocated on it.
 * Layouts: tp 2 x pp 2 with sequence parallelism, AdamW and clipping (built-in optimizer, tp gradient sync);
 * pp 2 x dp 2 GPipe with the built-in all-reduce; tp 2 x dp 2 ZeRO-3 with sequence parallelism; pp 2 x dp 2
 * ZeRO-2 with clipping.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "eqref.h"
#include "parallel/parallel3d.h"
#include "rec_device.h"
#include "runtime/alloc.h"
#include "runtime/rt.h"
#include "testutil.h"

#define STEPS 3

typedef struct {
    const char *name;
    int tp, pp, dp, m;
    mt_pp_schedule_t sched;
    bool sp, adamw;
    mt_p3d_dp_mode_t mode;
    mt_engine_kind_t kind;
    int zero_stage;
    float clip;
} case_t;

static const case_t CASES[] = {
    {"tp2 pp2 sp adamw clipped", 2, 2, 1, 2, MT_PP_1F1B, true, true, MT_P3D_ALLREDUCE, MT_ENGINE_DDP, 1, 0.05f},
    {"pp2 dp2 allreduce gpipe", 1, 2, 2, 2, MT_PP_GPIPE, false, false, MT_P3D_ALLREDUCE, MT_ENGINE_DDP, 1, 0.0f},
    {"tp2 dp2 zero-3 sp clipped", 2, 1, 2, 2, MT_PP_1F1B, true, false, MT_P3D_ENGINE, MT_ENGINE_ZERO, 3, 0.05f},
    {"pp2 dp2 zero-2 clipped", 1, 2, 2, 2, MT_PP_1F1B, false, true, MT_P3D_ENGINE, MT_ENGINE_ZERO, 2, 0.05f},
};

typedef struct {
    float loss[STEPS];
    double norm[STEPS];
    float **params; /* rank 0: every parameter, whole */
    int n_params;
    int64_t held[MT_MEM_NCAT]; /* the allocator's bytes by category that set-up added on this rank */
    int64_t table_comm;        /* MT_MEM_COMM bytes live on the table after set-up */
    int64_t msg_bytes;         /* one neighbour message buffer, as the allocator accounts it */
} run_t;

static void run_free(run_t *r) {
    for (int i = 0; r->params && i < r->n_params; i++) {
        free(r->params[i]);
    }
    free(r->params);
}

static void set_params(const case_t *c, const eq_setup_t *s, mt_par3d_params_t *p) {
    p->tp = c->tp;
    p->pp = c->pp;
    p->dp = c->dp;
    p->schedule = c->sched;
    p->microbatches = c->m;
    p->micro_batch = s->global_batch / (c->dp * c->m);
    p->seq_len = s->seq_len;
    p->sequence_parallel = c->sp;
    p->dp_mode = c->mode;
    p->engine_kind = c->kind;
    p->zero_stage = c->zero_stage;
    p->optim = s->optim;
    p->grad_clip = c->clip;
    p->bucket_mb = 0.01; /* several buckets */
    p->timeout_s = 60.0;
}

/* Trains STEPS steps of case c on dev (NULL: the default), fills r; *p3_out gets the composition (freed by
 * the caller, so it can look at the table before and after). */
static void train(const case_t *c, mt_device_table_t dev, int rank, run_t *r, mt_par3d_t *p3_out) {
    eq_setup_t s;
    eq_setup_default(&s, c->adamw);
    s.grad_clip = c->clip;
    mt_par3d_params_t p = MT_PAR3D_PARAMS_INIT;
    set_params(c, &s, &p);
    p.device = dev;
    memset(r, 0, sizeof(*r));
    mt_mem_stats_t m0, m1;
    mt_mem_stats(MT_MEM_HOST, &m0);
    mt_par3d_t p3 = NULL;
    mt_status_t st = mt_par3d_init(MPI_COMM_WORLD, &s.model, &p, &p3);
    mt_mem_stats(MT_MEM_HOST, &m1);
    *p3_out = p3;
    CHECK(st == MT_OK, "%s: mt_par3d_init: %s", c->name, mt_last_error_msg());
    if (!p3) {
        return;
    }
    for (int k = 0; k < MT_MEM_NCAT; k++) {
        r->held[k] = m1.current[k] - m0.current[k];
    }
    r->table_comm = rec.live[MT_MEM_COMM];
    r->msg_bytes = (int64_t)mt_alloc_accounted((mt_model_act_floats(mt_par3d_model(p3), p.micro_batch, p.seq_len) + 1) *
                                               sizeof(float));
    int row0 = 0, rows = 0;
    mt_par3d_rows(p3, &row0, &rows);
    int32_t *tok = malloc((size_t)rows * s.seq_len * sizeof(int32_t));
    int32_t *tgt = malloc((size_t)rows * s.seq_len * sizeof(int32_t));
    for (int step = 0; step < STEPS; step++) {
        eq_batch(&s, step, row0, rows, tok, tgt);
        CHECK_OK(mt_par3d_step(p3, tok, tgt, s.lr, &r->loss[step]));
        r->norm[step] = mt_par3d_last_grad_norm(p3);
    }
    free(tok);
    free(tgt);
    mt_model_t m = mt_par3d_model(p3);
    r->n_params = mt_model_n_params(m);
    r->params = calloc((size_t)r->n_params, sizeof(float *));
    for (int i = 0; i < r->n_params; i++) {
        const mt_param_t *q = mt_model_param(m, i);
        size_t n = (size_t)(q->global_shape[0] * q->global_shape[1]);
        r->params[i] = rank == 0 ? malloc(n * sizeof(float)) : NULL;
        CHECK_OK(mt_par3d_gather_param(p3, i, r->params[i]));
    }
}

static void run_case(const case_t *c, int rank) {
    run_t ref, got;
    mt_par3d_t p3 = NULL;
    train(c, NULL, rank, &ref, &p3);
    mt_par3d_free(p3);
    rec_reset();
    train(c, &rec_table, rank, &got, &p3);
    if (!p3) {
        run_free(&ref);
        return;
    }
    for (int s = 0; s < STEPS; s++) {
        CHECK(memcmp(&ref.loss[s], &got.loss[s], sizeof(float)) == 0 &&
                  memcmp(&ref.norm[s], &got.norm[s], sizeof(double)) == 0,
              "%s step %d: loss %.9g / norm %.17g on the recording table, %.9g / %.17g on the CPU table", c->name,
              s + 1, got.loss[s], got.norm[s], ref.loss[s], ref.norm[s]);
    }
    mt_model_t m = mt_par3d_model(p3);
    for (int i = 0; rank == 0 && i < got.n_params; i++) {
        const mt_param_t *q = mt_model_param(m, i);
        size_t n = (size_t)(q->global_shape[0] * q->global_shape[1]);
        CHECK(memcmp(ref.params[i], got.params[i], n * sizeof(float)) == 0,
              "%s: final %s differs between the recording table and the CPU table", c->name, q->name);
    }
    /* What set-up holds came from the table: the stage's (or the engine's) storage and the optimizer state
     * (AdamW's moments; plain SGD has none) exactly, the buffers the composition keeps for communication (two
     * neighbour messages per stage with pp > 1, the built-in all-reduce's copy of the stage's gradients with
     * dp > 1) at least (the communicators' own buffers are the collectives', not the table's). */
    int kinds[3] = {MT_MEM_PARAMS, MT_MEM_GRADS, MT_MEM_OPTIMIZER};
    for (int k = 0; k < 3; k++) {
        int cat = kinds[k];
        bool some = cat != MT_MEM_OPTIMIZER || c->adamw;
        CHECK((got.held[cat] > 0) == some && got.held[cat] == rec.peak[cat],
              "%s rank %d: set-up added %lld bytes of %s, the table allocated %lld", c->name, rank,
              (long long)got.held[cat], mt_mem_cat_name((mt_mem_cat_t)cat), (long long)rec.peak[cat]);
    }
    int64_t keeps =
        (c->pp > 1 ? 2 * got.msg_bytes : 0) + (c->mode == MT_P3D_ALLREDUCE && c->dp > 1 ? got.held[MT_MEM_GRADS] : 0);
    CHECK(got.table_comm >= keeps,
          "%s rank %d: the table holds %lld communication bytes after set-up, expected at least %lld",
          c->name, rank, (long long)got.table_comm, (long long)keeps);
    /* The step's device work went through the table. */
    CHECK(rec.zeros >= STEPS, "%s rank %d: %lld zeroings through the table in %d steps", c->name, rank,
          (long long)rec.zeros, STEPS);
    CHECK(rec.sumsqs >= STEPS, "%s rank %d: %lld sums of squares through the table in %d steps", c->name, rank,
          (long long)rec.sumsqs, STEPS);
    CHECK(rec.steps > 0 && rec.steps % STEPS == 0, "%s rank %d: %lld optimizer updates through the table in %d steps",
          c->name, rank, (long long)rec.steps, STEPS);
    /* pp > 1: each stage sends m messages a step and receives m (activations or their gradients); every tag
     * is written or read through the table, and each read waits for it. */
    CHECK(c->pp == 1 || (rec.copies >= 2 * c->m * STEPS && rec.waits >= c->m * STEPS),
          "%s rank %d: %lld copies and %lld waits through the table for %d micro-batches x %d steps", c->name, rank,
          (long long)rec.copies, (long long)rec.waits, c->m, STEPS);
    mt_par3d_free(p3);
    CHECK(rec.n_live == 0 && rec.unknown_frees == 0,
          "%s rank %d: %d blocks (%lld parameter, %lld gradient, %lld optimizer, %lld comm bytes) still live after "
          "mt_par3d_free, %lld frees of blocks the table never allocated",
          c->name, rank, rec.n_live, (long long)rec.live[MT_MEM_PARAMS], (long long)rec.live[MT_MEM_GRADS],
          (long long)rec.live[MT_MEM_OPTIMIZER], (long long)rec.live[MT_MEM_COMM], (long long)rec.unknown_frees);
    if (rank == 0) {
        printf("%s: bit-identical on the recording table; %lld allocations (%lld B params, %lld B grads, %lld B "
               "optimizer, %lld B comm peak), %lld zeroings, %lld sums of squares, %lld updates, %lld copies, all "
               "freed\n",
               c->name, (long long)rec.allocs, (long long)rec.peak[MT_MEM_PARAMS], (long long)rec.peak[MT_MEM_GRADS],
               (long long)rec.peak[MT_MEM_OPTIMIZER], (long long)rec.peak[MT_MEM_COMM], (long long)rec.zeros,
               (long long)rec.sumsqs, (long long)rec.steps, (long long)rec.copies);
    }
    run_free(&ref);
    run_free(&got);
}

/* A device whose memory the host cannot read: refused before anything is allocated on it. */
static void not_host(void) {
    struct mt_device far = rec_table;
    far.name = "far-device";
    far.host = false;
    eq_setup_t s;
    eq_setup_default(&s, false);
    mt_par3d_params_t p = MT_PAR3D_PARAMS_INIT;
    set_params(&CASES[0], &s, &p);
    p.device = &far;
    rec_reset();
    mt_par3d_t p3 = NULL;
    mt_status_t st = mt_par3d_init(MPI_COMM_WORLD, &s.model, &p, &p3);
    CHECK(st == MT_ERR_INVALID_ARG && p3 == NULL && strstr(mt_last_error_msg(), "far-device"),
          "parallel3d on a non-host device: %s (%s)", mt_status_str(st), mt_last_error_msg());

    mt_model_t model = NULL;
    CHECK_OK(mt_model_init(&s.model, &model));
    mt_pipeline_params_t pp = MT_PIPELINE_PARAMS_INIT;
    pp.seq_len = s.seq_len;
    pp.device = &far;
    mt_pipeline_t pl = NULL;
    st = mt_pipeline_init(model, NULL, NULL, &pp, &pl);
    CHECK(st == MT_ERR_INVALID_ARG && pl == NULL && strstr(mt_last_error_msg(), "far-device"),
          "a pipeline on a non-host device: %s (%s)", mt_status_str(st), mt_last_error_msg());
    mt_model_free(model);

    mt_tp_t tp = NULL;
    CHECK_OK(mt_tp_init(NULL, &tp));
    st = mt_tp_set_device(tp, &far, NULL);
    CHECK(st == MT_ERR_INVALID_ARG && strstr(mt_last_error_msg(), "far-device"), "tp on a non-host device: %s (%s)",
          mt_status_str(st), mt_last_error_msg());
    mt_tp_free(tp);
    CHECK(rec.allocs == 0, "a refused device still got %lld allocations", (long long)rec.allocs);
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    const mt_world_t *w = mt_rt_world();
    rec_install();
    CHECK(w->size == 4, "run on 4 ranks (this is %d)", w->size);
    if (w->size == 4) {
        for (size_t k = 0; k < sizeof(CASES) / sizeof(CASES[0]); k++) {
            run_case(&CASES[k], w->rank);
        }
        not_host();
    }
    return mt_test_finish_mpi("test_p3d_device");
}
