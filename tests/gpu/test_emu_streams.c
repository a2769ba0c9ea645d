/* The CPU emulator's lazy streams (tests/gpu/emu/cuda_emu.cpp, builds with CUDA): the orderings it decides
 * against the program. Work on a non-blocking stream has not run when another stream reads without waiting
 * (the reader sees the poisoned allocation), nor after a synchronous copy (which waits for the blocking
 * streams only); a wait on an event runs the recording stream up to that record and no further, and so does
 * cudaEventSynchronize, and a record of the event on another stream run since does not release the wait; a poll
 * (cudaEventQuery) from another thread answers "not ready" without running anything, the queuing thread's runs
 * the work; an asynchronous copy from pageable host memory reads it at the call, one into
 * pageable host memory has run when the call returns, one into pinned memory only when its stream is
 * synchronised; cudaFree and cudaDeviceSynchronize run everything queued. If the emulator ran every call at
 * once, the stale reads below would be fresh and the test would fail.
 * `others` (MESHTRAIN_EMU_LAZY=2): before a host synchronisation runs a stream, the other streams run what
 * they can without waiting for a record not yet run, so a reader that reaches its writer's work only through
 * a later wait reads too early; plain lazy streams run the writer first there (both checked below).
 * SPDX-License-Identifier: MIT */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "testutil.h"

enum { N = 64 };

/* cudaEventQuery from a thread other than the one that queues the work (the collectives' watchdog polls so) */
static void *query_elsewhere(void *e) {
    static cudaError_t r;
    r = cudaEventQuery((cudaEvent_t)e);
    return &r;
}

/* The first byte at dev, read straight from the emulated device memory (host memory):
 * what the device holds now, without making anything run. */
static unsigned char peek(const void *dev) {
    return *(const unsigned char *)dev;
}

/* s1 writes c; s2 reads c without waiting for it, then records an event that s1 waits for; the host
 * synchronises s1. Plain lazy streams run s1's write, then (through the wait) s2's read: it reads the
 * write. With other streams first, s2's read runs before s1's write: it reads the old value. */
static void others_first(bool others) {
    cudaStream_t s1, s2;
    cudaEvent_t e;
    unsigned char *c = NULL, *d = NULL;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess &&
              cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess &&
              cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess &&
              cudaMalloc((void **)&c, N) == cudaSuccess && cudaMalloc((void **)&d, N) == cudaSuccess,
          "set up");
    unsigned char poison = peek(c);
    CHECK(cudaMemsetAsync(c, 3, N, s1) == cudaSuccess &&
              cudaMemcpyAsync(d, c, N, cudaMemcpyDeviceToDevice, s2) == cudaSuccess &&
              cudaEventRecord(e, s2) == cudaSuccess && cudaStreamWaitEvent(s1, e, 0) == cudaSuccess &&
              cudaStreamSynchronize(s1) == cudaSuccess,
          "write on s1, read on s2, s1 waits for s2, sync s1");
    CHECK(peek(d) == (others ? poison : 3) && peek(c) == 3, "%s: s2 read %u (want %u), c holds %u (want 3)",
          others ? "other streams first" : "lazy", peek(d), others ? poison : 3, peek(c));
    /* a stream that waits for a record not yet run does not run past the wait: s2 waits for s1's record, the
     * host synchronises s1 (s2 runs nothing: nothing waits for it), then s2 */
    CHECK(cudaMemsetAsync(c, 4, N, s1) == cudaSuccess && cudaEventRecord(e, s1) == cudaSuccess &&
              cudaStreamWaitEvent(s2, e, 0) == cudaSuccess &&
              cudaMemcpyAsync(d, c, N, cudaMemcpyDeviceToDevice, s2) == cudaSuccess &&
              cudaStreamSynchronize(s1) == cudaSuccess,
          "memset, record on s1; s2 waits, reads; sync s1");
    CHECK(peek(c) == 4 && peek(d) == (others ? poison : 3), "s1 ran to %u (want 4), s2 read %u early", peek(c),
          peek(d));
    CHECK(cudaStreamSynchronize(s2) == cudaSuccess && peek(d) == 4, "s2 read %u after its wait (want 4)", peek(d));
    CHECK(cudaFree(c) == cudaSuccess && cudaFree(d) == cudaSuccess && cudaEventDestroy(e) == cudaSuccess &&
              cudaStreamDestroy(s1) == cudaSuccess && cudaStreamDestroy(s2) == cudaSuccess,
          "tear down");
}

int main(int argc, char **argv) {
    bool others = argc > 1 && !strcmp(argv[1], "others");
    const char *env = getenv("MESHTRAIN_EMU_LAZY"); /* 0 kept: to see which checks fail when calls run at once */
    if (!env || strcmp(env, "0") != 0) {
        setenv("MESHTRAIN_EMU_LAZY", others ? "2" : "1", 1); /* before the emulator's first call reads it */
    }
    others_first(others);
    if (others) {
        return mt_test_finish("test_emu_streams others");
    }
    cudaStream_t s1, s2;
    cudaEvent_t e;
    unsigned char *a = NULL, *b = NULL, *pin = NULL, host[N];
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess &&
              cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess &&
              cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess &&
              cudaMalloc((void **)&a, N) == cudaSuccess && cudaMalloc((void **)&b, N) == cudaSuccess &&
              cudaMallocHost((void **)&pin, N) == cudaSuccess,
          "set up streams, an event and buffers");
    unsigned char poison = peek(a); /* cudaMalloc's garbage */

    /* a reader on s2 that does not wait for s1's writer reads what was there before */
    CHECK(cudaMemsetAsync(a, 1, N, s1) == cudaSuccess, "memset on s1");
    CHECK(cudaMemcpyAsync(b, a, N, cudaMemcpyDeviceToDevice, s2) == cudaSuccess, "copy on s2");
    CHECK(cudaStreamSynchronize(s2) == cudaSuccess, "sync s2");
    CHECK(peek(b) == poison && peek(a) == poison, "s2 read %u (poison %u) and s1's memset ran (%u) without a wait",
          peek(b), poison, peek(a));
    CHECK(cudaMemcpy(host, a, N, cudaMemcpyDeviceToHost) == cudaSuccess && host[0] == poison,
          "a synchronous copy waited for the non-blocking s1: %u", host[0]);

    /* waiting for an event runs the recording stream up to the record, and not beyond it */
    CHECK(cudaEventRecord(e, s1) == cudaSuccess && cudaMemsetAsync(a, 2, N, s1) == cudaSuccess, "record, memset");
    CHECK(cudaStreamWaitEvent(s2, e, 0) == cudaSuccess &&
              cudaMemcpyAsync(b, a, N, cudaMemcpyDeviceToDevice, s2) == cudaSuccess &&
              cudaStreamSynchronize(s2) == cudaSuccess,
          "wait, copy and sync on s2");
    CHECK(peek(b) == 1 && peek(a) == 1, "after waiting for the record: read %u, a holds %u (want 1, 1)", peek(b),
          peek(a));
    CHECK(cudaEventRecord(e, s1) == cudaSuccess && cudaMemsetAsync(a, 3, N, s1) == cudaSuccess, "record, memset");
    CHECK(cudaEventSynchronize(e) == cudaSuccess && peek(a) == 2, "cudaEventSynchronize ran to %u (want 2)", peek(a));
    CHECK(cudaStreamSynchronize(s1) == cudaSuccess && peek(a) == 3, "s1 synchronised: %u (want 3)", peek(a));

    /* a wait is for the record at its call: recording the event again on s2 and running that one does not
     * release s3, which waits for the record on s1 */
    cudaStream_t s3;
    CHECK(cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking) == cudaSuccess, "create s3");
    CHECK(cudaMemsetAsync(a, 1, N, s1) == cudaSuccess && cudaEventRecord(e, s1) == cudaSuccess &&
              cudaStreamWaitEvent(s3, e, 0) == cudaSuccess && cudaEventRecord(e, s2) == cudaSuccess &&
              cudaStreamSynchronize(s2) == cudaSuccess,
          "memset and record on s1, wait on s3, record on s2");
    CHECK(cudaMemcpyAsync(b, a, N, cudaMemcpyDeviceToDevice, s3) == cudaSuccess &&
              cudaStreamSynchronize(s3) == cudaSuccess && peek(b) == 1,
          "s3 read %u past its wait for s1's record (want 1)", peek(b));
    CHECK(cudaStreamDestroy(s3) == cudaSuccess, "destroy s3");

    /* another thread's poll answers without running anything; the queuing thread's runs the work */
    pthread_t th;
    void *res = NULL;
    CHECK(cudaMemsetAsync(a, 2, N, s1) == cudaSuccess && cudaEventRecord(e, s1) == cudaSuccess, "memset, record");
    CHECK(pthread_create(&th, NULL, query_elsewhere, e) == 0 && pthread_join(th, &res) == 0 && res &&
              *(cudaError_t *)res == cudaErrorNotReady && peek(a) == 1,
          "a poll from another thread: %d, a holds %u (want not ready, 1)", res ? (int)*(cudaError_t *)res : -1,
          peek(a));
    CHECK(cudaEventQuery(e) == cudaSuccess && peek(a) == 2, "the queuing thread's poll ran the memset: %u",
          peek(a));

    /* asynchronous copies to and from host memory */
    memset(host, 7, N);
    CHECK(cudaMemcpyAsync(a, host, N, cudaMemcpyHostToDevice, s1) == cudaSuccess, "copy up from pageable memory");
    memset(host, 9, N); /* the copy read the pageable source at the call */
    CHECK(cudaStreamSynchronize(s1) == cudaSuccess && peek(a) == 7, "pageable source read at the call: %u (want 7)",
          peek(a));
    CHECK(cudaMemsetAsync(a, 4, N, s1) == cudaSuccess &&
              cudaMemcpyAsync(host, a, N, cudaMemcpyDeviceToHost, s1) == cudaSuccess && host[0] == 4,
          "a copy into pageable memory returned before it ran: %u (want 4)", host[0]);
    memset(pin, 0, N);
    CHECK(cudaMemsetAsync(a, 5, N, s1) == cudaSuccess &&
              cudaMemcpyAsync(pin, a, N, cudaMemcpyDeviceToHost, s1) == cudaSuccess && pin[0] == 0,
          "a copy into pinned memory ran before its stream was synchronised: %u", pin[0]);
    CHECK(cudaStreamSynchronize(s1) == cudaSuccess && pin[0] == 5, "pinned copy after the sync: %u (want 5)", pin[0]);

    /* the device-wide synchronisations */
    CHECK(cudaMemsetAsync(b, 6, N, s2) == cudaSuccess && peek(b) != 6, "memset on s2 ran at once");
    CHECK(cudaDeviceSynchronize() == cudaSuccess && peek(b) == 6, "cudaDeviceSynchronize: %u (want 6)", peek(b));
    CHECK(cudaMemsetAsync(b, 8, N, s2) == cudaSuccess && cudaMemcpyAsync(pin, b, N, cudaMemcpyDeviceToHost, s2) ==
                                                               cudaSuccess,
          "queue on s2");
    CHECK(cudaFree(a) == cudaSuccess && pin[0] == 8, "cudaFree ran the queued work: %u (want 8)", pin[0]);
    CHECK(cudaFree(b) == cudaSuccess && cudaFreeHost(pin) == cudaSuccess && cudaEventDestroy(e) == cudaSuccess &&
              cudaStreamDestroy(s1) == cudaSuccess && cudaStreamDestroy(s2) == cudaSuccess,
          "tear down");
    return mt_test_finish("test_emu_streams");
}
