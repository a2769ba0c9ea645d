/* The matrix library on CPUs (OpenBLAS) and the kernel it runs. A DYNAMIC_ARCH OpenBLAS picks its kernel
 * from cpuid when it loads, and on CPUs it does not recognise (new or virtual ones) it falls back to a
 * weaker one: Prescott's SSE3 kernels on an AVX-512 Xeon run sgemm at a sixth of the machine's rate. At
 * start-up, before MPI, `runtime.blas_core` decides: `auto` (the default) moves to the best kernel this
 * CPU executes when OpenBLAS chose a weaker one and the environment sets neither OPENBLAS_CORETYPE nor
 * OPENBLAS_L2_SIZE; `keep` leaves OpenBLAS's choice; a kernel name asks for that kernel and is an error
 * when the CPU cannot run it. A change restarts the process image (execv of /proc/self/exe with
 * OPENBLAS_CORETYPE set, since OpenBLAS reads it only when it loads); the restarted process checks that
 * OpenBLAS took the kernel and that small products match a double-precision reference, and goes back to
 * OpenBLAS's own choice (auto) or stops (a name) when either fails. docs/metrics.md.
 * SPDX-License-Identifier: MIT */
#ifndef MT_BLAS_H
#define MT_BLAS_H

#include <stdbool.h>
#include <stddef.h>

#include "cpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The values runtime.blas_core accepts (OpenBLAS's x86-64 kernel names, as it spells them). */
#define MT_BLAS_CORE_CHOICES                                                                                           \
    "auto|keep|Prescott|Core2|Penryn|Dunnington|Nehalem|Opteron|Barcelona|Bobcat|Atom|Nano|Sandybridge|"               \
    "Bulldozer|Piledriver|Steamroller|Excavator|Haswell|Zen|SkylakeX|Cooperlake|SapphireRapids"

typedef enum { MT_BLAS_KEEP = 0, MT_BLAS_SET, MT_BLAS_FAIL } mt_blas_action_t;

typedef struct {
    mt_blas_action_t action;
    char core[32]; /* MT_BLAS_SET: the kernel to select */
    char why[512]; /* one line: the reason (MT_BLAS_FAIL: the error, naming the fix) */
} mt_blas_plan_t;

/* What runtime.blas_core = request means on this CPU. Pure, for tests: current is the kernel OpenBLAS
 * chose, dynamic whether it can switch (a DYNAMIC_ARCH build), env_core / env_l2 the environment's
 * OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (NULL when unset); request NULL or "" means "auto". */
void mt_blas_plan(const mt_cpu_t *cpu, const char *current, bool dynamic, const char *env_core, const char *env_l2,
                  const char *request, mt_blas_plan_t *out);

/* The best kernel of this OpenBLAS generation for the CPU ("SkylakeX", "Zen", "Haswell", ...). */
const char *mt_blas_best_core(const mt_cpu_t *cpu);

/* Whether the CPU executes kernel name; false for names meshtrain does not know. When false and missing
 * is non-NULL, it names the missing extensions ("avx512f avx512bw") or says the name is unknown. */
bool mt_blas_core_runs(const mt_cpu_t *cpu, const char *name, char *missing, size_t len);

/* Before MPI_Init (every rank does the same): applies runtime.blas_core = request (NULL: auto). May
 * replace the process image (argv as main received it) and never return. Returns 0 to go on, or 2 after
 * printing the problem and its fix to stderr (rank 0 of the launcher only, so a job prints it once). */
int mt_blas_startup(char **argv, const char *request);

/* One line for start-up and `meshtrain version`: "OpenBLAS 0.3.21, kernel Zen (auto: ...)". */
const char *mt_blas_describe(void);

/* "OpenBLAS 0.3.21 Zen": the library and kernel, for metrics. */
const char *mt_blas_short(void);

/* The largest error of small sgemm products (NN, NT, TN; odd sizes; alpha and beta) against a double
 * reference, relative to the sum of |a||b| terms of each entry. About 1e-7 for a correct kernel. */
double mt_blas_selfcheck(void);

#ifdef __cplusplus
}
#endif
#endif /* MT_BLAS_H */
