/* The CPU device table (runtime/device.h): every call computes what the CPU engines compute today, bit for
 * bit (the sum of squares and the clipping coefficient of models/optim, AdamW and SGD of runtime/flat_ops.h,
 * the rounding of runtime/precision.h), the device-side multiplier and skip flag act as documented, and
 * empty ranges are answered without touching memory. The CUDA table is checked against this one
 * (tests/gpu/test_device_cuda.c).
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <string.h>

#include "models/optim/optim.h"
#include "runtime/device.h"
#include "runtime/precision.h"
#include "testutil.h"

enum { N = 70001 }; /* above the OpenMP threshold, odd */

static float *fill(mt_device_table_t d, uint32_t seed, float scale) {
    float *x = NULL;
    CHECK_OK(mt_device_alloc(d, (void **)&x, N * sizeof(float), MT_MEM_OTHER, "test", NULL));
    uint32_t s = seed;
    for (int i = 0; i < N; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = scale * ((float)(s >> 8) / 16777216.0f - 0.5f);
    }
    return x;
}

static void memory(mt_device_table_t d) {
    CHECK(!strcmp(mt_device_name(d), "cpu") && mt_device_is_host(d), "the CPU table");
    float *a = fill(d, 1, 1.0f), *b = NULL;
    CHECK_OK(mt_device_alloc(d, (void **)&b, N * sizeof(float), MT_MEM_OTHER, "test", NULL));
    CHECK(((uintptr_t)b % 64) == 0, "64-byte aligned");
    CHECK_OK(mt_device_copy(d, b, a, N * sizeof(float), NULL));
    CHECK(!memcmp(a, b, N * sizeof(float)), "copy");
    CHECK_OK(mt_device_zero(d, b, 10 * sizeof(float), NULL));
    CHECK(b[0] == 0.0f && b[9] == 0.0f && b[10] == a[10], "zero of a prefix");
    CHECK_OK(mt_device_order(d, NULL, NULL));
    CHECK_OK(mt_device_wait(d, NULL));
    void *z = NULL;
    CHECK_OK(mt_device_alloc(d, &z, 0, MT_MEM_OTHER, "test", NULL));
    CHECK(z != NULL, "zero bytes: a valid block");
    mt_device_free(d, z);
    mt_device_free(d, NULL);
    float *c = NULL;
    CHECK_OK(mt_device_calloc(d, (void **)&c, N * sizeof(float), MT_MEM_OTHER, "test", NULL));
    bool zeroed = c != NULL;
    for (int i = 0; zeroed && i < N; i++) {
        zeroed = c[i] == 0.0f;
    }
    CHECK(zeroed, "calloc: a zeroed block");
    mt_device_free(d, c);
    mt_device_free(d, a);
    mt_device_free(d, b);
}

static void arithmetic(mt_device_table_t d) {
    float *x = fill(d, 2, 3.0f), *y = fill(d, 3, 1.0f), *ref = fill(d, 3, 1.0f);
    CHECK_OK(mt_device_add(d, y, x, N, NULL));
    int bad = 0;
    for (int i = 0; i < N; i++) {
        bad += y[i] != ref[i] + x[i];
    }
    CHECK(bad == 0, "add: %d elements differ from y + x", bad);

    double s = -1.0;
    int nonfinite = 0;
    CHECK_OK(mt_device_sumsq(d, &s, &nonfinite, x, N, NULL));
    CHECK(s == mt_clip_sumsq(x, N) && nonfinite == 0, "sumsq %.17g, nonfinite %d", s, nonfinite);
    x[N / 2] = INFINITY;
    CHECK_OK(mt_device_sumsq(d, NULL, &nonfinite, x, N, NULL));
    CHECK(nonfinite == 1, "an inf is flagged");
    x[N / 2] = NAN;
    nonfinite = 0;
    CHECK_OK(mt_device_sumsq(d, NULL, &nonfinite, x, N, NULL));
    CHECK(nonfinite == 1, "a NaN is flagged");
    s = 5.0;
    CHECK_OK(mt_device_sumsq(d, &s, NULL, x, 0, NULL));
    CHECK(s == 0.0, "the sum of an empty range is 0");

    /* the clipping coefficient: mt_clip_coef's, and with a loss scale of 1024 the unscaled norm's */
    double total = 1234.5;
    float coef = 0.0f, norm = 0.0f;
    double want_norm = 0.0;
    float want = mt_clip_coef(total, 1.0f, &want_norm);
    CHECK_OK(mt_device_clip_coef(d, &coef, &norm, &total, 1.0f, 1.0f, NULL));
    CHECK(coef == want && norm == (float)want_norm, "clip coef %.9g (want %.9g), norm %.9g", (double)coef, (double)want,
          (double)norm);
    double scaled = total * 1024.0 * 1024.0;
    CHECK_OK(mt_device_clip_coef(d, &coef, &norm, &scaled, 1.0f, 1.0f / 1024.0f, NULL));
    CHECK(fabsf(coef * 1024.0f - want) <= 1e-6f * want && fabsf(norm - (float)want_norm) <= 1e-5f * norm,
          "scaled: coef x 1024 = %.9g (want %.9g)", (double)(coef * 1024.0f), (double)want);
    CHECK_OK(mt_device_clip_coef(d, &coef, NULL, &total, 0.0f, 1.0f, NULL));
    CHECK(coef == 1.0f, "max_norm 0: no clipping");
    double inf = INFINITY;
    CHECK_OK(mt_device_clip_coef(d, &coef, NULL, &inf, 1.0f, 1.0f, NULL));
    CHECK(coef == 1.0f, "a non-finite norm: coefficient 1");
    mt_device_free(d, x);
    mt_device_free(d, y);
    mt_device_free(d, ref);
}

static int differ(const float *a, const float *b) {
    int n = 0;
    for (int i = 0; i < N; i++) {
        n += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    }
    return n;
}

static void step(mt_device_table_t d) {
    float *p = fill(d, 4, 1.0f), *g = fill(d, 5, 0.1f), *m = fill(d, 6, 0.01f), *v = fill(d, 7, 0.001f);
    float *rp = fill(d, 4, 1.0f), *rm = fill(d, 6, 0.01f), *rv = fill(d, 7, 0.001f);
    for (int i = 0; i < N; i++) {
        v[i] = rv[i] = fabsf(v[i]);
    }
    float coef = 0.5f;
    mt_device_step_t s = {.lr = 1e-3f,
                          .beta1 = 0.9f,
                          .beta2 = 0.95f,
                          .eps = 1e-8f,
                          .weight_decay = 0.1f,
                          .t = 3,
                          .grad_scale = 2.0f,
                          .grad_scale_dev = &coef};
    CHECK_OK(mt_device_step(d, &s, p, g, m, v, N, NULL));
    mt_adamw_update(rp, g, rm, rv, N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 2.0f * 0.5f);
    CHECK(differ(p, rp) == 0 && differ(m, rm) == 0 && differ(v, rv) == 0, "adamw: mt_adamw_update's bits");
    int skip = 1;
    s.skip = &skip;
    CHECK_OK(mt_device_step(d, &s, p, g, m, v, N, NULL));
    CHECK(differ(p, rp) == 0 && differ(m, rm) == 0, "skip: nothing changes");
    skip = 0;
    s = (mt_device_step_t){
        .sgd = true, .lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f, .first = true, .grad_scale = 1.0f};
    CHECK_OK(mt_device_step(d, &s, p, g, m, NULL, N, NULL));
    mt_sgd_update(rp, g, rm, N, 0.1f, 0.9f, 0.01f, true, 1.0f);
    s.first = false;
    CHECK_OK(mt_device_step(d, &s, p, g, m, NULL, N, NULL));
    mt_sgd_update(rp, g, rm, N, 0.1f, 0.9f, 0.01f, false, 1.0f);
    CHECK(differ(p, rp) == 0 && differ(m, rm) == 0, "sgd with momentum, two steps: mt_sgd_update's bits");

    /* the compute copy: bf16 and f16 values in f32 storage, as the CPU emulation rounds in place */
    float *c = fill(d, 8, 0.0f);
    for (int k = 0; k < 2; k++) {
        mt_dtype_t dt = k ? MT_F16 : MT_BF16;
        CHECK_OK(mt_device_round(d, c, p, N, dt, NULL));
        memcpy(rp, p, N * sizeof(float));
        mt_prec_round(rp, N, dt);
        CHECK(differ(c, rp) == 0, "round to %s", mt_dtype_name(dt));
    }
    mt_device_free(d, p);
    mt_device_free(d, g);
    mt_device_free(d, m);
    mt_device_free(d, v);
    mt_device_free(d, rp);
    mt_device_free(d, rm);
    mt_device_free(d, rv);
    mt_device_free(d, c);
}

int main(void) {
    mt_device_table_t d = mt_device_cpu();
    memory(d);
    arithmetic(d);
    step(d);
    return mt_test_finish("test_device");
}
