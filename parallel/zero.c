/* ZeRO stages 1-3 (Rajbhandari et al., 2020) over units padded so that rank r owns the equal, aligned
 * slice [r*shard, (r+1)*shard) of every unit:
 *   stage 1  full parameters and gradients, optimizer state of the owned slices only; on the last
 *            micro-batch each bucket is reduce-scattered in place during backward.
 *   stage 2  full parameters; gradients only as the owned shard: each bucket accumulates one pass in a
 *            pooled buffer, is reduce-scattered as soon as complete, and its shard added to the rank's.
 *   stage 3  parameters sharded too, one unit per module: gathered before the module's forward (the
 *            next module's gather prefetched), freed after, gathered again for backward; gradients
 *            reduce-scattered after the module's backward. Parameters below persist_threshold elements
 *            stay whole on every rank (gradients all-reduced, updated by every rank).
 * After the optimizer, stages 1/2 all-gather the updated slices; stage 3 gathers at the next use.
 * SPDX-License-Identifier: MIT */
#include "parallel/engine_impl.h"

static mt_status_t zero_layout(mt_engine_t e) {
    return e->stage == 3 ? eng_layout_modules(e) : eng_layout_buckets(e, UNIT_SHARD);
}

static mt_status_t zero_grad_sumsq(mt_engine_t e, double *local) {
    double s = 0.0;
    if (e->stage >= 2) {
        MT_CHECK(eng_sumsq_add(e, e->gshard, e->shard_len, &s));
    }
    for (int k = 0; k < e->n_units; k++) {
        const unit_t *u = &e->units[k];
        if (u->kind == UNIT_SHARD && e->stage == 1) {
            MT_CHECK(eng_sumsq_add(e, e->gflat + u->base + (size_t)e->rank * u->shard, u->shard, &s));
        } else if (u->kind == UNIT_REPL) { /* whole on every rank: each sums an equal share */
            size_t lo = u->numel * (size_t)e->rank / (size_t)e->size;
            size_t hi = u->numel * (size_t)(e->rank + 1) / (size_t)e->size;
            MT_CHECK(eng_sumsq_add(e, e->gflat + u->base + lo, hi - lo, &s));
        }
    }
    *local = s;
    return MT_OK;
}

static mt_status_t zero_step(mt_engine_t e, float lr, float grad_scale) {
    if (e->stage == 3) {
        MT_CHECK(eng_release_all_params(e)); /* no gather may read the shard while it is updated */
    }
    MT_CHECK(mt_optim_step(e->opt, lr, grad_scale));
    if (e->stage == 3) {
        return MT_OK;
    }
    /* All-gather every unit's updated slices in place, all in flight at once, then wait in order. */
    mt_status_t st = MT_OK;
    int k = 0;
    for (; k < e->n_units && st == MT_OK; k++) {
        unit_t *u = &e->units[k];
        float *p = e->pflat + u->base;
        st = eng_all_gather(e, p + (size_t)e->rank * u->shard, p, u->shard, &u->gwork);
    }
    for (int j = 0; j < k && st == MT_OK; j++) {
        st = eng_wait(e, &e->units[j].gwork); /* on failure the rest stay in flight: mt_engine_free waits */
    }
    return st;
}

const engine_ops_t mt_engine_zero_ops = {
    .layout = zero_layout,
    .grad_sumsq = zero_grad_sumsq,
    .step = zero_step,
};
