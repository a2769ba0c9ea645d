/* All ranks agree on a loss-scaler skip: only one rank's gradients overflow, the flag is all-reduced
 * (MAX) as the caller must, every rank skips the same steps and the scales stay identical.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <mpi.h>

#include "runtime/precision.h"
#include "runtime/rt.h"
#include "testutil.h"

int main(int argc, char **argv) {
    if (mt_rt_init(&argc, &argv) != MT_OK) {
        return 1;
    }
    const mt_world_t *w = mt_rt_world();
    mt_loss_scaler_t s;
    CHECK_OK(mt_loss_scaler_init(&s, MT_PREC_FP16, 65536.0f, 4));
    float w_local = 0.0f;
    mt_master_t m;
    CHECK_OK(mt_master_init(MT_PREC_FP16, &w_local, 1, &m));
    int skips = 0;
    for (int step = 0; step < 20; step++) {
        /* rank (step % size) sees a gradient that overflows f16 at steps 3 and 11 */
        float g = 0.5f * mt_loss_scaler_scale(&s);
        if ((step == 3 || step == 11) && w->rank == step % w->size) {
            g = 2.0f * mt_loss_scaler_scale(&s);
        }
        int local = mt_master_prepare_grads(m, &g, 1), any = 0;
        MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, w->comm);
        skips += mt_loss_scaler_update(&s, any);
        float lo, hi;
        MPI_Allreduce(&s.scale, &lo, 1, MPI_FLOAT, MPI_MIN, w->comm);
        MPI_Allreduce(&s.scale, &hi, 1, MPI_FLOAT, MPI_MAX, w->comm);
        CHECK(lo == hi, "step %d: ranks disagree on the scale (%g vs %g)", step, lo, hi);
    }
    CHECK(skips == 2, "every rank skipped exactly the 2 overflow steps (rank %d: %d)", w->rank, skips);
    mt_master_free(m);
    return mt_test_finish_mpi("test_loss_scale_mpi");
}
