/* The MPI backend (host memory): each op is one call of MPI's own collective on the comm's duplicate
 * communicator, with MPI_IN_PLACE for the in-place forms, user-defined ops for f16/bf16 and a division
 * pass for avg. Kept thin on purpose: a synchronous call costs one table lookup over the raw MPI call.
 * Point-to-point in a group is MPI_Isend/Irecv completed by one MPI_Waitall at group end.
 * SPDX-License-Identifier: MIT */
#include <string.h>

#include "collectives/coll_impl.h"
#include "collectives/coll_mpi.h"
#include "runtime/alloc.h"

struct mpi_ctx {
    MPI_Comm comm;
    int rank, size;
    bool in_group;
    MPI_Request *reqs;
    int n_reqs, cap_reqs;
};

static MPI_Datatype mpi_type(mt_coll_dtype_t d) {
    switch (d) {
    case MT_COLL_F32:
        return MPI_FLOAT;
    case MT_COLL_F64:
        return MPI_DOUBLE;
    case MT_COLL_F16:
        return MPI_UINT16_T;
    case MT_COLL_BF16:
        return MPI_UINT16_T;
    case MT_COLL_I32:
        return MPI_INT32_T;
    case MT_COLL_I64:
        return MPI_INT64_T;
    default:
        return MPI_UINT8_T;
    }
}

static MPI_Op mpi_op_of(mt_coll_dtype_t d, mt_redop_t op) {
    if (d == MT_COLL_F16 || d == MT_COLL_BF16) {
        return mt_coll_mpi_op16(d, op);
    }
    switch (op) {
    case MT_REDOP_MAX:
        return MPI_MAX;
    case MT_REDOP_MIN:
        return MPI_MIN;
    case MT_REDOP_PROD:
        return MPI_PROD;
    default:
        return MPI_SUM; /* sum, and avg before its division */
    }
}

mt_status_t mt_coll_mpi_types(mt_coll_dtype_t dtype, mt_redop_t op, MPI_Datatype *type, MPI_Op *mpi_op) {
    if ((unsigned)dtype >= MT_COLL_DTYPE_COUNT || (unsigned)op >= MT_REDOP_COUNT) {
        return mt_error(MT_ERR_INVALID_ARG, "mt_coll_mpi_types: invalid dtype %d or op %d", (int)dtype, (int)op);
    }
    int rc = mt_coll_mpi_redop_init();
    if (rc != MPI_SUCCESS) {
        return mt_coll_mpi_status(rc, "MPI_Op_create (f16/bf16 reductions)");
    }
    *type = mpi_type(dtype);
    *mpi_op = mpi_op_of(dtype, op);
    return MT_OK;
}

#define MPI_OK(call) mt_coll_mpi_status((call), #call)

static mt_status_t mpi_query(const struct mt_comm_info *info, int *priority) {
    *priority = -1;
    if (info->memory != MT_COMM_MEM_HOST) {
        mt_error(MT_ERR_INVALID_USAGE,
                 "mpi backend: comm %s is for device memory, which this MPI backend does not "
                 "stage; use the nccl or staged backend",
                 info->name);
        MT_INFO(MT_LOG_COLL, "comm %s: mpi backend disqualified: device memory", info->name);
        return MT_OK;
    }
    *priority = 50;
    return MT_OK;
}

size_t mt_coll_mpi_ctx_bytes(void) { return mt_alloc_accounted(sizeof(struct mpi_ctx)); }

static mt_status_t mpi_init(mt_comm_t comm, const struct mt_comm_info *info, void **ctx) {
    int rc = mt_coll_mpi_redop_init();
    if (rc != MPI_SUCCESS) {
        return mt_coll_mpi_status(rc, "MPI_Op_create (f16/bf16 reductions)");
    }
    struct mpi_ctx *m = mt_calloc(sizeof(*m), MT_MEM_COMM, "coll_mpi");
    if (!m) {
        return mt_error(MT_ERR_OOM, "mpi backend: out of memory");
    }
    m->comm = info->mpi;
    m->rank = info->rank;
    m->size = info->size;
    *ctx = m;
    return MT_OK;
}

static void mpi_free(void *ctx) {
    struct mpi_ctx *m = ctx;
    if (m) {
        mt_free(m->reqs);
        mt_free(m);
    }
}

static mt_status_t mpi_all_reduce(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                  mt_redop_t op, mt_stream_t stream) {
    struct mpi_ctx *m = ctx;
    if (m->size == 1) {
        mt_coll_local_copy(send, recv, count * mt_coll_dtype_size(dtype));
        return MT_OK;
    }
    int rc = MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, mpi_type(dtype), mpi_op_of(dtype, op),
                           m->comm);
    if (rc != MPI_SUCCESS) {
        return MPI_OK(rc);
    }
    if (op == MT_REDOP_AVG) {
        mt_coll_divide(recv, count, dtype, m->size);
    }
    return MT_OK;
}

/* In place: recv == send (result at the start) or recv == send + rank*count (moved there after). */
static mt_status_t mpi_reduce_scatter(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                      mt_redop_t op, mt_stream_t stream) {
    struct mpi_ctx *m = ctx;
    size_t bytes = count * mt_coll_dtype_size(dtype);
    if (m->size == 1) {
        mt_coll_local_copy(send, recv, bytes);
        return MT_OK;
    }
    char *own_block = (char *)send + bytes * (size_t)m->rank;
    bool in_place = recv == send || recv == own_block;
    void *out = in_place ? (void *)send : recv;
    MT_CHECK(MPI_OK(MPI_Reduce_scatter_block(in_place ? MPI_IN_PLACE : send, out, (int)count, mpi_type(dtype),
                                             mpi_op_of(dtype, op), m->comm)));
    if (in_place && recv != send) {
        memmove(recv, send, bytes); /* [0, bytes) and [rank*bytes, ...) may overlap for count 0 only */
    }
    if (op == MT_REDOP_AVG) {
        mt_coll_divide(recv, count, dtype, m->size);
    }
    return MT_OK;
}

/* In place: send == recv + rank*count (MPI_IN_PLACE's own layout) or send == recv (moved there first). */
static mt_status_t mpi_all_gather(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                  mt_stream_t stream) {
    struct mpi_ctx *m = ctx;
    size_t bytes = count * mt_coll_dtype_size(dtype);
    if (m->size == 1) {
        mt_coll_local_copy(send, recv, bytes);
        return MT_OK;
    }
    char *own_block = (char *)recv + bytes * (size_t)m->rank;
    bool in_place = send == own_block || send == recv;
    if (in_place && send != own_block) {
        memmove(own_block, send, bytes);
    }
    MPI_Datatype t = mpi_type(dtype);
    return MPI_OK(MPI_Allgather(in_place ? MPI_IN_PLACE : send, (int)count, t, recv, (int)count, t, m->comm));
}

static mt_status_t mpi_broadcast(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype, int root,
                                 mt_stream_t stream) {
    struct mpi_ctx *m = ctx;
    if (m->rank == root) {
        mt_coll_local_copy(send, recv, count * mt_coll_dtype_size(dtype));
    }
    if (m->size == 1) {
        return MT_OK;
    }
    return MPI_OK(MPI_Bcast(recv, (int)count, mpi_type(dtype), root, m->comm));
}

static mt_status_t mpi_reduce(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                              mt_redop_t op, int root, mt_stream_t stream) {
    struct mpi_ctx *m = ctx;
    if (m->size == 1) {
        mt_coll_local_copy(send, recv, count * mt_coll_dtype_size(dtype));
        return MT_OK;
    }
    const void *s = (m->rank == root && send == recv) ? MPI_IN_PLACE : send;
    MT_CHECK(MPI_OK(MPI_Reduce(s, m->rank == root ? recv : NULL, (int)count, mpi_type(dtype), mpi_op_of(dtype, op),
                               root, m->comm)));
    if (op == MT_REDOP_AVG && m->rank == root) {
        mt_coll_divide(recv, count, dtype, m->size);
    }
    return MT_OK;
}

static mt_status_t mpi_all_to_all(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                  mt_stream_t stream) {
    struct mpi_ctx *m = ctx;
    if (m->size == 1) {
        mt_coll_local_copy(send, recv, count * mt_coll_dtype_size(dtype));
        return MT_OK;
    }
    MPI_Datatype t = mpi_type(dtype);
    return MPI_OK(MPI_Alltoall(send == recv ? MPI_IN_PLACE : send, (int)count, t, recv, (int)count, t, m->comm));
}

static mt_status_t push_req(struct mpi_ctx *m, MPI_Request **slot) {
    if (m->n_reqs == m->cap_reqs) {
        int cap = m->cap_reqs ? 2 * m->cap_reqs : 16;
        MPI_Request *r = mt_alloc(sizeof(*r) * (size_t)cap, MT_MEM_COMM, "coll_mpi");
        if (!r) {
            return mt_error(MT_ERR_OOM, "mpi backend: cannot grow the group's request list");
        }
        if (m->n_reqs) {
            memcpy(r, m->reqs, sizeof(*r) * (size_t)m->n_reqs);
        }
        mt_free(m->reqs);
        m->reqs = r;
        m->cap_reqs = cap;
    }
    *slot = &m->reqs[m->n_reqs++];
    return MT_OK;
}

#define MT_COLL_P2P_TAG 0x6d74

static mt_status_t mpi_send(void *ctx, const void *buf, size_t count, mt_coll_dtype_t dtype, int peer,
                            mt_stream_t stream) {
    struct mpi_ctx *m = ctx;
    if (!m->in_group) {
        return MPI_OK(MPI_Send(buf, (int)count, mpi_type(dtype), peer, MT_COLL_P2P_TAG, m->comm));
    }
    MPI_Request *r;
    MT_CHECK(push_req(m, &r));
    int rc = MPI_Isend(buf, (int)count, mpi_type(dtype), peer, MT_COLL_P2P_TAG, m->comm, r);
    if (rc != MPI_SUCCESS) {
        m->n_reqs--;
    }
    return MPI_OK(rc);
}

static mt_status_t mpi_recv(void *ctx, void *buf, size_t count, mt_coll_dtype_t dtype, int peer, mt_stream_t stream) {
    struct mpi_ctx *m = ctx;
    if (!m->in_group) {
        return MPI_OK(MPI_Recv(buf, (int)count, mpi_type(dtype), peer, MT_COLL_P2P_TAG, m->comm, MPI_STATUS_IGNORE));
    }
    MPI_Request *r;
    MT_CHECK(push_req(m, &r));
    int rc = MPI_Irecv(buf, (int)count, mpi_type(dtype), peer, MT_COLL_P2P_TAG, m->comm, r);
    if (rc != MPI_SUCCESS) {
        m->n_reqs--;
    }
    return MPI_OK(rc);
}

static mt_status_t mpi_group_start(void *ctx) {
    struct mpi_ctx *m = ctx;
    m->in_group = true;
    m->n_reqs = 0;
    return MT_OK;
}

static mt_status_t mpi_group_end(void *ctx, mt_stream_t stream) {
    struct mpi_ctx *m = ctx;
    m->in_group = false;
    int n = m->n_reqs;
    m->n_reqs = 0;
    return n ? MPI_OK(MPI_Waitall(n, m->reqs, MPI_STATUSES_IGNORE)) : MT_OK;
}

static mt_status_t mpi_barrier(void *ctx, mt_stream_t stream) {
    struct mpi_ctx *m = ctx;
    return m->size == 1 ? MT_OK : MPI_OK(MPI_Barrier(m->comm));
}

const struct mt_coll_backend mt_coll_backend_mpi = {
    .name = "mpi",
    .api_version = MT_COLL_API_VERSION,
    .stream_ordered = false,
    .query = mpi_query,
    .init = mpi_init,
    .free = mpi_free,
    .all_reduce = mpi_all_reduce,
    .reduce_scatter = mpi_reduce_scatter,
    .all_gather = mpi_all_gather,
    .broadcast = mpi_broadcast,
    .reduce = mpi_reduce,
    .all_to_all = mpi_all_to_all,
    .send = mpi_send,
    .recv = mpi_recv,
    .group_start = mpi_group_start,
    .group_end = mpi_group_end,
    .barrier = mpi_barrier,
};
