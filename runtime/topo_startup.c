/* Topology at job start-up, in the two calls the trainer and `meshtrain topo` share: load + bind from
 * the config with one verdict for the whole job, and the resolution of parallel.order = "auto" on rank
 * 0 from the placement of its node, broadcast so every rank builds the same mesh.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "rt.h"
#include "topo.h"

/* Every rank passes its status; all return the worst, so no rank carries on alone. */
static mt_status_t agree(MPI_Comm comm, mt_status_t st) {
    int mine = (int)st, worst = 0;
    if (MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS) {
        return mt_error(MT_ERR_MPI, "topology: agreeing on the start-up verdict failed");
    }
    if (worst != MT_OK && st == MT_OK) {
        mt_error((mt_status_t)worst, "topology start-up failed on another rank (see its message)");
    }
    return (mt_status_t)worst;
}

mt_status_t mt_topo_startup(const mt_config_t *cfg, mt_topo_t **topo, mt_topo_report_t *report) {
    const mt_world_t *w = mt_rt_world();
    *topo = NULL;
    mt_bind_mode_t mode = MT_BIND_AUTO;
    mt_status_t st = mt_topo_bind_mode_parse(mt_config_str(cfg, "runtime.bind"), &mode);
    if (st == MT_OK) {
        st = mt_topo_load(NULL, topo);
    }
    if ((st = agree(w->comm, st)) != MT_OK) {
        mt_topo_free(*topo);
        *topo = NULL;
        return st;
    }
    bool nic_auto = !strcmp(mt_config_str(cfg, "runtime.nic"), "auto");
    bool use_gpus = strcmp(mt_config_str(cfg, "runtime.device"), "cpu") != 0;
    st = mt_topo_bind(*topo, w->local_comm, mode, nic_auto, use_gpus, report);
    if ((st = agree(w->comm, st)) != MT_OK) {
        mt_topo_free(*topo);
        *topo = NULL;
    }
    return st;
}

mt_status_t mt_topo_resolve_order(const mt_topo_t *topo, const mt_topo_report_t *report, const char *order, int tp,
                                  int pp, int dp, bool use_gpus, char out[16], char *why, size_t why_len, char *warn,
                                  size_t warn_len) {
    const mt_world_t *w = mt_rt_world();
    if (why && why_len) {
        why[0] = '\0';
    }
    if (warn && warn_len) {
        warn[0] = '\0';
    }
    if (strcmp(order, "auto") != 0) {
        snprintf(out, 16, "%s", order);
        return MT_OK;
    }
    int ls = w->local_size;
    int mine[2] = {report->plan.numa, report->device.gpu};
    int *both = malloc(sizeof(int) * 2 * (size_t)ls), *dom = malloc(sizeof(int) * (size_t)ls);
    int *gpu = malloc(sizeof(int) * (size_t)ls), *sw = malloc(sizeof(int) * (size_t)ls);
    if (!both || !dom || !gpu || !sw) {
        free(both);
        free(dom);
        free(gpu);
        free(sw);
        return mt_error(MT_ERR_OOM, "out of memory");
    }
    if (MPI_Allgather(mine, 2, MPI_INT, both, 2, MPI_INT, w->local_comm) != MPI_SUCCESS) {
        free(both);
        free(dom);
        free(gpu);
        free(sw);
        return mt_error(MT_ERR_MPI, "topology: gathering the local ranks' placement failed");
    }
    for (int i = 0; i < ls; i++) {
        dom[i] = both[2 * i];
        gpu[i] = both[2 * i + 1];
    }
    free(both);
    mt_topo_switch_ids(topo, ls, gpu, sw);
    free(gpu);
    int sizes[2] = {ls, -ls}, ext[2] = {0, 0};
    int blocked = w->rank == w->node_id * ls + w->local_rank, all_blocked = 0;
    MPI_Allreduce(sizes, ext, 2, MPI_INT, MPI_MIN, w->comm);
    MPI_Allreduce(&blocked, &all_blocked, 1, MPI_INT, MPI_LAND, w->comm);
    mt_status_t st = MT_OK;
    char chosen[16] = "";
    if (w->rank == 0) {
        for (int i = 0; i < ls; i++) {
            dom[i] = dom[i] >= 0 ? dom[i] : topo->n_numa; /* a rank spanning NUMA nodes: a domain of its own */
        }
        mt_topo_node_shape_t shape = {
            .n_devices = use_gpus ? topo->n_gpus : 0, .domain_of_local = dom, .switch_of_local = sw};
        char wbuf[512] = "";
        st = mt_topo_auto_order(&shape, w->size, ls, tp, pp, dp, chosen, why, why_len, wbuf, sizeof(wbuf));
        if (st == MT_OK && (ext[0] != -ext[1] || !all_blocked)) {
            size_t used = strlen(wbuf);
            snprintf(wbuf + used, sizeof(wbuf) - used,
                     "%sranks are not placed on nodes in equal consecutive blocks (%d to %d per node), which order = "
                     "auto assumes: launch with --map-by slot (Open MPI) or --distribution=block (Slurm)",
                     used ? "; " : "", ext[0], -ext[1]);
        }
        if (wbuf[0]) {
            MT_WARN("parallel.order = auto: %s", wbuf);
        }
        if (warn && warn_len) {
            snprintf(warn, warn_len, "%s", wbuf);
        }
        MT_INFO(MT_LOG_TOPO, "%s", why ? why : chosen);
    }
    free(dom);
    free(sw);
    MPI_Bcast(chosen, sizeof(chosen), MPI_CHAR, 0, w->comm);
    if ((st = agree(w->comm, st)) != MT_OK) {
        return st;
    }
    snprintf(out, 16, "%s", chosen);
    return MT_OK;
}
