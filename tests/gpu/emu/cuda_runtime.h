/* CPU emulation of the CUDA C++ device subset the kernels of models/cuda use: qualifiers, thread indices,
 * __syncthreads(_or), __syncwarp, warp shuffles, atomics, a few intrinsics, and kernel launches (the emulated build
 * rewrites `k<<<grid, block, smem, stream>>>(args)` into `mt_emu_launch(grid, block, stream, k, args)`). A
 * launch runs the grid's blocks one after another when its stream's turn comes (cuda_emu.cpp); the threads of
 * a block are fibers (ucontext) on the calling thread, switched at every barrier and shuffle; __shared__
 * variables become statics, shared by the threads of the running block. Test-only.
 * SPDX-License-Identifier: MIT */
#ifndef MT_EMU_CUDA_RUNTIME_H
#define MT_EMU_CUDA_RUNTIME_H

#include <math.h>
#include <functional>
#include <mutex>

#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

/* 16-byte vector (the kernels' 128-bit loads and stores) */
struct __align__(16) uint4 {
    unsigned x, y, z, w;
};

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
extern dim3 threadIdx, blockIdx, blockDim, gridDim; /* of the running fiber */

void __syncthreads();
int __syncthreads_or(int pred);
/* Waits for the lanes of mask (those that exist in the block) of the caller's warp. */
void __syncwarp(unsigned mask = 0xffffffffu);
float __shfl_xor_sync(unsigned mask, float v, int lane_mask, int width = 32);
/* the value v of lane src_lane (of the caller's width-wide segment) */
unsigned __shfl_sync(unsigned mask, unsigned v, int src_lane, int width = 32);
float atomicAdd(float *p, float v);
int atomicOr(int *p, int v);
#define __expf(x) expf(x)
static inline float rsqrtf(float x) {
    return 1.0f / sqrtf(x);
}
static inline int min(int a, int b) {
    return a < b ? a : b;
}
static inline int max(int a, int b) {
    return a > b ? a : b;
}
using std::isfinite;

void mt_emu_run(dim3 grid, dim3 block, const std::function<void()> &body);
/* A launch's shape against a device's limits (grid x < 2^31, y and z <= 65535, none 0; a block of at most 1024
 * threads, z <= 64): false, with cudaErrorInvalidConfiguration as the thread's last error, and nothing runs. */
bool mt_emu_launch_ok(dim3 grid, dim3 block);
/* Runs fn in stream s's order: at once, or with lazy streams (cuda_emu.cpp) when something waits for it. */
void mt_emu_enqueue(cudaStream_t s, std::function<void()> fn);
/* For the emulated NCCL (emu_nccl.cpp): may this thread make queued work run; run e's stream through e's record. */
bool mt_emu_on_worker(void);
void mt_emu_run_to_event(cudaEvent_t e);
/* The same, once a thread has queued work: this is that thread. The lock of the emulator's streams. */
bool mt_emu_is_worker(void);
std::recursive_mutex &mt_emu_streams_lock(void);

template <typename X> struct mt_emu_same { typedef X type; };
/* The arguments are converted to the kernel's parameter types at the call (non-deduced) and kept by value until
 * the launch runs, as a launch does. */
template <typename... P>
void mt_emu_launch(dim3 grid, dim3 block, cudaStream_t s, void (*kernel)(P...), typename mt_emu_same<P>::type... args) {
    if (mt_emu_launch_ok(grid, block)) {
        mt_emu_enqueue(s, [=]() { mt_emu_run(grid, block, [=]() { kernel(args...); }); });
    }
}

#endif
