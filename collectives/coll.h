/* The communicator API: one opaque mt_comm_t per process group, collectives and point-to-point over
 * it, synchronous or with a work handle, behind backends chosen per communicator (NCCL for device
 * memory, or MPI through pinned host buffers where NCCL cannot serve; MPI and shared memory for host memory;
 * a local path for 1-rank groups). This header is the manual; the
 * design notes (progress thread, ordering, in-place conventions) are in docs/collectives.md.
 * SPDX-License-Identifier: MIT */
#ifndef MT_COLL_H
#define MT_COLL_H

#include <mpi.h>
#include <stdint.h>

#include "runtime/mt_core.h"
#include "runtime/tensor.h" /* mt_dtype_t and the f32 <-> bf16/f16 conversions */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- element types and reductions -------------------------------------------------------- */

/* Element types of collective calls. The first three are the tensor dtypes of runtime/tensor.h with the
 * same values, so a tensor's dtype converts with a cast: (mt_coll_dtype_t)t->dtype. */
typedef enum {
    MT_COLL_F32 = MT_F32,
    MT_COLL_BF16 = MT_BF16, /* bfloat16: the top 16 bits of an f32 */
    MT_COLL_F16 = MT_F16,   /* IEEE binary16 */
    MT_COLL_F64 = MT_DTYPE_COUNT,
    MT_COLL_I32,
    MT_COLL_I64,
    MT_COLL_U8,
    MT_COLL_DTYPE_COUNT
} mt_coll_dtype_t;

/* Reductions. Floating types accumulate in f32 (f16, bf16: MPI backend: every pairwise combine is done
 * in f32 and rounded once; NCCL backend: NCCL's own arithmetic) or in their own type (f32, f64). AVG is
 * the SUM divided by the group size in the accumulation type, rounded once (f16/bf16: the sum arrives
 * rounded to 16 bits, then sum/n is computed in f32 and rounded; integers: C division, truncating toward
 * zero). PROD/MAX/MIN of u8 wrap / compare as unsigned. */
typedef enum { MT_REDOP_SUM = 0, MT_REDOP_AVG, MT_REDOP_MAX, MT_REDOP_MIN, MT_REDOP_PROD, MT_REDOP_COUNT } mt_redop_t;

/* Bytes per element (0 for an invalid dtype). */
size_t mt_coll_dtype_size(mt_coll_dtype_t dtype);
/* "f32", "f64", "f16", "bf16", "i32", "i64", "u8"; "?" if invalid. */
const char *mt_coll_dtype_name(mt_coll_dtype_t dtype);
/* "sum", "avg", "max", "min", "prod"; "?" if invalid. */
const char *mt_redop_name(mt_redop_t op);
/* Parse the names above (case-insensitive; "float32"/"float"/"half"/"bfloat16"/"int32"... too).
 * Return false for anything else. */
bool mt_coll_dtype_parse(const char *s, mt_coll_dtype_t *out);
bool mt_redop_parse(const char *s, mt_redop_t *out);

/* Element i of a host buffer of type dtype, read as a double / written from one (f16, bf16 through f32,
 * integers by C conversion). For checking and filling buffers (benchmarks, tests), not for hot loops.
 * A dtype outside mt_coll_dtype_t is an internal error (MT_ABORT). */
double mt_coll_elem_get(const void *buf, mt_coll_dtype_t dtype, size_t i);
void mt_coll_elem_set(void *buf, mt_coll_dtype_t dtype, size_t i, double v);
/* acc combined with v by op, in double: max, min, prod; sum and avg add (avg's division is the caller's). */
double mt_redop_apply(mt_redop_t op, double acc, double v);

/* ---- communicators ------------------------------------------------------------------------ */

typedef struct mt_comm *mt_comm_t;
typedef struct mt_work *mt_work_t;

/* A CUDA stream (cudaStream_t) for device-memory communicators; NULL (the default stream) or ignored
 * for host-memory ones. Kept as void * so CPU-only code never sees CUDA types. */
typedef void *mt_stream_t;

/* Where the buffers of a communicator's calls live; it decides the backend. */
typedef enum { MT_COMM_MEM_HOST = 0, MT_COMM_MEM_DEVICE = 1 } mt_comm_mem_t;

typedef struct {
    size_t size;          /* = sizeof(mt_comm_params_t); lets the struct grow */
    const char *name;     /* shown in logs and errors ("tp", "dp", "world"); copied; NULL = "comm" */
    mt_comm_mem_t memory; /* host (mpi, shm backends) or device (nccl, staged backends) buffers */
    const char *backend;  /* NULL = by priority; "mpi", "shm", "nccl", "staged", "self" force one (as
                           * MESHTRAIN_COLL_BACKEND) */
    double timeout_s;     /* default timeout of mt_work_wait(w, -1); <= 0: MESHTRAIN_COLL_TIMEOUT (s) */
} mt_comm_params_t;

#define MT_COMM_PARAMS_INIT                                                                                            \
    { sizeof(mt_comm_params_t), NULL, MT_COMM_MEM_HOST, NULL, 0.0 }

/* Creates a communicator over all ranks of parent (which may already be a group communicator):
 * collective over parent; parent is duplicated, the caller keeps ownership of it. params may be NULL
 * (defaults). Backend choice: each backend's query() probes (and may disqualify itself with a logged
 * reason), the highest priority wins, MESHTRAIN_COLL_BACKEND or params->backend force one; the choice is
 * logged once at INFO(COLL). A forced backend that disqualifies itself is MT_ERR_INVALID_USAGE.
 * Errors: MT_ERR_INVALID_ARG, MT_ERR_MPI, MT_ERR_NCCL, MT_ERR_CUDA, MT_ERR_OOM. */
mt_status_t mt_comm_init(MPI_Comm parent, const mt_comm_params_t *params, mt_comm_t *out);

/* Creates the communicator of the group made of the given ranks of world (n ranks, in the order
 * given: the new rank of ranks[i] is i). Collective over the listed ranks ONLY (MPI_Comm_create_group):
 * ranks outside the group do not call it, so a rank creates only the communicators it belongs to.
 * The calling rank must be in ranks, ranks must be distinct and in [0, size(world)), else
 * MT_ERR_INVALID_ARG. */
mt_status_t mt_comm_init_ranks(MPI_Comm world, const int *ranks, int n, const mt_comm_params_t *params, mt_comm_t *out);

struct mt_mesh;
/* This rank's group communicator along the axes in axes_mask (MT_AXIS_BIT(MT_AXIS_TP) | ...) of the
 * mesh (runtime/mesh.h), over world (whose size must equal the mesh's world and whose rank numbers are
 * the mesh's). Collective over the members of that group only. params->name NULL: named after the
 * axes ("tp", "dp-pp"). */
mt_status_t mt_comm_init_mesh(MPI_Comm world, const struct mt_mesh *mesh, unsigned axes_mask,
                              const mt_comm_params_t *params, mt_comm_t *out);

/* Waits (up to the comm's timeout) for outstanding work, frees the backends and the communicator.
 * NULL is a no-op. Not collective for MPI beyond MPI_Comm_free's rules. Returns the first error
 * seen (the comm is freed regardless, except on MT_ERR_TIMEOUT, where it is leaked because work
 * still runs on it: call mt_comm_abort). */
mt_status_t mt_comm_free(mt_comm_t comm);

/* Where a host communicator's ranks sit, for sizing it without creating it (the planner). */
typedef struct {
    int size;            /* ranks of the comm */
    int local_size;      /* of them on this rank's node (1..size) */
    int local_rank;      /* this rank among them, by comm rank (0: it holds the segment's header) */
    int max_local_size;  /* the most ranks of the comm any node holds */
    int n_nodes;         /* nodes the comm spans */
    bool oversubscribed; /* some rank on this node has fewer CPUs than local_size (mt_shm_init's test) */
} mt_coll_host_place_t;

/* The host bytes (MT_MEM_COMM) the shared-memory backend accounts on this rank for a host communicator
 * placed as *pl and created with params (NULL: defaults), over what an MPI-only communicator holds: its
 * context, node map, its own MPI context, and (local_size > 1) the mt_shm_t and this rank's share of the
 * segment, plus the leaders' MPI context on local rank 0 of a comm spanning nodes. The same functions size
 * the real allocations (shm_seg.c, shm_backend.c). 0 when the shm backend will not serve the comm: a
 * 1-rank comm, MESHTRAIN_COLL_ALGO=mpi, or another backend forced (params->backend or
 * MESHTRAIN_COLL_BACKEND). Reads MESHTRAIN_COLL_ALGO, MESHTRAIN_SHM_CHUNK as the backend does;
 * MT_ERR_INVALID_ARG for a bad MESHTRAIN_COLL_ALGO or placement. Pure: no MPI, no allocation. */
mt_status_t mt_coll_shm_plan_bytes(const mt_coll_host_place_t *pl, const mt_comm_params_t *params, int64_t *bytes);

int mt_comm_rank(const mt_comm_t comm);
int mt_comm_size(const mt_comm_t comm);
const char *mt_comm_name(const mt_comm_t comm);
/* The MPI communicator the comm's MPI traffic runs on (owned by the comm; do not free). Calling MPI on
 * it while the comm has asynchronous work outstanding is the caller's problem. */
MPI_Comm mt_comm_mpi(const mt_comm_t comm);
/* Name of the backend chosen for op kind "all_reduce" (other ops may fall through to others). */
const char *mt_comm_backend_name(const mt_comm_t comm);
/* World rank (in the communicator the comm was made from) of group rank r. */
int mt_comm_parent_rank(const mt_comm_t comm, int r);

/* Sequence numbers: every call on a comm (each collective, each send/recv outside a group, each
 * group_end, barrier) takes the next number, starting at 1. issued = the last number handed out;
 * completed = the highest n such that all calls 1..n are complete. A watchdog seeing completed <
 * issued for too long has found a hang, and the numbers say which call. Thread-safe reads. */
uint64_t mt_comm_seq_issued(const mt_comm_t comm);
uint64_t mt_comm_seq_completed(const mt_comm_t comm);

/* An error the comm hit asynchronously (a failed asynchronous call, NCCL's async error); MT_OK if none.
 * Sticky: once set, later calls on the comm return it. */
mt_status_t mt_comm_get_async_error(mt_comm_t comm);
/* Text of the last error recorded on this comm ("" if none). */
const char *mt_comm_last_error(const mt_comm_t comm);

/* Aborts the comm's outstanding work as far as the backend allows (ncclCommAbort; MPI: MPI_Abort on
 * the comm, which ends the job under Open MPI) and marks the comm failed. For hang recovery only. */
mt_status_t mt_comm_abort(mt_comm_t comm);

/* ---- work handles --------------------------------------------------------------------------- */

/* Waits until the call completes or timeout_s passes (< 0: the comm's default timeout; 0: just test).
 * Returns the call's status; MT_ERR_TIMEOUT (with mt_error text naming the op, comm and sequence
 * number) if it did not complete in time: the handle stays valid and may be waited on again. NCCL:
 * completion means the op finished on the device (the stream event fired). */
mt_status_t mt_work_wait(mt_work_t work, double timeout_s);
/* Non-blocking: *done = whether the call completed. Returns the call's status once done, else MT_OK. */
mt_status_t mt_work_test(mt_work_t work, bool *done);
/* Sequence number of the call. */
uint64_t mt_work_seq(const mt_work_t work);
/* Releases the handle. If the call has not completed the handle is detached: the call still runs and
 * its buffers must stay valid until mt_comm_seq_completed() passes its sequence number. NULL ok. */
void mt_work_free(mt_work_t work);

/* ---- operations ------------------------------------------------------------------------------
 * Common rules for every call below:
 * - work == NULL: synchronous. Host comms: the result is ready when the call returns (the call runs MPI
 *   directly, after any outstanding asynchronous work on the comm has finished, to keep issue order).
 *   Device comms: the op is enqueued on stream, ordered after prior work there (result ready in stream
 *   order). work != NULL: asynchronous; *work receives a handle (mt_work_wait/test/free). Buffers must
 *   not be touched until the handle completes.
 * - Calls on one comm complete in issue order, and every rank of the comm must issue the same calls
 *   in the same order (as in MPI and NCCL). A comm is not thread-safe: one thread issues on it.
 * - count is elements (not bytes); count == 0 is valid and does nothing but take a sequence number.
 * - Host comms ignore stream.
 * - Errors: MT_ERR_INVALID_ARG (bad dtype/op/root/peer, NULL buffer with count > 0, aliasing that is
 *   not one of the in-place forms), MT_ERR_INVALID_USAGE (collective inside a group, work inside a
 *   group), backend errors (MT_ERR_MPI, MT_ERR_NCCL, MT_ERR_CUDA), or the comm's sticky async error. */

/* recv[i] = op over ranks of send[i], i < count, on every rank. In place when send == recv. */
mt_status_t mt_coll_all_reduce(mt_comm_t comm, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                               mt_redop_t op, mt_stream_t stream, mt_work_t *work);

/* send holds size*count elements; rank r receives in recv (count elements) the reduction of block r
 * (send[r*count .. (r+1)*count)). count is per rank: uneven totals are the caller's padding. In place
 * when recv == send + r*count (NCCL's convention) or recv == send (the result lands in the first
 * count elements of the buffer). */
mt_status_t mt_coll_reduce_scatter(mt_comm_t comm, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                   mt_redop_t op, mt_stream_t stream, mt_work_t *work);

/* Every rank contributes count elements; recv (size*count elements) gets rank r's at r*count. In place
 * when send == recv + r*count (NCCL's convention) or send == recv (the input is read from the first
 * count elements of recv before they are overwritten). */
mt_status_t mt_coll_all_gather(mt_comm_t comm, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                               mt_stream_t stream, mt_work_t *work);

/* recv = root's send on every rank (send is read on root only). In place when send == recv. */
mt_status_t mt_coll_broadcast(mt_comm_t comm, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                              int root, mt_stream_t stream, mt_work_t *work);

/* recv on root = op over ranks of send (recv is not touched on other ranks and may be NULL there). In
 * place when send == recv. */
mt_status_t mt_coll_reduce(mt_comm_t comm, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                           mt_redop_t op, int root, mt_stream_t stream, mt_work_t *work);

/* send and recv hold size*count elements; block j of send goes to rank j, which stores it as block r
 * of recv (r = sender). In place when send == recv. */
mt_status_t mt_coll_all_to_all(mt_comm_t comm, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                               mt_stream_t stream, mt_work_t *work);

/* Point-to-point to / from group rank peer (peer == own rank: matched with a recv from self, only
 * inside a group). Outside a group each is its own synchronous or asynchronous call; inside
 * mt_coll_group_start/end they are batched (posted together, completed together at group_end, in any
 * order between peers, so exchanges cannot deadlock) and work must be NULL. Messages between two
 * ranks on a comm match in issue order. */
mt_status_t mt_coll_send(mt_comm_t comm, const void *buf, size_t count, mt_coll_dtype_t dtype, int peer,
                         mt_stream_t stream, mt_work_t *work);
mt_status_t mt_coll_recv(mt_comm_t comm, void *buf, size_t count, mt_coll_dtype_t dtype, int peer, mt_stream_t stream,
                         mt_work_t *work);

/* Batch point-to-point calls: between start and end only mt_coll_send/recv are allowed (others return
 * MT_ERR_INVALID_USAGE). group_end issues the batch as one call (one sequence number), synchronous
 * when work == NULL. Groups do not nest. An empty group is a valid no-op call. */
mt_status_t mt_coll_group_start(mt_comm_t comm);
mt_status_t mt_coll_group_end(mt_comm_t comm, mt_stream_t stream, mt_work_t *work);

/* Returns (or completes, asynchronously) when every rank of the comm has entered the barrier. */
mt_status_t mt_coll_barrier(mt_comm_t comm, mt_stream_t stream, mt_work_t *work);

/* ---- for benchmarks -------------------------------------------------------------------------------- */

/* The MPI datatype and reduction the MPI backend passes to MPI for (dtype, op): f16/bf16 are
 * MPI_UINT16_T with this library's user-defined ops; avg is the sum (the backend divides afterwards).
 * Lets `meshtrain bench coll --compare-raw` time the plain MPI call with identical arguments. MPI must
 * be initialised. MT_ERR_INVALID_ARG for a bad dtype/op, MT_ERR_MPI if the user ops cannot be made. */
mt_status_t mt_coll_mpi_types(mt_coll_dtype_t dtype, mt_redop_t op, MPI_Datatype *type, MPI_Op *mpi_op);

#ifdef __cplusplus
}
#endif
#endif /* MT_COLL_H */
