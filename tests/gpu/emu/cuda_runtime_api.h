/* CPU emulation of the CUDA runtime API subset meshtrain uses, so the CUDA kernels and their callers run
 * (slowly, one block at a time, one OS thread per CUDA thread) on machines without a GPU. Test-only: the
 * emulated build replaces <cuda_runtime_api.h> by putting this directory first on the include path.
 * SPDX-License-Identifier: MIT */
#ifndef MT_EMU_CUDA_RUNTIME_API_H
#define MT_EMU_CUDA_RUNTIME_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidPitchValue = 12,
    cudaErrorNotReady = 600,
    cudaErrorUnknown = 999
} cudaError_t;
typedef enum { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice,
               cudaMemcpyDefault } cudaMemcpyKind;
typedef struct mt_emu_stream *cudaStream_t;
typedef struct mt_emu_event *cudaEvent_t;
#define cudaStreamNonBlocking 1u
#define cudaEventDisableTiming 2u

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int dev);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k, cudaStream_t s);
typedef enum { cudaDevAttrMaxPitch = 11 } cudaDeviceAttr;
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind k, cudaStream_t s);
cudaError_t cudaMemset(void *p, int v, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority);
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaSetDevice(int d);

/* Emulator bookkeeping for tests: bytes currently held by cudaMalloc; calls so far that create, touch or order
 * device state (allocations, copies, sets, streams, events, kernel launches, cuBLASLt handles). */
size_t mt_emu_device_bytes(void);
size_t mt_emu_api_calls(void);
/* 1: a poll (cudaEventQuery) on the thread that queues work answers "not ready" every other time for a record not
 * yet run, as a busy device may, starting with the calling thread's next such poll (MESHTRAIN_EMU_BUSY_POLLS=1
 * sets it for the process); 0: never. */
void mt_emu_busy_polls(int on);
/* Host waits so far, by kind: calls that block the calling thread until device work queued before them is done
 * (on a device as here). An inner wait of such a call (cudaFree's device synchronisation) is not counted
 * again; a poll (cudaEventQuery) is not a wait. */
enum {
    MT_EMU_WAIT_STREAM, /* cudaStreamSynchronize (also an asynchronous copy into pageable host memory) */
    MT_EMU_WAIT_EVENT,  /* cudaEventSynchronize */
    MT_EMU_WAIT_DEVICE, /* cudaDeviceSynchronize */
    MT_EMU_WAIT_COPY,   /* cudaMemcpy to or from the host */
    MT_EMU_WAIT_FREE,   /* cudaFree, cudaFreeHost */
    MT_EMU_WAIT_KINDS
};
size_t mt_emu_host_waits(int kind);
/* Work issued so far: kernel launches (accepted <<<>>> launches), cuBLASLt products (cublasLtMatmul calls), and
 * bytes copied by cudaMemcpy, cudaMemcpyAsync and cudaMemcpy2DAsync by direction (cudaMemcpyKind: host to host,
 * host to device, device to host, device to device, default), for the per-step counts of the engine record
 * (tests/engine). */
size_t mt_emu_kernel_launches(void);
size_t mt_emu_matmuls(void);
size_t mt_emu_copy_bytes(int kind);

#ifdef __cplusplus
}
#endif
#endif
