/* Failure paths of the shared-memory collectives, 2 ranks, MESHTRAIN_COLL_TIMEOUT=MESHTRAIN_SHM_TIMEOUT=2:
 * ranks issuing different calls get MT_ERR_INVALID_USAGE naming the peer's call; a rank that never
 * arrives makes the other time out (MT_ERR_TIMEOUT naming rank, op and sequence number) within the
 * timeout; after a failure every later call on either rank fails at once (MT_ERR_REMOTE), no hang.
 * SPDX-License-Identifier: MIT */
#include <string.h>
#include <unistd.h>

#include "collectives/coll.h"
#include "runtime/rt.h"
#include "testutil.h"

static mt_comm_t make(const char *name) {
    mt_comm_params_t p = MT_COMM_PARAMS_INIT;
    p.name = name;
    p.backend = "shm";
    mt_comm_t c = NULL;
    CHECK_OK(mt_comm_init(mt_rt_world()->comm, &p, &c));
    return c;
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    const mt_world_t *w = mt_rt_world();
    if (w->size != 2) {
        fprintf(stderr, "test_shm_errors runs on 2 ranks\n");
        return 1;
    }
    float a[256], b[512];
    for (int i = 0; i < 256; i++) {
        a[i] = (float)i;
    }

    /* 1. different calls: all_reduce on rank 0, all_gather on rank 1 */
    mt_comm_t c = make("mismatch");
    mt_status_t st = w->rank == 0 ? mt_coll_all_reduce(c, a, b, 256, MT_COLL_F32, MT_REDOP_SUM, NULL, NULL)
                                  : mt_coll_all_gather(c, a, b, 256, MT_COLL_F32, NULL, NULL);
    CHECK(st == MT_ERR_INVALID_USAGE, "mismatched calls returned %s (%s)", mt_status_str(st), mt_last_error_msg());
    CHECK(strstr(mt_last_error_msg(), "issued a different call") != NULL, "message: %s", mt_last_error_msg());
    st = mt_coll_all_reduce(c, a, b, 256, MT_COLL_F32, MT_REDOP_SUM, NULL, NULL);
    CHECK(st == MT_ERR_REMOTE, "a call after the failure returned %s", mt_status_str(st));
    mt_comm_free(c);
    MPI_Barrier(w->comm);

    /* 2. rank 1 never arrives: rank 0 times out (2 s); rank 1's next call fails at once */
    c = make("timeout");
    double t0 = mt_now();
    if (w->rank == 0) {
        st = mt_coll_all_reduce(c, a, b, 256, MT_COLL_F32, MT_REDOP_SUM, NULL, NULL);
        double dt = mt_now() - t0;
        CHECK(st == MT_ERR_TIMEOUT, "missing peer: %s (%s)", mt_status_str(st), mt_last_error_msg());
        CHECK(dt >= 1.9 && dt < 10, "timed out after %.2f s, want about 2", dt);
        const char *m = mt_last_error_msg();
        CHECK(strstr(m, "shm all_reduce (call 1,") && strstr(m, "local rank 1 (comm rank 1") &&
              strstr(m, "did not arrive"), "message does not name op, call and rank: %s", m);
    }
    MPI_Barrier(w->comm); /* rank 1 waits here (over MPI) until rank 0 has timed out */
    if (w->rank == 1) {
        t0 = mt_now();
        st = mt_coll_all_reduce(c, a, b, 256, MT_COLL_F32, MT_REDOP_SUM, NULL, NULL);
        CHECK(st == MT_ERR_REMOTE && mt_now() - t0 < 1.0, "after the peer failed: %s in %.2f s (%s)",
              mt_status_str(st), mt_now() - t0, mt_last_error_msg());
    }
    mt_comm_free(c);
    return mt_test_finish_mpi("test_shm_errors");
}
