/* Bodies of the opaque communicator and work handle, and the call descriptor the dispatcher queues.
 * Private to collectives/ (coll.c, coll_ops.c and the backends).
 * SPDX-License-Identifier: MIT */
#ifndef MT_COLL_IMPL_H
#define MT_COLL_IMPL_H

#include <pthread.h>

#include "collectives/coll_backend.h"
#include "runtime/watchdog.h"

#define MT_COLL_EVENT_RING 1024 /* stream-ordered comms: calls in flight before the host waits */

/* One call, as queued for the progress thread. For point-to-point, root is the peer. */
struct mt_coll_call {
    mt_coll_kind_t kind;
    const void *send;
    void *recv;
    size_t count;
    mt_coll_dtype_t dtype;
    mt_redop_t op;
    int root;
    mt_stream_t stream;
    struct mt_coll_call *group; /* MT_COLL_GROUP: the batched send/recv calls */
    int n_group;
};

struct mt_comm_backend_slot {
    const struct mt_coll_backend *be;
    void *ctx;
    int priority;
    bool inited;
};

struct mt_comm_event {
    uint64_t seq;
    void *event;
};

struct mt_work {
    struct mt_comm *comm;
    uint64_t seq;
    struct mt_coll_call call;
    _Atomic int done;
    mt_status_t status;
    bool detached;
    char err[512];
    struct mt_work *next;
};

struct mt_comm {
    char name[64];
    int rank, size;
    mt_comm_mem_t memory;
    double timeout_s;
    int thread_level;
    MPI_Comm mpi;      /* owned duplicate / group communicator */
    int *parent_ranks; /* group rank -> rank in the communicator it was made from */

    struct mt_comm_backend_slot backends[4]; /* qualified backends, by priority */
    int n_backends;
    struct mt_comm_backend_slot ops[MT_COLL_KIND_COUNT]; /* per call kind: first backend implementing it */
    bool stream_ordered;

    _Atomic uint64_t seq_issued, seq_completed;
    mt_wd_group_t wd; /* registration with the hang watchdog (runtime/watchdog.h); NULL: not watched */
    _Atomic int async_error; /* mt_status_t, sticky */
    char last_error[512];

    /* point-to-point batching between group_start and group_end */
    bool in_group;
    struct mt_coll_call *group_ops;
    int n_group_ops, cap_group_ops;

    /* host backends: the progress thread and its FIFO of asynchronous calls */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    pthread_t thread;
    bool thread_started, stop;
    struct mt_work *q_head, *q_tail;
    _Atomic int n_pending;

    /* stream-ordered backends: events of calls not yet seen complete, oldest at ev_head */
    struct mt_comm_event *events;
    uint64_t ev_head, ev_tail;
};

/* Issues a validated call (coll.c). */
mt_status_t mt_coll_issue(mt_comm_t c, const struct mt_coll_call *call, mt_work_t *work);

/* MPI return code -> status with MPI's message (MT_OK for MPI_SUCCESS). */
mt_status_t mt_coll_mpi_status(int rc, const char *what);

#endif /* MT_COLL_IMPL_H */
