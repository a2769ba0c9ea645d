/* The "self" backend: 1-rank groups on host memory. Every collective of one rank is a copy (or nothing
 * when in place), and a send to oneself is matched with the recv from oneself at group end. No MPI.
 * SPDX-License-Identifier: MIT */
#include <string.h>

#include "collectives/coll_backend.h"
#include "runtime/alloc.h"

#define SELF_MAX_PENDING 64

struct self_ctx {
    int n_send, n_recv;
    struct {
        const void *buf;
        size_t bytes;
    } sends[SELF_MAX_PENDING];
    struct {
        void *buf;
        size_t bytes;
    } recvs[SELF_MAX_PENDING];
};

static mt_status_t self_query(const struct mt_comm_info *info, int *priority) {
    *priority = -1;
    if (info->size != 1) {
        mt_error(MT_ERR_INVALID_USAGE, "self backend serves 1-rank groups only (comm %s has %d ranks)", info->name,
                 info->size);
        MT_INFO(MT_LOG_COLL, "comm %s: self backend disqualified: %d ranks", info->name, info->size);
        return MT_OK;
    }
    if (info->memory != MT_COMM_MEM_HOST) {
        mt_error(MT_ERR_INVALID_USAGE, "self backend serves host memory only (comm %s is for device memory)",
                 info->name);
        MT_INFO(MT_LOG_COLL, "comm %s: self backend disqualified: device memory", info->name);
        return MT_OK;
    }
    *priority = 100;
    return MT_OK;
}

static mt_status_t self_init(mt_comm_t comm, const struct mt_comm_info *info, void **ctx) {
    *ctx = mt_calloc(sizeof(struct self_ctx), MT_MEM_COMM, "coll_self");
    return *ctx ? MT_OK : mt_error(MT_ERR_OOM, "self backend: out of memory");
}

static void self_free(void *ctx) {
    mt_free(ctx);
}

static mt_status_t self_all_reduce(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                   mt_redop_t op, mt_stream_t stream) {
    mt_coll_local_copy(send, recv, count * mt_coll_dtype_size(dtype));
    return MT_OK;
}

static mt_status_t self_reduce_scatter(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                       mt_redop_t op, mt_stream_t stream) {
    mt_coll_local_copy(send, recv, count * mt_coll_dtype_size(dtype));
    return MT_OK;
}

static mt_status_t self_all_gather(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                   mt_stream_t stream) {
    mt_coll_local_copy(send, recv, count * mt_coll_dtype_size(dtype));
    return MT_OK;
}

static mt_status_t self_broadcast(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                  int root, mt_stream_t stream) {
    mt_coll_local_copy(send, recv, count * mt_coll_dtype_size(dtype));
    return MT_OK;
}

static mt_status_t self_reduce(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                               mt_redop_t op, int root, mt_stream_t stream) {
    mt_coll_local_copy(send, recv, count * mt_coll_dtype_size(dtype));
    return MT_OK;
}

static mt_status_t self_all_to_all(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                   mt_stream_t stream) {
    mt_coll_local_copy(send, recv, count * mt_coll_dtype_size(dtype));
    return MT_OK;
}

static mt_status_t self_send(void *ctx, const void *buf, size_t count, mt_coll_dtype_t dtype, int peer,
                             mt_stream_t stream) {
    struct self_ctx *s = ctx;
    if (s->n_send == SELF_MAX_PENDING) {
        return mt_error(MT_ERR_INVALID_USAGE, "self backend: more than %d sends to self in one group",
                        SELF_MAX_PENDING);
    }
    s->sends[s->n_send].buf = buf;
    s->sends[s->n_send++].bytes = count * mt_coll_dtype_size(dtype);
    return MT_OK;
}

static mt_status_t self_recv(void *ctx, void *buf, size_t count, mt_coll_dtype_t dtype, int peer, mt_stream_t stream) {
    struct self_ctx *s = ctx;
    if (s->n_recv == SELF_MAX_PENDING) {
        return mt_error(MT_ERR_INVALID_USAGE, "self backend: more than %d receives from self in one group",
                        SELF_MAX_PENDING);
    }
    s->recvs[s->n_recv].buf = buf;
    s->recvs[s->n_recv++].bytes = count * mt_coll_dtype_size(dtype);
    return MT_OK;
}

static mt_status_t self_group_start(void *ctx) {
    struct self_ctx *s = ctx;
    s->n_send = s->n_recv = 0;
    return MT_OK;
}

/* The i-th send to self matches the i-th recv from self, as MPI's non-overtaking rule would. */
static mt_status_t self_group_end(void *ctx, mt_stream_t stream) {
    struct self_ctx *s = ctx;
    mt_status_t st = MT_OK;
    if (s->n_send != s->n_recv) {
        st = mt_error(MT_ERR_INVALID_USAGE, "self backend: group has %d sends to self but %d receives", s->n_send,
                      s->n_recv);
    }
    for (int i = 0; st == MT_OK && i < s->n_send; i++) {
        if (s->sends[i].bytes > s->recvs[i].bytes) {
            st = mt_error(MT_ERR_INVALID_ARG, "self backend: send %d of %zu bytes into a receive of %zu bytes", i,
                          s->sends[i].bytes, s->recvs[i].bytes);
            break;
        }
        mt_coll_local_copy(s->sends[i].buf, s->recvs[i].buf, s->sends[i].bytes);
    }
    s->n_send = s->n_recv = 0;
    return st;
}

static mt_status_t self_barrier(void *ctx, mt_stream_t stream) {
    return MT_OK;
}

const struct mt_coll_backend mt_coll_backend_self = {
    .name = "self",
    .api_version = MT_COLL_API_VERSION,
    .stream_ordered = false,
    .query = self_query,
    .init = self_init,
    .free = self_free,
    .all_reduce = self_all_reduce,
    .reduce_scatter = self_reduce_scatter,
    .all_gather = self_all_gather,
    .broadcast = self_broadcast,
    .reduce = self_reduce,
    .all_to_all = self_all_to_all,
    .send = self_send,
    .recv = self_recv,
    .group_start = self_group_start,
    .group_end = self_group_end,
    .barrier = self_barrier,
};
