/* Refused combinations: every one gives MT_ERR_INVALID_ARG with a message naming the keys and why (checked
 * by substring), and a valid one passes. Also the sharded model's own refusals at build time (n_head or
 * padded vocabulary not divisible by tp, recompute, missing seam callbacks). One process: mt_par3d_check
 * is pure arithmetic, and a tp model is built without communicating.
 * SPDX-License-Identifier: MIT */
#include <string.h>

#include "eqref.h"
#include "parallel/parallel3d.h"
#include "testutil.h"

static mt_par3d_params_t base(int tp, int pp, int dp) {
    mt_par3d_params_t p = MT_PAR3D_PARAMS_INIT;
    p.tp = tp;
    p.pp = pp;
    p.dp = dp;
    p.microbatches = 2;
    p.micro_batch = 2;
    p.seq_len = 16;
    return p;
}

static void refused(const mt_par3d_params_t *p, int world, const mt_model_config_t *mc, const char *needle) {
    mt_status_t st = mt_par3d_check(p, world, mc);
    CHECK(st == MT_ERR_INVALID_ARG, "expected a refusal containing \"%s\", got %s", needle, mt_status_str(st));
    CHECK(strstr(mt_last_error_msg(), needle) != NULL, "message \"%s\" lacks \"%s\"", mt_last_error_msg(), needle);
}

static mt_status_t no_ar(void *ctx, float *buf, size_t n) {
    (void)ctx, (void)buf, (void)n;
    return MT_OK;
}
static mt_status_t no_ag(void *ctx, const float *s, float *r, size_t n) {
    (void)ctx, (void)s, (void)r, (void)n;
    return MT_OK;
}

static void model_refused(mt_model_config_t mc, const char *needle) {
    mt_model_t m = NULL;
    mt_status_t st = mt_model_init(&mc, &m);
    CHECK(st == MT_ERR_INVALID_ARG && m == NULL, "model init returned %s", mt_status_str(st));
    CHECK(strstr(mt_last_error_msg(), needle) != NULL, "message \"%s\" lacks \"%s\"", mt_last_error_msg(), needle);
    mt_model_free(m);
}

int main(void) {
    mt_model_config_t mc = eq_tiny_gpt2();
    mt_par3d_params_t p = base(2, 2, 2);
    CHECK_OK(mt_par3d_check(&p, 8, &mc));
    p.dp = 0; /* derived */
    CHECK_OK(mt_par3d_check(&p, 8, &mc));
    refused(&p, 6, &mc, "does not make the 6 ranks");
    p = base(2, 2, 3);
    refused(&p, 8, &mc, "2 x 2 x 3");

    mt_model_config_t bad = eq_tiny_gpt2();
    bad.n_head = 6;
    bad.n_embd = 48;
    p = base(4, 1, 1);
    refused(&p, 4, &bad, "model.n_head = 6 is not divisible by parallel.tp = 4");
    bad = eq_tiny_gpt2();
    bad.padded_vocab = 130;
    p = base(4, 1, 1);
    refused(&p, 4, &bad, "model.padded_vocab = 130 is not divisible by parallel.tp = 4");
    bad = eq_tiny_gpt2();
    bad.kind = MT_MODEL_MLP;
    p = base(2, 1, 1);
    refused(&p, 2, &bad, "GPT-2 only");
    bad = eq_tiny_gpt2();
    bad.recompute = MT_RECOMPUTE_BLOCK;
    refused(&p, 2, &bad, "model.recompute");
    p = base(4, 1, 1);
    p.sequence_parallel = true;
    p.micro_batch = 1;
    p.seq_len = 6;
    refused(&p, 4, &mc, "sequence_parallel splits");

    p = base(1, 2, 2);
    p.dp_mode = MT_P3D_ENGINE;
    p.engine_kind = MT_ENGINE_DP;
    refused(&p, 4, &mc, "DataParallel baseline");
    /* every other engine composes with pipelines, clipping included (test_3d runs them) */
    p.engine_kind = MT_ENGINE_ZERO;
    p.grad_clip = 1.0f;
    for (int stage = 1; stage <= 3; stage++) {
        p.zero_stage = stage;
        CHECK_OK(mt_par3d_check(&p, 4, &mc));
    }
    p.engine_kind = MT_ENGINE_DDP;
    CHECK_OK(mt_par3d_check(&p, 4, &mc));
    p = base(2, 1, 2);
    p.dp_mode = MT_P3D_ENGINE;
    p.engine_kind = MT_ENGINE_ZERO;
    p.zero_stage = 3;
    CHECK_OK(mt_par3d_check(&p, 4, &mc)); /* ZeRO-3 with tp: the engine's call */

    /* The sharded model refuses what it cannot shard, naming the keys. */
    mt_tp_ops_t ops = {NULL, no_ar, no_ag, NULL, no_ar};
    mt_model_config_t t = eq_tiny_gpt2();
    t.tp_size = 3;
    t.tp_rank = 0;
    t.tp_ops = &ops;
    t.n_head = 4;
    model_refused(t, "n_head");
    t = eq_tiny_gpt2();
    t.tp_size = 4;
    t.tp_ops = &ops;
    t.padded_vocab = 130;
    model_refused(t, "wte");
    t = eq_tiny_gpt2();
    t.tp_size = 2;
    t.tp_ops = &ops;
    t.recompute = MT_RECOMPUTE_BLOCK;
    model_refused(t, "model.recompute");
    t = eq_tiny_gpt2();
    t.tp_size = 2;
    t.tp_ops = &ops;
    t.sequence_parallel = true; /* no reduce_scatter_sum in the seam */
    model_refused(t, "reduce_scatter_sum");
    t.sequence_parallel = false;
    mt_model_t m = NULL;
    CHECK_OK(mt_model_init(&t, &m));
    if (m) {
        const mt_param_t *w = mt_model_param(m, mt_model_find_param(m, "wte"));
        CHECK(w->shape[0] == 64 && w->tp_dim == 0, "wte shard has %lld rows, tp_dim %d", (long long)w->shape[0],
              w->tp_dim);
        const mt_param_t *q = mt_model_param(m, mt_model_find_param(m, "h.0.attn.qkv.weight"));
        CHECK(q->shape[0] == 48 && q->shape[1] == 32 && q->tp_parts == 3, "qkv shard %lldx%lld", (long long)q->shape[0],
              (long long)q->shape[1]);
        CHECK(mt_model_act_floats(m, 2, 16) == 2 * 16 * 32, "act floats");
    }
    mt_model_free(m);
    return mt_test_finish("test_p3d_check");
}
