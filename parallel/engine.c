/* The engine API: parameter checks, set-up common to every kind (layout, storage, initial values,
 * optimizer, hooks), the step entry points dispatching to dp.c / ddp.c / zero.c, gathering parameters
 * to one rank, and the accounting read-outs.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "parallel/engine_impl.h"
#include "runtime/alloc.h"

bool mt_engine_kind_parse(const char *s, mt_engine_kind_t *out) {
    static const char *names[] = {"dp", "ddp", "zero"};
    for (int i = 0; s && i < 3; i++) {
        if (!strcasecmp(s, names[i])) {
            *out = (mt_engine_kind_t)i;
            return true;
        }
    }
    return false;
}

const char *mt_engine_name(mt_engine_t e) {
    return e->name;
}

static mt_status_t check_params(mt_model_t model, mt_comm_t dp, const mt_engine_params_t *p) {
    if (!model || !dp || !p) {
        return mt_error(MT_ERR_INVALID_ARG, "mt_engine_init: model, dp communicator and params are required");
    }
    if (p->size != sizeof(mt_engine_params_t)) {
        return mt_error(MT_ERR_INVALID_ARG, "mt_engine_init: params.size not set (start from MT_ENGINE_PARAMS_INIT)");
    }
    if (p->kind < MT_ENGINE_DP || p->kind > MT_ENGINE_ZERO) {
        return mt_error(MT_ERR_INVALID_ARG, "parallel.engine: unknown engine %d (expected dp, ddp or zero)",
                        (int)p->kind);
    }
    if (p->kind == MT_ENGINE_ZERO && (p->zero_stage < 1 || p->zero_stage > 3)) {
        return mt_error(MT_ERR_INVALID_ARG, "parallel.zero_stage = %d: ZeRO has stages 1, 2 and 3", p->zero_stage);
    }
    if (p->grad_accum < 1) {
        return mt_error(MT_ERR_INVALID_ARG, "engine: grad_accum = %d: at least one micro-batch per step",
                        p->grad_accum);
    }
    if (!(p->bucket_mb > 0.0) || !(p->first_bucket_mb > 0.0)) {
        return mt_error(
            MT_ERR_INVALID_ARG,
            "parallel.bucket_mb = %g, first bucket %g MiB: bucket sizes must be positive (default 25 and 1)",
            p->bucket_mb, p->first_bucket_mb);
    }
    if (p->persist_threshold < 0) {
        return mt_error(MT_ERR_INVALID_ARG, "parallel.zero_persist_threshold = %lld: must be >= 0",
                        (long long)p->persist_threshold);
    }
    MT_CHECK(mt_device_require_host(p->device, "engine"));
    if (p->param_flags && p->kind == MT_ENGINE_DP) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "parallel.engine = \"dp\" lays out the whole model on every rank: it takes no per-parameter "
                        "subset (pipeline stages run DDP or ZeRO)");
    }
    /* A tensor-parallel model is fine: its parameters are this rank's tp shards, and the engine
     * works over the dp group, whose ranks all hold the same shard (tests/parallel3d: 2x2x2 with DDP,
     * ZeRO-1 and sequence parallelism; tp2 x dp2 with ZeRO-2 and ZeRO-3). */
    for (int i = 0; i < mt_model_n_params(model); i++) {
        const mt_param_t *q = mt_model_param(model, i);
        if (q->data || q->grad) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "engine: parameter %s already has storage bound; the engine binds its own (do not call "
                            "mt_model_alloc_params / alloc_grads before mt_engine_init)",
                            q->name);
        }
    }
    return MT_OK;
}

mt_status_t mt_engine_init(mt_model_t model, mt_comm_t dp, const mt_engine_params_t *params, mt_engine_t *out) {
    *out = NULL;
    MT_CHECK(check_params(model, dp, params));
    mt_engine_t e = mt_calloc(sizeof(*e), MT_MEM_OTHER, "engine");
    if (!e) {
        return mt_error(MT_ERR_OOM, "engine: out of memory");
    }
    mt_status_t st = MT_OK;
    e->p = *params;
    e->model = model;
    e->comm = dp;
    e->rank = mt_comm_rank(dp);
    e->size = mt_comm_size(dp);
    e->n_params = mt_model_n_params(model);
    e->n_modules = mt_model_n_modules(model);
    e->stage = params->kind == MT_ENGINE_ZERO ? params->zero_stage : 0;
    e->dev = params->device ? params->device : mt_device_cpu();
    e->stream = params->stream;
    e->gpool.dev = e->ppool.dev = e->dev;
    e->gpool.stream = e->ppool.stream = e->stream;
    switch (params->kind) {
    case MT_ENGINE_DP:
        e->ops = &mt_engine_dp_ops;
        snprintf(e->name, sizeof(e->name), "dp");
        break;
    case MT_ENGINE_DDP:
        e->ops = &mt_engine_ddp_ops;
        snprintf(e->name, sizeof(e->name), "ddp");
        break;
    default:
        e->ops = &mt_engine_zero_ops;
        snprintf(e->name, sizeof(e->name), "zero-%d", e->stage);
        break;
    }
    size_t np = (size_t)MT_MAX(e->n_params, 1);
    e->units = mt_calloc((np + 1) * sizeof(unit_t), MT_MEM_OTHER, "engine layout");
    e->unit_params = mt_calloc(np * sizeof(int), MT_MEM_OTHER, "engine layout");
    e->param_unit = mt_calloc(np * sizeof(int), MT_MEM_OTHER, "engine layout");
    e->param_pos = mt_calloc(np * sizeof(size_t), MT_MEM_OTHER, "engine layout");
    e->fifo = mt_calloc((np + 1) * sizeof(int), MT_MEM_OTHER, "engine layout");
    if (!e->units || !e->unit_params || !e->param_unit || !e->param_pos || !e->fifo) {
        st = mt_error(MT_ERR_OOM, "engine: out of memory for the layout of %d parameters", e->n_params);
        goto fail;
    }
    if (!mt_device_is_host(e->dev) && (st = mt_device_alloc(e->dev, (void **)&e->dsum, sizeof(double), MT_MEM_OTHER,
                                                            "engine norm", e->stream)) != MT_OK) {
        goto fail;
    }
    MT_CHECK_GOTO(e->ops->layout(e), st, fail);
    MT_CHECK_GOTO(eng_layout_finish(e), st, fail);
    MT_CHECK_GOTO(eng_alloc_storage(e), st, fail);
    eng_bind_full(e);
    MT_CHECK_GOTO(eng_init_values(e), st, fail);
    MT_CHECK_GOTO(eng_register_optim(e), st, fail);
    eng_install_hooks(e);
    e->counting = true;
    MT_INFO(MT_LOG_MODEL, "engine %s over %d ranks: %zu parameters in %d units, %zu padded (%zu per shard)", e->name,
            e->size, mt_model_numel(model), e->n_units, e->flat_len + e->shard_len * (size_t)e->size, e->shard_len);
    *out = e;
    return MT_OK;
fail:
    mt_engine_free(e);
    return st;
}

void mt_engine_free(mt_engine_t e) {
    if (!e) {
        return;
    }
    mt_model_set_hooks(e->model, NULL);
    bool clean = true;
    for (int i = 0; i < e->n_stuck; i++) {
        clean = clean && eng_wait(e, &e->stuck[i]) == MT_OK;
    }
    clean = clean && eng_drain(e) == MT_OK;
    for (int k = 0; clean && k < e->n_units; k++) {
        clean = eng_release_params(e, k) == MT_OK && eng_wait(e, &e->units[k].gwork) == MT_OK;
    }
    if (!clean) {
        MT_WARN("engine %s (dp rank %d): communication still outstanding at free: its buffers are leaked, not freed",
                e->name, e->rank);
        return;
    }
    for (int i = 0; i < e->n_params; i++) {
        mt_param_t *p = mt_model_param(e->model, i);
        p->data = NULL;
        p->grad = NULL;
    }
    mt_optim_free(e->opt);
    pool_free(&e->gpool);
    pool_free(&e->ppool);
    mt_device_free(e->dev, e->pflat);
    mt_device_free(e->dev, e->gflat);
    mt_device_free(e->dev, e->pshard);
    mt_device_free(e->dev, e->gshard);
    mt_device_free(e->dev, e->dsum);
    mt_free(e->units);
    mt_free(e->unit_params);
    mt_free(e->param_unit);
    mt_free(e->param_pos);
    mt_free(e->mod_off);
    mt_free(e->mod_units);
    mt_free(e->fifo);
    mt_free(e->piece_param);
    mt_free(e->piece_lo);
    mt_free(e->piece_hi);
    mt_free(e);
}

mt_status_t mt_engine_zero_grads(mt_engine_t e) {
    MT_CHECK(eng_drain(e));
    memset(&e->cur, 0, sizeof(e->cur));
    e->micro = 0;
    e->in_backward = false;
    for (int k = 0; k < e->n_units; k++) {
        e->units[k].launched = false;
        e->units[k].pending = e->units[k].np;
        e->units[k].t_launch = e->units[k].t_done = 0.0;
    }
    if (e->gflat) {
        MT_CHECK(mt_device_zero(e->dev, e->gflat, e->flat_len * sizeof(float), e->stream));
    }
    if (e->gshard) {
        MT_CHECK(mt_device_zero(e->dev, e->gshard, e->shard_len * sizeof(float), e->stream));
    }
    if (e->ops->zero_grads) {
        MT_CHECK(e->ops->zero_grads(e));
    }
    return MT_OK;
}

bool mt_engine_root_loads_batch(mt_engine_t e) {
    return e->p.kind == MT_ENGINE_DP;
}

mt_status_t mt_engine_finish_grads(mt_engine_t e) {
    return e->ops->finish_grads ? e->ops->finish_grads(e) : eng_finish_common(e);
}

/* With param_flags: the held parameters marked NORM, each element summed by exactly one rank of the group
 * (replicated units: an equal share of each parameter; sharded units: the owned slice). */
static mt_status_t flagged_sumsq(mt_engine_t e, double *out) {
    double s = 0.0;
    for (int k = 0; k < e->n_units; k++) {
        const unit_t *u = &e->units[k];
        size_t own_lo = (size_t)e->rank * u->shard, own_hi = own_lo + u->shard;
        for (int j = 0; j < u->np; j++) {
            int i = e->unit_params[u->p0 + j];
            if (!eng_flag(e, i, MT_ENGINE_PARAM_NORM)) {
                continue;
            }
            size_t pos = e->param_pos[i], n = mt_model_param(e->model, i)->numel;
            if (u->kind == UNIT_REPL) {
                size_t lo = n * (size_t)e->rank / (size_t)e->size, hi = n * (size_t)(e->rank + 1) / (size_t)e->size;
                MT_CHECK(eng_sumsq_add(e, e->gflat + u->base + pos + lo, hi - lo, &s));
                continue;
            }
            size_t a = MT_MAX(pos, own_lo), b = MT_MIN(pos + n, own_hi);
            if (a < b) {
                const float *g = e->stage == 1 ? e->gflat + u->base + a : e->gshard + u->sbase + (a - own_lo);
                MT_CHECK(eng_sumsq_add(e, g, b - a, &s));
            }
        }
    }
    *out = s;
    return MT_OK;
}

mt_status_t mt_engine_grad_sumsq(mt_engine_t e, double *total) {
    double local = 0.0;
    if (e->p.param_flags) {
        MT_CHECK(flagged_sumsq(e, &local));
    } else {
        MT_CHECK(e->ops->grad_sumsq(e, &local));
    }
    *total = local;
    if (e->size > 1) {
        e->scalar[0] = local;
        MT_CHECK(eng_all_reduce(e, false, &e->scalar[0], &e->scalar[1], 1, MT_COLL_F64, MT_REDOP_SUM, NULL));
        *total = e->scalar[1];
    }
    return MT_OK;
}

mt_status_t mt_engine_reduce_loss(mt_engine_t e, double *loss) {
    if (e->size > 1) {
        e->scalar[0] = *loss;
        MT_CHECK(eng_all_reduce(e, false, &e->scalar[0], &e->scalar[1], 1, MT_COLL_F64, MT_REDOP_SUM, NULL));
        *loss = e->scalar[1] / (double)e->size;
    }
    return MT_OK;
}

mt_status_t mt_engine_step(mt_engine_t e, float lr, float grad_scale) {
    MT_CHECK(e->ops->step(e, lr, grad_scale));
    e->last = e->cur;
    return MT_OK;
}

bool mt_engine_grad_accumulates(mt_engine_t e, int i) {
    if (i < 0 || i >= e->n_params || e->param_unit[i] < 0) {
        return false;
    }
    const unit_t *u = &e->units[e->param_unit[i]];
    return !(u->kind == UNIT_SHARD && e->stage >= 2 && !u->once);
}

mt_optim_t mt_engine_optim(mt_engine_t e) {
    return e->opt;
}

void mt_engine_comm_stats(mt_engine_t e, mt_engine_comm_stats_t *out) {
    *out = e->last;
}

/* A buffer of floats on the engine's device as the allocator accounts it (on the CPU table, mt_alloc_size). */
static int64_t asize(const void *p, size_t floats) {
    return p ? (int64_t)mt_alloc_accounted(floats * sizeof(float)) : 0;
}

void mt_engine_mem(mt_engine_t e, mt_engine_mem_t *out) {
    memset(out, 0, sizeof(*out));
    out->params = asize(e->pflat, e->flat_len) + asize(e->pshard, e->shard_len);
    out->grads = asize(e->gflat, e->flat_len) + asize(e->gshard, e->shard_len);
    for (int i = 0; e->opt && i < mt_optim_count(e->opt); i++) {
        const char *name = NULL;
        size_t n = 0;
        float *m = NULL, *v = NULL;
        if (mt_optim_state(e->opt, i, &name, &n, &m, &v) == MT_OK) {
            out->optimizer += asize(m, n) + asize(v, n);
        }
    }
    out->comm = pool_bytes(&e->gpool) + pool_bytes(&e->ppool);
    out->comm_peak = e->gpool.peak + e->ppool.peak;
    out->grad_buffers = e->gpool.n;
    out->param_buffers = e->ppool.n;
    for (int m = 0; m < e->n_modules; m++) {
        out->max_module_units = MT_MAX(out->max_module_units, e->mod_off[m + 1] - e->mod_off[m]);
    }
    out->numel = (int64_t)mt_model_numel(e->model);
    for (int k = 0; k < e->n_units; k++) {
        const unit_t *u = &e->units[k];
        out->numel_padded += (int64_t)u->len;
        out->max_unit = MT_MAX(out->max_unit, (int64_t)u->len);
        if (u->kind == UNIT_REPL && e->stage == 3) {
            out->numel_persist += (int64_t)u->numel;
        }
        bool tied = false;
        for (int j = 0; j < u->np; j++) {
            tied |= mt_model_param(e->model, e->unit_params[u->p0 + j])->tied_module >= 0;
        }
        out->n_tied_units += u->kind == UNIT_SHARD && tied;
    }
    out->n_units = e->n_units;
}
