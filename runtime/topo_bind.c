/* The start-up call that applies the placement: picks this rank's device (CUDA's own numbering when a
 * CUDA device exists, else CUDA_VISIBLE_DEVICES over PCI bus order), plans the node with the other
 * local ranks, binds the whole process near its device unless the launcher already did, sizes the
 * OpenMP and OpenBLAS thread pools to the cores owned, and exports the nearest NIC for NCCL on request.
 * SPDX-License-Identifier: MIT */
#include <cblas.h>
#include <errno.h>
#include <hwloc.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "topo.h"

#if MT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

mt_status_t mt_topo_bind_mode_parse(const char *s, mt_bind_mode_t *mode) {
    if (s && !strcmp(s, "auto")) {
        *mode = MT_BIND_AUTO;
    } else if (s && !strcmp(s, "force")) {
        *mode = MT_BIND_FORCE;
    } else if (s && !strcmp(s, "none")) {
        *mode = MT_BIND_NONE;
    } else {
        return mt_error(MT_ERR_INVALID_ARG, "runtime.bind = \"%s\": expected auto, force or none", s ? s : "(null)");
    }
    return MT_OK;
}

const char *mt_topo_bind_action_str(mt_bind_action_t a) {
    switch (a) {
    case MT_BIND_APPLIED:
        return "applied";
    case MT_BIND_KEPT_LAUNCHER:
        return "kept-launcher";
    case MT_BIND_LEFT_ALONE:
        return "none";
    case MT_BIND_NOT_THIS_SYSTEM:
        return "planned-only";
    }
    return "?";
}

/* The GPUs CUDA itself enumerates, mapped to the topology by PCI bus id (this honours UUIDs in
 * CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER). Returns false when CUDA has no device here. */
static bool visible_from_cuda(const mt_topo_t *topo, int *visible, int *n_visible) {
#if MT_HAVE_CUDA
    int n = 0;
    if (!topo->this_system || cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
        cudaGetLastError(); /* clear the sticky "no driver" error */
        return false;
    }
    *n_visible = 0;
    for (int i = 0; i < n && *n_visible < MT_TOPO_MAX_GPUS; i++) {
        char busid[32];
        if (cudaDeviceGetPCIBusId(busid, (int)sizeof(busid), i) != cudaSuccess) {
            return false;
        }
        int g = mt_topo_gpu_by_busid(topo, busid);
        if (g < 0) {
            MT_WARN("CUDA device %d (%s) is not among the GPUs hwloc found; using CUDA_VISIBLE_DEVICES instead", i,
                    busid);
            return false;
        }
        visible[(*n_visible)++] = g;
    }
    return true;
#else
    (void)topo;
    (void)visible;
    (void)n_visible;
    return false;
#endif
}

/* snprintf that may truncate (report text is bounded by design). */
static void fmt_into(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fmt_into(char *buf, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

static int cores_in(const mt_topo_t *topo, const mt_cpuset_t *cpus) {
    int n = 0;
    for (int c = 0; c < topo->n_cores; c++) {
        n += mt_cpuset_intersects(&topo->cores[c].pus, cpus);
    }
    return n;
}

mt_status_t mt_topo_bind(const mt_topo_t *topo, MPI_Comm local_comm, mt_bind_mode_t mode, bool nic_auto, bool use_gpus,
                         mt_topo_report_t *report) {
    memset(report, 0, sizeof(*report));
    MT_MPI_CHECK(MPI_Comm_rank(local_comm, &report->local_rank));
    MT_MPI_CHECK(MPI_Comm_size(local_comm, &report->local_size));
    int lr = report->local_rank, ls = report->local_size;

    /* 1. This rank's device. */
    int visible[MT_TOPO_MAX_GPUS], n_visible = 0;
    mt_status_t st = MT_OK;
    char restricted[160] = "";
    if (use_gpus && topo->n_gpus > 0) {
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
        if (cvd) {
            snprintf(restricted, sizeof(restricted), "CUDA_VISIBLE_DEVICES=%s%s", cvd,
                     getenv("SLURM_STEP_GPUS") || getenv("SLURM_JOB_GPUS") ? " set by Slurm" : "");
        }
        if (!visible_from_cuda(topo, visible, &n_visible)) {
            st = mt_topo_visible_gpus(topo, cvd, visible, &n_visible);
        }
    }
    mt_topo_device_t dev;
    mt_topo_choose_device(topo, lr, visible, st == MT_OK ? n_visible : 0, restricted[0] ? restricted : NULL, &dev);
    if (!use_gpus && topo->n_gpus > 0) {
        snprintf(dev.why, sizeof(dev.why), "CPU requested (runtime.device = cpu)");
    }

    /* 2. Every local rank's device, then the node plan (identical on every local rank). */
    int mine[2] = {dev.gpu, (int)st};
    int *all = malloc(sizeof(int) * 2 * (size_t)ls);
    int *gpu_of_local = malloc(sizeof(int) * (size_t)ls);
    mt_topo_place_t *places = malloc(sizeof(*places) * (size_t)ls);
    if (!all || !gpu_of_local || !places) {
        free(all);
        free(gpu_of_local);
        free(places);
        return mt_error(MT_ERR_OOM, "topology: out of memory for %d local ranks", ls);
    }
    int mrc = MPI_Allgather(mine, 2, MPI_INT, all, 2, MPI_INT, local_comm);
    int bad = -1;
    for (int r = 0; r < ls && mrc == MPI_SUCCESS; r++) {
        gpu_of_local[r] = all[2 * r];
        if (all[2 * r + 1] != MT_OK && bad < 0) {
            bad = r;
        }
    }
    free(all);
    if (mrc != MPI_SUCCESS || bad >= 0 || st != MT_OK) {
        free(gpu_of_local);
        free(places);
        if (st != MT_OK) {
            return st; /* keeps this rank's message */
        }
        if (mrc != MPI_SUCCESS) {
            return mt_error(MT_ERR_MPI, "topology: gathering the devices of the node's ranks failed");
        }
        return mt_error(MT_ERR_INVALID_ARG, "topology: local rank %d could not choose its device (see its message)",
                        bad);
    }
    report->oversubscribed = mt_topo_plan_node(topo, ls, gpu_of_local, places);
    report->plan = places[lr];
    free(gpu_of_local);
    free(places);
    report->device = dev;
    if (dev.kind == MT_DEVKIND_GPU) {
        snprintf(report->device_str, sizeof(report->device_str), "gpu:%d (%s)", dev.cuda_ordinal,
                 topo->gpus[dev.gpu].busid);
    } else {
        char cores[48];
        mt_cpuset_format(&report->plan.cpus, cores, sizeof(cores));
        snprintf(report->device_str, sizeof(report->device_str), "cpu:%s", cores);
    }

    /* 3. Binding. The launcher bound us when our affinity is narrower than what we may use. */
    mt_cpuset_t cur;
    MT_CHECK(mt_cpuset_get_affinity(&cur));
    bool launcher_bound = topo->this_system && !mt_cpuset_is_subset(&topo->cpus, &cur);
    char cur_s[128], plan_s[128];
    mt_cpuset_format(&cur, cur_s, sizeof(cur_s));
    mt_cpuset_format(&report->plan.cpus, plan_s, sizeof(plan_s));
    if (mode == MT_BIND_NONE) {
        report->action = MT_BIND_LEFT_ALONE;
        fmt_into(report->note, sizeof(report->note), "runtime.bind = none: affinity (%s) and thread counts untouched",
                 cur_s);
    } else if (!topo->this_system) {
        report->action = MT_BIND_NOT_THIS_SYSTEM;
        fmt_into(report->note, sizeof(report->note), "topology %s is not this machine: planned cpus %s not applied",
                 topo->source, plan_s);
    } else if (mode == MT_BIND_AUTO && launcher_bound) {
        report->action = MT_BIND_KEPT_LAUNCHER;
        fmt_into(report->note, sizeof(report->note),
                 "the launcher bound this rank to %s; kept (runtime.bind = force would use %s)", cur_s, plan_s);
    } else {
        hwloc_bitmap_t bm = hwloc_bitmap_alloc();
        for (int c = mt_cpuset_next(&report->plan.cpus, 0); c >= 0; c = mt_cpuset_next(&report->plan.cpus, c + 1)) {
            hwloc_bitmap_set(bm, (unsigned)c);
        }
        int rc = hwloc_set_cpubind((hwloc_topology_t)topo->hw, bm, HWLOC_CPUBIND_PROCESS);
        int e = errno;
        hwloc_bitmap_free(bm);
        if (rc != 0) {
            return mt_error(MT_ERR_SYSTEM,
                            "cannot bind local rank %d to cpus %s: %s (runtime.bind = none skips binding)", lr, plan_s,
                            strerror(e));
        }
        report->action = MT_BIND_APPLIED;
        fmt_into(report->note, sizeof(report->note), "bound to %s%s%s", plan_s,
                 launcher_bound ? " (runtime.bind = force, replacing the launcher's " : "",
                 launcher_bound ? cur_s : "");
        if (launcher_bound) {
            strncat(report->note, ")", sizeof(report->note) - strlen(report->note) - 1);
        }
    }
    MT_CHECK(mt_cpuset_get_affinity(&report->bound));
    const mt_cpuset_t *owned = report->action == MT_BIND_NOT_THIS_SYSTEM ? &report->plan.cpus : &report->bound;
    int numa = mt_topo_numa_of(topo, owned);
    report->numa_os = numa >= 0 ? topo->numa[numa].os_index : -1;

    /* 4. Thread pools sized to the cores owned. */
    if (report->action == MT_BIND_LEFT_ALONE) {
        report->n_threads = omp_get_max_threads();
    } else {
        int n = report->action == MT_BIND_NOT_THIS_SYSTEM ? report->plan.n_cores : cores_in(topo, owned);
        report->n_threads = n > 0 ? n : 1;
        omp_set_num_threads(report->n_threads);
        openblas_set_num_threads(report->n_threads);
    }

    /* 5. Oversubscription: said once per node. */
    if (report->oversubscribed && lr == 0) {
        static _Atomic int warned;
        if (!atomic_exchange(&warned, 1)) {
            MT_WARN("%d local ranks on %d cores%s: ranks share cores, expect them to slow each other down", ls,
                    topo->n_cores, dev.kind == MT_DEVKIND_GPU ? " near their GPUs" : "");
        }
    }

    /* 6. NIC. */
    report->nic = report->plan.nic;
    if (report->nic >= 0) {
        const mt_topo_nic_t *nic = &topo->nics[report->nic];
        snprintf(report->nic_name, sizeof(report->nic_name), "%s", nic->name);
        if (nic_auto && dev.kind == MT_DEVKIND_GPU) {
            const char *var = nic->kind == MT_NIC_IB ? "NCCL_IB_HCA" : "NCCL_SOCKET_IFNAME";
            const char *set = getenv(var);
            if (set) {
                MT_INFO(MT_LOG_TOPO, "runtime.nic = auto: %s=%s already set by the user; kept (nearest is %s)", var,
                        set, nic->name);
            } else {
                char val[40];
                snprintf(val, sizeof(val), "=%s", nic->name); /* '=': exactly this device, not a prefix */
                setenv(var, val, 1);
                snprintf(report->nic_export, sizeof(report->nic_export), "%s=%s", var, val);
            }
        }
    }
    char bound_s[128];
    mt_cpuset_format(&report->bound, bound_s, sizeof(bound_s));
    MT_INFO(MT_LOG_TOPO, "local rank %d/%d: device %s (%s), binding %s: %s, affinity %s, %d threads, nic %s%s%s", lr,
            ls, report->device_str, dev.why, mt_topo_bind_action_str(report->action), report->note, bound_s,
            report->n_threads, report->nic_name[0] ? report->nic_name : "none",
            report->nic_export[0] ? ", exported " : "", report->nic_export);
    return MT_OK;
}
