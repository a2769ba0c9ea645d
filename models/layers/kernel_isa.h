/* The CPU kernels in two builds of the same source: the baseline (x86-64's SSE2, what the compiler targets
 * by default) and, on x86-64, an AVX-512 one (F, BW, DQ, VL) that runs where the CPU has it. A kernel file
 * defines its work as MT_KNAME(name) and, in the baseline build only (MT_KERNEL_DISPATCH), the public entry
 * that calls MT_KCALL(name, (args)): the AVX-512 variant when mt_layers_isa() says so, else the baseline.
 * models/CMakeLists.txt compiles the files listed there a second time with MT_KERNEL_AVX512 and the
 * AVX-512 flags. Elementwise loops compute the same bits in both (the same IEEE operations, no contraction
 * under -std=c11); `omp simd` reductions sum in 16 lanes instead of 4, so those results differ in the last
 * bits (tests/models/test_layers_isa.c holds both to each other).
 * SPDX-License-Identifier: MIT */
#ifndef MT_KERNEL_ISA_H
#define MT_KERNEL_ISA_H

#include <stdbool.h>

#ifdef MT_KERNEL_AVX512
#define MT_KNAME(f) f##_avx512
#else
#define MT_KNAME(f) f##_base
#define MT_KERNEL_DISPATCH 1
#endif

/* Both variants' prototypes: MT_KPROTO(void, name, (params)). */
#define MT_KPROTO(ret, f, params)                                                                                      \
    ret f##_base params;                                                                                               \
    ret f##_avx512 params

/* The variant this process runs: true for AVX-512 (the build has it, the CPU executes it, and
 * mt_layers_set_isa has not asked for the baseline). */
bool mt_layers_isa_avx512(void);

#if MT_LAYERS_HAVE_AVX512
#define MT_KCALL(f, args) (mt_layers_isa_avx512() ? f##_avx512 args : f##_base args)
#else
#define MT_KCALL(f, args) (f##_base args)
#endif

#endif
