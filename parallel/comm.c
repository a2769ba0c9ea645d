/* What the engines send and when: collectives counted with the per-rank formula of engine.h, the
 * queue of gradient collectives in flight (launched from post_backward, completed in issue order),
 * buffer pools for ZeRO-2/3 buckets and ZeRO-3 gathered parameters, and the model hooks.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/engine_impl.h"
#include "runtime/alloc.h"
#include "runtime/trace.h"

/* ---- counted collectives ------------------------------------------------------------------------
 * Per-rank bytes of a bandwidth-optimal algorithm over N ranks, b = bytes of the buffer per rank:
 *   all_reduce 2b(N-1)/N; reduce_scatter / all_gather (N-1)/N of the whole N*c buffer; broadcast and
 *   reduce b(N-1)/N (a chain: N-1 of the N ranks send b); point-to-point: what this rank sends. */

void eng_count_send(mt_engine_t e, bool model, double bytes) {
    if (!e->counting) {
        return;
    }
    if (model) {
        e->cur.bytes_model += bytes;
    } else {
        e->cur.bytes_other += bytes;
    }
}

static double frac(mt_engine_t e) {
    return (double)(e->size - 1) / (double)e->size;
}

/* The collective's own message (copied first: mt_error writes the buffer it would be read from). */
static mt_status_t coll_error(mt_engine_t e, mt_status_t st, const char *op, size_t count) {
    char inner[512];
    snprintf(inner, sizeof(inner), "%s", mt_last_error_msg());
    return mt_error(st, "engine %s (dp rank %d of %d): %s of %zu elements failed: %s", e->name, e->rank, e->size, op,
                    count, inner);
}

/* Every collective is issued asynchronously; a caller that passes no work handle gets it waited for
 * here, with the communicator's timeout, so no blocking path can hang on a missing rank. */
static mt_status_t issued(mt_engine_t e, mt_status_t st, const char *op, size_t count, mt_work_t *work,
                          mt_work_t *local) {
    if (st != MT_OK) {
        return coll_error(e, st, op, count);
    }
    if (work) {
        return MT_OK;
    }
    st = eng_wait(e, local);
    if (st != MT_OK) {
        eng_keep_stuck(e, *local);
    }
    return st;
}

/* A collective whose wait failed still runs on its buffers: mt_engine_free waits for it again (and
 * leaks the engine's buffers if it still has not finished). */
void eng_keep_stuck(mt_engine_t e, mt_work_t w) {
    if (!w) {
        return;
    }
    if (e->n_stuck < (int)(sizeof(e->stuck) / sizeof(e->stuck[0]))) {
        e->stuck[e->n_stuck++] = w;
        return;
    }
    MT_WARN("engine %s (dp rank %d): too many timed-out collectives; aborting the communicator", e->name, e->rank);
    mt_comm_abort(e->comm);
}

mt_status_t eng_all_reduce(mt_engine_t e, bool model, const void *send, void *recv, size_t count, mt_coll_dtype_t dt,
                           mt_redop_t op, mt_work_t *work) {
    eng_count_send(e, model, 2.0 * (double)(count * mt_coll_dtype_size(dt)) * frac(e));
    e->cur.n_calls++;
    mt_work_t local = NULL;
    mt_status_t st = mt_coll_all_reduce(e->comm, send, recv, count, dt, op, NULL, work ? work : &local);
    return issued(e, st, "all_reduce", count, work, &local);
}

mt_status_t eng_reduce_scatter(mt_engine_t e, const void *send, void *recv, size_t count, mt_work_t *work) {
    eng_count_send(e, true, (double)(count * sizeof(float)) * (double)(e->size - 1));
    e->cur.n_calls++;
    mt_work_t local = NULL;
    mt_status_t st =
        mt_coll_reduce_scatter(e->comm, send, recv, count, MT_COLL_F32, MT_REDOP_AVG, NULL, work ? work : &local);
    return issued(e, st, "reduce_scatter", count, work, &local);
}

mt_status_t eng_all_gather(mt_engine_t e, const void *send, void *recv, size_t count, mt_work_t *work) {
    eng_count_send(e, true, (double)(count * sizeof(float)) * (double)(e->size - 1));
    e->cur.n_calls++;
    mt_work_t local = NULL;
    mt_status_t st = mt_coll_all_gather(e->comm, send, recv, count, MT_COLL_F32, NULL, work ? work : &local);
    return issued(e, st, "all_gather", count, work, &local);
}

mt_status_t eng_broadcast(mt_engine_t e, bool model, void *buf, size_t count, mt_coll_dtype_t dt, int root) {
    eng_count_send(e, model, (double)(count * mt_coll_dtype_size(dt)) * frac(e));
    e->cur.n_calls++;
    mt_work_t local = NULL;
    mt_status_t st = mt_coll_broadcast(e->comm, buf, buf, count, dt, root, NULL, &local);
    return issued(e, st, "broadcast", count, NULL, &local);
}

mt_status_t eng_reduce(mt_engine_t e, void *buf, size_t count, int root) {
    eng_count_send(e, true, (double)(count * sizeof(float)) * frac(e));
    e->cur.n_calls++;
    mt_work_t local = NULL;
    mt_status_t st = mt_coll_reduce(e->comm, buf, buf, count, MT_COLL_F32, MT_REDOP_AVG, root, NULL, &local);
    return issued(e, st, "reduce", count, NULL, &local);
}

/* On failure (a timeout names the operation) the handle is kept: the collective may still be using
 * its buffers, which mt_engine_free then leaks rather than frees. */
mt_status_t eng_wait(mt_engine_t e, mt_work_t *work) {
    if (!*work) {
        return MT_OK;
    }
    double t0 = mt_now();
    mt_status_t st = mt_work_wait(*work, -1.0);
    e->cur.wait_s += mt_now() - t0;
    if (st != MT_OK) {
        char inner[512];
        snprintf(inner, sizeof(inner), "%s", mt_last_error_msg());
        return mt_error(st, "engine %s (dp rank %d of %d): waiting for a collective failed: %s", e->name, e->rank,
                        e->size, inner);
    }
    mt_work_free(*work);
    *work = NULL;
    return MT_OK;
}

/* ---- pools ----------------------------------------------------------------------------------------- */

float *pool_get(pool_t *pl, size_t floats) {
    int best = -1;
    for (int i = 0; i < pl->n; i++) {
        if (!pl->busy[i] && pl->sizes[i] >= floats && (best < 0 || pl->sizes[i] < pl->sizes[best])) {
            best = i;
        }
    }
    if (best < 0) {
        return NULL;
    }
    pl->busy[best] = true;
    return pl->bufs[best];
}

/* A buffer of floats on the pool's device (NULL when out of memory). Its bytes are counted as the host
 * allocator accounts them (what mt_alloc_size reports for the CPU table's blocks, and what the planner adds). */
static float *pool_alloc(pool_t *pl, size_t floats) {
    void *b = NULL;
    return mt_device_alloc(pl->dev, &b, floats * sizeof(float), MT_MEM_COMM, pl->owner, pl->stream) == MT_OK ? b : NULL;
}

static int64_t pool_buf_bytes(size_t floats) {
    return (int64_t)mt_alloc_accounted(floats * sizeof(float));
}

/* Called after pool_get found nothing that fits: a free buffer (too small) is replaced by one of the
 * size asked for, so the pool never holds more buffers than were ever in use at once. */
mt_status_t pool_grow(pool_t *pl, size_t floats, float **out) {
    for (int i = 0; i < pl->n; i++) {
        if (!pl->busy[i]) {
            pl->bytes -= pool_buf_bytes(pl->sizes[i]);
            mt_device_free(pl->dev, pl->bufs[i]);
            pl->bufs[i] = pool_alloc(pl, floats);
            pl->sizes[i] = pl->bufs[i] ? floats : 0;
            if (!pl->bufs[i]) {
                return mt_error(MT_ERR_OOM, "engine: cannot allocate a %s of %zu bytes", pl->owner,
                                floats * sizeof(float));
            }
            pl->busy[i] = true;
            pl->bytes += pool_buf_bytes(floats);
            pl->peak = MT_MAX(pl->peak, pl->bytes);
            *out = pl->bufs[i];
            return MT_OK;
        }
    }
    if (pl->n == pl->cap) {
        int cap = pl->cap ? 2 * pl->cap : 4;
        float **b = realloc(pl->bufs, (size_t)cap * sizeof(*b));
        size_t *sz = b ? realloc(pl->sizes, (size_t)cap * sizeof(*sz)) : NULL;
        bool *busy = sz ? realloc(pl->busy, (size_t)cap * sizeof(*busy)) : NULL;
        if (b) {
            pl->bufs = b;
        }
        if (sz) {
            pl->sizes = sz;
        }
        if (!busy) {
            return mt_error(MT_ERR_OOM, "engine: out of memory for a buffer pool");
        }
        pl->busy = busy;
        pl->cap = cap;
    }
    float *buf = pool_alloc(pl, floats);
    if (!buf) {
        return mt_error(MT_ERR_OOM, "engine: cannot allocate a %s of %zu bytes", pl->owner, floats * sizeof(float));
    }
    pl->bytes += pool_buf_bytes(floats);
    pl->peak = MT_MAX(pl->peak, pl->bytes);
    pl->bufs[pl->n] = buf;
    pl->sizes[pl->n] = floats;
    pl->busy[pl->n++] = true;
    *out = buf;
    return MT_OK;
}

void pool_put(pool_t *pl, float *buf) {
    for (int i = 0; i < pl->n; i++) {
        if (pl->bufs[i] == buf) {
            pl->busy[i] = false;
            return;
        }
    }
    MT_ABORT("engine: buffer %p returned to pool %s that does not own it", (void *)buf, pl->owner);
}

void pool_free(pool_t *pl) {
    for (int i = 0; i < pl->n; i++) {
        mt_device_free(pl->dev, pl->bufs[i]);
    }
    free(pl->bufs);
    free(pl->sizes);
    free(pl->busy);
    memset(pl, 0, sizeof(*pl));
}

int64_t pool_bytes(const pool_t *pl) {
    return pl->bytes;
}

/* ---- gradient collectives ------------------------------------------------------------------------- */

/* DDP and ZeRO-1 accumulate micro-batches into full-size gradients and communicate on the last pass;
 * ZeRO-2/3 sharded units have only a bucket buffer, so they reduce-scatter every pass, except `once` units
 * (MT_ENGINE_PARAM_ONCE), whose buffer stays bound and accumulates the whole step. */
bool eng_unit_comms_this_pass(mt_engine_t e, int u) {
    if (e->p.kind == MT_ENGINE_DP) {
        return false;
    }
    if (e->units[u].kind == UNIT_SHARD && e->stage >= 2 && !e->units[u].once) {
        return true;
    }
    return e->micro >= e->p.grad_accum;
}

mt_status_t eng_launch_grad(mt_engine_t e, int k) {
    unit_t *u = &e->units[k];
    if (u->launched) {
        return MT_OK;
    }
    u->launched = true;
    if (u->kind == UNIT_REPL) {
        MT_CHECK(eng_all_reduce(e, true, e->gflat + u->base, e->gflat + u->base, u->numel, MT_COLL_F32, MT_REDOP_AVG,
                                &u->gwork));
    } else if (e->stage == 1) {
        float *g = e->gflat + u->base;
        MT_CHECK(eng_reduce_scatter(e, g, g + (size_t)e->rank * u->shard, u->shard, &u->gwork));
    } else {
        if (!u->gslot) {
            return MT_OK; /* no module wrote into it this pass (same on every rank) */
        }
        MT_CHECK(eng_reduce_scatter(e, u->gslot, u->gslot + (size_t)e->rank * u->shard, u->shard, &u->gwork));
    }
    u->t_launch = mt_now();
    u->t_done = 0.0;
    u->trace_us = mt_trace_on() ? mt_trace_now_us() : 0.0;
    if (e->cur.t_comm_first == 0.0) {
        e->cur.t_comm_first = u->t_launch;
    }
    e->fifo[(e->fifo_head + e->fifo_n) % e->n_units] = k;
    e->fifo_n++;
    return MT_OK;
}

/* The collective of unit k finished: ZeRO-2/3 add this pass's shard of the bucket into the gradient
 * shard (the first pass adds to zeros) and give the bucket back. */
static void complete_unit(mt_engine_t e, int k) {
    unit_t *u = &e->units[k];
    u->t_done = mt_now();
    if (mt_trace_on() && u->trace_us > 0.0) {
        char args[96];
        snprintf(args, sizeof(args), "\"unit\": %d, \"elements\": %zu, \"pass\": %d", k, u->len, e->micro);
        mt_trace_span("comm", u->kind == UNIT_REPL ? "grad all_reduce" : "grad reduce_scatter", u->trace_us,
                      mt_trace_now_us(), args);
    }
    if (u->kind == UNIT_SHARD && e->stage >= 2 && u->gslot) {
        const float *src = u->gslot + (size_t)e->rank * u->shard;
        float *dst = e->gshard + u->sbase;
        for (size_t i = 0; i < u->shard; i++) {
            dst[i] += src[i];
        }
        pool_put(&e->gpool, u->gslot);
        u->gslot = NULL;
    }
}

mt_status_t eng_poll(mt_engine_t e) {
    while (e->fifo_n > 0) {
        int k = e->fifo[e->fifo_head];
        bool done = false;
        mt_status_t st = mt_work_test(e->units[k].gwork, &done);
        if (st != MT_OK) {
            char inner[512];
            snprintf(inner, sizeof(inner), "%s", mt_last_error_msg());
            return mt_error(st, "engine %s (dp rank %d): gradient collective of unit %d failed: %s", e->name, e->rank,
                            k, inner);
        }
        if (!done) {
            break;
        }
        mt_work_free(e->units[k].gwork);
        e->units[k].gwork = NULL;
        complete_unit(e, k);
        e->fifo_head = (e->fifo_head + 1) % e->n_units;
        e->fifo_n--;
    }
    return MT_OK;
}

static mt_status_t drain_one(mt_engine_t e) {
    int k = e->fifo[e->fifo_head];
    MT_CHECK(eng_wait(e, &e->units[k].gwork));
    complete_unit(e, k);
    e->fifo_head = (e->fifo_head + 1) % e->n_units;
    e->fifo_n--;
    return MT_OK;
}

mt_status_t eng_drain(mt_engine_t e) {
    while (e->fifo_n > 0) {
        MT_CHECK(drain_one(e));
    }
    return MT_OK;
}

static int cmp_interval(const void *a, const void *b) {
    double x = ((const double *)a)[0], y = ((const double *)b)[0];
    return x < y ? -1 : x > y;
}

/* Overlap of the last pass's gradient collectives with backward: the union of their [launch, done]
 * intervals, and the part of it before backward ended. */
static void overlap_stats(mt_engine_t e) {
    double *iv = malloc((size_t)e->n_units * 2 * sizeof(double));
    if (!iv) {
        return;
    }
    int n = 0;
    for (int k = 0; k < e->n_units; k++) {
        if (e->units[k].t_launch > 0.0 && e->units[k].t_done > 0.0) {
            iv[2 * n] = e->units[k].t_launch;
            iv[2 * n + 1] = e->units[k].t_done;
            n++;
            e->cur.t_comm_done = MT_MAX(e->cur.t_comm_done, e->units[k].t_done);
        }
    }
    qsort(iv, (size_t)n, 2 * sizeof(double), cmp_interval);
    double busy = 0.0, hidden = 0.0, s = 0.0, t = -1.0, bend = e->cur.t_backward_end;
    for (int i = 0; i <= n; i++) {
        if (i < n && iv[2 * i] <= t) {
            t = MT_MAX(t, iv[2 * i + 1]);
            continue;
        }
        if (t >= 0.0) {
            busy += t - s;
            hidden += MT_MAX(0.0, MT_MIN(t, bend) - s);
        }
        if (i < n) {
            s = iv[2 * i];
            t = iv[2 * i + 1];
        }
    }
    e->cur.comm_busy_s = busy;
    e->cur.comm_hidden_s = hidden;
    free(iv);
}

/* End of the step's backward: launch, in unit order, every gradient collective that was not launched
 * (its parameters' modules did not signal completion on the last pass), then wait for all of them. */
mt_status_t eng_finish_common(mt_engine_t e) {
    for (int k = 0; k < e->n_units; k++) {
        if (!e->units[k].launched) {
            MT_CHECK(eng_launch_grad(e, k));
        }
    }
    MT_CHECK(eng_drain(e));
    overlap_stats(e);
    return MT_OK;
}

/* ---- ZeRO-3 parameters -------------------------------------------------------------------------- */

static mt_status_t start_gather(mt_engine_t e, int k) {
    unit_t *u = &e->units[k];
    float *slot = pool_get(&e->ppool, u->len);
    if (!slot) {
        MT_CHECK(pool_grow(&e->ppool, u->len, &slot));
    }
    u->pslot = slot;
    MT_CHECK(eng_all_gather(e, e->pshard + u->sbase, slot, u->shard, &u->pwork));
    u->pstate = 1;
    for (int j = 0; j < u->np; j++) {
        int i = e->unit_params[u->p0 + j];
        mt_model_param(e->model, i)->data = slot + e->param_pos[i];
    }
    return MT_OK;
}

static mt_status_t gather_module(mt_engine_t e, int m, bool wait) {
    if (m < 0 || m >= e->n_modules) {
        return MT_OK;
    }
    for (int j = e->mod_off[m]; j < e->mod_off[m + 1]; j++) {
        if (e->units[e->mod_units[j]].pstate == 0) {
            MT_CHECK(start_gather(e, e->mod_units[j]));
        }
    }
    for (int j = e->mod_off[m]; wait && j < e->mod_off[m + 1]; j++) {
        unit_t *u = &e->units[e->mod_units[j]];
        if (u->pstate == 1) {
            MT_CHECK(eng_wait(e, &u->pwork));
            u->pstate = 2;
        }
    }
    return MT_OK;
}

mt_status_t eng_release_params(mt_engine_t e, int k) {
    unit_t *u = &e->units[k];
    if (u->pstate == 1) {
        MT_CHECK(eng_wait(e, &u->pwork));
    }
    if (u->pstate != 0) {
        pool_put(&e->ppool, u->pslot);
        u->pslot = NULL;
        u->pstate = 0;
    }
    return MT_OK;
}

mt_status_t eng_release_all_params(mt_engine_t e) {
    for (int k = 0; k < e->n_units; k++) {
        MT_CHECK(eng_release_params(e, k));
    }
    return MT_OK;
}

static bool module_uses(mt_engine_t e, int m, int k) {
    if (m < 0 || m >= e->n_modules) {
        return false;
    }
    for (int j = e->mod_off[m]; j < e->mod_off[m + 1]; j++) {
        if (e->mod_units[j] == k) {
            return true;
        }
    }
    return false;
}

/* Frees module m's gathered units that module next (the next to run) does not use. */
static mt_status_t release_module(mt_engine_t e, int m, int next) {
    for (int j = e->mod_off[m]; j < e->mod_off[m + 1]; j++) {
        if (!module_uses(e, next, e->mod_units[j])) {
            MT_CHECK(eng_release_params(e, e->mod_units[j]));
        }
    }
    return MT_OK;
}

/* ---- ZeRO-2/3 gradient buckets ------------------------------------------------------------------ */

/* Binds the gradients of module m's sharded units to zeroed bucket buffers (if not bound in this
 * pass). With no buffer free, waits for the oldest collective in flight, else grows the pool. */
static mt_status_t bind_grads(mt_engine_t e, int m) {
    for (int j = e->mod_off[m]; j < e->mod_off[m + 1]; j++) {
        unit_t *u = &e->units[e->mod_units[j]];
        if (u->gslot) {
            continue;
        }
        float *slot = pool_get(&e->gpool, u->len);
        while (!slot && e->fifo_n > 0) {
            MT_CHECK(drain_one(e));
            slot = pool_get(&e->gpool, u->len);
        }
        if (!slot) {
            MT_CHECK(pool_grow(&e->gpool, u->len, &slot));
        }
        MT_CHECK(mt_device_zero(e->dev, slot, u->len * sizeof(float), e->stream));
        u->gslot = slot;
        for (int k = 0; k < u->np; k++) {
            int i = e->unit_params[u->p0 + k];
            mt_model_param(e->model, i)->grad = slot + e->param_pos[i];
        }
    }
    return MT_OK;
}

/* ---- hooks ------------------------------------------------------------------------------------ */

/* A backward pass begins when backward runs after a forward, or restarts at a module not below the
 * last one (micro-batches run back to back). */
static mt_status_t begin_pass(mt_engine_t e) {
    if (e->micro >= e->p.grad_accum) {
        return mt_error(MT_ERR_INVALID_USAGE,
                        "engine %s: backward pass %d in a step of grad_accum = %d: call mt_engine_zero_grads at the "
                        "start of every step and run exactly grad_accum micro-batches",
                        e->name, e->micro + 1, e->p.grad_accum);
    }
    if (e->stage >= 2) {
        MT_CHECK(eng_drain(e)); /* the previous pass's buckets are added into the shard before reuse */
    }
    e->micro++;
    for (int k = 0; k < e->n_units; k++) {
        unit_t *u = &e->units[k];
        u->pending = u->np;
        u->launched = false;
        u->t_launch = u->t_done = 0.0;
    }
    e->cur.t_comm_first = 0.0;
    return MT_OK;
}

static mt_status_t hook_pre_forward(void *arg, int m) {
    mt_engine_t e = arg;
    e->in_backward = false;
    if (e->stage == 3) {
        MT_CHECK(gather_module(e, m, true));
        MT_CHECK(gather_module(e, m + 1, false)); /* prefetch: overlaps this module's forward */
    }
    return eng_poll(e);
}

static mt_status_t hook_post_forward(void *arg, int m) {
    mt_engine_t e = arg;
    if (e->stage == 3) {
        MT_CHECK(release_module(e, m, m + 1));
    }
    return eng_poll(e);
}

static mt_status_t hook_pre_backward(void *arg, int m) {
    mt_engine_t e = arg;
    if (!e->in_backward || m >= e->last_bwd_module) {
        MT_CHECK(begin_pass(e));
    }
    e->in_backward = true;
    e->last_bwd_module = m;
    if (e->stage == 3) {
        MT_CHECK(gather_module(e, m, true));
        MT_CHECK(gather_module(e, m - 1, false));
    }
    if (e->stage >= 2) {
        MT_CHECK(bind_grads(e, m));
    }
    return eng_poll(e);
}

static mt_status_t hook_post_backward(void *arg, int m) {
    mt_engine_t e = arg;
    int first = 0, count = 0;
    mt_model_module_params(e->model, m, &first, &count);
    for (int i = first; i < first + count; i++) {
        int k = e->param_unit[i];
        if (k >= 0 && --e->units[k].pending == 0 && eng_unit_comms_this_pass(e, k)) {
            MT_CHECK(eng_launch_grad(e, k));
        }
    }
    if (e->stage == 3) {
        MT_CHECK(release_module(e, m, m - 1));
    }
    e->cur.t_backward_end = mt_now();
    return eng_poll(e);
}

void eng_install_hooks(mt_engine_t e) {
    mt_model_hooks_t h = {.pre_forward = hook_pre_forward,
                          .post_forward = hook_post_forward,
                          .pre_backward = hook_pre_backward,
                          .post_backward = hook_post_backward,
                          .arg = e};
    mt_model_set_hooks(e->model, &h);
}
