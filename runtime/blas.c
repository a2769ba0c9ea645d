/* runtime.blas_core: which OpenBLAS kernel this process runs, and why (blas.h).
 * SPDX-License-Identifier: MIT */
#include "blas.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "mt_core.h"
#include "rt.h"

/* Set by the process that restarts itself with another kernel: "KERNEL|PREVIOUS|WHY". */
#define SWITCH_ENV "MESHTRAIN_BLAS_SWITCH"
/* Set when the restarted process rejected the kernel and restarted once more without it: "KERNEL|WHY". */
#define REJECT_ENV "MESHTRAIN_BLAS_REJECTED"

enum {
    F_SSE2 = 1 << 0,
    F_SSE3 = 1 << 1,
    F_SSSE3 = 1 << 2,
    F_SSE41 = 1 << 3,
    F_SSE4A = 1 << 4,
    F_AVX = 1 << 5,
    F_FMA = 1 << 6,
    F_FMA4 = 1 << 7,
    F_AVX2 = 1 << 8,
    F_AVX512 = 1 << 9,
    F_BF16 = 1 << 10,
    F_AMX = 1 << 11,
};

/* level orders the f32 kernels by the vector width they use: 1 SSE, 2 SSSE3/SSE4, 3 AVX, 4 AVX2+FMA,
 * 5 AVX-512. auto moves only upward. */
static const struct {
    const char *name;
    int level;
    unsigned needs;
} cores[] = {
    {"Opteron", 1, F_SSE2},
    {"Prescott", 1, F_SSE2 | F_SSE3},
    {"Atom", 1, F_SSE2 | F_SSE3 | F_SSSE3},
    {"Nano", 1, F_SSE2 | F_SSE3 | F_SSSE3},
    {"Barcelona", 1, F_SSE2 | F_SSE3 | F_SSE4A},
    {"Bobcat", 1, F_SSE2 | F_SSE3 | F_SSSE3 | F_SSE4A},
    {"Core2", 2, F_SSE2 | F_SSE3 | F_SSSE3},
    {"Penryn", 2, F_SSE2 | F_SSE3 | F_SSSE3 | F_SSE41},
    {"Dunnington", 2, F_SSE2 | F_SSE3 | F_SSSE3 | F_SSE41},
    {"Nehalem", 2, F_SSE2 | F_SSE3 | F_SSSE3 | F_SSE41},
    {"Sandybridge", 3, F_SSE2 | F_SSE3 | F_SSSE3 | F_SSE41 | F_AVX},
    {"Bulldozer", 3, F_SSE2 | F_SSE3 | F_SSSE3 | F_SSE41 | F_AVX | F_FMA4},
    {"Piledriver", 3, F_SSE2 | F_SSE3 | F_SSSE3 | F_SSE41 | F_AVX | F_FMA | F_FMA4},
    {"Steamroller", 3, F_SSE2 | F_SSE3 | F_SSSE3 | F_SSE41 | F_AVX | F_FMA | F_FMA4},
    {"Excavator", 3, F_SSE2 | F_SSE3 | F_SSSE3 | F_SSE41 | F_AVX | F_FMA | F_FMA4 | F_AVX2},
    {"Haswell", 4, F_SSE2 | F_SSE3 | F_SSSE3 | F_SSE41 | F_AVX | F_FMA | F_AVX2},
    {"Zen", 4, F_SSE2 | F_SSE3 | F_SSSE3 | F_SSE41 | F_AVX | F_FMA | F_AVX2},
    {"SkylakeX", 5, F_SSE2 | F_SSE3 | F_SSSE3 | F_SSE41 | F_AVX | F_FMA | F_AVX2 | F_AVX512},
    {"Cooperlake", 5, F_SSE2 | F_SSE3 | F_SSSE3 | F_SSE41 | F_AVX | F_FMA | F_AVX2 | F_AVX512 | F_BF16},
    {"SapphireRapids", 5, F_SSE2 | F_SSE3 | F_SSSE3 | F_SSE41 | F_AVX | F_FMA | F_AVX2 | F_AVX512 | F_BF16 | F_AMX},
};

static const char *const feature_names[] = {"sse2",        "sse3",
                                            "ssse3",       "sse4.1",
                                            "sse4a",       "avx",
                                            "fma",         "fma4",
                                            "avx2",        "avx512f avx512bw avx512dq avx512vl avx512cd",
                                            "avx512_bf16", "amx_tile amx_bf16"};

static unsigned cpu_mask(const mt_cpu_t *c) {
    return (c->sse2 ? F_SSE2 : 0) | (c->sse3 ? F_SSE3 : 0) | (c->ssse3 ? F_SSSE3 : 0) | (c->sse41 ? F_SSE41 : 0) |
           (c->sse4a ? F_SSE4A : 0) | (c->avx ? F_AVX : 0) | (c->fma ? F_FMA : 0) | (c->fma4 ? F_FMA4 : 0) |
           (c->avx2 ? F_AVX2 : 0) | (mt_cpu_has_avx512(c) ? F_AVX512 : 0) | (c->avx512_bf16 ? F_BF16 : 0) |
           (c->amx_tile && c->amx_bf16 ? F_AMX : 0);
}

static int core_index(const char *name) {
    for (size_t i = 0; name && i < MT_ARRAY_LEN(cores); i++) {
        if (!strcasecmp(cores[i].name, name)) {
            return (int)i;
        }
    }
    return -1;
}

bool mt_blas_core_runs(const mt_cpu_t *cpu, const char *name, char *missing, size_t len) {
    int i = core_index(name);
    if (i < 0) {
        if (missing) {
            snprintf(missing, len, "'%s' is not a kernel meshtrain knows", name ? name : "(null)");
        }
        return false;
    }
    unsigned lack = cores[i].needs & ~cpu_mask(cpu);
    if (lack && missing) {
        size_t used = 0;
        missing[0] = '\0';
        for (size_t b = 0; b < MT_ARRAY_LEN(feature_names) && used < len; b++) {
            if (lack & (1u << b)) {
                int w = snprintf(missing + used, len - used, "%s%s", used ? " " : "", feature_names[b]);
                used += w > 0 ? (size_t)w : 0;
            }
        }
    }
    return lack == 0;
}

const char *mt_blas_best_core(const mt_cpu_t *c) {
    bool amd = !strcmp(c->vendor, "AuthenticAMD") || !strcmp(c->vendor, "HygonGenuine");
    if (mt_cpu_has_avx512(c)) {
        return "SkylakeX"; /* also Zen 4 and later: OpenBLAS 0.3.21 has no kernel of its own for them */
    }
    if (c->avx2 && c->fma) {
        return amd ? "Zen" : "Haswell";
    }
    if (c->avx) {
        return amd && c->fma4 ? (c->fma ? "Piledriver" : "Bulldozer") : "Sandybridge";
    }
    if (c->sse41 && c->ssse3) {
        return "Nehalem";
    }
    if (c->ssse3) {
        return "Core2";
    }
    return c->sse3 ? "Prescott" : "Opteron";
}

void mt_blas_plan(const mt_cpu_t *cpu, const char *current, bool dynamic, const char *env_core, const char *env_l2,
                  const char *request, mt_blas_plan_t *out) {
    memset(out, 0, sizeof(*out));
    char lack[160];
    char isa[64];
    snprintf(isa, sizeof(isa), "%s", mt_cpu_vector_isa(cpu));
    if (!request || !request[0]) {
        request = "auto";
    }
    current = current ? current : "unknown";
    if (env_core && env_core[0] && !mt_blas_core_runs(cpu, env_core, lack, sizeof(lack)) && core_index(env_core) >= 0) {
        out->action = MT_BLAS_FAIL;
        snprintf(out->why, sizeof(out->why),
                 "OPENBLAS_CORETYPE=%s in the environment names a kernel this CPU cannot run (it lacks %s): the first "
                 "matrix product would die of an illegal instruction; unset OPENBLAS_CORETYPE or set it to one the "
                 "CPU runs (best here: %s)",
                 env_core, lack, mt_blas_best_core(cpu));
        return;
    }
    if (!strcmp(request, "keep")) {
        snprintf(out->why, sizeof(out->why), "runtime.blas_core = keep: OpenBLAS's own choice");
        return;
    }
    if (strcmp(request, "auto") != 0) { /* a kernel by name */
        if (core_index(request) < 0) {
            out->action = MT_BLAS_FAIL;
            snprintf(out->why, sizeof(out->why),
                     "runtime.blas_core = \"%s\" is not an OpenBLAS kernel: choose auto, keep or one of the names in "
                     "`meshtrain config --schema`",
                     request);
            return;
        }
        if (!mt_blas_core_runs(cpu, request, lack, sizeof(lack))) {
            out->action = MT_BLAS_FAIL;
            snprintf(out->why, sizeof(out->why),
                     "runtime.blas_core = \"%s\" needs %s, which this CPU does not execute: choose a kernel it runs "
                     "(best here: %s) or auto",
                     request, lack, mt_blas_best_core(cpu));
            return;
        }
        if (env_core && env_core[0]) {
            if (!strcasecmp(env_core, request)) {
                snprintf(out->why, sizeof(out->why), "runtime.blas_core = %s, as OPENBLAS_CORETYPE already says",
                         request);
                return;
            }
            out->action = MT_BLAS_FAIL;
            snprintf(
                out->why, sizeof(out->why),
                "runtime.blas_core = \"%s\" but OPENBLAS_CORETYPE=%s in the environment: meshtrain never overrides "
                "it; unset OPENBLAS_CORETYPE, or set runtime.blas_core = keep",
                request, env_core);
            return;
        }
        if (!strcasecmp(current, request)) {
            snprintf(out->why, sizeof(out->why), "runtime.blas_core = %s, OpenBLAS's own choice too", request);
            return;
        }
        if (!dynamic) {
            out->action = MT_BLAS_FAIL;
            snprintf(out->why, sizeof(out->why),
                     "runtime.blas_core = \"%s\" but this OpenBLAS was built for one CPU (%s, no DYNAMIC_ARCH) and "
                     "cannot switch: use a DYNAMIC_ARCH build (Debian's libopenblas0-pthread) or runtime.blas_core = "
                     "keep",
                     request, current);
            return;
        }
        out->action = MT_BLAS_SET;
        snprintf(out->core, sizeof(out->core), "%s", cores[core_index(request)].name);
        snprintf(out->why, sizeof(out->why), "runtime.blas_core = %s; OpenBLAS chose %s", out->core, current);
        return;
    }
    if (env_core && env_core[0]) {
        snprintf(out->why, sizeof(out->why), "auto: OPENBLAS_CORETYPE=%s set in the environment, left as it is",
                 env_core);
        return;
    }
    if (env_l2 && env_l2[0]) {
        snprintf(out->why, sizeof(out->why),
                 "auto: OPENBLAS_L2_SIZE=%s set in the environment, OpenBLAS's choice "
                 "left as it is",
                 env_l2);
        return;
    }
    int cur = core_index(current);
    const char *best = mt_blas_best_core(cpu);
    if (cur < 0) {
        snprintf(out->why, sizeof(out->why), "auto: OpenBLAS chose %s, a kernel meshtrain does not rank; left as it is",
                 current);
        return;
    }
    if (cores[cur].level >= cores[core_index(best)].level) {
        snprintf(out->why, sizeof(out->why), "auto: OpenBLAS's choice, the best this CPU runs (%s)", isa);
        return;
    }
    if (!dynamic) {
        snprintf(out->why, sizeof(out->why),
                 "auto: OpenBLAS runs %s, weaker than this CPU's %s (%s), and was built without DYNAMIC_ARCH so it "
                 "cannot switch: install a DYNAMIC_ARCH build (Debian's libopenblas0-pthread) for full speed",
                 current, best, isa);
        return;
    }
    out->action = MT_BLAS_SET;
    snprintf(out->core, sizeof(out->core), "%s", best);
    snprintf(out->why, sizeof(out->why), "auto: OpenBLAS chose %s, but this CPU runs %s", current, isa);
}

/* ---- the self-check ----------------------------------------------------------------------------- */

static double check_one(bool ta, bool tb, int m, int n, int k, float alpha, float beta) {
    float *a = malloc(sizeof(float) * (size_t)m * k), *b = malloc(sizeof(float) * (size_t)k * n);
    float *c = malloc(sizeof(float) * (size_t)m * n), *c0 = malloc(sizeof(float) * (size_t)m * n);
    double worst = INFINITY; /* no memory: no verdict, reported as a failure */
    if (a && b && c && c0) {
        uint32_t s = 12345u;
        for (size_t i = 0; i < (size_t)m * k; i++) {
            s = s * 1664525u + 1013904223u;
            a[i] = (float)((int)(s >> 9) % 2001 - 1000) / 1000.0f;
        }
        for (size_t i = 0; i < (size_t)k * n; i++) {
            s = s * 1664525u + 1013904223u;
            b[i] = (float)((int)(s >> 9) % 2001 - 1000) / 1000.0f;
        }
        for (size_t i = 0; i < (size_t)m * n; i++) {
            c[i] = c0[i] = (float)(i % 13) * 0.125f - 0.75f;
        }
        int lda = ta ? m : k, ldb = tb ? k : n;
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
                    lda, b, ldb, beta, c, n);
        worst = 0.0;
        for (int i = 0; i < m; i++) {
            for (int j = 0; j < n; j++) {
                double sum = 0.0, mag = 0.0;
                for (int p = 0; p < k; p++) {
                    double x = ta ? a[(size_t)p * m + i] : a[(size_t)i * k + p];
                    double y = tb ? b[(size_t)j * k + p] : b[(size_t)p * n + j];
                    sum += x * y;
                    mag += fabs(x * y);
                }
                double ref = alpha * sum + beta * c0[(size_t)i * n + j];
                double scale = fabs(alpha) * mag + fabs(beta * c0[(size_t)i * n + j]) + 1e-30;
                double err = fabs((double)c[(size_t)i * n + j] - ref) / scale;
                worst = isfinite(err) ? MT_MAX(worst, err) : INFINITY;
            }
        }
    }
    free(a);
    free(b);
    free(c);
    free(c0);
    return worst;
}

double mt_blas_selfcheck(void) {
    /* Sizes off every blocking factor, and one past a kernel's packing panel (k > 256). */
    double e = check_one(false, false, 61, 67, 129, 1.0f, 0.0f);
    e = MT_MAX(e, check_one(false, true, 37, 83, 300, 0.5f, 1.0f));
    e = MT_MAX(e, check_one(true, false, 96, 33, 77, -1.0f, 0.25f));
    e = MT_MAX(e, check_one(true, true, 7, 129, 45, 1.0f, 0.0f));
    return e;
}

/* float rounding grows with k: a product of 300 terms is within ~300 ulp-ish bounds of the exact sum;
 * a wrong kernel is off by O(1). */
#define SELFCHECK_TOL 1e-4

/* ---- start-up --------------------------------------------------------------------------------- */

static char describe[768];
static char brief[128];

static const char *library_version(void) {
    static char v[64];
    const char *cfg = openblas_get_config();
    if (!v[0]) {
        /* "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": the first two words */
        const char *sp = cfg ? strchr(cfg, ' ') : NULL;
        const char *sp2 = sp ? strchr(sp + 1, ' ') : NULL;
        snprintf(v, sizeof(v), "%.*s", sp2 ? (int)(sp2 - cfg) : (cfg ? (int)strlen(cfg) : 8), cfg ? cfg : "OpenBLAS");
    }
    return v;
}

static bool library_dynamic(void) {
    const char *cfg = openblas_get_config();
    return cfg && strstr(cfg, "DYNAMIC_ARCH") != NULL;
}

static bool is_rank0(void) {
    mt_launcher_info_t li;
    mt_launcher_detect(&li);
    return li.rank <= 0;
}

static void set_describe(const char *core, const char *how) {
    double err = mt_blas_selfcheck();
    char check[96];
    if (err <= SELFCHECK_TOL) {
        snprintf(check, sizeof(check), "products checked against a double reference");
    } else {
        snprintf(check, sizeof(check), "WARNING: products off a double reference by %.2g (relative)", err);
        if (is_rank0()) {
            fprintf(stderr,
                    "meshtrain: warning: OpenBLAS's %s kernel computes wrong products here (error %.2g): set "
                    "runtime.blas_core or OPENBLAS_CORETYPE to another kernel\n",
                    core, err);
        }
    }
    snprintf(describe, sizeof(describe), "%s, kernel %s (%s; %s)", library_version(), core, how, check);
    snprintf(brief, sizeof(brief), "%s %s", library_version(), core);
}

/* Restarts this program with the same arguments; returns only when execv failed. */
static void restart(char **argv) {
    fflush(stdout);
    fflush(stderr);
    execv("/proc/self/exe", argv);
}

int mt_blas_startup(char **argv, const char *request) {
    mt_cpu_t cpu;
    mt_cpu_detect(&cpu);
    const char *current = openblas_get_corename();
    bool explicit_name = request && request[0] && strcmp(request, "auto") && strcmp(request, "keep");
    const char *sw = getenv(SWITCH_ENV), *env_core = getenv("OPENBLAS_CORETYPE");
    if (sw && env_core) { /* this process was restarted to run the kernel named in SWITCH_ENV */
        char want[32] = "", why[512] = "";
        const char *b1 = strchr(sw, '|'), *b2 = b1 ? strchr(b1 + 1, '|') : NULL;
        if (b1 && b2) {
            snprintf(want, sizeof(want), "%.*s", (int)(b1 - sw), sw);
            snprintf(why, sizeof(why), "%s", b2 + 1);
        }
        if (want[0] && !strcasecmp(want, env_core)) {
            unsetenv(SWITCH_ENV);
            double err = strcasecmp(current, want) ? 0.0 : mt_blas_selfcheck();
            char reject[160] = "";
            if (strcasecmp(current, want) != 0) {
                snprintf(reject, sizeof(reject), "this OpenBLAS has no %s kernel (it fell back to %s)", want, current);
            } else if (!(err <= SELFCHECK_TOL)) {
                snprintf(reject, sizeof(reject), "its products were off a double reference by %.2g", err);
            }
            if (!reject[0]) {
                set_describe(current, why); /* why names prev, OpenBLAS's own choice */
                return 0;
            }
            if (explicit_name) {
                if (is_rank0()) {
                    fprintf(stderr,
                            "meshtrain: runtime.blas_core = \"%s\" cannot be used: %s; choose auto, keep or "
                            "another kernel\n",
                            want, reject);
                }
                return 2;
            }
            char val[256];
            snprintf(val, sizeof(val), "%s|%s", want, reject);
            unsetenv("OPENBLAS_CORETYPE");
            setenv(REJECT_ENV, val, 1);
            restart(argv);
            snprintf(describe, sizeof(describe),
                     "%s, kernel %s (auto switched to it although %s: restarting "
                     "without it failed: %s)",
                     library_version(), current, reject, strerror(errno));
            snprintf(brief, sizeof(brief), "%s %s", library_version(), current);
            return 0;
        }
        unsetenv(SWITCH_ENV); /* the environment's OPENBLAS_CORETYPE is not ours: treat it as the user's */
    }
    const char *rej = getenv(REJECT_ENV);
    if (rej) {
        char how[400];
        const char *bar = strchr(rej, '|');
        snprintf(how, sizeof(how), "OpenBLAS's choice: auto tried %.*s and went back because %s",
                 bar ? (int)(bar - rej) : 0, rej, bar ? bar + 1 : "it failed");
        unsetenv(REJECT_ENV);
        set_describe(current, how);
        return 0;
    }
    mt_blas_plan_t plan;
    mt_blas_plan(&cpu, current, library_dynamic(), env_core, getenv("OPENBLAS_L2_SIZE"), request, &plan);
    if (plan.action == MT_BLAS_FAIL) {
        if (is_rank0()) {
            fprintf(stderr, "meshtrain: %s\n", plan.why);
        }
        return 2;
    }
    if (plan.action == MT_BLAS_SET) {
        char val[600];
        snprintf(val, sizeof(val), "%s|%s|%s", plan.core, current, plan.why);
        setenv("OPENBLAS_CORETYPE", plan.core, 1);
        setenv(SWITCH_ENV, val, 1);
        restart(argv);
        int e = errno; /* still here: run on with OpenBLAS's choice */
        unsetenv("OPENBLAS_CORETYPE");
        unsetenv(SWITCH_ENV);
        if (explicit_name) {
            if (is_rank0()) {
                fprintf(stderr,
                        "meshtrain: runtime.blas_core = \"%s\": restarting with that kernel failed (execv "
                        "/proc/self/exe: %s); use keep\n",
                        plan.core, strerror(e));
            }
            return 2;
        }
        char how[700];
        snprintf(how, sizeof(how), "%s; restarting with %s failed (execv /proc/self/exe: %s)", plan.why, plan.core,
                 strerror(e));
        set_describe(current, how);
        return 0;
    }
    set_describe(current, plan.why);
    return 0;
}

const char *mt_blas_describe(void) {
    if (!describe[0]) { /* a program that never ran mt_blas_startup (the tests): OpenBLAS's own choice */
        set_describe(openblas_get_corename(), "OpenBLAS's choice");
    }
    return describe;
}

const char *mt_blas_short(void) {
    if (!brief[0]) {
        mt_blas_describe();
    }
    return brief;
}
