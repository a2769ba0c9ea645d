/* The CPU matrix-product backend: OpenBLAS sgemm, and oneDNN's matmul primitive for bf16 (and, asked for,
 * f32). See matmul.h.
 * SPDX-License-Identifier: MIT */
#include "matmul.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "cpu.h"
#include "mt_build_config.h"
#include "mt_core.h"

#if MT_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

bool mt_matmul_parse(const char *s, mt_matmul_lib_t *out) {
    static const char *names[] = {"auto", "openblas", "onednn"};
    for (int i = 0; i < 3; i++) {
        if (s && strcmp(s, names[i]) == 0) {
            *out = (mt_matmul_lib_t)i;
            return true;
        }
    }
    return false;
}

bool mt_matmul_have_onednn(void) {
    return MT_HAVE_ONEDNN != 0;
}

static bool chosen;                                   /* mt_matmul_init ran */
static mt_matmul_lib_t lib_f32 = MT_MATMUL_OPENBLAS;  /* who computes f32 products */
static mt_matmul_lib_t lib_bf16 = MT_MATMUL_OPENBLAS; /* who computes bf16 ones (OpenBLAS: the emulation) */
static char describe[384];

static void sgemm(bool ta, bool tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb, float beta,
                  float *C, int ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A, lda, B,
                ldb, beta, C, ldc);
}

/* ---- oneDNN ------------------------------------------------------------------------------------ */

#if MT_HAVE_ONEDNN

static dnnl_engine_t engine;
static dnnl_stream_t stream;
static bool runtime_failed; /* reported once; products fall back to OpenBLAS */

typedef struct {
    bool ta, tb, beta, bf16;
    int M, N, K, lda, ldb, ldc;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, pad;
    size_t pad_bytes; /* its scratchpad (user mode: ours, kept, instead of oneDNN's allocation per call) */
    const char *impl; /* oneDNN's name of the kernel it chose */
} prim_t;

/* Primitives by shape. A model has a few dozen shapes; past the capacity the oldest entry is replaced. */
enum { CACHE_CAP = 128 };
static prim_t cache[CACHE_CAP];
static int cache_n, cache_next;

/* bf16 copies of the inputs (compacted: leading dimension = the stored row length). */
static uint16_t *scratch;
static size_t scratch_elems;
/* The primitives' scratchpad (their packing buffers), one for all since they run one at a time, allocated
 * once through the accounting allocator rather than by oneDNN at each execution (its default). */
static void *pad;
static size_t pad_bytes;

static void prim_destroy(prim_t *p) {
    dnnl_memory_destroy(p->a);
    dnnl_memory_destroy(p->b);
    dnnl_memory_destroy(p->c);
    dnnl_memory_destroy(p->pad);
    dnnl_primitive_destroy(p->prim);
    memset(p, 0, sizeof(*p));
}

static void release(void) {
    for (int i = 0; i < cache_n; i++) {
        prim_destroy(&cache[i]);
    }
    cache_n = cache_next = 0;
    mt_free(scratch);
    scratch = NULL;
    scratch_elems = 0;
    mt_free(pad);
    pad = NULL;
    pad_bytes = 0;
}

static void onednn_shutdown(void) {
    release();
    if (stream) {
        dnnl_stream_destroy(stream);
        stream = NULL;
    }
    if (engine) {
        dnnl_engine_destroy(engine);
        engine = NULL;
    }
}

static bool onednn_start(void) {
    if (engine) {
        return true;
    }
    if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) {
        engine = NULL;
        return false;
    }
    if (dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) != dnnl_success) {
        dnnl_engine_destroy(engine);
        engine = NULL;
        return false;
    }
    static bool registered;
    if (!registered) {
        atexit(onednn_shutdown);
        registered = true;
    }
    return true;
}

/* A (rows, cols) matrix stored with leading dimension ld, read as its transpose when t: dims and strides of
 * the (logical) operand. */
static dnnl_status_t md_init(dnnl_memory_desc_t *md, bool t, int64_t r, int64_t c, int64_t ld, dnnl_data_type_t dt) {
    dnnl_dims_t dims = {r, c};
    dnnl_dims_t strides = {t ? 1 : ld, t ? ld : 1};
    return dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides);
}

static prim_t *prim_get(bool ta, bool tb, int M, int N, int K, int lda, int ldb, int ldc, bool beta, bool bf16) {
    for (int i = 0; i < cache_n; i++) {
        prim_t *p = &cache[i];
        if (p->ta == ta && p->tb == tb && p->M == M && p->N == N && p->K == K && p->lda == lda && p->ldb == ldb &&
            p->ldc == ldc && p->beta == beta && p->bf16 == bf16) {
            return p;
        }
    }
    if (!onednn_start()) {
        return NULL;
    }
    dnnl_data_type_t in = bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t a, b, c;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    prim_t p = {
        .ta = ta, .tb = tb, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc, .beta = beta, .bf16 = bf16};
    bool ok = md_init(&a, ta, M, K, lda, in) == dnnl_success && md_init(&b, tb, K, N, ldb, in) == dnnl_success &&
              md_init(&c, false, M, N, ldc, dnnl_f32) == dnnl_success &&
              dnnl_matmul_desc_init(&desc, &a, &b, NULL, &c) == dnnl_success &&
              dnnl_primitive_attr_create(&attr) == dnnl_success &&
              dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
    if (ok && beta) {
        ok = dnnl_post_ops_create(&po) == dnnl_success && dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    }
    ok = ok && dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL) == dnnl_success &&
         dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &p.impl) == dnnl_success &&
         dnnl_primitive_create(&p.prim, pd) == dnnl_success &&
         dnnl_memory_create(&p.a, &a, engine, DNNL_MEMORY_NONE) == dnnl_success &&
         dnnl_memory_create(&p.b, &b, engine, DNNL_MEMORY_NONE) == dnnl_success &&
         dnnl_memory_create(&p.c, &c, engine, DNNL_MEMORY_NONE) == dnnl_success;
    if (ok) {
        const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        dnnl_memory_desc_t sd = *smd;
        p.pad_bytes = dnnl_memory_desc_get_size(&sd);
        ok = dnnl_memory_create(&p.pad, &sd, engine, DNNL_MEMORY_NONE) == dnnl_success;
    }
    /* impl points into the primitive's own descriptor; keep a static copy of the few names seen. */
    static char names[8][64];
    static int n_names;
    if (ok) {
        int k = 0;
        while (k < n_names && strcmp(names[k], p.impl) != 0) {
            k++;
        }
        if (k == n_names && n_names < 8) {
            snprintf(names[n_names++], sizeof(names[0]), "%s", p.impl);
        }
        p.impl = k < n_names ? names[k] : "oneDNN";
    }
    if (pd) {
        dnnl_primitive_desc_destroy(pd);
    }
    if (po) {
        dnnl_post_ops_destroy(po);
    }
    if (attr) {
        dnnl_primitive_attr_destroy(attr);
    }
    if (!ok) {
        prim_destroy(&p);
        return NULL;
    }
    int slot;
    if (cache_n < CACHE_CAP) {
        slot = cache_n++;
    } else {
        slot = cache_next;
        prim_destroy(&cache[slot]);
        cache_next = (cache_next + 1) % CACHE_CAP;
    }
    cache[slot] = p;
    return &cache[slot];
}

static void convert_row(uint16_t *d, const float *s, int n) {
#pragma omp simd
    for (int c = 0; c < n; c++) {
        d[c] = mt_bf16_round(s[c]);
    }
}

/* The same in AVX-512 (16 lanes, 4x the baseline build's SSE2 rate, measured): every CPU that gets bf16
 * products on oneDNN has it (AVX512-BF16 and AMX come with AVX512F/BW). */
#if defined(__x86_64__) && defined(__GNUC__)
#define MT_HAVE_ROW512 1
__attribute__((target("avx512f,avx512bw"))) static void convert_row512(uint16_t *d, const float *s, int n) {
#pragma omp simd
    for (int c = 0; c < n; c++) {
        d[c] = mt_bf16_round(s[c]);
    }
}
#endif

#ifdef MT_HAVE_ROW512
static bool use_row512;
#endif

/* rows x cols of src (leading dimension ld) into dst, compacted (leading dimension cols). */
static void convert(uint16_t *dst, const float *src, int rows, int cols, int ld) {
#ifdef MT_HAVE_ROW512
    bool wide = use_row512;
#endif
#pragma omp parallel for schedule(static) if ((size_t)rows * (size_t)cols > 32768)
    for (int r = 0; r < rows; r++) {
        const float *s = src + (size_t)r * (size_t)ld;
        uint16_t *d = dst + (size_t)r * (size_t)cols;
#ifdef MT_HAVE_ROW512
        if (wide) {
            convert_row512(d, s, cols);
            continue;
        }
#endif
        convert_row(d, s, cols);
    }
}

/* false: not done (the caller computes it with OpenBLAS). */
static bool onednn_gemm(bool ta, bool tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                        float beta, float *C, int ldc, bool bf16) {
    if (runtime_failed || M <= 0 || N <= 0 || K <= 0) {
        return false;
    }
    const void *pa = A, *pb = B;
    if (bf16) {
        /* A stored (ta ? K : M) rows of (ta ? M : K); B (tb ? N : K) rows of (tb ? K : N). */
        int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
        size_t need = (size_t)ar * ac + (size_t)br * bc;
        if (need > scratch_elems) {
            mt_free(scratch);
            scratch = mt_alloc(need * sizeof(uint16_t), MT_MEM_OTHER, "bf16 product inputs");
            scratch_elems = scratch ? need : 0;
            if (!scratch) {
                return false;
            }
        }
        convert(scratch, A, ar, ac, lda);
        convert(scratch + (size_t)ar * ac, B, br, bc, ldb);
        pa = scratch;
        pb = scratch + (size_t)ar * ac;
        lda = ac;
        ldb = bc;
    }
    prim_t *p = prim_get(ta, tb, M, N, K, lda, ldb, ldc, beta != 0.0f, bf16);
    if (p && p->pad_bytes > pad_bytes) {
        mt_free(pad);
        pad = mt_alloc(p->pad_bytes, MT_MEM_OTHER, "oneDNN scratchpad");
        pad_bytes = pad ? p->pad_bytes : 0;
    }
    bool ok = p && pad_bytes >= p->pad_bytes && dnnl_memory_set_data_handle(p->a, (void *)pa) == dnnl_success &&
              dnnl_memory_set_data_handle(p->b, (void *)pb) == dnnl_success &&
              dnnl_memory_set_data_handle(p->c, C) == dnnl_success &&
              dnnl_memory_set_data_handle(p->pad, pad) == dnnl_success;
    if (ok) {
        dnnl_exec_arg_t args[4] = {
            {DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b}, {DNNL_ARG_DST, p->c}, {DNNL_ARG_SCRATCHPAD, p->pad}};
        ok = dnnl_primitive_execute(p->prim, stream, 4, args) == dnnl_success &&
             dnnl_stream_wait(stream) == dnnl_success;
    }
    if (!ok) {
        runtime_failed = true;
        fprintf(stderr,
                "meshtrain: warning: oneDNN failed a %s product (%d x %d x %d); this process computes its products "
                "with OpenBLAS from now on (set runtime.matmul = \"openblas\" to choose it at start-up)\n",
                bf16 ? "bf16" : "f32", M, N, K);
    }
    return ok;
}

static double onednn_bf16_rate(int n) {
    prim_t *p = prim_get(false, false, n, n, n, n, n, n, false, true);
    size_t nn = (size_t)n * (size_t)n;
    uint16_t *a = malloc(nn * sizeof(uint16_t)), *b = malloc(nn * sizeof(uint16_t));
    float *c = malloc(nn * sizeof(float));
    void *tmp = p && p->pad_bytes ? malloc(p->pad_bytes) : NULL;
    double best = 0.0;
    if (p && a && b && c && (tmp || !p->pad_bytes)) {
        for (size_t i = 0; i < nn; i++) {
            a[i] = mt_bf16_round(1.0f + (float)(i % 7) * 0.125f);
            b[i] = mt_bf16_round(1.0f + (float)(i % 5) * 0.25f);
        }
        bool ok = dnnl_memory_set_data_handle(p->a, a) == dnnl_success &&
                  dnnl_memory_set_data_handle(p->b, b) == dnnl_success &&
                  dnnl_memory_set_data_handle(p->c, c) == dnnl_success &&
                  dnnl_memory_set_data_handle(p->pad, tmp) == dnnl_success;
        dnnl_exec_arg_t args[4] = {
            {DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b}, {DNNL_ARG_DST, p->c}, {DNNL_ARG_SCRATCHPAD, p->pad}};
        double start = mt_now();
        for (int rep = 0; ok && rep < 8 && (rep < 3 || mt_now() - start < 0.3); rep++) {
            double t0 = mt_now();
            ok = dnnl_primitive_execute(p->prim, stream, 4, args) == dnnl_success &&
                 dnnl_stream_wait(stream) == dnnl_success;
            double dt = mt_now() - t0;
            if (ok && rep > 0 && dt > 0) { /* the first run warms the threads and caches */
                best = fmax(best, 2.0 * n * (double)n * n / dt);
            }
        }
        best = ok ? best : 0.0;
    }
    free(a);
    free(b);
    free(c);
    free(tmp);
    release(); /* the primitive's handles pointed at the buffers just freed */
    return best;
}

static const char *onednn_version(void) {
    static char v[32];
    const dnnl_version_t *ver = dnnl_version();
    snprintf(v, sizeof(v), "oneDNN %d.%d.%d", ver->major, ver->minor, ver->patch);
    return v;
}

/* The kernel oneDNN picks for a representative bf16 product, or NULL when it cannot make one. */
static const char *onednn_kernel(bool bf16) {
    prim_t *p = prim_get(false, true, 256, 256, 256, 256, 256, 256, true, bf16);
    return p ? p->impl : NULL;
}

#else

static void release(void) {
}

static bool onednn_gemm(bool ta, bool tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                        float beta, float *C, int ldc, bool bf16) {
    (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)beta, (void)C,
        (void)ldc, (void)bf16;
    return false;
}

#endif

/* ---- choosing --------------------------------------------------------------------------------- */

void mt_gemm(bool ta, bool tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb, float beta,
             float *C, int ldc, mt_dtype_t dt) {
    if (!chosen) {
        (void)mt_matmul_init(MT_MATMUL_AUTO);
    }
    if (dt == MT_BF16 && lib_bf16 == MT_MATMUL_ONEDNN) {
        if (onednn_gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, true)) {
            return;
        }
    } else if (lib_f32 == MT_MATMUL_ONEDNN && onednn_gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, false)) {
        return; /* f32, and the emulation's bf16 (an f32 product of the rounded values) */
    }
    sgemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

double mt_matmul_bf16_rate(int n) {
#if MT_HAVE_ONEDNN
    if (mt_matmul_lib(MT_BF16) == MT_MATMUL_ONEDNN && n > 0) {
        return onednn_bf16_rate(n);
    }
#endif
    (void)n;
    return 0.0;
}

void mt_matmul_release(void) {
    release();
}

mt_matmul_lib_t mt_matmul_lib(mt_dtype_t dt) {
    if (!chosen) {
        (void)mt_matmul_init(MT_MATMUL_AUTO);
    }
    return dt == MT_BF16 ? lib_bf16 : lib_f32;
}

const char *mt_matmul_describe(void) {
    if (!chosen) {
        (void)mt_matmul_init(MT_MATMUL_AUTO);
    }
    return describe;
}

/* A (M,K) op B (K,N) with ta/tb layouts, values in [-1, 1) from a fixed generator, against double. */
static double check_one(bool ta, bool tb, int M, int N, int K, float beta, mt_dtype_t dt) {
    int lda = ta ? M : K, ldb = tb ? K : N, ldc = N + 3;
    size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * ldc;
    float *a = malloc(na * sizeof(float)), *b = malloc(nb * sizeof(float)), *c = malloc(nc * sizeof(float));
    double worst = INFINITY;
    if (a && b && c) {
        uint32_t s = 12345u + (uint32_t)(M * 7 + N * 13 + K);
        for (size_t i = 0; i < na + nb + nc; i++) {
            s = s * 1664525u + 1013904223u;
            float v = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f;
            float *dst = i < na ? &a[i] : i < na + nb ? &b[i - na] : &c[i - na - nb];
            /* bf16: inputs that are bf16 values already, so the reference is exact for them */
            *dst = dt == MT_BF16 && i < na + nb ? (float)(int)(v * 64.0f) / 64.0f : v;
        }
        float *c0 = malloc(nc * sizeof(float));
        if (c0) {
            memcpy(c0, c, nc * sizeof(float));
            mt_gemm(ta, tb, M, N, K, a, lda, b, ldb, beta, c, ldc, dt);
            worst = 0.0;
            for (int i = 0; i < M; i++) {
                for (int j = 0; j < N; j++) {
                    double ref = beta != 0.0f ? (double)c0[(size_t)i * ldc + j] : 0.0, mag = fabs(ref);
                    for (int k = 0; k < K; k++) {
                        double x = ta ? a[(size_t)k * lda + i] : a[(size_t)i * lda + k];
                        double y = tb ? b[(size_t)j * ldb + k] : b[(size_t)k * ldb + j];
                        ref += x * y;
                        mag += fabs(x * y);
                    }
                    double e = fabs((double)c[(size_t)i * ldc + j] - ref) / (mag > 0 ? mag : 1.0);
                    worst = e > worst || isnan(e) ? (isnan(e) ? INFINITY : e) : worst;
                }
            }
            free(c0);
        }
    }
    free(a);
    free(b);
    free(c);
    return worst;
}

double mt_matmul_selfcheck(mt_dtype_t dt) {
    double e = check_one(false, false, 61, 67, 129, 0.0f, dt);
    e = fmax(e, check_one(false, true, 37, 83, 300, 1.0f, dt));
    e = fmax(e, check_one(true, false, 96, 33, 77, 1.0f, dt));
    e = fmax(e, check_one(true, true, 7, 129, 45, 0.0f, dt));
    return e;
}

#define SELFCHECK_TOL 1e-4

mt_status_t mt_matmul_init(mt_matmul_lib_t request) {
    chosen = true;
    lib_f32 = lib_bf16 = MT_MATMUL_OPENBLAS;
    const char *how = request == MT_MATMUL_AUTO ? "auto" : request == MT_MATMUL_ONEDNN ? "onednn" : "openblas";
    snprintf(describe, sizeof(describe), "f32 and bf16 on OpenBLAS, bf16 emulated (%s%s)", how,
             request == MT_MATMUL_AUTO && !MT_HAVE_ONEDNN ? ": this build has no oneDNN" : "");
    if (request == MT_MATMUL_OPENBLAS) {
        return MT_OK;
    }
#if MT_HAVE_ONEDNN
    mt_cpu_t cpu;
    mt_cpu_detect(&cpu);
#ifdef MT_HAVE_ROW512
    use_row512 = cpu.avx512f && cpu.avx512bw;
#endif
    const char *kb = onednn_kernel(true), *kf = onednn_kernel(false);
    if (request == MT_MATMUL_ONEDNN && !kf) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "runtime.matmul = \"onednn\": oneDNN cannot create an f32 matrix product on this CPU; set "
                        "runtime.matmul = \"auto\" or \"openblas\"");
    }
    /* auto: f32 on oneDNN wherever it has a native kernel (one OpenMP thread pool for the products and the
     * kernels around them: with OpenBLAS's own pool beside OpenMP's the two fought for the cores and the fp32
     * step took twice as long, docs/PERFORMANCE.md); bf16 on oneDNN only where the CPU multiplies bf16
     * (elsewhere oneDNN's bf16 is slower than the emulation's f32 products). */
    bool native_bf16 = (cpu.amx_bf16 || cpu.avx512_bf16) && kb && strncmp(kb, "ref", 3) != 0;
    bool native_f32 = kf && strncmp(kf, "ref", 3) != 0;
    lib_f32 = request == MT_MATMUL_ONEDNN || native_f32 ? MT_MATMUL_ONEDNN : MT_MATMUL_OPENBLAS;
    /* onednn: bf16 on oneDNN wherever it can make a bf16 product at all (oneDNN 2.6 has none below AVX-512:
     * there bf16 is emulated on oneDNN's f32 products, and the start-up line says so) */
    lib_bf16 = (request == MT_MATMUL_ONEDNN && kb) || native_bf16 ? MT_MATMUL_ONEDNN : MT_MATMUL_OPENBLAS;
    double eb = lib_bf16 == MT_MATMUL_ONEDNN ? mt_matmul_selfcheck(MT_BF16) : 0.0;
    double ef = lib_f32 == MT_MATMUL_ONEDNN ? mt_matmul_selfcheck(MT_F32) : 0.0;
    release(); /* the checks' buffers: a job's first product allocates its own */
    if (!(eb <= SELFCHECK_TOL) || !(ef <= SELFCHECK_TOL)) {
        lib_f32 = lib_bf16 = MT_MATMUL_OPENBLAS;
        if (request == MT_MATMUL_ONEDNN) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "runtime.matmul = \"onednn\": oneDNN's products are off a double reference by %.2g "
                            "(relative) on this CPU; set runtime.matmul = \"openblas\"",
                            fmax(eb, ef));
        }
        snprintf(describe, sizeof(describe),
                 "f32 and bf16 on OpenBLAS, bf16 emulated (auto: oneDNN's products are off a double reference by "
                 "%.2g here)",
                 fmax(eb, ef));
        return MT_OK;
    }
    char f32[128], b16[160];
    if (lib_f32 == MT_MATMUL_ONEDNN) {
        snprintf(f32, sizeof(f32), "f32 %s %s", onednn_version(), kf);
    } else {
        snprintf(f32, sizeof(f32), "f32 on OpenBLAS (oneDNN has %s)", kf ? "only its reference f32 code" : "none");
    }
    if (lib_bf16 == MT_MATMUL_ONEDNN) {
        if (lib_f32 == MT_MATMUL_ONEDNN) {
            snprintf(b16, sizeof(b16), "bf16 %s", kb);
        } else {
            snprintf(b16, sizeof(b16), "bf16 %s %s", onednn_version(), kb);
        }
    } else {
        snprintf(b16, sizeof(b16), "bf16 emulated on %s (%s)", lib_f32 == MT_MATMUL_ONEDNN ? "oneDNN" : "OpenBLAS",
                 !kb                                  ? "oneDNN has no bf16 product on this CPU"
                 : !(cpu.amx_bf16 || cpu.avx512_bf16) ? "the CPU has neither AMX-BF16 nor AVX512-BF16"
                                                      : "oneDNN has no native bf16 kernel here");
    }
    snprintf(describe, sizeof(describe), "%s, %s (%s; products checked against a double reference)", f32, b16, how);
    return MT_OK;
#else
    if (request == MT_MATMUL_ONEDNN) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "runtime.matmul = \"onednn\": this build has no oneDNN; install it (apt-get install "
                        "libdnnl-dev, or scripts/setup.sh) and rebuild, or set runtime.matmul = \"auto\"");
    }
    return MT_OK;
#endif
}
