/* The hang watchdog under mpiexec. Modes (argv[1]):
 *   clean  no false alarm: sync and async all-reduces, a rank arriving late (but within the timeout),
 *          the registry's local view, start/stop twice; exits 0.
 *   skip   rank R (argv[2]) skips the 3rd all-reduce and then idles: the job must end with a report
 *          naming rank R, all_reduce and call #3 (checked by expect_abort.sh), also written to argv[3]
 *          if given (".json": a Chrome trace-event file).
 *   cross  rank 2 skips the 3rd all-reduce on 'world' and waits on comm 'pair' {2,3} that rank 3 never
 *          joins: one report, naming rank 2 and where it waits.
 *   kill   rank 2 dies (SIGKILL) before its 3rd all-reduce, as if killed mid-step.
 *   abort_hangs  a call on a registered group never completes, and the group's abort never returns (as
 *          ncclCommAbort may, waiting on another comm's kernel that spins on the stuck peer): the job must still
 *          end, after MESHTRAIN_WD_ABORT_GRACE_MS.
 * Built with MT_WATCHDOG_DEVICE (against the CPU emulator of CUDA and its emulated NCCL, tests/gpu/emu), the
 * all-reduces are device-memory ones on the NCCL backend, enqueued on a stream and waited for there, as the GPU
 * engine's are: a rank blocked in a stream synchronisation behind a collective that never completes must be
 * reported and ended the same way.
 * SPDX-License-Identifier: MIT */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collectives/coll.h"
#include "runtime/rt.h"
#ifndef MT_WATCHDOG_DEVICE
#define MT_WATCHDOG_DEVICE 0
#endif
#if MT_WATCHDOG_DEVICE
#include <cuda_runtime_api.h>
static cudaStream_t stream;
#define STREAM ((mt_stream_t)stream)
#else
#define STREAM NULL
#endif
#include "runtime/watchdog.h"
#include "testutil.h"

#define N 1024

static _Atomic uint64_t fake_completed;
static uint64_t fake_progress(void *arg) {
    (void)arg;
    return atomic_load(&fake_completed);
}

/* The registry alone: a pending call shows in the local view until it completes. */
static void registry_checks(void) {
    mt_wd_group_t g = mt_watchdog_group_register("fake", MPI_COMM_SELF, fake_progress, NULL, NULL);
    CHECK(g != NULL, "register");
    char buf[1024];
    CHECK(mt_watchdog_local_view(buf, sizeof(buf)) == 0, "nothing pending yet: %s", buf);
    mt_watchdog_op_begin(g, 1, "all_gather", 4096, -1);
    CHECK(mt_watchdog_local_view(buf, sizeof(buf)) == 1, "one pending");
    CHECK(strstr(buf, "comm 'fake'") && strstr(buf, "call #1 all_gather") && strstr(buf, "4096 bytes"), "view: %s",
          buf);
    atomic_store(&fake_completed, 1);
    CHECK(mt_watchdog_local_view(buf, sizeof(buf)) == 0, "completed: %s", buf);
    /* What registration costs every call: the best of 5 rounds of 200k registrations (printed; the bound
     * is loose because the machine may be loaded). */
    double best = 1e9;
    for (int round = 0; round < 5; round++) {
        double t0 = mt_now();
        for (uint64_t s = 2; s < 200002; s++) {
            mt_watchdog_op_begin(g, s, "all_reduce", 4096, -1);
        }
        best = MT_MIN(best, (mt_now() - t0) / 200000.0);
    }
    printf("watchdog: mt_watchdog_op_begin costs %.1f ns per call (best of 5 x 200000)\n", best * 1e9);
    CHECK(best < 5e-6, "registration costs %.0f ns per call", best * 1e9);
    mt_watchdog_group_unregister(g);
    mt_watchdog_group_unregister(NULL);
    mt_watchdog_op_begin(NULL, 1, "x", 0, -1);
}

static void abort_never_returns(void *arg) {
    (void)arg;
    for (;;) {
        sleep(60);
    }
}

static void all_reduce(mt_comm_t c, float *buf) {
    mt_status_t st = mt_coll_all_reduce(c, buf, buf, N, MT_COLL_F32, MT_REDOP_SUM, STREAM, NULL);
#if MT_WATCHDOG_DEVICE
    if (st == MT_OK && cudaStreamSynchronize(stream) != cudaSuccess) {
        st = MT_ERR_CUDA;
    }
#endif
    if (st != MT_OK) {
        fprintf(stderr, "all_reduce failed: %s\n", mt_last_error_msg());
    }
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    const mt_world_t *w = mt_rt_world();
    const char *mode = argc > 1 ? argv[1] : "clean";
    int culprit = argc > 2 ? atoi(argv[2]) : 2;
    const char *report = argc > 3 ? argv[3] : NULL; /* the report file (skip mode) */
    static float host_buf[N];
    float *buf = host_buf;
    mt_comm_params_t cp = MT_COMM_PARAMS_INIT;
#if MT_WATCHDOG_DEVICE /* one emulated device per rank (MESHTRAIN_EMU_DEVICES), as NCCL wants */
    CHECK(cudaSetDevice(w->local_rank) == cudaSuccess && cudaStreamCreate(&stream) == cudaSuccess &&
              cudaMalloc((void **)&buf, N * sizeof(float)) == cudaSuccess,
          "device set-up");
    cp.memory = MT_COMM_MEM_DEVICE;
    cp.backend = "nccl";
#endif
    for (int i = 0; i < N; i++) {
        buf[i] = 1.0f; /* (emulated device memory is the host's) */
    }
    mt_watchdog_params_t p = MT_WATCHDOG_PARAMS_INIT;
    p.timeout_s = MT_WATCHDOG_DEVICE ? 4.0 : 2.0; /* the emulator's ranks are slower, and share 2 cores */
    p.answer_s = p.timeout_s;
    p.report_path = report;
    cp.name = "world";
    mt_comm_t world = NULL;

    if (!strcmp(mode, "clean")) {
        /* A longer timeout here: on a loaded machine (or under ASan) an ordinary all-reduce can take a
         * second or two, and this mode asserts that nothing is reported. */
        p.timeout_s = 8.0;
        registry_checks();
        for (int round = 0; round < 2; round++) {
            CHECK_OK(mt_watchdog_start(&p));
            CHECK(mt_watchdog_running(), "running");
            CHECK(mt_watchdog_start(&p) == MT_ERR_INVALID_USAGE, "second start refused");
            CHECK_OK(mt_comm_init(w->comm, &cp, &world));
            for (int i = 0; i < 6; i++) {
                if (i == 3 && w->rank == w->size - 1) {
                    usleep(800 * 1000); /* late, within the timeout: no report */
                }
                all_reduce(world, buf);
                mt_work_t wk = NULL;
                CHECK_OK(mt_coll_all_reduce(world, buf, buf, N, MT_COLL_F32, MT_REDOP_MAX, STREAM, &wk));
                CHECK_OK(mt_work_wait(wk, -1));
                mt_work_free(wk);
            }
            char view[1024];
            CHECK(mt_watchdog_local_view(view, sizeof(view)) == 0, "nothing pending after the loop: %s", view);
            CHECK(mt_comm_seq_completed(world) == 12, "12 calls completed: %llu",
                  (unsigned long long)mt_comm_seq_completed(world));
            CHECK_OK(mt_comm_free(world));
            /* a rank that stops late: the others keep answering until every rank has stopped */
            if (w->rank == 0) {
                usleep(300 * 1000);
            }
            CHECK_OK(mt_watchdog_stop());
            CHECK(!mt_watchdog_running(), "stopped");
        }
        CHECK_OK(mt_watchdog_stop()); /* no-op */
        return mt_test_finish_mpi("watchdog clean");
    }

    CHECK_OK(mt_watchdog_start(&p));
    if (!strcmp(mode, "abort_hangs")) {
        mt_wd_group_t g = mt_watchdog_group_register("hangs-on-abort", w->comm, fake_progress, abort_never_returns,
                                                     NULL);
        CHECK(g != NULL, "register");
        mt_watchdog_op_begin(g, 1, "all_reduce", 4096, -1); /* never completes */
        sleep(60);
        fprintf(stderr, "rank %d: the job was not ended by the watchdog\n", w->rank);
        return 1;
    }
    CHECK_OK(mt_comm_init(w->comm, &cp, &world));
    mt_comm_t pair = NULL;
    if (!strcmp(mode, "cross") && w->rank >= 2 && w->rank <= 3) {
        int ranks[2] = {2, 3};
        mt_comm_params_t pp = MT_COMM_PARAMS_INIT;
        pp.name = "pair";
        CHECK_OK(mt_comm_init_ranks(w->comm, ranks, 2, &pp, &pair));
    }
    for (int i = 0; i < 5; i++) {
        if (i == 2 && !strcmp(mode, "kill") && w->rank == culprit) {
            fprintf(stderr, "rank %d: killing myself (SIGKILL) before all-reduce #3\n", w->rank);
            fflush(stderr);
            raise(SIGKILL);
        }
        if (i == 2 && !strcmp(mode, "skip") && w->rank == culprit) {
            fprintf(stderr, "rank %d: skipping all-reduce #3\n", w->rank);
            sleep(60); /* off doing something else; the watchdog must end the job long before this */
            break;
        }
        if (i == 2 && !strcmp(mode, "cross") && w->rank == 2) {
            all_reduce(pair, buf); /* rank 3 is in world #3: never returns */
            break;
        }
        all_reduce(world, buf);
        usleep(50 * 1000);
    }
    if (MT_WATCHDOG_DEVICE) {
        /* the watchdog's abort of the NCCL comm releases this rank's stream before its MPI_Abort ends the job:
         * wait for that, as a rank would whose next collective fails */
        sleep(60);
    }
    fprintf(stderr, "rank %d: the job was not ended by the watchdog\n", w->rank);
    return 1;
}
