/* `meshtrain version` / `meshtrain --version`: what this binary is and what it was built with.
 * SPDX-License-Identifier: MIT */
#include <hwloc.h>
#include <stdio.h>
#include <string.h>

#include "cmd.h"
#include "models/layers/layers.h"
#include "runtime/blas.h"
#include "runtime/matmul.h"
#include "runtime/cpu.h"
#include "runtime/rt.h"

#if MT_HAVE_NCCL
#include <nccl.h>
#endif

int mt_cmd_version(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: meshtrain version   (or meshtrain --version)\n"
                   "Prints the version, the git commit and the library versions this build uses.\n");
            return 0;
        }
    }
    if (mt_rt_world()->rank != 0) {
        return 0;
    }
    char mpi_lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(mpi_lib, &len);
    char *nl = strchr(mpi_lib, '\n');
    if (nl) {
        *nl = '\0';
    }
    char *comma = strchr(mpi_lib, ',');
    if (comma) {
        *comma = '\0';
    }
    unsigned hv = hwloc_get_api_version();
    printf("meshtrain %s (git %s)\n", MT_VERSION, MT_GIT_COMMIT);
    printf("  MPI:    %s (standard %d.%d)\n", mpi_lib, MPI_VERSION, MPI_SUBVERSION);
    printf("  hwloc:  %s (API %u.%u.%u)\n", MT_HWLOC_VERSION, hv >> 16, (hv >> 8) & 0xff, hv & 0xff);
#if MT_HAVE_CUDA
    printf("  CUDA:   yes, toolkit %s\n", MT_CUDA_VERSION);
#else
    printf("  CUDA:   no (CPU-only build)\n");
#endif
#if MT_HAVE_NCCL
    int nv = 0;
    ncclGetVersion(&nv);
    printf("  NCCL:   yes, %d.%d.%d (built against %s)\n", nv / 10000, (nv / 100) % 100, nv % 100, MT_NCCL_VERSION);
#else
    printf("  NCCL:   no\n");
#endif
    printf("  BLAS:   %s\n", mt_blas_describe());
    printf("  matmul: %s\n", mt_matmul_describe());
    printf("  kernels: %s (runtime.cpu_kernels = auto)\n", mt_layers_isa());
    mt_cpu_t cpu;
    mt_cpu_detect(&cpu);
    char feat[400];
    mt_cpu_features_str(&cpu, feat, sizeof(feat));
    printf("  CPU:    %s (%s; %s)\n", cpu.brand[0] ? cpu.brand : "unknown", mt_cpu_vector_isa(&cpu), feat);
    return 0;
}
