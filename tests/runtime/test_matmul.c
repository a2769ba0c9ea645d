/* runtime.matmul: who computes the CPU's matrix products, and in which precision. The choice (auto on
 * this CPU follows its bf16 instructions; openblas keeps everything on OpenBLAS; onednn is refused naming
 * the fix in a build without oneDNN), the products of every library against a double reference, and
 * what bf16 products mean: the inputs rounded to bf16 as runtime/precision.h rounds (nearest even), the
 * products accumulated in f32, so the result is the double product of the rounded inputs to f32 accuracy
 * and visibly not the f32 product of the unrounded ones. The layers' switch (mt_layers_set_product_dtype)
 * reaches the linear layer.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/layers/layers.h"
#include "runtime/cpu.h"
#include "runtime/matmul.h"
#include "runtime/precision.h"
#include "runtime/tensor.h"
#include "testutil.h"

static void parse(void) {
    mt_matmul_lib_t l = MT_MATMUL_OPENBLAS;
    CHECK(mt_matmul_parse("auto", &l) && l == MT_MATMUL_AUTO, "auto");
    CHECK(mt_matmul_parse("openblas", &l) && l == MT_MATMUL_OPENBLAS, "openblas");
    CHECK(mt_matmul_parse("onednn", &l) && l == MT_MATMUL_ONEDNN, "onednn");
    CHECK(!mt_matmul_parse("mkl", &l) && !mt_matmul_parse("", &l) && !mt_matmul_parse(NULL, &l), "others refused");
}

/* mt_prec_round's bf16 (the vectorised loop the emulation and the reference above use) gives the bits of
 * mt_f32_to_bf16 and back for every kind of float: random bit patterns, ties, infinities, NaNs, subnormals. */
static void rounding(void) {
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof(float));
    uint32_t *want = malloc(N * sizeof(uint32_t));
    uint32_t s = 99u;
    for (int i = 0; i < N; i++) {
        s = s * 1664525u + 1013904223u;
        uint32_t u = s;
        if (i % 7 == 1) {
            u = (u & 0xffff0000u) | 0x8000u; /* a tie */
        } else if (i % 7 == 2) {
            u = (u & 0x807fffffu) | 0x7f800000u; /* inf or NaN */
        } else if (i % 7 == 3) {
            u &= 0x807fffffu; /* subnormal */
        }
        memcpy(&x[i], &u, sizeof(u));
        float r = mt_bf16_to_f32(mt_f32_to_bf16(x[i]));
        memcpy(&want[i], &r, sizeof(r));
    }
    size_t bad_want = 0;
    for (int i = 0; i < N; i++) {
        bad_want += (want[i] & 0x7f800000u) == 0x7f800000u;
    }
    size_t bad = mt_prec_round(x, N, MT_BF16);
    int diff = 0;
    for (int i = 0; i < N; i++) {
        uint32_t got;
        memcpy(&got, &x[i], sizeof(got));
        diff += got != want[i];
    }
    CHECK(diff == 0, "%d of %d roundings differ from mt_f32_to_bf16's bits", diff, N);
    CHECK(bad == bad_want, "non-finite count %zu, expected %zu", bad, bad_want);
    free(x);
    free(want);
}

/* mt_prec_round_copy and mt_prec_round_add (the compute wrapper's one-pass weight copy and gradient sum) give the
 * bits of mt_prec_round followed by the copy or the sum, in every dtype, above and below the threading size. */
static void round_copy_add(void) {
    static const mt_dtype_t dts[] = {MT_F32, MT_BF16, MT_F16};
    static const size_t sizes[] = {1000, 300000};
    for (int k = 0; k < 3; k++) {
        for (int z = 0; z < 2; z++) {
            size_t n = sizes[z];
            float *src = malloc(n * 4), *ref = malloc(n * 4), *got = malloc(n * 4), *acc = malloc(n * 4);
            float *acc_ref = malloc(n * 4);
            uint32_t s = 7u + (uint32_t)k;
            for (size_t i = 0; i < n; i++) {
                s = s * 1664525u + 1013904223u;
                src[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (i % 11 == 3 ? 1e6f : 3.0f);
                acc[i] = acc_ref[i] = (float)(i % 13) * 0.37f;
            }
            memcpy(ref, src, n * 4);
            mt_prec_round(ref, n, dts[k]);
            mt_prec_round_copy(got, src, n, dts[k]);
            CHECK(memcmp(got, ref, n * 4) == 0, "round_copy in %s of %zu floats: the bits of mt_prec_round",
                  mt_dtype_name(dts[k]), n);
            for (size_t i = 0; i < n; i++) {
                acc_ref[i] += ref[i];
            }
            mt_prec_round_add(acc, src, n, dts[k]);
            CHECK(memcmp(acc, acc_ref, n * 4) == 0, "round_add in %s of %zu floats: the bits of round, then add",
                  mt_dtype_name(dts[k]), n);
            free(src), free(ref), free(got), free(acc), free(acc_ref);
        }
    }
}

/* Values with bits below bf16's 8-bit mantissa, so rounding them shows. */
static void fill(float *x, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 3.0f;
    }
}

/* Largest |C - ref| / sum|a b| of C = op(A) op(B) (+ C0), ref in double from A', B' (the inputs as given, or
 * rounded to bf16 first). */
static double product_error(bool ta, bool tb, int M, int N, int K, mt_dtype_t dt, bool beta, bool ref_rounded) {
    int lda = ta ? M : K, ldb = tb ? K : N, ldc = N + 5;
    size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * ldc;
    float *a = malloc(na * 4), *b = malloc(nb * 4), *c = malloc(nc * 4), *c0 = malloc(nc * 4), *ar = malloc(na * 4),
          *br = malloc(nb * 4);
    fill(a, na, 1u + (uint32_t)M);
    fill(b, nb, 2u + (uint32_t)N);
    fill(c, nc, 3u);
    memcpy(c0, c, nc * 4);
    memcpy(ar, a, na * 4);
    memcpy(br, b, nb * 4);
    if (ref_rounded) {
        mt_prec_round(ar, na, MT_BF16);
        mt_prec_round(br, nb, MT_BF16);
    }
    mt_gemm(ta, tb, M, N, K, a, lda, b, ldb, beta ? 1.0f : 0.0f, c, ldc, dt);
    double worst = 0.0;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double ref = beta ? c0[(size_t)i * ldc + j] : 0.0, mag = fabs(ref);
            for (int k = 0; k < K; k++) {
                double x = ta ? ar[(size_t)k * lda + i] : ar[(size_t)i * lda + k];
                double y = tb ? br[(size_t)j * ldb + k] : br[(size_t)k * ldb + j];
                ref += x * y;
                mag += fabs(x * y);
            }
            double e = fabs(c[(size_t)i * ldc + j] - ref) / mag;
            worst = isnan(e) || e > worst ? (isnan(e) ? INFINITY : e) : worst;
        }
        for (int j = N; j < ldc; j++) { /* the padding of each row is never written */
            if (c[(size_t)i * ldc + j] != c0[(size_t)i * ldc + j]) {
                worst = INFINITY;
            }
        }
    }
    free(a), free(b), free(c), free(c0), free(ar), free(br);
    return worst;
}

/* Every transpose, beta 0 and 1, odd sizes. */
static double worst_of(mt_dtype_t dt, bool ref_rounded) {
    double w = 0.0;
    for (int t = 0; t < 4; t++) {
        w = fmax(w, product_error(t & 1, t & 2, 33 + t, 47, 129 + 7 * t, dt, t & 1, ref_rounded));
    }
    return w;
}

static void openblas(void) {
    CHECK_OK(mt_matmul_init(MT_MATMUL_OPENBLAS));
    CHECK(mt_matmul_lib(MT_F32) == MT_MATMUL_OPENBLAS && mt_matmul_lib(MT_BF16) == MT_MATMUL_OPENBLAS,
          "openblas computes both precisions");
    CHECK(strstr(mt_matmul_describe(), "OpenBLAS") != NULL, "%s", mt_matmul_describe());
    double e = worst_of(MT_F32, false), eb = worst_of(MT_BF16, false);
    CHECK(e <= 1e-6, "OpenBLAS f32 products to float accuracy: %g", e);
    CHECK(eb <= 1e-6, "OpenBLAS's bf16 products are f32 products of the inputs as given (emulation): %g", eb);
}

static bool onednn_bf16; /* runtime.matmul = onednn got bf16 products from oneDNN on this CPU */

static void onednn(void) {
    mt_status_t st = mt_matmul_init(MT_MATMUL_ONEDNN);
    if (!mt_matmul_have_onednn()) {
        CHECK(st == MT_ERR_INVALID_ARG && strstr(mt_last_error_msg(), "libdnnl-dev") != NULL,
              "onednn without oneDNN is refused naming the fix: %s", mt_last_error_msg());
        CHECK(mt_matmul_lib(MT_BF16) == MT_MATMUL_OPENBLAS, "and the products stay on OpenBLAS");
        printf("oneDNN: not in this build (runtime.matmul = onednn refused, as it must be)\n");
        return;
    }
    CHECK_OK(st);
    printf("runtime.matmul = onednn: %s\n", mt_matmul_describe());
    CHECK(mt_matmul_lib(MT_F32) == MT_MATMUL_ONEDNN, "onednn: f32 on oneDNN");
    onednn_bf16 = mt_matmul_lib(MT_BF16) == MT_MATMUL_ONEDNN && !strstr(mt_matmul_describe(), "ref:");
    double ef = worst_of(MT_F32, false);
    CHECK(ef <= 1e-6, "oneDNN f32 products to float accuracy: %g", ef);
    if (mt_matmul_lib(MT_BF16) != MT_MATMUL_ONEDNN) {
        /* oneDNN 2.6 makes no bf16 product below AVX-512: bf16 is then the emulation on oneDNN's f32 */
        CHECK(strstr(mt_matmul_describe(), "bf16 emulated on oneDNN (oneDNN has no bf16 product") != NULL,
              "onednn without a bf16 product says bf16 is emulated: %s", mt_matmul_describe());
        double eb = worst_of(MT_BF16, false);
        CHECK(eb <= 1e-6, "and bf16 products are then f32 products of the inputs as given: %g", eb);
        printf("oneDNN has no bf16 product on this CPU: the bf16 rounding checks below cannot run here\n");
        return;
    }
    double eb = worst_of(MT_BF16, true), eu = worst_of(MT_BF16, false);
    printf("bf16 products: error %.3g against the double product of the bf16-rounded inputs, %.3g against the "
           "unrounded ones\n",
           eb, eu);
    CHECK(eb <= 1e-6, "bf16 products = products of the inputs rounded to nearest-even bf16, f32 sums: %g", eb);
    CHECK(eu > 1e-4, "and not the f32 product of the unrounded inputs (the rounding happens): %g", eu);
    CHECK(mt_matmul_selfcheck(MT_BF16) <= 1e-5 && mt_matmul_selfcheck(MT_F32) <= 1e-5, "the start-up self-check");

    /* The linear layer follows the layers' product precision: f32 by default, bf16 when set. */
    enum { N = 24, C = 40, OC = 56 };
    float *inp = malloc(N * C * 4), *w = malloc(OC * C * 4), *bias = malloc(OC * 4), *o32 = malloc(N * OC * 4),
          *o16 = malloc(N * OC * 4), *ir = malloc(N * C * 4), *wr = malloc(OC * C * 4);
    fill(inp, N * C, 7u);
    fill(w, OC * C, 8u);
    fill(bias, OC, 9u);
    mt_matmul_forward(o32, OC, inp, w, bias, N, C, OC);
    int prev = mt_layers_set_product_dtype((int)MT_BF16);
    CHECK(prev == (int)MT_F32, "the default product precision is f32");
    mt_matmul_forward(o16, OC, inp, w, bias, N, C, OC);
    mt_layers_set_product_dtype(prev);
    memcpy(ir, inp, N * C * 4);
    memcpy(wr, w, OC * C * 4);
    mt_prec_round(ir, N * C, MT_BF16);
    mt_prec_round(wr, OC * C, MT_BF16);
    double e16 = 0.0, e32 = 0.0;
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            double r16 = bias[o], r32 = bias[o], mag = fabs(bias[o]);
            for (int c = 0; c < C; c++) {
                r16 += (double)ir[n * C + c] * wr[o * C + c];
                r32 += (double)inp[n * C + c] * w[o * C + c];
                mag += fabs((double)inp[n * C + c] * w[o * C + c]);
            }
            e16 = fmax(e16, fabs(o16[n * OC + o] - r16) / mag);
            e32 = fmax(e32, fabs(o32[n * OC + o] - r32) / mag);
        }
    }
    CHECK(e32 <= 1e-6, "the linear layer in f32 by default: %g", e32);
    CHECK(e16 <= 1e-5, "the linear layer in bf16 when the model asks: %g", e16);
    free(inp), free(w), free(bias), free(o32), free(o16), free(ir), free(wr);
}

static void automatic(void) {
    CHECK_OK(mt_matmul_init(MT_MATMUL_AUTO));
    mt_cpu_t cpu;
    mt_cpu_detect(&cpu);
    bool native = cpu.amx_bf16 || cpu.avx512_bf16;
    printf("runtime.matmul = auto: %s\n", mt_matmul_describe());
    if (mt_matmul_have_onednn()) {
        CHECK(mt_matmul_lib(MT_F32) == MT_MATMUL_ONEDNN || strstr(mt_matmul_describe(), "reference f32"),
              "auto puts f32 products on oneDNN where it has a native kernel: %s", mt_matmul_describe());
    } else {
        CHECK(mt_matmul_lib(MT_F32) == MT_MATMUL_OPENBLAS, "without oneDNN f32 products are OpenBLAS's");
    }
    double ef = worst_of(MT_F32, false);
    CHECK(ef <= 1e-6, "auto's f32 products to float accuracy: %g", ef);
    if (mt_matmul_have_onednn() && native && onednn_bf16) {
        CHECK(mt_matmul_lib(MT_BF16) == MT_MATMUL_ONEDNN, "a CPU with bf16 instructions gets oneDNN's bf16: %s",
              mt_matmul_describe());
        CHECK(strstr(mt_matmul_describe(), "ref:") == NULL, "and not oneDNN's reference code: %s",
              mt_matmul_describe());
    } else {
        CHECK(mt_matmul_lib(MT_BF16) == MT_MATMUL_OPENBLAS, "no bf16 instructions or no oneDNN: emulated (%s)",
              mt_matmul_describe());
    }
}

int main(void) {
    parse();
    rounding();
    round_copy_add();
    openblas();
    onednn();
    automatic();
    return mt_test_finish("test_matmul");
}
