/* Group communicators along mesh axes: for several tp x dp x pp layouts of the world and every
 * non-empty set of axes, this rank's group (computed here with the documented default order
 * rank = tp_rank + tp*(dp_rank + dp*pp_rank)) is created from its rank list, and an all-gather of world
 * ranks over it must return exactly that list while an all-reduce sums it. When the mesh code is
 * built (runtime/mesh.c), mt_comm_init_mesh must produce the same groups.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "runtime/mesh.h"
#include "runtime/rt.h"
#include "testutil.h"

/* The ranks that differ from `rank` only in the coordinates of the axes in mask, increasing. */
static int formula_group(int tp, int dp, int pp, int rank, unsigned mask, int *out) {
    int size[3] = {tp, dp, pp};
    int me[3] = {rank % tp, (rank / tp) % dp, rank / (tp * dp)};
    int n = 0;
    for (int r = 0; r < tp * dp * pp; r++) {
        int c[3] = {r % tp, (r / tp) % dp, r / (tp * dp)};
        bool same = true;
        for (int a = 0; a < 3; a++) {
            same &= (mask & MT_AXIS_BIT(a)) || c[a] == me[a];
        }
        if (same) {
            out[n++] = r;
        }
    }
    (void)size;
    return n;
}

static void check_group(mt_comm_t c, const int *want, int n, const char *what) {
    const mt_world_t *w = mt_rt_world();
    CHECK(mt_comm_size(c) == n, "%s: size %d want %d", what, mt_comm_size(c), n);
    int got[64] = {0};
    int me = w->rank, sum = -1;
    CHECK_OK(mt_coll_all_gather(c, &me, got, 1, MT_COLL_I32, NULL, NULL));
    CHECK_OK(mt_coll_all_reduce(c, &me, &sum, 1, MT_COLL_I32, MT_REDOP_SUM, NULL, NULL));
    int want_sum = 0, bad = 0;
    for (int i = 0; i < n; i++) {
        want_sum += want[i];
        bad += got[i] != want[i];
    }
    CHECK(bad == 0 && sum == want_sum, "%s: gathered ranks differ from the mesh group (sum %d want %d)", what, sum,
          want_sum);
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    const mt_world_t *w = mt_rt_world();
    int n = w->size;
    /* every factorisation n = tp * dp * pp */
    int meshes = 0;
    for (int tp = 1; tp <= n; tp++) {
        for (int pp = 1; pp <= n / tp; pp++) {
            if (n % (tp * pp)) {
                continue;
            }
            int dp = n / (tp * pp);
            meshes++;
            for (unsigned mask = 1; mask < (1u << MT_AXIS_N); mask++) {
                int ranks[64];
                int k = formula_group(tp, dp, pp, w->rank, mask, ranks);
                char what[96];
                snprintf(what, sizeof(what), "mesh tp=%d dp=%d pp=%d axes 0x%x", tp, dp, pp, mask);
                mt_comm_params_t p = MT_COMM_PARAMS_INIT;
                p.name = what;
                mt_comm_t c = NULL;
                CHECK_OK(mt_comm_init_ranks(w->comm, ranks, k, &p, &c));
                if (c) {
                    check_group(c, ranks, k, what);
                    CHECK_OK(mt_comm_free(c));
                }
#if MT_TEST_HAVE_MESH
                mt_mesh_t *mesh = NULL;
                CHECK_OK(mt_mesh_create(n, tp, pp, dp, "tp-dp-pp", &mesh));
                mt_comm_t m = NULL;
                CHECK_OK(mt_comm_init_mesh(w->comm, mesh, mask, NULL, &m));
                if (m) {
                    check_group(m, ranks, k, what);
                    CHECK_OK(mt_comm_free(m));
                }
                mt_mesh_free(mesh);
#endif
            }
        }
    }
    CHECK(meshes >= 1, "at least the 1x1xN mesh");
#if !MT_TEST_HAVE_MESH
    if (w->rank == 0) {
        printf("mt_comm_init_mesh not exercised: runtime/mesh.c is not in this tree (groups checked by formula)\n");
    }
#endif
    return mt_test_finish_mpi("test_coll_mesh");
}
