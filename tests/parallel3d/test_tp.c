/* Tensor-parallel equivalence: the tiny GPT-2 sharded over tp = world ranks (Megatron layers, vocabulary-
 * parallel embedding and cross-entropy), with and without sequence parallelism, starts from exactly the
 * serial weights, and over 5 steps matches the single-process run in every step's loss and in the final
 * parameters gathered from the shards (SGD 1e-5, AdamW 1e-4 relative; see eq_param_close). Each module's
 * collectives are counted against the design: a block does exactly 2 all-reduces forward and 2 backward
 * (sequence parallelism: 2 all-gathers + 2 reduce-scatters each way, the same bytes, a lower activation
 * peak), and replicated parameters stay bit-identical on every tp rank. The AdamW runs use attention
 * recompute (model.attn_recompute).
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "eqref.h"
#include "parallel/tp.h"
#include "runtime/alloc.h"
#include "runtime/rt.h"
#include "testutil.h"

#define MAXMOD 16

typedef struct {
    mt_tp_t tp;
    mt_tp_counts_t at;
    mt_tp_counts_t fwd[MAXMOD], bwd[MAXMOD];
} hook_state_t;

static mt_tp_counts_t diff(const mt_tp_counts_t *a, const mt_tp_counts_t *b) {
    mt_tp_counts_t d = {a->all_reduce - b->all_reduce,
                        a->all_reduce_max - b->all_reduce_max,
                        a->all_gather - b->all_gather,
                        a->reduce_scatter - b->reduce_scatter,
                        a->grad_sync - b->grad_sync,
                        a->bytes - b->bytes,
                        0.0};
    return d;
}
static mt_status_t pre(void *arg, int module) {
    hook_state_t *h = arg;
    (void)module;
    mt_tp_counts(h->tp, &h->at);
    return MT_OK;
}
static mt_status_t post_fwd(void *arg, int module) {
    hook_state_t *h = arg;
    mt_tp_counts_t now;
    mt_tp_counts(h->tp, &now);
    h->fwd[module] = diff(&now, &h->at);
    return MT_OK;
}
static mt_status_t post_bwd(void *arg, int module) {
    hook_state_t *h = arg;
    mt_tp_counts_t now;
    mt_tp_counts(h->tp, &now);
    h->bwd[module] = diff(&now, &h->at);
    return MT_OK;
}

static void expect(const mt_tp_counts_t *c, int ar, int mx, int ag, int rs, const char *what, int module, bool sp) {
    CHECK(
        c->all_reduce == ar && c->all_reduce_max == mx && c->all_gather == ag && c->reduce_scatter == rs,
        "sp=%d %s of module %d: %lld all-reduce, %lld max, %lld all-gather, %lld reduce-scatter; expected %d %d %d %d",
        sp, what, module, (long long)c->all_reduce, (long long)c->all_reduce_max, (long long)c->all_gather,
        (long long)c->reduce_scatter, ar, mx, ag, rs);
}

static void run_case(mt_comm_t comm, mt_tp_t tp, const eq_setup_t *s, bool sp, const double *ref_loss, mt_model_t ref,
                     mt_model_t init_ref, double tol) {
    int rank = mt_comm_rank(comm), size = mt_comm_size(comm);
    int B = s->global_batch, T = s->seq_len, N = B * T;
    mt_model_config_t mc = s->model;
    mt_tp_model_config(tp, sp, &mc);
    /* the AdamW runs keep only the softmax statistics (attention recompute) on the local heads */
    mc.attn_recompute = s->optim.kind == MT_OPTIM_ADAMW;
    mt_model_t m = NULL;
    mt_acts_t a = NULL;
    mt_optim_t opt = NULL;
    CHECK_OK(mt_model_init(&mc, &m));
    if (!m) {
        return;
    }
    CHECK_OK(mt_model_alloc_params(m));
    CHECK_OK(mt_model_alloc_grads(m));
    mt_model_init_weights(m);
    CHECK(mt_model_act_floats(m, B, T) == (size_t)(sp ? N / size : N) * s->model.n_embd, "act floats %zu",
          mt_model_act_floats(m, B, T));
    /* The sharded model starts from exactly the serial weights. */
    for (int i = 0; i < mt_model_n_params(m); i++) {
        const mt_param_t *p = mt_model_param(m, i), *r = mt_model_param(init_ref, i);
        CHECK(p->global_shape[0] * p->global_shape[1] == (int64_t)r->numel, "%s: global shape differs", p->name);
        float *g = malloc(r->numel * sizeof(float));
        CHECK_OK(mt_tp_gather_param(tp, m, i, g));
        CHECK(memcmp(g, r->data, r->numel * sizeof(float)) == 0, "sp=%d initial %s differs from the serial model's", sp,
              p->name);
        free(g);
    }
    mt_mem_stats_t ms;
    mt_mem_stats(MT_MEM_HOST, &ms);
    int64_t act_base = ms.current[MT_MEM_ACTIVATIONS];
    mt_mem_reset_peak(MT_MEM_HOST);
    CHECK_OK(mt_acts_init(m, B, T, &a));
    CHECK_OK(mt_optim_init(&s->optim, &opt));
    CHECK_OK(eq_optim_add_bound(opt, m, NULL));
    int32_t *tok = malloc((size_t)N * sizeof(int32_t)), *tgt = malloc((size_t)N * sizeof(int32_t));
    hook_state_t hs;
    memset(&hs, 0, sizeof(hs));
    hs.tp = tp;
    for (int step = 0; step < s->steps; step++) {
        eq_batch(s, step, 0, B, tok, tgt); /* the same batch on every tp rank */
        mt_model_zero_grads(m);
        mt_model_hooks_t hk = {pre, post_fwd, pre, post_bwd, &hs};
        mt_model_set_hooks(m, step == 0 ? &hk : NULL);
        float loss = -1.0f;
        CHECK_OK(mt_model_step(m, a, tok, tgt, true, &loss));
        mt_model_set_hooks(m, NULL);
        mt_tp_counts_t c0, c1;
        mt_tp_counts(tp, &c0);
        CHECK_OK(mt_tp_finish_grads(tp, m, sp));
        mt_tp_counts(tp, &c1);
        CHECK(c1.grad_sync - c0.grad_sync == (sp ? 1 : 0), "sp=%d: %lld gradient syncs", sp,
              (long long)(c1.grad_sync - c0.grad_sync));
        CHECK_OK(mt_optim_step(opt, s->lr, 1.0f));
        float lmin = loss, lmax = loss;
        CHECK_OK(mt_coll_all_reduce(comm, &lmin, &lmin, 1, MT_COLL_F32, MT_REDOP_MIN, NULL, NULL));
        CHECK_OK(mt_coll_all_reduce(comm, &lmax, &lmax, 1, MT_COLL_F32, MT_REDOP_MAX, NULL, NULL));
        CHECK(lmin == lmax, "tp ranks disagree on the loss: %.9g .. %.9g", lmin, lmax);
        if (rank == 0) {
            CHECK_CLOSE(loss, ref_loss[step], tol, 0.0);
            if (step == 0 || step == s->steps - 1) {
                printf("tp=%d sp=%d %s step %d: loss %.7f (serial %.7f)\n", size, sp,
                       s->optim.kind == MT_OPTIM_ADAMW ? "adamw" : "sgd", step, loss, ref_loss[step]);
            }
        }
    }
    /* Sequence parallelism holds less activation memory (the residual stream is split over tp). */
    mt_mem_stats(MT_MEM_HOST, &ms);
    static int64_t act_peak[2];
    act_peak[sp] = ms.peak[MT_MEM_ACTIVATIONS] - act_base;
    if (sp) {
        CHECK(act_peak[1] < act_peak[0], "tp=%d: activation peak with sequence parallelism %lld >= without %lld", size,
              (long long)act_peak[1], (long long)act_peak[0]);
        if (rank == 0 && s->optim.kind == MT_OPTIM_SGD) {
            printf("tp=%d activation peak: %lld B without sequence parallelism, %lld B with\n", size,
                   (long long)act_peak[0], (long long)act_peak[1]);
        }
    }
    /* Collectives per module of step 0, against the design. */
    int L = s->model.n_layer;
    for (int mod = 1; mod <= L; mod++) {
        expect(&hs.fwd[mod], sp ? 0 : 2, 0, sp ? 2 : 0, sp ? 2 : 0, "forward", mod, sp);
        expect(&hs.bwd[mod], sp ? 0 : 2, 0, sp ? 2 : 0, sp ? 2 : 0, "backward", mod, sp);
    }
    /* Sequence parallelism moves the same bytes: a block's all-gather + reduce-scatter pairs replace its
     * all-reduces (bus convention, parallel/tp.c). */
    static int64_t block_bytes[2][2];
    block_bytes[sp][0] = hs.fwd[1].bytes;
    block_bytes[sp][1] = hs.bwd[1].bytes;
    CHECK(hs.fwd[1].bytes > 0 && hs.fwd[1].bytes == hs.bwd[1].bytes, "block bytes fwd %lld bwd %lld",
          (long long)hs.fwd[1].bytes, (long long)hs.bwd[1].bytes);
    if (sp) {
        CHECK(block_bytes[1][0] == block_bytes[0][0], "block forward bytes: sp %lld, without %lld",
              (long long)block_bytes[1][0], (long long)block_bytes[0][0]);
    }
    expect(&hs.fwd[0], sp ? 0 : 1, 0, 0, sp ? 1 : 0, "forward", 0, sp);
    expect(&hs.bwd[0], 0, 0, sp ? 1 : 0, 0, "backward", 0, sp);
    expect(&hs.fwd[L + 1], 1, 1, sp ? 1 : 0, 0, "forward", L + 1, sp);
    expect(&hs.bwd[L + 1], sp ? 0 : 1, 0, 0, sp ? 1 : 0, "backward", L + 1, sp);

    /* Final parameters against the serial run; replicated ones identical on every rank. */
    for (int i = 0; i < mt_model_n_params(m); i++) {
        const mt_param_t *p = mt_model_param(m, i), *r = mt_model_param(ref ? ref : init_ref, i);
        float *g = malloc(r->numel * sizeof(float));
        CHECK_OK(mt_tp_gather_param(tp, m, i, g));
        if (rank == 0) {
            double e = 0.0;
            bool ok = eq_param_close(p->name, g, r->data, r->numel, s->model.n_embd, tol, eq_key_bound(s), &e);
            CHECK(ok, "tp=%d sp=%d: parameter %s differs by %.3g (tol %.0e)", size, sp, p->name, e, tol);
        }
        if (p->tp_dim < 0) {
            float *mn = malloc(p->numel * sizeof(float)), *mx = malloc(p->numel * sizeof(float));
            CHECK_OK(mt_coll_all_reduce(comm, p->data, mn, p->numel, MT_COLL_F32, MT_REDOP_MIN, NULL, NULL));
            CHECK_OK(mt_coll_all_reduce(comm, p->data, mx, p->numel, MT_COLL_F32, MT_REDOP_MAX, NULL, NULL));
            CHECK(memcmp(mn, mx, p->numel * sizeof(float)) == 0, "sp=%d: replicated %s differs between tp ranks", sp,
                  p->name);
            free(mn);
            free(mx);
        }
        free(g);
    }
    free(tok);
    free(tgt);
    mt_optim_free(opt);
    mt_acts_free(a);
    mt_model_free(m);
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    const mt_world_t *w = mt_rt_world();
    mt_comm_params_t cp = MT_COMM_PARAMS_INIT;
    cp.name = "tp";
    cp.timeout_s = 60.0;
    mt_comm_t comm = NULL;
    CHECK_OK(mt_comm_init(w->comm, &cp, &comm));
    mt_tp_t tp = NULL;
    CHECK_OK(mt_tp_init(comm, &tp));
    for (int adamw = 0; adamw < 2; adamw++) {
        eq_setup_t s;
        eq_setup_default(&s, adamw);
        double tol = adamw ? 1e-4 : 1e-5;
        double ref_loss[16] = {0};
        mt_model_t ref = NULL, init_ref = NULL;
        if (w->rank == 0) {
            CHECK_OK(eq_serial_run(&s, ref_loss, &ref));
        }
        /* Every rank builds the serial initial model to compare the sharded start against. */
        CHECK_OK(mt_model_init(&s.model, &init_ref));
        CHECK_OK(mt_model_alloc_params(init_ref));
        mt_model_init_weights(init_ref);
        for (int sp = 0; sp < 2; sp++) {
            run_case(comm, tp, &s, sp, ref_loss, ref, init_ref, tol);
        }
        mt_model_free(ref);
        mt_model_free(init_ref);
    }
    mt_tp_free(tp);
    CHECK_OK(mt_comm_free(comm));
    return mt_test_finish_mpi("test_tp");
}
