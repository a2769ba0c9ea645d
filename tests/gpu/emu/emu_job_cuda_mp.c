/* train/job_cuda_mp.c (the GPU engine's pipeline and tensor parallelism) built for the CPU emulator, as
 * emu_job_cuda.c builds train/job_cuda.c. Test-only.
 * SPDX-License-Identifier: MIT */
#include "mt_build_config.h"
#undef MT_HAVE_CUDA
#define MT_HAVE_CUDA 1
#define MT_CUDA_EMULATED 1
#include "train/job_cuda_mp.c"
