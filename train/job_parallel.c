/* The training loop's adapter to the data-parallel engines (parallel/engine.h): the dp communicator
 * from the job's mesh, the engine from the parallel.* keys, and the engine's storage described as
 * checkpoint pieces. The pieces follow the engine's layout (parallel/engine_impl.h): replicated units
 * hold whole parameters (and, except under DP, whole optimizer state) on every rank, written once by dp
 * rank 0; sharded units hold the slice [rank*shard, (rank+1)*shard) of their packed parameters, which
 * cuts parameters into flat ranges, each written by its owner as up to three boxes.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "train/job_impl.h"
#include "train/job_pieces.h"
#include "parallel/engine_impl.h"
#include "runtime/mesh.h"

typedef struct {
    mt_comm_t comm;
    mt_engine_t e;
    int64_t micro_batch, grad_accum, seq_len; /* DP's scatter: rows and tokens per micro-batch */
    int32_t *pack;                            /* DP root: one micro-batch of the whole group, packed by rank */
} par_ctx_t;

static void par_free(void *ctx) {
    par_ctx_t *c = ctx;
    if (c) {
        mt_free(c->pack);
        mt_engine_free(c->e);
        mt_comm_free(c->comm);
        free(c);
    }
}

static mt_status_t par_init(const mt_job_info_t *info, void **ctx) {
    *ctx = NULL;
    const mt_parallel_settings_t *par = &info->set->par;
    mt_engine_params_t ep = MT_ENGINE_PARAMS_INIT;
    ep.kind = par->engine;
    ep.zero_stage = par->zero_stage;
    ep.bucket_mb = par->bucket_mb;
    ep.persist_threshold = par->persist_threshold;
    ep.grad_accum = (int)info->grad_accum;
    ep.optim = info->optim;
    par_ctx_t *c = calloc(1, sizeof(*c));
    if (!c) {
        return mt_error(MT_ERR_OOM, "parallel engine: out of memory");
    }
    c->micro_batch = info->micro_batch;
    c->grad_accum = info->grad_accum;
    c->seq_len = info->seq_len;
    mt_comm_params_t cp = MT_COMM_PARAMS_INIT;
    cp.name = "dp";
    mt_status_t st = MT_OK;
    if (info->mesh) {
        MT_CHECK_GOTO(mt_comm_init_mesh(info->comm, info->mesh, MT_AXIS_BIT(MT_AXIS_DP), &cp, &c->comm), st, fail);
    } else {
        MT_CHECK_GOTO(mt_comm_init(info->comm, &cp, &c->comm), st, fail);
    }
    if (mt_comm_size(c->comm) != info->dp_size || mt_comm_rank(c->comm) != info->dp_rank) {
        st = mt_error(MT_ERR_INTERNAL, "parallel engine: dp communicator rank %d of %d, the job expects %d of %d",
                      mt_comm_rank(c->comm), mt_comm_size(c->comm), info->dp_rank, info->dp_size);
        goto fail;
    }
    MT_CHECK_GOTO(mt_engine_init(info->model, c->comm, &ep, &c->e), st, fail);
    if (mt_engine_root_loads_batch(c->e) && info->dp_rank == 0 && info->dp_size > 1) {
        size_t n = (size_t)info->dp_size * (size_t)(info->micro_batch * info->seq_len);
        /* batch data, like the loader's buffers (category other, which `meshtrain plan` does not size) */
        c->pack = mt_alloc(n * sizeof(int32_t), MT_MEM_OTHER, "dp batch scatter");
        if (!c->pack) {
            st = mt_error(MT_ERR_OOM, "engine dp: out of memory for the %zu-token scatter buffer", n);
            goto fail;
        }
    }
    *ctx = c;
    return MT_OK;
fail:
    par_free(c);
    return st;
}

static mt_status_t par_zero_grads(void *ctx) {
    return mt_engine_zero_grads(((par_ctx_t *)ctx)->e);
}

static mt_status_t par_finish_grads(void *ctx) {
    return mt_engine_finish_grads(((par_ctx_t *)ctx)->e);
}

static mt_status_t par_grad_sumsq(void *ctx, double *total) {
    return mt_engine_grad_sumsq(((par_ctx_t *)ctx)->e, total);
}

static mt_status_t par_step(void *ctx, float lr, float grad_scale) {
    return mt_engine_step(((par_ctx_t *)ctx)->e, lr, grad_scale);
}

static mt_status_t par_reduce_loss(void *ctx, double *loss) {
    return mt_engine_reduce_loss(((par_ctx_t *)ctx)->e, loss);
}

static bool par_root_loads_batch(void *ctx) {
    return mt_engine_root_loads_batch(((par_ctx_t *)ctx)->e);
}

/* Packs rows [r*rows + k*mb, r*rows + (k+1)*mb) of the group's batch for every dp rank r, rank after rank
 * (mt_engine_scatter_batch's root layout), from src (inputs or targets of the group batch). */
static void pack_micro(const par_ctx_t *c, const int32_t *src, int64_t rows, int64_t k, int32_t *dst) {
    size_t n = (size_t)(c->micro_batch * c->seq_len);
    for (int r = 0; r < c->e->size; r++) {
        memcpy(dst + (size_t)r * n, src + (size_t)(r * rows + k * c->micro_batch) * (size_t)c->seq_len,
               n * sizeof(int32_t));
    }
}

/* DP's data path: the root sends every rank its rows of micro-batch k (inputs, then targets), counted in
 * the step's bytes_other by the engine. */
static mt_status_t par_scatter_micro_batch(void *ctx, const mt_batch_t *group, int64_t k, int32_t *inputs,
                                           int32_t *targets) {
    par_ctx_t *c = ctx;
    mt_engine_t e = c->e;
    size_t n = (size_t)(c->micro_batch * c->seq_len);
    int64_t rows = c->micro_batch * c->grad_accum; /* per rank */
    if (k < 0 || k >= c->grad_accum) {
        return mt_error(MT_ERR_INVALID_USAGE, "engine dp: micro-batch %lld of %lld", (long long)k,
                        (long long)c->grad_accum);
    }
    if (e->rank == 0 && (!group || group->rows != rows * e->size || group->seq_len != c->seq_len)) {
        return mt_error(MT_ERR_INVALID_USAGE, "engine dp: the root needs the group's batch of %lld x %lld tokens",
                        (long long)(rows * e->size), (long long)c->seq_len);
    }
    if (e->size == 1) {
        memcpy(inputs, group->inputs + (size_t)k * n, n * sizeof(int32_t));
        memcpy(targets, group->targets + (size_t)k * n, n * sizeof(int32_t));
        return MT_OK;
    }
    const int32_t *srcs[2] = {e->rank == 0 ? group->inputs : NULL, e->rank == 0 ? group->targets : NULL};
    int32_t *dsts[2] = {inputs, targets};
    for (int i = 0; i < 2; i++) {
        if (e->rank == 0) {
            pack_micro(c, srcs[i], rows, k, c->pack);
        }
        MT_CHECK(mt_engine_scatter_batch(e, e->rank == 0 ? c->pack : NULL, dsts[i], n));
    }
    return MT_OK;
}

static void par_comm_bytes(void *ctx, double *model, double *other) {
    mt_engine_comm_stats_t s;
    mt_engine_comm_stats(((par_ctx_t *)ctx)->e, &s);
    *model = s.bytes_model;
    *other = s.bytes_other;
}

/* ---- checkpoint pieces (shared with job_mp.c: train/job_pieces.h) ---------------------------------- */

static mt_status_t push_box(mt_plist_t *l, const char *kind, const mt_param_t *p, const int64_t lo[2],
                            const int64_t hi[2], float *data, int64_t ld) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        mt_ckpt_piece_t *v = realloc(l->v, (size_t)cap * sizeof(*v));
        if (!v) {
            return mt_error(MT_ERR_OOM, "checkpoint: out of memory listing pieces");
        }
        l->v = v;
        l->cap = cap;
    }
    mt_ckpt_piece_t *pc = &l->v[l->n++];
    memset(pc, 0, sizeof(*pc));
    snprintf(pc->tensor, sizeof(pc->tensor), "%s/%s", kind, p->name);
    pc->ndim = p->ndim;
    for (int d = 0; d < p->ndim; d++) {
        pc->shape[d] = p->global_shape[d];
        pc->lo[d] = lo[d];
        pc->hi[d] = hi[d];
    }
    pc->data = data;
    pc->ld = p->ndim == 2 ? ld : 0;
    return MT_OK;
}

/* The local box [lo, hi) (rows ld floats apart at data) as global boxes: split along tp_dim at the
 * tp_parts blocks, each moved to where this tp rank's block sits in the global tensor. */
static mt_status_t push_local_box(mt_plist_t *l, const char *kind, const mt_param_t *p, int tp_size, int tp_rank,
                                  const int64_t lo[2], const int64_t hi[2], float *data, int64_t ld) {
    if (p->tp_dim < 0 || tp_size == 1) {
        return push_box(l, kind, p, lo, hi, data, ld);
    }
    int d = p->tp_dim;
    int64_t parts = MT_MAX(p->tp_parts, 1), pl = p->shape[d] / parts;
    for (int64_t x = lo[d]; x < hi[d];) {
        int64_t k = x / pl, end = MT_MIN(hi[d], (k + 1) * pl);
        int64_t g = k * pl * tp_size + (int64_t)tp_rank * pl + x - k * pl;
        int64_t glo[2] = {lo[0], lo[1]}, ghi[2] = {hi[0], hi[1]};
        glo[d] = g;
        ghi[d] = g + (end - x);
        float *at = d == 0 ? data + (x - lo[0]) * (p->ndim == 2 ? ld : 1) : data + (x - lo[1]);
        MT_CHECK(push_box(l, kind, p, glo, ghi, at, ld));
        x = end;
    }
    return MT_OK;
}

mt_status_t mt_plist_push_flat(mt_plist_t *l, const char *kind, const mt_param_t *p, int tp_size, int tp_rank,
                               size_t a, size_t b, float *data) {
    if (a >= b) {
        return MT_OK;
    }
    if (p->ndim == 1) {
        int64_t lo[2] = {(int64_t)a, 0}, hi[2] = {(int64_t)b, 0};
        return push_local_box(l, kind, p, tp_size, tp_rank, lo, hi, data, 0);
    }
    /* the rest of the first row, the whole rows, the start of the last row */
    int64_t w = p->shape[1], r0 = (int64_t)a / w, c0 = (int64_t)a % w;
    int64_t r1 = (int64_t)b / w, c1 = (int64_t)b % w;
    if (r0 == r1) {
        int64_t lo[2] = {r0, c0}, hi[2] = {r0 + 1, c1};
        return push_local_box(l, kind, p, tp_size, tp_rank, lo, hi, data, w);
    }
    float *d = data;
    if (c0 > 0) {
        int64_t lo[2] = {r0, c0}, hi[2] = {r0 + 1, w};
        MT_CHECK(push_local_box(l, kind, p, tp_size, tp_rank, lo, hi, d, w));
        d += w - c0;
        r0++;
    }
    if (r1 > r0) {
        int64_t lo[2] = {r0, 0}, hi[2] = {r1, w};
        MT_CHECK(push_local_box(l, kind, p, tp_size, tp_rank, lo, hi, d, w));
        d += (r1 - r0) * w;
    }
    if (c1 > 0) {
        int64_t lo[2] = {r1, 0}, hi[2] = {r1 + 1, c1};
        MT_CHECK(push_local_box(l, kind, p, tp_size, tp_rank, lo, hi, d, w));
    }
    return MT_OK;
}

typedef struct {
    mt_plist_t *l;
    mt_engine_t e;
    bool sgd;
    int tp_size, tp_rank;
} pieces_t;

/* The optimizer state of state tensor k, which covers elements [a, b) of parameter p. */
static mt_status_t push_state(pieces_t *c, int k, const mt_param_t *p, size_t a, size_t b) {
    const char *name = NULL;
    size_t n = 0;
    float *m = NULL, *v = NULL;
    MT_CHECK(mt_optim_state(mt_engine_optim(c->e), k, &name, &n, &m, &v));
    if (n != b - a || strcmp(name, p->name) != 0) {
        return mt_error(MT_ERR_INTERNAL, "checkpoint: optimizer tensor %d is %s (%zu elements), expected %s [%zu, %zu)",
                        k, name, n, p->name, a, b);
    }
    if (c->sgd) {
        return m ? mt_plist_push_flat(c->l, "sgd.momentum", p, c->tp_size, c->tp_rank, a, b, m) : MT_OK;
    }
    MT_CHECK(mt_plist_push_flat(c->l, "adamw.m", p, c->tp_size, c->tp_rank, a, b, m));
    return mt_plist_push_flat(c->l, "adamw.v", p, c->tp_size, c->tp_rank, a, b, v);
}

mt_status_t mt_job_engine_pieces(mt_engine_t e, bool save, int tp_size, int tp_rank, const uint8_t *flags,
                                 mt_ckpt_piece_t **pieces, int *n) {
    mt_plist_t l = {0};
    pieces_t c = {.l = &l, .e = e, .sgd = e->p.optim.kind == MT_OPTIM_SGD, .tp_size = tp_size, .tp_rank = tp_rank};
    bool root = e->rank == 0;
    bool has_opt = mt_engine_optim(e) != NULL; /* DP: the root only */
    int k = 0;                                 /* optimizer tensor index, in eng_register_optim's order */
    mt_status_t st = MT_OK;
    for (int ui = 0; ui < e->n_units && st == MT_OK; ui++) {
        const unit_t *u = &e->units[ui];
        for (int j = 0; j < u->np && st == MT_OK; j++) {
            int i = e->unit_params[u->p0 + j];
            const mt_param_t *p = mt_model_param(e->model, i);
            size_t pos = e->param_pos[i], end = pos + p->numel;
            size_t own_lo = (size_t)e->rank * u->shard, own_hi = own_lo + u->shard;
            size_t a = MT_MAX(pos, own_lo), b = MT_MIN(end, own_hi);
            bool written = !flags || (flags[i] & MT_ENGINE_PARAM_NORM); /* this tp rank's / stage's copy */
            bool take = !save || written;
            /* parameter values: replicated ones written once, by dp rank 0, and read by every rank */
            if (u->full && take && (!save || root)) {
                st = mt_plist_push_flat(&l, "param", p, tp_size, tp_rank, 0, p->numel, e->pflat + u->base + pos);
            } else if (!u->full && take && a < b) {
                st = mt_plist_push_flat(&l, "param", p, tp_size, tp_rank, a - pos, b - pos,
                                        e->pshard + u->sbase + (a - own_lo));
            }
            if (st != MT_OK || !has_opt) {
                continue;
            }
            /* optimizer state (k counts every tensor the optimizer has, written or not) */
            if (u->kind == UNIT_REPL) {
                if (take && (!save || root)) {
                    st = push_state(&c, k, p, 0, p->numel);
                }
                k++;
            } else if (a < b) {
                if (take) {
                    st = push_state(&c, k, p, a - pos, b - pos);
                }
                k++;
            }
        }
    }
    if (st == MT_OK && has_opt && k != mt_optim_count(mt_engine_optim(e))) {
        st = mt_error(MT_ERR_INTERNAL, "checkpoint: %d optimizer tensors described, the engine has %d", k,
                      mt_optim_count(mt_engine_optim(e)));
    }
    if (st != MT_OK) {
        free(l.v);
        return st;
    }
    *pieces = l.v;
    *n = l.n;
    return MT_OK;
}

static mt_status_t par_ckpt_pieces(void *ctx, bool save, mt_ckpt_piece_t **pieces, int *n) {
    return mt_job_engine_pieces(((par_ctx_t *)ctx)->e, save, 1, 0, NULL, pieces, n);
}

static int64_t par_ckpt_get_step(void *ctx) {
    mt_optim_t o = mt_engine_optim(((par_ctx_t *)ctx)->e);
    return o ? mt_optim_get_step(o) : 0;
}

static void par_ckpt_set_step(void *ctx, int64_t t) {
    mt_optim_t o = mt_engine_optim(((par_ctx_t *)ctx)->e);
    if (o) {
        mt_optim_set_step(o, t);
    }
}

static mt_status_t par_ckpt_loaded(void *ctx) {
    mt_engine_t e = ((par_ctx_t *)ctx)->e;
    return e->stage == 3 ? eng_release_all_params(e) : MT_OK; /* no gathered copy may predate the load */
}

static const mt_job_engine_t parallel_engine = {
    .name = "data-parallel",
    .init = par_init,
    .zero_grads = par_zero_grads,
    .finish_grads = par_finish_grads,
    .grad_sumsq = par_grad_sumsq,
    .step = par_step,
    .reduce_loss = par_reduce_loss,
    .free = par_free,
    .ckpt_pieces = par_ckpt_pieces,
    .ckpt_get_step = par_ckpt_get_step,
    .ckpt_set_step = par_ckpt_set_step,
    .ckpt_loaded = par_ckpt_loaded,
    .root_loads_batch = par_root_loads_batch,
    .scatter_micro_batch = par_scatter_micro_batch,
    .comm_bytes = par_comm_bytes,
};

const mt_job_engine_t *mt_job_engine_parallel(void) {
    return &parallel_engine;
}
