/* The shared-memory collectives core: one segment per node-local group, mapped by every rank of the
 * group, synchronised by per-rank step counters (C11 atomics + futex) and used by chunked,
 * double-buffered all-reduce, reduce, reduce-scatter, all-gather and broadcast on host buffers.
 * It knows only an MPI communicator of ranks that share a node; the backend glue (shm_backend.c)
 * picks when to use it. Private to collectives/. Algorithms and the segment's life: docs/collectives.md.
 * SPDX-License-Identifier: MIT */
#ifndef MT_SHM_H
#define MT_SHM_H

#include <mpi.h>

#include "collectives/coll.h"

#define MT_SHM_MAX_RANKS 64 /* local ranks one segment serves (the header has one control line each) */

typedef struct mt_shm mt_shm_t;

/* How the segment is created and shared. MEMFD: memfd_create on local rank 0, peers open it through
 * /proc/<pid>/fd (it never has a name: nothing can be left behind). POSIX: shm_open + shm_unlink as soon
 * as every local rank has mapped it (a name exists only during mt_shm_init). AUTO: MEMFD, else POSIX. */
typedef enum { MT_SHM_METHOD_AUTO = 0, MT_SHM_METHOD_MEMFD, MT_SHM_METHOD_POSIX } mt_shm_method_t;

typedef struct {
    const char *name;                     /* comm name for messages and the segment's name */
    size_t chunk_bytes;                   /* bytes per rank per pipeline round (rounded to 4 KiB); 0: 512 KiB,
                                             or 2 MiB where the node has more local ranks than CPUs */
    double timeout_s;                     /* every wait fails with MT_ERR_TIMEOUT after this long */
    double spin_us;                       /* busy-poll this long before yielding; < 0: decide (oversubscription) */
    double yield_us;                      /* then sched_yield() this long before sleeping on a futex; < 0:
                                             2 ms, or 20 ms where the node has more local ranks than CPUs */
    mt_shm_method_t method;
    const _Atomic uint64_t *seq_completed; /* the comm's counter: the running call is *seq_completed + 1 (or NULL) */
    const int *group_ranks;               /* local rank -> rank in the comm (for messages; NULL: identity) */
} mt_shm_params_t;

/* The segment's sizing, used by mt_shm_init and by the planner (through mt_coll_shm_plan_bytes), so a
 * plan's figure is the allocation's own. Chunk: chunk_param (MESHTRAIN_SHM_CHUNK; 0 = default: 512 KiB, or
 * 2 MiB when oversubscribed, i.e. some local rank has fewer CPUs than the group has ranks), at least one
 * page, rounded up to pages. Rank bytes: what local rank `rank` of an n-rank group accounts under
 * MT_MEM_COMM for the mapping (its slot of 4 x chunk; local rank 0 also the page-rounded header); 0 when
 * n < 2 (no segment). Ctx bytes: the accounted size of the mt_shm_t each rank allocates. */
size_t mt_shm_chunk_bytes(size_t chunk_param, bool oversubscribed);
size_t mt_shm_rank_bytes(int n, int rank, size_t chunk);
size_t mt_shm_ctx_bytes(void);

/* Creates and maps the segment of the ranks of local (all on one node, at most MT_SHM_MAX_RANKS):
 * collective over local. On failure every rank returns the same error status (the ranks agree through
 * local), with the reason in mt_last_error_msg(), and nothing is left mapped or named. */
mt_status_t mt_shm_init(MPI_Comm local, const mt_shm_params_t *params, mt_shm_t **out);

/* Unmaps and frees (not collective; the kernel frees the memory when the last rank unmaps). NULL ok. */
void mt_shm_free(mt_shm_t *s);

int mt_shm_rank(const mt_shm_t *s);
int mt_shm_size(const mt_shm_t *s);
/* "memfd" or "posix": how the segment was shared. */
const char *mt_shm_method_name(const mt_shm_t *s);
/* Bytes of the segment (header + slots). */
size_t mt_shm_bytes(const mt_shm_t *s);

/* The collectives, with the semantics and in-place forms of the public calls in coll.h, over the
 * local group. count == 0 returns at once. Results are the same on every rank and do not depend on the
 * chunk size: each element is reduced by one rank, over ranks in order 0..n-1, in the accumulation type
 * (f16/bf16 in f32 rounded once at the end, f32/f64 in their own type, integers wrapping). AVG divides
 * the sum, rounded to the dtype, by n in the accumulation type (integers: truncating), as coll.h says.
 * Errors: MT_ERR_TIMEOUT (a peer did not reach a step in timeout_s), MT_ERR_REMOTE (a peer died or
 * failed), MT_ERR_INVALID_USAGE (the ranks issued different calls); the message names the comm, the
 * local and comm rank, the op and the call's sequence number. After any error the segment is failed:
 * every later call (here and on the peers) returns MT_ERR_REMOTE. */
mt_status_t mt_shm_all_reduce(mt_shm_t *s, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                              mt_redop_t op);
/* recv on root only (ignored elsewhere, may be NULL). */
mt_status_t mt_shm_reduce(mt_shm_t *s, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype, mt_redop_t op,
                          int root);
mt_status_t mt_shm_reduce_scatter(mt_shm_t *s, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                  mt_redop_t op);
mt_status_t mt_shm_all_gather(mt_shm_t *s, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype);
/* send is read on root only; root's recv gets a copy too (nothing when send == recv). */
mt_status_t mt_shm_broadcast(mt_shm_t *s, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype, int root);
mt_status_t mt_shm_barrier(mt_shm_t *s);

/* ---- the backend (shm_backend.c) ------------------------------------------------------------------ */

/* What the shm backend decided for comm: whether shared memory serves calls, how many nodes the comm
 * spans and how many of its ranks share this node. MT_ERR_INVALID_ARG if comm's all-reduce is not served
 * by the shm backend. For tests and diagnostics. */
mt_status_t mt_coll_shm_info(mt_comm_t comm, bool *active, int *n_nodes, int *local_size);

/* ---- reduction kernels (shm_reduce.c) ------------------------------------------------------------ */

/* out[i] = op over r = 0..n-1 of in[r][i] (rank order), accumulated as described above; avg divides by
 * div (pass the group size; 1 for no division). out must not overlap any in[r]. */
void mt_shm_reduce_kernel(void *restrict out, const void *const *in, int n, size_t count, mt_coll_dtype_t dtype,
                          mt_redop_t op, int div);

/* The 16-bit conversions the kernels use (branch-free so they vectorise), exported for the tests that
 * check them bit for bit against mt_f16_to_f32 & co. */
float mt_shm_f16_to_f32(uint16_t h);
uint16_t mt_shm_f32_to_f16(float f);
float mt_shm_bf16_to_f32(uint16_t h);
uint16_t mt_shm_f32_to_bf16(float f);

#endif /* MT_SHM_H */
