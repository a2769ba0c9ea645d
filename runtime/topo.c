/* Topology discovery: loads hwloc (probe, XML file or synthetic description) once and flattens it into
 * mt_topo_t: packages, NUMA nodes with their cores, NVIDIA GPUs found as PCI devices (Debian's hwloc has
 * no CUDA/NVML plugin, so a GPU is PCI class 0x0300/0x0302 of vendor 0x10de and its CPUs come from its
 * nearest non-I/O ancestor) and NICs as OS devices with their PCI locality. Also CPU-set helpers and the
 * PCI distance used to pick a GPU's nearest NIC.
 * SPDX-License-Identifier: MIT */
#include "topo.h"

#include <errno.h>
#include <hwloc.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

MT_PARAM_STR(topo_file, "TOPO_FILE", NULL)
MT_PARAM_STR(topo_dump_file, "TOPO_DUMP_FILE", NULL)

/* ---- CPU sets ------------------------------------------------------------------------------- */

void mt_cpuset_zero(mt_cpuset_t *s) {
    memset(s, 0, sizeof(*s));
}

void mt_cpuset_set(mt_cpuset_t *s, int cpu) {
    if (cpu >= 0 && cpu < MT_TOPO_MAX_CPUS) {
        s->w[cpu / 64] |= 1ull << (cpu % 64);
    }
}

bool mt_cpuset_isset(const mt_cpuset_t *s, int cpu) {
    return cpu >= 0 && cpu < MT_TOPO_MAX_CPUS && (s->w[cpu / 64] >> (cpu % 64)) & 1u;
}

int mt_cpuset_count(const mt_cpuset_t *s) {
    int n = 0;
    for (size_t i = 0; i < MT_ARRAY_LEN(s->w); i++) {
        n += __builtin_popcountll(s->w[i]);
    }
    return n;
}

bool mt_cpuset_equal(const mt_cpuset_t *a, const mt_cpuset_t *b) {
    return !memcmp(a->w, b->w, sizeof(a->w));
}

bool mt_cpuset_intersects(const mt_cpuset_t *a, const mt_cpuset_t *b) {
    for (size_t i = 0; i < MT_ARRAY_LEN(a->w); i++) {
        if (a->w[i] & b->w[i]) {
            return true;
        }
    }
    return false;
}

bool mt_cpuset_is_subset(const mt_cpuset_t *sub, const mt_cpuset_t *super) {
    for (size_t i = 0; i < MT_ARRAY_LEN(sub->w); i++) {
        if (sub->w[i] & ~super->w[i]) {
            return false;
        }
    }
    return true;
}

void mt_cpuset_or(mt_cpuset_t *dst, const mt_cpuset_t *src) {
    for (size_t i = 0; i < MT_ARRAY_LEN(dst->w); i++) {
        dst->w[i] |= src->w[i];
    }
}

int mt_cpuset_next(const mt_cpuset_t *s, int from) {
    for (int c = from < 0 ? 0 : from; c < MT_TOPO_MAX_CPUS; c++) {
        if (!s->w[c / 64]) {
            c |= 63; /* skip an empty word */
            continue;
        }
        if (mt_cpuset_isset(s, c)) {
            return c;
        }
    }
    return -1;
}

void mt_cpuset_format(const mt_cpuset_t *s, char *buf, size_t len) {
    size_t off = 0;
    if (len == 0) {
        return;
    }
    buf[0] = '\0';
    for (int c = mt_cpuset_next(s, 0); c >= 0;) {
        int end = c;
        while (mt_cpuset_isset(s, end + 1)) {
            end++;
        }
        int n = end > c ? snprintf(buf + off, len - off, "%s%d-%d", off ? "," : "", c, end)
                        : snprintf(buf + off, len - off, "%s%d", off ? "," : "", c);
        if (n < 0 || (size_t)n >= len - off) {
            buf[len - 1] = '\0';
            return;
        }
        off += (size_t)n;
        c = mt_cpuset_next(s, end + 1);
    }
}

mt_status_t mt_cpuset_get_affinity(mt_cpuset_t *s) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) {
        return mt_error(MT_ERR_SYSTEM, "sched_getaffinity: %s", strerror(errno));
    }
    mt_cpuset_zero(s);
    for (int c = 0; c < CPU_SETSIZE && c < MT_TOPO_MAX_CPUS; c++) {
        if (CPU_ISSET(c, &set)) {
            mt_cpuset_set(s, c);
        }
    }
    return MT_OK;
}

static void from_hwloc(mt_cpuset_t *s, hwloc_const_bitmap_t bm) {
    mt_cpuset_zero(s);
    if (!bm) {
        return;
    }
    int i;
    hwloc_bitmap_foreach_begin(i, bm) {
        if (i >= MT_TOPO_MAX_CPUS) {
            break;
        }
        mt_cpuset_set(s, i);
    }
    hwloc_bitmap_foreach_end();
}

/* ---- loading --------------------------------------------------------------------------------- */

int mt_topo_numa_of(const mt_topo_t *topo, const mt_cpuset_t *cpus) {
    if (mt_cpuset_count(cpus) == 0) {
        return -1;
    }
    for (int i = 0; i < topo->n_numa; i++) {
        if (mt_cpuset_is_subset(cpus, &topo->numa[i].cpus)) {
            return i;
        }
    }
    return -1;
}

static int package_of(hwloc_topology_t hw, hwloc_obj_t obj) {
    hwloc_obj_t p = hwloc_get_ancestor_obj_by_type(hw, HWLOC_OBJ_PACKAGE, obj);
    return p ? (int)p->logical_index : -1;
}

static void fill_pci(mt_topo_t *topo, hwloc_topology_t hw, hwloc_obj_t dev, mt_topo_pci_t *p) {
    memset(p, 0, sizeof(*p));
    const struct hwloc_pcidev_attr_s *a = &dev->attr->pcidev;
    snprintf(p->busid, sizeof(p->busid), "%04x:%02x:%02x.%x", a->domain & 0xffffu, a->bus, a->dev, a->func);
    p->vendor_id = a->vendor_id;
    p->device_id = a->device_id;
    p->class_id = a->class_id;
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(hw, dev);
    from_hwloc(&p->cpus, anc ? anc->cpuset : NULL);
    p->numa = mt_topo_numa_of(topo, &p->cpus);
    p->package = anc ? package_of(hw, anc) : -1;
    if (p->package < 0 && anc && anc->type == HWLOC_OBJ_PACKAGE) {
        p->package = (int)anc->logical_index;
    }
    for (hwloc_obj_t up = dev->parent; up && up->type == HWLOC_OBJ_BRIDGE; up = up->parent) {
        if (up->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST) {
            p->host_bridge = up->gp_index;
        } else if (p->n_bridges < MT_TOPO_MAX_BRIDGES) {
            p->bridges[p->n_bridges++] = up->gp_index;
        }
    }
}

static bool is_nvidia_gpu(hwloc_obj_t dev) {
    unsigned cls = dev->attr->pcidev.class_id;
    return dev->attr->pcidev.vendor_id == 0x10de && (cls == 0x0300 || cls == 0x0302);
}

static void fill(mt_topo_t *topo, hwloc_topology_t hw) {
    from_hwloc(&topo->cpus, hwloc_topology_get_allowed_cpuset(hw));
    if (mt_cpuset_count(&topo->cpus) == 0) {
        from_hwloc(&topo->cpus, hwloc_topology_get_topology_cpuset(hw));
    }
    topo->n_pus = mt_cpuset_count(&topo->cpus);
    topo->n_packages = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PACKAGE);
    int n_numa = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_NUMANODE);
    for (int i = 0; i < n_numa && topo->n_numa < MT_TOPO_MAX_NUMA; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(hw, HWLOC_OBJ_NUMANODE, (unsigned)i);
        mt_topo_numa_t *nn = &topo->numa[topo->n_numa++];
        nn->os_index = (int)o->os_index;
        from_hwloc(&nn->cpus, o->cpuset);
        for (size_t w = 0; w < MT_ARRAY_LEN(nn->cpus.w); w++) {
            nn->cpus.w[w] &= topo->cpus.w[w];
        }
        nn->package = package_of(hw, o);
    }
    /* Cores; a platform without core objects gets one "core" per PU. */
    hwloc_obj_type_t core_type = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
    int n_cores = hwloc_get_nbobjs_by_type(hw, core_type);
    for (int i = 0; i < n_cores && topo->n_cores < MT_TOPO_MAX_CPUS; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(hw, core_type, (unsigned)i);
        mt_topo_core_t *c = &topo->cores[topo->n_cores];
        from_hwloc(&c->pus, o->cpuset);
        for (size_t w = 0; w < MT_ARRAY_LEN(c->pus.w); w++) {
            c->pus.w[w] &= topo->cpus.w[w];
        }
        if (mt_cpuset_count(&c->pus) == 0) {
            continue; /* a core this process may not use */
        }
        c->numa = mt_topo_numa_of(topo, &c->pus);
        c->package = package_of(hw, o);
        if (c->numa >= 0) {
            topo->numa[c->numa].n_cores++;
        }
        topo->n_cores++;
    }
    for (hwloc_obj_t dev = hwloc_get_next_pcidev(hw, NULL); dev; dev = hwloc_get_next_pcidev(hw, dev)) {
        if (is_nvidia_gpu(dev) && topo->n_gpus < MT_TOPO_MAX_GPUS) {
            fill_pci(topo, hw, dev, &topo->gpus[topo->n_gpus++]);
        }
    }
    for (hwloc_obj_t os = hwloc_get_next_osdev(hw, NULL); os; os = hwloc_get_next_osdev(hw, os)) {
        hwloc_obj_osdev_type_t t = os->attr->osdev.type;
        if ((t != HWLOC_OBJ_OSDEV_NETWORK && t != HWLOC_OBJ_OSDEV_OPENFABRICS) || !os->parent ||
            os->parent->type != HWLOC_OBJ_PCI_DEVICE || topo->n_nics >= MT_TOPO_MAX_NICS) {
            continue; /* virtual interfaces (lo, bridges, containers) have no PCI locality */
        }
        mt_topo_nic_t *nic = &topo->nics[topo->n_nics++];
        snprintf(nic->name, sizeof(nic->name), "%s", os->name ? os->name : "?");
        nic->kind = t == HWLOC_OBJ_OSDEV_OPENFABRICS ? MT_NIC_IB : MT_NIC_NET;
        fill_pci(topo, hw, os->parent, &nic->pci);
    }
}

mt_status_t mt_topo_load(const char *source, mt_topo_t **out) {
    *out = NULL;
    const char *src = source;
    if (!src) {
        src = mt_param_topo_file();
        if (src && !*src) {
            src = NULL;
        }
    }
    hwloc_topology_t hw = NULL;
    if (hwloc_topology_init(&hw) != 0) {
        return mt_error(MT_ERR_SYSTEM, "hwloc_topology_init failed: %s", strerror(errno));
    }
    hwloc_topology_set_io_types_filter(hw, HWLOC_TYPE_FILTER_KEEP_ALL);
    if (src && !strncmp(src, "synthetic:", 10)) {
        if (hwloc_topology_set_synthetic(hw, src + 10) != 0) {
            hwloc_topology_destroy(hw);
            return mt_error(MT_ERR_INVALID_ARG,
                            "hwloc rejects the synthetic topology \"%s\" (expected e.g. \"pack:2 numa:1 core:8 pu:1\")",
                            src + 10);
        }
    } else if (src) {
        FILE *f = fopen(src, "r");
        if (!f) {
            int e = errno;
            hwloc_topology_destroy(hw);
            return mt_error(MT_ERR_IO, "cannot read topology file %s: %s (an hwloc XML, e.g. from `lstopo t.xml`)", src,
                            strerror(e));
        }
        fclose(f);
        if (hwloc_topology_set_xml(hw, src) != 0) {
            hwloc_topology_destroy(hw);
            return mt_error(MT_ERR_IO, "hwloc cannot use %s as an XML topology: %s", src, strerror(errno));
        }
    }
    if (hwloc_topology_load(hw) != 0) {
        int e = errno;
        hwloc_topology_destroy(hw);
        return mt_error(src ? MT_ERR_IO : MT_ERR_SYSTEM, "hwloc failed to load the topology%s%s: %s",
                        src ? " from " : "", src ? src : "", strerror(e));
    }
    mt_topo_t *t = mt_calloc(sizeof(*t), MT_MEM_OTHER, "topo");
    if (!t) {
        hwloc_topology_destroy(hw);
        return mt_error(MT_ERR_OOM, "out of memory for the topology");
    }
    t->hw = hw;
    t->this_system = hwloc_topology_is_thissystem(hw) != 0;
    if (!src) {
        snprintf(t->source, sizeof(t->source), "probe");
    } else if (!strncmp(src, "synthetic:", 10)) {
        snprintf(t->source, sizeof(t->source), "%s", src);
    } else {
        snprintf(t->source, sizeof(t->source), "xml:%s", src);
    }
    fill(t, hw);
    MT_INFO(MT_LOG_TOPO, "topology from %s: %d packages, %d NUMA nodes, %d cores, %d PUs, %d GPUs, %d NICs%s",
            t->source, t->n_packages, t->n_numa, t->n_cores, t->n_pus, t->n_gpus, t->n_nics,
            t->this_system ? "" : " (not this machine: placement is planned, not applied)");
    const char *dump = mt_param_topo_dump_file();
    if (!src && dump && *dump) {
        mt_status_t st = mt_topo_export_xml(t, dump);
        if (st != MT_OK) {
            mt_topo_free(t);
            return st;
        }
    }
    *out = t;
    return MT_OK;
}

void mt_topo_free(mt_topo_t *topo) {
    if (!topo) {
        return;
    }
    if (topo->hw) {
        hwloc_topology_destroy((hwloc_topology_t)topo->hw);
    }
    mt_free(topo);
}

mt_status_t mt_topo_export_xml(const mt_topo_t *topo, const char *path) {
    if (hwloc_topology_export_xml((hwloc_topology_t)topo->hw, path, 0) != 0) {
        return mt_error(MT_ERR_IO, "cannot write the topology to %s: %s", path, strerror(errno));
    }
    MT_INFO(MT_LOG_TOPO, "topology written to %s", path);
    return MT_OK;
}

/* ---- devices ----------------------------------------------------------------------------------- */

int mt_topo_gpu_by_busid(const mt_topo_t *topo, const char *busid) {
    unsigned dom = 0, bus = 0, dev = 0, fn = 0;
    if (!busid || sscanf(busid, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4) {
        return -1;
    }
    hwloc_obj_t o = hwloc_get_pcidev_by_busid((hwloc_topology_t)topo->hw, dom, bus, dev, fn);
    if (!o) {
        return -1;
    }
    char want[16];
    snprintf(want, sizeof(want), "%04x:%02x:%02x.%x", o->attr->pcidev.domain & 0xffffu, o->attr->pcidev.bus,
             o->attr->pcidev.dev, o->attr->pcidev.func);
    for (int i = 0; i < topo->n_gpus; i++) {
        if (!strcmp(topo->gpus[i].busid, want)) {
            return i;
        }
    }
    return -1;
}

int mt_topo_pci_distance(const mt_topo_pci_t *a, const mt_topo_pci_t *b) {
    for (int i = 0; i < a->n_bridges; i++) {
        for (int j = 0; j < b->n_bridges; j++) {
            if (a->bridges[i] == b->bridges[j]) {
                return 0;
            }
        }
    }
    if (a->host_bridge && a->host_bridge == b->host_bridge) {
        return 1;
    }
    if (a->numa >= 0 && a->numa == b->numa) {
        return 2;
    }
    if (a->package >= 0 && a->package == b->package) {
        return 3;
    }
    return 4;
}

int mt_topo_nearest_nic(const mt_topo_t *topo, const mt_topo_pci_t *gpu, const mt_cpuset_t *cpus) {
    int best = -1, best_d = 1 << 30;
    int numa = cpus ? mt_topo_numa_of(topo, cpus) : -1;
    for (int i = 0; i < topo->n_nics; i++) {
        const mt_topo_nic_t *n = &topo->nics[i];
        int d;
        if (gpu) {
            d = mt_topo_pci_distance(gpu, &n->pci);
        } else if (numa >= 0 && n->pci.numa == numa) {
            d = 2;
        } else if (cpus && mt_cpuset_intersects(cpus, &n->pci.cpus)) {
            d = 3;
        } else {
            d = 4;
        }
        d = d * 2 + (n->kind == MT_NIC_IB ? 0 : 1); /* verbs devices first at equal distance */
        if (d < best_d || (d == best_d && strcmp(n->pci.busid, topo->nics[best].pci.busid) < 0)) {
            best = i;
            best_d = d;
        }
    }
    return best;
}

mt_status_t mt_topo_visible_gpus(const mt_topo_t *topo, const char *cuda_visible, int visible[MT_TOPO_MAX_GPUS],
                                 int *n_visible) {
    *n_visible = 0;
    if (!cuda_visible) {
        for (int i = 0; i < topo->n_gpus; i++) {
            visible[i] = i;
        }
        *n_visible = topo->n_gpus;
        return MT_OK;
    }
    const char *p = cuda_visible;
    while (*p) {
        while (*p == ' ') {
            p++;
        }
        if (!*p) {
            break;
        }
        if (!strncmp(p, "GPU-", 4) || !strncmp(p, "MIG-", 4)) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "CUDA_VISIBLE_DEVICES=%s names GPUs by UUID, which needs the CUDA runtime with a device to "
                            "map to PCI bus ids; use integer indices (PCI bus order) or run where CUDA sees the GPUs",
                            cuda_visible);
        }
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',' && *end != ' ')) {
            return mt_error(MT_ERR_INVALID_ARG, "CUDA_VISIBLE_DEVICES=%s: '%s' is not a GPU index", cuda_visible, p);
        }
        if (v < 0) {
            break; /* CUDA stops at a negative index */
        }
        if (v >= topo->n_gpus) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "CUDA_VISIBLE_DEVICES=%s: GPU %ld does not exist (the node has %d GPUs)", cuda_visible, v,
                            topo->n_gpus);
        }
        for (int i = 0; i < *n_visible; i++) {
            if (visible[i] == (int)v) {
                return mt_error(MT_ERR_INVALID_ARG, "CUDA_VISIBLE_DEVICES=%s lists GPU %ld twice", cuda_visible, v);
            }
        }
        visible[(*n_visible)++] = (int)v;
        p = end;
        while (*p == ' ' || *p == ',') {
            p++;
        }
    }
    return MT_OK;
}

void mt_topo_choose_device(const mt_topo_t *topo, int local_rank, const int *visible, int n_visible,
                           const char *restricted_by, mt_topo_device_t *out) {
    memset(out, 0, sizeof(*out));
    if (n_visible <= 0) {
        out->kind = MT_DEVKIND_CPU;
        out->gpu = -1;
        out->cuda_ordinal = -1;
        snprintf(out->why, sizeof(out->why), "%s",
                 topo->n_gpus == 0 ? "no GPU on this node"
                 : restricted_by   ? "no GPU visible"
                                   : "GPUs not used");
        if (restricted_by && topo->n_gpus > 0) {
            snprintf(out->why + strlen(out->why), sizeof(out->why) - strlen(out->why), " (%s)", restricted_by);
        }
        return;
    }
    out->kind = MT_DEVKIND_GPU;
    out->cuda_ordinal = local_rank % n_visible;
    out->gpu = visible[out->cuda_ordinal];
    if (n_visible == 1 && restricted_by) {
        snprintf(out->why, sizeof(out->why), "the launcher restricted this rank to one GPU (%s)", restricted_by);
    } else {
        snprintf(out->why, sizeof(out->why), "local rank %d mod %d %sGPUs%s%s%s", local_rank, n_visible,
                 restricted_by ? "visible " : "", restricted_by ? " (" : "", restricted_by ? restricted_by : "",
                 restricted_by ? ")" : "");
    }
}
