/* Start-up under mpiexec (and alone): rank/size agree with MPI, local ranks and nodes are consistent
 * across the job, and the launcher's variables agree with what MPI says.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>

#include "runtime/rt.h"
#include "testutil.h"

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    CHECK_OK(mt_rt_init(&argc, &argv)); /* idempotent */
    const mt_world_t *w = mt_rt_world();
    int r, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    CHECK(w->rank == r && w->size == n, "rank %d/%d vs MPI %d/%d", w->rank, w->size, r, n);
    CHECK(w->local_rank >= 0 && w->local_rank < w->local_size, "local rank %d of %d", w->local_rank, w->local_size);
    CHECK(w->node_id >= 0 && w->node_id < w->n_nodes, "node %d of %d", w->node_id, w->n_nodes);
    /* Sum of local sizes over node leaders is the world size. */
    int mine = w->local_rank == 0 ? w->local_size : 0, total = 0;
    MPI_Allreduce(&mine, &total, 1, MPI_INT, MPI_SUM, w->comm);
    CHECK(total == w->size, "local sizes add up to %d, world %d", total, w->size);
    mt_launcher_info_t li;
    mt_launcher_detect(&li);
    if (li.launcher != MT_LAUNCHER_NONE) {
        CHECK(li.rank == w->rank, "launcher rank %d", li.rank);
        if (li.local_rank >= 0) {
            CHECK(li.local_rank == w->local_rank, "launcher local rank %d vs %d", li.local_rank, w->local_rank);
        }
    } else {
        CHECK(w->size == 1, "outside a launcher the job is 1 rank");
    }
    return mt_test_finish_mpi("test_rt_world");
}
