/* runtime/cuda_alloc.c built for the CPU emulator: its CUDA backend compiled against the emulated runtime
 * (this directory's cuda_runtime_api.h), whatever the build's MT_HAVE_CUDA. Test-only.
 * SPDX-License-Identifier: MIT */
#include "mt_build_config.h"
#undef MT_HAVE_CUDA
#define MT_HAVE_CUDA 1
#include "runtime/cuda_alloc.c"
