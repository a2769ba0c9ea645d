/* Unit layouts of the data-parallel engines: gradient buckets in reverse registration order (DDP,
 * ZeRO-1/2), one unit per module (ZeRO-3, plus the persistent parameters), one unit for DP; then the
 * padded offsets, storage, binding, layout-independent initial values and the optimizer's pieces.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/engine_impl.h"
#include "runtime/alloc.h"

size_t eng_round_up(size_t n, size_t m) {
    return (n + m - 1) / m * m;
}

static unit_t *new_unit(mt_engine_t e, unit_kind_t kind) {
    unit_t *u = &e->units[e->n_units++];
    memset(u, 0, sizeof(*u));
    u->kind = kind;
    u->p0 = e->n_units == 1 ? 0 : e->units[e->n_units - 2].p0 + e->units[e->n_units - 2].np;
    return u;
}

static void add_param(mt_engine_t e, unit_t *u, int i) {
    e->unit_params[u->p0 + u->np++] = i;
    u->numel += mt_model_param(e->model, i)->numel;
}

/* Buckets: walk the parameters from the last registered to the first (the order backward produces
 * their gradients), closing a bucket once it holds at least its cap (first_bucket_mb for the first,
 * bucket_mb after). A bucket never splits a parameter, so one larger than the cap is a bucket alone. */
mt_status_t eng_layout_buckets(mt_engine_t e, unit_kind_t kind) {
    double cap = e->p.first_bucket_mb * 1048576.0;
    unit_t *u = NULL;
    for (int i = e->n_params - 1; i >= 0; i--) {
        if (!eng_held(e, i)) {
            continue; /* another pipeline stage's */
        }
        if (e->stage >= 2 && eng_flag(e, i, MT_ENGINE_PARAM_ONCE)) { /* a bucket of its own, sent once */
            unit_t *o = new_unit(e, kind);
            add_param(e, o, i);
            o->once = true;
            continue;
        }
        if (!u) {
            u = new_unit(e, kind);
        }
        add_param(e, u, i);
        if ((double)u->numel * sizeof(float) >= cap) {
            u = NULL;
            cap = e->p.bucket_mb * 1048576.0;
        }
    }
    return MT_OK;
}

mt_status_t eng_layout_one(mt_engine_t e) {
    unit_t *u = new_unit(e, UNIT_REPL);
    for (int i = 0; i < e->n_params; i++) {
        if (eng_held(e, i)) {
            add_param(e, u, i);
        }
    }
    return MT_OK;
}

static bool persistent(mt_engine_t e, int i) {
    return (int64_t)mt_model_param(e->model, i)->numel < e->p.persist_threshold;
}

/* ZeRO-3: parameter i goes into a sharded module unit (held, not persistent). */
static bool sharded(mt_engine_t e, int i) {
    return eng_held(e, i) && !persistent(e, i);
}

/* ZeRO-3: per module, every tied parameter (read by another module too, e.g. GPT-2's wte by the head)
 * is a unit of its own, so the other module gathers just that parameter; the module's other sharded
 * parameters form one unit. Parameters below persist_threshold elements go to one replicated unit. */
mt_status_t eng_layout_modules(mt_engine_t e) {
    for (int m = 0; m < e->n_modules; m++) {
        int first = 0, count = 0;
        mt_model_module_params(e->model, m, &first, &count);
        for (int i = first; i < first + count; i++) {
            if (mt_model_param(e->model, i)->tied_module >= 0 && sharded(e, i)) {
                unit_t *t = new_unit(e, UNIT_SHARD);
                add_param(e, t, i);
                t->once = eng_flag(e, i, MT_ENGINE_PARAM_ONCE);
            }
        }
        unit_t *u = NULL;
        for (int i = first; i < first + count; i++) {
            if (mt_model_param(e->model, i)->tied_module < 0 && sharded(e, i)) {
                if (!u) {
                    u = new_unit(e, UNIT_SHARD);
                }
                add_param(e, u, i);
            }
        }
    }
    unit_t *u = NULL;
    for (int i = 0; i < e->n_params; i++) {
        if (eng_held(e, i) && persistent(e, i)) {
            if (!u) {
                u = new_unit(e, UNIT_REPL);
            }
            add_param(e, u, i);
        }
    }
    return MT_OK;
}

mt_status_t eng_layout_finish(mt_engine_t e) {
    size_t N = (size_t)e->size;
    e->flat_len = 0;
    e->shard_len = 0;
    for (int i = 0; i < e->n_params; i++) {
        e->param_unit[i] = -1; /* not held here */
    }
    for (int k = 0; k < e->n_units; k++) {
        unit_t *u = &e->units[k];
        size_t pos = 0;
        for (int j = 0; j < u->np; j++) {
            int i = e->unit_params[u->p0 + j];
            e->param_unit[i] = k;
            e->param_pos[i] = pos;
            pos += mt_model_param(e->model, i)->numel;
        }
        if (u->kind == UNIT_SHARD) {
            u->len = eng_round_up(MT_MAX(u->numel, (size_t)1), N * ENG_ALIGN);
            u->shard = u->len / N;
            u->sbase = e->shard_len;
            e->shard_len += u->shard;
        } else {
            u->len = eng_round_up(MT_MAX(u->numel, (size_t)1), ENG_ALIGN);
            u->shard = 0;
        }
        u->full = e->stage != 3 || u->kind == UNIT_REPL;
        if (u->full) {
            u->base = e->flat_len;
            e->flat_len += u->len;
        }
    }
    /* Module m's sharded units: those holding a parameter m owns or reads (tied). */
    int *seen = mt_calloc((size_t)e->n_units * sizeof(int), MT_MEM_OTHER, "engine layout");
    e->mod_off = mt_calloc((size_t)(e->n_modules + 1) * sizeof(int), MT_MEM_OTHER, "engine layout");
    e->mod_units = mt_calloc((size_t)(2 * e->n_params + 1) * sizeof(int), MT_MEM_OTHER, "engine layout");
    if (!seen || !e->mod_off || !e->mod_units) {
        mt_free(seen);
        return mt_error(MT_ERR_OOM, "engine %s: out of memory for the module tables", e->name);
    }
    int n = 0;
    for (int m = 0; m < e->n_modules; m++) {
        e->mod_off[m] = n;
        for (int i = 0; i < e->n_params; i++) {
            const mt_param_t *p = mt_model_param(e->model, i);
            int k = e->param_unit[i];
            if (k >= 0 && (p->module == m || p->tied_module == m) && e->units[k].kind == UNIT_SHARD &&
                seen[k] != m + 1) {
                seen[k] = m + 1;
                e->mod_units[n++] = k;
            }
        }
    }
    e->mod_off[e->n_modules] = n;
    mt_free(seen);
    return MT_OK;
}

void *eng_dev_calloc(mt_engine_t e, size_t bytes, mt_mem_cat_t cat, const char *owner) {
    void *p = NULL;
    return mt_device_calloc(e->dev, &p, bytes, cat, owner, e->stream) == MT_OK ? p : NULL;
}

mt_status_t eng_sumsq_add(mt_engine_t e, const float *x, size_t n, double *acc) {
    double s = 0.0;
    if (mt_device_is_host(e->dev)) {
        MT_CHECK(mt_device_sumsq(e->dev, &s, NULL, x, n, e->stream));
    } else {
        MT_CHECK(mt_device_sumsq(e->dev, e->dsum, NULL, x, n, e->stream));
        MT_CHECK(mt_device_copy(e->dev, &s, e->dsum, sizeof(double), e->stream));
        MT_CHECK(mt_device_wait(e->dev, e->stream));
    }
    *acc += s;
    return MT_OK;
}

mt_status_t eng_alloc_storage(mt_engine_t e) {
    size_t maxlen = 0;
    for (int k = 0; k < e->n_units; k++) {
        if (e->units[k].kind == UNIT_SHARD) {
            maxlen = MT_MAX(maxlen, e->units[k].len);
        }
    }
    if (e->flat_len > 0) {
        e->pflat = eng_dev_calloc(e, e->flat_len * sizeof(float), MT_MEM_PARAMS, "engine params");
        if (!e->pflat) {
            goto oom;
        }
        if (e->stage != 2) { /* ZeRO-2 keeps no full-size gradient */
            e->gflat = eng_dev_calloc(e, e->flat_len * sizeof(float), MT_MEM_GRADS, "engine grads");
            if (!e->gflat) {
                goto oom;
            }
        }
    }
    if (e->stage >= 2 && e->shard_len > 0) {
        e->gshard = eng_dev_calloc(e, e->shard_len * sizeof(float), MT_MEM_GRADS, "engine grad shard");
        if (!e->gshard) {
            goto oom;
        }
        e->gpool.floats = maxlen;
        e->gpool.owner = "engine grad bucket";
    }
    if (e->stage == 3 && e->shard_len > 0) {
        e->pshard = eng_dev_calloc(e, e->shard_len * sizeof(float), MT_MEM_PARAMS, "engine param shard");
        if (!e->pshard) {
            goto oom;
        }
        e->ppool.floats = maxlen;
        e->ppool.owner = "engine gathered params";
    }
    return MT_OK;
oom:
    return mt_error(MT_ERR_OOM, "engine %s: cannot allocate parameter/gradient storage (%zu + %zu floats)", e->name,
                    e->flat_len, e->shard_len);
}

void eng_bind_full(mt_engine_t e) {
    for (int i = 0; i < e->n_params; i++) {
        if (e->param_unit[i] < 0) {
            continue; /* another pipeline stage's: stays unbound */
        }
        mt_param_t *p = mt_model_param(e->model, i);
        const unit_t *u = &e->units[e->param_unit[i]];
        p->data = u->full ? e->pflat + u->base + e->param_pos[i] : NULL;
        p->grad = u->full && e->gflat ? e->gflat + u->base + e->param_pos[i] : NULL;
    }
}

/* Calls fn for every piece of parameter storage this rank owns in sharded unit u: parameter i's
 * elements [lo, hi) in unit coordinates (relative to the parameter: lo - pos). */
typedef mt_status_t (*piece_fn)(mt_engine_t e, const unit_t *u, int i, size_t lo, size_t hi);

static mt_status_t for_each_piece(mt_engine_t e, const unit_t *u, piece_fn fn) {
    size_t own_lo = (size_t)e->rank * u->shard, own_hi = own_lo + u->shard;
    for (int j = 0; j < u->np; j++) {
        int i = e->unit_params[u->p0 + j];
        size_t pos = e->param_pos[i], end = pos + mt_model_param(e->model, i)->numel;
        size_t lo = MT_MAX(pos, own_lo), hi = MT_MIN(end, own_hi);
        if (lo < hi) {
            MT_CHECK(fn(e, u, i, lo, hi));
        }
    }
    return MT_OK;
}

static mt_status_t init_piece(mt_engine_t e, const unit_t *u, int i, size_t lo, size_t hi) {
    size_t pos = e->param_pos[i];
    mt_model_param_init_values(e->model, i, lo - pos, hi - lo, e->pshard + u->sbase + (lo - u->shard * e->rank));
    return MT_OK;
}

/* Replicated layouts: rank 0 writes every value and broadcasts, so replicas are bit-identical from the
 * start whatever each rank would compute. ZeRO-3: every rank writes its own shard (and the persistent
 * parameters) from the layout-independent initialiser; nothing is sent. Not counted in any step. */
mt_status_t eng_init_values(mt_engine_t e) {
    bool replicated = e->stage != 3;
    for (int k = 0; k < e->n_units; k++) {
        const unit_t *u = &e->units[k];
        if (u->full && (!replicated || e->rank == 0)) {
            for (int j = 0; j < u->np; j++) {
                int i = e->unit_params[u->p0 + j];
                mt_model_param_init_values(e->model, i, 0, mt_model_param(e->model, i)->numel,
                                           e->pflat + u->base + e->param_pos[i]);
            }
        } else if (!u->full) {
            MT_CHECK(for_each_piece(e, u, init_piece));
        }
    }
    if (replicated && e->flat_len > 0 && e->size > 1) {
        MT_CHECK(eng_broadcast(e, true, e->pflat, e->flat_len, MT_COLL_F32, 0));
    }
    return MT_OK;
}

static mt_status_t optim_piece(mt_engine_t e, const unit_t *u, int i, size_t lo, size_t hi) {
    const mt_param_t *p = mt_model_param(e->model, i);
    size_t in_shard = lo - u->shard * e->rank;
    float *param = e->stage == 3 ? e->pshard + u->sbase + in_shard : e->pflat + u->base + lo;
    float *grad = e->stage == 1 ? e->gflat + u->base + lo : e->gshard + u->sbase + in_shard;
    MT_CHECK(mt_optim_add(e->opt, p->name, param, grad, hi - lo, p->is_weight2d, NULL));
    e->piece_param[e->n_pieces] = i;
    e->piece_lo[e->n_pieces] = lo;
    e->piece_hi[e->n_pieces++] = hi;
    return MT_OK;
}

/* The optimizer gets what this rank owns: whole parameters of replicated units (on DP's root only),
 * and per sharded unit the parameter pieces inside [rank*shard, (rank+1)*shard). AdamW and SGD are
 * element-wise, so any split computes the same values; decay follows the parameter (2-D weights). */
mt_status_t eng_register_optim(mt_engine_t e) {
    if (e->p.kind == MT_ENGINE_DP && e->rank != 0) {
        return MT_OK;
    }
    size_t cap = (size_t)(e->n_params + e->n_units);
    e->piece_param = mt_calloc(cap * sizeof(int), MT_MEM_OTHER, "engine pieces");
    e->piece_lo = mt_calloc(cap * sizeof(size_t), MT_MEM_OTHER, "engine pieces");
    e->piece_hi = mt_calloc(cap * sizeof(size_t), MT_MEM_OTHER, "engine pieces");
    if (!e->piece_param || !e->piece_lo || !e->piece_hi) {
        return mt_error(MT_ERR_OOM, "engine %s: out of memory for the optimizer's pieces", e->name);
    }
    MT_CHECK(mt_optim_init(&e->p.optim, &e->opt));
    MT_CHECK(mt_optim_set_device(e->opt, e->dev, e->stream));
    for (int k = 0; k < e->n_units; k++) {
        const unit_t *u = &e->units[k];
        if (u->kind == UNIT_REPL) {
            for (int j = 0; j < u->np; j++) {
                int i = e->unit_params[u->p0 + j];
                const mt_param_t *p = mt_model_param(e->model, i);
                float *off = e->pflat + u->base + e->param_pos[i];
                float *g = e->gflat + u->base + e->param_pos[i];
                MT_CHECK(mt_optim_add(e->opt, p->name, off, g, p->numel, p->is_weight2d, NULL));
                e->piece_param[e->n_pieces] = i;
                e->piece_lo[e->n_pieces] = e->param_pos[i];
                e->piece_hi[e->n_pieces++] = e->param_pos[i] + p->numel;
            }
        } else {
            MT_CHECK(for_each_piece(e, u, optim_piece));
        }
    }
    return MT_OK;
}

/* ---- sizing without a communicator (meshtrain plan) ------------------------------------------------- */

static mt_status_t count_piece(mt_engine_t e, const unit_t *u, int i, size_t lo, size_t hi) {
    (void)u;
    (void)i;
    e->plan_bytes += (int64_t)mt_alloc_accounted((hi - lo) * sizeof(float));
    return MT_OK;
}

/* The planner's figures come from here: the layout this file builds (e->ops->layout + eng_layout_finish), the
 * buffers eng_alloc_storage allocates and the optimizer pieces eng_register_optim registers, each as the
 * allocator accounts it; the pools at the bound their use keeps to (tests/parallel/test_accounting.c). */
mt_status_t mt_engine_plan_mem(mt_model_t model, int size, int rank, const mt_engine_params_t *params,
                               mt_engine_mem_t *out) {
    memset(out, 0, sizeof(*out));
    if (!model || !params || params->size != sizeof(mt_engine_params_t) || size < 1 || rank < 0 || rank >= size ||
        params->kind < MT_ENGINE_DP || params->kind > MT_ENGINE_ZERO ||
        (params->kind == MT_ENGINE_ZERO && (params->zero_stage < 1 || params->zero_stage > 3))) {
        return mt_error(MT_ERR_INVALID_ARG, "mt_engine_plan_mem: bad arguments (size %d, rank %d)", size, rank);
    }
    struct mt_engine *e = calloc(1, sizeof(*e));
    if (!e) {
        return mt_error(MT_ERR_OOM, "engine sizing: out of memory");
    }
    e->p = *params;
    e->model = model;
    e->rank = rank;
    e->size = size;
    e->n_params = mt_model_n_params(model);
    e->n_modules = mt_model_n_modules(model);
    e->stage = params->kind == MT_ENGINE_ZERO ? params->zero_stage : 0;
    e->ops = params->kind == MT_ENGINE_DP ? &mt_engine_dp_ops
             : params->kind == MT_ENGINE_DDP ? &mt_engine_ddp_ops
                                             : &mt_engine_zero_ops;
    snprintf(e->name, sizeof(e->name), "plan");
    size_t np = (size_t)MT_MAX(e->n_params, 1);
    e->units = calloc(np + 1, sizeof(unit_t));
    e->unit_params = calloc(np, sizeof(int));
    e->param_unit = calloc(np, sizeof(int));
    e->param_pos = calloc(np, sizeof(size_t));
    mt_status_t st = MT_OK;
    if (!e->units || !e->unit_params || !e->param_unit || !e->param_pos) {
        st = mt_error(MT_ERR_OOM, "engine sizing: out of memory for %d parameters", e->n_params);
        goto done;
    }
    MT_CHECK_GOTO(e->ops->layout(e), st, done);
    MT_CHECK_GOTO(eng_layout_finish(e), st, done);
    size_t maxlen = 0;
    int nbuf = mt_optim_state_buffers(&params->optim);
    bool owns = !(params->kind == MT_ENGINE_DP && rank != 0);
    for (int k = 0; k < e->n_units; k++) {
        const unit_t *u = &e->units[k];
        out->numel_padded += (int64_t)u->len;
        out->max_unit = MT_MAX(out->max_unit, (int64_t)u->len);
        bool tied = false;
        for (int j = 0; j < u->np; j++) {
            tied |= mt_model_param(model, e->unit_params[u->p0 + j])->tied_module >= 0;
        }
        out->n_tied_units += u->kind == UNIT_SHARD && tied;
        if (u->kind == UNIT_SHARD) {
            maxlen = MT_MAX(maxlen, u->len);
            if (owns) {
                e->plan_bytes = 0;
                MT_CHECK_GOTO(for_each_piece(e, u, count_piece), st, done);
                out->optimizer += nbuf * e->plan_bytes;
            }
        } else {
            if (e->stage == 3) {
                out->numel_persist += (int64_t)u->numel;
            }
            for (int j = 0; owns && j < u->np; j++) {
                size_t n = mt_model_param(model, e->unit_params[u->p0 + j])->numel;
                out->optimizer += nbuf * (int64_t)mt_alloc_accounted(n * sizeof(float));
            }
        }
    }
    for (int m = 0; m < e->n_modules; m++) {
        out->max_module_units = MT_MAX(out->max_module_units, e->mod_off[m + 1] - e->mod_off[m]);
    }
    /* eng_alloc_storage's buffers */
    int64_t flat = e->flat_len > 0 ? (int64_t)mt_alloc_accounted(e->flat_len * sizeof(float)) : 0;
    int64_t shard = e->shard_len > 0 ? (int64_t)mt_alloc_accounted(e->shard_len * sizeof(float)) : 0;
    out->params = flat + (e->stage == 3 ? shard : 0);
    out->grads = (e->stage != 2 ? flat : 0) + (e->stage >= 2 ? shard : 0);
    /* pools: ZeRO-2/3 hold at most (units one module writes + tied units) gradient buckets, ZeRO-3 also two
     * modules' worth of gathered parameters, each buffer at most the largest sharded unit, and a pool never
     * more than every sharded unit at once (one buffer per unit and pass). An upper bound: how many are in
     * flight together depends on how fast collectives complete. */
    int64_t buf = maxlen > 0 ? (int64_t)mt_alloc_accounted(maxlen * sizeof(float)) : 0;
    int64_t all_units = 0;
    for (int k = 0; k < e->n_units; k++) {
        all_units += e->units[k].kind == UNIT_SHARD ? (int64_t)mt_alloc_accounted(e->units[k].len * sizeof(float)) : 0;
    }
    int grad_bufs = e->stage >= 2 ? out->max_module_units + out->n_tied_units : 0;
    int param_bufs = e->stage == 3 ? 2 * out->max_module_units : 0;
    out->comm = MT_MIN(grad_bufs * buf, all_units) + MT_MIN(param_bufs * buf, all_units);
    out->comm_peak = out->comm;
    out->grad_buffers = grad_bufs;
    out->param_buffers = param_bufs;
    out->numel = (int64_t)mt_model_numel(model);
    out->n_units = e->n_units;
done:
    mt_free(e->mod_off);
    mt_free(e->mod_units);
    free(e->units);
    free(e->unit_params);
    free(e->param_unit);
    free(e->param_pos);
    free(e);
    return st;
}
