/* Mixed precision on the CPU: storage rounding, the dynamic loss scaler's state machine, master weights
 * keeping updates a bf16 weight would lose, loss scaling rescuing f16 gradients that would underflow, and
 * the MLP model trained in fp32 / bf16 / fp16 (emulated storage) with per-mode loss tolerances:
 *   bf16: |loss - loss_fp32| <= 4e-3 (1 + loss_fp32) at every step (8-bit mantissa weights and grads;
 *         measured 3.9e-4 on this model)
 *   fp16: |loss - loss_fp32| <= 5e-4 (1 + loss_fp32) at every step (11-bit mantissa; measured 5.6e-5)
 *   tf32: identical to fp32 on the CPU (tf32 only changes GPU matrix products)
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/model.h"
#include "models/optim/optim.h"
#include "runtime/alloc.h"
#include "runtime/precision.h"
#include "testutil.h"

static void test_parse_round(void) {
    mt_prec_t p;
    CHECK(mt_prec_parse("bf16", &p) && p == MT_PREC_BF16, "parse bf16");
    CHECK(mt_prec_parse("fp16", &p) && p == MT_PREC_FP16 && mt_prec_storage(p) == MT_F16, "parse fp16");
    CHECK(mt_prec_parse("tf32", &p) && mt_prec_storage(p) == MT_F32, "tf32 stores f32");
    CHECK(!mt_prec_parse("fp8", &p) && !mt_prec_parse(NULL, &p), "unknown names refused");
    float x[6] = {1.0f + 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, 70000.0f, 65504.0f, 0x1p-26f, NAN};
    float y[6];
    memcpy(y, x, sizeof(x));
    CHECK(mt_prec_round(y, 2, MT_BF16) == 0, "finite");
    CHECK(y[0] == 1.0f && y[1] == 1.0f + 0x1p-7f, "bf16 round to nearest even: %.9g %.9g", y[0], y[1]);
    memcpy(y, x, sizeof(x));
    CHECK(mt_prec_round(y + 2, 4, MT_F16) == 2, "f16: 70000 overflows to inf and NaN stays: 2 non-finite");
    CHECK(isinf(y[2]) && y[3] == 65504.0f && y[4] == 0.0f && isnan(y[5]), "f16 overflow, max, underflow, NaN");
    CHECK(mt_prec_count_nonfinite(x, 6) == 1, "count");
}

static void test_scaler(void) {
    mt_loss_scaler_t s;
    CHECK_OK(mt_loss_scaler_init(&s, MT_PREC_FP16, 65536.0f, 3));
    CHECK(mt_loss_scaler_scale(&s) == 65536.0f && mt_loss_scaler_inv_scale(&s) == 1.0f / 65536.0f, "initial");
    CHECK(!mt_loss_scaler_update(&s, 0) && !mt_loss_scaler_update(&s, 0), "clean steps do not skip");
    CHECK(s.scale == 65536.0f, "not grown before the window");
    CHECK(!mt_loss_scaler_update(&s, 0) && s.scale == 131072.0f, "doubled after scale_window = 3 clean steps");
    CHECK(!mt_loss_scaler_update(&s, 0) && !mt_loss_scaler_update(&s, 0), "two more clean");
    CHECK(mt_loss_scaler_update(&s, 1) && s.scale == 65536.0f, "overflow: skip and halve (%g)", s.scale);
    CHECK(!mt_loss_scaler_update(&s, 0) && !mt_loss_scaler_update(&s, 0) && s.scale == 65536.0f,
          "the clean count restarted at the overflow");
    CHECK(!mt_loss_scaler_update(&s, 0) && s.scale == 131072.0f, "and grows after a full window");
    for (int i = 0; i < 40; i++) {
        CHECK(mt_loss_scaler_update(&s, 1), "every overflow skips");
    }
    CHECK(s.scale == 1.0f && s.n_skipped == 41 && s.n_steps == 49, "floor at 1: %g, %lld skipped", s.scale,
          (long long)s.n_skipped);
    CHECK_OK(mt_loss_scaler_init(&s, MT_PREC_FP16, 16777216.0f, 1));
    CHECK(!mt_loss_scaler_update(&s, 0) && s.scale == 16777216.0f, "capped at 2^24");
    for (int m = MT_PREC_FP32; m <= MT_PREC_BF16; m++) {
        CHECK_OK(mt_loss_scaler_init(&s, (mt_prec_t)m, 65536.0f, 3));
        CHECK(s.scale == 1.0f && !mt_loss_scaler_update(&s, 1), "%s: fixed scale 1, never skips",
              mt_prec_name((mt_prec_t)m));
    }
    CHECK(mt_loss_scaler_init(&s, MT_PREC_FP16, 0.5f, 3) == MT_ERR_INVALID_ARG &&
              strstr(mt_last_error_msg(), "precision.init_scale"),
          "init_scale < 1 refused naming the key");
    CHECK(mt_loss_scaler_init(&s, MT_PREC_FP16, 1024.0f, 0) == MT_ERR_INVALID_ARG &&
              strstr(mt_last_error_msg(), "precision.scale_window"),
          "window 0 refused naming the key");
}

/* 100 SGD steps of -1e-3 on a weight of 1: the update is below half a bf16 ulp at 1 (2^-9), so a bf16
 * weight updated in place never moves, while the f32 master reaches 0.9 and the published bf16 copy
 * follows it. */
static void test_master_keeps_small_updates(void) {
    float w = 1.0f, g = 1.0f;
    mt_master_t m;
    CHECK_OK(mt_master_init(MT_PREC_BF16, &w, 1, &m));
    float direct = 1.0f;
    for (int i = 0; i < 100; i++) {
        mt_sgd_update(mt_master_weights(m), &g, NULL, 1, 1e-3f, 0.0f, 0.0f, i == 0, 1.0f);
        mt_master_publish(m);
        direct = mt_bf16_to_f32(mt_f32_to_bf16(direct - 1e-3f * g));
    }
    CHECK(direct == 1.0f, "without master weights bf16 loses every update (%.9g)", direct);
    CHECK_CLOSE(mt_master_weights(m)[0], 0.9, 1e-5, 0);
    CHECK(w == mt_bf16_to_f32(mt_f32_to_bf16(mt_master_weights(m)[0])) && fabsf(w - 0.9f) < 0x1p-8f,
          "the model sees the rounded master (%.9g)", w);
    mt_master_free(m);
    /* fp32 mode: no copy, the master is the buffer */
    float v[3] = {1, 2, 3};
    CHECK_OK(mt_master_init(MT_PREC_FP32, v, 3, &m));
    CHECK(mt_master_weights(m) == v, "fp32: master is the parameter buffer");
    mt_master_free(m);
}

/* A gradient of 1e-8 is below half the smallest f16 subnormal (2^-25): stored as f16 it is 0. Scaled by
 * 65536 it survives and unscales to within an f16 rounding (2^-11 relative). */
static void test_fp16_underflow(void) {
    float w = 0.0f;
    mt_master_t m;
    CHECK_OK(mt_master_init(MT_PREC_FP16, &w, 1, &m));
    float g = 1e-8f;
    CHECK(mt_master_prepare_grads(m, &g, 1) == 0 && g == 0.0f, "unscaled: underflows to 0");
    mt_loss_scaler_t s;
    CHECK_OK(mt_loss_scaler_init(&s, MT_PREC_FP16, 65536.0f, 1000));
    g = 1e-8f * mt_loss_scaler_scale(&s);
    CHECK(mt_master_prepare_grads(m, &g, 1) == 0 && !mt_loss_scaler_update(&s, 0), "scaled: finite, kept");
    CHECK_CLOSE(g * mt_loss_scaler_inv_scale(&s), 1e-8, 0x1p-11, 0);
    g = 1.0f * mt_loss_scaler_scale(&s); /* 65536 > 65504: overflows */
    CHECK(mt_master_prepare_grads(m, &g, 1) == 1 && mt_loss_scaler_update(&s, 1) && s.scale == 32768.0f,
          "overflow detected, step skipped, scale halved");
    mt_master_free(m);
}

/* ---- the MLP model trained per mode ---- */

enum { B = 4, T = 8, H = 32, V = 16, L = 2, STEPS = 30 };

typedef struct {
    float loss[STEPS];
    int64_t skipped;
    int first_update; /* the first step whose update was applied */
    float final_scale;
} run_t;

static run_t train(mt_prec_t mode, float init_scale) {
    run_t r;
    memset(&r, 0, sizeof(r));
    r.first_update = -1;
    mt_model_config_t c = MT_MODEL_CONFIG_INIT;
    c.kind = MT_MODEL_MLP;
    c.n_layer = L;
    c.n_embd = H;
    c.seq_len = T;
    c.vocab_size = V;
    c.seed = 11;
    mt_model_t model;
    CHECK_OK(mt_model_init(&c, &model));
    CHECK_OK(mt_model_alloc_params(model));
    CHECK_OK(mt_model_alloc_grads(model));
    mt_model_init_weights(model);
    size_t n = mt_model_numel(model);
    float *params = mt_model_params_flat(model), *grads = mt_model_grads_flat(model);
    int32_t tok[B * T], tgt[B * T];
    unsigned seed = 3;
    for (int i = 0; i < B * T; i++) {
        seed = seed * 1103515245u + 12345u;
        tok[i] = (int32_t)((seed >> 16) % V);
        tgt[i] = (tok[i] * 5 + 3) % V; /* a learnable bigram */
    }
    mt_master_t m;
    CHECK_OK(mt_master_init(mode, params, n, &m));
    mt_loss_scaler_t ls;
    CHECK_OK(mt_loss_scaler_init(&ls, mode, init_scale, 10));
    mt_optim_params_t op = MT_OPTIM_PARAMS_INIT;
    mt_optim_t opt;
    CHECK_OK(mt_optim_init(&op, &opt));
    CHECK_OK(mt_optim_add(opt, "all", mt_master_weights(m), grads, n, true, NULL));
    mt_acts_t a;
    CHECK_OK(mt_acts_init(model, B, T, &a));
    int nm = mt_model_n_modules(model);
    for (int s = 0; s < STEPS; s++) {
        mt_model_zero_grads(model);
        CHECK_OK(mt_model_forward(model, a, 0, nm, tok, tgt, NULL, NULL, &r.loss[s]));
        CHECK_OK(mt_model_backward(model, a, 0, nm, NULL, NULL, mt_loss_scaler_scale(&ls)));
        int found_inf = mt_master_prepare_grads(m, grads, n); /* a multi-rank caller all-reduces this (MAX) */
        float inv = mt_loss_scaler_inv_scale(&ls);
        if (!mt_loss_scaler_update(&ls, found_inf)) {
            CHECK_OK(mt_optim_step(opt, 1e-2f, inv));
            mt_master_publish(m);
            if (r.first_update < 0) {
                r.first_update = s;
            }
        }
    }
    r.skipped = ls.n_skipped;
    r.final_scale = ls.scale;
    mt_acts_free(a);
    mt_optim_free(opt);
    mt_master_free(m);
    mt_model_free(model);
    return r;
}

static void test_training_modes(void) {
    run_t f32 = train(MT_PREC_FP32, 1.0f), t32 = train(MT_PREC_TF32, 1.0f);
    run_t b16 = train(MT_PREC_BF16, 1.0f), h16 = train(MT_PREC_FP16, 1024.0f);
    CHECK(f32.loss[STEPS - 1] < 0.5f * f32.loss[0], "fp32 learns (%g -> %g)", f32.loss[0], f32.loss[STEPS - 1]);
    CHECK(memcmp(f32.loss, t32.loss, sizeof(f32.loss)) == 0, "tf32 is fp32 on the CPU");
    double worst_b = 0, worst_h = 0;
    for (int s = 0; s < STEPS; s++) {
        worst_b = fmax(worst_b, fabs(b16.loss[s] - f32.loss[s]) / (1 + f32.loss[s]));
        worst_h = fmax(worst_h, fabs(h16.loss[s] - f32.loss[s]) / (1 + f32.loss[s]));
    }
    printf("worst relative loss difference to fp32 over %d steps: bf16 %.3e, fp16 %.3e\n", STEPS, worst_b, worst_h);
    CHECK(worst_b <= 4e-3, "bf16 within 4e-3 of fp32 (%.3e)", worst_b);
    CHECK(worst_h <= 5e-4, "fp16 within 5e-4 of fp32 (%.3e)", worst_h);
    CHECK(worst_b > worst_h, "bf16 (8-bit mantissa) deviates more than fp16 (11-bit)");
    CHECK(worst_b > 0 && worst_h > 0, "the storage rounding is actually applied");
    CHECK(h16.skipped == 0 && h16.final_scale == 8192.0f, "fp16 at 1024: no overflow, 3 growths (scale %g)",
          h16.final_scale);
    /* an initial scale of 2^24 overflows f16 gradients: the first steps are skipped and the scale backs off
     * until the gradients fit; training then proceeds */
    run_t hi = train(MT_PREC_FP16, 16777216.0f);
    printf("fp16 from scale 2^24: %lld steps skipped, final scale %g, loss %g -> %g\n", (long long)hi.skipped,
           hi.final_scale, hi.loss[0], hi.loss[STEPS - 1]);
    CHECK(hi.skipped >= 2 && hi.final_scale < 16777216.0f, "overflows skipped and backed off");
    CHECK(hi.first_update >= 2 && hi.loss[hi.first_update] == hi.loss[0],
          "the leading skipped steps leave the weights untouched (first update at step %d)", hi.first_update);
    CHECK(hi.loss[STEPS - 1] < 0.6f * hi.loss[0], "and it still learns (%g -> %g)", hi.loss[0], hi.loss[STEPS - 1]);
}

/* ZeRO-3-like hooks: pre_forward/pre_backward point every parameter the module reads at a private copy
 * (the "gathered" buffer) and post hooks point them back; the wrapper must round what the hook bound. */
typedef struct {
    mt_model_t m;
    float *gathered; /* a copy of the flat parameters */
    float *flat;
    int pre_calls;
    bool saw_master; /* a hook found p->data not restored to what it bound */
} gather_t;

static mt_status_t g_pre(void *arg, int module) {
    gather_t *g = arg;
    g->pre_calls++;
    for (int i = 0; i < mt_model_n_params(g->m); i++) {
        mt_param_t *p = mt_model_param(g->m, i);
        p->data = g->gathered + p->offset;
    }
    (void)module;
    return MT_OK;
}

static mt_status_t g_post(void *arg, int module) {
    gather_t *g = arg;
    for (int i = 0; i < mt_model_n_params(g->m); i++) {
        mt_param_t *p = mt_model_param(g->m, i);
        g->saw_master |= p->data != g->gathered + p->offset;
        p->data = g->flat + p->offset;
    }
    (void)module;
    return MT_OK;
}

/* The model's per-module wrapper (mt_model_set_compute): weights the engine bound stay f32 and untouched,
 * each module's parameter gradients arrive rounded to the storage dtype, the loss scale multiplies them,
 * a hook's rebinding is honoured, and the scratch is accounted. */
static void test_model_wrapper(void) {
    mt_model_config_t c = MT_MODEL_CONFIG_INIT;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 32;
    c.seq_len = 8;
    c.vocab_size = 64;
    mt_model_t m;
    CHECK_OK(mt_model_init(&c, &m));
    CHECK(mt_model_set_compute(m, 7) == MT_ERR_INVALID_ARG, "an unknown dtype is refused");
    CHECK_OK(mt_model_alloc_params(m));
    CHECK_OK(mt_model_alloc_grads(m));
    mt_model_init_weights(m);
    size_t n = mt_model_numel(m);
    float *flat = mt_model_params_flat(m), *grads = mt_model_grads_flat(m);
    float *orig = malloc(n * sizeof(float)), *g32 = malloc(n * sizeof(float)), *gathered = malloc(n * sizeof(float));
    memcpy(orig, flat, n * sizeof(float));
    memcpy(gathered, flat, n * sizeof(float));
    int32_t tok[2 * 8], tgt[2 * 8];
    for (int i = 0; i < 16; i++) {
        tok[i] = (i * 7 + 1) % 64;
        tgt[i] = (i * 3 + 5) % 64;
    }
    mt_acts_t a;
    CHECK_OK(mt_acts_init(m, 2, 8, &a));
    int nm = mt_model_n_modules(m);
    float l32 = 0, l16 = 0, lh = 0;
    mt_model_zero_grads(m);
    CHECK_OK(mt_model_forward(m, a, 0, nm, tok, tgt, NULL, NULL, &l32));
    CHECK_OK(mt_model_backward(m, a, 0, nm, NULL, NULL, 1.0f));
    memcpy(g32, grads, n * sizeof(float));

    mt_mem_stats_t before, after;
    mt_mem_stats(MT_MEM_HOST, &before);
    CHECK_OK(mt_model_set_compute(m, (int)MT_BF16));
    gather_t g = {.m = m, .gathered = gathered, .flat = flat};
    mt_model_hooks_t h = {.pre_forward = g_pre, .post_forward = g_post, .pre_backward = g_pre,
                          .post_backward = g_post, .arg = &g};
    mt_model_set_hooks(m, &h);
    mt_model_zero_grads(m);
    CHECK_OK(mt_model_forward(m, a, 0, nm, tok, tgt, NULL, NULL, &l16));
    CHECK_OK(mt_model_backward(m, a, 0, nm, NULL, NULL, 1.0f));
    mt_mem_stats(MT_MEM_HOST, &after);
    CHECK(g.pre_calls == 2 * nm && !g.saw_master, "the hooks ran around every module and saw their own binding back");
    CHECK(memcmp(orig, flat, n * sizeof(float)) == 0 && memcmp(orig, gathered, n * sizeof(float)) == 0,
          "the bound f32 weights are not rounded in place");
    CHECK(l16 != l32 && fabsf(l16 - l32) < 2e-2f * l32, "bf16 forward differs slightly from f32: %.7g vs %.7g", l16,
          l32);
    size_t bad = 0;
    double dev = 0, ref = 0;
    for (int i = 0; i < mt_model_n_params(m); i++) {
        const mt_param_t *p = mt_model_param(m, i);
        for (size_t k = 0; k < p->numel; k++) {
            float v = p->grad[k], r = v;
            mt_prec_round(&r, 1, MT_BF16);
            bad += p->tied_module < 0 && r != v; /* one rounded contribution per call; a tied one sums two */
            dev += fabs((double)v - g32[p->offset + k]);
            ref += fabs((double)g32[p->offset + k]);
        }
    }
    CHECK(bad == 0, "every untied gradient is a bf16 value (%zu are not)", bad);
    CHECK(dev > 0 && dev < 0.05 * ref, "bf16 gradients near the f32 ones: mean |diff| / mean |g| = %.3g", dev / ref);
    int64_t extra = (after.current[MT_MEM_PARAMS] - before.current[MT_MEM_PARAMS]) +
                    (after.current[MT_MEM_GRADS] - before.current[MT_MEM_GRADS]);
    CHECK(extra > 0 && after.current[MT_MEM_PARAMS] > before.current[MT_MEM_PARAMS] &&
              after.current[MT_MEM_GRADS] > before.current[MT_MEM_GRADS],
          "the scratch is accounted as params and grads (%lld bytes)", (long long)extra);
    mt_model_set_hooks(m, NULL);

    /* fp16 with a loss scale: gradients carry it (x1024 up to f16 rounding); an absurd scale overflows to inf */
    CHECK_OK(mt_model_set_compute(m, (int)MT_F16));
    mt_model_set_loss_scale(m, 1024.0f);
    mt_model_zero_grads(m);
    CHECK_OK(mt_model_forward(m, a, 0, nm, tok, tgt, NULL, NULL, &lh));
    CHECK_OK(mt_model_backward(m, a, 0, nm, NULL, NULL, 1.0f));
    dev = 0;
    for (size_t k = 0; k < n; k++) {
        dev += fabs((double)grads[k] / 1024.0 - g32[k]);
    }
    CHECK(dev < 0.01 * ref && mt_prec_count_nonfinite(grads, n) == 0, "fp16 scaled gradients / 1024 near f32 (%.3g)",
          dev / ref);
    mt_model_set_loss_scale(m, 1e30f);
    mt_model_zero_grads(m);
    CHECK_OK(mt_model_forward(m, a, 0, nm, tok, tgt, NULL, NULL, &lh));
    CHECK_OK(mt_model_backward(m, a, 0, nm, NULL, NULL, 1.0f));
    CHECK(mt_prec_count_nonfinite(grads, n) > 0, "an overflowing scale shows up as inf in the gradients");
    mt_acts_free(a);
    mt_model_free(m);
    free(orig);
    free(g32);
    free(gathered);
}

int main(void) {
    test_parse_round();
    test_scaler();
    test_master_keeps_small_updates();
    test_fp16_underflow();
    test_training_modes();
    test_model_wrapper();
    return mt_test_finish("test_precision");
}
