/* Which build of the CPU kernels runs (kernel_isa.h): AVX-512 where the build has it and the CPU executes
 * it, unless a test or benchmark asked for the baseline.
 * SPDX-License-Identifier: MIT */
#include "kernel_isa.h"
#include "layers.h"
#include "runtime/cpu.h"

static int avx512 = -1; /* -1: not decided yet */
static bool forced_base;

static bool cpu_runs_avx512(void) {
#if MT_LAYERS_HAVE_AVX512
    mt_cpu_t c;
    mt_cpu_detect(&c);
    return c.avx512f && c.avx512bw && c.avx512dq && c.avx512vl;
#else
    return false;
#endif
}

bool mt_layers_isa_avx512(void) {
    if (avx512 < 0) {
        avx512 = cpu_runs_avx512() && !forced_base;
    }
    return avx512 != 0;
}

bool mt_layers_set_isa(bool allow_avx512) {
    forced_base = !allow_avx512;
    avx512 = -1;
    return mt_layers_isa_avx512();
}

const char *mt_layers_isa(void) {
    return mt_layers_isa_avx512() ? "avx512" : "baseline";
}
