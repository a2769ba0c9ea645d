/* The public entry points of every collective and point-to-point call: argument validation (cheap,
 * before anything is issued, so every rank fails the same way on the same bad call) and hand-off to the
 * dispatcher. Batching of send/recv between group_start and group_end also lives here.
 * SPDX-License-Identifier: MIT */
#include <limits.h>
#include <string.h>

#include "collectives/coll_impl.h"
#include "runtime/alloc.h"

mt_status_t mt_coll_mpi_status(int rc, const char *what) {
    if (rc == MPI_SUCCESS) {
        return MT_OK;
    }
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return mt_foreign_error("MPI", MT_ERR_MPI, rc, msg, what, __FILE__, __LINE__);
}

/* Do [a, a+na) and [b, b+nb) overlap? */
static inline bool overlap(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

static mt_status_t check_common(mt_comm_t c, const char *fn, size_t count, mt_coll_dtype_t dtype, size_t total) {
    if (!c) {
        return mt_error(MT_ERR_INVALID_ARG, "%s: NULL communicator", fn);
    }
    if ((unsigned)dtype >= MT_COLL_DTYPE_COUNT) {
        return mt_error(MT_ERR_INVALID_ARG, "%s on comm %s: invalid dtype %d", fn, c->name, (int)dtype);
    }
    /* MPI counts are int; NCCL's are size_t, and the staged backend's pieces keep each of its MPI calls small */
    const char *be = c->ops[MT_COLL_ALL_REDUCE].be->name;
    bool int_counts = c->memory != MT_COMM_MEM_DEVICE || (strcmp(be, "nccl") != 0 && strcmp(be, "staged") != 0);
    if (int_counts && (total > (size_t)INT_MAX || count > (size_t)INT_MAX)) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "%s on comm %s: %zu elements exceed INT_MAX (MPI counts are int): "
                        "split the call",
                        fn, c->name, total);
    }
    if (c->in_group) {
        return mt_error(MT_ERR_INVALID_USAGE,
                        "%s on comm %s inside mt_coll_group_start/end: only send/recv may be "
                        "batched",
                        fn, c->name);
    }
    return MT_OK;
}

static mt_status_t check_op(mt_comm_t c, const char *fn, mt_redop_t op) {
    if ((unsigned)op >= MT_REDOP_COUNT) {
        return mt_error(MT_ERR_INVALID_ARG, "%s on comm %s: invalid reduction %d", fn, c->name, (int)op);
    }
    return MT_OK;
}

static mt_status_t check_bufs(mt_comm_t c, const char *fn, const void *send, size_t send_bytes, const void *recv,
                              size_t recv_bytes) {
    if ((send_bytes && !send) || (recv_bytes && !recv)) {
        return mt_error(MT_ERR_INVALID_ARG, "%s on comm %s: NULL buffer with a non-zero count", fn, c->name);
    }
    return MT_OK;
}

static mt_status_t check_root(mt_comm_t c, const char *fn, int root, const char *what) {
    if (root < 0 || root >= c->size) {
        return mt_error(MT_ERR_INVALID_ARG, "%s on comm %s: %s %d outside the group of %d ranks", fn, c->name, what,
                        root, c->size);
    }
    return MT_OK;
}

static mt_status_t not_aliased(mt_comm_t c, const char *fn, const void *send, size_t sb, const void *recv, size_t rb) {
    if (send != recv && overlap(send, sb, recv, rb)) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "%s on comm %s: send and recv overlap without being one of the in-place "
                        "forms (see collectives/coll.h)",
                        fn, c->name);
    }
    return MT_OK;
}

mt_status_t mt_coll_all_reduce(mt_comm_t comm, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                               mt_redop_t op, mt_stream_t stream, mt_work_t *work) {
    static const char fn[] = "mt_coll_all_reduce";
    MT_CHECK(check_common(comm, fn, count, dtype, count));
    MT_CHECK(check_op(comm, fn, op));
    size_t b = count * mt_coll_dtype_size(dtype);
    MT_CHECK(check_bufs(comm, fn, send, b, recv, b));
    MT_CHECK(not_aliased(comm, fn, send, b, recv, b));
    struct mt_coll_call a = {MT_COLL_ALL_REDUCE, send, recv, count, dtype, op, 0, stream, NULL, 0};
    return mt_coll_issue(comm, &a, work);
}

mt_status_t mt_coll_reduce_scatter(mt_comm_t comm, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                   mt_redop_t op, mt_stream_t stream, mt_work_t *work) {
    static const char fn[] = "mt_coll_reduce_scatter";
    MT_CHECK(check_common(comm, fn, count, dtype, count * (size_t)(comm ? comm->size : 1)));
    MT_CHECK(check_op(comm, fn, op));
    size_t b = count * mt_coll_dtype_size(dtype);
    MT_CHECK(check_bufs(comm, fn, send, b * (size_t)comm->size, recv, b));
    if (recv != (const char *)send + b * (size_t)comm->rank) {
        MT_CHECK(not_aliased(comm, fn, send, b * (size_t)comm->size, recv, b));
    }
    struct mt_coll_call a = {MT_COLL_REDUCE_SCATTER, send, recv, count, dtype, op, 0, stream, NULL, 0};
    return mt_coll_issue(comm, &a, work);
}

mt_status_t mt_coll_all_gather(mt_comm_t comm, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                               mt_stream_t stream, mt_work_t *work) {
    static const char fn[] = "mt_coll_all_gather";
    MT_CHECK(check_common(comm, fn, count, dtype, count * (size_t)(comm ? comm->size : 1)));
    size_t b = count * mt_coll_dtype_size(dtype);
    MT_CHECK(check_bufs(comm, fn, send, b, recv, b * (size_t)comm->size));
    if (send != (const char *)recv + b * (size_t)comm->rank) {
        MT_CHECK(not_aliased(comm, fn, send, b, recv, b * (size_t)comm->size));
    }
    struct mt_coll_call a = {MT_COLL_ALL_GATHER, send, recv, count, dtype, 0, 0, stream, NULL, 0};
    return mt_coll_issue(comm, &a, work);
}

mt_status_t mt_coll_broadcast(mt_comm_t comm, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                              int root, mt_stream_t stream, mt_work_t *work) {
    static const char fn[] = "mt_coll_broadcast";
    MT_CHECK(check_common(comm, fn, count, dtype, count));
    MT_CHECK(check_root(comm, fn, root, "root"));
    size_t b = count * mt_coll_dtype_size(dtype);
    MT_CHECK(check_bufs(comm, fn, comm->rank == root ? send : recv, b, recv, b));
    if (comm->rank == root) {
        MT_CHECK(not_aliased(comm, fn, send, b, recv, b));
    }
    struct mt_coll_call a = {MT_COLL_BROADCAST, send, recv, count, dtype, 0, root, stream, NULL, 0};
    return mt_coll_issue(comm, &a, work);
}

mt_status_t mt_coll_reduce(mt_comm_t comm, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                           mt_redop_t op, int root, mt_stream_t stream, mt_work_t *work) {
    static const char fn[] = "mt_coll_reduce";
    MT_CHECK(check_common(comm, fn, count, dtype, count));
    MT_CHECK(check_op(comm, fn, op));
    MT_CHECK(check_root(comm, fn, root, "root"));
    size_t b = count * mt_coll_dtype_size(dtype);
    MT_CHECK(check_bufs(comm, fn, send, b, recv, comm->rank == root ? b : 0));
    if (comm->rank == root) {
        MT_CHECK(not_aliased(comm, fn, send, b, recv, b));
    }
    struct mt_coll_call a = {MT_COLL_REDUCE, send, recv, count, dtype, op, root, stream, NULL, 0};
    return mt_coll_issue(comm, &a, work);
}

mt_status_t mt_coll_all_to_all(mt_comm_t comm, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                               mt_stream_t stream, mt_work_t *work) {
    static const char fn[] = "mt_coll_all_to_all";
    MT_CHECK(check_common(comm, fn, count, dtype, count * (size_t)(comm ? comm->size : 1)));
    size_t b = count * mt_coll_dtype_size(dtype) * (size_t)comm->size;
    MT_CHECK(check_bufs(comm, fn, send, b, recv, b));
    MT_CHECK(not_aliased(comm, fn, send, b, recv, b));
    struct mt_coll_call a = {MT_COLL_ALL_TO_ALL, send, recv, count, dtype, 0, 0, stream, NULL, 0};
    return mt_coll_issue(comm, &a, work);
}

mt_status_t mt_coll_barrier(mt_comm_t comm, mt_stream_t stream, mt_work_t *work) {
    MT_CHECK(check_common(comm, "mt_coll_barrier", 0, MT_COLL_U8, 0));
    struct mt_coll_call a = {MT_COLL_BARRIER, NULL, NULL, 0, MT_COLL_U8, 0, 0, stream, NULL, 0};
    return mt_coll_issue(comm, &a, work);
}

/* ---- point-to-point and groups -------------------------------------------------------------------- */

static mt_status_t p2p(mt_comm_t comm, mt_coll_kind_t kind, const void *sbuf, void *rbuf, size_t count,
                       mt_coll_dtype_t dtype, int peer, mt_stream_t stream, mt_work_t *work) {
    const char *fn = kind == MT_COLL_SEND ? "mt_coll_send" : "mt_coll_recv";
    if (!comm) {
        return mt_error(MT_ERR_INVALID_ARG, "%s: NULL communicator", fn);
    }
    if ((unsigned)dtype >= MT_COLL_DTYPE_COUNT) {
        return mt_error(MT_ERR_INVALID_ARG, "%s on comm %s: invalid dtype %d", fn, comm->name, (int)dtype);
    }
    if (count > (size_t)INT_MAX) {
        return mt_error(MT_ERR_INVALID_ARG, "%s on comm %s: %zu elements exceed INT_MAX: split the call", fn,
                        comm->name, count);
    }
    MT_CHECK(check_root(comm, fn, peer, "peer"));
    size_t b = count * mt_coll_dtype_size(dtype);
    MT_CHECK(check_bufs(comm, fn, sbuf, kind == MT_COLL_SEND ? b : 0, rbuf, kind == MT_COLL_RECV ? b : 0));
    struct mt_coll_call a = {kind, sbuf, rbuf, count, dtype, 0, peer, stream, NULL, 0};
    if (!comm->in_group) {
        if (peer == comm->rank) {
            return mt_error(MT_ERR_INVALID_USAGE,
                            "%s on comm %s: to/from itself outside a group would never "
                            "complete; wrap the send and the recv in mt_coll_group_start/end",
                            fn, comm->name);
        }
        return mt_coll_issue(comm, &a, work);
    }
    if (work) {
        return mt_error(MT_ERR_INVALID_USAGE,
                        "%s on comm %s inside a group: pass work == NULL and take the "
                        "handle from mt_coll_group_end",
                        fn, comm->name);
    }
    if (comm->n_group_ops == comm->cap_group_ops) {
        int cap = comm->cap_group_ops ? 2 * comm->cap_group_ops : 16;
        struct mt_coll_call *g = mt_alloc(sizeof(*g) * (size_t)cap, MT_MEM_COMM, "mt_comm group");
        if (!g) {
            return mt_error(MT_ERR_OOM, "%s on comm %s: cannot grow the group's list", fn, comm->name);
        }
        if (comm->n_group_ops) {
            memcpy(g, comm->group_ops, sizeof(*g) * (size_t)comm->n_group_ops);
        }
        mt_free(comm->group_ops);
        comm->group_ops = g;
        comm->cap_group_ops = cap;
    }
    comm->group_ops[comm->n_group_ops++] = a;
    return MT_OK;
}

mt_status_t mt_coll_send(mt_comm_t comm, const void *buf, size_t count, mt_coll_dtype_t dtype, int peer,
                         mt_stream_t stream, mt_work_t *work) {
    return p2p(comm, MT_COLL_SEND, buf, NULL, count, dtype, peer, stream, work);
}

mt_status_t mt_coll_recv(mt_comm_t comm, void *buf, size_t count, mt_coll_dtype_t dtype, int peer, mt_stream_t stream,
                         mt_work_t *work) {
    return p2p(comm, MT_COLL_RECV, NULL, buf, count, dtype, peer, stream, work);
}

mt_status_t mt_coll_group_start(mt_comm_t comm) {
    if (!comm) {
        return mt_error(MT_ERR_INVALID_ARG, "mt_coll_group_start: NULL communicator");
    }
    if (comm->in_group) {
        return mt_error(MT_ERR_INVALID_USAGE, "mt_coll_group_start on comm %s: groups do not nest", comm->name);
    }
    comm->in_group = true;
    comm->n_group_ops = 0;
    return MT_OK;
}

mt_status_t mt_coll_group_end(mt_comm_t comm, mt_stream_t stream, mt_work_t *work) {
    if (!comm) {
        return mt_error(MT_ERR_INVALID_ARG, "mt_coll_group_end: NULL communicator");
    }
    if (!comm->in_group) {
        return mt_error(MT_ERR_INVALID_USAGE, "mt_coll_group_end on comm %s without mt_coll_group_start", comm->name);
    }
    comm->in_group = false;
    struct mt_coll_call a = {MT_COLL_GROUP,    NULL, NULL, 0, MT_COLL_U8, 0, 0, stream, comm->group_ops,
                             comm->n_group_ops};
    return mt_coll_issue(comm, &a, work);
}
