/* Asynchronous calls: handles complete in issue order while the caller keeps working, synchronous calls
 * wait for earlier asynchronous ones, results are right, a 4 MiB all-reduce progresses while the caller
 * computes without calling MPI (overlap, measured), and a call a peer never joins times out with a
 * message naming the op, the comm and the sequence number instead of hanging.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "coll_testlib.h"
#include "runtime/alloc.h"
#include "runtime/rt.h"
#include "testutil.h"

/* Busy arithmetic that never calls MPI, for about `seconds`. */
static volatile double sink;
static void compute_for(double seconds) {
    double t0 = mt_now(), x = 1.0;
    while (mt_now() - t0 < seconds) {
        for (int i = 0; i < 20000; i++) {
            x = x * 1.0000001 + 1e-9;
        }
    }
    sink = x;
}

static void test_order(mt_comm_t c) {
    int n = mt_comm_size(c), r = mt_comm_rank(c);
    enum { K = 8, CNT = 20000 };
    float *bufs[K];
    mt_work_t w[K];
    uint64_t s0 = mt_comm_seq_issued(c);
    for (int k = 0; k < K; k++) {
        bufs[k] = mt_alloc(sizeof(float) * CNT, MT_MEM_COMM, "test");
        for (int i = 0; i < CNT; i++) {
            bufs[k][i] = (float)(r + k + i % 5);
        }
        CHECK_OK(mt_coll_all_reduce(c, bufs[k], bufs[k], CNT, MT_COLL_F32, MT_REDOP_SUM, NULL, &w[k]));
        CHECK(mt_work_seq(w[k]) == s0 + 1 + (uint64_t)k, "seq of call %d is %llu", k,
              (unsigned long long)mt_work_seq(w[k]));
    }
    CHECK(mt_comm_seq_issued(c) == s0 + K, "issued %llu", (unsigned long long)mt_comm_seq_issued(c));
    /* Keep working, polling: the completed set must always be a prefix of the issued calls. */
    int prefix_violations = 0, polls = 0;
    double t0 = mt_now();
    for (;;) {
        bool done[K];
        int n_done = 0;
        for (int k = 0; k < K; k++) {
            CHECK_OK(mt_work_test(w[k], &done[k]));
            n_done += done[k];
        }
        for (int k = 1; k < K; k++) {
            prefix_violations += done[k] && !done[k - 1];
        }
        uint64_t comp = mt_comm_seq_completed(c);
        prefix_violations += comp < s0 + (uint64_t)n_done; /* completed moves before a handle says done */
        polls++;
        if (n_done == K || mt_now() - t0 > 20) {
            break;
        }
        compute_for(0.0005);
    }
    CHECK(prefix_violations == 0, "%d polls saw a later call done before an earlier one", prefix_violations);
    /* Wait in reverse order: all already complete or completing; results right. */
    for (int k = K - 1; k >= 0; k--) {
        CHECK_OK(mt_work_wait(w[k], -1));
        int bad = 0;
        for (int i = 0; i < CNT; i++) {
            float want = (float)(n * (n - 1) / 2 + n * (k + i % 5));
            bad += bufs[k][i] != want;
        }
        CHECK(bad == 0, "async all_reduce %d: %d wrong", k, bad);
        mt_work_free(w[k]);
        mt_free(bufs[k]);
    }
    CHECK(mt_comm_seq_completed(c) == s0 + K, "completed %llu", (unsigned long long)mt_comm_seq_completed(c));
}

/* Asynchronous calls of every kind, then a synchronous one: it must find them all complete. */
static void test_mixed(mt_comm_t c) {
    int n = mt_comm_size(c), r = mt_comm_rank(c);
    int32_t a[64], g[64 * 8], b[4], x[8 * 4], y[8 * 4], nb[2], pv[2];
    for (int i = 0; i < 64; i++) {
        a[i] = r + i;
    }
    for (int i = 0; i < 4; i++) {
        b[i] = r == 0 ? 100 + i : -1;
    }
    for (int i = 0; i < 4 * n; i++) {
        x[i] = r * 100 + i;
    }
    mt_work_t w[6];
    CHECK_OK(mt_coll_all_reduce(c, a, a, 64, MT_COLL_I32, MT_REDOP_MAX, NULL, &w[0]));
    CHECK_OK(mt_coll_all_gather(c, a, g, 64, MT_COLL_I32, NULL, &w[1])); /* sees the max: issue order */
    CHECK_OK(mt_coll_broadcast(c, b, b, 4, MT_COLL_I32, 0, NULL, &w[2]));
    CHECK_OK(mt_coll_all_to_all(c, x, y, 4, MT_COLL_I32, NULL, &w[3]));
    nb[0] = r;
    CHECK_OK(mt_coll_group_start(c));
    CHECK_OK(mt_coll_send(c, &nb[0], 1, MT_COLL_I32, (r + 1) % n, NULL, NULL));
    CHECK_OK(mt_coll_recv(c, &pv[0], 1, MT_COLL_I32, (r + n - 1) % n, NULL, NULL));
    CHECK_OK(mt_coll_group_end(c, NULL, &w[4]));
    CHECK_OK(mt_coll_barrier(c, NULL, &w[5]));
    int32_t s = r, total = 0;
    CHECK_OK(mt_coll_all_reduce(c, &s, &total, 1, MT_COLL_I32, MT_REDOP_SUM, NULL, NULL));
    for (int k = 0; k < 6; k++) {
        bool done = false;
        CHECK_OK(mt_work_test(w[k], &done));
        CHECK(done, "async call %d complete once a later synchronous call returned", k);
        mt_work_free(w[k]);
    }
    CHECK(total == n * (n - 1) / 2, "sync all_reduce %d", total);
    int bad = 0;
    for (int q = 0; q < n; q++) {
        for (int i = 0; i < 64; i++) {
            bad += g[q * 64 + i] != n - 1 + i;
        }
        for (int i = 0; i < 4; i++) {
            bad += y[q * 4 + i] != q * 100 + r * 4 + i;
        }
    }
    for (int i = 0; i < 4; i++) {
        bad += b[i] != 100 + i;
    }
    bad += pv[0] != (r + n - 1) % n;
    CHECK(bad == 0, "mixed asynchronous calls: %d wrong values", bad);
    /* A detached handle: freed before completion, the call still completes. */
    mt_work_t d = NULL;
    int32_t dv = 1, dsum = 0;
    CHECK_OK(mt_coll_all_reduce(c, &dv, &dsum, 1, MT_COLL_I32, MT_REDOP_SUM, NULL, &d));
    uint64_t dseq = mt_work_seq(d);
    mt_work_free(d);
    CHECK_OK(mt_coll_barrier(c, NULL, NULL));
    CHECK(mt_comm_seq_completed(c) >= dseq && dsum == n, "detached call completed (sum %d)", dsum);
}

/* Overlap: a 4 MiB all-reduce issued asynchronously must complete while the caller computes without
 * calling MPI, so the wait afterwards returns at once. Without a progress mechanism (a plain
 * MPI_Iallreduce) the wait would take about a whole all-reduce. */
static void test_overlap(mt_comm_t c) {
    if (mt_comm_size(c) == 1) {
        printf("overlap: 1 rank, nothing to overlap (checked on 2+ ranks)\n");
        return;
    }
    const size_t cnt = (4u << 20) / sizeof(float);
    float *v = mt_alloc(cnt * sizeof(float), MT_MEM_COMM, "test");
    for (size_t i = 0; i < cnt; i++) {
        v[i] = 1.0f;
    }
    /* the synchronous time, median of 3 */
    double ts[3];
    for (int k = 0; k < 3; k++) {
        CHECK_OK(mt_coll_barrier(c, NULL, NULL));
        double t0 = mt_now();
        CHECK_OK(mt_coll_all_reduce(c, v, v, cnt, MT_COLL_F32, MT_REDOP_MAX, NULL, NULL));
        ts[k] = mt_now() - t0;
    }
    double t_sync = ts[0] > ts[1] ? (ts[1] > ts[2] ? ts[1] : (ts[0] > ts[2] ? ts[2] : ts[0]))
                                  : (ts[0] > ts[2] ? ts[0] : (ts[1] > ts[2] ? ts[2] : ts[1]));
    /* Compute for 10x the synchronous time (at least 50 ms). The progress check polls mt_work_test, which
     * only reads a flag (no MPI), so MPI is never entered by this thread; if the machine is so loaded that
     * the call is not done by then, keep computing (still without MPI) up to 30 s: a mechanism that does
     * not progress on its own never completes here and the test fails. */
    double compute = 10 * t_sync < 0.05 ? 0.05 : (10 * t_sync > 2.0 ? 2.0 : 10 * t_sync);
    CHECK_OK(mt_coll_barrier(c, NULL, NULL));
    mt_work_t w = NULL;
    double t0 = mt_now();
    CHECK_OK(mt_coll_all_reduce(c, v, v, cnt, MT_COLL_F32, MT_REDOP_SUM, NULL, &w));
    double t_issue = mt_now() - t0;
    bool done = false;
    double t_done = -1;
    while (mt_now() - t0 < compute || (!done && mt_now() - t0 < 30.0)) {
        compute_for(0.001);
        if (!done) {
            CHECK_OK(mt_work_test(w, &done));
            if (done) {
                t_done = mt_now() - t0;
            }
        }
    }
    double t1 = mt_now();
    CHECK_OK(mt_work_wait(w, -1));
    double t_wait = mt_now() - t1;
    mt_work_free(w);
    int n = mt_comm_size(c), bad = 0;
    for (size_t i = 0; i < cnt; i++) {
        bad += v[i] != (float)n;
    }
    CHECK(bad == 0, "overlapped all_reduce: %d wrong", bad);
    /* Every rank must see it: the slowest rank decides. */
    double mine[4] = {t_wait, t_issue, t_done < 0 ? 1e9 : t_done, (double)!done}, all[4];
    MPI_Allreduce(mine, all, 4, MPI_DOUBLE, MPI_MAX, mt_rt_world()->comm);
    int rank = mt_comm_rank(c);
    if (rank == 0) {
        printf("overlap: 4 MiB all_reduce sync %.2f ms; async issue %.3f ms, completed %.2f ms into a %.0f ms "
               "compute phase without MPI calls, then wait %.3f ms (max over ranks)\n",
               t_sync * 1e3, all[1] * 1e3, all[2] * 1e3, compute * 1e3, all[0] * 1e3);
    }
    CHECK(all[3] == 0, "the asynchronous all-reduce did not complete during 30 s of compute without MPI calls: "
                       "nothing progresses it");
    CHECK(all[0] < 0.25 * t_sync + 0.0002, "wait after the call completed took %.3f ms", all[0] * 1e3);
    mt_free(v);
}

/* Rank 0 issues a call the others join only later: its waits time out naming op, comm and seq. */
static void test_timeout(void) {
    const mt_world_t *wd = mt_rt_world();
    if (wd->size == 1) {
        printf("timeout: needs 2+ ranks (a 1-rank call cannot wait on a peer)\n");
        return;
    }
    mt_comm_params_t p = MT_COMM_PARAMS_INIT;
    p.name = "slowpoke";
    p.timeout_s = 0.3;
    mt_comm_t c = NULL;
    CHECK_OK(mt_comm_init(wd->comm, &p, &c));
    int32_t v = 1, s = 0;
    if (wd->rank == 0) {
        mt_work_t w = NULL;
        CHECK_OK(mt_coll_all_reduce(c, &v, &s, 1, MT_COLL_I32, MT_REDOP_SUM, NULL, &w));
        double t0 = mt_now();
        mt_status_t st = mt_work_wait(w, 0.2);
        double took = mt_now() - t0;
        CHECK(st == MT_ERR_TIMEOUT, "wait returned %s", mt_status_str(st));
        CHECK(took >= 0.19 && took < 2.0, "timed out after %.3f s", took);
        const char *m = mt_last_error_msg();
        CHECK(strstr(m, "all_reduce") && strstr(m, "slowpoke") && strstr(m, "call 1 "), "message: %s", m);
        bool done = true;
        CHECK_OK(mt_work_test(w, &done));
        CHECK(!done, "not complete yet");
        /* A synchronous call behind it waits for it, up to the comm's timeout (0.3 s). */
        st = mt_coll_barrier(c, NULL, NULL);
        CHECK(st == MT_ERR_TIMEOUT, "sync call behind a stuck one returned %s", mt_status_str(st));
        CHECK(strstr(mt_last_error_msg(), "slowpoke") && strstr(mt_last_error_msg(), "call 1 "), "message: %s",
              mt_last_error_msg());
        CHECK(mt_comm_seq_issued(c) == 1 && mt_comm_seq_completed(c) == 0, "watchdog view: issued %llu completed %llu",
              (unsigned long long)mt_comm_seq_issued(c), (unsigned long long)mt_comm_seq_completed(c));
        MPI_Barrier(wd->comm); /* release the others */
        CHECK_OK(mt_work_wait(w, 30));
        CHECK(s == wd->size, "late all_reduce sum %d", s);
        mt_work_free(w);
    } else {
        MPI_Barrier(wd->comm);
        CHECK_OK(mt_coll_all_reduce(c, &v, &s, 1, MT_COLL_I32, MT_REDOP_SUM, NULL, NULL));
    }
    CHECK_OK(mt_coll_barrier(c, NULL, NULL));
    CHECK(mt_comm_seq_completed(c) == mt_comm_seq_issued(c), "all complete");
    CHECK_OK(mt_comm_free(c));
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    const mt_world_t *wd = mt_rt_world();
    mt_comm_params_t p = MT_COMM_PARAMS_INIT;
    p.name = "world";
    mt_comm_t c = NULL;
    CHECK_OK(mt_comm_init(wd->comm, &p, &c));
    test_order(c);
    test_mixed(c);
    test_overlap(c);
    test_timeout();
    CHECK_OK(mt_comm_free(c));
    return mt_test_finish_mpi("test_coll_async");
}
