/* Topology discovery and placement on the XML nodes under tests/data/ (2 sockets + 8 GPUs + 2 HCAs,
 * 1 socket + 4 GPUs, CPU-only 2 NUMA) and synthetic ones: what hwloc finds, the nearest NIC against a
 * brute-force search, device choice under CUDA_VISIBLE_DEVICES, per-node binding plans (disjoint,
 * inside the GPU's NUMA node, covering the cores), dump/reload, and order = auto.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/mesh.h"
#include "runtime/topo.h"
#include "testutil.h"

#define DATA MT_SOURCE_DIR "/tests/data/"

static mt_topo_t *load(const char *src) {
    mt_topo_t *t = NULL;
    CHECK_OK(mt_topo_load(src, &t));
    return t;
}

static int nic_named(const mt_topo_t *t, const char *name) {
    for (int i = 0; i < t->n_nics; i++) {
        if (!strcmp(t->nics[i].name, name)) {
            return i;
        }
    }
    return -1;
}

/* Plan properties every plan must have: each rank has cores; without sharing the sets are disjoint and
 * (when every core is wanted) cover the node; a GPU rank sits inside its GPU's NUMA node. */
static void check_plan(const mt_topo_t *t, int n, const int *gpu_of_local, const mt_topo_place_t *p, bool shared,
                       bool expect_cover, const char *what) {
    mt_cpuset_t all;
    mt_cpuset_zero(&all);
    int overlaps = 0, outside = 0, empty = 0, wrong_numa = 0;
    for (int i = 0; i < n; i++) {
        empty += mt_cpuset_count(&p[i].cpus) == 0;
        if (mt_cpuset_intersects(&all, &p[i].cpus)) {
            overlaps++;
        }
        mt_cpuset_or(&all, &p[i].cpus);
        outside += !mt_cpuset_is_subset(&p[i].cpus, &t->cpus);
        int g = gpu_of_local ? gpu_of_local[i] : -1;
        if (g >= 0 && t->gpus[g].numa >= 0) {
            wrong_numa +=
                !mt_cpuset_is_subset(&p[i].cpus, &t->numa[t->gpus[g].numa].cpus) || p[i].numa != t->gpus[g].numa;
        }
        /* Each rank's set is whole cores. */
        for (int c = 0; c < t->n_cores; c++) {
            if (mt_cpuset_intersects(&t->cores[c].pus, &p[i].cpus) &&
                !mt_cpuset_is_subset(&t->cores[c].pus, &p[i].cpus)) {
                outside++;
            }
        }
    }
    CHECK(empty == 0 && outside == 0, "%s: %d empty sets, %d sets outside the node or splitting a core", what, empty,
          outside);
    CHECK(wrong_numa == 0, "%s: %d GPU ranks bound outside their GPU's NUMA node", what, wrong_numa);
    if (!shared) {
        CHECK(overlaps == 0, "%s: %d ranks overlap another's cores", what, overlaps);
    }
    if (expect_cover) {
        CHECK(mt_cpuset_equal(&all, &t->cpus), "%s: the sets cover %d of %d PUs", what, mt_cpuset_count(&all),
              t->n_pus);
    }
    /* Even split: core counts within a domain differ by at most 1 (checked over all ranks of one NUMA). */
    for (int d = 0; d < t->n_numa && !shared; d++) {
        int lo = 1 << 30, hi = -1;
        for (int i = 0; i < n; i++) {
            if (p[i].numa == d) {
                lo = MT_MIN(lo, p[i].n_cores);
                hi = MT_MAX(hi, p[i].n_cores);
            }
        }
        CHECK(hi < 0 || hi - lo <= 1, "%s: NUMA %d gets uneven core counts %d..%d", what, d, lo, hi);
    }
}

static void test_2s8g(void) {
    mt_topo_t *t = load(DATA "node_2s8g_2nic.xml");
    if (!t) {
        return;
    }
    CHECK(t->n_packages == 2 && t->n_numa == 2 && t->n_cores == 24 && t->n_pus == 48,
          "shape %d pkg %d numa %d cores %d pus", t->n_packages, t->n_numa, t->n_cores, t->n_pus);
    CHECK(!t->this_system, "an XML file is not this machine");
    CHECK(t->n_gpus == 8, "%d GPUs", t->n_gpus);
    static const char *const bus[8] = {"0000:18:00.0", "0000:1a:00.0", "0000:28:00.0", "0000:2a:00.0",
                                       "0000:98:00.0", "0000:9a:00.0", "0000:a8:00.0", "0000:aa:00.0"};
    for (int g = 0; g < t->n_gpus && g < 8; g++) {
        CHECK(!strcmp(t->gpus[g].busid, bus[g]), "GPU %d bus id %s, want %s", g, t->gpus[g].busid, bus[g]);
        CHECK(t->gpus[g].numa == g / 4 && t->gpus[g].package == g / 4, "GPU %d on NUMA %d package %d", g,
              t->gpus[g].numa, t->gpus[g].package);
        CHECK(t->gpus[g].class_id == 0x0302 && t->gpus[g].vendor_id == 0x10de, "GPU %d class %x vendor %x", g,
              t->gpus[g].class_id, t->gpus[g].vendor_id);
    }
    CHECK(mt_topo_gpu_by_busid(t, "00000000:1A:00.0") == 1, "CUDA-style bus id maps to GPU 1");
    CHECK(mt_topo_gpu_by_busid(t, "0000:1c:00.0") == -1, "the HCA is not a GPU");
    int mlx0 = nic_named(t, "mlx5_0"), mlx1 = nic_named(t, "mlx5_1"), eno1 = nic_named(t, "eno1");
    CHECK(mlx0 >= 0 && mlx1 >= 0 && eno1 >= 0 && nic_named(t, "ib0") >= 0, "NICs found: %d", t->n_nics);
    CHECK(mlx0 >= 0 && t->nics[mlx0].kind == MT_NIC_IB && t->nics[mlx0].pci.numa == 0, "mlx5_0 is IB on NUMA 0");
    CHECK(eno1 >= 0 && t->nics[eno1].kind == MT_NIC_NET, "eno1 is a network interface");
    /* Nearest NIC: the expected HCA, and no NIC is nearer (brute force over the PCI distance). */
    for (int g = 0; g < t->n_gpus; g++) {
        int n = mt_topo_nearest_nic(t, &t->gpus[g], NULL);
        CHECK(n == (g < 4 ? mlx0 : mlx1), "GPU %d: nearest NIC %s", g, n >= 0 ? t->nics[n].name : "none");
        for (int i = 0; i < t->n_nics && n >= 0; i++) {
            CHECK(mt_topo_pci_distance(&t->gpus[g], &t->nics[i].pci) >=
                      mt_topo_pci_distance(&t->gpus[g], &t->nics[n].pci),
                  "GPU %d: %s is nearer than the chosen %s", g, t->nics[i].name, t->nics[n].name);
        }
    }
    CHECK(mt_topo_pci_distance(&t->gpus[0], &t->nics[mlx0].pci) == 0, "GPU 0 and mlx5_0 share a switch");
    CHECK(mt_topo_pci_distance(&t->gpus[2], &t->nics[mlx0].pci) == 1, "GPU 2 and mlx5_0 share a root complex");
    CHECK(mt_topo_pci_distance(&t->gpus[4], &t->nics[mlx0].pci) == 4, "GPU 4 and mlx5_0 are on other sockets");

    /* Device choice. */
    int vis[MT_TOPO_MAX_GPUS], nv = 0;
    mt_topo_device_t dev;
    CHECK_OK(mt_topo_visible_gpus(t, NULL, vis, &nv));
    CHECK(nv == 8, "all 8 visible when unset");
    mt_topo_choose_device(t, 9, vis, nv, NULL, &dev);
    CHECK(dev.kind == MT_DEVKIND_GPU && dev.gpu == 1 && dev.cuda_ordinal == 1, "local rank 9 -> GPU %d", dev.gpu);
    CHECK(strstr(dev.why, "mod 8"), "why: %s", dev.why);
    CHECK_OK(mt_topo_visible_gpus(t, "4,5,6,7", vis, &nv));
    mt_topo_choose_device(t, 1, vis, nv, "CUDA_VISIBLE_DEVICES=4,5,6,7", &dev);
    CHECK(nv == 4 && dev.gpu == 5 && dev.cuda_ordinal == 1, "restricted: GPU %d ordinal %d", dev.gpu, dev.cuda_ordinal);
    CHECK(strstr(dev.why, "CUDA_VISIBLE_DEVICES=4,5,6,7"), "why names the restriction: %s", dev.why);
    CHECK_OK(mt_topo_visible_gpus(t, "3", vis, &nv));
    mt_topo_choose_device(t, 5, vis, nv, "CUDA_VISIBLE_DEVICES=3 set by Slurm", &dev);
    CHECK(dev.gpu == 3 && dev.cuda_ordinal == 0 && strstr(dev.why, "launcher"), "per-rank GPU: %d, %s", dev.gpu,
          dev.why);
    CHECK_OK(mt_topo_visible_gpus(t, "", vis, &nv));
    mt_topo_choose_device(t, 0, vis, nv, "CUDA_VISIBLE_DEVICES=", &dev);
    CHECK(nv == 0 && dev.kind == MT_DEVKIND_CPU && dev.gpu == -1, "empty CUDA_VISIBLE_DEVICES -> CPU");
    CHECK(mt_topo_visible_gpus(t, "GPU-8a1b", vis, &nv) == MT_ERR_INVALID_ARG && strstr(mt_last_error_msg(), "UUID"),
          "UUIDs need CUDA: %s", mt_last_error_msg());
    CHECK(mt_topo_visible_gpus(t, "8", vis, &nv) == MT_ERR_INVALID_ARG && strstr(mt_last_error_msg(), "8 GPUs"),
          "out of range: %s", mt_last_error_msg());
    CHECK(mt_topo_visible_gpus(t, "1,1", vis, &nv) == MT_ERR_INVALID_ARG, "duplicate");
    CHECK(mt_topo_visible_gpus(t, "x", vis, &nv) == MT_ERR_INVALID_ARG, "garbage");

    /* Plans: 8 ranks, one per GPU: 3 cores (6 PUs) each, in the GPU's NUMA node, covering the node. */
    mt_topo_place_t p[48];
    int gol[48];
    for (int i = 0; i < 48; i++) {
        gol[i] = i % 8;
    }
    bool sh = mt_topo_plan_node(t, 8, gol, p);
    CHECK(!sh, "8 ranks on 24 cores are not oversubscribed");
    check_plan(t, 8, gol, p, sh, true, "2s8g, 8 ranks");
    for (int i = 0; i < 8; i++) {
        CHECK(p[i].n_cores == 3 && mt_cpuset_count(&p[i].cpus) == 6, "rank %d: %d cores", i, p[i].n_cores);
        CHECK(p[i].nic == (i < 4 ? mlx0 : mlx1), "rank %d NIC %d", i, p[i].nic);
    }
    /* 4 ranks on GPUs 0-3: socket 0 split 4 ways, socket 1 left free. */
    sh = mt_topo_plan_node(t, 4, gol, p);
    check_plan(t, 4, gol, p, sh, false, "2s8g, 4 ranks");
    mt_cpuset_t s0;
    mt_cpuset_zero(&s0);
    for (int i = 0; i < 4; i++) {
        mt_cpuset_or(&s0, &p[i].cpus);
    }
    CHECK(mt_cpuset_equal(&s0, &t->numa[0].cpus), "4 ranks cover exactly NUMA 0");
    /* 16 ranks, 2 per GPU: 8 per socket on 12 cores (1 or 2 each). */
    sh = mt_topo_plan_node(t, 16, gol, p);
    CHECK(!sh, "16 ranks on 24 cores are not oversubscribed");
    check_plan(t, 16, gol, p, sh, true, "2s8g, 16 ranks");
    /* 48 ranks: 24 per socket on 12 cores: shared, still inside the right socket. */
    sh = mt_topo_plan_node(t, 48, gol, p);
    CHECK(sh, "48 ranks on 24 cores are oversubscribed");
    check_plan(t, 48, gol, p, sh, true, "2s8g, 48 ranks");
    /* GPUs 4-7 only (CUDA_VISIBLE_DEVICES=4,5,6,7): the ranks sit on socket 1. */
    int g47[4] = {4, 5, 6, 7};
    sh = mt_topo_plan_node(t, 4, g47, p);
    check_plan(t, 4, g47, p, sh, false, "2s8g, GPUs 4-7");
    /* Mixed: 2 GPU ranks and 2 CPU ranks: CPU ranks take the cores not near a used GPU. */
    int mixed[4] = {0, 4, -1, -1};
    sh = mt_topo_plan_node(t, 4, mixed, p);
    check_plan(t, 4, mixed, p, sh, true, "2s8g, mixed");

    /* Dump and reload. */
    char path[] = "/tmp/mt_topo_dump_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    CHECK_OK(mt_topo_export_xml(t, path));
    mt_topo_t *t2 = load(path);
    if (t2) {
        CHECK(t2->n_gpus == 8 && t2->n_nics == t->n_nics && t2->n_cores == 24, "reloaded dump: %d GPUs %d NICs",
              t2->n_gpus, t2->n_nics);
        CHECK(!strcmp(t2->gpus[7].busid, "0000:aa:00.0") && t2->gpus[7].numa == 1, "reloaded GPU 7");
        mt_topo_free(t2);
    }
    remove(path);
    mt_topo_free(t);
}

static void test_1s4g(void) {
    mt_topo_t *t = load(DATA "node_1s4g.xml");
    if (!t) {
        return;
    }
    CHECK(t->n_packages == 1 && t->n_numa == 1 && t->n_cores == 16 && t->n_gpus == 4, "shape %d %d %d %d",
          t->n_packages, t->n_numa, t->n_cores, t->n_gpus);
    int mlx0 = nic_named(t, "mlx5_0"), mlx1 = nic_named(t, "mlx5_1");
    /* Same NUMA node for all: the PCI switch decides. */
    for (int g = 0; g < t->n_gpus; g++) {
        int n = mt_topo_nearest_nic(t, &t->gpus[g], NULL);
        CHECK(n == (g < 2 ? mlx0 : mlx1), "GPU %d: nearest %s", g, n >= 0 ? t->nics[n].name : "none");
    }
    int gol[4] = {0, 1, 2, 3}, sw[4];
    mt_topo_switch_ids(t, 4, gol, sw);
    CHECK(sw[0] == sw[1] && sw[2] == sw[3] && sw[0] != sw[2] && sw[0] > 0, "switch ids %d %d %d %d", sw[0], sw[1],
          sw[2], sw[3]);
    mt_topo_place_t p[4];
    bool sh = mt_topo_plan_node(t, 4, gol, p);
    check_plan(t, 4, gol, p, sh, true, "1s4g, 4 ranks");
    for (int i = 0; i < 4; i++) {
        CHECK(p[i].n_cores == 4, "rank %d: %d cores", i, p[i].n_cores);
    }
    mt_topo_free(t);
}

static void test_cpu_2numa(void) {
    mt_topo_t *t = load(DATA "node_cpu_2numa.xml");
    if (!t) {
        return;
    }
    CHECK(t->n_numa == 2 && t->n_cores == 16 && t->n_gpus == 0 && t->n_nics == 1,
          "shape %d numa %d cores %d gpus %d nics", t->n_numa, t->n_cores, t->n_gpus, t->n_nics);
    CHECK(t->nics[0].pci.numa == 1, "eth0 on NUMA index %d", t->nics[0].pci.numa);
    mt_topo_place_t p[32];
    bool sh = mt_topo_plan_node(t, 4, NULL, p);
    check_plan(t, 4, NULL, p, sh, true, "cpu, 4 ranks");
    for (int i = 0; i < 4; i++) {
        CHECK(p[i].n_cores == 4 && p[i].numa == i / 2, "rank %d: %d cores on NUMA %d", i, p[i].n_cores, p[i].numa);
        CHECK(p[i].nic == 0, "rank %d NIC %d", i, p[i].nic);
    }
    sh = mt_topo_plan_node(t, 2, NULL, p);
    check_plan(t, 2, NULL, p, sh, true, "cpu, 2 ranks");
    CHECK(p[0].numa == 0 && p[1].numa == 1, "2 ranks: one NUMA node each");
    sh = mt_topo_plan_node(t, 3, NULL, p);
    check_plan(t, 3, NULL, p, sh, true, "cpu, 3 ranks");
    CHECK(p[0].n_cores == 6 && p[1].n_cores == 5 && p[2].n_cores == 5, "3 ranks: 6/5/5 cores");
    sh = mt_topo_plan_node(t, 32, NULL, p);
    CHECK(sh, "32 ranks on 16 cores are oversubscribed");
    check_plan(t, 32, NULL, p, sh, true, "cpu, 32 ranks");
    for (int i = 0; i < 32; i++) {
        CHECK(p[i].n_cores == 1, "shared rank %d has one core", i);
    }
    mt_topo_free(t);
}

static void test_synthetic_and_errors(void) {
    mt_topo_t *t = load("synthetic:pack:2 numa:1 core:8 pu:2");
    if (t) {
        CHECK(t->n_packages == 2 && t->n_cores == 16 && t->n_pus == 32 && t->n_gpus == 0 && !t->this_system,
              "synthetic shape");
        mt_topo_place_t p[8];
        bool sh = mt_topo_plan_node(t, 8, NULL, p);
        check_plan(t, 8, NULL, p, sh, true, "synthetic, 8 ranks");
        char buf[64];
        mt_cpuset_format(&p[1].cpus, buf, sizeof(buf));
        CHECK(!strcmp(buf, "4-7"), "rank 1 of 8 on 2x8x2: %s", buf);
        mt_topo_free(t);
    }
    t = (mt_topo_t *)1;
    CHECK(mt_topo_load(DATA "no_such_node.xml", &t) == MT_ERR_IO && !t, "missing file");
    CHECK(strstr(mt_last_error_msg(), "no_such_node.xml"), "message names the file: %s", mt_last_error_msg());
    CHECK(mt_topo_load("synthetic:pack:banana", &t) == MT_ERR_INVALID_ARG, "bad synthetic");
    mt_cpuset_t s;
    mt_cpuset_zero(&s);
    char buf[64];
    mt_cpuset_format(&s, buf, sizeof(buf));
    CHECK(!strcmp(buf, ""), "empty set formats as \"\"");
    int cpus[] = {0, 1, 2, 5, 7, 8, 64, 65, 1000};
    for (size_t i = 0; i < MT_ARRAY_LEN(cpus); i++) {
        mt_cpuset_set(&s, cpus[i]);
    }
    mt_cpuset_format(&s, buf, sizeof(buf));
    CHECK(!strcmp(buf, "0-2,5,7-8,64-65,1000"), "format: %s", buf);
    CHECK(mt_cpuset_count(&s) == 9 && mt_cpuset_next(&s, 66) == 1000, "count / next");
}

/* Every tp group of the chosen order is on one node (and in one domain when asked), checked by walking
 * the mesh's groups directly. */
static int tp_groups_off_node(const char *order, int world, int rpn, int tp, int pp, const int *dom) {
    mt_mesh_t *m = NULL;
    if (mt_mesh_create(world, tp, pp, 0, order, &m) != MT_OK) {
        return -1;
    }
    int bad = 0, g[1024];
    for (int r = 0; r < world; r++) {
        int k = mt_mesh_group(m, r, MT_AXIS_BIT(MT_AXIS_TP), g, NULL);
        for (int i = 1; i < k; i++) {
            bad += g[i] / rpn != g[0] / rpn || (dom && dom[g[i] % rpn] != dom[g[0] % rpn]);
        }
    }
    mt_mesh_free(m);
    return bad;
}

static void test_auto_order(void) {
    char order[16], why[512], warn[256];
    int dom8[8] = {0, 0, 0, 0, 1, 1, 1, 1};
    mt_topo_node_shape_t shape = {.n_devices = 8, .domain_of_local = dom8};
    CHECK_OK(mt_topo_auto_order(&shape, 32, 8, 4, 2, 0, order, why, sizeof(why), warn, sizeof(warn)));
    CHECK(!strcmp(order, "tp-dp-pp") && warn[0] == '\0', "8 GPUs/node, tp 4 pp 2: %s (%s)", order, why);
    CHECK(tp_groups_off_node(order, 32, 8, 4, 2, dom8) == 0, "tp groups stay in one node and NUMA node");
    /* GPUs interleaved across NUMA nodes (0,2,4,6 on NUMA 0): tp=2 with the default order would pair
     * GPUs of different sockets. With dp=4 fastest, tp pairs local ranks {r, r+4} (same NUMA node) and
     * dp groups {0,1,2,3} stay in the node, beating pp-tp-dp whose dp groups cross nodes. */
    int inter[8] = {0, 1, 0, 1, 0, 1, 0, 1};
    mt_topo_node_shape_t ishape = {.n_devices = 8, .domain_of_local = inter};
    CHECK_OK(mt_topo_auto_order(&ishape, 16, 8, 2, 2, 0, order, why, sizeof(why), warn, sizeof(warn)));
    CHECK(!strcmp(order, "dp-tp-pp"), "interleaved NUMA: %s (%s)", order, why);
    CHECK(tp_groups_off_node(order, 16, 8, 2, 2, inter) == 0, "interleaved: tp groups inside one NUMA node");
    CHECK(tp_groups_off_node("tp-dp-pp", 16, 8, 2, 2, inter) > 0, "the default order would cross NUMA nodes");
    /* GPUs of one NUMA node behind two PCIe switches, alternating (GPUs 0 and 2 on one switch): tp pairs
     * should share a switch. */
    int sw4[4] = {1, 2, 1, 2};
    mt_topo_node_shape_t swshape = {.n_devices = 4, .switch_of_local = sw4};
    CHECK_OK(mt_topo_auto_order(&swshape, 8, 4, 2, 2, 0, order, why, sizeof(why), warn, sizeof(warn)));
    int64_t tn = -1, td = -1, ts = -1;
    mt_topo_mesh_crossings(&swshape, 8, 4, 2, 2, 2, order, MT_AXIS_BIT(MT_AXIS_TP), &tn, &td, &ts);
    CHECK(!strcmp(order, "dp-tp-pp") && tn == 0 && ts == 0, "switch-aware order %s: %lld node, %lld switch crossings",
          order, (long long)tn, (long long)ts);
    CHECK(tp_groups_off_node(order, 8, 4, 2, 2, sw4) == 0, "tp pairs share a switch");
    mt_topo_mesh_crossings(&swshape, 8, 4, 2, 2, 2, "tp-dp-pp", MT_AXIS_BIT(MT_AXIS_TP), &tn, &td, &ts);
    CHECK(ts == 4, "the default order pairs GPUs across switches in all 4 tp groups: %lld", (long long)ts);
    /* pp takes the links between nodes: 2 nodes of 4, tp 2, pp 2, dp 2 -> dp inside nodes. */
    CHECK_OK(mt_topo_auto_order(NULL, 8, 4, 2, 2, 0, order, why, sizeof(why), warn, sizeof(warn)));
    int64_t nc = -1, dc = -1;
    mt_topo_mesh_crossings(NULL, 8, 4, 2, 2, 2, order, MT_AXIS_BIT(MT_AXIS_DP), &nc, &dc, NULL);
    CHECK(nc == 0, "dp crosses nodes %lld times with %s", (long long)nc, order);
    mt_topo_mesh_crossings(NULL, 8, 4, 2, 2, 2, order, MT_AXIS_BIT(MT_AXIS_PP), &nc, &dc, NULL);
    CHECK(nc == 4, "pp groups span both nodes: %lld crossings with %s", (long long)nc, order);
    /* Sweep: whenever tp <= devices per node and divides it, every tp group stays on one node. */
    int cases = 0;
    for (int rpn = 1; rpn <= 8; rpn++) {
        for (int nodes = 1; nodes <= 4; nodes++) {
            int world = rpn * nodes;
            for (int tp = 1; tp <= rpn; tp++) {
                for (int pp = 1; pp <= world; pp++) {
                    if (rpn % tp || world % (tp * pp)) {
                        continue;
                    }
                    mt_topo_node_shape_t s = {.n_devices = rpn};
                    CHECK_OK(
                        mt_topo_auto_order(&s, world, rpn, tp, pp, 0, order, why, sizeof(why), warn, sizeof(warn)));
                    CHECK(tp_groups_off_node(order, world, rpn, tp, pp, NULL) == 0, "world %d rpn %d tp %d pp %d: %s",
                          world, rpn, tp, pp, order);
                    cases++;
                }
            }
        }
    }
    CHECK(cases > 100, "%d cases", cases);
    CHECK_OK(mt_topo_auto_order(&shape, 32, 8, 16, 1, 0, order, why, sizeof(why), warn, sizeof(warn)));
    CHECK(strstr(warn, "exceeds the 8 devices"), "warning for tp 16 > 8 GPUs: '%s'", warn);
    CHECK(mt_topo_auto_order(&shape, 30, 8, 4, 1, 0, order, why, sizeof(why), warn, sizeof(warn)) == MT_ERR_INVALID_ARG,
          "30 ranks, tp 4");
}

int main(void) {
    test_2s8g();
    test_1s4g();
    test_cpu_2numa();
    test_synthetic_and_errors();
    test_auto_order();
    return mt_test_finish("test_topo_xml");
}
