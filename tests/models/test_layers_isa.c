/* The two builds of the CPU kernels (models/layers/kernel_isa.h) compute the same function: every kernel
 * of the baseline build against its AVX-512 build on the same inputs, forward and backward. Elementwise
 * kernels (GELU, residual, LayerNorm, the softmax gradient) give the same bits; the kernels with `omp simd`
 * sums (attention, the softmax's log-sum-exp) agree to a few float ulps of the sums' magnitudes. Where the
 * CPU or the build has no AVX-512, the test says so and checks that the baseline runs (it cannot compare).
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "models/layers/layers.h"
#include "testutil.h"

enum { B = 2, T = 37, C = 48, NH = 3, N = B * T, V = 101, VP = 128 };

static float *randn(size_t n, uint32_t seed, float scale) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * scale;
    }
    return x;
}

static float *copy(const float *x, size_t n) {
    float *y = malloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

/* The outputs of every kernel, from one set of inputs. */
typedef struct {
    float *gelu, *dgelu, *res, *dres, *ln, *mean, *rstd, *dln_x, *dln_w, *dln_b, *att_out, *att_lse, *dqkv, *dqkv_r,
        *losses, *lse, *dlogits;
    float mean_loss;
} outs_t;

static void run(outs_t *o) {
    size_t n = (size_t)N * C;
    float *x = randn(n, 1, 6.0f), *y = randn(n, 2, 2.0f), *dy = randn(n, 3, 1.0f);
    float *w = randn(C, 4, 1.0f), *bias = randn(C, 5, 0.2f);
    o->gelu = malloc(n * 4);
    mt_gelu_forward(o->gelu, x, n);
    o->dgelu = copy(y, n);
    mt_gelu_backward(o->dgelu, x, dy, n);
    o->res = malloc(n * 4);
    mt_residual_forward(o->res, x, y, n);
    o->dres = copy(y, n);
    mt_residual_backward(o->dres, NULL, dy, n);
    o->ln = malloc(n * 4);
    o->mean = malloc(N * 4);
    o->rstd = malloc(N * 4);
    mt_layernorm_forward(o->ln, o->mean, o->rstd, x, w, bias, N, C);
    o->dln_x = copy(y, n);
    o->dln_w = calloc(C, 4);
    o->dln_b = calloc(C, 4);
    mt_layernorm_backward(o->dln_x, o->dln_w, o->dln_b, dy, x, w, o->mean, o->rstd, N, C);

    float *qkv = randn((size_t)N * 3 * C, 6, 2.0f), *datt = randn(n, 7, 1.0f);
    float *scratch = malloc(mt_attention_scratch_floats(T, C / NH) * 4);
    float *att = malloc((size_t)B * NH * T * T * 4);
    o->att_out = malloc(n * 4);
    o->att_lse = malloc((size_t)B * NH * T * 4);
    mt_attention_forward(o->att_out, att, NULL, qkv, B, T, C, NH, scratch);
    o->dqkv = calloc((size_t)N * 3 * C, 4);
    mt_attention_backward(o->dqkv, datt, qkv, att, NULL, B, T, C, NH, scratch);
    float *out2 = malloc(n * 4);
    mt_attention_forward(out2, NULL, o->att_lse, qkv, B, T, C, NH, scratch); /* the recompute variant */
    o->dqkv_r = calloc((size_t)N * 3 * C, 4);
    mt_attention_backward(o->dqkv_r, datt, qkv, NULL, o->att_lse, B, T, C, NH, scratch);

    float *logits = randn((size_t)N * VP, 8, 8.0f);
    int32_t tg[N];
    for (int i = 0; i < N; i++) {
        tg[i] = i % 9 == 4 ? -1 : (i * 31) % V;
    }
    o->losses = malloc(N * 4);
    o->lse = malloc(N * 4);
    mt_softmax_ce_forward(o->losses, o->lse, &o->mean_loss, logits, tg, N, V, VP);
    o->dlogits = malloc((size_t)N * VP * 4);
    mt_softmax_ce_backward(o->dlogits, logits, o->lse, tg, N, V, VP, 1.0f / N);
    free(x), free(y), free(dy), free(w), free(bias), free(qkv), free(datt), free(scratch), free(att), free(out2),
        free(logits);
}

static void outs_free(outs_t *o) {
    float **p = (float **)o;
    for (size_t i = 0; i < offsetof(outs_t, mean_loss) / sizeof(float *); i++) {
        free(p[i]);
    }
}

static void same_bits(const char *what, const float *a, const float *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) {
        d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    }
    CHECK(d == 0, "%s: %zu of %zu values differ between the builds (elementwise: the same bits expected)", what, d, n);
}

static void close_to(const char *what, const float *a, const float *b, size_t n, double tol) {
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        scale = fmax(scale, fabs(b[i]));
    }
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]) / (scale > 0 ? scale : 1.0);
        worst = isnan(e) ? INFINITY : fmax(worst, e);
    }
    printf("%-22s largest difference %.3g of the largest value\n", what, worst);
    CHECK(worst <= tol, "%s: builds differ by %g relative (bound %g)", what, worst, tol);
}

int main(void) {
    bool have = mt_layers_set_isa(true);
    outs_t wide, base;
    run(&wide);
    CHECK(!mt_layers_set_isa(false), "the baseline can be asked for");
    CHECK(strcmp(mt_layers_isa(), "baseline") == 0, "and is reported: %s", mt_layers_isa());
    run(&base);
    mt_layers_set_isa(true);
    for (int i = 0; i < N; i++) {
        CHECK(isfinite(base.losses[i]) && isfinite(base.att_out[i * C]), "the baseline computes finite values");
    }
    if (!have) {
        printf("skipped: no AVX-512 kernels here (%s), nothing to compare the baseline with\n", mt_layers_isa());
        outs_free(&wide);
        outs_free(&base);
        mt_test_finish("test_layers_isa");
        return MT_TEST_SKIP;
    }
    size_t n = (size_t)N * C;
    same_bits("gelu forward", wide.gelu, base.gelu, n);
    same_bits("gelu backward", wide.dgelu, base.dgelu, n);
    same_bits("residual", wide.res, base.res, n);
    same_bits("residual backward", wide.dres, base.dres, n);
    same_bits("layernorm forward", wide.ln, base.ln, n);
    same_bits("layernorm dx", wide.dln_x, base.dln_x, n);
    same_bits("layernorm dw", wide.dln_w, base.dln_w, C);
    same_bits("layernorm db", wide.dln_b, base.dln_b, C);
    close_to("attention out", wide.att_out, base.att_out, n, 1e-6);
    close_to("attention lse", wide.att_lse, base.att_lse, (size_t)B * NH * T, 1e-6);
    close_to("attention dqkv", wide.dqkv, base.dqkv, (size_t)N * 3 * C, 1e-6);
    close_to("attention dqkv (lse)", wide.dqkv_r, base.dqkv_r, (size_t)N * 3 * C, 1e-6);
    close_to("softmax_ce losses", wide.losses, base.losses, N, 1e-6);
    close_to("softmax_ce dlogits", wide.dlogits, base.dlogits, (size_t)N * VP, 1e-6);
    CHECK_CLOSE(wide.mean_loss, base.mean_loss, 1e-6, 0);
    outs_free(&wide);
    outs_free(&base);
    return mt_test_finish("test_layers_isa");
}
