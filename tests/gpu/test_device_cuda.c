/* The CUDA device table (models/cuda/device_cuda.h) against the CPU table (runtime/device.h) on the same
 * inputs: memory moves exactly (host to device, device to device, back), zero, two streams ordered by
 * mt_device_order, add and rounding bit for bit, the sum of squares within 1e-12, the non-finite flag, the
 * clipping coefficient within an fp32 ulp (CUDA divides in double), AdamW and SGD within 1e-6 with the
 * device-side multiplier and skip flag. Built against the CUDA runtime (label gpu; exits 77 printing
 * "skipped: no CUDA device" without one) and against the CPU emulator (labels unit;emu).
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "models/cuda/device_cuda.h"
#include "models/cuda/mt_cuda.h"
#include "runtime/device.h"
#include "testutil.h"

enum { N = 5003 };

static mt_device_table_t cpu, gpu;
static cudaStream_t s1, s2;

static void fill(float *x, uint32_t seed, float scale) {
    uint32_t s = seed;
    for (int i = 0; i < N; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = scale * ((float)(s >> 8) / 16777216.0f - 0.5f);
    }
}

/* A device copy of n floats of host. */
static float *up(const float *host, size_t n, cudaStream_t s) {
    float *d = NULL;
    CHECK_OK(mt_device_alloc(gpu, (void **)&d, n * sizeof(float), MT_MEM_OTHER, "test", s));
    CHECK_OK(mt_device_copy(gpu, d, host, n * sizeof(float), s));
    return d;
}

static void down(void *host, const void *dev, size_t bytes, cudaStream_t s) {
    CHECK_OK(mt_device_copy(gpu, host, dev, bytes, s));
    CHECK_OK(mt_device_wait(gpu, s));
}

static double max_rel(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]) / fmax(fabs((double)b[i]), 1e-30);
        m = d > m ? d : m;
    }
    return m;
}

static void memory(void) {
    CHECK(!strcmp(mt_device_name(gpu), "cuda") && !mt_device_is_host(gpu), "the CUDA table");
    static float a[N], b[N];
    fill(a, 1, 1.0f);
    float *d1 = up(a, N, s1), *d2 = NULL;
    CHECK_OK(mt_device_alloc(gpu, (void **)&d2, N * sizeof(float), MT_MEM_OTHER, "test", s2));
    /* s2 copies what s1 uploaded only after mt_device_order */
    CHECK_OK(mt_device_order(gpu, s2, s1));
    CHECK_OK(mt_device_copy(gpu, d2, d1, N * sizeof(float), s2));
    CHECK_OK(mt_device_zero(gpu, d2, 16 * sizeof(float), s2));
    down(b, d2, sizeof(b), s2);
    CHECK(b[0] == 0.0f && b[15] == 0.0f && !memcmp(b + 16, a + 16, (N - 16) * sizeof(float)),
          "upload on one stream, copy and zero on another after order, download");
    CHECK_OK(mt_device_order(gpu, s1, s2));
    mt_device_free(gpu, d1);
    mt_device_free(gpu, d2);
}

static void arithmetic(void) {
    static float x[N], y[N], got[N];
    fill(x, 2, 3.0f);
    fill(y, 3, 1.0f);
    float *dx = up(x, N, s1), *dy = up(y, N, s1);
    CHECK_OK(mt_device_add(gpu, dy, dx, N, s1));
    CHECK_OK(mt_device_add(cpu, y, x, N, NULL));
    down(got, dy, sizeof(got), s1);
    CHECK(!memcmp(got, y, sizeof(y)), "add: the CPU table's bits");

    double *dsum = NULL;
    int *dflag = NULL;
    CHECK_OK(mt_device_alloc(gpu, (void **)&dsum, sizeof(double), MT_MEM_OTHER, "test", s1));
    CHECK_OK(mt_device_alloc(gpu, (void **)&dflag, sizeof(int), MT_MEM_OTHER, "test", s1));
    CHECK_OK(mt_device_zero(gpu, dflag, sizeof(int), s1));
    CHECK_OK(mt_device_sumsq(gpu, dsum, dflag, dx, N, s1));
    double sum = 0.0, want = 0.0;
    int flag = -1, wflag = 0;
    CHECK_OK(mt_device_sumsq(cpu, &want, &wflag, x, N, NULL));
    down(&sum, dsum, sizeof(sum), s1);
    down(&flag, dflag, sizeof(flag), s1);
    CHECK(fabs(sum - want) <= 1e-12 * want && flag == 0, "sumsq %.17g vs %.17g, flag %d", sum, want, flag);
    float nan = NAN;
    CHECK_OK(mt_device_copy(gpu, dx + 77, &nan, sizeof(float), s1));
    CHECK_OK(mt_device_sumsq(gpu, NULL, dflag, dx, N, s1));
    down(&flag, dflag, sizeof(flag), s1);
    CHECK(flag == 1, "a NaN is flagged");

    float coef[2], wcoef = 0.0f, wnorm = 0.0f;
    float *dcoef = NULL;
    CHECK_OK(mt_device_alloc(gpu, (void **)&dcoef, 2 * sizeof(float), MT_MEM_OTHER, "test", s1));
    CHECK_OK(mt_device_copy(gpu, dsum, &want, sizeof(double), s1));
    CHECK_OK(mt_device_clip_coef(gpu, dcoef, dcoef + 1, dsum, 1.0f, 0.25f, s1));
    CHECK_OK(mt_device_clip_coef(cpu, &wcoef, &wnorm, &want, 1.0f, 0.25f, NULL));
    down(coef, dcoef, sizeof(coef), s1);
    CHECK(fabsf(coef[0] - wcoef) <= 1.2e-7f * wcoef && coef[1] == wnorm, "clip coef %.9g vs %.9g, norm %.9g vs %.9g",
          (double)coef[0], (double)wcoef, (double)coef[1], (double)wnorm);
    mt_device_free(gpu, dx);
    mt_device_free(gpu, dy);
    mt_device_free(gpu, dsum);
    mt_device_free(gpu, dflag);
    mt_device_free(gpu, dcoef);
}

static void step(void) {
    static float p[N], g[N], m[N], v[N], got[N];
    fill(p, 4, 1.0f);
    fill(g, 5, 0.1f);
    fill(m, 6, 0.01f);
    fill(v, 7, 0.001f);
    for (int i = 0; i < N; i++) {
        v[i] = fabsf(v[i]);
    }
    float *dp = up(p, N, s1), *dg = up(g, N, s1), *dm = up(m, N, s1), *dv = up(v, N, s1);
    float half = 0.5f, *dhalf = up(&half, 1, s1);
    int one = 1, *dskip = NULL;
    CHECK_OK(mt_device_alloc(gpu, (void **)&dskip, sizeof(int), MT_MEM_OTHER, "test", s1));
    CHECK_OK(mt_device_copy(gpu, dskip, &one, sizeof(int), s1));
    mt_device_step_t s = {.lr = 1e-3f,
                          .beta1 = 0.9f,
                          .beta2 = 0.95f,
                          .eps = 1e-8f,
                          .weight_decay = 0.1f,
                          .t = 3,
                          .grad_scale = 2.0f,
                          .grad_scale_dev = dhalf,
                          .skip = dskip};
    CHECK_OK(mt_device_step(gpu, &s, dp, dg, dm, dv, N, s1)); /* skipped */
    down(got, dp, sizeof(got), s1);
    CHECK(!memcmp(got, p, sizeof(p)), "skip: nothing changes");
    CHECK_OK(mt_device_zero(gpu, dskip, sizeof(int), s1));
    CHECK_OK(mt_device_step(gpu, &s, dp, dg, dm, dv, N, s1));
    s.grad_scale_dev = &half;
    s.skip = NULL;
    CHECK_OK(mt_device_step(cpu, &s, p, g, m, v, N, NULL));
    down(got, dp, sizeof(got), s1);
    CHECK(max_rel(got, p, N) <= 1e-6, "adamw: within 1e-6 of the CPU table (%.3g)", max_rel(got, p, N));
    down(got, dv, sizeof(got), s1);
    CHECK(max_rel(got, v, N) <= 1e-6, "adamw v (%.3g)", max_rel(got, v, N));
    s = (mt_device_step_t){
        .sgd = true, .lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f, .first = true, .grad_scale = 1.0f};
    for (int k = 0; k < 2; k++, s.first = false) {
        CHECK_OK(mt_device_step(gpu, &s, dp, dg, dm, NULL, N, s1));
        CHECK_OK(mt_device_step(cpu, &s, p, g, m, NULL, N, NULL));
    }
    down(got, dp, sizeof(got), s1);
    CHECK(max_rel(got, p, N) <= 1e-6, "sgd with momentum, two steps (%.3g)", max_rel(got, p, N));

    /* the compute copy in bf16 and f16 storage: the CPU table's values, bit for bit in normal range */
    static uint16_t h[N];
    static float r[N];
    uint16_t *dh = NULL;
    CHECK_OK(mt_device_alloc(gpu, (void **)&dh, N * sizeof(uint16_t), MT_MEM_OTHER, "test", s1));
    for (int k = 0; k < 2; k++) {
        mt_dtype_t dt = k ? MT_F16 : MT_BF16;
        CHECK_OK(mt_device_copy(gpu, dp, p, sizeof(p), s1));
        CHECK_OK(mt_device_round(gpu, dh, dp, N, dt, s1));
        CHECK_OK(mt_device_round(cpu, r, p, N, dt, NULL));
        down(h, dh, sizeof(h), s1);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            float f = dt == MT_BF16 ? mt_bf16_to_f32(h[i]) : mt_f16_to_f32(h[i]);
            bad += fabsf(p[i]) >= 6.2e-5f && f != r[i]; /* f16 normals: the CPU flushes far subnormals to 0 */
        }
        CHECK(bad == 0, "round to %s: %d values differ", mt_dtype_name(dt), bad);
    }
    mt_device_free(gpu, dp);
    mt_device_free(gpu, dg);
    mt_device_free(gpu, dm);
    mt_device_free(gpu, dv);
    mt_device_free(gpu, dhalf);
    mt_device_free(gpu, dskip);
    mt_device_free(gpu, dh);
}

int main(void) {
    if (mt_cuda_device_count() == 0) {
        printf("skipped: no CUDA device\n");
        return MT_TEST_SKIP;
    }
    cpu = mt_device_cpu();
    gpu = mt_device_cuda();
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess &&
              cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess,
          "two streams");
    memory();
    arithmetic();
    step();
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
    return mt_test_finish("test_device_cuda");
}
