/* State in the layout-free form moves between engines: train engine A for 2 steps, gather its
 * parameters and AdamW moments to rank 0, scatter them into a fresh engine B of another kind (and
 * layout), check the round trip is bit-exact, then continue A and B side by side for 3 more steps on
 * the same data: every loss matches (1e-4 relative, AdamW) and so do the final parameters (relative
 * L2 1e-4) -- a checkpoint taken under one engine resumes under another.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <string.h>

#include "driver.h"
#include "models/data/data.h"
#include "runtime/rt.h"
#include "testutil.h"

typedef struct {
    mt_model_t model;
    mt_engine_t e;
    mt_acts_t acts;
} side_t;

static mt_status_t side_init(const drv_cfg_t *c, mt_comm_t dp, mt_engine_kind_t kind, int stage, side_t *s) {
    memset(s, 0, sizeof(*s));
    mt_engine_params_t ep = MT_ENGINE_PARAMS_INIT;
    ep.kind = kind;
    ep.zero_stage = stage ? stage : 1;
    ep.grad_accum = c->grad_accum;
    ep.optim = c->optim;
    ep.bucket_mb = 0.01;
    ep.first_bucket_mb = 0.002;
    MT_CHECK(mt_model_init(&c->model, &s->model));
    MT_CHECK(mt_engine_init(s->model, dp, &ep, &s->e));
    return mt_acts_init(s->model, c->global_batch / mt_comm_size(dp) / c->grad_accum, c->seq_len, &s->acts);
}

static void side_free(side_t *s) {
    mt_acts_free(s->acts);
    mt_engine_free(s->e);
    mt_model_free(s->model);
}

/* One step of s on step's batch (each rank its rows; DP: the root loads and scatters). */
static mt_status_t side_step(const drv_cfg_t *c, mt_comm_t dp, mt_data_t d, side_t *s, int step, double *loss) {
    int N = mt_comm_size(dp), rank = mt_comm_rank(dp), T = c->seq_len, ga = c->grad_accum;
    int rows = c->global_batch / N, mb = rows / ga, n = mt_model_n_modules(s->model);
    int32_t win[64 * 17], tok[64 * 16], tgt[64 * 16], gtok[64 * 16], gtgt[64 * 16];
    MT_CHECK(mt_engine_zero_grads(s->e));
    double sum = 0.0;
    for (int k = 0; k < ga; k++) {
        bool scatter = mt_engine_root_loads_batch(s->e);
        for (int q = 0; q < N; q++) {
            if (scatter ? rank != 0 : q != rank) {
                continue;
            }
            MT_CHECK(mt_data_global_rows(d, step, q * rows + k * mb, mb, win));
            int32_t *dt = scatter ? gtok + q * mb * T : tok, *dg = scatter ? gtgt + q * mb * T : tgt;
            for (int i = 0; i < mb; i++) {
                memcpy(dt + i * T, win + i * (T + 1), (size_t)T * 4);
                memcpy(dg + i * T, win + i * (T + 1) + 1, (size_t)T * 4);
            }
        }
        if (scatter) {
            MT_CHECK(mt_engine_scatter_batch(s->e, gtok, tok, (size_t)mb * T));
            MT_CHECK(mt_engine_scatter_batch(s->e, gtgt, tgt, (size_t)mb * T));
        }
        float l = 0.0f;
        MT_CHECK(mt_model_forward(s->model, s->acts, 0, n, tok, tgt, NULL, NULL, &l));
        MT_CHECK(mt_model_backward(s->model, s->acts, 0, n, NULL, NULL, 1.0f / (float)ga));
        sum += l;
    }
    *loss = sum / ga;
    double sumsq = 0.0;
    MT_CHECK(mt_engine_finish_grads(s->e));
    MT_CHECK(mt_engine_grad_sumsq(s->e, &sumsq));
    MT_CHECK(mt_engine_reduce_loss(s->e, loss));
    return mt_engine_step(s->e, c->lr, mt_clip_coef(sumsq, c->clip, NULL));
}

static void pair(mt_comm_t dp, mt_data_t d, const drv_cfg_t *c, mt_engine_kind_t ka, int sa, mt_engine_kind_t kb,
                 int sb, const char *what) {
    int rank = mt_comm_rank(dp);
    size_t numel = 0;
    side_t a, b;
    CHECK_OK(side_init(c, dp, ka, sa, &a));
    CHECK_OK(side_init(c, dp, kb, sb, &b));
    numel = mt_model_numel(a.model);
    float *st[3], *back = mt_alloc(numel * 4, MT_MEM_OTHER, "test");
    for (int f = 0; f < 3; f++) {
        st[f] = mt_alloc(numel * 4, MT_MEM_OTHER, "test");
    }
    double la = 0.0, lb = 0.0;
    for (int s = 0; s < 2; s++) {
        CHECK_OK(side_step(c, dp, d, &a, s, &la));
    }
    for (int f = 0; f < 3; f++) {
        CHECK_OK(mt_engine_gather_state(a.e, (mt_engine_state_t)f, 0, st[f]));
        CHECK_OK(mt_engine_scatter_state(b.e, (mt_engine_state_t)f, 0, st[f]));
        CHECK_OK(mt_engine_gather_state(b.e, (mt_engine_state_t)f, 0, back));
        CHECK(rank != 0 || memcmp(back, st[f], numel * 4) == 0, "%s: state %d does not round-trip exactly", what, f);
    }
    int64_t t = mt_engine_optim(a.e) ? mt_optim_get_step(mt_engine_optim(a.e)) : 0;
    MPI_Bcast(&t, 1, MPI_INT64_T, 0, mt_comm_mpi(dp));
    CHECK(t == 2, "%s: optimizer step %lld after 2 steps", what, (long long)t);
    if (mt_engine_optim(b.e)) {
        mt_optim_set_step(mt_engine_optim(b.e), t);
    }
    for (int s = 2; s < 5; s++) {
        CHECK_OK(side_step(c, dp, d, &a, s, &la));
        CHECK_OK(side_step(c, dp, d, &b, s, &lb));
        CHECK(fabs(la - lb) <= 1e-4 * fabs(la), "%s step %d: resumed loss %.9g vs uninterrupted %.9g", what, s + 1, lb,
              la);
    }
    CHECK_OK(mt_engine_gather_params(a.e, 0, st[0]));
    CHECK_OK(mt_engine_gather_params(b.e, 0, back));
    if (rank == 0) {
        double dd = 0.0, ss = 0.0;
        for (size_t i = 0; i < numel; i++) {
            dd += ((double)back[i] - st[0][i]) * ((double)back[i] - st[0][i]);
            ss += (double)st[0][i] * st[0][i];
        }
        CHECK(sqrt(dd / ss) <= 1e-4, "%s: final parameters differ by %.3g (relative L2)", what, sqrt(dd / ss));
        printf("%s: resumed across engines, final loss %.6f vs %.6f, parameters rel diff %.2g\n", what, lb, la,
               sqrt(dd / ss));
    }
    for (int f = 0; f < 3; f++) {
        mt_free(st[f]);
    }
    mt_free(back);
    side_free(&a);
    side_free(&b);
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    mt_comm_t dp = NULL;
    CHECK_OK(mt_comm_init(mt_rt_world()->comm, NULL, &dp));
    drv_cfg_t c;
    drv_cfg_gpt2_tiny(&c);
    c.optim.kind = MT_OPTIM_ADAMW;
    c.optim.weight_decay = 0.1f;
    c.clip = 0.25f;
    mt_data_params_t p = MT_DATA_PARAMS_INIT;
    p.seed = c.data_seed;
    p.global_batch = c.global_batch;
    p.seq_len = c.seq_len;
    p.vocab_size = c.model.vocab_size;
    p.prefetch = false;
    mt_data_t d = NULL;
    CHECK_OK(mt_data_open(&p, &d));
    if (d && dp) {
        pair(dp, d, &c, MT_ENGINE_ZERO, 3, MT_ENGINE_DDP, 0, "zero-3 -> ddp");
        pair(dp, d, &c, MT_ENGINE_DDP, 0, MT_ENGINE_ZERO, 2, "ddp -> zero-2");
        pair(dp, d, &c, MT_ENGINE_ZERO, 1, MT_ENGINE_ZERO, 3, "zero-1 -> zero-3");
        pair(dp, d, &c, MT_ENGINE_DP, 0, MT_ENGINE_ZERO, 1, "dp -> zero-1");
        /* SGD without momentum keeps no moments: asking for one is a named error. */
        drv_cfg_t s = c;
        s.optim.kind = MT_OPTIM_SGD;
        side_t x;
        CHECK_OK(side_init(&s, dp, MT_ENGINE_DDP, 0, &x));
        float one = 0.0f;
        mt_status_t st = mt_engine_gather_state(x.e, MT_ENGINE_STATE_OPT_V, 0, &one);
        CHECK(st == MT_ERR_INVALID_ARG && strstr(mt_last_error_msg(), "second moment"), "sgd v: %s (%s)",
              mt_status_str(st), mt_last_error_msg());
        side_free(&x);
    }
    mt_data_close(d);
    CHECK_OK(mt_comm_free(dp));
    return mt_test_finish_mpi("test_parallel_state");
}
