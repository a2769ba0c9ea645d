/* cpuid/xgetbv feature detection and the measured f32 vector peak of one core (cpu.h). The peak probe
 * runs independent dependency chains (more than FMA latency x FMA ports, so the units never wait on a
 * result) in functions compiled for one extension each and called only when the CPU and OS allow it.
 * SPDX-License-Identifier: MIT */
#include "cpu.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mt_core.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

void mt_cpu_detect(mt_cpu_t *out) {
    memset(out, 0, sizeof(*out));
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) {
        return;
    }
    unsigned max_leaf = a;
    memcpy(out->vendor, &b, 4);
    memcpy(out->vendor + 4, &d, 4);
    memcpy(out->vendor + 8, &c, 4);
    __get_cpuid(1, &a, &b, &c, &d);
    int fam = (int)((a >> 8) & 0xf), mod = (int)((a >> 4) & 0xf);
    if (fam == 0xf) {
        fam += (int)((a >> 20) & 0xff);
    }
    if (fam == 6 || fam >= 0xf) {
        mod |= (int)((a >> 16) & 0xf) << 4;
    }
    out->family = fam;
    out->model = mod;
    bool osxsave = (c >> 27) & 1;
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    bool os_avx = (xcr0 & 0x6) == 0x6;         /* XMM and YMM state */
    bool os_avx512 = (xcr0 & 0xe6) == 0xe6;    /* plus opmask, ZMM_Hi256, Hi16_ZMM */
    bool os_amx = (xcr0 & 0x60000) == 0x60000; /* XTILECFG and XTILEDATA */
    out->sse2 = (d >> 26) & 1;
    out->sse3 = c & 1;
    out->ssse3 = (c >> 9) & 1;
    out->sse41 = (c >> 19) & 1;
    out->sse42 = (c >> 20) & 1;
    out->avx = os_avx && ((c >> 28) & 1);
    out->fma = out->avx && ((c >> 12) & 1);
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        unsigned max_sub = a;
        out->avx2 = out->avx && ((b >> 5) & 1);
        out->avx512f = os_avx512 && ((b >> 16) & 1);
        out->avx512dq = out->avx512f && ((b >> 17) & 1);
        out->avx512cd = out->avx512f && ((b >> 28) & 1);
        out->avx512bw = out->avx512f && ((b >> 30) & 1);
        out->avx512vl = out->avx512f && ((b >> 31) & 1);
        out->avx512_fp16 = out->avx512f && ((d >> 23) & 1);
        out->amx_bf16 = os_amx && ((d >> 22) & 1);
        out->amx_tile = os_amx && ((d >> 24) & 1);
        if (max_sub >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            out->avx512_bf16 = out->avx512f && ((a >> 5) & 1);
        }
    }
    __get_cpuid(0x80000000, &a, &b, &c, &d);
    unsigned max_ext = a;
    if (max_ext >= 0x80000001) {
        __get_cpuid(0x80000001, &a, &b, &c, &d);
        out->sse4a = (c >> 6) & 1;
        out->fma4 = out->avx && ((c >> 16) & 1);
    }
    if (max_ext >= 0x80000004) {
        unsigned r[12];
        for (unsigned i = 0; i < 3; i++) {
            __get_cpuid(0x80000002 + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
        }
        char brand[49];
        memcpy(brand, r, 48);
        brand[48] = '\0';
        const char *s = brand;
        while (*s == ' ') {
            s++;
        }
        snprintf(out->brand, sizeof(out->brand), "%s", s);
        size_t n = strlen(out->brand);
        while (n > 0 && out->brand[n - 1] == ' ') {
            out->brand[--n] = '\0';
        }
    }
#endif
}

bool mt_cpu_has_avx512(const mt_cpu_t *c) {
    return c->avx512f && c->avx512bw && c->avx512dq && c->avx512vl && c->avx512cd;
}

void mt_cpu_features_str(const mt_cpu_t *c, char *buf, size_t len) {
    const struct {
        bool on;
        const char *name;
    } f[] = {{c->sse2, "sse2"},
             {c->sse3, "sse3"},
             {c->ssse3, "ssse3"},
             {c->sse41, "sse4.1"},
             {c->sse42, "sse4.2"},
             {c->sse4a, "sse4a"},
             {c->avx, "avx"},
             {c->fma, "fma"},
             {c->fma4, "fma4"},
             {c->avx2, "avx2"},
             {c->avx512f, "avx512f"},
             {c->avx512bw, "avx512bw"},
             {c->avx512dq, "avx512dq"},
             {c->avx512vl, "avx512vl"},
             {c->avx512cd, "avx512cd"},
             {c->avx512_bf16, "avx512_bf16"},
             {c->avx512_fp16, "avx512_fp16"},
             {c->amx_tile, "amx_tile"},
             {c->amx_bf16, "amx_bf16"}};
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < MT_ARRAY_LEN(f); i++) {
        if (f[i].on && used < len) {
            int w = snprintf(buf + used, len - used, "%s%s", used ? " " : "", f[i].name);
            used += w > 0 ? (size_t)w : 0;
        }
    }
    if (!used && len > 0) {
        snprintf(buf, len, "none detected");
    }
}

const char *mt_cpu_vector_isa(const mt_cpu_t *c) {
    if (c->avx512f) {
        return "AVX-512";
    }
    if (c->avx2 && c->fma) {
        return "AVX2+FMA";
    }
    if (c->avx) {
        return "AVX";
    }
    if (c->sse2) {
        return "SSE";
    }
    return "scalar";
}

/* ---- the peak probe: each returns the FLOPs it executed; sink keeps the chains alive ---------------- */

static volatile float sink;

#if defined(__x86_64__)
/* 16 chains of x = x * m + k (m < 1: x converges to k / (1 - m), no overflow, no denormals). */
__attribute__((target("avx512f"))) static double chains_avx512(long iters) {
    __m512 m = _mm512_set1_ps(0.999f), k = _mm512_set1_ps(0.001f);
    __m512 x0 = _mm512_set1_ps(0.1f), x1 = _mm512_set1_ps(0.2f), x2 = _mm512_set1_ps(0.3f), x3 = _mm512_set1_ps(0.4f),
           x4 = _mm512_set1_ps(0.5f), x5 = _mm512_set1_ps(0.6f), x6 = _mm512_set1_ps(0.7f), x7 = _mm512_set1_ps(0.8f),
           x8 = _mm512_set1_ps(0.9f), x9 = _mm512_set1_ps(1.1f), x10 = _mm512_set1_ps(1.2f), x11 = _mm512_set1_ps(1.3f),
           x12 = _mm512_set1_ps(1.4f), x13 = _mm512_set1_ps(1.5f), x14 = _mm512_set1_ps(1.6f),
           x15 = _mm512_set1_ps(1.7f);
    for (long i = 0; i < iters; i++) {
        x0 = _mm512_fmadd_ps(x0, m, k);
        x1 = _mm512_fmadd_ps(x1, m, k);
        x2 = _mm512_fmadd_ps(x2, m, k);
        x3 = _mm512_fmadd_ps(x3, m, k);
        x4 = _mm512_fmadd_ps(x4, m, k);
        x5 = _mm512_fmadd_ps(x5, m, k);
        x6 = _mm512_fmadd_ps(x6, m, k);
        x7 = _mm512_fmadd_ps(x7, m, k);
        x8 = _mm512_fmadd_ps(x8, m, k);
        x9 = _mm512_fmadd_ps(x9, m, k);
        x10 = _mm512_fmadd_ps(x10, m, k);
        x11 = _mm512_fmadd_ps(x11, m, k);
        x12 = _mm512_fmadd_ps(x12, m, k);
        x13 = _mm512_fmadd_ps(x13, m, k);
        x14 = _mm512_fmadd_ps(x14, m, k);
        x15 = _mm512_fmadd_ps(x15, m, k);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(x0, x1), _mm512_add_ps(x2, x3)),
                             _mm512_add_ps(_mm512_add_ps(x4, x5), _mm512_add_ps(x6, x7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(x8, x9), _mm512_add_ps(x10, x11)),
                                       _mm512_add_ps(_mm512_add_ps(x12, x13), _mm512_add_ps(x14, x15))));
    sink = _mm512_reduce_add_ps(s);
    return (double)iters * 16 * 16 * 2;
}

/* 12 chains: Haswell to Zen 4 have two FMA ports of latency 4-5, so 10 keep them busy. */
__attribute__((target("avx2,fma"))) static double chains_fma(long iters) {
    __m256 m = _mm256_set1_ps(0.999f), k = _mm256_set1_ps(0.001f);
    __m256 x0 = _mm256_set1_ps(0.1f), x1 = _mm256_set1_ps(0.2f), x2 = _mm256_set1_ps(0.3f), x3 = _mm256_set1_ps(0.4f),
           x4 = _mm256_set1_ps(0.5f), x5 = _mm256_set1_ps(0.6f), x6 = _mm256_set1_ps(0.7f), x7 = _mm256_set1_ps(0.8f),
           x8 = _mm256_set1_ps(0.9f), x9 = _mm256_set1_ps(1.1f), x10 = _mm256_set1_ps(1.2f), x11 = _mm256_set1_ps(1.3f);
    for (long i = 0; i < iters; i++) {
        x0 = _mm256_fmadd_ps(x0, m, k);
        x1 = _mm256_fmadd_ps(x1, m, k);
        x2 = _mm256_fmadd_ps(x2, m, k);
        x3 = _mm256_fmadd_ps(x3, m, k);
        x4 = _mm256_fmadd_ps(x4, m, k);
        x5 = _mm256_fmadd_ps(x5, m, k);
        x6 = _mm256_fmadd_ps(x6, m, k);
        x7 = _mm256_fmadd_ps(x7, m, k);
        x8 = _mm256_fmadd_ps(x8, m, k);
        x9 = _mm256_fmadd_ps(x9, m, k);
        x10 = _mm256_fmadd_ps(x10, m, k);
        x11 = _mm256_fmadd_ps(x11, m, k);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3)),
                             _mm256_add_ps(_mm256_add_ps(x4, x5), _mm256_add_ps(x6, x7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(x8, x9), _mm256_add_ps(x10, x11)));
    float v[8];
    _mm256_storeu_ps(v, s);
    sink = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
    return (double)iters * 12 * 8 * 2;
}

/* Without FMA the multiplier and the adder are separate units: 6 multiply chains (x * m, then x * 1/m
 * so x stays near where it started) beside 6 add chains, each one FLOP per lane. */
#define MT_MUL_ADD_CHAINS(V, SET1, MUL, ADD, LANES, STORE)                                                             \
    V m = SET1(1.001f), mi = SET1(1.0f / 1.001f), k = SET1(1e-3f), nk = SET1(-1e-3f);                                  \
    V p0 = SET1(0.1f), p1 = SET1(0.2f), p2 = SET1(0.3f), p3 = SET1(0.4f), p4 = SET1(0.5f), p5 = SET1(0.6f);            \
    V a0 = SET1(1.1f), a1 = SET1(1.2f), a2 = SET1(1.3f), a3 = SET1(1.4f), a4 = SET1(1.5f), a5 = SET1(1.6f);            \
    for (long i = 0; i < iters; i++) {                                                                                 \
        V f = (i & 1) ? mi : m, g = (i & 1) ? nk : k;                                                                  \
        p0 = MUL(p0, f);                                                                                               \
        a0 = ADD(a0, g);                                                                                               \
        p1 = MUL(p1, f);                                                                                               \
        a1 = ADD(a1, g);                                                                                               \
        p2 = MUL(p2, f);                                                                                               \
        a2 = ADD(a2, g);                                                                                               \
        p3 = MUL(p3, f);                                                                                               \
        a3 = ADD(a3, g);                                                                                               \
        p4 = MUL(p4, f);                                                                                               \
        a4 = ADD(a4, g);                                                                                               \
        p5 = MUL(p5, f);                                                                                               \
        a5 = ADD(a5, g);                                                                                               \
    }                                                                                                                  \
    V s = ADD(ADD(ADD(p0, p1), ADD(p2, p3)), ADD(ADD(p4, p5), ADD(ADD(a0, a1), ADD(a2, a3))));                         \
    s = ADD(s, ADD(a4, a5));                                                                                           \
    float v[LANES];                                                                                                    \
    STORE(v, s);                                                                                                       \
    float t = 0.0f;                                                                                                    \
    for (int l = 0; l < (LANES); l++) {                                                                                \
        t += v[l];                                                                                                     \
    }                                                                                                                  \
    sink = t;                                                                                                          \
    return (double)iters * 12 * (LANES)

__attribute__((target("avx"))) static double chains_avx(long iters) {
    MT_MUL_ADD_CHAINS(__m256, _mm256_set1_ps, _mm256_mul_ps, _mm256_add_ps, 8, _mm256_storeu_ps);
}

static double chains_sse(long iters) {
    MT_MUL_ADD_CHAINS(__m128, _mm_set1_ps, _mm_mul_ps, _mm_add_ps, 4, _mm_storeu_ps);
}
#endif

static double chains_scalar(long iters) {
    float x[8] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};
    for (long i = 0; i < iters; i++) {
        for (int c = 0; c < 8; c++) {
            x[c] = x[c] * 0.999f + 0.001f;
        }
    }
    sink = x[0] + x[1] + x[2] + x[3] + x[4] + x[5] + x[6] + x[7];
    return (double)iters * 8 * 2;
}

double mt_cpu_f32_peak_core(const mt_cpu_t *c) {
    double (*run)(long) = chains_scalar;
#if defined(__x86_64__)
    if (c->avx512f) {
        run = chains_avx512;
    } else if (c->avx2 && c->fma) {
        run = chains_fma;
    } else if (c->avx) {
        run = chains_avx;
    } else if (c->sse2) {
        run = chains_sse;
    }
#else
    (void)c;
#endif
    /* Size one run to ~4 ms from a short calibration, then keep the best of 8: a run the scheduler
     * interrupted is slower, never faster, so the best is the closest to the core's own rate. */
    long iters = 20000;
    double t0 = mt_now();
    run(iters);
    double dt = mt_now() - t0;
    if (dt > 0) {
        double scale = 4e-3 / dt;
        scale = scale < 1.0 ? 1.0 : (scale > 1000.0 ? 1000.0 : scale);
        iters = (long)((double)iters * scale);
    }
    double best = 0.0;
    for (int rep = 0; rep < 8; rep++) {
        t0 = mt_now();
        double flops = run(iters);
        dt = mt_now() - t0;
        if (dt > 0) {
            best = MT_MAX(best, flops / dt);
        }
    }
    return best;
}
