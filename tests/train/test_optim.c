/* Optimizers against steps worked out by hand (AdamW with decoupled decay and bias correction, SGD
 * with momentum and L2 decay), clipping from partial sums of squares, and LR schedules at chosen steps.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <string.h>

#include "models/optim/optim.h"
#include "runtime/alloc.h"
#include "testutil.h"

/* AdamW, two steps, hand-computed (lr 0.1, betas 0.9/0.999, eps 1e-8, wd 0.1):
 * step 1, g = 0.5, p = 1:  p = 0.99 (decay); m = 0.05; v = 0.00025; step_size = 0.1/0.1 = 1;
 *   denom = sqrt(0.00025)/sqrt(0.001) + 1e-8 = 0.5 + 1e-8; p = 0.99 - 0.05/0.5 = 0.89
 * step 2, g = -0.25: p = 0.89*0.99 = 0.8811; m = 0.045 - 0.025 = 0.02; v = 0.00024975 + 0.0000625 = 0.00031225;
 *   step_size = 0.1/0.19; denom = sqrt(0.00031225)/sqrt(0.001999) = 0.3952263; p = 0.8811 - 0.0266335 = 0.8544665 */
static void test_adamw_hand(void) {
    mt_optim_params_t prm = MT_OPTIM_PARAMS_INIT;
    prm.kind = MT_OPTIM_ADAMW;
    prm.beta1 = 0.9f;
    prm.beta2 = 0.999f;
    prm.eps = 1e-8f;
    prm.weight_decay = 0.1f;
    mt_optim_t opt = NULL;
    CHECK_OK(mt_optim_init(&prm, &opt));
    float w[2] = {1.0f, -2.0f}, gw[2];  /* a "2-D weight": decayed */
    float b[1] = {1.0f}, gb[1];         /* a bias: not decayed */
    CHECK_OK(mt_optim_add(opt, "w", w, gw, 2, true, NULL));
    CHECK_OK(mt_optim_add(opt, "b", b, gb, 1, false, NULL));
    gw[0] = 0.5f;
    gw[1] = 0.0f; /* zero gradient: only decay moves it */
    gb[0] = 0.5f;
    CHECK_OK(mt_optim_step(opt, 0.1f, 1.0f));
    CHECK_CLOSE(w[0], 0.89, 1e-6, 0);
    CHECK_CLOSE(w[1], -2.0 * 0.99, 1e-6, 0);
    CHECK_CLOSE(b[0], 0.9, 1e-6, 0); /* 1 - 0.05/0.5, no decay */
    gw[0] = -0.25f;
    gb[0] = -0.25f;
    CHECK_OK(mt_optim_step(opt, 0.1f, 1.0f));
    CHECK_CLOSE(w[0], 0.8544665, 2e-6, 0);
    CHECK_CLOSE(b[0], 0.9 - 0.0266335, 2e-6, 0);
    CHECK(mt_optim_get_step(opt) == 2, "step counter %lld", (long long)mt_optim_get_step(opt));
    float *m = NULL, *v = NULL;
    size_t n = 0;
    CHECK_OK(mt_optim_state(opt, 0, NULL, &n, &m, &v));
    CHECK(n == 2 && m && v, "state of w");
    CHECK_CLOSE(m[0], 0.02, 1e-6, 0);
    CHECK_CLOSE(v[0], 0.00031225, 3e-5, 0); /* beta2 = 0.999f is 0.99900001287 in fp32 */
    CHECK(mt_optim_state(opt, 2, NULL, NULL, NULL, NULL) == MT_ERR_INVALID_ARG, "bad index rejected");
    mt_optim_free(opt);
}

/* Reference AdamW in double over many random-looking steps: the fp32 kernel tracks it closely. */
static void test_adamw_reference(void) {
    enum { N = 37, STEPS = 20 };
    float p[N], g[N];
    double pd[N], md[N] = {0}, vd[N] = {0};
    for (int i = 0; i < N; i++) {
        p[i] = (float)(0.1 * sin(i + 1.0));
        pd[i] = p[i];
    }
    mt_optim_params_t prm = MT_OPTIM_PARAMS_INIT;
    prm.beta1 = 0.8f;
    prm.beta2 = 0.95f;
    prm.eps = 1e-6f;
    prm.weight_decay = 0.05f;
    mt_optim_t opt = NULL;
    CHECK_OK(mt_optim_init(&prm, &opt));
    CHECK_OK(mt_optim_add(opt, "p", p, g, N, true, NULL));
    double b1 = prm.beta1, b2 = prm.beta2, eps = prm.eps, wd = prm.weight_decay;
    double maxrel = 0;
    for (int t = 1; t <= STEPS; t++) {
        double lr = 0.01 * t / STEPS;
        for (int i = 0; i < N; i++) {
            g[i] = (float)cos(0.7 * i + 1.3 * t);
        }
        CHECK_OK(mt_optim_step(opt, (float)lr, 1.0f));
        for (int i = 0; i < N; i++) {
            pd[i] *= 1 - lr * wd;
            md[i] = b1 * md[i] + (1 - b1) * g[i];
            vd[i] = b2 * vd[i] + (1 - b2) * (double)g[i] * g[i];
            double mh = md[i] / (1 - pow(b1, t)), vh = vd[i] / (1 - pow(b2, t));
            pd[i] -= lr * mh / (sqrt(vh) + eps);
            double rel = fabs(p[i] - pd[i]) / (fabs(pd[i]) + 1e-3);
            maxrel = rel > maxrel ? rel : maxrel;
        }
    }
    CHECK(maxrel < 1e-5, "fp32 AdamW vs double reference: max relative error %g", maxrel);
    mt_optim_free(opt);
}

/* grad_scale is bit-identical to scaling the gradients before the step. */
static void test_scale_equivalence(void) {
    enum { N = 64 };
    float p1[N], p2[N], g1[N], g2[N];
    for (int i = 0; i < N; i++) {
        p1[i] = p2[i] = (float)(0.01 * i - 0.3);
        g1[i] = (float)sin(i * 0.37);
    }
    for (int kind = 0; kind < 2; kind++) {
        mt_optim_params_t prm = MT_OPTIM_PARAMS_INIT;
        prm.kind = kind ? MT_OPTIM_SGD : MT_OPTIM_ADAMW;
        prm.momentum = 0.9f;
        prm.weight_decay = 0.01f;
        mt_optim_t a = NULL, b = NULL;
        CHECK_OK(mt_optim_init(&prm, &a));
        CHECK_OK(mt_optim_init(&prm, &b));
        CHECK_OK(mt_optim_add(a, "p", p1, g1, N, true, NULL));
        CHECK_OK(mt_optim_add(b, "p", p2, g2, N, true, NULL));
        float scale = 0.3f;
        for (int s = 0; s < 3; s++) {
            for (int i = 0; i < N; i++) {
                g2[i] = g1[i] * scale;
            }
            CHECK_OK(mt_optim_step(a, 1e-2f, scale));
            CHECK_OK(mt_optim_step(b, 1e-2f, 1.0f));
        }
        CHECK(memcmp(p1, p2, sizeof(p1)) == 0, "kind %d: grad_scale differs from pre-scaled gradients", kind);
        mt_optim_free(a);
        mt_optim_free(b);
    }
}

/* SGD, lr 0.1: momentum 0.9, g = 0.5 twice: buf 0.5 -> p 0.95; buf 0.95 -> p 0.855.
 * With L2 weight decay 0.1 on p = 1: g' = 0.6, p = 0.94. Plain SGD allocates no state. */
static void test_sgd_hand(void) {
    mt_optim_params_t prm = MT_OPTIM_PARAMS_INIT;
    prm.kind = MT_OPTIM_SGD;
    prm.momentum = 0.9f;
    mt_optim_t opt = NULL;
    CHECK_OK(mt_optim_init(&prm, &opt));
    float p[1] = {1.0f}, g[1] = {0.5f};
    CHECK_OK(mt_optim_add(opt, "p", p, g, 1, true, NULL));
    CHECK_OK(mt_optim_step(opt, 0.1f, 1.0f));
    CHECK_CLOSE(p[0], 0.95, 1e-7, 0);
    CHECK_OK(mt_optim_step(opt, 0.1f, 1.0f));
    CHECK_CLOSE(p[0], 0.855, 1e-6, 0);
    mt_optim_free(opt);

    prm.momentum = 0.9f;
    prm.weight_decay = 0.1f;
    CHECK_OK(mt_optim_init(&prm, &opt));
    float q[2] = {1.0f, 1.0f}, gq[2] = {0.5f, 0.5f};
    CHECK_OK(mt_optim_add(opt, "w", q, gq, 1, true, NULL));
    CHECK_OK(mt_optim_add(opt, "b", q + 1, gq + 1, 1, false, NULL));
    CHECK_OK(mt_optim_step(opt, 0.1f, 1.0f));
    CHECK_CLOSE(q[0], 0.94, 1e-6, 0);
    CHECK_CLOSE(q[1], 0.95, 1e-6, 0);
    mt_optim_free(opt);

    mt_mem_stats_t before, after;
    mt_mem_stats(MT_MEM_HOST, &before);
    prm.momentum = 0.0f;
    prm.weight_decay = 0.0f;
    CHECK_OK(mt_optim_init(&prm, &opt));
    float r[1] = {2.0f}, gr[1] = {1.0f};
    CHECK_OK(mt_optim_add(opt, "r", r, gr, 1, true, NULL));
    mt_mem_stats(MT_MEM_HOST, &after);
    CHECK(after.current[MT_MEM_OPTIMIZER] == before.current[MT_MEM_OPTIMIZER], "plain SGD has no state");
    CHECK_OK(mt_optim_step(opt, 0.5f, 1.0f));
    CHECK_CLOSE(r[0], 1.5, 0, 0);
    mt_optim_free(opt);
}

static void test_state_accounting(void) {
    mt_mem_stats_t before, mid, after;
    mt_mem_stats(MT_MEM_HOST, &before);
    mt_optim_params_t prm = MT_OPTIM_PARAMS_INIT;
    mt_optim_t opt = NULL;
    CHECK_OK(mt_optim_init(&prm, &opt));
    static float p[1024], g[1024];
    CHECK_OK(mt_optim_add(opt, "p", p, g, 1024, true, NULL));
    mt_mem_stats(MT_MEM_HOST, &mid);
    CHECK(mid.current[MT_MEM_OPTIMIZER] - before.current[MT_MEM_OPTIMIZER] == 2 * 4096,
          "AdamW state is exactly m and v: %lld bytes",
          (long long)(mid.current[MT_MEM_OPTIMIZER] - before.current[MT_MEM_OPTIMIZER]));
    mt_optim_free(opt);
    mt_mem_stats(MT_MEM_HOST, &after);
    CHECK(after.current[MT_MEM_OPTIMIZER] == before.current[MT_MEM_OPTIMIZER], "state freed");

    mt_optim_params_t bad = MT_OPTIM_PARAMS_INIT;
    bad.beta1 = 1.0f;
    CHECK(mt_optim_init(&bad, &opt) == MT_ERR_INVALID_ARG && opt == NULL, "beta1 = 1 rejected");
    CHECK(strstr(mt_last_error_msg(), "beta1") != NULL, "message names beta1: %s", mt_last_error_msg());
    bad = (mt_optim_params_t)MT_OPTIM_PARAMS_INIT;
    bad.size = 0;
    CHECK(mt_optim_init(&bad, &opt) == MT_ERR_INVALID_ARG, "unset size rejected");
}

/* Global norm of {3} and {4} (one tensor per "rank") is 5; clipping to 1 scales by 1/(5 + 1e-6). */
static void test_clip(void) {
    float a[1] = {3.0f}, b[1] = {4.0f};
    double partial[2] = {mt_clip_sumsq(a, 1), mt_clip_sumsq(b, 1)};
    double norm = 0;
    float coef = mt_clip_coef(partial[0] + partial[1], 1.0f, &norm);
    CHECK_CLOSE(norm, 5.0, 0, 0);
    CHECK_CLOSE(coef, 1.0 / (5.0 + 1e-6), 1e-7, 0);
    CHECK(mt_clip_coef(25.0, 10.0f, NULL) == 1.0f, "norm below the limit: no clipping");
    CHECK(mt_clip_coef(25.0, 0.0f, NULL) == 1.0f, "max_norm 0 disables");
    CHECK(mt_clip_coef(NAN, 1.0f, &norm) == 1.0f && isnan(norm), "NaN reported, not hidden");
    CHECK(mt_clip_coef(INFINITY, 1.0f, &norm) == 1.0f && isinf(norm), "inf reported");

    /* Sharded: any split of a vector gives the same total as one pass (to double rounding). */
    enum { N = 1000 };
    static float v[N];
    for (int i = 0; i < N; i++) {
        v[i] = (float)sin(i * 0.1);
    }
    double whole = mt_clip_sumsq(v, N);
    double split = mt_clip_sumsq(v, 333) + mt_clip_sumsq(v + 333, 333) + mt_clip_sumsq(v + 666, N - 666);
    CHECK_CLOSE(split, whole, 1e-14, 0);
    double ref = 0;
    for (int i = 0; i < N; i++) {
        ref += (double)v[i] * v[i];
    }
    CHECK_CLOSE(whole, ref, 1e-14, 0);
}

static void test_schedules(void) {
    mt_lr_sched_t s = {.kind = MT_LR_COSINE, .lr = 1.0f, .min_lr = 0.1f, .warmup_steps = 10, .total_steps = 111};
    CHECK_CLOSE(mt_lr_at(&s, 0), 0.1, 1e-7, 0);   /* (0+1)/10 */
    CHECK_CLOSE(mt_lr_at(&s, 4), 0.5, 1e-7, 0);
    CHECK_CLOSE(mt_lr_at(&s, 9), 1.0, 1e-7, 0);   /* warm-up ends at the peak */
    CHECK_CLOSE(mt_lr_at(&s, 10), 1.0, 1e-7, 0);  /* cosine starts at the peak */
    CHECK_CLOSE(mt_lr_at(&s, 60), 0.55, 1e-6, 0); /* halfway: r = 50/100 -> (1 + 0.1)/2 */
    CHECK_CLOSE(mt_lr_at(&s, 35), 0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 0.25)), 1e-6, 0);
    CHECK_CLOSE(mt_lr_at(&s, 110), 0.1, 1e-7, 0); /* last step reaches min_lr */
    CHECK_CLOSE(mt_lr_at(&s, 500), 0.1, 1e-7, 0); /* and stays there */
    mt_lr_sched_t c = {.kind = MT_LR_CONSTANT, .lr = 3e-4f, .warmup_steps = 4, .total_steps = 10};
    CHECK_CLOSE(mt_lr_at(&c, 1), 1.5e-4, 1e-6, 0);
    CHECK_CLOSE(mt_lr_at(&c, 3), 3e-4, 1e-6, 0);
    CHECK_CLOSE(mt_lr_at(&c, 9), 3e-4, 1e-6, 0);
    mt_lr_sched_t nw = {.kind = MT_LR_COSINE, .lr = 2.0f, .min_lr = 0.0f, .warmup_steps = 0, .total_steps = 5};
    CHECK_CLOSE(mt_lr_at(&nw, 0), 2.0, 1e-7, 0);
    CHECK_CLOSE(mt_lr_at(&nw, 2), 1.0, 1e-6, 0);
    CHECK_CLOSE(mt_lr_at(&nw, 4), 0.0, 0, 1e-7);
    mt_lr_sched_t one = {.kind = MT_LR_COSINE, .lr = 2.0f, .min_lr = 0.5f, .warmup_steps = 0, .total_steps = 1};
    CHECK_CLOSE(mt_lr_at(&one, 0), 2.0, 1e-7, 0); /* a 1-step run trains at the peak */
    mt_lr_kind_t k;
    CHECK(mt_lr_kind_parse("cosine", &k) && k == MT_LR_COSINE, "parse cosine");
    CHECK(!mt_lr_kind_parse("linear", &k), "unknown schedule rejected");
}

int main(void) {
    test_adamw_hand();
    test_adamw_reference();
    test_scale_equivalence();
    test_sgd_hand();
    test_state_accounting();
    test_clip();
    test_schedules();
    return mt_test_finish("test_optim");
}
