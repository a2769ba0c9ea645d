/* Every CPU operation: forward against its double-precision reference (models/layers/<op>_ref.c), and
 * backward against central finite differences of that reference in double (h = 1e-6), plus the
 * accumulate (+=) contract. Tolerances: forward |fast - ref| <= 2e-5 (1 + |ref|); backward
 * |analytic - fd| <= 1e-3 |fd| + 1e-4 max|fd| (float kernels vs exact derivatives).
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/layers/fastmath.h"
#include "models/layers/layers.h"
#include "models/layers/layers_ref.h"
#include "testutil.h"

#define PRE 0.5f /* gradients start here to check that backward accumulates */

static uint64_t rng = 88172645463325252ull;
static double urand(void) { /* uniform [-1, 1), exactly representable in float */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(float)(((double)(rng >> 11) * 0x1.0p-53) * 2.0 - 1.0);
}
static double *drand_arr(size_t n, double scale) {
    double *a = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        a[i] = (double)(float)(urand() * scale);
    }
    return a;
}
static float *to_f(const double *d, size_t n) {
    float *f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        f[i] = (float)d[i];
    }
    return f;
}
static float *filled(size_t n, float v) {
    float *f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        f[i] = v;
    }
    return f;
}

static void check_fwd(const char *what, const float *fast, const double *ref, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(fabs(fast[i] - ref[i]) <= 2e-5 * (1.0 + fabs(ref[i])))) {
            if (bad++ < 3) {
                fprintf(stderr, "%s[%zu]: fast %.9g ref %.9g\n", what, i, fast[i], ref[i]);
            }
        }
    }
    CHECK(bad == 0, "%s forward: %d of %zu elements off", what, bad, n);
}

/* The scalar L(x) whose gradient backward computes: sum(out * proj) of the reference. */
typedef double (*loss_fn)(void *ctx);

static void check_grad(const char *what, double *x, size_t n, const float *grad_minus_pre, loss_fn f, void *ctx) {
    double h = 1e-6, mx = 0.0;
    double *fd = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + h;
        double lp = f(ctx);
        x[i] = keep - h;
        double lm = f(ctx);
        x[i] = keep;
        fd[i] = (lp - lm) / (2 * h);
        mx = fmax(mx, fabs(fd[i]));
    }
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double a = (double)grad_minus_pre[i] - PRE;
        if (!(fabs(a - fd[i]) <= 1e-3 * fabs(fd[i]) + 1e-4 * mx + 1e-7)) {
            if (bad++ < 3) {
                fprintf(stderr, "%s d[%zu]: analytic %.9g fd %.9g\n", what, i, a, fd[i]);
            }
        }
    }
    CHECK(bad == 0, "%s backward: %d of %zu gradients off (max |fd| %.3g)", what, bad, n, mx);
    free(fd);
}

static double dot(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        s += a[i] * b[i];
    }
    return s;
}

/* ---- matmul + bias ---- */
typedef struct {
    double *inp, *w, *b, *proj, *out;
    int N, C, OC;
} mm_ctx;
static double mm_loss(void *p) {
    mm_ctx *c = p;
    mt_matmul_ref(c->out, c->inp, c->w, c->b, c->N, c->C, c->OC);
    return dot(c->out, c->proj, (size_t)c->N * c->OC);
}
static void test_matmul(void) {
    mm_ctx c = {.N = 6, .C = 8, .OC = 12};
    size_t NC = (size_t)c.N * c.C, NO = (size_t)c.N * c.OC, OCC = (size_t)c.OC * c.C;
    c.inp = drand_arr(NC, 1);
    c.w = drand_arr(OCC, 1);
    c.b = drand_arr(c.OC, 1);
    c.proj = drand_arr(NO, 1);
    c.out = malloc(NO * sizeof(double));
    float *inp = to_f(c.inp, NC), *w = to_f(c.w, OCC), *b = to_f(c.b, c.OC), *dout = to_f(c.proj, NO);
    /* padded output rows (ldo > OC) must be left alone */
    int ldo = c.OC + 3;
    float *out = filled((size_t)c.N * ldo, 7.0f), *outc = malloc(NO * sizeof(float));
    mt_matmul_forward(out, ldo, inp, w, b, c.N, c.C, c.OC);
    int pad_ok = 1;
    for (int n = 0; n < c.N; n++) {
        memcpy(outc + (size_t)n * c.OC, out + (size_t)n * ldo, c.OC * sizeof(float));
        for (int o = c.OC; o < ldo; o++) {
            pad_ok &= out[(size_t)n * ldo + o] == 7.0f;
        }
    }
    CHECK(pad_ok, "matmul wrote into padded columns");
    mm_loss(&c);
    check_fwd("matmul", outc, c.out, NO);
    mt_matmul_forward(outc, c.OC, inp, w, NULL, c.N, c.C, c.OC); /* no bias */
    mt_matmul_ref(c.out, c.inp, c.w, NULL, c.N, c.C, c.OC);
    check_fwd("matmul (no bias)", outc, c.out, NO);
    float *dinp = filled(NC, PRE), *dw = filled(OCC, PRE), *db = filled(c.OC, PRE);
    mt_matmul_backward(dinp, dw, db, dout, c.OC, inp, w, c.N, c.C, c.OC);
    check_grad("matmul dinp", c.inp, NC, dinp, mm_loss, &c);
    check_grad("matmul dw", c.w, OCC, dw, mm_loss, &c);
    check_grad("bias db", c.b, c.OC, db, mm_loss, &c);
    float *db2 = filled(c.OC, PRE);
    mt_bias_backward(db2, dout, c.OC, c.N, c.OC);
    CHECK(memcmp(db, db2, c.OC * sizeof(float)) == 0, "mt_bias_backward equals the bias part of matmul backward");
    free(c.inp), free(c.w), free(c.b), free(c.proj), free(c.out);
    free(inp), free(w), free(b), free(dout), free(out), free(outc), free(dinp), free(dw), free(db), free(db2);
}

/* ---- layernorm ---- */
typedef struct {
    double *inp, *w, *b, *proj, *out;
    int N, C;
} ln_ctx;
static double ln_loss(void *p) {
    ln_ctx *c = p;
    mt_layernorm_ref(c->out, c->inp, c->w, c->b, c->N, c->C);
    return dot(c->out, c->proj, (size_t)c->N * c->C);
}
static void test_layernorm(void) {
    ln_ctx c = {.N = 5, .C = 70}; /* C > 64 exercises two channel chunks */
    size_t NC = (size_t)c.N * c.C;
    c.inp = drand_arr(NC, 2);
    for (int i = 0; i < c.C; i++) {
        c.inp[i] = (double)(float)(c.inp[i] * 0.003); /* row 0: variance ~ eps, so eps = 1e-5 matters */
    }
    c.w = drand_arr(c.C, 1);
    c.b = drand_arr(c.C, 1);
    c.proj = drand_arr(NC, 1);
    c.out = malloc(NC * sizeof(double));
    float *inp = to_f(c.inp, NC), *w = to_f(c.w, c.C), *b = to_f(c.b, c.C), *dout = to_f(c.proj, NC);
    float *out = malloc(NC * sizeof(float)), *mean = malloc(c.N * sizeof(float)), *rstd = malloc(c.N * sizeof(float));
    mt_layernorm_forward(out, mean, rstd, inp, w, b, c.N, c.C);
    ln_loss(&c);
    check_fwd("layernorm", out, c.out, NC);
    float *dinp = filled(NC, PRE), *dw = filled(c.C, PRE), *db = filled(c.C, PRE);
    mt_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, c.N, c.C);
    check_grad("layernorm dinp", c.inp, NC, dinp, ln_loss, &c);
    check_grad("layernorm dw", c.w, c.C, dw, ln_loss, &c);
    check_grad("layernorm db", c.b, c.C, db, ln_loss, &c);
    free(c.inp), free(c.w), free(c.b), free(c.proj), free(c.out);
    free(inp), free(w), free(b), free(dout), free(out), free(mean), free(rstd), free(dinp), free(dw), free(db);
}

/* ---- gelu and residual ---- */
typedef struct {
    double *x, *y, *proj, *out;
    size_t n;
} ew_ctx;
static double gelu_loss(void *p) {
    ew_ctx *c = p;
    mt_gelu_ref(c->out, c->x, c->n);
    return dot(c->out, c->proj, c->n);
}
static double res_loss(void *p) {
    ew_ctx *c = p;
    mt_residual_ref(c->out, c->x, c->y, c->n);
    return dot(c->out, c->proj, c->n);
}
static void test_elementwise(void) {
    ew_ctx c = {.n = 301};
    c.x = drand_arr(c.n, 4);
    c.y = drand_arr(c.n, 1);
    c.proj = drand_arr(c.n, 1);
    c.out = malloc(c.n * sizeof(double));
    float *x = to_f(c.x, c.n), *y = to_f(c.y, c.n), *dout = to_f(c.proj, c.n), *out = malloc(c.n * sizeof(float));
    mt_gelu_forward(out, x, c.n);
    gelu_loss(&c);
    check_fwd("gelu", out, c.out, c.n);
    float *dx = filled(c.n, PRE), *dy = filled(c.n, PRE);
    mt_gelu_backward(dx, x, dout, c.n);
    check_grad("gelu dinp", c.x, c.n, dx, gelu_loss, &c);
    mt_residual_forward(out, x, y, c.n);
    res_loss(&c);
    check_fwd("residual", out, c.out, c.n);
    for (size_t i = 0; i < c.n; i++) {
        dx[i] = PRE;
    }
    mt_residual_backward(dx, dy, dout, c.n);
    check_grad("residual da", c.x, c.n, dx, res_loss, &c);
    check_grad("residual db", c.y, c.n, dy, res_loss, &c);
    free(c.x), free(c.y), free(c.proj), free(c.out), free(x), free(y), free(dout), free(out), free(dx), free(dy);
}

/* ---- embedding ---- */
typedef struct {
    double *wte, *wpe, *proj, *out;
    const int32_t *tok;
    int B, T, C;
} emb_ctx;
static double emb_loss(void *p) {
    emb_ctx *c = p;
    mt_embedding_ref(c->out, c->tok, c->wte, c->wpe, c->B, c->T, c->C);
    return dot(c->out, c->proj, (size_t)c->B * c->T * c->C);
}
static void test_embedding(void) {
    static const int32_t tok[] = {3, 1, 3, 0, 4, 3}; /* repeats: gradients of a row add up */
    emb_ctx c = {.tok = tok, .B = 2, .T = 3, .C = 67};
    size_t NC = (size_t)6 * c.C, VC = (size_t)5 * c.C, TC = (size_t)c.T * c.C;
    c.wte = drand_arr(VC, 1);
    c.wpe = drand_arr(TC, 1);
    c.proj = drand_arr(NC, 1);
    c.out = malloc(NC * sizeof(double));
    float *wte = to_f(c.wte, VC), *wpe = to_f(c.wpe, TC), *dout = to_f(c.proj, NC), *out = malloc(NC * sizeof(float));
    mt_embedding_forward(out, tok, wte, wpe, c.B, c.T, c.C);
    emb_loss(&c);
    check_fwd("embedding", out, c.out, NC);
    float *dwte = filled(VC, PRE), *dwpe = filled(TC, PRE);
    mt_embedding_backward(dwte, dwpe, dout, tok, c.B, c.T, c.C);
    check_grad("embedding dwte", c.wte, VC, dwte, emb_loss, &c);
    check_grad("embedding dwpe", c.wpe, TC, dwpe, emb_loss, &c);
    free(c.wte), free(c.wpe), free(c.proj), free(c.out), free(wte), free(wpe), free(dout), free(out), free(dwte);
    free(dwpe);
}

/* ---- attention, both variants ---- */
typedef struct {
    double *qkv, *proj, *out;
    int B, T, C, NH;
} att_ctx;
static double att_loss(void *p) {
    att_ctx *c = p;
    mt_attention_ref(c->out, c->qkv, c->B, c->T, c->C, c->NH);
    return dot(c->out, c->proj, (size_t)c->B * c->T * c->C);
}
/* The blocked kernels' edges: T not a multiple of the 4-row tile or of the 32-key block, head sizes below, at and
 * between the vector chunks (4: padded to 16; 20: one full and one padded vector; 64: four-vector chunks). */
static void test_attention_shape(int B, int T, int C, int NH) {
    att_ctx c = {.B = B, .T = T, .C = C, .NH = NH};
    size_t NC = (size_t)c.B * c.T * c.C;
    c.qkv = drand_arr(3 * NC, 1.5);
    c.proj = drand_arr(NC, 1);
    c.out = malloc(NC * sizeof(double));
    float *qkv = to_f(c.qkv, 3 * NC), *dout = to_f(c.proj, NC);
    float *scratch = malloc(mt_attention_scratch_floats(c.T, c.C / c.NH) * sizeof(float));
    float *att = malloc((size_t)c.B * c.NH * c.T * c.T * sizeof(float));
    float *lse = malloc((size_t)c.B * c.NH * c.T * sizeof(float));
    float *out1 = malloc(NC * sizeof(float)), *out2 = malloc(NC * sizeof(float));
    att_loss(&c);
    mt_attention_forward(out1, att, NULL, qkv, c.B, c.T, c.C, c.NH, scratch);
    check_fwd("attention (keep probs)", out1, c.out, NC);
    mt_attention_forward(out2, NULL, lse, qkv, c.B, c.T, c.C, c.NH, scratch);
    check_fwd("attention (recompute)", out2, c.out, NC);
    CHECK(memcmp(out1, out2, NC * sizeof(float)) == 0, "both attention variants give the same forward bits");
    int upper_zero = 1;
    for (int bh = 0; bh < c.B * c.NH; bh++) {
        for (int t = 0; t < c.T; t++) {
            for (int s = t + 1; s < c.T; s++) {
                upper_zero &= att[((size_t)bh * c.T + t) * c.T + s] == 0.0f;
            }
        }
    }
    CHECK(upper_zero, "causal: probabilities above the diagonal are zero");
    float *d1 = filled(3 * NC, PRE), *d2 = filled(3 * NC, PRE);
    mt_attention_backward(d1, dout, qkv, att, NULL, c.B, c.T, c.C, c.NH, scratch);
    mt_attention_backward(d2, dout, qkv, NULL, lse, c.B, c.T, c.C, c.NH, scratch);
    check_grad("attention dqkv (keep probs)", c.qkv, 3 * NC, d1, att_loss, &c);
    check_grad("attention dqkv (recompute)", c.qkv, 3 * NC, d2, att_loss, &c);
    free(c.qkv), free(c.proj), free(c.out), free(qkv), free(dout), free(scratch), free(att), free(lse);
    free(out1), free(out2), free(d1), free(d2);
}

static void test_attention(void) {
    test_attention_shape(2, 5, 8, 2);
    test_attention_shape(1, 37, 40, 2);
    test_attention_shape(1, 9, 64, 1);
    test_attention_shape(2, 2, 12, 3); /* T below the tile's rows */
}

/* ---- softmax + cross-entropy, ignore index, padded vocabulary ---- */
typedef struct {
    double *logits;
    const int32_t *tg;
    int N, V, Vp;
} ce_ctx;
static double ce_loss(void *p) {
    ce_ctx *c = p;
    return mt_softmax_ce_ref(NULL, c->logits, c->tg, c->N, c->V, c->Vp);
}
static void test_softmax_ce(void) {
    static const int32_t tg[] = {2, -1, 6, 0, -1, 3};
    ce_ctx c = {.tg = tg, .N = 6, .V = 7, .Vp = 9};
    size_t n = (size_t)c.N * c.Vp;
    c.logits = drand_arr(n, 3);
    float *logits = to_f(c.logits, n);
    for (int r = 0; r < c.N; r++) {
        for (int v = c.V; v < c.Vp; v++) {
            logits[r * c.Vp + v] = NAN; /* padded columns: any read would poison the result */
        }
    }
    float losses[6], lse[6], mean = -1;
    double rl[6];
    int nv = mt_softmax_ce_forward(losses, lse, &mean, logits, tg, c.N, c.V, c.Vp);
    double rmean = mt_softmax_ce_ref(rl, c.logits, tg, c.N, c.V, c.Vp);
    CHECK(nv == 4, "4 non-ignored targets, got %d", nv);
    CHECK_CLOSE(mean, rmean, 2e-6, 1e-6);
    check_fwd("softmax_ce losses", losses, rl, (size_t)c.N);
    CHECK(losses[1] == 0.0f && losses[4] == 0.0f, "ignored rows have loss 0");
    float *dl = malloc(n * sizeof(float));
    mt_softmax_ce_backward(dl, logits, lse, tg, c.N, c.V, c.Vp, 1.0f / nv);
    int pad_zero = 1;
    for (int r = 0; r < c.N; r++) {
        for (int v = c.V; v < c.Vp; v++) {
            pad_zero &= dl[r * c.Vp + v] == 0.0f;
        }
    }
    CHECK(pad_zero, "padded columns get zero gradient");
    for (size_t i = 0; i < n; i++) {
        dl[i] += PRE; /* this op overwrites; shift so check_grad's convention applies */
    }
    /* FD over the real columns only (padded columns are NaN in the float copy, unused in the reference) */
    check_grad("softmax_ce dlogits", c.logits, n, dl, ce_loss, &c);
    int32_t none[2] = {-1, -1};
    nv = mt_softmax_ce_forward(losses, lse, &mean, logits, none, 2, c.V, c.Vp);
    CHECK(nv == 0 && mean == 0.0f, "all targets ignored: loss 0 (got %d, %g)", nv, mean);
    free(c.logits), free(logits), free(dl);
}

/* The vectorisable exp used by softmax, attention and GELU: relative error <= 4e-7, 0 far below. */
static void test_fast_exp(void) {
    double worst = 0.0;
    for (double x = -87.0; x <= 88.0; x += 0.001) {
        double e = exp((double)(float)x), f = mt_fast_expf((float)x);
        worst = fmax(worst, fabs(f - e) / e);
    }
    CHECK(worst <= 4e-7, "fast exp max relative error %.3g", worst);
    CHECK(mt_fast_expf(-INFINITY) == 0.0f && mt_fast_expf(-100.0f) == 0.0f && mt_fast_expf(0.0f) == 1.0f,
          "exp(-inf) = 0, exp(0) = 1");
}

int main(void) {
    test_fast_exp();
    test_matmul();
    test_layernorm();
    test_elementwise();
    test_embedding();
    test_attention();
    test_softmax_ce();
    return mt_test_finish("test_layers");
}
