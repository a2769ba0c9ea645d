/* Victim/survivor program of the kill test (kill_test.sh): every rank loops 4 MiB all-reduces on the shm
 * backend; once the first has completed, rank 0 writes every rank's pid to argv[1] and the script
 * kill -9s one rank mid-loop. Survivors must leave the loop with an error naming the op and the call
 * (they print "survivor rank R: ..." and exit 3); completing the loop or hanging is a failure the script
 * reports.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "collectives/coll.h"
#include "runtime/alloc.h"
#include "runtime/rt.h"

int main(int argc, char **argv) {
    if (argc < 2 || mt_rt_init(&argc, &argv) != MT_OK) {
        fprintf(stderr, "usage: test_shm_kill PIDFILE (under mpiexec)\n");
        return 2;
    }
    const mt_world_t *w = mt_rt_world();
    mt_comm_params_t p = MT_COMM_PARAMS_INIT;
    p.name = "killtest";
    mt_comm_t c;
    if (mt_comm_init(w->comm, &p, &c) != MT_OK) {
        fprintf(stderr, "rank %d: comm: %s\n", w->rank, mt_last_error_msg());
        return 2;
    }
    size_t count = 1u << 20;
    float *x = mt_alloc(count * sizeof(float), MT_MEM_COMM, "test");
    for (size_t i = 0; i < count; i++) {
        x[i] = 1.0f;
    }
    int pids[64] = {0}, me = (int)getpid();
    MPI_Gather(&me, 1, MPI_INT, pids, 1, MPI_INT, 0, w->comm);
    double t0 = mt_now();
    for (long k = 1; mt_now() - t0 < 60.0; k++) {
        mt_status_t st = mt_coll_all_reduce(c, x, x, count, MT_COLL_F32, MT_REDOP_AVG, NULL, NULL);
        if (st != MT_OK) {
            printf("survivor rank %d: all_reduce %ld failed: %s: %s\n", w->rank, k, mt_status_str(st),
                   mt_last_error_msg());
            fflush(stdout);
            _exit(3); /* MPI_Finalize would wait for the dead rank */
        }
        if (k == 1 && w->rank == 0) {
            char tmp[4096];
            snprintf(tmp, sizeof(tmp), "%s.tmp", argv[1]);
            FILE *f = fopen(tmp, "w");
            for (int r = 0; f && r < w->size; r++) {
                fprintf(f, "%d\n", pids[r]);
            }
            if (!f || fclose(f) != 0 || rename(tmp, argv[1]) != 0) {
                fprintf(stderr, "cannot write %s\n", argv[1]);
                return 2;
            }
        }
    }
    printf("rank %d: 60 s of all-reduces without an error: the victim was not killed\n", w->rank);
    mt_free(x);
    mt_comm_free(c);
    mt_rt_finalize();
    return 0;
}
