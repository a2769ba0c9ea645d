/* Placement as pure functions: which cores each local rank of a node gets (near its GPU, disjoint,
 * even), and which mesh order keeps tensor-parallel groups inside a node and NUMA domain. Pure so that
 * a cluster's placement can be planned and tested from an XML topology anywhere.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "mesh.h"
#include "topo.h"

/* ---- node plan -------------------------------------------------------------------------------- */

/* The cores a rank should sit near: its GPU's NUMA node, else the CPUs of the GPU's nearest non-I/O
 * ancestor, else everything. */
static void domain_of_gpu(const mt_topo_t *topo, int gpu, mt_cpuset_t *dom) {
    const mt_topo_pci_t *g = &topo->gpus[gpu];
    *dom = g->numa >= 0 ? topo->numa[g->numa].cpus : g->cpus;
    for (size_t w = 0; w < MT_ARRAY_LEN(dom->w); w++) {
        dom->w[w] &= topo->cpus.w[w];
    }
    if (mt_cpuset_count(dom) == 0) {
        *dom = topo->cpus;
    }
}

typedef struct {
    mt_cpuset_t cpus;
    int n_ranks;
    int *ranks; /* local ranks, ascending */
} domain_t;

/* Gives the k ranks of a domain its free cores: an even contiguous split when there are at least k,
 * else round-robin over the domain's cores (shared). taken marks cores already handed out. */
static bool split_domain(const mt_topo_t *topo, const domain_t *d, bool *taken, mt_topo_place_t *places) {
    int *cores = malloc(sizeof(int) * (size_t)(topo->n_cores ? topo->n_cores : 1));
    int n = 0;
    for (int c = 0; c < topo->n_cores; c++) {
        if (!taken[c] && mt_cpuset_is_subset(&topo->cores[c].pus, &d->cpus)) {
            cores[n++] = c;
        }
    }
    bool shared = false;
    if (n == 0) { /* everything near it is taken (or it holds no whole core): share those cores */
        for (int c = 0; c < topo->n_cores; c++) {
            if (mt_cpuset_is_subset(&topo->cores[c].pus, &d->cpus)) {
                cores[n++] = c;
            }
        }
        shared = true;
    }
    if (n == 0) { /* a domain without any core of ours: use them all */
        for (int c = 0; c < topo->n_cores; c++) {
            cores[n++] = c;
        }
        shared = true;
    }
    int k = d->n_ranks;
    if (n < k) {
        shared = true;
    }
    int start = 0;
    for (int j = 0; j < k; j++) {
        mt_topo_place_t *p = &places[d->ranks[j]];
        mt_cpuset_zero(&p->cpus);
        int cnt = n >= k ? n / k + (j < n % k) : 1;
        for (int i = 0; i < cnt; i++) {
            int c = n >= k ? cores[start + i] : cores[j % n];
            mt_cpuset_or(&p->cpus, &topo->cores[c].pus);
            taken[c] = true;
        }
        start += cnt;
        p->n_cores = cnt;
        p->shared = shared;
    }
    free(cores);
    return shared;
}

bool mt_topo_plan_node(const mt_topo_t *topo, int local_size, const int *gpu_of_local, mt_topo_place_t *places) {
    MT_ASSERT(local_size >= 1);
    memset(places, 0, sizeof(*places) * (size_t)local_size);
    /* At most one domain per rank plus the CPU ranks' domain. */
    domain_t *doms = calloc((size_t)local_size + 1, sizeof(*doms));
    int *rank_lists = malloc(sizeof(int) * (size_t)local_size * ((size_t)local_size + 1));
    MT_ASSERT(doms && rank_lists);
    for (int d = 0; d <= local_size; d++) {
        doms[d].ranks = rank_lists + (size_t)d * (size_t)local_size;
    }
    int n_doms = 0;
    mt_cpuset_t gpu_cpus;
    mt_cpuset_zero(&gpu_cpus);
    bool any_cpu_rank = false;
    /* GPU ranks: one domain per distinct CPU set near their GPUs, ranks in ascending order. */
    for (int r = 0; r < local_size; r++) {
        int g = gpu_of_local ? gpu_of_local[r] : -1;
        if (g < 0 || g >= topo->n_gpus) {
            any_cpu_rank = true;
            continue;
        }
        mt_cpuset_t dom;
        domain_of_gpu(topo, g, &dom);
        int d = 0;
        while (d < n_doms && !mt_cpuset_equal(&doms[d].cpus, &dom)) {
            d++;
        }
        if (d == n_doms) {
            doms[n_doms++].cpus = dom;
        }
        doms[d].ranks[doms[d].n_ranks++] = r;
        mt_cpuset_or(&gpu_cpus, &dom);
    }
    /* CPU ranks: the cores no GPU rank sits near, or all of them. */
    if (any_cpu_rank) {
        domain_t *cd = &doms[n_doms];
        mt_cpuset_zero(&cd->cpus);
        for (size_t w = 0; w < MT_ARRAY_LEN(cd->cpus.w); w++) {
            cd->cpus.w[w] = topo->cpus.w[w] & ~gpu_cpus.w[w];
        }
        if (mt_cpuset_count(&cd->cpus) == 0) {
            cd->cpus = topo->cpus;
        }
        for (int r = 0; r < local_size; r++) {
            int g = gpu_of_local ? gpu_of_local[r] : -1;
            if (g < 0 || g >= topo->n_gpus) {
                cd->ranks[cd->n_ranks++] = r;
            }
        }
    }
    int n_all = n_doms + (any_cpu_rank ? 1 : 0);
    /* Narrow domains first, so a domain nested in a wider one (a GPU without NUMA locality) does not
     * lose its cores to it. */
    int *by_size = malloc(sizeof(int) * (size_t)(n_all ? n_all : 1));
    for (int d = 0; d < n_all; d++) {
        by_size[d] = d;
    }
    for (int i = 1; i < n_all; i++) {
        for (int j = i; j > 0 && mt_cpuset_count(&doms[by_size[j]].cpus) < mt_cpuset_count(&doms[by_size[j - 1]].cpus);
             j--) {
            int t = by_size[j];
            by_size[j] = by_size[j - 1];
            by_size[j - 1] = t;
        }
    }
    bool *taken = calloc((size_t)(topo->n_cores ? topo->n_cores : 1), sizeof(bool));
    bool shared = false;
    for (int i = 0; i < n_all; i++) {
        shared |= split_domain(topo, &doms[by_size[i]], taken, places);
    }
    for (int r = 0; r < local_size; r++) {
        mt_topo_place_t *p = &places[r];
        int g = gpu_of_local ? gpu_of_local[r] : -1;
        p->numa = mt_topo_numa_of(topo, &p->cpus);
        p->nic = (g >= 0 && g < topo->n_gpus) ? mt_topo_nearest_nic(topo, &topo->gpus[g], NULL)
                                              : mt_topo_nearest_nic(topo, NULL, &p->cpus);
    }
    free(taken);
    free(by_size);
    free(rank_lists);
    free(doms);
    return shared;
}

/* ---- auto mesh order ---------------------------------------------------------------------------- */

static int cmp_int64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

void mt_topo_switch_ids(const mt_topo_t *topo, int n, const int *gpu_of_local, int *out) {
    uint64_t seen[MT_TOPO_MAX_GPUS];
    int n_seen = 0;
    for (int i = 0; i < n; i++) {
        int g = gpu_of_local ? gpu_of_local[i] : -1;
        out[i] = 0;
        if (g < 0 || g >= topo->n_gpus) {
            continue;
        }
        const mt_topo_pci_t *p = &topo->gpus[g];
        uint64_t key = p->n_bridges > 0 ? p->bridges[p->n_bridges - 1] : p->host_bridge;
        int k = 0;
        while (k < n_seen && seen[k] != key) {
            k++;
        }
        if (k == n_seen && n_seen < MT_TOPO_MAX_GPUS) {
            seen[n_seen++] = key;
        }
        out[i] = k + 1;
    }
}

/* Distinct values among k (node, id) keys. */
static int distinct(int64_t *keys, int k) {
    qsort(keys, (size_t)k, sizeof(int64_t), cmp_int64);
    int n = k > 0;
    for (int i = 1; i < k; i++) {
        n += keys[i] != keys[i - 1];
    }
    return n;
}

void mt_topo_mesh_crossings(const mt_topo_node_shape_t *shape, int world, int ranks_per_node, int tp, int pp, int dp,
                            const char *order, unsigned axes_mask, int64_t *node_crossings, int64_t *domain_crossings,
                            int64_t *switch_crossings) {
    *node_crossings = 0;
    *domain_crossings = 0;
    if (switch_crossings) {
        *switch_crossings = 0;
    }
    mt_mesh_t *m = NULL;
    if (mt_mesh_create(world, tp, pp, dp, order, &m) != MT_OK) {
        return;
    }
    int gsize = mt_mesh_group_size(m, axes_mask);
    int *members = malloc(sizeof(int) * (size_t)gsize);
    int64_t *doms = malloc(sizeof(int64_t) * (size_t)gsize);
    int64_t *sws = malloc(sizeof(int64_t) * (size_t)gsize);
    MT_ASSERT(members && doms && sws);
    for (int r = 0; r < world; r++) {
        int c[MT_AXIS_N], lead = 1;
        mt_mesh_coords(m, r, c);
        for (int a = 0; a < MT_AXIS_N; a++) {
            if ((axes_mask & MT_AXIS_BIT(a)) && c[a] != 0) {
                lead = 0;
            }
        }
        if (!lead) {
            continue; /* each group is counted once, at its member with zero coordinates */
        }
        int k = mt_mesh_group(m, r, axes_mask, members, NULL);
        int nodes = 1;
        for (int i = 0; i < k; i++) {
            int node = members[i] / ranks_per_node, local = members[i] % ranks_per_node;
            if (i > 0 && node != members[i - 1] / ranks_per_node) {
                nodes++; /* members ascend, so nodes do too */
            }
            int dom = shape && shape->domain_of_local ? shape->domain_of_local[local] : 0;
            int sw = shape && shape->switch_of_local ? shape->switch_of_local[local] : 0;
            doms[i] = ((int64_t)node << 32) | (uint32_t)dom;
            sws[i] = ((int64_t)node << 32) | (uint32_t)sw;
        }
        *node_crossings += nodes - 1;
        *domain_crossings += distinct(doms, k) - 1;
        if (switch_crossings) {
            *switch_crossings += distinct(sws, k) - 1;
        }
    }
    free(members);
    free(doms);
    free(sws);
    mt_mesh_free(m);
}

/* Preference among equally good orders: the default first, then tp fastest, then pp slowest. */
static const char *const orders_pref[6] = {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "pp-tp-dp", "dp-pp-tp", "pp-dp-tp"};

mt_status_t mt_topo_auto_order(const mt_topo_node_shape_t *shape, int world, int ranks_per_node, int tp, int pp, int dp,
                               char order[16], char *why, size_t why_len, char *warn, size_t warn_len) {
    if (warn && warn_len) {
        warn[0] = '\0';
    }
    if (ranks_per_node < 1) {
        return mt_error(MT_ERR_INVALID_ARG, "auto order: ranks per node %d must be at least 1", ranks_per_node);
    }
    mt_mesh_t *probe = NULL;
    MT_CHECK(mt_mesh_create(world, tp, pp, dp, "tp-dp-pp", &probe));
    dp = mt_mesh_axis_size(probe, MT_AXIS_DP);
    mt_mesh_free(probe);
    int64_t best[4] = {0, 0, 0, 0};
    int best_i = -1;
    for (int i = 0; i < 6; i++) {
        int64_t s[4], unused, unused2;
        mt_topo_mesh_crossings(shape, world, ranks_per_node, tp, pp, dp, orders_pref[i], MT_AXIS_BIT(MT_AXIS_TP), &s[0],
                               &s[1], &s[2]);
        mt_topo_mesh_crossings(shape, world, ranks_per_node, tp, pp, dp, orders_pref[i], MT_AXIS_BIT(MT_AXIS_DP), &s[3],
                               &unused, &unused2);
        int better = best_i < 0;
        for (int j = 0; j < 4 && !better; j++) {
            if (s[j] != best[j]) {
                better = s[j] < best[j];
                break;
            }
        }
        if (better) {
            best_i = i;
            memcpy(best, s, sizeof(best));
        }
    }
    snprintf(order, 16, "%s", orders_pref[best_i]);
    int devices = shape && shape->n_devices > 0 ? shape->n_devices : ranks_per_node;
    if (why && why_len) {
        snprintf(why, why_len,
                 "order=auto chose %s for tp=%d dp=%d pp=%d on %d ranks per node: tp groups cross nodes %lld times, "
                 "NUMA domains %lld times and PCIe switches %lld times; dp groups cross nodes %lld times",
                 order, tp, dp, pp, ranks_per_node, (long long)best[0], (long long)best[1], (long long)best[2],
                 (long long)best[3]);
    }
    if (tp > devices && warn && warn_len) {
        snprintf(warn, warn_len,
                 "tp=%d exceeds the %d devices of a node: every tensor-parallel group crosses nodes, where its "
                 "all-reduces run at network speed; choose tp <= %d",
                 tp, devices, devices);
    }
    return MT_OK;
}
