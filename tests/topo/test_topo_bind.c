/* Real binding on this machine under mpiexec (run with --bind-to none): the plan is applied to the whole
 * process and matches what the kernel reports (sched_getaffinity, also from OpenMP threads started
 * afterwards), the node's ranks get disjoint cores covering the machine (or share them and say so when
 * there are more ranks than cores), thread pools are sized to the cores owned, a launcher's binding is
 * detected and kept under "auto" and replaced under "force", and "none" changes nothing.
 * SPDX-License-Identifier: MIT */
#include <cblas.h>
#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/rt.h"
#include "runtime/topo.h"
#include "testutil.h"

static void set_affinity(const mt_cpuset_t *s) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c = mt_cpuset_next(s, 0); c >= 0 && c < CPU_SETSIZE; c = mt_cpuset_next(s, c + 1)) {
        CPU_SET(c, &set);
    }
    CHECK(sched_setaffinity(0, sizeof(set), &set) == 0, "sched_setaffinity");
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    const mt_world_t *w = mt_rt_world();
    mt_topo_t *t = NULL;
    CHECK_OK(mt_topo_load(NULL, &t));
    if (!t) {
        return mt_test_finish_mpi("test_topo_bind");
    }
    CHECK(t->this_system && t->n_cores >= 1, "probed this machine: %d cores", t->n_cores);
    mt_cpuset_t start, now;
    CHECK_OK(mt_cpuset_get_affinity(&start));
    if (!mt_cpuset_equal(&start, &t->cpus)) {
        /* Started bound (taskset, a launcher's default): widen to what the process may use, so the checks
         * below start from an unbound process as under `mpiexec --bind-to none`. */
        printf("note: started with a narrower affinity than the %d PUs allowed; widened for the test\n", t->n_pus);
        set_affinity(&t->cpus);
        CHECK_OK(mt_cpuset_get_affinity(&start));
    }
    CHECK(mt_cpuset_equal(&start, &t->cpus), "unbound: affinity covers all %d PUs", t->n_pus);
    mt_topo_report_t rep;

    /* none: nothing changes. */
    CHECK_OK(mt_topo_bind(t, w->local_comm, MT_BIND_NONE, false, false, &rep));
    CHECK_OK(mt_cpuset_get_affinity(&now));
    CHECK(rep.action == MT_BIND_LEFT_ALONE && mt_cpuset_equal(&now, &start), "bind=none left the affinity alone");

    /* A launcher-style binding (narrower than the machine) is kept under auto. */
    if (t->n_pus > 1) {
        mt_cpuset_t one;
        int last = -1;
        for (int c = mt_cpuset_next(&t->cpus, 0); c >= 0; c = mt_cpuset_next(&t->cpus, c + 1)) {
            last = c;
        }
        mt_cpuset_zero(&one);
        mt_cpuset_set(&one, last);
        set_affinity(&one);
        CHECK_OK(mt_topo_bind(t, w->local_comm, MT_BIND_AUTO, false, false, &rep));
        CHECK(rep.action == MT_BIND_KEPT_LAUNCHER, "auto keeps a launcher binding: %s",
              mt_topo_bind_action_str(rep.action));
        CHECK(mt_cpuset_equal(&rep.bound, &one) && strstr(rep.note, "launcher"), "kept cpu %d: %s", last, rep.note);
        CHECK(rep.n_threads == 1 && omp_get_max_threads() == 1, "threads sized to the kept core: %d", rep.n_threads);
        /* force replaces it with the plan. */
        CHECK_OK(mt_topo_bind(t, w->local_comm, MT_BIND_FORCE, false, false, &rep));
        CHECK_OK(mt_cpuset_get_affinity(&now));
        CHECK(rep.action == MT_BIND_APPLIED && mt_cpuset_equal(&now, &rep.plan.cpus), "force applied the plan");
        set_affinity(&start);
    }

    /* auto from an unbound start: the plan is applied. */
    CHECK_OK(mt_topo_bind(t, w->local_comm, MT_BIND_AUTO, false, false, &rep));
    CHECK_OK(mt_cpuset_get_affinity(&now));
    char a[128], b[128];
    mt_cpuset_format(&now, a, sizeof(a));
    mt_cpuset_format(&rep.plan.cpus, b, sizeof(b));
    CHECK(rep.action == MT_BIND_APPLIED, "auto applied: %s", mt_topo_bind_action_str(rep.action));
    CHECK(mt_cpuset_equal(&now, &rep.plan.cpus) && mt_cpuset_equal(&now, &rep.bound), "kernel says %s, plan %s", a, b);
    CHECK(rep.device.kind == MT_DEVKIND_CPU && !strncmp(rep.device_str, "cpu:", 4), "device %s", rep.device_str);
    CHECK(rep.n_threads == rep.plan.n_cores && omp_get_max_threads() == rep.n_threads &&
              openblas_get_num_threads() == rep.n_threads,
          "threads %d, omp %d, openblas %d, cores %d", rep.n_threads, omp_get_max_threads(), openblas_get_num_threads(),
          rep.plan.n_cores);
    /* Threads started after binding inherit it (the OpenMP pool, like BLAS and progress threads). */
    int outside = 0;
#pragma omp parallel reduction(+ : outside)
    {
        mt_cpuset_t mine;
        if (mt_cpuset_get_affinity(&mine) != MT_OK || !mt_cpuset_is_subset(&mine, &rep.plan.cpus)) {
            outside++;
        }
    }
    CHECK(outside == 0, "%d OpenMP threads run outside the binding", outside);

    /* Across the node: disjoint and covering, or shared and reported. */
    int ls = w->local_size;
    mt_cpuset_t *all = malloc(sizeof(mt_cpuset_t) * (size_t)ls);
    MPI_Allgather(&now, (int)sizeof(mt_cpuset_t), MPI_BYTE, all, (int)sizeof(mt_cpuset_t), MPI_BYTE, w->local_comm);
    mt_cpuset_t uni;
    mt_cpuset_zero(&uni);
    int overlaps = 0;
    for (int i = 0; i < ls; i++) {
        overlaps += mt_cpuset_intersects(&uni, &all[i]);
        mt_cpuset_or(&uni, &all[i]);
    }
    bool over = ls > t->n_cores;
    CHECK(rep.oversubscribed == over && rep.plan.shared == over, "%d ranks on %d cores: oversubscribed reported %d", ls,
          t->n_cores, rep.oversubscribed);
    if (!over) {
        CHECK(overlaps == 0, "%d local ranks overlap", overlaps);
        CHECK(ls != t->n_cores || mt_cpuset_equal(&uni, &t->cpus), "one rank per core covers the machine");
    } else {
        CHECK(mt_cpuset_equal(&uni, &t->cpus) && rep.plan.n_cores == 1, "shared cores: every core used, one each");
    }
    if (w->rank == 0) {
        printf("local rank 0 of %d: bound to %s (%s), %d threads, %s\n", ls, a, mt_topo_bind_action_str(rep.action),
               rep.n_threads, rep.oversubscribed ? "oversubscribed" : "exclusive");
    }
    free(all);
    mt_topo_free(t);
    return mt_test_finish_mpi("test_topo_bind");
}
