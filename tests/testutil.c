/* Implementation of the test harness's closing lines.
 * SPDX-License-Identifier: MIT */
#include "testutil.h"

#include "runtime/rt.h"

int mt_test_failures;
int mt_test_checks;

int mt_test_finish(const char *name) {
    printf("%s: %d checks, %d failed\n", name, mt_test_checks, mt_test_failures);
    return mt_test_failures ? 1 : 0;
}

int mt_test_finish_mpi(const char *name) {
    const mt_world_t *w = mt_rt_world();
    int local[2] = {mt_test_failures, mt_test_checks}, total[2] = {0, 0};
    MPI_Allreduce(local, total, 2, MPI_INT, MPI_SUM, w->comm);
    if (w->rank == 0) {
        printf("%s (%d ranks): %d checks, %d failed\n", name, w->size, total[1], total[0]);
    }
    mt_rt_finalize();
    return total[0] ? 1 : 0;
}
