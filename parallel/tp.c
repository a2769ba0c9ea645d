/* Tensor parallelism over a communicator: the seam's collectives with counting and timing, the
 * sequence-parallel gradient sync of replicated parameters, and gathers of sharded parameters.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "parallel/tp.h"
#include "parallel/tp_wait.h"
#include "runtime/alloc.h"

/* Bytes a rank sends in a bandwidth-optimal algorithm (the nccl-tests bus convention, as the data-parallel
 * engines count): all-reduce of b bytes 2b(n-1)/n, all-gather / reduce-scatter of b = n x c bytes b(n-1)/n.
 * So an all-reduce moves exactly what the reduce-scatter + all-gather pair of sequence parallelism moves. */
static int64_t bus_bytes(size_t total_floats, int n, int factor) {
    return (int64_t)((double)factor * (double)total_floats * sizeof(float) * (n - 1) / n);
}

struct mt_tp {
    mt_comm_t comm; /* borrowed; NULL = one rank */
    int rank, size;
    mt_tp_ops_t ops;
    mt_tp_counts_t counts;
    mt_device_table_t dev; /* mt_tp_set_device's, or the CPU table */
    void *stream;
};

/* The seam's collectives over count floats per rank: all-reduce (sum or max, in place: send == recv),
 * all-gather and reduce-scatter (sum). Each call adds 1 to *kind (its counter in tp->counts), its bus bytes
 * and its time; a group of one only copies send to recv. */
typedef enum { SEAM_ALL_REDUCE_SUM, SEAM_ALL_REDUCE_MAX, SEAM_ALL_GATHER, SEAM_REDUCE_SCATTER } seam_op_t;

static mt_status_t seam_run(struct mt_tp *tp, seam_op_t op, int64_t *kind, const float *send, float *recv,
                            size_t count) {
    mt_work_t w = NULL;
    double t0 = mt_now();
    bool all_reduce = op == SEAM_ALL_REDUCE_SUM || op == SEAM_ALL_REDUCE_MAX;
    (*kind)++;
    tp->counts.bytes += all_reduce ? bus_bytes(count, tp->size, 2) : bus_bytes(count * (size_t)tp->size, tp->size, 1);
    mt_status_t st = MT_OK;
    if (tp->comm) {
        switch (op) {
        case SEAM_ALL_REDUCE_SUM:
        case SEAM_ALL_REDUCE_MAX:
            st = mt_coll_all_reduce(tp->comm, send, recv, count, MT_COLL_F32,
                                    op == SEAM_ALL_REDUCE_MAX ? MT_REDOP_MAX : MT_REDOP_SUM, NULL, &w);
            break;
        case SEAM_ALL_GATHER:
            st = mt_coll_all_gather(tp->comm, send, recv, count, MT_COLL_F32, NULL, &w);
            break;
        case SEAM_REDUCE_SCATTER:
            st = mt_coll_reduce_scatter(tp->comm, send, recv, count, MT_COLL_F32, MT_REDOP_SUM, NULL, &w);
            break;
        }
        st = mt_mp_wait(st, &w, -1.0);
    } else if (recv != send) {
        memcpy(recv, send, count * sizeof(float));
    }
    tp->counts.seconds += mt_now() - t0;
    return st;
}

static mt_status_t seam_all_reduce(void *ctx, float *buf, size_t count) {
    struct mt_tp *tp = ctx;
    return seam_run(tp, SEAM_ALL_REDUCE_SUM, &tp->counts.all_reduce, buf, buf, count);
}

static mt_status_t seam_all_reduce_max(void *ctx, float *buf, size_t count) {
    struct mt_tp *tp = ctx;
    return seam_run(tp, SEAM_ALL_REDUCE_MAX, &tp->counts.all_reduce_max, buf, buf, count);
}

static mt_status_t seam_all_gather(void *ctx, const float *send, float *recv, size_t count) {
    struct mt_tp *tp = ctx;
    return seam_run(tp, SEAM_ALL_GATHER, &tp->counts.all_gather, send, recv, count);
}

static mt_status_t seam_reduce_scatter(void *ctx, const float *send, float *recv, size_t count) {
    struct mt_tp *tp = ctx;
    return seam_run(tp, SEAM_REDUCE_SCATTER, &tp->counts.reduce_scatter, send, recv, count);
}

mt_status_t mt_tp_init(mt_comm_t tp_comm, mt_tp_t *out) {
    *out = NULL;
    struct mt_tp *tp = calloc(1, sizeof(*tp));
    if (!tp) {
        return mt_error(MT_ERR_OOM, "tp: out of memory");
    }
    tp->comm = tp_comm;
    tp->rank = tp_comm ? mt_comm_rank(tp_comm) : 0;
    tp->size = tp_comm ? mt_comm_size(tp_comm) : 1;
    tp->ops.ctx = tp;
    tp->ops.all_reduce_sum = seam_all_reduce;
    tp->ops.all_gather = seam_all_gather;
    tp->ops.reduce_scatter_sum = seam_reduce_scatter;
    tp->ops.all_reduce_max = seam_all_reduce_max;
    tp->dev = mt_device_cpu();
    *out = tp;
    return MT_OK;
}

void mt_tp_free(mt_tp_t tp) {
    free(tp);
}

mt_status_t mt_tp_set_device(mt_tp_t tp, mt_device_table_t dev, void *stream) {
    MT_CHECK(mt_device_require_host(dev, "tp"));
    dev = dev ? dev : mt_device_cpu();
    tp->dev = dev;
    tp->stream = stream;
    return MT_OK;
}

int mt_tp_rank(mt_tp_t tp) {
    return tp->rank;
}
int mt_tp_size(mt_tp_t tp) {
    return tp->size;
}
const mt_tp_ops_t *mt_tp_ops(mt_tp_t tp) {
    return &tp->ops;
}

void mt_tp_model_config(mt_tp_t tp, bool sequence_parallel, mt_model_config_t *mc) {
    mc->tp_rank = tp->rank;
    mc->tp_size = tp->size;
    mc->tp_ops = tp->size > 1 ? &tp->ops : NULL;
    mc->sequence_parallel = tp->size > 1 && sequence_parallel;
}

void mt_tp_counts(mt_tp_t tp, mt_tp_counts_t *out) {
    *out = tp->counts;
}
void mt_tp_reset_counts(mt_tp_t tp) {
    memset(&tp->counts, 0, sizeof(tp->counts));
}

/* Copies the gradients of the replicated parameters (tp_dim < 0, with a gradient) among [first, n) into
 * buf back to back (to_buf) or out of it, through the device table; *total: their number of floats (buf
 * may be NULL to count). */
static mt_status_t pack_replicated(mt_tp_t tp, mt_model_t m, int first, int n, float *buf, bool to_buf, size_t *total) {
    size_t off = 0;
    for (int i = first; i < n; i++) {
        const mt_param_t *p = mt_model_param(m, i);
        if (p->tp_dim < 0 && p->grad) {
            size_t bytes = p->numel * sizeof(float);
            if (buf) {
                MT_CHECK(mt_device_copy(tp->dev, to_buf ? (void *)(buf + off) : (void *)p->grad,
                                        to_buf ? (const void *)p->grad : (const void *)(buf + off), bytes, tp->stream));
            }
            off += p->numel;
        }
    }
    *total = off;
    return MT_OK;
}

/* Sums the gradients of the replicated parameters in [first, first + count) over tp, packed in one buffer. */
static mt_status_t sync_replicated(mt_tp_t tp, mt_model_t m, int first, int count) {
    mt_work_t w_ = NULL;
    int n = first + count;
    size_t total = 0;
    MT_CHECK(pack_replicated(tp, m, first, n, NULL, false, &total));
    if (total == 0) {
        return MT_OK;
    }
    float *buf = NULL;
    mt_status_t st =
        mt_device_alloc(tp->dev, (void **)&buf, total * sizeof(float), MT_MEM_COMM, "tp grad sync", tp->stream);
    if (st != MT_OK) {
        return st; /* the table's message names the owner and the bytes */
    }
    st = pack_replicated(tp, m, first, n, buf, true, &total);
    double t0 = mt_now();
    if (st == MT_OK) {
        st = mt_mp_wait(mt_coll_all_reduce(tp->comm, buf, buf, total, MT_COLL_F32, MT_REDOP_SUM, NULL, &w_), &w_, -1.0);
        tp->counts.grad_sync++;
        tp->counts.bytes += bus_bytes(total, tp->size, 2);
        tp->counts.seconds += mt_now() - t0;
    }
    if (st == MT_OK) {
        st = pack_replicated(tp, m, first, n, buf, false, &total);
    }
    if (st == MT_OK) {
        st = mt_device_wait(tp->dev, tp->stream); /* the buffer is read before it is freed */
    }
    mt_device_free(tp->dev, buf);
    return st;
}

mt_status_t mt_tp_finish_grads(mt_tp_t tp, mt_model_t m, bool sequence_parallel) {
    if (!sequence_parallel || tp->size == 1) {
        return MT_OK;
    }
    return sync_replicated(tp, m, 0, mt_model_n_params(m));
}

mt_status_t mt_tp_sync_module_grads(mt_tp_t tp, mt_model_t m, int module, bool sequence_parallel) {
    if (!sequence_parallel || tp->size == 1) {
        return MT_OK;
    }
    int first = 0, count = 0;
    mt_model_module_params(m, module, &first, &count);
    return sync_replicated(tp, m, first, count);
}

mt_status_t mt_tp_gather_param(mt_tp_t tp, mt_model_t m, int i, float *out) {
    const mt_param_t *p = mt_model_param(m, i);
    if (!p || !p->data) {
        return mt_error(MT_ERR_INVALID_ARG, "tp: parameter %d does not exist or has no data bound", i);
    }
    return mt_tp_gather_shard(tp, p, p->data, out);
}

mt_status_t mt_tp_gather_shard(mt_tp_t tp, const mt_param_t *p, const float *local, float *out) {
    mt_work_t w_ = NULL;
    if (p->tp_dim < 0 || tp->size == 1) {
        MT_CHECK(mt_device_copy(tp->dev, out, local, p->numel * sizeof(float), tp->stream));
        return mt_device_wait(tp->dev, tp->stream);
    }
    float *all = NULL;
    mt_status_t st = mt_device_alloc(tp->dev, (void **)&all, p->numel * (size_t)tp->size * sizeof(float), MT_MEM_COMM,
                                     "tp gather", tp->stream);
    if (st != MT_OK) {
        return st;
    }
    st = mt_mp_wait(mt_coll_all_gather(tp->comm, local, all, p->numel, MT_COLL_F32, NULL, &w_), &w_, -1.0);
    if (st == MT_OK) {
        int64_t r0 = p->shape[0], c0 = p->shape[1], gcols = p->global_shape[1];
        for (int r = 0; r < tp->size; r++) {
            const float *src = all + (size_t)r * p->numel;
            for (int64_t a = 0; a < r0; a++) {
                for (int64_t b = 0; b < c0; b++) {
                    int64_t ga = a, gb = b;
                    /* local index -> global: block k of tp_parts along tp_dim, rank r's slice inside it */
                    if (p->tp_dim == 0) {
                        int64_t pl = r0 / p->tp_parts;
                        ga = (a / pl) * pl * tp->size + (int64_t)r * pl + a % pl;
                    } else {
                        int64_t pl = c0 / p->tp_parts;
                        gb = (b / pl) * pl * tp->size + (int64_t)r * pl + b % pl;
                    }
                    out[ga * gcols + gb] = src[a * c0 + b];
                }
            }
        }
    }
    mt_device_free(tp->dev, all);
    return st;
}
