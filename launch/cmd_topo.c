/* `meshtrain topo`: shows where every rank runs. Under mpirun/srun each rank binds itself as training
 * would (mt_topo_bind) and reports host, mesh coordinates, cores, NUMA node, device and NIC to rank 0,
 * which prints one line per rank, a summary per node and every group of the mesh. With --dry-run it
 * plans a hypothetical world of N ranks on nodes like this one (or like --topo-file) without launching.
 * SPDX-License-Identifier: MIT */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "parallel/settings.h"
#include "runtime/config.h"
#include "runtime/mesh.h"
#include "runtime/rt.h"
#include "runtime/topo.h"

/* One rank's line of the report; gathered to rank 0 as bytes. */
typedef struct {
    int rank, node, local_rank, local_size;
    int coords[MT_AXIS_N];
    int numa_os, n_threads, oversubscribed;
    char host[64];
    mt_cpuset_t cpus; /* bound (what the kernel says) or, in a dry run, planned */
    char device[64];
    char device_why[200];
    char nic[32];
    char nic_export[96];
    char binding[16];
    char note[256];
} rank_rec_t;

typedef struct {
    bool dry_run, json;
    int world, ranks_per_node;
    const char *topo_file;
} topo_opts_t;

static void usage(FILE *out) {
    fprintf(out,
            "usage: mpirun -np N meshtrain topo [CONFIG.toml] [--section.key=value ...] [--topo-file X.xml] [--json]\n"
            "       meshtrain topo --dry-run --world N [--ranks-per-node R] [--topo-file X.xml] [--json]\n"
            "                      [--parallel.tp=T --parallel.pp=P --parallel.order=ORDER|auto]\n\n"
            "Shows where every rank runs: host, rank, local rank, mesh coordinates (tp, dp, pp), the cores it is\n"
            "bound to, its NUMA node, its device (GPU index and PCI bus id, or cpu:<cores>) and the nearest NIC,\n"
            "then a summary per node and every group of every mesh axis. Under a launcher each rank binds itself\n"
            "as training does (runtime.bind = auto|force|none; runtime.nic = auto exports the NIC for NCCL).\n\n"
            "  --dry-run           plan a hypothetical world instead of the running one; nothing is launched\n"
            "  --world N           ranks of the hypothetical world (with --dry-run)\n"
            "  --ranks-per-node R  ranks per node (with --dry-run; default: the node's GPUs, else its NUMA nodes)\n"
            "  --topo-file X.xml   node topology from an hwloc XML (lstopo X.xml) instead of this machine\n"
            "  --json              machine-readable output\n");
}

static int parse_opts(int argc, char **argv, topo_opts_t *o, bool *help) {
    static const struct option longopts[] = {{"dry-run", no_argument, NULL, 'd'},
                                             {"world", required_argument, NULL, 'w'},
                                             {"ranks-per-node", required_argument, NULL, 'r'},
                                             {"topo-file", required_argument, NULL, 't'},
                                             {"json", no_argument, NULL, 'j'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    memset(o, 0, sizeof(*o));
    *help = false;
    optind = 0; /* GNU: full re-initialisation */
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'd':
            o->dry_run = true;
            break;
        case 'j':
            o->json = true;
            break;
        case 'h':
            *help = true;
            break;
        case 't':
            o->topo_file = optarg;
            break;
        case 'w':
        case 'r': {
            long v = strtol(optarg, &end, 10);
            if (!*optarg || *end || v < 1 || v > (1 << 24)) {
                return mt_error(MT_ERR_INVALID_ARG, "--%s %s: expected a positive integer",
                                c == 'w' ? "world" : "ranks-per-node", optarg);
            }
            *(c == 'w' ? &o->world : &o->ranks_per_node) = (int)v;
            break;
        }
        default:
            return mt_error(MT_ERR_INVALID_ARG, "unknown or incomplete option '%s' (see meshtrain topo --help)",
                            argv[optind - 1]);
        }
    }
    if (optind < argc) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "unexpected argument '%s' (config files end in .toml; keys are --section.key=value)",
                        argv[optind]);
    }
    if (o->dry_run && o->world < 1) {
        return mt_error(MT_ERR_INVALID_ARG, "--dry-run needs --world N, the number of ranks to lay out");
    }
    if (!o->dry_run && (o->world || o->ranks_per_node)) {
        return mt_error(MT_ERR_INVALID_ARG, "--world and --ranks-per-node describe a hypothetical job: add --dry-run");
    }
    return MT_OK;
}

/* ---- output ------------------------------------------------------------------------------------ */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') {
            fprintf(f, "\\%c", *s);
        } else if ((unsigned char)*s < 0x20) {
            fprintf(f, "\\u%04x", *s);
        } else {
            fputc(*s, f);
        }
    }
    fputc('"', f);
}

static void json_cpus(FILE *f, const mt_cpuset_t *s) {
    fputc('[', f);
    for (int c = mt_cpuset_next(s, 0), first = 1; c >= 0; c = mt_cpuset_next(s, c + 1), first = 0) {
        fprintf(f, "%s%d", first ? "" : ",", c);
    }
    fputc(']', f);
}

/* Every group along mask, each once (at its member with zero coordinates on the masked axes). */
static void print_groups(FILE *f, const mt_mesh_t *m, unsigned mask, const char *name, bool json) {
    int world = mt_mesh_world(m), gs = mt_mesh_group_size(m, mask);
    int *g = malloc(sizeof(int) * (size_t)gs);
    if (json) {
        fprintf(f, "    \"%s\": [", name);
    } else {
        fprintf(f, "  %-10s %d groups of %d:", name, world / gs, gs);
    }
    int n = 0;
    for (int r = 0; r < world; r++) {
        int c[MT_AXIS_N], lead = 1;
        mt_mesh_coords(m, r, c);
        for (int a = 0; a < MT_AXIS_N; a++) {
            lead &= !(mask & MT_AXIS_BIT(a)) || c[a] == 0;
        }
        if (!lead) {
            continue;
        }
        int k = mt_mesh_group(m, r, mask, g, NULL);
        fprintf(f, json ? "%s[" : "%s[", json ? (n ? "," : "") : " ");
        for (int i = 0; i < k; i++) {
            fprintf(f, "%s%d", i ? "," : "", g[i]);
        }
        fputc(']', f);
        n++;
    }
    fprintf(f, json ? "]" : "\n");
    free(g);
}

static void print_embedding(FILE *f, const mt_mesh_t *m, bool json) {
    int world = mt_mesh_world(m), n = 0;
    fprintf(f, json ? "    \"embedding\": [" : "  %-10s first and last pipeline stage:", "embedding");
    for (int r = 0; r < world; r++) {
        int c[MT_AXIS_N], e[2];
        mt_mesh_coords(m, r, c);
        if (c[MT_AXIS_PP] != 0) {
            continue;
        }
        int k = mt_mesh_embedding_group(m, r, e);
        if (k == 1) {
            fprintf(f, "%s[%d]", json ? (n ? "," : "") : " ", e[0]);
        } else {
            fprintf(f, "%s[%d,%d]", json ? (n ? "," : "") : " ", e[0], e[1]);
        }
        n++;
    }
    fprintf(f, json ? "]" : "\n");
}

static void print_report(FILE *f, const topo_opts_t *o, const mt_topo_t *topo, const mt_mesh_t *m,
                         const rank_rec_t *recs, int n, int n_nodes, const char *order_why, const char *warn) {
    int tp = mt_mesh_axis_size(m, MT_AXIS_TP), dp = mt_mesh_axis_size(m, MT_AXIS_DP);
    int pp = mt_mesh_axis_size(m, MT_AXIS_PP);
    if (o->json) {
        fprintf(f, "{\n  \"dry_run\": %s,\n  \"world\": %d,\n  \"nodes\": %d,\n", o->dry_run ? "true" : "false", n,
                n_nodes);
        fprintf(f, "  \"mesh\": {\"tp\": %d, \"dp\": %d, \"pp\": %d, \"order\": \"%s\", \"order_reason\": ", tp, dp, pp,
                mt_mesh_order(m));
        json_str(f, order_why);
        fprintf(f, "},\n  \"warnings\": [");
        if (warn[0]) {
            json_str(f, warn);
        }
        fprintf(f, "],\n  \"topology\": {\"source\": ");
        json_str(f, topo->source);
        fprintf(f, ", \"packages\": %d, \"numa_nodes\": %d, \"cores\": %d, \"pus\": %d, \"gpus\": [", topo->n_packages,
                topo->n_numa, topo->n_cores, topo->n_pus);
        for (int i = 0; i < topo->n_gpus; i++) {
            fprintf(f, "%s\"%s\"", i ? "," : "", topo->gpus[i].busid);
        }
        fprintf(f, "], \"nics\": [");
        for (int i = 0; i < topo->n_nics; i++) {
            fprintf(f, "%s\"%s\"", i ? "," : "", topo->nics[i].name);
        }
        fprintf(f, "]},\n  \"groups\": {\n");
        print_groups(f, m, MT_AXIS_BIT(MT_AXIS_TP), "tp", true);
        fprintf(f, ",\n");
        print_groups(f, m, MT_AXIS_BIT(MT_AXIS_DP), "dp", true);
        fprintf(f, ",\n");
        print_groups(f, m, MT_AXIS_BIT(MT_AXIS_PP), "pp", true);
        fprintf(f, ",\n");
        print_embedding(f, m, true);
        fprintf(f, "\n  },\n  \"ranks\": [\n");
        for (int i = 0; i < n; i++) {
            const rank_rec_t *r = &recs[i];
            fprintf(f, "    {\"rank\": %d, \"host\": ", r->rank);
            json_str(f, r->host);
            fprintf(f, ", \"node\": %d, \"local_rank\": %d, \"tp\": %d, \"dp\": %d, \"pp\": %d, \"cpus\": ", r->node,
                    r->local_rank, r->coords[MT_AXIS_TP], r->coords[MT_AXIS_DP], r->coords[MT_AXIS_PP]);
            json_cpus(f, &r->cpus);
            fprintf(f, ", \"numa\": %d, \"device\": ", r->numa_os);
            json_str(f, r->device);
            fprintf(f, ", \"device_reason\": ");
            json_str(f, r->device_why);
            fprintf(f, ", \"nic\": ");
            json_str(f, r->nic);
            fprintf(f, ", \"nic_export\": ");
            json_str(f, r->nic_export);
            fprintf(f, ", \"binding\": \"%s\", \"threads\": %d, \"oversubscribed\": %s, \"note\": ", r->binding,
                    r->n_threads, r->oversubscribed ? "true" : "false");
            json_str(f, r->note);
            fprintf(f, "}%s\n", i + 1 < n ? "," : "");
        }
        fprintf(f, "  ],\n  \"node_summary\": [\n");
    } else {
        fprintf(f,
                "meshtrain topo: %d ranks on %d node%s%s; node topology %s: %d packages, %d NUMA nodes, %d cores, %d "
                "PUs, %d GPUs, %d NICs\n",
                n, n_nodes, n_nodes == 1 ? "" : "s", o->dry_run ? " (dry run: planned, nothing launched)" : "",
                topo->source, topo->n_packages, topo->n_numa, topo->n_cores, topo->n_pus, topo->n_gpus, topo->n_nics);
        fprintf(f, "mesh: tp=%d dp=%d pp=%d, order %s%s%s%s\n", tp, dp, pp, mt_mesh_order(m), order_why[0] ? " (" : "",
                order_why, order_why[0] ? ")" : "");
        if (warn[0]) {
            fprintf(f, "warning: %s\n", warn);
        }
        fprintf(f, "groups:\n");
        print_groups(f, m, MT_AXIS_BIT(MT_AXIS_TP), "tp", false);
        print_groups(f, m, MT_AXIS_BIT(MT_AXIS_DP), "dp", false);
        print_groups(f, m, MT_AXIS_BIT(MT_AXIS_PP), "pp", false);
        print_embedding(f, m, false);
        fprintf(f, "ranks:\n  %-12s %5s %5s %3s %3s %3s  %-16s %4s  %-24s %-8s %s\n", "host", "rank", "local", "tp",
                "dp", "pp", "cpus", "numa", "device", "nic", "binding");
        for (int i = 0; i < n; i++) {
            const rank_rec_t *r = &recs[i];
            char cpus[256];
            mt_cpuset_format(&r->cpus, cpus, sizeof(cpus));
            fprintf(f, "  %-12s %5d %5d %3d %3d %3d  %-16s %4d  %-24s %-8s %s%s%s\n", r->host, r->rank, r->local_rank,
                    r->coords[MT_AXIS_TP], r->coords[MT_AXIS_DP], r->coords[MT_AXIS_PP], cpus, r->numa_os, r->device,
                    r->nic[0] ? r->nic : "-", r->binding,
                    r->nic_export[0] ? (o->dry_run ? ", would export " : ", exported ") : "", r->nic_export);
        }
        fprintf(f, "nodes:\n");
    }
    /* Per node: its ranks, devices, cores bound and whether ranks share cores. Ranks of a node are
     * found by node id (they need not be consecutive). */
    for (int node = 0; node < n_nodes; node++) {
        mt_cpuset_t uni;
        mt_cpuset_zero(&uni);
        int count = 0, overlap = 0, over = 0, first = -1;
        char devs[512] = "", nics[256] = "", binds[64] = "";
        for (int i = 0; i < n; i++) {
            const rank_rec_t *r = &recs[i];
            if (r->node != node) {
                continue;
            }
            if (first < 0) {
                first = i;
            }
            count++;
            overlap += mt_cpuset_intersects(&uni, &r->cpus);
            mt_cpuset_or(&uni, &r->cpus);
            over |= r->oversubscribed;
            if (strncmp(r->device, "cpu:", 4) && !strstr(devs, r->device) &&
                strlen(devs) + strlen(r->device) + 2 < sizeof(devs)) {
                snprintf(devs + strlen(devs), sizeof(devs) - strlen(devs), "%s%s", devs[0] ? "," : "", r->device);
            }
            if (r->nic[0] && !strstr(nics, r->nic) && strlen(nics) + strlen(r->nic) + 2 < sizeof(nics)) {
                snprintf(nics + strlen(nics), sizeof(nics) - strlen(nics), "%s%s", nics[0] ? "," : "", r->nic);
            }
            if (!strstr(binds, r->binding) && strlen(binds) + strlen(r->binding) + 2 < sizeof(binds)) {
                snprintf(binds + strlen(binds), sizeof(binds) - strlen(binds), "%s%s", binds[0] ? "," : "", r->binding);
            }
        }
        if (first < 0) {
            continue;
        }
        int n_pus = topo->n_pus; /* of rank 0's node type */
        const char *sharing = over ? "oversubscribed: ranks share cores" : overlap ? "ranks overlap" : "exclusive";
        if (o->json) {
            fprintf(f, "    {\"node\": %d, \"host\": ", node);
            json_str(f, recs[first].host);
            fprintf(f, ", \"ranks\": %d, \"gpus\": \"%s\", \"pus_bound\": %d, \"cpus\": ", count, devs,
                    mt_cpuset_count(&uni));
            json_cpus(f, &uni);
            fprintf(f, ", \"oversubscribed\": %s, \"overlap\": %s, \"nics\": \"%s\", \"binding\": \"%s\"}%s\n",
                    over ? "true" : "false", overlap ? "true" : "false", nics, binds, node + 1 < n_nodes ? "," : "");
        } else {
            char cpus[256];
            mt_cpuset_format(&uni, cpus, sizeof(cpus));
            fprintf(f, "  node %d %s: %d ranks, %s, %d of %d PUs bound (%s), %s, NICs %s, binding %s\n", node,
                    recs[first].host, count, devs[0] ? devs : "CPU only", mt_cpuset_count(&uni), n_pus, cpus, sharing,
                    nics[0] ? nics : "none", binds);
        }
    }
    if (o->json) {
        fprintf(f, "  ]\n}\n");
    }
}

/* ---- the two modes ----------------------------------------------------------------------------- */

typedef struct {
    int tp, pp, dp;
    char order[16];
    bool use_gpus, nic_auto;
    mt_bind_mode_t bind;
} layout_t;

static mt_status_t layout_from_config(const mt_config_t *cfg, layout_t *l) {
    mt_settings_t set;
    MT_CHECK(mt_settings_read(cfg, &set));
    l->tp = set.par.tp;
    l->pp = set.par.pp;
    l->dp = set.par.dp;
    snprintf(l->order, sizeof(l->order), "%s", set.par.order);
    l->use_gpus = strcmp(mt_config_str(cfg, "runtime.device"), "cpu") != 0;
    l->nic_auto = !strcmp(mt_config_str(cfg, "runtime.nic"), "auto");
    return mt_topo_bind_mode_parse(mt_config_str(cfg, "runtime.bind"), &l->bind);
}

/* Resolves "auto" for a hypothetical node of rpn ranks on GPUs gpu_of_local placed on numa_of_local. */
static mt_status_t resolve_order(const mt_topo_t *topo, layout_t *l, int world, int rpn, const int *numa_of_local,
                                 const int *gpu_of_local, char *why, size_t why_len, char *warn, size_t warn_len) {
    why[0] = warn[0] = '\0';
    if (strcmp(l->order, "auto") != 0) {
        return MT_OK;
    }
    int *dom = malloc(sizeof(int) * (size_t)rpn), *sw = malloc(sizeof(int) * (size_t)rpn);
    if (!dom || !sw) {
        free(dom);
        free(sw);
        return mt_error(MT_ERR_OOM, "out of memory");
    }
    for (int i = 0; i < rpn; i++) {
        dom[i] = numa_of_local[i] >= 0 ? numa_of_local[i] : topo->n_numa; /* spanning: a domain of its own */
    }
    mt_topo_switch_ids(topo, rpn, gpu_of_local, sw);
    mt_topo_node_shape_t shape = {
        .n_devices = l->use_gpus ? topo->n_gpus : 0, .domain_of_local = dom, .switch_of_local = sw};
    mt_status_t st =
        mt_topo_auto_order(&shape, world, rpn, l->tp, l->pp, l->dp, l->order, why, why_len, warn, warn_len);
    free(dom);
    free(sw);
    return st;
}

static int run_dry(const topo_opts_t *o, const mt_config_t *cfg, int rank) {
    int rc = 2;
    layout_t l;
    mt_topo_t *topo = NULL;
    mt_mesh_t *m = NULL;
    rank_rec_t *recs = NULL;
    mt_topo_place_t *places = NULL, *last = NULL;
    int *gol = NULL, *numa_of_local = NULL;
    char why[512], warn[512];
    if (layout_from_config(cfg, &l) != MT_OK) {
        goto fail;
    }
    if (mt_topo_load(o->topo_file, &topo) != MT_OK) {
        goto fail;
    }
    int n = o->world;
    int rpn = o->ranks_per_node ? o->ranks_per_node
                                : (l.use_gpus && topo->n_gpus > 0 ? topo->n_gpus : MT_MAX(topo->n_numa, 1));
    rpn = MT_MIN(rpn, n);
    int n_nodes = MT_DIV_UP(n, rpn), last_size = n - (n_nodes - 1) * rpn;
    int visible[MT_TOPO_MAX_GPUS], nv = 0;
    if (l.use_gpus) {
        mt_topo_visible_gpus(topo, NULL, visible, &nv); /* a hypothetical node: all its GPUs */
    }
    gol = malloc(sizeof(int) * (size_t)rpn);
    numa_of_local = malloc(sizeof(int) * (size_t)rpn);
    places = malloc(sizeof(*places) * (size_t)rpn);
    last = malloc(sizeof(*last) * (size_t)rpn);
    recs = calloc((size_t)n, sizeof(*recs));
    if (!gol || !numa_of_local || !places || !last || !recs) {
        mt_error(MT_ERR_OOM, "out of memory for %d ranks", n);
        rc = 1;
        goto fail;
    }
    for (int i = 0; i < rpn; i++) {
        mt_topo_device_t d;
        mt_topo_choose_device(topo, i, visible, nv, NULL, &d);
        gol[i] = d.gpu;
    }
    bool over = mt_topo_plan_node(topo, rpn, gol, places);
    bool over_last = mt_topo_plan_node(topo, last_size, gol, last);
    for (int i = 0; i < rpn; i++) {
        numa_of_local[i] = places[i].numa;
    }
    if (resolve_order(topo, &l, n, rpn, numa_of_local, gol, why, sizeof(why), warn, sizeof(warn)) != MT_OK) {
        goto fail;
    }
    if (mt_mesh_create(n, l.tp, l.pp, l.dp, l.order, &m) != MT_OK) {
        goto fail;
    }
    if (!warn[0] && l.tp > (nv > 0 ? nv : rpn)) {
        snprintf(warn, sizeof(warn), "tp=%d exceeds the %d devices of a node: tensor-parallel groups cross nodes", l.tp,
                 nv > 0 ? nv : rpn);
    }
    for (int r = 0; r < n; r++) {
        rank_rec_t *rec = &recs[r];
        int node = r / rpn, lr = r % rpn;
        bool is_last = node == n_nodes - 1 && last_size != rpn;
        const mt_topo_place_t *p = is_last ? &last[lr] : &places[lr];
        rec->rank = r;
        rec->node = node;
        rec->local_rank = lr;
        rec->local_size = is_last ? last_size : rpn;
        mt_mesh_coords(m, r, rec->coords);
        snprintf(rec->host, sizeof(rec->host), "node%d", node);
        rec->cpus = p->cpus;
        rec->numa_os = p->numa >= 0 ? topo->numa[p->numa].os_index : -1;
        rec->n_threads = p->n_cores;
        rec->oversubscribed = is_last ? over_last : over;
        mt_topo_device_t d;
        mt_topo_choose_device(topo, lr, visible, nv, NULL, &d);
        if (d.kind == MT_DEVKIND_GPU) {
            snprintf(rec->device, sizeof(rec->device), "gpu:%d (%s)", d.cuda_ordinal, topo->gpus[d.gpu].busid);
        } else {
            char c[48];
            mt_cpuset_format(&p->cpus, c, sizeof(c));
            snprintf(rec->device, sizeof(rec->device), "cpu:%s", c);
        }
        snprintf(rec->device_why, sizeof(rec->device_why), "%s", d.why);
        snprintf(rec->nic, sizeof(rec->nic), "%s", p->nic >= 0 ? topo->nics[p->nic].name : "");
        if (l.nic_auto && p->nic >= 0 && d.kind == MT_DEVKIND_GPU) {
            snprintf(rec->nic_export, sizeof(rec->nic_export), "%s==%s",
                     topo->nics[p->nic].kind == MT_NIC_IB ? "NCCL_IB_HCA" : "NCCL_SOCKET_IFNAME",
                     topo->nics[p->nic].name);
        }
        snprintf(rec->binding, sizeof(rec->binding), "%s", l.bind == MT_BIND_NONE ? "none" : "planned");
    }
    if (rank == 0) {
        print_report(stdout, o, topo, m, recs, n, n_nodes, why, warn);
        if (over && !o->json) {
            printf("note: %d ranks per node on %d cores: ranks share cores\n", rpn, topo->n_cores);
        }
    }
    rc = 0;
fail:
    if (rc != 0 && rank == 0) {
        fprintf(stderr, "meshtrain topo: %s\n", mt_last_error_msg());
    }
    free(gol);
    free(numa_of_local);
    free(places);
    free(last);
    free(recs);
    mt_mesh_free(m);
    mt_topo_free(topo);
    return rc;
}

/* Every rank passes its status; all return the worst, so no rank carries on alone. */
static mt_status_t agree(MPI_Comm comm, mt_status_t st) {
    int mine = (int)st, worst = 0;
    MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, comm);
    return (mt_status_t)worst;
}

static int run_live(const topo_opts_t *o, const mt_config_t *cfg) {
    const mt_world_t *w = mt_rt_world();
    layout_t l;
    mt_topo_t *topo = NULL;
    mt_mesh_t *m = NULL;
    mt_topo_report_t rep;
    rank_rec_t rec, *recs = NULL;
    char why[512] = "", warn[512] = "", err[512] = "";
    int rc = 1;
    mt_status_t st = layout_from_config(cfg, &l);
    if (st == MT_OK && !o->topo_file) {
        st = mt_topo_startup(cfg, &topo, &rep); /* what training does */
    } else if (st == MT_OK) {
        /* Another machine's topology: planned on this one, not applied. */
        st = agree(w->comm, mt_topo_load(o->topo_file, &topo));
        if (st == MT_OK) {
            st = agree(w->comm, mt_topo_bind(topo, w->local_comm, l.bind, l.nic_auto, l.use_gpus, &rep));
        }
    }
    if (st != MT_OK) {
        snprintf(err, sizeof(err), "%s", mt_last_error_msg());
        rc = st == MT_ERR_IO || st == MT_ERR_INVALID_ARG ? 2 : 1;
        goto out;
    }
    char order[16];
    st = mt_topo_resolve_order(topo, &rep, l.order, l.tp, l.pp, l.dp, l.use_gpus, order, why, sizeof(why), warn,
                               sizeof(warn));
    if (st == MT_OK) {
        st = mt_mesh_create(w->size, l.tp, l.pp, l.dp, order, &m);
    }
    if ((st = agree(w->comm, st)) != MT_OK) {
        snprintf(err, sizeof(err), "%s", mt_last_error_msg());
        rc = 2;
        goto out;
    }
    memset(&rec, 0, sizeof(rec));
    rec.rank = w->rank;
    rec.node = w->node_id;
    rec.local_rank = w->local_rank;
    rec.local_size = w->local_size;
    mt_mesh_coords(m, w->rank, rec.coords);
    snprintf(rec.host, sizeof(rec.host), "%s", w->hostname);
    rec.cpus = rep.action == MT_BIND_NOT_THIS_SYSTEM ? rep.plan.cpus : rep.bound;
    rec.numa_os = rep.numa_os;
    rec.n_threads = rep.n_threads;
    rec.oversubscribed = rep.oversubscribed;
    snprintf(rec.device, sizeof(rec.device), "%s", rep.device_str);
    snprintf(rec.device_why, sizeof(rec.device_why), "%s", rep.device.why);
    snprintf(rec.nic, sizeof(rec.nic), "%s", rep.nic_name);
    snprintf(rec.nic_export, sizeof(rec.nic_export), "%s", rep.nic_export);
    snprintf(rec.binding, sizeof(rec.binding), "%s", mt_topo_bind_action_str(rep.action));
    snprintf(rec.note, sizeof(rec.note), "%s", rep.note);
    if (w->rank == 0) {
        recs = malloc(sizeof(*recs) * (size_t)w->size);
    }
    MPI_Gather(&rec, (int)sizeof(rec), MPI_BYTE, recs, (int)sizeof(rec), MPI_BYTE, 0, w->comm);
    if (w->rank == 0) {
        print_report(stdout, o, topo, m, recs, w->size, w->n_nodes, why, warn);
        fflush(stdout);
    }
    rc = 0;
out:
    if (rc != 0 && w->rank == 0) {
        fprintf(stderr, "meshtrain topo: %s\n", err[0] ? err : "failed (see the messages above)");
    }
    free(recs);
    mt_mesh_free(m);
    mt_topo_free(topo);
    return rc;
}

int mt_cmd_topo(int argc, char **argv) {
    const mt_world_t *w = mt_rt_world();
    mt_config_cli_t cli;
    topo_opts_t o;
    bool help = false;
    if (mt_config_split_args(argc, argv, &cli) != MT_OK) {
        if (w->rank == 0) {
            fprintf(stderr, "meshtrain topo: %s\n", mt_last_error_msg());
        }
        return 2;
    }
    if (parse_opts(cli.rest_argc, cli.rest_argv, &o, &help) != MT_OK || help) {
        if (w->rank == 0) {
            if (help) {
                usage(stdout);
            } else {
                fprintf(stderr, "meshtrain topo: %s\n", mt_last_error_msg());
            }
        }
        mt_config_cli_free(&cli);
        return help ? 0 : 2;
    }
    mt_config_t *cfg = NULL;
    mt_status_t st;
    if (o.dry_run) {
        /* A hypothetical world: every rank validates against N locally; rank 0 speaks. */
        st = mt_config_load(cli.path, cli.n_overrides, cli.overrides, o.world, &cfg, w->rank == 0 ? stderr : NULL);
        if (st != MT_OK && w->rank == 0) {
            fprintf(stderr, "meshtrain topo: the configuration has errors (above) for a world of %d ranks\n", o.world);
        }
    } else {
        st = mt_config_load_world(w->comm, cli.path, cli.n_overrides, cli.overrides, &cfg);
    }
    mt_config_cli_free(&cli);
    if (st != MT_OK) {
        return 2;
    }
    int rc = o.dry_run ? run_dry(&o, cfg, w->rank) : run_live(&o, cfg);
    mt_config_free(cfg);
    return rc;
}
