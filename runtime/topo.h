/* Topology-aware placement: the hwloc probe (or an hwloc XML / synthetic topology) flattened into a
 * plain struct, the choice of each local rank's device, the CPU binding near that device, the NIC
 * nearest to it, and the mesh order that keeps tensor-parallel groups inside a node. Everything except
 * mt_topo_load (probe) and mt_topo_bind (applies) is a pure function of its arguments, so a cluster's
 * placement can be computed and tested from its XML on any machine.
 * SPDX-License-Identifier: MIT */
#ifndef MT_TOPO_H
#define MT_TOPO_H

#include <mpi.h>

#include "mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- CPU sets ------------------------------------------------------------------------------- */

#define MT_TOPO_MAX_CPUS 2048 /* PU OS indices 0..MT_TOPO_MAX_CPUS-1 */
typedef struct {
    uint64_t w[MT_TOPO_MAX_CPUS / 64];
} mt_cpuset_t;

void mt_cpuset_zero(mt_cpuset_t *s);
void mt_cpuset_set(mt_cpuset_t *s, int cpu);
bool mt_cpuset_isset(const mt_cpuset_t *s, int cpu);
int mt_cpuset_count(const mt_cpuset_t *s);
bool mt_cpuset_equal(const mt_cpuset_t *a, const mt_cpuset_t *b);
bool mt_cpuset_intersects(const mt_cpuset_t *a, const mt_cpuset_t *b);
bool mt_cpuset_is_subset(const mt_cpuset_t *sub, const mt_cpuset_t *super);
void mt_cpuset_or(mt_cpuset_t *dst, const mt_cpuset_t *src);
/* First set CPU at or after `from`, or -1. */
int mt_cpuset_next(const mt_cpuset_t *s, int from);
/* Writes the set as a list of ranges ("0-3,8,10-11"; "" when empty), truncated to fit len. */
void mt_cpuset_format(const mt_cpuset_t *s, char *buf, size_t len);
/* The calling thread's affinity as the kernel reports it (sched_getaffinity). Fails with MT_ERR_SYSTEM. */
mt_status_t mt_cpuset_get_affinity(mt_cpuset_t *s);

/* ---- the topology struct ---------------------------------------------------------------------- */

#define MT_TOPO_MAX_NUMA 64
#define MT_TOPO_MAX_GPUS 64
#define MT_TOPO_MAX_NICS 64
#define MT_TOPO_MAX_BRIDGES 8

typedef struct {
    int os_index;     /* NUMA node P# */
    int package;      /* index into packages, -1 when not inside one package */
    mt_cpuset_t cpus; /* its PUs */
    int n_cores;
} mt_topo_numa_t;

typedef struct {
    mt_cpuset_t pus; /* the hardware threads of this core */
    int numa;        /* index into numa[], -1 if none */
    int package;
} mt_topo_core_t;

/* Where a PCI device hangs: its bus id, its PCI bridges (to tell devices behind the same switch) and
 * the CPUs / NUMA node of its nearest non-I/O ancestor. */
typedef struct {
    char busid[16]; /* "0000:17:00.0"; "" for a device that is not on PCI */
    unsigned vendor_id, device_id, class_id;
    int numa;         /* index into numa[] of the NUMA node it is attached to, -1 when it spans several */
    int package;      /* index of its package, -1 when several */
    mt_cpuset_t cpus; /* PUs of the nearest non-I/O ancestor */
    int n_bridges;
    uint64_t bridges[MT_TOPO_MAX_BRIDGES]; /* hwloc gp_index of each PCI-to-PCI bridge above it, nearest first */
    uint64_t host_bridge;                  /* gp_index of its host bridge (root complex), 0 if none */
} mt_topo_pci_t;

typedef enum { MT_NIC_IB = 0, MT_NIC_NET = 1 } mt_nic_kind_t;

typedef struct {
    char name[32]; /* "mlx5_0" (IB / RoCE verbs device) or "eth0" / "ib0" (network interface) */
    mt_nic_kind_t kind;
    mt_topo_pci_t pci;
} mt_topo_nic_t;

typedef struct mt_topo {
    char source[320]; /* "probe", "xml:PATH", "synthetic:DESC" */
    bool this_system; /* the topology describes the machine this process runs on (binding allowed) */
    int n_pus, n_cores, n_packages, n_numa, n_gpus, n_nics;
    mt_cpuset_t cpus; /* every PU this process may use */
    mt_topo_numa_t numa[MT_TOPO_MAX_NUMA];
    mt_topo_core_t cores[MT_TOPO_MAX_CPUS]; /* in hwloc logical order (package, NUMA, core) */
    mt_topo_pci_t gpus[MT_TOPO_MAX_GPUS];   /* NVIDIA GPUs (PCI class 0x0300/0x0302, vendor 0x10de), by bus id */
    mt_topo_nic_t nics[MT_TOPO_MAX_NICS];   /* IB/RoCE verbs devices and network interfaces with a PCI device */
    void *hw;                               /* the hwloc topology it was read from (owned) */
} mt_topo_t;

/* Loads the topology. source NULL: the MESHTRAIN_TOPO_FILE XML when set, else probes this machine
 * (and writes the probe to MESHTRAIN_TOPO_DUMP_FILE when set). source "synthetic:<hwloc synthetic
 * description>" builds a synthetic CPU topology; any other source is an hwloc XML path. I/O objects
 * (PCI devices, bridges, OS devices) are kept. *out is owned by the caller (mt_topo_free). Fails with
 * MT_ERR_IO (unreadable file, naming it) or MT_ERR_SYSTEM (hwloc failure). */
mt_status_t mt_topo_load(const char *source, mt_topo_t **out);
void mt_topo_free(mt_topo_t *topo);

/* Writes the topology as hwloc XML (loadable with MESHTRAIN_TOPO_FILE or `lstopo --input`). */
mt_status_t mt_topo_export_xml(const mt_topo_t *topo, const char *path);

/* Index into numa[] of the NUMA node holding every PU of cpus, or -1 when they span several or none. */
int mt_topo_numa_of(const mt_topo_t *topo, const mt_cpuset_t *cpus);

/* ---- devices ----------------------------------------------------------------------------------- */

/* How close two PCI devices are, smaller is nearer: 0 same PCI switch, 1 same root complex, 2 same
 * NUMA node, 3 same package, 4 same machine. */
int mt_topo_pci_distance(const mt_topo_pci_t *a, const mt_topo_pci_t *b);

/* Index into topo->gpus of the GPU with this PCI bus id ("0000:17:00.0", or CUDA's "00000000:17:00.0";
 * looked up through hwloc_get_pcidev_by_busid), -1 when none. */
int mt_topo_gpu_by_busid(const mt_topo_t *topo, const char *busid);

/* The NIC nearest to a GPU (gpu != NULL) or to a set of CPUs (gpu == NULL): smallest PCI distance
 * (for CPUs: a NIC attached to the NUMA node of the set, then any), InfiniBand/RoCE verbs devices
 * preferred over plain interfaces at equal distance, then the lowest bus id. -1 when there is none. */
int mt_topo_nearest_nic(const mt_topo_t *topo, const mt_topo_pci_t *gpu, const mt_cpuset_t *cpus);

/* The GPUs this process may use, as indices into topo->gpus in CUDA's numbering (visible[i] is what
 * cudaSetDevice(i) selects). cuda_visible is CUDA_VISIBLE_DEVICES as set (NULL = unset: all GPUs in PCI
 * bus order, as with CUDA_DEVICE_ORDER=PCI_BUS_ID); integer entries index that order; UUIDs ("GPU-...")
 * and MIG names cannot be mapped without the CUDA runtime and fail with MT_ERR_INVALID_ARG. An empty
 * value means no GPU. Out-of-range entries fail naming the entry and the count. */
mt_status_t mt_topo_visible_gpus(const mt_topo_t *topo, const char *cuda_visible, int visible[MT_TOPO_MAX_GPUS],
                                 int *n_visible);

typedef enum { MT_DEVKIND_CPU = 0, MT_DEVKIND_GPU = 1 } mt_dev_kind_t;

typedef struct {
    mt_dev_kind_t kind;
    int gpu;          /* index into topo->gpus, -1 for CPU */
    int cuda_ordinal; /* argument of cudaSetDevice, -1 for CPU */
    char why[200];    /* how it was chosen, for the report */
} mt_topo_device_t;

/* Device of a local rank: GPU visible[local_rank mod n_visible], or the CPU when n_visible is 0.
 * restricted_by names what narrowed the visible list (e.g. "CUDA_VISIBLE_DEVICES=2,3 set by Slurm"),
 * NULL when nothing did; it is quoted in why. */
void mt_topo_choose_device(const mt_topo_t *topo, int local_rank, const int *visible, int n_visible,
                           const char *restricted_by, mt_topo_device_t *out);

/* ---- placement of one node ------------------------------------------------------------------ */

typedef struct {
    mt_cpuset_t cpus; /* PUs of the cores it is bound to */
    int n_cores;
    int numa;    /* index into topo->numa holding all of cpus, -1 when they span several */
    int nic;     /* index into topo->nics, -1 when none */
    bool shared; /* its cores are shared with another local rank (more ranks than cores) */
} mt_topo_place_t;

/* The CPU placement of every local rank of a node, given each one's GPU (gpu_of_local[i], index into
 * topo->gpus, or -1 for a CPU rank; NULL = all CPU). Ranks whose GPUs hang off the same NUMA node (or,
 * without NUMA locality, the same CPU set) split that node's cores evenly and disjointly in local-rank
 * order; CPU ranks split the cores not near any GPU rank's device (all cores when there is none)
 * evenly in contiguous blocks, which keeps a block inside one NUMA node when the count divides. When a
 * domain has fewer cores than ranks, ranks take its cores round-robin and are marked shared.
 * Returns true when any rank is shared (oversubscribed). Pure. */
bool mt_topo_plan_node(const mt_topo_t *topo, int local_size, const int *gpu_of_local, mt_topo_place_t *places);

/* ---- binding (the start-up call) -------------------------------------------------------------- */

typedef enum { MT_BIND_AUTO = 0, MT_BIND_FORCE, MT_BIND_NONE } mt_bind_mode_t;
typedef enum {
    MT_BIND_APPLIED = 0,    /* bound to the planned cores */
    MT_BIND_KEPT_LAUNCHER,  /* the launcher had bound the process; kept (runtime.bind = auto) */
    MT_BIND_LEFT_ALONE,     /* runtime.bind = none */
    MT_BIND_NOT_THIS_SYSTEM /* the topology is a file describing another machine: planned, not applied */
} mt_bind_action_t;

/* Parses "auto" | "force" | "none" (runtime.bind). */
mt_status_t mt_topo_bind_mode_parse(const char *s, mt_bind_mode_t *mode);
const char *mt_topo_bind_action_str(mt_bind_action_t a);

/* What mt_topo_bind did, for `meshtrain topo` and the start-up log. */
typedef struct {
    int local_rank, local_size;
    mt_topo_device_t device;
    char device_str[64];  /* "gpu:3 (0000:1a:00.0)" or "cpu:0-11" */
    mt_topo_place_t plan; /* the planned placement */
    mt_cpuset_t bound;    /* the affinity the kernel reports after binding */
    int numa_os;          /* OS index of the NUMA node holding `bound`, -1 when several */
    mt_bind_action_t action;
    bool oversubscribed; /* more local ranks than cores: cores are shared */
    int n_threads;       /* OpenMP and OpenBLAS thread count set (cores owned) */
    int nic;             /* index into topo->nics, -1 none */
    char nic_name[32];   /* "" when none */
    char nic_export[96]; /* "NCCL_IB_HCA==mlx5_0" when exported (runtime.nic = auto), else "" */
    char note[256];      /* why the action was taken */
} mt_topo_report_t;

/* Chooses this process's device, plans the node (gathering the local ranks' devices over local_comm,
 * collective over it; MPI_COMM_SELF for a single process), binds the whole process (all its threads,
 * so OpenMP, OpenBLAS and progress threads follow) unless the launcher already bound it (kept under
 * MT_BIND_AUTO) or mode is MT_BIND_NONE, sets the OpenMP and OpenBLAS thread counts to the cores owned,
 * exports the nearest NIC for NCCL (NCCL_IB_HCA or NCCL_SOCKET_IFNAME, unless the user set it) when
 * nic_auto, warns once per node when cores are shared, and fills *report. With use_gpus false the
 * device is always the CPU. Fails with MT_ERR_SYSTEM when the kernel refuses the binding, MT_ERR_MPI,
 * or MT_ERR_INVALID_ARG for an unusable CUDA_VISIBLE_DEVICES. */
mt_status_t mt_topo_bind(const mt_topo_t *topo, MPI_Comm local_comm, mt_bind_mode_t mode, bool nic_auto, bool use_gpus,
                         mt_topo_report_t *report);

/* ---- start-up in one call (collective over the world, after mt_rt_init) ------------------------ */

struct mt_config;

/* What the trainer calls at start-up: loads the topology (MESHTRAIN_TOPO_FILE, else the probe; written
 * to MESHTRAIN_TOPO_DUMP_FILE when set), then mt_topo_bind with runtime.bind, runtime.nic and
 * runtime.device from cfg over mt_rt_world()->local_comm. Every rank returns the same status (the
 * worst); this rank's message stays in mt_last_error_msg. *topo is the caller's (mt_topo_free). */
mt_status_t mt_topo_startup(const struct mt_config *cfg, mt_topo_t **topo, mt_topo_report_t *report);

/* Resolves parallel.order for the running job: an explicit order is copied; "auto" is chosen on rank
 * 0 from its node (ranks per node = its local size, domains = the NUMA nodes of the local ranks'
 * plans) and broadcast. warn (may be NULL) gets rank 0's warnings: tp above the node's devices, or
 * ranks not placed on nodes in equal consecutive blocks (which auto assumes). Collective over the
 * world; every rank gets the same order and status. */
mt_status_t mt_topo_resolve_order(const mt_topo_t *topo, const mt_topo_report_t *report, const char *order, int tp,
                                  int pp, int dp, bool use_gpus, char out[16], char *why, size_t why_len, char *warn,
                                  size_t warn_len);

/* ---- mesh order that follows the hardware ------------------------------------------------------ */

/* The shape of one node as the placement sees it, for ranks_per_node local ranks: local rank i sits
 * in NUMA domain domain_of_local[i] and behind PCIe switch switch_of_local[i] (small ids; either array
 * NULL = one domain / one switch per node), and the node has n_devices GPUs (0 on CPU-only nodes, where
 * the devices are the local ranks). */
typedef struct {
    int n_devices;
    const int *domain_of_local;
    const int *switch_of_local;
} mt_topo_node_shape_t;

/* Small ids of the PCIe switch (outermost PCI-to-PCI bridge, else the root complex) of each local
 * rank's GPU (gpu_of_local[i], index into topo->gpus; -1 = CPU rank, id 0), for switch_of_local. */
void mt_topo_switch_ids(const mt_topo_t *topo, int n, const int *gpu_of_local, int *out);

/* Resolves parallel.order = "auto": ranks are placed on nodes in blocks of ranks_per_node (rank r on
 * node r / ranks_per_node, local rank r mod ranks_per_node). Scores each of the 6 orders by, in turn:
 * tp groups' node crossings, tp groups' NUMA-domain crossings, tp groups' PCIe-switch crossings, dp
 * groups' node crossings (so pipeline stages take the links between nodes and data parallel fills the
 * rest), then the default order first. Writes the winner (e.g. "tp-dp-pp") to order and the reason to
 * why; warn (may be NULL) gets a warning when tp exceeds the devices of a node (tp groups must cross
 * nodes). Fails with MT_ERR_INVALID_ARG when the sizes do not multiply to world. Pure. */
mt_status_t mt_topo_auto_order(const mt_topo_node_shape_t *shape, int world, int ranks_per_node, int tp, int pp, int dp,
                               char order[16], char *why, size_t why_len, char *warn, size_t warn_len);

/* Crossings of every group along axes_mask of a mesh under block placement, the measure auto order
 * minimises: sum over groups of (distinct nodes - 1), of (distinct NUMA domains - 1) and of (distinct
 * switches - 1); switch_crossings may be NULL. Exposed for tests and reports. */
void mt_topo_mesh_crossings(const mt_topo_node_shape_t *shape, int world, int ranks_per_node, int tp, int pp, int dp,
                            const char *order, unsigned axes_mask, int64_t *node_crossings, int64_t *domain_crossings,
                            int64_t *switch_crossings);

#ifdef __cplusplus
}
#endif
#endif /* MT_TOPO_H */
