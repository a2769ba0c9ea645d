/* What this CPU can execute, from cpuid and the OS's saved-state mask (xgetbv): a vector extension counts
 * only when the CPU has it and the kernel saves its registers. And the f32 vector peak of one core,
 * measured by timing independent FMA chains in the widest extension that is usable (the MFU denominator
 * on CPUs, docs/metrics.md). x86-64 only; elsewhere every flag is false and the peak is measured with
 * plain C.
 * SPDX-License-Identifier: MIT */
#ifndef MT_CPU_H
#define MT_CPU_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char vendor[16]; /* "GenuineIntel", "AuthenticAMD", "" off x86 */
    char brand[64];  /* the processor brand string, trimmed */
    int family, model;
    bool sse2, sse3, ssse3, sse41, sse42, sse4a, avx, fma, fma4, avx2;
    bool avx512f, avx512bw, avx512dq, avx512vl, avx512cd, avx512_bf16, avx512_fp16;
    bool amx_tile, amx_bf16;
} mt_cpu_t;

/* Fills *out from cpuid/xgetbv (zeroes elsewhere). Cheap; safe to call often. */
void mt_cpu_detect(mt_cpu_t *out);

/* The full AVX-512 set OpenBLAS's SkylakeX kernels use (F, BW, DQ, VL, CD). */
bool mt_cpu_has_avx512(const mt_cpu_t *c);

/* The usable extensions as one line ("sse2 sse3 ... avx2 fma avx512f ..."), into buf. */
void mt_cpu_features_str(const mt_cpu_t *c, char *buf, size_t len);

/* The widest f32 vector path of this CPU: "AVX-512", "AVX2+FMA", "AVX", "SSE" or "scalar". */
const char *mt_cpu_vector_isa(const mt_cpu_t *c);

/* f32 FLOP/s of one core on its widest vector path: FMA chains (two FLOPs per lane) timed on the calling
 * thread, the best of several short runs (about 40 ms in all). 0 if the timing failed. */
double mt_cpu_f32_peak_core(const mt_cpu_t *c);

#ifdef __cplusplus
}
#endif
#endif /* MT_CPU_H */
