/* Side-by-side timing of all-reduce f32 sum: plain MPI_Allreduce ("raw") against mt_coll_all_reduce on
 * the shm backend, alternating, median of rounds of the slowest rank's mean per call. A tuning tool
 * for the shared-memory path (the release figures come from `meshtrain bench coll --compare-raw`).
 * Usage: bench_shm [min_bytes [max_bytes [rounds]]]
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "runtime/alloc.h"
#include "runtime/rt.h"

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double time_one(mt_comm_t c, MPI_Comm mpi, float *s, float *r, size_t n, int iters, bool raw) {
    MPI_Barrier(mpi);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
        if (raw) {
            MPI_Allreduce(s, r, (int)n, MPI_FLOAT, MPI_SUM, mpi);
        } else if (mt_coll_all_reduce(c, s, r, n, MT_COLL_F32, MT_REDOP_SUM, NULL, NULL) != MT_OK) {
            fprintf(stderr, "all_reduce failed: %s\n", mt_last_error_msg());
            MPI_Abort(mpi, 1);
        }
    }
    double t = (MPI_Wtime() - t0) / iters, worst;
    MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, mpi);
    return worst;
}

int main(int argc, char **argv) {
    if (mt_rt_init(&argc, &argv) != MT_OK) {
        return 1;
    }
    const mt_world_t *w = mt_rt_world();
    size_t lo = argc > 1 ? (size_t)atoll(argv[1]) : 4, hi = argc > 2 ? (size_t)atoll(argv[2]) : 64u << 20;
    int rounds = argc > 3 ? atoi(argv[3]) : 5;
    mt_comm_t c;
    if (mt_comm_init(w->comm, NULL, &c) != MT_OK) {
        fprintf(stderr, "comm: %s\n", mt_last_error_msg());
        return 1;
    }
    float *s = mt_alloc(hi, MT_MEM_COMM, "bench"), *r = mt_alloc(hi, MT_MEM_COMM, "bench");
    for (size_t i = 0; i < hi / 4; i++) {
        s[i] = (float)(i % 17);
    }
    memset(r, 0, hi);
    if (w->rank == 0) {
        printf("# %d ranks, backend %s; times in us (median of %d rounds, slowest rank)\n", w->size,
               mt_comm_backend_name(c), rounds);
        printf("# %12s %12s %12s %9s %10s\n", "bytes", "raw_us", "ours_us", "ours/raw", "busbw_GB/s");
    }
    for (size_t b = lo; b <= hi; b *= 4) {
        size_t n = b / 4;
        int iters = b <= 65536 ? 200 : b <= (1u << 20) ? 40 : b <= (16u << 20) ? 6 : 3;
        time_one(c, w->comm, s, r, n, 2, false);
        time_one(c, w->comm, s, r, n, 2, true);
        double tr[32], to[32];
        for (int k = 0; k < rounds && k < 32; k++) {
            bool first_raw = k & 1;
            tr[k] = time_one(c, w->comm, s, r, n, iters, first_raw ? true : false);
            to[k] = time_one(c, w->comm, s, r, n, iters, first_raw ? false : true);
            if (!first_raw) {
                double t = tr[k];
                tr[k] = to[k];
                to[k] = t;
            }
        }
        qsort(tr, (size_t)rounds, sizeof(double), cmp);
        qsort(to, (size_t)rounds, sizeof(double), cmp);
        double raw = tr[rounds / 2], ours = to[rounds / 2];
        if (w->rank == 0) {
            printf("  %12zu %12.1f %12.1f %9.2f %10.2f\n", b, raw * 1e6, ours * 1e6, ours / raw,
                   (double)b * 2.0 * (w->size - 1) / w->size / ours / 1e9);
            fflush(stdout);
        }
    }
    mt_free(s);
    mt_free(r);
    mt_comm_free(c);
    mt_rt_finalize();
    return 0;
}
