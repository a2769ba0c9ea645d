/* runtime.blas_core and the CPU it decides on: the policy over synthetic CPUs (an AVX-512 Xeon that
 * OpenBLAS mistook for Prescott, a Zen, an AVX2 Intel, an old SSE machine), the rules it must never break
 * (no kernel the CPU cannot run, never over the environment's OPENBLAS_CORETYPE or OPENBLAS_L2_SIZE, auto
 * only upward), then this machine: cpuid against /proc/cpuinfo, the vector peak probe, the product check
 * with the kernel OpenBLAS runs here. The environment is never changed.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "runtime/blas.h"
#include "runtime/cpu.h"
#include "testutil.h"

static mt_cpu_t cpu_sse(void) {
    mt_cpu_t c;
    memset(&c, 0, sizeof(c));
    snprintf(c.vendor, sizeof(c.vendor), "GenuineIntel");
    c.sse2 = c.sse3 = true;
    return c;
}

static mt_cpu_t cpu_avx2(const char *vendor) {
    mt_cpu_t c = cpu_sse();
    snprintf(c.vendor, sizeof(c.vendor), "%s", vendor);
    c.ssse3 = c.sse41 = c.sse42 = c.avx = c.fma = c.avx2 = true;
    c.sse4a = !strcmp(vendor, "AuthenticAMD");
    return c;
}

static mt_cpu_t cpu_xeon_amx(void) {
    mt_cpu_t c = cpu_avx2("GenuineIntel");
    c.avx512f = c.avx512bw = c.avx512dq = c.avx512vl = c.avx512cd = c.avx512_bf16 = c.avx512_fp16 = true;
    c.amx_tile = c.amx_bf16 = true;
    return c;
}

static mt_blas_plan_t plan(const mt_cpu_t *c, const char *cur, bool dyn, const char *env_core, const char *env_l2,
                           const char *req) {
    mt_blas_plan_t p;
    mt_blas_plan(c, cur, dyn, env_core, env_l2, req, &p);
    return p;
}

static void policy(void) {
    mt_cpu_t xeon = cpu_xeon_amx(), zen = cpu_avx2("AuthenticAMD"), hsw = cpu_avx2("GenuineIntel"), old = cpu_sse();
    /* the case the issue measured: an AMX Xeon that OpenBLAS 0.3.21 does not recognise */
    mt_blas_plan_t p = plan(&xeon, "Prescott", true, NULL, NULL, "auto");
    CHECK(p.action == MT_BLAS_SET && !strcmp(p.core, "SkylakeX"), "Xeon seen as Prescott -> SkylakeX (%d %s: %s)",
          p.action, p.core, p.why);
    p = plan(&xeon, "Prescott", true, NULL, NULL, NULL);
    CHECK(p.action == MT_BLAS_SET && !strcmp(p.core, "SkylakeX"), "no request means auto");
    p = plan(&xeon, "SkylakeX", true, NULL, NULL, "auto");
    CHECK(p.action == MT_BLAS_KEEP, "Xeon seen as SkylakeX: kept (%s)", p.why);
    p = plan(&xeon, "Cooperlake", true, NULL, NULL, "auto");
    CHECK(p.action == MT_BLAS_KEEP, "auto never moves sideways from Cooperlake (%s)", p.why);
    p = plan(&zen, "Zen", true, NULL, NULL, "auto");
    CHECK(p.action == MT_BLAS_KEEP && strstr(p.why, "AVX2+FMA"), "Zen on Zen: kept (%s)", p.why);
    p = plan(&zen, "Prescott", true, NULL, NULL, "auto");
    CHECK(p.action == MT_BLAS_SET && !strcmp(p.core, "Zen"), "AMD AVX2 seen as Prescott -> Zen (%s)", p.core);
    p = plan(&hsw, "Nehalem", true, NULL, NULL, "auto");
    CHECK(p.action == MT_BLAS_SET && !strcmp(p.core, "Haswell"), "Intel AVX2 seen as Nehalem -> Haswell (%s)", p.core);
    p = plan(&hsw, "Zen", true, NULL, NULL, "auto");
    CHECK(p.action == MT_BLAS_KEEP, "Haswell and Zen are the same level: kept");
    p = plan(&old, "Prescott", true, NULL, NULL, "auto");
    CHECK(p.action == MT_BLAS_KEEP, "an SSE3 machine keeps Prescott (%s)", p.why);
    p = plan(&xeon, "SomeFutureCore", true, NULL, NULL, "auto");
    CHECK(p.action == MT_BLAS_KEEP, "a kernel meshtrain does not rank is left alone (%s)", p.why);

    /* the environment wins */
    p = plan(&xeon, "Prescott", true, "Prescott", NULL, "auto");
    CHECK(p.action == MT_BLAS_KEEP && strstr(p.why, "OPENBLAS_CORETYPE=Prescott"), "auto keeps the env's core (%s)",
          p.why);
    p = plan(&xeon, "Prescott", true, NULL, "1048576", "auto");
    CHECK(p.action == MT_BLAS_KEEP && strstr(p.why, "OPENBLAS_L2_SIZE"), "auto keeps with OPENBLAS_L2_SIZE (%s)",
          p.why);
    p = plan(&xeon, "Prescott", true, "Prescott", NULL, "Haswell");
    CHECK(p.action == MT_BLAS_FAIL && strstr(p.why, "never overrides"), "a name against the env is an error (%s)",
          p.why);
    p = plan(&xeon, "Haswell", true, "haswell", NULL, "Haswell");
    CHECK(p.action == MT_BLAS_KEEP, "a name the env already sets (any case) is kept (%s)", p.why);
    p = plan(&zen, "SkylakeX", true, "SkylakeX", NULL, "auto");
    CHECK(p.action == MT_BLAS_FAIL && strstr(p.why, "avx512f"), "an env kernel the CPU cannot run is named (%s)",
          p.why);

    /* names */
    p = plan(&zen, "Zen", true, NULL, NULL, "SkylakeX");
    CHECK(p.action == MT_BLAS_FAIL && strstr(p.why, "avx512f") && strstr(p.why, "Zen"),
          "SkylakeX on AVX2 is an error naming what is missing and the best kernel (%s)", p.why);
    p = plan(&xeon, "SkylakeX", true, NULL, NULL, "Bulldozer");
    CHECK(p.action == MT_BLAS_FAIL && strstr(p.why, "fma4"), "Bulldozer needs FMA4 (%s)", p.why);
    p = plan(&zen, "Zen", true, NULL, NULL, "Prescott");
    CHECK(p.action == MT_BLAS_SET && !strcmp(p.core, "Prescott"), "a weaker kernel by name is honoured");
    p = plan(&zen, "Zen", true, NULL, NULL, "haswell");
    CHECK(p.action == MT_BLAS_SET && !strcmp(p.core, "Haswell"), "names are matched in any case, set as spelt");
    p = plan(&zen, "Zen", true, NULL, NULL, "zen");
    CHECK(p.action == MT_BLAS_KEEP, "the name OpenBLAS already runs: nothing to do");
    p = plan(&zen, "Zen", true, NULL, NULL, "keep");
    CHECK(p.action == MT_BLAS_KEEP && strstr(p.why, "keep"), "keep (%s)", p.why);
    p = plan(&zen, "Zen", true, NULL, NULL, "Pentium4");
    CHECK(p.action == MT_BLAS_FAIL && strstr(p.why, "Pentium4"), "an unknown name (%s)", p.why);
    p = plan(&zen, "Zen", false, NULL, NULL, "Prescott");
    CHECK(p.action == MT_BLAS_FAIL && strstr(p.why, "DYNAMIC_ARCH"), "a single-CPU build cannot switch (%s)", p.why);
    p = plan(&xeon, "Prescott", false, NULL, NULL, "auto");
    CHECK(p.action == MT_BLAS_KEEP && strstr(p.why, "DYNAMIC_ARCH"), "auto says why it cannot help (%s)", p.why);

    /* over every CPU and every starting kernel: auto sets only kernels the CPU runs, and only upward */
    const mt_cpu_t cpus[] = {xeon, zen, hsw, old};
    const char *names[] = {"Opteron", "Prescott", "Core2",    "Nehalem",    "Sandybridge",   "Bulldozer",
                           "Haswell", "Zen",      "SkylakeX", "Cooperlake", "SapphireRapids"};
    for (size_t c = 0; c < MT_ARRAY_LEN(cpus); c++) {
        CHECK(mt_blas_core_runs(&cpus[c], mt_blas_best_core(&cpus[c]), NULL, 0), "best core %s runs on CPU %zu",
              mt_blas_best_core(&cpus[c]), c);
        for (size_t n = 0; n < MT_ARRAY_LEN(names); n++) {
            p = plan(&cpus[c], names[n], true, NULL, NULL, "auto");
            if (p.action == MT_BLAS_SET) {
                CHECK(mt_blas_core_runs(&cpus[c], p.core, NULL, 0), "auto set %s on CPU %zu: it runs", p.core, c);
                CHECK(strcasecmp(p.core, names[n]) != 0, "auto set what was already there (%s)", p.core);
            }
            CHECK(p.action != MT_BLAS_FAIL, "auto never fails (CPU %zu, %s: %s)", c, names[n], p.why);
            p = plan(&cpus[c], names[n], true, NULL, NULL, names[n]);
            bool runs = mt_blas_core_runs(&cpus[c], names[n], NULL, 0);
            CHECK((p.action == MT_BLAS_FAIL) == !runs, "asking for %s on CPU %zu fails iff it cannot run", names[n], c);
        }
    }
}

/* Whether /proc/cpuinfo's first "flags" line lists flag (a whole word). -1 without /proc/cpuinfo. */
static int cpuinfo_has(const char *flag) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) {
        return -1;
    }
    char line[8192];
    int found = -1;
    while (fgets(line, sizeof(line), f)) {
        if (!strncmp(line, "flags", 5)) {
            found = 0;
            size_t n = strlen(flag);
            for (char *s = strstr(line, flag); s; s = strstr(s + 1, flag)) {
                if (s[-1] == ' ' && (s[n] == ' ' || s[n] == '\n' || s[n] == '\0')) {
                    found = 1;
                }
            }
            break;
        }
    }
    fclose(f);
    return found;
}

static void this_machine(void) {
    mt_cpu_t c;
    mt_cpu_detect(&c);
    char feat[400];
    mt_cpu_features_str(&c, feat, sizeof(feat));
    printf("this CPU: %s [%s] family %d model %d, %s: %s\n", c.brand, c.vendor, c.family, c.model,
           mt_cpu_vector_isa(&c), feat);
#if defined(__x86_64__)
    const struct {
        bool ours;
        const char *flag;
    } pairs[] = {{c.sse2, "sse2"},
                 {c.ssse3, "ssse3"},
                 {c.sse41, "sse4_1"},
                 {c.sse42, "sse4_2"},
                 {c.avx, "avx"},
                 {c.fma, "fma"},
                 {c.avx2, "avx2"},
                 {c.avx512f, "avx512f"},
                 {c.avx512bw, "avx512bw"},
                 {c.avx512vl, "avx512vl"},
                 {c.avx512_bf16, "avx512_bf16"},
                 {c.amx_tile, "amx_tile"}};
    for (size_t i = 0; i < MT_ARRAY_LEN(pairs); i++) {
        int has = cpuinfo_has(pairs[i].flag);
        if (has >= 0) {
            CHECK(pairs[i].ours == (has == 1), "%s: cpuid says %d, /proc/cpuinfo %d", pairs[i].flag, pairs[i].ours,
                  has);
        }
    }
    CHECK(c.vendor[0] != '\0', "an x86-64 CPU names its vendor");
#endif
    const char *best = mt_blas_best_core(&c);
    char lack[160] = "";
    CHECK(mt_blas_core_runs(&c, best, lack, sizeof(lack)), "the best kernel %s runs here (%s)", best, lack);
    double peak = mt_cpu_f32_peak_core(&c);
    printf("f32 vector peak of one core: %.1f GFLOP/s (%s)\n", peak / 1e9, mt_cpu_vector_isa(&c));
    CHECK(peak > 1e8 && isfinite(peak), "the vector peak probe measures something: %g FLOP/s", peak);
    double err = mt_blas_selfcheck();
    printf("OpenBLAS: %s; self-check error %.3g\n", mt_blas_describe(), err);
    CHECK(err <= 1e-5, "OpenBLAS's own kernel here computes products to float accuracy: %g", err);
    CHECK(strstr(mt_blas_short(), "OpenBLAS") != NULL, "short name: %s", mt_blas_short());
}

int main(void) {
    policy();
    this_machine();
    return mt_test_finish("test_blas");
}
