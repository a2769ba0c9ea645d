/* The contract between the communicator dispatcher (coll.c) and its backends (coll_nccl.c, coll_mpi.c,
 * coll_self.c): a backend is a table of functions plus a context per communicator, as in Open MPI's
 * coll framework but with about ten entries. NULL entry = this backend does not implement the op, the
 * dispatcher falls through to the next qualified backend for that op. Private to collectives/.
 * SPDX-License-Identifier: MIT */
#ifndef MT_COLL_BACKEND_H
#define MT_COLL_BACKEND_H

#include <pthread.h>

#include "collectives/coll.h"

#define MT_COLL_API_VERSION 1

/* What a backend's query() sees about the communicator being created. */
struct mt_comm_info {
    int rank, size;
    mt_comm_mem_t memory;
    int mpi_thread_level; /* what MPI_Init_thread granted */
    const char *name;
    MPI_Comm mpi; /* the comm's own MPI communicator (a duplicate) */
};

/* Kinds of calls; also the index of the per-op backend resolution table. */
typedef enum {
    MT_COLL_ALL_REDUCE = 0,
    MT_COLL_REDUCE_SCATTER,
    MT_COLL_ALL_GATHER,
    MT_COLL_BROADCAST,
    MT_COLL_REDUCE,
    MT_COLL_ALL_TO_ALL,
    MT_COLL_SEND,
    MT_COLL_RECV,
    MT_COLL_BARRIER,
    MT_COLL_GROUP, /* a batch of send/recv closed by group_end */
    MT_COLL_KIND_COUNT
} mt_coll_kind_t;

const char *mt_coll_kind_name(mt_coll_kind_t kind);

/* Every op has the shape (ctx, buffers, count, dtype, op|root|peer, stream) and the semantics of the
 * public call in coll.h (count per rank for reduce_scatter / all_gather / all_to_all; in-place forms
 * included). Host backends return when the op is complete; stream-ordered backends (NCCL) when it is
 * enqueued on stream. Arguments are already validated by the dispatcher. */
struct mt_coll_backend {
    const char *name;
    int api_version;     /* = MT_COLL_API_VERSION */
    bool stream_ordered; /* ops are enqueued on a stream: completion is tracked with events (below) */

    /* *priority >= 0: usable (highest wins); -1: disqualified (the backend logs why at INFO(COLL) and
     * writes the reason with mt_error so a forced choice can report it). */
    mt_status_t (*query)(const struct mt_comm_info *info, int *priority);
    mt_status_t (*init)(mt_comm_t comm, const struct mt_comm_info *info, void **ctx);
    void (*free)(void *ctx);

    mt_status_t (*all_reduce)(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                              mt_redop_t op, mt_stream_t stream);
    mt_status_t (*reduce_scatter)(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                  mt_redop_t op, mt_stream_t stream);
    mt_status_t (*all_gather)(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                              mt_stream_t stream);
    mt_status_t (*broadcast)(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype, int root,
                             mt_stream_t stream);
    mt_status_t (*reduce)(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype, mt_redop_t op,
                          int root, mt_stream_t stream);
    mt_status_t (*all_to_all)(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                              mt_stream_t stream);
    mt_status_t (*send)(void *ctx, const void *buf, size_t count, mt_coll_dtype_t dtype, int peer, mt_stream_t stream);
    mt_status_t (*recv)(void *ctx, void *buf, size_t count, mt_coll_dtype_t dtype, int peer, mt_stream_t stream);
    /* Between group_start and group_end, send/recv only post; group_end completes (host) or enqueues
     * (stream-ordered) all of them. NULL = no-op (only valid for backends whose send/recv never block). */
    mt_status_t (*group_start)(void *ctx);
    mt_status_t (*group_end)(void *ctx, mt_stream_t stream);
    mt_status_t (*barrier)(void *ctx, mt_stream_t stream);

    /* Stream-ordered backends only: an event after everything enqueued so far on stream; query it
     * (*done; an error status if the backend failed asynchronously); release it. */
    mt_status_t (*event_record)(void *ctx, mt_stream_t stream, void **event);
    mt_status_t (*event_query)(void *ctx, void *event, bool *done);
    void (*event_free)(void *ctx, void *event);

    mt_status_t (*get_async_error)(void *ctx); /* NULL: never fails asynchronously */
    mt_status_t (*abort)(void *ctx);           /* NULL: nothing to abort beyond the MPI comm */
};

extern const struct mt_coll_backend mt_coll_backend_self;
extern const struct mt_coll_backend mt_coll_backend_mpi;
extern const struct mt_coll_backend mt_coll_backend_shm; /* shm_backend.c */
#if MT_HAVE_NCCL
extern const struct mt_coll_backend mt_coll_backend_nccl;
#endif
#if MT_HAVE_COLL_STAGED
extern const struct mt_coll_backend mt_coll_backend_staged; /* coll_staged.c: device memory through MPI */
/* MT_OK for cudaSuccess (err), else the CUDA error as MT_ERR_CUDA naming the call what at file:line. */
mt_status_t mt_coll_cuda_status(int err, const char *what, const char *file, int line);
#endif

/* ---- helpers shared by the backends --------------------------------------------------------- */

/* The backend params->backend or MESHTRAIN_COLL_BACKEND forces ("mpi", "shm", ...), or NULL (coll.c). */
const char *mt_coll_forced_backend(const mt_comm_params_t *params);
/* The accounted bytes of one MPI backend context as mpi_init allocates it (coll_mpi.c). */
size_t mt_coll_mpi_ctx_bytes(void);

/* The 1-rank result of each collective on host memory: a copy (memmove when the in-place form
 * overlaps) or nothing. All reductions of one rank's data are the data itself (avg divides by 1). */
void mt_coll_local_copy(const void *send, void *recv, size_t bytes);

/* recv[i] = recv[i] / n in dtype's accumulation type (avg after a sum). */
void mt_coll_divide(void *buf, size_t count, mt_coll_dtype_t dtype, int n);

/* The comm's group size / rank, for backends that keep only the comm pointer. */
int mt_comm_rank(const mt_comm_t comm);
int mt_comm_size(const mt_comm_t comm);

#endif /* MT_COLL_BACKEND_H */
