/* The timeline profiler: regions record nothing when tracing is off, spans from two threads land on
 * two named tracks, clocks are aligned, all ranks are merged by rank 0 into one valid Chrome trace,
 * and the memory profiler's history accounts for every allocation with the breakdown at the peak.
 * SPDX-License-Identifier: MIT */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/alloc.h"
#include "runtime/memprof.h"
#include "runtime/rt.h"
#include "runtime/trace.h"
#include "testutil.h"

static void *worker(void *arg) {
    mt_trace_thread_name("worker");
    MT_TRACE_BEGIN(t);
    usleep(1000);
    MT_TRACE_END(t, "comm", "all_reduce");
    return NULL;
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    const mt_world_t *w = mt_rt_world();
    CHECK_OK(mt_trace_sync_clocks(w->comm));
    double off, rtt;
    mt_trace_clock_offset(&off, &rtt);
    CHECK(w->rank == 0 ? off == 0 : rtt > 0, "offset measured: %.1f us rtt %.1f", off, rtt);

    {
        MT_TRACE_BEGIN(t);
        MT_TRACE_END(t, "compute", "ignored");
    }
    CHECK(mt_trace_count() == 0, "nothing recorded while off");
    mt_trace_thread_name("main");
    mt_trace_start();
    {
        MT_TRACE_BEGIN(t);
        usleep(2000);
        MT_TRACE_END(t, "compute", "forward block.0");
    }
    mt_trace_span("comm", "broadcast", 10.0, 20.0, "\"bytes\": 64, \"seq\": 3, \"group\": \"dp\"");
    mt_trace_instant("watchdog", "desync \"report\"", NULL);
    mt_trace_counter("memory", "bytes", 1234.0);
    pthread_t th;
    pthread_create(&th, NULL, worker, NULL);
    pthread_join(th, NULL);
    mt_trace_stop();
    CHECK(mt_trace_count() == 7, "events recorded: %zu", mt_trace_count());

    char path[256] = "";
    if (w->rank == 0) {
        snprintf(path, sizeof(path), "/tmp/mt_trace_test_%d.json", (int)getpid());
    }
    MPI_Bcast(path, sizeof(path), MPI_CHAR, 0, w->comm);
    CHECK_OK(mt_trace_write(w->comm, path));
    if (w->rank == 0) {
        char cmd[512];
        snprintf(cmd, sizeof(cmd), "python3 %s/tests/tools/check_trace.py %s %d 'forward block.0' all_reduce",
                 MT_SOURCE_DIR, path, w->size);
        CHECK(system(cmd) == 0, "trace validates");
        unlink(path);
    }
    /* Unwritable path: every rank gets the error, nothing hangs. */
    CHECK(mt_trace_write(w->comm, "/nonexistent/dir/trace.json") == MT_ERR_IO, "unwritable path reported");

    /* Memory profile. */
    mt_memprof_start();
    void *a = mt_alloc(1 << 20, MT_MEM_ACTIVATIONS, "block.0 acts");
    void *b = mt_alloc(4096, MT_MEM_GRADS, "grads");
    mt_free(a);
    void *c = mt_alloc(1024, MT_MEM_ACTIVATIONS, "block.1 acts");
    mt_memprof_stop();
    CHECK(mt_memprof_count() == 4, "4 events: %zu", mt_memprof_count());
    char mp[256];
    snprintf(mp, sizeof(mp), "/tmp/mt_memprof_test_%d_%d.json", (int)getpid(), w->rank);
    CHECK_OK(mt_memprof_write(mp, w->rank));
    char cmd[600];
    snprintf(cmd, sizeof(cmd),
             "python3 -c \"import json,sys; d=json.load(open('%s')); p=d['peak']; "
             "o={x['owner']:x['bytes'] for x in p['by_owner']}; "
             "sys.exit(0 if p['by_category']['activations']>=1048576 and o.get('block.0 acts')==1048576 and "
             "len(d['events'])==4 and 'block.1 acts' not in o else 1)\"", mp);
    CHECK(system(cmd) == 0, "memory profile has the peak breakdown by owner");
    unlink(mp);
    mt_free(b);
    mt_free(c);
    return mt_test_finish_mpi("test_trace");
}
