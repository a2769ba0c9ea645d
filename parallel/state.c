/* Moving an engine's state to and from the full, layout-free form: parameters and the optimizer's
 * first/second moments in registration order (p->offset), as one process would hold them. A checkpoint
 * written from one engine, rank count or bucket size loads into any other. Not on the step's path:
 * simple collectives per unit (an all-gather to collect, a broadcast from the root to distribute).
 * SPDX-License-Identifier: MIT */
#include <string.h>

#include "parallel/engine_impl.h"
#include "runtime/alloc.h"

/* This rank's storage of state `what` for parameter i at unit element x, and in *run how many elements
 * from x on are contiguous there; NULL (with *run elements to skip) where it keeps none. */
static float *where(mt_engine_t e, mt_engine_state_t what, const unit_t *u, int i, size_t x, size_t *run) {
    size_t end = e->param_pos[i] + mt_model_param(e->model, i)->numel;
    size_t own_lo = (size_t)e->rank * u->shard, own_hi = own_lo + u->shard;
    if (what == MT_ENGINE_STATE_PARAMS) {
        if (u->full) {
            *run = end - x;
            return e->pflat + u->base + x;
        }
        if (x < own_lo || x >= own_hi) {
            *run = x < own_lo ? MT_MIN(end, own_lo) - x : end - x;
            return NULL;
        }
        *run = MT_MIN(end, own_hi) - x;
        return e->pshard + u->sbase + (x - own_lo);
    }
    size_t next = end; /* the nearest piece of this parameter after x */
    for (int j = 0; e->opt && j < e->n_pieces; j++) {
        if (e->piece_param[j] != i) {
            continue;
        }
        if (e->piece_lo[j] <= x && x < e->piece_hi[j]) {
            const char *name = NULL;
            size_t n = 0;
            float *m = NULL, *v = NULL;
            float *base = NULL;
            if (mt_optim_state(e->opt, j, &name, &n, &m, &v) == MT_OK) {
                base = what == MT_ENGINE_STATE_OPT_M ? m : v;
            }
            *run = e->piece_hi[j] - x;
            return base ? base + (x - e->piece_lo[j]) : NULL;
        }
        if (e->piece_lo[j] > x) {
            next = MT_MIN(next, e->piece_lo[j]);
        }
    }
    *run = next - x;
    return NULL;
}

static mt_status_t check(mt_engine_t e, mt_engine_state_t what, int root, const void *buf, const char *fn) {
    if (root < 0 || root >= e->size || (e->rank == root && !buf)) {
        return mt_error(MT_ERR_INVALID_ARG, "%s: root %d (of %d) needs a buffer of the model's size", fn, root,
                        e->size);
    }
    if (what < MT_ENGINE_STATE_PARAMS || what > MT_ENGINE_STATE_OPT_V) {
        return mt_error(MT_ERR_INVALID_ARG, "%s: unknown state %d", fn, (int)what);
    }
    if (what != MT_ENGINE_STATE_PARAMS) {
        if (e->p.kind == MT_ENGINE_DP && root != 0) {
            return mt_error(MT_ERR_INVALID_ARG, "%s: DP's optimizer state lives on dp rank 0: use root 0", fn);
        }
        bool has = what == MT_ENGINE_STATE_OPT_M ? (e->p.optim.kind == MT_OPTIM_ADAMW || e->p.optim.momentum > 0.0f)
                                                 : e->p.optim.kind == MT_OPTIM_ADAMW;
        if (!has) {
            return mt_error(MT_ERR_INVALID_ARG, "%s: the optimizer (%s) keeps no %s", fn,
                            e->p.optim.kind == MT_OPTIM_ADAMW ? "adamw" : "sgd",
                            what == MT_ENGINE_STATE_OPT_M ? "first moment / momentum" : "second moment");
        }
    }
    return MT_OK;
}

/* Copies n floats between a parameter's elements [x, x + n) of unit u (this rank's storage, piece by
 * piece for optimizer state) and buf (host memory or the engine's device). to_storage: buf -> storage. */
static mt_status_t copy_run(mt_engine_t e, mt_engine_state_t what, const unit_t *u, int i, size_t x, size_t n,
                            float *buf, bool to_storage) {
    size_t done = 0;
    while (done < n) {
        size_t run = 0;
        float *s = where(e, what, u, i, x + done, &run);
        run = MT_MAX(MT_MIN(run, n - done), (size_t)1);
        if (s) {
            MT_CHECK(mt_device_copy(e->dev, to_storage ? s : buf + done, to_storage ? buf + done : s,
                                    run * sizeof(float), e->stream));
        }
        done += run;
    }
    return MT_OK;
}

mt_status_t mt_engine_gather_state(mt_engine_t e, mt_engine_state_t what, int root, float *out) {
    MT_CHECK(check(e, what, root, out, "mt_engine_gather_state"));
    bool counting = e->counting;
    e->counting = false;
    mt_status_t st = MT_OK;
    float *shard = NULL, *full = NULL;
    for (int k = 0; k < e->n_units && st == MT_OK; k++) {
        const unit_t *u = &e->units[k];
        if (u->kind == UNIT_REPL) { /* whole on every rank (DP's optimizer: on rank 0 = root) */
            for (int j = 0; e->rank == root && j < u->np; j++) {
                int i = e->unit_params[u->p0 + j];
                const mt_param_t *p = mt_model_param(e->model, i);
                st = st == MT_OK ? copy_run(e, what, u, i, e->param_pos[i], p->numel, out + p->offset, false) : st;
            }
            continue;
        }
        if (!shard) {
            size_t maxlen = e->ppool.floats ? e->ppool.floats : e->gpool.floats;
            for (int q = 0; q < e->n_units; q++) {
                maxlen = MT_MAX(maxlen, e->units[q].len);
            }
            shard = eng_dev_calloc(e, maxlen * sizeof(float), MT_MEM_COMM, "engine state transfer");
            full = eng_dev_calloc(e, maxlen * sizeof(float), MT_MEM_COMM, "engine state transfer");
            if (!shard || !full) {
                st = mt_error(MT_ERR_OOM, "mt_engine_gather_state: out of memory");
                break;
            }
        }
        st = mt_device_zero(e->dev, shard, u->shard * sizeof(float), e->stream);
        size_t own_lo = (size_t)e->rank * u->shard, own_hi = own_lo + u->shard;
        for (int j = 0; j < u->np; j++) {
            int i = e->unit_params[u->p0 + j];
            size_t pos = e->param_pos[i], end = pos + mt_model_param(e->model, i)->numel;
            size_t lo = MT_MAX(pos, own_lo), hi = MT_MIN(end, own_hi);
            if (lo < hi && st == MT_OK) {
                st = copy_run(e, what, u, i, lo, hi - lo, shard + (lo - own_lo), false);
            }
        }
        st = st == MT_OK ? eng_all_gather(e, shard, full, u->shard, NULL) : st;
        for (int j = 0; st == MT_OK && e->rank == root && j < u->np; j++) {
            int i = e->unit_params[u->p0 + j];
            const mt_param_t *p = mt_model_param(e->model, i);
            st = mt_device_copy(e->dev, out + p->offset, full + e->param_pos[i], p->numel * sizeof(float), e->stream);
        }
    }
    st = st == MT_OK ? mt_device_wait(e->dev, e->stream) : st; /* out is complete on return */
    if (st == MT_OK) { /* else a timed-out collective may still use them: leaked on purpose */
        mt_device_free(e->dev, shard);
        mt_device_free(e->dev, full);
    }
    e->counting = counting;
    return st;
}

mt_status_t mt_engine_scatter_state(mt_engine_t e, mt_engine_state_t what, int root, const float *in) {
    MT_CHECK(check(e, what, root, in, "mt_engine_scatter_state"));
    if (e->stage == 3 && what == MT_ENGINE_STATE_PARAMS) {
        MT_CHECK(eng_release_all_params(e)); /* gathered copies would be stale */
    }
    bool counting = e->counting;
    e->counting = false;
    mt_status_t st = MT_OK;
    float *full = NULL;
    for (int k = 0; k < e->n_units && st == MT_OK; k++) {
        const unit_t *u = &e->units[k];
        if (!full) {
            size_t maxlen = 0;
            for (int q = 0; q < e->n_units; q++) {
                maxlen = MT_MAX(maxlen, e->units[q].len);
            }
            full = eng_dev_calloc(e, maxlen * sizeof(float), MT_MEM_COMM, "engine state transfer");
            if (!full) {
                st = mt_error(MT_ERR_OOM, "mt_engine_scatter_state: out of memory");
                break;
            }
        }
        st = mt_device_zero(e->dev, full, u->len * sizeof(float), e->stream);
        for (int j = 0; st == MT_OK && e->rank == root && j < u->np; j++) {
            int i = e->unit_params[u->p0 + j];
            const mt_param_t *p = mt_model_param(e->model, i);
            st = mt_device_copy(e->dev, full + e->param_pos[i], in + p->offset, p->numel * sizeof(float), e->stream);
        }
        /* DP's optimizer state exists on rank 0 (= root) only: nothing to send. */
        bool dp_opt = e->p.kind == MT_ENGINE_DP && what != MT_ENGINE_STATE_PARAMS;
        if (st == MT_OK && e->size > 1 && !dp_opt) {
            st = eng_broadcast(e, false, full, u->len, MT_COLL_F32, root);
        }
        for (int j = 0; st == MT_OK && j < u->np; j++) {
            int i = e->unit_params[u->p0 + j];
            size_t pos = e->param_pos[i], end = pos + mt_model_param(e->model, i)->numel;
            /* Store every element this rank keeps: all of a replicated unit, ZeRO-1/2's full parameters,
             * otherwise the owned slice (copy_run skips elements without storage). */
            st = copy_run(e, what, u, i, pos, end - pos, full + pos, true);
        }
    }
    st = st == MT_OK ? mt_device_wait(e->dev, e->stream) : st; /* in may be reused on return */
    if (st == MT_OK) {
        mt_device_free(e->dev, full);
    }
    e->counting = counting;
    return st;
}

mt_status_t mt_engine_gather_params(mt_engine_t e, int root, float *out) {
    return mt_engine_gather_state(e, MT_ENGINE_STATE_PARAMS, root, out);
}
