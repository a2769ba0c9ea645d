/* Every CUDA kernel against the CPU operation of models/layers on random inputs, in each storage dtype.
 * Inputs are rounded to the dtype first and the CPU runs on the rounded values, so the comparison measures
 * the kernel, not the input rounding. The error measure is max_i |gpu_i - cpu_i| / max_i |cpu_i| and the
 * tolerances are, per dtype:
 *   f32 products and reductions 2e-4 (summation order differs from OpenBLAS/OpenMP), f32 elementwise 1e-5,
 *   tf32 products 1e-2 (10-bit mantissa inputs), bf16 3e-2 (8-bit mantissa storage of outputs and of the
 *   intermediates the kernels keep), f16 5e-3 (11-bit mantissa),
 * plus exact checks where the math is exact (conversions, the skip flag, counts).
 * Usage: test_gpu_ops [family]  (matmul layernorm elementwise embedding attention attention_tc attention_knob
 * attention_knob_bad softmax_ce vocab_parallel adamw reduce; without one, all but the two knob families, which set
 * MESHTRAIN_ATTN_TC for the process);
 * exits 77 printing "skipped: no CUDA device" without a device.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "models/cuda/cuda_backend.h"
#include "models/layers/layers.h"
#include "models/optim/optim.h"
#include "runtime/cuda_alloc.h"
#include "runtime/tensor.h"
#include "testutil.h"

static const int dts[3] = {MT_CU_F32, MT_CU_BF16, MT_CU_F16};
static const char *dt_name(int dt) {
    return dt == MT_CU_F32 ? "f32" : dt == MT_CU_BF16 ? "bf16" : "f16";
}
static double tol_dt(int dt, bool elementwise) {
    return dt == MT_CU_F32 ? (elementwise ? 1e-5 : 2e-4) : dt == MT_CU_BF16 ? 3e-2 : 5e-3;
}

static unsigned rng = 1234567u;
static float frand(void) { /* uniform in [-1, 1) */
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) * (1.0 / 8388608.0)) - 1.0f;
}

/* Random host buffer of n floats scaled by amp, rounded to dt's values. */
static float *hrand(size_t n, float amp, int dt) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        h[i] = amp * frand();
    }
    float *tmp = malloc((n ? n : 1) * 4);
    mt_convert(tmp, (mt_dtype_t)dt, h, MT_F32, n);
    mt_convert(h, MT_F32, tmp, (mt_dtype_t)dt, n);
    free(tmp);
    return h;
}

static float *hcopy(const float *x, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    memcpy(h, x, n * sizeof(float));
    return h;
}

/* Device copy of n host floats stored as dt. */
static void *dup_dt(const float *h, size_t n, int dt) {
    void *d = NULL;
    size_t es = dt == MT_CU_F32 ? 4 : 2;
    CHECK_OK(mt_dev_malloc(&d, n * es, MT_MEM_OTHER, "test", NULL));
    void *tmp = malloc((n ? n : 1) * es);
    mt_convert(tmp, (mt_dtype_t)dt, h, MT_F32, n);
    CHECK(cudaMemcpy(d, tmp, n * es, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
    free(tmp);
    return d;
}

/* dup_dt's copy placed `off` elements into a buffer of n + off (*base: what to free), for pointers that are less
 * aligned than an allocation's 256 bytes, as a tensor at an odd offset of a flat parameter buffer is. */
static void *dup_dt_at(const float *h, size_t n, int dt, size_t off, void **base) {
    float *pad = calloc(n + off, sizeof(float));
    memcpy(pad + off, h, n * sizeof(float));
    *base = dup_dt(pad, n + off, dt);
    free(pad);
    return (char *)*base + off * (dt == MT_CU_F32 ? 4 : 2);
}

static void *dup_bytes(const void *h, size_t bytes) {
    void *d = NULL;
    CHECK_OK(mt_dev_malloc(&d, bytes, MT_MEM_OTHER, "test", NULL));
    CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
    return d;
}

/* Host floats of n device elements of dtype dt (waits for the device). */
static float *down(const void *d, size_t n, int dt) {
    size_t es = dt == MT_CU_F32 ? 4 : 2;
    void *tmp = malloc((n ? n : 1) * es);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "kernels ran: %s", cudaGetErrorString(cudaGetLastError()));
    CHECK(cudaMemcpy(tmp, d, n * es, cudaMemcpyDeviceToHost) == cudaSuccess, "download");
    float *h = malloc((n ? n : 1) * sizeof(float));
    mt_convert(h, MT_F32, tmp, (mt_dtype_t)dt, n);
    free(tmp);
    return h;
}

/* max |g - c| / max |c| over n (strided rows: n_rows of `cols` valid columns out of ld). */
static double rel_err(const float *g, const float *c, size_t rows, size_t cols, size_t ld) {
    double num = 0, den = 0;
    for (size_t r = 0; r < rows; r++) {
        for (size_t k = 0; k < cols; k++) {
            double a = g[r * ld + k], b = c[r * ld + k];
            if (!isfinite(a)) {
                return INFINITY;
            }
            num = fmax(num, fabs(a - b));
            den = fmax(den, fabs(b));
        }
    }
    return den > 0 ? num / den : num;
}

#define EXPECT_CLOSE(what, g, c, n, tol)                                                                               \
    do {                                                                                                               \
        double e_ = rel_err((g), (c), 1, (n), (n));                                                                    \
        CHECK(e_ <= (tol), "%s: relative error %.3e > %.1e", (what), e_, (double)(tol));                               \
        if (getenv("MT_TEST_VERBOSE")) {                                                                               \
            printf("  %-40s %.3e (tol %.1e)\n", (what), e_, (double)(tol));                                            \
        }                                                                                                              \
    } while (0)

static char label[160];
static const char *lbl(const char *op, int dt, const char *what) {
    snprintf(label, sizeof(label), "%s %s %s", op, dt_name(dt), what);
    return label;
}

/* ---------------------------------------------------------------------------------------------- */

static void test_matmul(void) {
    void *ws = NULL;
    CHECK_OK(mt_dev_malloc(&ws, 32 << 20, MT_MEM_OTHER, "cublaslt-ws", NULL));
    /* shape 1: an output width that matmul.cu splits (not a multiple of 16, over 256: columns 0-255 and 256-299
     * in two products), as the GPT-2 vocabulary's 50257 is; shape 2: the weight and the bias one element past a
     * 16-byte boundary, as at an odd offset of the flat parameter buffer (a tp shard or an MLP width that is not
     * a multiple of 8): the bias must not reach cuBLASLt's epilogue, which may assume 16 bytes (the emulator
     * fails such a product), and is added after it into an output whose row stride is not its width */
    for (int mode = 0; mode < 12; mode++) { /* f32, tf32, bf16, f16 at each shape */
        int shape = mode / 4;
        int N = (int[]){67, 37, 29}[shape], C = (int[]){96, 64, 40}[shape];
        int OC = (int[]){80, 300, 104}[shape], LDO = (int[]){88, 304, 112}[shape];
        size_t off = shape == 2; /* elements the weight and the bias sit past an allocation's start */
        int dt = mode % 4 < 2 ? MT_CU_F32 : dts[mode % 4 - 1];
        bool tf32 = mode % 4 == 1;
        double tol = tf32 ? 1e-2 : tol_dt(dt, false);
        const char *name = tf32 ? "tf32" : dt_name(dt);
        mt_cuda_ctx_t ctx;
        CHECK_OK(mt_cuda_status(mt_cuda_ctx_create(&ctx, ws, 32 << 20, tf32), "ctx"));
        float *inp = hrand((size_t)N * C, 1, dt), *w = hrand((size_t)OC * C, 0.5f, dt), *b = hrand(OC, 1, dt);
        float *out = calloc((size_t)N * LDO, 4);
        mt_matmul_forward(out, LDO, inp, w, b, N, C, OC);
        void *dw_base = NULL, *db_base = NULL, *dinp = dup_dt(inp, (size_t)N * C, dt);
        void *dw = dup_dt_at(w, (size_t)OC * C, dt, off, &dw_base), *db = dup_dt_at(b, OC, dt, off, &db_base);
        /* the output poisoned in its OC columns (each must be written) and zero, as out's, in the padding columns
         * (which must stay untouched): the check covers all LDO columns */
        float *poison = hcopy(out, (size_t)N * LDO);
        for (size_t i = 0; i < (size_t)N * LDO; i++) {
            poison[i] = (int)(i % LDO) < OC ? 777.0f : poison[i];
        }
        void *dout = dup_dt(poison, (size_t)N * LDO, dt);
        free(poison);
        CHECK_OK(mt_cuda_status(mt_cuda_matmul_forward(ctx, dout, LDO, NULL, dinp, dw, db, N, C, OC, dt, NULL), "fwd"));
        float *g = down(dout, (size_t)N * LDO, dt);
        double e = rel_err(g, out, N, LDO, LDO);
        CHECK(e <= tol, "matmul %s forward: %.3e > %.1e", name, e, tol);
        /* no bias, and the fused GELU epilogue (ldo = OC) */
        float *pre = calloc((size_t)N * OC, 4), *act = calloc((size_t)N * OC, 4);
        mt_matmul_forward(pre, OC, inp, w, b, N, C, OC);
        mt_gelu_forward(act, pre, (size_t)N * OC);
        void *dpre = dup_dt(pre, (size_t)N * OC, dt), *dact = dup_dt(pre, (size_t)N * OC, dt);
        CHECK(cudaMemset(dpre, 0, (size_t)N * OC * (dt ? 2 : 4)) == cudaSuccess, "memset");
        CHECK_OK(mt_cuda_status(mt_cuda_matmul_forward(ctx, dact, OC, dpre, dinp, dw, db, N, C, OC, dt, NULL), "gelu"));
        float *gp = down(dpre, (size_t)N * OC, dt), *ga = down(dact, (size_t)N * OC, dt);
        EXPECT_CLOSE(lbl("matmul+gelu", dt, "pre-activation"), gp, pre, (size_t)N * OC, tol);
        EXPECT_CLOSE(lbl("matmul+gelu", dt, "gelu(pre)"), ga, act, (size_t)N * OC, tol);
        /* backward, accumulating into pre-filled gradients */
        float *gout = hrand((size_t)N * LDO, 1, dt);
        float *gin = hrand((size_t)N * C, 1, dt), *gw = hrand((size_t)OC * C, 1, MT_CU_F32),
              *gb = hrand(OC, 1, MT_CU_F32);
        void *d_gout = dup_dt(gout, (size_t)N * LDO, dt), *d_gin = dup_dt(gin, (size_t)N * C, dt);
        void *d_gw = dup_dt(gw, (size_t)OC * C, MT_CU_F32), *d_gb = dup_dt(gb, OC, MT_CU_F32);
        void *scr = NULL;
        CHECK_OK(mt_dev_malloc(&scr, mt_cuda_colsum_scratch_floats(OC) * 4, MT_MEM_OTHER, "scratch", NULL));
        mt_matmul_backward(gin, gw, gb, gout, LDO, inp, w, N, C, OC);
        CHECK_OK(mt_cuda_status(
            mt_cuda_matmul_backward(ctx, d_gin, d_gw, d_gb, d_gout, LDO, dinp, dw, N, C, OC, dt, scr, NULL), "bwd"));
        float *h_gin = down(d_gin, (size_t)N * C, dt), *h_gw = down(d_gw, (size_t)OC * C, MT_CU_F32),
              *h_gb = down(d_gb, OC, MT_CU_F32);
        EXPECT_CLOSE(lbl("matmul", dt, tf32 ? "dinp (tf32)" : "dinp"), h_gin, gin, (size_t)N * C, tol);
        EXPECT_CLOSE(lbl("matmul", dt, tf32 ? "dw (tf32)" : "dw"), h_gw, gw, (size_t)OC * C, tol);
        EXPECT_CLOSE(lbl("matmul", dt, "dbias"), h_gb, gb, OC, tol_dt(MT_CU_F32, false));
        /* the overwriting variant: dinp = dout @ w over a NaN-filled buffer (which must never be read), dw and
         * dbias still accumulating */
        float *set_ref = calloc((size_t)N * C, 4), *nan_in = malloc((size_t)N * C * 4);
        float *gw2 = hcopy(gw, (size_t)OC * C), *gb2 = hcopy(gb, OC);
        for (size_t i = 0; i < (size_t)N * C; i++) {
            nan_in[i] = NAN;
        }
        mt_matmul_backward(set_ref, gw2, gb2, gout, LDO, inp, w, N, C, OC);
        void *d_set = dup_dt(nan_in, (size_t)N * C, dt);
        CHECK_OK(mt_cuda_status(
            mt_cuda_matmul_backward_set(ctx, d_set, d_gw, d_gb, d_gout, LDO, dinp, dw, N, C, OC, dt, scr, NULL),
            "bwd set"));
        float *h_set = down(d_set, (size_t)N * C, dt), *h_gw2 = down(d_gw, (size_t)OC * C, MT_CU_F32);
        EXPECT_CLOSE(lbl("matmul", dt, tf32 ? "dinp overwritten (tf32)" : "dinp overwritten"), h_set, set_ref,
                     (size_t)N * C, tol);
        EXPECT_CLOSE(lbl("matmul", dt, tf32 ? "dw after both (tf32)" : "dw after both"), h_gw2, gw2, (size_t)OC * C,
                     tol);
        mt_dev_free(d_set);
        free(set_ref), free(nan_in), free(gw2), free(gb2), free(h_set), free(h_gw2);
        mt_cuda_ctx_destroy(ctx);
        void *dev[] = {dinp, dw_base, db_base, dout, dpre, dact, d_gout, d_gin, d_gw, d_gb, scr};
        for (size_t i = 0; i < MT_ARRAY_LEN(dev); i++) {
            mt_dev_free(dev[i]);
        }
        float *host[] = {inp, w, b, out, g, pre, act, gp, ga, gout, gin, gw, gb, h_gin, h_gw, h_gb};
        for (size_t i = 0; i < MT_ARRAY_LEN(host); i++) {
            free(host[i]);
        }
    }
    mt_dev_free(ws);
}

static void test_layernorm(void) {
    /* C = 200: the fused backward (rows in registers); N = 2100: more row groups than its blocks, so warps take
     * several rows; C = 202: not a multiple of 16 bytes, the two-kernel backward */
    for (int kk = 0; kk < 9; kk++) {
        int k = kk % 3, shape = kk / 3;
        int N = shape == 1 ? 2100 : 37, C = shape == 0 ? 200 : shape == 1 ? 64 : 202;
        int dt = dts[k];
        double tol = tol_dt(dt, false);
        float *a = hrand((size_t)N * C, 2, dt), *bb = hrand((size_t)N * C, 2, dt);
        float *w = hrand(C, 1, dt), *b = hrand(C, 1, dt);
        float *out = malloc((size_t)N * C * 4), *mean = malloc(N * 4), *rstd = malloc(N * 4);
        mt_layernorm_forward(out, mean, rstd, a, w, b, N, C);
        void *da = dup_dt(a, (size_t)N * C, dt), *dbb = dup_dt(bb, (size_t)N * C, dt);
        void *dw = dup_dt(w, C, dt), *db = dup_dt(b, C, dt), *dout = NULL, *dres = NULL, *dm = NULL, *dr = NULL;
        CHECK_OK(mt_dev_malloc(&dout, (size_t)N * C * 4, MT_MEM_OTHER, "t", NULL));
        CHECK_OK(mt_dev_malloc(&dres, (size_t)N * C * 4, MT_MEM_OTHER, "t", NULL));
        CHECK_OK(mt_dev_malloc(&dm, N * 4, MT_MEM_OTHER, "t", NULL));
        CHECK_OK(mt_dev_malloc(&dr, N * 4, MT_MEM_OTHER, "t", NULL));
        CHECK_OK(mt_cuda_status(mt_cuda_layernorm_forward(dout, dm, dr, da, dw, db, N, C, dt, NULL), "ln fwd"));
        float *g = down(dout, (size_t)N * C, dt), *gm = down(dm, N, MT_CU_F32), *gr = down(dr, N, MT_CU_F32);
        EXPECT_CLOSE(lbl("layernorm", dt, "out"), g, out, (size_t)N * C, tol);
        EXPECT_CLOSE(lbl("layernorm", dt, "mean"), gm, mean, N, 2e-4);
        EXPECT_CLOSE(lbl("layernorm", dt, "rstd"), gr, rstd, N, 2e-4);
        /* fused residual: res = round(a + bb), ln(res) */
        float *res = malloc((size_t)N * C * 4);
        mt_residual_forward(res, a, bb, (size_t)N * C);
        float *tmp = malloc((size_t)N * C * 4);
        mt_convert(tmp, (mt_dtype_t)dt, res, MT_F32, (size_t)N * C);
        mt_convert(res, MT_F32, tmp, (mt_dtype_t)dt, (size_t)N * C);
        mt_layernorm_forward(out, mean, rstd, res, w, b, N, C);
        CHECK_OK(mt_cuda_status(mt_cuda_residual_layernorm_forward(dres, dout, dm, dr, da, dbb, dw, db, N, C, dt, NULL),
                                "res+ln"));
        float *gres = down(dres, (size_t)N * C, dt), *g2 = down(dout, (size_t)N * C, dt);
        CHECK(memcmp(gres, res, (size_t)N * C * 4) == 0, "fused residual %s: the sum is exact in f32 then rounded",
              dt_name(dt));
        EXPECT_CLOSE(lbl("residual+layernorm", dt, "out"), g2, out, (size_t)N * C, tol);
        /* backward from the fused forward's statistics */
        float *dy = hrand((size_t)N * C, 1, dt), *dx = hrand((size_t)N * C, 1, dt);
        float *dwr = hrand(C, 1, MT_CU_F32), *dbr = hrand(C, 1, MT_CU_F32);
        void *d_dy = dup_dt(dy, (size_t)N * C, dt), *d_dx = dup_dt(dx, (size_t)N * C, dt);
        void *d_dw = dup_dt(dwr, C, MT_CU_F32), *d_db = dup_dt(dbr, C, MT_CU_F32), *scr = NULL;
        CHECK_OK(mt_dev_malloc(&scr, mt_cuda_layernorm_scratch_floats(C) * 4, MT_MEM_OTHER, "t", NULL));
        mt_layernorm_backward(dx, dwr, dbr, dy, res, w, mean, rstd, N, C);
        CHECK_OK(mt_cuda_status(
            mt_cuda_layernorm_backward(d_dx, d_dw, d_db, d_dy, dres, dw, dm, dr, N, C, dt, scr, NULL), "ln bwd"));
        float *h_dx = down(d_dx, (size_t)N * C, dt), *h_dw = down(d_dw, C, MT_CU_F32), *h_db = down(d_db, C, MT_CU_F32);
        EXPECT_CLOSE(lbl("layernorm", dt, "dinp"), h_dx, dx, (size_t)N * C, tol);
        EXPECT_CLOSE(lbl("layernorm", dt, "dw"), h_dw, dwr, C, dt == MT_CU_F32 ? 2e-4 : tol);
        EXPECT_CLOSE(lbl("layernorm", dt, "db"), h_db, dbr, C, dt == MT_CU_F32 ? 2e-4 : tol);
        void *dev[] = {da, dbb, dw, db, dout, dres, dm, dr, d_dy, d_dx, d_dw, d_db, scr};
        for (size_t i = 0; i < MT_ARRAY_LEN(dev); i++) {
            mt_dev_free(dev[i]);
        }
        float *host[] = {a,   bb,   w,  b,  out, mean, rstd, g,    gm,   gr,  res,
                         tmp, gres, g2, dy, dx,  dwr,  dbr,  h_dx, h_dw, h_db};
        for (size_t i = 0; i < MT_ARRAY_LEN(host); i++) {
            free(host[i]);
        }
    }
}

static void test_elementwise(void) {
    enum { N = 10007 };
    for (int k = 0; k < 3; k++) {
        int dt = dts[k];
        double tol = tol_dt(dt, true);
        float *x = hrand(N, 4, dt), *y = hrand(N, 1, dt), *dy = hrand(N, 1, dt), *acc = hrand(N, 1, dt);
        float *out = malloc(N * 4), *acc2 = hcopy(acc, N), *acc3 = hcopy(acc, N);
        void *dx = dup_dt(x, N, dt), *d_y = dup_dt(y, N, dt), *d_dy = dup_dt(dy, N, dt), *dout = dup_dt(x, N, dt);
        void *d_acc = dup_dt(acc, N, dt), *d_acc2 = dup_dt(acc, N, dt);
        mt_gelu_forward(out, x, N);
        CHECK_OK(mt_cuda_status(mt_cuda_gelu_forward(dout, dx, N, dt, NULL), "gelu fwd"));
        float *g = down(dout, N, dt);
        EXPECT_CLOSE(lbl("gelu", dt, "forward"), g, out, N, dt == MT_CU_F32 ? 1e-5 : tol);
        free(g);
        mt_gelu_backward(acc2, x, dy, N);
        CHECK_OK(mt_cuda_status(mt_cuda_gelu_backward(d_acc, dx, d_dy, N, dt, NULL), "gelu bwd"));
        g = down(d_acc, N, dt);
        EXPECT_CLOSE(lbl("gelu", dt, "backward (+=)"), g, acc2, N, dt == MT_CU_F32 ? 1e-5 : tol);
        free(g);
        { /* the overwriting variant over a NaN-filled buffer */
            float *ref = calloc(N, 4), *nan_in = malloc(N * 4);
            for (int i = 0; i < N; i++) {
                nan_in[i] = NAN;
            }
            mt_gelu_backward(ref, x, dy, N);
            void *d_set = dup_dt(nan_in, N, dt);
            CHECK_OK(mt_cuda_status(mt_cuda_gelu_backward_set(d_set, dx, d_dy, N, dt, NULL), "gelu bwd set"));
            g = down(d_set, N, dt);
            EXPECT_CLOSE(lbl("gelu", dt, "backward (=)"), g, ref, N, dt == MT_CU_F32 ? 1e-5 : tol);
            mt_dev_free(d_set);
            free(g), free(ref), free(nan_in);
        }
        mt_residual_forward(out, x, y, N);
        CHECK_OK(mt_cuda_status(mt_cuda_residual_forward(dout, dx, d_y, N, dt, NULL), "res fwd"));
        g = down(dout, N, dt);
        EXPECT_CLOSE(lbl("residual", dt, "forward"), g, out, N, dt == MT_CU_F32 ? 0 : tol);
        free(g);
        mt_residual_backward(acc3, NULL, dy, N);
        CHECK_OK(mt_cuda_status(mt_cuda_residual_backward(d_acc2, NULL, d_dy, N, dt, NULL), "res bwd"));
        g = down(d_acc2, N, dt);
        EXPECT_CLOSE(lbl("residual", dt, "backward (+=)"), g, acc3, N, dt == MT_CU_F32 ? 0 : tol);
        free(g);
        void *dev[] = {dx, d_y, d_dy, dout, d_acc, d_acc2};
        for (size_t i = 0; i < MT_ARRAY_LEN(dev); i++) {
            mt_dev_free(dev[i]);
        }
        free(x), free(y), free(dy), free(acc), free(out), free(acc2), free(acc3);
    }
}

static void test_embedding(void) {
    enum { B = 3, T = 17, C = 40, V = 50 };
    int32_t tok[B * T];
    for (int i = 0; i < B * T; i++) {
        frand();
        tok[i] = (int32_t)((rng >> 8) % V);
    }
    tok[1] = tok[5] = tok[20] = 7; /* repeated ids accumulate */
    int32_t *dtok = dup_bytes(tok, sizeof(tok));
    for (int k = 0; k < 3; k++) {
        int dt = dts[k];
        float *wte = hrand((size_t)V * C, 1, dt), *wpe = hrand((size_t)T * C, 1, dt);
        float *out = malloc((size_t)B * T * C * 4);
        mt_embedding_forward(out, tok, wte, wpe, B, T, C);
        void *d_wte = dup_dt(wte, (size_t)V * C, dt), *d_wpe = dup_dt(wpe, (size_t)T * C, dt);
        void *dout = dup_dt(out, (size_t)B * T * C, dt);
        CHECK_OK(mt_cuda_status(mt_cuda_embedding_forward(dout, dtok, d_wte, d_wpe, B, T, C, dt, NULL), "emb fwd"));
        float *g = down(dout, (size_t)B * T * C, dt);
        EXPECT_CLOSE(lbl("embedding", dt, "forward"), g, out, (size_t)B * T * C, tol_dt(dt, true));
        float *dy = hrand((size_t)B * T * C, 1, dt), *gwte = hrand((size_t)V * C, 1, MT_CU_F32),
              *gwpe = hrand((size_t)T * C, 1, MT_CU_F32);
        void *d_dy = dup_dt(dy, (size_t)B * T * C, dt), *d_gwte = dup_dt(gwte, (size_t)V * C, MT_CU_F32),
             *d_gwpe = dup_dt(gwpe, (size_t)T * C, MT_CU_F32);
        mt_embedding_backward(gwte, gwpe, dy, tok, B, T, C);
        CHECK_OK(mt_cuda_status(mt_cuda_embedding_backward(d_gwte, d_gwpe, d_dy, dtok, B, T, C, dt, NULL), "emb bwd"));
        float *h1 = down(d_gwte, (size_t)V * C, MT_CU_F32), *h2 = down(d_gwpe, (size_t)T * C, MT_CU_F32);
        EXPECT_CLOSE(lbl("embedding", dt, "dwte"), h1, gwte, (size_t)V * C, 1e-5);
        EXPECT_CLOSE(lbl("embedding", dt, "dwpe"), h2, gwpe, (size_t)T * C, 1e-5);
        void *dev[] = {d_wte, d_wpe, dout, d_dy, d_gwte, d_gwpe};
        for (size_t i = 0; i < MT_ARRAY_LEN(dev); i++) {
            mt_dev_free(dev[i]);
        }
        free(wte), free(wpe), free(out), free(g), free(dy), free(gwte), free(gwpe), free(h1), free(h2);
    }
    mt_dev_free(dtok);
}

/* Head sizes 16, 64, 100 (padded to 128) and 128; T crosses several tiles and is not a multiple of any. */
static void test_attention(void) {
    static const int cases[][4] = {{2, 70, 32, 2}, {2, 150, 128, 2}, {1, 97, 200, 2}, {1, 130, 256, 2}};
    for (size_t ci = 0; ci < MT_ARRAY_LEN(cases); ci++) {
        int B = cases[ci][0], T = cases[ci][1], C = cases[ci][2], NH = cases[ci][3];
        size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nl = (size_t)B * NH * T;
        float *scratch = malloc(mt_attention_scratch_floats(T, C / NH) * 4);
        for (int k = 0; k < 3; k++) {
            int dt = dts[k];
            double tol = tol_dt(dt, false);
            char what[64];
            float *qkv = hrand(nqkv, 1.5f, dt), *out = malloc(nout * 4), *lse = malloc(nl * 4);
            float *att = malloc(nl * T * 4);
            mt_attention_forward(out, att, lse, qkv, B, T, C, NH, scratch);
            void *d_qkv = dup_dt(qkv, nqkv, dt), *d_out = NULL, *d_lse = NULL, *d_att = NULL;
            CHECK_OK(mt_dev_malloc(&d_out, nout * 4, MT_MEM_ACTIVATIONS, "t", NULL));
            CHECK_OK(mt_dev_malloc(&d_lse, nl * 4, MT_MEM_ACTIVATIONS, "t", NULL));
            CHECK_OK(mt_dev_malloc(&d_att, nl * T * 4, MT_MEM_ACTIVATIONS, "t", NULL));
            CHECK_OK(mt_cuda_status(mt_cuda_attention_forward(d_out, d_lse, d_qkv, B, T, C, NH, dt, NULL), "attn"));
            float *g = down(d_out, nout, dt), *gl = down(d_lse, nl, MT_CU_F32);
            snprintf(what, sizeof(what), "flash out hs=%d T=%d", C / NH, T);
            EXPECT_CLOSE(lbl("attention", dt, what), g, out, nout, tol);
            EXPECT_CLOSE(lbl("attention", dt, "flash lse"), gl, lse, nl, dt == MT_CU_F32 ? 1e-5 : tol);
            free(g), free(gl);
            CHECK_OK(mt_cuda_status(mt_cuda_attention_plain_forward(d_out, d_att, d_lse, d_qkv, B, T, C, NH, dt, NULL),
                                    "plain"));
            float *gp = down(d_out, nout, dt), *ga = down(d_att, nl * T, MT_CU_F32);
            EXPECT_CLOSE(lbl("attention", dt, "plain out"), gp, out, nout, tol);
            EXPECT_CLOSE(lbl("attention", dt, "plain probabilities"), ga, att, nl * T, 1e-5);
            free(gp), free(ga);
            /* backward (+=) from lse, against the CPU's recompute path */
            CHECK_OK(mt_cuda_status(mt_cuda_attention_forward(d_out, d_lse, d_qkv, B, T, C, NH, dt, NULL), "attn"));
            float *dy = hrand(nout, 1, dt), *dq = hrand(nqkv, 1, dt);
            void *d_dy = dup_dt(dy, nout, dt), *d_dq = dup_dt(dq, nqkv, dt), *scr = NULL;
            CHECK_OK(mt_dev_malloc(&scr, mt_cuda_attention_scratch_floats(B, T, NH) * 4, MT_MEM_OTHER, "t", NULL));
            /* the CPU reference runs on the GPU forward's stored out in low precision, as the kernel does */
            mt_attention_backward(dq, dy, qkv, NULL, lse, B, T, C, NH, scratch);
            CHECK_OK(mt_cuda_status(
                mt_cuda_attention_backward(d_dq, d_dy, d_qkv, d_out, d_lse, B, T, C, NH, dt, scr, NULL), "attn bwd"));
            float *gdq = down(d_dq, nqkv, dt);
            snprintf(what, sizeof(what), "dqkv hs=%d T=%d", C / NH, T);
            EXPECT_CLOSE(lbl("attention", dt, what), gdq, dq, nqkv, dt == MT_CU_F32 ? 2e-4 : 2 * tol);
            void *dev[] = {d_qkv, d_out, d_lse, d_att, d_dy, d_dq, scr};
            for (size_t i = 0; i < MT_ARRAY_LEN(dev); i++) {
                mt_dev_free(dev[i]);
            }
            free(qkv), free(out), free(lse), free(att), free(dy), free(dq), free(gdq);
        }
        free(scratch);
    }
}

/* The tensor-core kernels (bf16/f16; forward for head sizes that are multiples of 16 up to 128, backward up to
 * 64) against the CPU and against the CUDA-core kernels on the same inputs, with mt_cuda_attention_set_tc
 * forcing each path and the launch counters showing which one ran. T = 70 is not a multiple of the 64-row
 * blocks nor of the key tiles (64 keys for head sizes 32/64, 32 for 128). Tolerances (relative to
 * max |reference|), tighter than the file's generic ones because these cases are small and fixed: out and
 * dqkv bf16 1.5e-2, f16 2.5e-3 (outputs are stored in the dtype, whose rounding alone is up to 2^-9 resp.
 * 2^-12 of the largest value, and P and dS are rounded to it before their products); lse 2e-3 for both
 * (scores are f32 sums of products of the stored inputs; lse moves only by the rounding of the summed
 * probabilities); the two device paths against each other at the same tolerances. */
static void attn_tc_case(int B, int T, int C, int NH, int dt, bool misalign) {
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nl = (size_t)B * NH * T;
    int hs = C / NH;
    double tol = dt == MT_CU_BF16 ? 1.5e-2 : 2.5e-3, tol_lse = 2e-3, tol_bwd = tol;
    char what[96];
    float *scratch = malloc(mt_attention_scratch_floats(T, C / NH) * 4);
    float *qkv = hrand(nqkv, 1.5f, dt), *out = malloc(nout * 4), *lse = malloc(nl * 4), *att = malloc(nl * T * 4);
    mt_attention_forward(out, att, lse, qkv, B, T, C, NH, scratch);
    float *dy = hrand(nout, 1, dt), *dq0 = hrand(nqkv, 1, dt), *dq = hcopy(dq0, nqkv);
    mt_attention_backward(dq, dy, qkv, NULL, lse, B, T, C, NH, scratch);
    /* misalign: qkv one element past a 16-byte boundary, so the kernels take their element-wise loads */
    float *qkv1 = malloc((nqkv + 1) * 4);
    qkv1[0] = 0.0f;
    memcpy(qkv1 + 1, qkv, nqkv * 4);
    void *d_buf = misalign ? dup_dt(qkv1, nqkv + 1, dt) : dup_dt(qkv, nqkv, dt), *d_out = NULL, *d_lse = NULL;
    void *d_qkv = misalign ? (char *)d_buf + 2 : d_buf, *d_dy = dup_dt(dy, nout, dt), *d_scr = NULL;
    CHECK_OK(mt_dev_malloc(&d_out, nout * 2, MT_MEM_ACTIVATIONS, "t", NULL));
    CHECK_OK(mt_dev_malloc(&d_lse, nl * 4, MT_MEM_ACTIVATIONS, "t", NULL));
    CHECK_OK(mt_dev_malloc(&d_scr, mt_cuda_attention_scratch_floats(B, T, NH) * 4, MT_MEM_OTHER, "t", NULL));
    /* mode 1: the tensor-core path (the mma.sync kernels where they apply, which is every aligned case here but
     * the backward at head size 128), 2: its WMMA kernels, 0: CUDA cores */
    float *g[3], *gl[3], *gd[3];
    const char *path[3] = {"cuda-core", "tensor-core", "tensor-core wmma"};
    static const int modes[3] = {1, 2, 0};
    for (int mi = 0; mi < 3; mi++) {
        int mode = modes[mi], tc = mode != 0;
        mt_cuda_attention_set_tc(mode);
        int tc_bwd = tc && hs <= 64, mma_f = mode == 1 && !misalign, mma_b = mma_f && tc_bwd;
        CHECK(mt_cuda_attention_tc_path(dt, hs, 0) == tc && mt_cuda_attention_tc_path(dt, hs, 1) == tc_bwd,
              "%s hs=%d: forced %d selects forward %d, backward %d", dt_name(dt), hs, mode, tc, tc_bwd);
        unsigned long nf = mt_cuda_attention_tc_launches(0), nb = mt_cuda_attention_tc_launches(1);
        unsigned long mf = mt_cuda_attention_mma_launches(0), mb = mt_cuda_attention_mma_launches(1);
        CHECK_OK(mt_cuda_status(mt_cuda_attention_forward(d_out, d_lse, d_qkv, B, T, C, NH, dt, NULL), "attn"));
        CHECK(mt_cuda_attention_tc_launches(0) == nf + (unsigned long)tc &&
                  mt_cuda_attention_mma_launches(0) == mf + (unsigned long)mma_f,
              "%s hs=%d mode %d: the %s forward ran (mma.sync: %d)", dt_name(dt), hs, mode, path[mode], mma_f);
        g[mode] = down(d_out, nout, dt);
        gl[mode] = down(d_lse, nl, MT_CU_F32);
        snprintf(what, sizeof(what), "%s%s out hs=%d T=%d%s", path[mode], mma_f ? " mma" : "", hs, T,
                 misalign ? " misaligned" : "");
        EXPECT_CLOSE(lbl("attention", dt, what), g[mode], out, nout, tol);
        snprintf(what, sizeof(what), "%s lse hs=%d T=%d", path[mode], hs, T);
        EXPECT_CLOSE(lbl("attention", dt, what), gl[mode], lse, nl, tol_lse);
        /* backward (+=, into a pre-filled gradient) from this forward's out and lse */
        void *d_dq = dup_dt(dq0, nqkv, dt);
        CHECK_OK(mt_cuda_status(
            mt_cuda_attention_backward(d_dq, d_dy, d_qkv, d_out, d_lse, B, T, C, NH, dt, d_scr, NULL), "attn bwd"));
        CHECK(mt_cuda_attention_tc_launches(1) == nb + (unsigned long)tc_bwd &&
                  mt_cuda_attention_mma_launches(1) == mb + (unsigned long)mma_b,
              "%s hs=%d mode %d: the %s backward ran (mma.sync: %d)", dt_name(dt), hs, mode, path[tc_bwd ? mode : 0],
              mma_b);
        gd[mode] = down(d_dq, nqkv, dt);
        snprintf(what, sizeof(what), "%s%s dqkv hs=%d T=%d%s", path[tc_bwd ? mode : 0], mma_b ? " mma" : "", hs, T,
                 misalign ? " misaligned" : "");
        EXPECT_CLOSE(lbl("attention", dt, what), gd[mode], dq, nqkv, tol_bwd);
        mt_dev_free(d_dq);
    }
    for (int mode = 1; mode < 3; mode++) {
        snprintf(what, sizeof(what), "%s vs cuda-core out hs=%d", path[mode], hs);
        EXPECT_CLOSE(lbl("attention", dt, what), g[mode], g[0], nout, tol);
        snprintf(what, sizeof(what), "%s vs cuda-core dqkv hs=%d", path[mode], hs);
        EXPECT_CLOSE(lbl("attention", dt, what), gd[mode], gd[0], nqkv, tol_bwd);
    }
    mt_cuda_attention_set_tc(-1);
    void *dev[] = {d_buf, d_out, d_lse, d_dy, d_scr};
    for (size_t i = 0; i < MT_ARRAY_LEN(dev); i++) {
        mt_dev_free(dev[i]);
    }
    float *host[] = {scratch, qkv,  qkv1, out,   lse,   att,   dy,    dq0,   dq,
                     g[0],    g[1], g[2], gl[0], gl[1], gl[2], gd[0], gd[1], gd[2]};
    for (size_t i = 0; i < MT_ARRAY_LEN(host); i++) {
        free(host[i]);
    }
}

static void test_attention_tc(void) {
    static const int cases[][4] = {{1, 70, 64, 2}, {2, 70, 128, 2}, {1, 70, 128, 1}}; /* hs 32, 64, 128 */
    for (size_t ci = 0; ci < MT_ARRAY_LEN(cases); ci++) {
        for (int k = 1; k < 3; k++) {
            attn_tc_case(cases[ci][0], cases[ci][1], cases[ci][2], cases[ci][3], dts[k], false);
        }
    }
    attn_tc_case(1, 70, 64, 2, MT_CU_BF16, true);
    /* T = 200: four tiles per row block, so the double-buffered kernels alternate their buffers several times */
    attn_tc_case(1, 200, 128, 2, MT_CU_BF16, false);
    /* f32 storage and head sizes that are not multiples of 16 stay on CUDA cores even when forced */
    mt_cuda_attention_set_tc(1);
    for (int bwd = 0; bwd < 2; bwd++) {
        CHECK(mt_cuda_attention_tc_path(MT_CU_BF16, 64, bwd) == 1 && mt_cuda_attention_tc_path(MT_CU_F16, 16, bwd) == 1,
              "bf16 hs=64 and f16 hs=16 are eligible (backward %d)", bwd);
        CHECK(mt_cuda_attention_tc_path(MT_CU_F32, 64, bwd) == 0, "f32 attention is not on the tensor-core path");
        CHECK(mt_cuda_attention_tc_path(MT_CU_BF16, 100, bwd) == 0 &&
                  mt_cuda_attention_tc_path(MT_CU_BF16, 24, bwd) == 0,
              "head sizes not a multiple of 16 are not on the tensor-core path");
    }
    CHECK(mt_cuda_attention_tc_path(MT_CU_BF16, 128, 0) == 1 && mt_cuda_attention_tc_path(MT_CU_BF16, 128, 1) == 0,
          "head size 128: tensor-core forward, CUDA-core backward");
    mt_cuda_attention_set_tc(-1);
}

/* MESHTRAIN_ATTN_TC=0 (set before the knob is first read) turns the tensor-core path off: the selection says
 * CUDA cores for bf16 hs=64, a forward runs without the tensor-core kernel and still matches the CPU; the
 * process override still wins over the knob. */
/* A value of the knob outside 0/1/2 is warned about and read as the default, 1 (its own process: the knob is read
 * once). */
static void test_attention_knob_bad(void) {
    setenv("MESHTRAIN_ATTN_TC", "7", 1);
    CHECK(mt_cuda_attn_tc_param() == 1, "MESHTRAIN_ATTN_TC=7 is read as the default, 1");
    CHECK(mt_cuda_attention_tc_path(MT_CU_BF16, 64, 0) == 1, "MESHTRAIN_ATTN_TC=7: bf16 hs=64 on tensor cores");
}

static void test_attention_knob(void) {
    setenv("MESHTRAIN_ATTN_TC", "0", 1);
    CHECK(mt_cuda_attn_tc_param() == 0, "MESHTRAIN_ATTN_TC=0 is read as off");
    CHECK(mt_cuda_attention_tc_path(MT_CU_BF16, 64, 0) == 0 && mt_cuda_attention_tc_path(MT_CU_BF16, 64, 1) == 0,
          "knob off: bf16 hs=64 on CUDA cores");
    enum { B = 1, T = 40, C = 128, NH = 2 };
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *scratch = malloc(mt_attention_scratch_floats(T, C / NH) * 4);
    float *qkv = hrand(nqkv, 1.5f, MT_CU_BF16), *out = malloc(nout * 4), *lse = malloc(nl * 4);
    float *att = malloc(nl * T * 4);
    mt_attention_forward(out, att, lse, qkv, B, T, C, NH, scratch);
    void *d_qkv = dup_dt(qkv, nqkv, MT_CU_BF16), *d_out = NULL, *d_lse = NULL;
    CHECK_OK(mt_dev_malloc(&d_out, nout * 2, MT_MEM_ACTIVATIONS, "t", NULL));
    CHECK_OK(mt_dev_malloc(&d_lse, nl * 4, MT_MEM_ACTIVATIONS, "t", NULL));
    CHECK_OK(mt_cuda_status(mt_cuda_attention_forward(d_out, d_lse, d_qkv, B, T, C, NH, MT_CU_BF16, NULL), "attn"));
    CHECK(mt_cuda_attention_tc_launches(0) == 0, "knob off: no tensor-core launch");
    float *g = down(d_out, nout, MT_CU_BF16);
    EXPECT_CLOSE("attention bf16 knob off out", g, out, nout, tol_dt(MT_CU_BF16, false));
    mt_cuda_attention_set_tc(1);
    CHECK(mt_cuda_attention_tc_path(MT_CU_BF16, 64, 0) == 1, "the process override wins over the knob");
    CHECK_OK(mt_cuda_status(mt_cuda_attention_forward(d_out, d_lse, d_qkv, B, T, C, NH, MT_CU_BF16, NULL), "attn"));
    CHECK(mt_cuda_attention_tc_launches(0) == 1, "override on: one tensor-core launch");
    mt_cuda_attention_set_tc(-1);
    CHECK(mt_cuda_attention_tc_path(MT_CU_BF16, 64, 0) == 0, "back to the knob: off");
    mt_dev_free(d_qkv), mt_dev_free(d_out), mt_dev_free(d_lse);
    free(scratch), free(qkv), free(out), free(lse), free(att), free(g);
}

/* The device cross-entropy's losses, lse, mean and n_valid (what mt_cuda_softmax_ce_forward leaves) against the
 * CPU's, with want_nv non-ignored rows. */
static void ce_forward_matches(const char *op, int dt, int N, const void *d_losses, const void *d_lse,
                               const void *d_mean, const void *d_nv, const float *losses, const float *lse, float mean,
                               int nv, int want_nv) {
    float *gl = down(d_losses, N, MT_CU_F32), *gz = down(d_lse, N, MT_CU_F32), *gm = down(d_mean, 1, MT_CU_F32);
    int gnv = 0;
    CHECK(cudaMemcpy(&gnv, d_nv, 4, cudaMemcpyDeviceToHost) == cudaSuccess, "n_valid");
    EXPECT_CLOSE(lbl(op, dt, "losses"), gl, losses, N, 1e-5);
    EXPECT_CLOSE(lbl(op, dt, "lse"), gz, lse, N, 1e-5);
    CHECK(gnv == nv && nv == want_nv, "%s: n_valid %d (cpu %d, want %d)", op, gnv, nv, want_nv);
    CHECK_CLOSE(gm[0], mean, 1e-5, 0);
    free(gl), free(gz), free(gm);
}

static void test_softmax_ce(void) {
    /* V = 1001: the 16-byte path (padded width 1024) with a forward tail of V mod 8 columns; padded width 1003:
     * the element path */
    enum { N = 13, V = 1001 };
    int32_t tgt[N];
    for (int i = 0; i < N; i++) {
        tgt[i] = (int32_t)(((unsigned)(i * 7919 + 11)) % V);
    }
    tgt[3] = tgt[9] = -1;
    tgt[5] = V - 1; /* the last real column, in the forward's tail */
    int32_t *dtgt = dup_bytes(tgt, sizeof(tgt));
    for (int kk = 0; kk < 6; kk++) {
        int dt = dts[kk % 3], VP = kk < 3 ? 1024 : 1003;
        float *logits = hrand((size_t)N * VP, 6, dt), *losses = malloc(N * 4), *lse = malloc(N * 4), mean = 0;
        int nv = mt_softmax_ce_forward(losses, lse, &mean, logits, tgt, N, V, VP);
        void *d_logits = dup_dt(logits, (size_t)N * VP, dt), *d_losses = NULL, *d_lse = NULL, *d_mean = NULL,
             *d_nv = NULL;
        CHECK_OK(mt_dev_malloc(&d_losses, N * 4, MT_MEM_OTHER, "t", NULL));
        CHECK_OK(mt_dev_malloc(&d_lse, N * 4, MT_MEM_OTHER, "t", NULL));
        CHECK_OK(mt_dev_malloc(&d_mean, 4, MT_MEM_OTHER, "t", NULL));
        CHECK_OK(mt_dev_malloc(&d_nv, 4, MT_MEM_OTHER, "t", NULL));
        CHECK_OK(mt_cuda_status(
            mt_cuda_softmax_ce_forward(d_losses, d_lse, d_mean, d_nv, d_logits, dtgt, N, V, VP, dt, NULL), "ce"));
        ce_forward_matches("softmax_ce", dt, N, d_losses, d_lse, d_mean, d_nv, losses, lse, mean, nv, N - 2);
        /* backward in place, scale / n_valid read on the device */
        float *dl = hcopy(logits, (size_t)N * VP);
        mt_softmax_ce_backward(dl, dl, lse, tgt, N, V, VP, 0.5f / nv);
        CHECK_OK(mt_cuda_status(
            mt_cuda_softmax_ce_backward(d_logits, d_logits, d_lse, dtgt, d_nv, N, V, VP, 0.5f, dt, NULL), "ce bwd"));
        float *gd = down(d_logits, (size_t)N * VP, dt);
        EXPECT_CLOSE(lbl("softmax_ce", dt, "dlogits (in place)"), gd, dl, (size_t)N * VP,
                     dt == MT_CU_F32 ? 1e-5 : tol_dt(dt, true));
        bool pad_zero = true;
        for (int r = 0; r < N; r++) {
            for (int v = V; v < VP; v++) {
                pad_zero &= gd[(size_t)r * VP + v] == 0.0f;
            }
        }
        CHECK(pad_zero, "padded vocabulary columns get zero gradient");
        void *dev[] = {d_logits, d_losses, d_lse, d_mean, d_nv};
        for (size_t i = 0; i < MT_ARRAY_LEN(dev); i++) {
            mt_dev_free(dev[i]);
        }
        free(logits), free(losses), free(lse), free(dl), free(gd);
    }
    mt_dev_free(dtgt);
}

/* Vocabulary-parallel (tensor-parallel) embedding and cross-entropy: the whole vocabulary cut into P shards of
 * Vl rows (the last holding padding; with V = 30, P = 4 the last holds no real column), each shard's kernels on
 * its own rows, combined as the tp group does (the embedding's outputs summed, wpe given to shard 0 only; the
 * cross-entropy's parts merged by mt_cuda_softmax_ce_combine), against the whole-vocabulary CPU operation. */
static void test_vocab_parallel(void) {
    enum { B = 2, T = 9, C = 24, N = B * T, VP = 48 };
    static const struct {
        int V, P;
    } cuts[] = {{45, 3}, {30, 4}};
    int32_t tok[N], tgt[N];
    for (size_t ci = 0; ci < MT_ARRAY_LEN(cuts); ci++) {
        int V = cuts[ci].V, P = cuts[ci].P, Vl = VP / P;
        for (int i = 0; i < N; i++) {
            frand();
            tok[i] = (int32_t)((rng >> 8) % (unsigned)V);
            tgt[i] = (int32_t)((rng >> 12) % (unsigned)V);
        }
        tgt[4] = -1;
        tgt[7] = V - 1;
        int32_t *dtok = dup_bytes(tok, sizeof(tok)), *dtgt = dup_bytes(tgt, sizeof(tgt));
        for (int k = 0; k < 3; k++) {
            int dt = dts[k];
            /* embedding: the shards' outputs sum to the whole lookup, their gradients are its rows */
            float *wte = hrand((size_t)VP * C, 1, dt), *wpe = hrand((size_t)T * C, 1, dt), *ref = malloc(N * C * 4);
            float *sum = calloc((size_t)N * C, 4), *dy = hrand((size_t)N * C, 1, dt);
            float *gwte = calloc((size_t)VP * C, 4), *gwpe = calloc((size_t)T * C, 4);
            mt_embedding_forward(ref, tok, wte, wpe, B, T, C);
            mt_embedding_backward(gwte, gwpe, dy, tok, B, T, C);
            void *d_wpe = dup_dt(wpe, (size_t)T * C, dt), *d_dy = dup_dt(dy, (size_t)N * C, dt), *d_out = NULL;
            CHECK_OK(mt_dev_malloc(&d_out, (size_t)N * C * 4, MT_MEM_OTHER, "t", NULL));
            bool others_zero = true;
            for (int p = 0; p < P; p++) {
                void *d_w = dup_dt(wte + (size_t)p * Vl * C, (size_t)Vl * C, dt);
                CHECK_OK(mt_cuda_status(mt_cuda_embedding_forward_shard(d_out, dtok, d_w, p == 0 ? d_wpe : NULL,
                                                                        p * Vl, Vl, B, T, C, dt, NULL),
                                        "emb shard fwd"));
                float *g = down(d_out, (size_t)N * C, dt);
                for (int n = 0; n < N; n++) {
                    bool mine = tok[n] >= p * Vl && tok[n] < (p + 1) * Vl;
                    for (int c = 0; c < C; c++) {
                        sum[n * C + c] += g[n * C + c];
                        /* another shard's token: a zero row, plus wpe on shard 0 (exact: wpe is of dt's values) */
                        float want = p == 0 ? wpe[(size_t)(n % T) * C + c] : 0.0f;
                        others_zero &= mine || g[n * C + c] == want;
                    }
                }
                float *dw = calloc((size_t)Vl * C, 4), *dp = calloc((size_t)T * C, 4);
                void *d_dw = dup_dt(dw, (size_t)Vl * C, MT_CU_F32), *d_dp = dup_dt(dp, (size_t)T * C, MT_CU_F32);
                CHECK_OK(mt_cuda_status(mt_cuda_embedding_backward_shard(d_dw, d_dp, d_dy, dtok, p * Vl, Vl, B, T, C,
                                                                         dt, NULL),
                                        "emb shard bwd"));
                float *h1 = down(d_dw, (size_t)Vl * C, MT_CU_F32), *h2 = down(d_dp, (size_t)T * C, MT_CU_F32);
                EXPECT_CLOSE(lbl("vocab-parallel embedding", dt, "dwte shard"), h1, gwte + (size_t)p * Vl * C,
                             (size_t)Vl * C, 1e-5);
                EXPECT_CLOSE(lbl("vocab-parallel embedding", dt, "dwpe"), h2, gwpe, (size_t)T * C, 1e-5);
                mt_dev_free(d_w), mt_dev_free(d_dw), mt_dev_free(d_dp);
                free(g), free(dw), free(dp), free(h1), free(h2);
            }
            CHECK(others_zero, "V %d, P %d, %s: a shard wrote more than wpe (shard 0) or zero for a token it does not "
                  "hold", V, P, dt_name(dt));
            EXPECT_CLOSE(lbl("vocab-parallel embedding", dt, "sum of shards"), sum, ref, (size_t)N * C,
                         tol_dt(dt, true));
            mt_dev_free(d_wpe), mt_dev_free(d_dy), mt_dev_free(d_out);
            free(wte), free(wpe), free(ref), free(sum), free(dy), free(gwte), free(gwpe);
            /* cross-entropy: the parts merged into the whole vocabulary's losses, lse and mean; each shard's
             * gradient the whole gradient's columns */
            float *logits = hrand((size_t)N * VP, 6, dt), *losses = malloc(N * 4), *lse = malloc(N * 4), mean = 0;
            int nv = mt_softmax_ce_forward(losses, lse, &mean, logits, tgt, N, V, VP);
            float *dl = hcopy(logits, (size_t)N * VP);
            mt_softmax_ce_backward(dl, dl, lse, tgt, N, V, VP, 0.5f / nv);
            void *d_parts = NULL, *d_losses = NULL, *d_lse = NULL, *d_mean = NULL, *d_nv = NULL;
            CHECK_OK(mt_dev_malloc(&d_parts, (size_t)P * N * 3 * 4, MT_MEM_OTHER, "t", NULL));
            CHECK_OK(mt_dev_malloc(&d_losses, N * 4, MT_MEM_OTHER, "t", NULL));
            CHECK_OK(mt_dev_malloc(&d_lse, N * 4, MT_MEM_OTHER, "t", NULL));
            CHECK_OK(mt_dev_malloc(&d_mean, 4, MT_MEM_OTHER, "t", NULL));
            CHECK_OK(mt_dev_malloc(&d_nv, 4, MT_MEM_OTHER, "t", NULL));
            void *d_sh[8];
            float *shard = malloc((size_t)N * Vl * 4);
            for (int p = 0; p < P; p++) {
                for (int n = 0; n < N; n++) {
                    memcpy(shard + (size_t)n * Vl, logits + (size_t)n * VP + (size_t)p * Vl, (size_t)Vl * 4);
                }
                int Vr = MT_MAX(0, MT_MIN(Vl, V - p * Vl));
                d_sh[p] = dup_dt(shard, (size_t)N * Vl, dt);
                CHECK_OK(mt_cuda_status(mt_cuda_softmax_ce_partial((float *)d_parts + (size_t)p * N * 3, d_sh[p], dtgt,
                                                                   p * Vl, N, Vr, Vl, dt, NULL),
                                        "ce partial"));
            }
            cudaError_t ce = mt_cuda_softmax_ce_combine(d_losses, d_lse, d_mean, d_nv, d_parts, P, dtgt, N, NULL);
            CHECK_OK(mt_cuda_status(ce, "ce combine"));
            ce_forward_matches("vocab-parallel ce", dt, N, d_losses, d_lse, d_mean, d_nv, losses, lse, mean, nv, N - 1);
            for (int p = 0; p < P; p++) {
                int Vr = MT_MAX(0, MT_MIN(Vl, V - p * Vl));
                CHECK_OK(mt_cuda_status(mt_cuda_softmax_ce_backward_shard(d_sh[p], d_sh[p], d_lse, dtgt, d_nv, p * Vl,
                                                                          N, Vr, Vl, 0.5f, dt, NULL),
                                        "ce shard bwd"));
                float *gd = down(d_sh[p], (size_t)N * Vl, dt);
                for (int n = 0; n < N; n++) {
                    memcpy(shard + (size_t)n * Vl, dl + (size_t)n * VP + (size_t)p * Vl, (size_t)Vl * 4);
                }
                char what[64];
                snprintf(what, sizeof(what), "dlogits shard %d of %d (V %d)", p, P, V);
                EXPECT_CLOSE(lbl("vocab-parallel ce", dt, what), gd, shard, (size_t)N * Vl,
                             dt == MT_CU_F32 ? 1e-5 : tol_dt(dt, true));
                free(gd);
                mt_dev_free(d_sh[p]);
            }
            void *dev[] = {d_parts, d_losses, d_lse, d_mean, d_nv};
            for (size_t i = 0; i < MT_ARRAY_LEN(dev); i++) {
                mt_dev_free(dev[i]);
            }
            free(logits), free(losses), free(lse), free(dl), free(shard);
        }
        mt_dev_free(dtok), mt_dev_free(dtgt);
    }
}

/* The fused SGD (mt_cuda_sgd) against mt_sgd_update: with momentum over 3 steps (the first sets the buffer) and
 * L2 weight decay, its fp16 compute copy the rounded master; plain SGD without a buffer; a skipped step changes
 * nothing. (Part of the "adamw" family: the optimizer kernels.) */
static void test_sgd(void) {
    enum { N = 10000 };
    for (int with_m = 0; with_m < 2; with_m++) {
        float mu = with_m ? 0.9f : 0.0f;
        float *p = hrand(N, 1, MT_CU_F32), *buf = with_m ? calloc(N, 4) : NULL;
        void *dp = dup_dt(p, N, MT_CU_F32), *dbuf = with_m ? dup_dt(buf, N, MT_CU_F32) : NULL, *dlow = NULL;
        CHECK_OK(mt_dev_malloc(&dlow, N * 2, MT_MEM_OTHER, "t", NULL));
        float coef = 0.75f;
        int skip = 0;
        void *dcoef = dup_bytes(&coef, 4), *dskip = dup_bytes(&skip, 4);
        for (int t = 1; t <= 3; t++) {
            float *g = hrand(N, 1, MT_CU_F32);
            void *dg = dup_dt(g, N, MT_CU_F32);
            mt_sgd_update(p, g, buf, N, 0.05f, mu, 0.1f, t == 1, 0.5f * coef);
            CHECK_OK(mt_cuda_status(mt_cuda_sgd(dp, dg, dbuf, N, 0.05f, mu, 0.1f, t == 1, 0.5f, dcoef, dskip, dlow,
                                                MT_CU_F16, NULL),
                                    "sgd"));
            mt_dev_free(dg);
            free(g);
        }
        float *gp = down(dp, N, MT_CU_F32), *gl = down(dlow, N, MT_CU_F16);
        EXPECT_CLOSE(with_m ? "sgd (momentum) params" : "sgd params", gp, p, N, 1e-6);
        if (with_m) {
            float *gb = down(dbuf, N, MT_CU_F32);
            EXPECT_CLOSE("sgd momentum buffer", gb, buf, N, 1e-6);
            free(gb);
        }
        bool low_ok = true;
        for (int i = 0; i < N; i++) {
            low_ok &= gl[i] == mt_f16_to_f32(mt_f32_to_f16(gp[i]));
        }
        CHECK(low_ok, "sgd: the fp16 copy is the rounded master");
        skip = 1;
        CHECK(cudaMemcpy(dskip, &skip, 4, cudaMemcpyHostToDevice) == cudaSuccess, "skip");
        void *dg = dup_dt(p, N, MT_CU_F32);
        CHECK_OK(mt_cuda_status(mt_cuda_sgd(dp, dg, dbuf, N, 0.05f, mu, 0.1f, false, 1.0f, NULL, dskip, NULL, 0, NULL),
                                "sgd"));
        float *gp2 = down(dp, N, MT_CU_F32);
        CHECK(memcmp(gp, gp2, N * 4) == 0, "sgd: a skipped step leaves the parameters bit-identical");
        void *dev[] = {dp, dbuf, dlow, dcoef, dskip, dg};
        for (size_t i = 0; i < MT_ARRAY_LEN(dev); i++) {
            mt_dev_free(dev[i]);
        }
        free(p), free(buf), free(gp), free(gl), free(gp2);
    }
}

static void test_adamw(void) {
    enum { N = 10000 };
    float *p = hrand(N, 1, MT_CU_F32), *m = calloc(N, 4), *v = calloc(N, 4);
    void *dp = dup_dt(p, N, MT_CU_F32), *dm = dup_dt(m, N, MT_CU_F32), *dv = dup_dt(v, N, MT_CU_F32);
    void *dlow = NULL, *dcoef = NULL, *dskip = NULL;
    CHECK_OK(mt_dev_malloc(&dlow, N * 2, MT_MEM_OTHER, "t", NULL));
    float coef = 0.75f;
    int skip = 0;
    dcoef = dup_bytes(&coef, 4);
    dskip = dup_bytes(&skip, 4);
    for (int t = 1; t <= 3; t++) {
        float *g = hrand(N, 1, MT_CU_F32);
        void *dg = dup_dt(g, N, MT_CU_F32);
        mt_adamw_update(p, g, m, v, N, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f * coef);
        CHECK_OK(mt_cuda_status(mt_cuda_adamw(dp, dg, dm, dv, N, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f, dcoef, dskip,
                                              dlow, MT_CU_BF16, NULL),
                                "adamw"));
        mt_dev_free(dg);
        free(g);
    }
    float *gp = down(dp, N, MT_CU_F32), *gm = down(dm, N, MT_CU_F32), *gv = down(dv, N, MT_CU_F32);
    float *gl = down(dlow, N, MT_CU_BF16);
    EXPECT_CLOSE("adamw params", gp, p, N, 1e-6);
    EXPECT_CLOSE("adamw m", gm, m, N, 1e-6);
    EXPECT_CLOSE("adamw v", gv, v, N, 1e-6);
    bool low_ok = true;
    for (int i = 0; i < N; i++) {
        low_ok &= gl[i] == mt_bf16_to_f32(mt_f32_to_bf16(gp[i]));
    }
    CHECK(low_ok, "the bf16 copy is the rounded master");
    /* skip flag set on the device: nothing changes */
    skip = 1;
    CHECK(cudaMemcpy(dskip, &skip, 4, cudaMemcpyHostToDevice) == cudaSuccess, "skip");
    void *dg = dup_dt(p, N, MT_CU_F32);
    CHECK_OK(mt_cuda_status(
        mt_cuda_adamw(dp, dg, dm, dv, N, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 4, 1.0f, NULL, dskip, NULL, 0, NULL),
        "adamw"));
    float *gp2 = down(dp, N, MT_CU_F32);
    CHECK(memcmp(gp, gp2, N * 4) == 0, "a skipped step leaves the parameters bit-identical");
    void *dev[] = {dp, dm, dv, dlow, dcoef, dskip, dg};
    for (size_t i = 0; i < MT_ARRAY_LEN(dev); i++) {
        mt_dev_free(dev[i]);
    }
    free(p), free(m), free(v), free(gp), free(gm), free(gv), free(gl), free(gp2);
    test_sgd();
}

/* Column sums (the bias gradient) over more rows than the kernel's 64 x 8 row lanes, so each thread sums
 * several rows: 16-byte path (width and row stride multiples of the vector) and element path (width 42). */
static void test_colsum(void) {
    enum { N = 1100 };
    for (int kk = 0; kk < 6; kk++) {
        int dt = dts[kk % 3], OC = kk < 3 ? 40 : 42, LD = kk < 3 ? 48 : 42;
        float *x = hrand((size_t)N * LD, 1, dt), *ref = hrand(OC, 1, MT_CU_F32);
        void *dx = dup_dt(x, (size_t)N * LD, dt), *dref = dup_dt(ref, OC, MT_CU_F32), *scr = NULL;
        CHECK_OK(mt_dev_malloc(&scr, mt_cuda_colsum_scratch_floats(OC) * 4, MT_MEM_OTHER, "t", NULL));
        for (int c = 0; c < OC; c++) {
            double a = ref[c];
            for (int n = 0; n < N; n++) {
                a += x[(size_t)n * LD + c];
            }
            ref[c] = (float)a;
        }
        CHECK_OK(mt_cuda_status(mt_cuda_colsum(dref, dx, LD, N, OC, dt, scr, NULL), "colsum"));
        float *g = down(dref, OC, MT_CU_F32);
        snprintf(label, sizeof(label), "colsum %s width %d (+=)", dt_name(dt), OC);
        EXPECT_CLOSE(label, g, ref, OC, 1e-5);
        void *dev[] = {dx, dref, scr};
        for (size_t i = 0; i < MT_ARRAY_LEN(dev); i++) {
            mt_dev_free(dev[i]);
        }
        free(x), free(ref), free(g);
    }
}

static void test_reduce(void) {
    test_colsum();
    enum { N = 300001 };
    float *x = hrand(N, 3, MT_CU_F32);
    void *dx = dup_dt(x, N, MT_CU_F32), *dsum = NULL, *dscr = NULL, *dflag = NULL, *dcoef = NULL, *dnorm = NULL;
    CHECK_OK(mt_dev_malloc(&dsum, 8, MT_MEM_OTHER, "t", NULL));
    CHECK_OK(mt_dev_malloc(&dscr, mt_cuda_sumsq_scratch_doubles() * 8, MT_MEM_OTHER, "t", NULL));
    CHECK_OK(mt_dev_malloc(&dflag, 4, MT_MEM_OTHER, "t", NULL));
    CHECK_OK(mt_dev_malloc(&dcoef, 4, MT_MEM_OTHER, "t", NULL));
    CHECK_OK(mt_dev_malloc(&dnorm, 4, MT_MEM_OTHER, "t", NULL));
    CHECK_OK(mt_cuda_status(mt_cuda_sumsq(dsum, dx, N, dscr, NULL), "sumsq"));
    double s1 = 0, s2 = 0;
    CHECK(cudaMemcpy(&s1, dsum, 8, cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
    CHECK_OK(mt_cuda_status(mt_cuda_sumsq(dsum, dx, N, dscr, NULL), "sumsq"));
    CHECK(cudaMemcpy(&s2, dsum, 8, cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
    CHECK_CLOSE(s1, mt_clip_sumsq(x, N), 1e-12, 0);
    CHECK(s1 == s2, "sum of squares is deterministic");
    CHECK_OK(mt_cuda_status(mt_cuda_clip_coef(dcoef, dnorm, dsum, 1.0f, 0.25f, NULL), "clip"));
    float coef = 0, norm = 0;
    CHECK(cudaMemcpy(&coef, dcoef, 4, cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
    CHECK(cudaMemcpy(&norm, dnorm, 4, cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
    double cn = 0;
    float cc = mt_clip_coef(s1 / 16.0, 1.0f, &cn); /* unscaled norm = sqrt(s) / 4 */
    CHECK_CLOSE(norm, cn, 1e-6, 0);
    CHECK_CLOSE(coef, cc * 0.25f, 1e-6, 0);
    int flag = 0;
    CHECK(cudaMemset(dflag, 0, 4) == cudaSuccess, "memset");
    CHECK_OK(mt_cuda_status(mt_cuda_check_finite(dflag, dx, N, MT_CU_F32, NULL), "finite"));
    CHECK(cudaMemcpy(&flag, dflag, 4, cudaMemcpyDeviceToHost) == cudaSuccess && flag == 0, "finite data: flag 0");
    float inf = INFINITY;
    CHECK(cudaMemcpy((float *)dx + N - 1, &inf, 4, cudaMemcpyHostToDevice) == cudaSuccess, "poke");
    CHECK_OK(mt_cuda_status(mt_cuda_check_finite(dflag, dx, N, MT_CU_F32, NULL), "finite"));
    CHECK(cudaMemcpy(&flag, dflag, 4, cudaMemcpyDeviceToHost) == cudaSuccess && flag == 1, "one inf: flag 1");
    /* conversions round to nearest even exactly as the host's */
    x[N - 1] = 70000.0f;
    CHECK(cudaMemcpy(dx, x, (size_t)N * 4, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
    for (int k = 1; k < 3; k++) {
        void *dl = NULL;
        CHECK_OK(mt_dev_malloc(&dl, (size_t)N * 2, MT_MEM_OTHER, "t", NULL));
        CHECK_OK(mt_cuda_status(mt_cuda_convert(dl, dts[k], dx, MT_CU_F32, N, 1.0f, NULL), "convert"));
        uint16_t *gh = malloc((size_t)N * 2), *hh = malloc((size_t)N * 2);
        CHECK(cudaMemcpy(gh, dl, (size_t)N * 2, cudaMemcpyDeviceToHost) == cudaSuccess, "download");
        mt_convert(hh, (mt_dtype_t)dts[k], x, MT_F32, N);
        CHECK(memcmp(gh, hh, (size_t)N * 2) == 0, "%s conversion bit-identical to the host's", dt_name(dts[k]));
        free(gh), free(hh);
        mt_dev_free(dl);
    }
    void *dev[] = {dx, dsum, dscr, dflag, dcoef, dnorm};
    for (size_t i = 0; i < MT_ARRAY_LEN(dev); i++) {
        mt_dev_free(dev[i]);
    }
    free(x);
}

int main(int argc, char **argv) {
    if (mt_cuda_device_count() == 0) {
        printf("skipped: no CUDA device\n");
        return MT_TEST_SKIP;
    }
    static const struct {
        const char *name;
        void (*fn)(void);
    } fams[] = {{"matmul", test_matmul},       {"layernorm", test_layernorm}, {"elementwise", test_elementwise},
                {"embedding", test_embedding}, {"attention", test_attention}, {"attention_tc", test_attention_tc},
                {"attention_knob", test_attention_knob}, {"attention_knob_bad", test_attention_knob_bad},
                {"softmax_ce", test_softmax_ce},         {"vocab_parallel", test_vocab_parallel},
                {"adamw", test_adamw},
                {"reduce", test_reduce}};
    const char *only = argc > 1 ? argv[1] : NULL;
    bool ran = false;
    for (size_t i = 0; i < MT_ARRAY_LEN(fams); i++) {
        /* the knob families set MESHTRAIN_ATTN_TC for the whole process */
        bool all = !only && fams[i].fn != test_attention_knob && fams[i].fn != test_attention_knob_bad;
        if (all || (only && !strcmp(only, fams[i].name))) {
            fams[i].fn();
            ran = true;
        }
    }
    CHECK(ran, "unknown family %s", only ? only : "");
    mt_cuda_alloc_t a;
    CHECK_OK(mt_cuda_alloc_default(&a));
    mt_cuda_alloc_stats_t st;
    mt_cuda_alloc_get_stats(a, &st);
    CHECK(st.allocated_bytes == 0, "every device buffer of the test was freed (%lld bytes left)",
          (long long)st.allocated_bytes);
    CHECK_OK(mt_cuda_alloc_validate(a));
    char name[64];
    snprintf(name, sizeof(name), "test_gpu_ops %s", only ? only : "all");
    return mt_test_finish(name);
}
