/* train/job_cuda.c (the GPU engine of the training loop) built for the CPU emulator: compiled against the
 * emulated runtime (this directory's cuda_runtime_api.h) whatever the build's MT_HAVE_CUDA, its device
 * communicators on the staged backend (or, in a build without CUDA, which has none, on host communicators:
 * emulated device memory is host memory). Test-only.
 * SPDX-License-Identifier: MIT */
#include "mt_build_config.h"
#undef MT_HAVE_CUDA
#define MT_HAVE_CUDA 1
#define MT_CUDA_EMULATED 1
#include "train/job_cuda.c"
