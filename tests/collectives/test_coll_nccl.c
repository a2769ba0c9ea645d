/* The device-memory backends: every op x dtype x reduction x in-place form x counts against the same
 * locally computed values as the MPI backend's test, synchronous (stream-ordered) and through work handles.
 * No argument: NCCL, one CUDA device per rank. `staged`: the staged backend (MPI through pinned host
 * memory), any number of ranks per device. Both are also built against the CPU emulator of CUDA (tests/gpu/emu;
 * NCCL: its emulated NCCL, emu_nccl.cpp, with MESHTRAIN_EMU_DEVICES devices), where an op's result must land in
 * its stream's order, not at the call (the emulator's lazy streams).
 * `staged big`: only an all-reduce of more than INT_MAX elements.
 * Exits 77 ("skipped: ...") without a device.
 * SPDX-License-Identifier: MIT */
#include <cuda_runtime_api.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "coll_testlib.h"
#include "runtime/alloc.h"
#include "runtime/rt.h"
#include "testutil.h"

#ifndef MT_CUDA_EMULATED
#define MT_CUDA_EMULATED 0
#endif

#define CU(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        CHECK(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                                             \
    } while (0)

static const size_t counts[] = {0, 1, 7, 129, 4099};
#define MAXB (4 * 4099 * 8)
static unsigned char *h_a, *h_b, *d_a, *d_b;
static cudaStream_t stream;
static const char *be_name = "nccl";

static void up(void *d, const void *h, size_t bytes) {
    CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
}
static void down(void *h, const void *d, size_t bytes) {
    CU(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

/* Synchronous calls are only enqueued: finish the stream before reading; async ones through the handle. */
static void finish(mt_work_t *w) {
    if (*w) {
        CHECK_OK(mt_work_wait(*w, 60));
        mt_work_free(*w);
        *w = NULL;
    } else {
        CU(cudaStreamSynchronize(stream));
    }
}

static void test_reductions(mt_comm_t c, bool async) {
    int n = mt_comm_size(c), r = mt_comm_rank(c);
    for (int d = 0; d < MT_COLL_DTYPE_COUNT; d++) {
        for (int op = 0; op < MT_REDOP_COUNT; op++) {
            for (size_t k = 0; k < MT_ARRAY_LEN(counts); k++) {
                for (int mode = 0; mode < 3; mode++) {
                    size_t cnt = counts[k], bytes = cnt * mt_coll_dtype_size(d);
                    mt_work_t w = NULL, *wp = async ? &w : NULL;
                    /* all_reduce: mode 0 out of place, 1 in place */
                    if (mode < 2) {
                        for (size_t i = 0; i < cnt; i++) {
                            mt_coll_elem_set(h_a, d, i, tl_val(r, i, d, op));
                        }
                        up(d_a, h_a, bytes);
                        void *recv = mode ? d_a : d_b;
                        CHECK_OK(mt_coll_all_reduce(c, d_a, recv, cnt, d, op, stream, wp));
                        finish(&w);
                        down(h_b, recv, bytes);
                        int bad = 0;
                        for (size_t i = 0; i < cnt; i++) {
                            bad += mt_coll_elem_get(h_b, d, i) != tl_expect(n, i, d, op);
                        }
                        CHECK(bad == 0, "%s all_reduce %s %s count %zu mode %d: %d wrong", be_name,
                              mt_coll_dtype_name(d), mt_redop_name(op), cnt, mode, bad);
                        /* reduce to the last rank */
                        int root = n - 1;
                        up(d_a, h_a, bytes);
                        CHECK_OK(mt_coll_reduce(c, d_a, mode ? d_a : d_b, cnt, d, op, root, stream, wp));
                        finish(&w);
                        if (r == root) {
                            down(h_b, mode ? d_a : d_b, bytes);
                            bad = 0;
                            for (size_t i = 0; i < cnt; i++) {
                                bad += mt_coll_elem_get(h_b, d, i) != tl_expect(n, i, d, op);
                            }
                            CHECK(bad == 0, "%s reduce %s %s count %zu mode %d: %d wrong", be_name,
                                  mt_coll_dtype_name(d), mt_redop_name(op), cnt, mode, bad);
                        }
                    }
                    /* reduce_scatter: 0 out of place, 1 recv = send + r*count, 2 recv = send */
                    for (size_t i = 0; i < cnt * (size_t)n; i++) {
                        mt_coll_elem_set(h_a, d, i, tl_val(r, i, d, op));
                    }
                    up(d_a, h_a, bytes * (size_t)n);
                    void *recv = mode == 0 ? (void *)d_b : mode == 1 ? (void *)(d_a + bytes * (size_t)r) : d_a;
                    CHECK_OK(mt_coll_reduce_scatter(c, d_a, recv, cnt, d, op, stream, wp));
                    finish(&w);
                    down(h_b, recv, bytes);
                    int bad = 0;
                    for (size_t i = 0; i < cnt; i++) {
                        bad += mt_coll_elem_get(h_b, d, i) != tl_expect(n, cnt * (size_t)r + i, d, op);
                    }
                    CHECK(bad == 0, "%s reduce_scatter %s %s count %zu mode %d: %d wrong", be_name,
                          mt_coll_dtype_name(d), mt_redop_name(op), cnt, mode, bad);
                }
            }
        }
    }
}

static void test_data_movement(mt_comm_t c, bool async) {
    int n = mt_comm_size(c), r = mt_comm_rank(c);
    for (int d = 0; d < MT_COLL_DTYPE_COUNT; d++) {
        for (size_t k = 0; k < MT_ARRAY_LEN(counts); k++) {
            size_t cnt = counts[k], bytes = cnt * mt_coll_dtype_size(d);
            mt_work_t w = NULL, *wp = async ? &w : NULL;
            for (int mode = 0; mode < 3; mode++) {
                /* all_gather: 0 out of place, 1 send = recv + r*count, 2 send = recv */
                for (size_t i = 0; i < cnt; i++) {
                    mt_coll_elem_set(h_a, d, i, tl_val(r, i, d, MT_REDOP_SUM));
                }
                CU(cudaMemset(d_b, 0x5a, bytes * (size_t)n));
                void *send = mode == 0 ? (void *)d_a : mode == 1 ? (void *)(d_b + bytes * (size_t)r) : d_b;
                up(send, h_a, bytes);
                CHECK_OK(mt_coll_all_gather(c, send, d_b, cnt, d, stream, wp));
                finish(&w);
                down(h_b, d_b, bytes * (size_t)n);
                int bad = 0;
                for (int q = 0; q < n; q++) {
                    for (size_t i = 0; i < cnt; i++) {
                        bad += mt_coll_elem_get(h_b, d, (size_t)q * cnt + i) != tl_val(q, i, d, MT_REDOP_SUM);
                    }
                }
                CHECK(bad == 0, "%s all_gather %s count %zu mode %d: %d wrong", be_name, mt_coll_dtype_name(d), cnt,
                      mode, bad);
            }
            for (int inplace = 0; inplace < 2; inplace++) {
                /* broadcast from rank 0 */
                for (size_t i = 0; i < cnt; i++) {
                    mt_coll_elem_set(h_a, d, i, r == 0 ? tl_val(0, i, d, MT_REDOP_SUM) : 99.0);
                }
                up(d_a, h_a, bytes);
                void *recv = inplace ? d_a : d_b;
                CHECK_OK(mt_coll_broadcast(c, d_a, recv, cnt, d, 0, stream, wp));
                finish(&w);
                down(h_b, recv, bytes);
                int bad = 0;
                for (size_t i = 0; i < cnt; i++) {
                    bad += mt_coll_elem_get(h_b, d, i) != tl_val(0, i, d, MT_REDOP_SUM);
                }
                CHECK(bad == 0, "%s broadcast %s count %zu in place %d: %d wrong", be_name, mt_coll_dtype_name(d), cnt,
                      inplace, bad);
                /* all_to_all: element j of the block s sends to t is (s*7 + t*3 + j) % 13 */
                for (int t = 0; t < n; t++) {
                    for (size_t j = 0; j < cnt; j++) {
                        mt_coll_elem_set(h_a, d, (size_t)t * cnt + j, (double)((r * 7 + t * 3 + (int)j) % 13));
                    }
                }
                up(d_a, h_a, bytes * (size_t)n);
                recv = inplace ? d_a : d_b;
                CHECK_OK(mt_coll_all_to_all(c, d_a, recv, cnt, d, stream, wp));
                finish(&w);
                down(h_b, recv, bytes * (size_t)n);
                bad = 0;
                for (int s = 0; s < n; s++) {
                    for (size_t j = 0; j < cnt; j++) {
                        bad += mt_coll_elem_get(h_b, d, (size_t)s * cnt + j) != (double)((s * 7 + r * 3 + (int)j) % 13);
                    }
                }
                CHECK(bad == 0, "%s all_to_all %s count %zu in place %d: %d wrong", be_name, mt_coll_dtype_name(d), cnt,
                      inplace, bad);
            }
        }
    }
    /* ring exchange + self message in one group, then a barrier */
    int32_t out[2] = {100 + r, 200 + r}, in[2] = {-99, -99}; /* distinct and non-zero on every rank */
    up(d_a, out, sizeof(out));
    mt_work_t w = NULL;
    CHECK_OK(mt_coll_group_start(c));
    CHECK_OK(mt_coll_send(c, d_a, 1, MT_COLL_I32, (r + 1) % n, stream, NULL));
    CHECK_OK(mt_coll_recv(c, d_b, 1, MT_COLL_I32, (r + n - 1) % n, stream, NULL));
    CHECK_OK(mt_coll_send(c, d_a + 4, 1, MT_COLL_I32, r, stream, NULL));
    CHECK_OK(mt_coll_recv(c, d_b + 4, 1, MT_COLL_I32, r, stream, NULL));
    CHECK_OK(mt_coll_group_end(c, stream, async ? &w : NULL));
    finish(&w);
    down(in, d_b, sizeof(in));
    CHECK(in[0] == 100 + (r + n - 1) % n && in[1] == 200 + r, "%s group p2p got %d %d", be_name, in[0], in[1]);
    CHECK_OK(mt_coll_barrier(c, stream, async ? &w : NULL));
    finish(&w);
    CHECK(mt_comm_seq_completed(c) == mt_comm_seq_issued(c), "%s seq completed %llu of %llu", be_name,
          (unsigned long long)mt_comm_seq_completed(c), (unsigned long long)mt_comm_seq_issued(c));
    CHECK_OK(mt_comm_get_async_error(c));
}

#if MT_CUDA_EMULATED
/* Under the emulator's lazy streams: an op's result lands in its stream's order (a reader on another stream
 * must wait for it), not when the call returns: the staged backend's as NCCL's (and the emulated NCCL's). */
static void test_stream_order(mt_comm_t c) {
    cudaStream_t s2;
    CU(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    float one = 1.0f, *a = (float *)d_a, *b = (float *)d_b;
    up(d_a, &one, 4);
    CU(cudaMemset(d_b, 0, 4));
    CHECK_OK(mt_coll_all_reduce(c, d_a, d_b, 1, MT_COLL_F32, MT_REDOP_SUM, s2, NULL));
    CHECK(b[0] == 0.0f && a[0] == 1.0f, "%s all_reduce: its result %g was there before its stream ran", be_name,
          b[0]);
    CU(cudaStreamSynchronize(s2));
    CHECK(b[0] == (float)mt_comm_size(c), "%s all_reduce after its stream ran: %g, want %d", be_name, b[0],
          mt_comm_size(c));
    /* the next op, on another stream, waits for the first one's copy out of the staging buffer before it
     * writes there: both results are their own */
    float five = 5.0f;
    up(a + 16, &five, 4);
    CU(cudaMemset(d_b, 0, 128));
    CHECK_OK(mt_coll_all_reduce(c, a, b, 1, MT_COLL_F32, MT_REDOP_SUM, s2, NULL));
    CHECK_OK(mt_coll_all_reduce(c, a + 16, b + 16, 1, MT_COLL_F32, MT_REDOP_SUM, stream, NULL));
    CU(cudaStreamSynchronize(s2));
    CU(cudaStreamSynchronize(stream));
    CHECK(b[0] == (float)mt_comm_size(c) && b[16] == 5.0f * (float)mt_comm_size(c),
          "two %s all_reduces on two streams: %g and %g, want %d and %d", be_name, b[0], b[16], mt_comm_size(c),
          5 * mt_comm_size(c));
    CU(cudaStreamDestroy(s2));
}
#endif

/* The host polls a stream-ordered comm's completion events: when a call is tested (mt_work_test), and when more
 * calls are queued behind the device than the comm keeps events for (collectives/coll.c: MT_COLL_EVENT_RING,
 * 1024). A poll's "not ready" must not stay behind as this thread's last CUDA error, which every kernel launcher
 * returns after its launch: the next launch would fail with it. Under the emulator each other poll of a record
 * not yet run answers "not ready", as a busy device may (mt_emu_busy_polls); its lazy streams keep every call
 * queued until something waits. */
static void test_polls(mt_comm_t c) {
    CU(cudaMemset(d_a, 0, 4));
    CU(cudaGetLastError());
#if MT_CUDA_EMULATED
    mt_emu_busy_polls(1);
#endif
    mt_work_t w = NULL;
    bool done = false;
    CHECK_OK(mt_coll_all_reduce(c, d_a, d_a, 1, MT_COLL_F32, MT_REDOP_MAX, stream, &w));
    CHECK_OK(mt_work_test(w, &done));
    cudaError_t e = cudaGetLastError();
    CHECK(e == cudaSuccess, "%s: after a test of a call (done: %d), this thread's last CUDA error is \"%s\"",
          be_name, (int)done, cudaGetErrorString(e));
    finish(&w);
    enum { CALLS = 1024 + 64 };
    for (int i = 0; i < CALLS; i++) {
        CHECK_OK(mt_coll_all_reduce(c, d_a, d_a, 1, MT_COLL_F32, MT_REDOP_MAX, stream, NULL));
    }
    e = cudaGetLastError();
    CHECK(e == cudaSuccess, "%s: after %d calls queued behind the device, this thread's last CUDA error is \"%s\"",
          be_name, CALLS, cudaGetErrorString(e));
    CU(cudaStreamSynchronize(stream));
#if MT_CUDA_EMULATED
    mt_emu_busy_polls(0);
#endif
}

/* An in-place all-reduce of more than INT_MAX elements (u8, 2 GiB + 4 KiB per rank): MPI counts are int, but
 * the staged backend's pieces keep each MPI call small, so it takes the op as NCCL does. */
static void test_big(mt_comm_t c) {
    int n = mt_comm_size(c), r = mt_comm_rank(c);
    size_t cnt = (size_t)INT_MAX + 4097;
    unsigned char *d = NULL;
    CU(cudaMalloc((void **)&d, cnt));
#if MT_CUDA_EMULATED
    unsigned char *h = d; /* emulated device memory is the host's: no second 2 GiB */
#else
    unsigned char *h = malloc(cnt);
#endif
    CHECK(h && d, "cannot allocate 2 x %zu bytes", cnt);
    if (!h || !d) {
        return;
    }
    CU(cudaMemset(d, 1 + r, cnt));
    CHECK_OK(mt_coll_all_reduce(c, d, d, cnt, MT_COLL_U8, MT_REDOP_SUM, stream, NULL));
    CU(cudaStreamSynchronize(stream));
    if (h != d) {
        down(h, d, cnt);
    }
    unsigned char want = (unsigned char)(n * (n + 1) / 2);
    size_t bad = 0, first = cnt;
    for (size_t i = 0; i < cnt; i++) {
        if (h[i] != want) {
            bad++;
            first = MT_MIN(first, i);
        }
    }
    CHECK(bad == 0, "staged all_reduce of %zu u8: %zu wrong from element %zu (want %d)", cnt, bad, first, want);
    if (h != d) {
        free(h);
    }
    cudaFree(d);
}

int main(int argc, char **argv) {
    bool staged = argc > 1 && !strcmp(argv[1], "staged");
    if (staged) {
        be_name = "staged";
    }
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("skipped: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return MT_TEST_SKIP;
    }
    CHECK_OK(mt_rt_init(&argc, &argv));
    const mt_world_t *wd = mt_rt_world();
    if (!staged && wd->local_size > ndev && MT_CUDA_EMULATED) { /* the test's own set-up: not a skip */
        CHECK(false, "%d ranks on this node but %d emulated device(s): set MESHTRAIN_EMU_DEVICES", wd->local_size,
              ndev);
        return mt_test_finish_mpi("test_coll_nccl");
    }
    if (!staged && wd->local_size > ndev) {
        if (wd->rank == 0) {
            printf("skipped: %d ranks on this node but %d CUDA device(s); NCCL needs one device per rank\n",
                   wd->local_size, ndev);
        }
        mt_rt_finalize();
        return MT_TEST_SKIP;
    }
    CU(cudaSetDevice(wd->local_rank % ndev));
    CU(cudaStreamCreate(&stream));
    h_a = malloc(MAXB);
    h_b = malloc(MAXB);
    CU(cudaMalloc((void **)&d_a, MAXB));
    CU(cudaMalloc((void **)&d_b, MAXB));
    mt_comm_params_t p = MT_COMM_PARAMS_INIT;
    p.name = "world-dev";
    p.memory = MT_COMM_MEM_DEVICE;
    p.backend = staged ? "staged" : NULL;
    mt_comm_t c = NULL;
    mt_mem_stats_t m0;
    mt_mem_stats(MT_MEM_HOST, &m0);
    CHECK_OK(mt_comm_init(wd->comm, &p, &c));
    mt_mem_stats_t m_init; /* the comm's own structures, before its first op pins anything */
    mt_mem_stats(MT_MEM_HOST, &m_init);
    if (c && staged && argc > 2 && !strcmp(argv[2], "big")) {
        test_big(c);
        CHECK_OK(mt_comm_free(c));
        c = NULL;
    }
    if (c) {
        CHECK(!strcmp(mt_comm_backend_name(c), be_name), "backend %s, expected %s", mt_comm_backend_name(c), be_name);
        test_reductions(c, false);
        test_data_movement(c, false);
        test_reductions(c, true);
        test_data_movement(c, true);
#if MT_CUDA_EMULATED
        const char *lazy = getenv("MESHTRAIN_EMU_LAZY");
        if (!(lazy && !strcmp(lazy, "0"))) { /* the emulator's lazy streams (its default here) */
            test_stream_order(c);
        }
#endif
        test_polls(c);
        if (staged) {
            /* the pinned staging buffer is accounted as host communication memory while the comm lives. With
             * the default pieces (8 MiB) every op here is one piece: at least the largest op's input and
             * output (all_to_all of 4099 f64 per rank). With MESHTRAIN_STAGED_CHUNK set small, that op and
             * most others run in many pieces, and the buffer holds two pieces (four as it grows by doubling)
             * or its 64 KiB minimum, where that all_to_all whole would need 2 x size x 32 KiB and a bit. */
            mt_mem_stats_t m1;
            mt_mem_stats(MT_MEM_HOST, &m1);
            int64_t grown = m1.current[MT_MEM_COMM] - m_init.current[MT_MEM_COMM];
            const char *chunk = getenv("MESHTRAIN_STAGED_CHUNK");
            int64_t piece = chunk ? atoll(chunk) : 0;
            int64_t bound = MT_MAX(4 * piece, (int64_t)65536) + 4096; /* + the group calls' bookkeeping */
            if (piece > 0) {
                CHECK(bound < 2 * (int64_t)wd->size * 4099 * 8,
                      "MESHTRAIN_STAGED_CHUNK=%lld is too large for this test to tell pieces from whole ops",
                      (long long)piece);
                CHECK(grown > 0 && grown <= bound, "staged, pieces of %lld bytes: %lld bytes of host comm memory "
                      "(want at most four pieces or 64 KiB, and 4 KiB of bookkeeping)", (long long)piece,
                      (long long)grown);
            } else {
                CHECK(grown >= 2 * (int64_t)wd->size * 4099 * 8, "staged: %lld bytes of host comm memory after an "
                      "all_to_all of 2 x %d x 4099 x 8 bytes", (long long)grown, wd->size);
            }
        }
        CHECK_OK(mt_comm_free(c));
        mt_mem_stats_t m2;
        mt_mem_stats(MT_MEM_HOST, &m2);
        CHECK(m2.current[MT_MEM_COMM] == m0.current[MT_MEM_COMM], "%s: %lld bytes of host comm memory left after "
              "mt_comm_free", be_name, (long long)(m2.current[MT_MEM_COMM] - m0.current[MT_MEM_COMM]));
    }
    cudaFree(d_a);
    cudaFree(d_b);
    free(h_a);
    free(h_b);
    cudaStreamDestroy(stream);
    return mt_test_finish_mpi("test_coll_nccl");
}
