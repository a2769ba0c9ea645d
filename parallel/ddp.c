/* DDP: every rank keeps a replica. Gradients live in flat buckets in reverse registration order (the
 * order backward produces them); on the step's last micro-batch each bucket's all-reduce (average) is
 * launched asynchronously from post_backward the moment its last gradient is complete, so it overlaps
 * the rest of backward. Parameters start as rank 0's (broadcast at init), and every rank applies the
 * same update to the same averaged gradient, so replicas stay bit-identical.
 * SPDX-License-Identifier: MIT */
#include "parallel/engine_impl.h"

static mt_status_t ddp_layout(mt_engine_t e) {
    return eng_layout_buckets(e, UNIT_REPL);
}

/* Every rank holds the whole averaged gradient; each sums an equal 1/N share of the flat buffer
 * (padding is zero), and the engine adds the shares over the group. */
static mt_status_t ddp_grad_sumsq(mt_engine_t e, double *local) {
    size_t lo = e->flat_len * (size_t)e->rank / (size_t)e->size;
    size_t hi = e->flat_len * (size_t)(e->rank + 1) / (size_t)e->size;
    *local = 0.0;
    MT_CHECK(eng_sumsq_add(e, e->gflat + lo, hi - lo, local));
    return MT_OK;
}

static mt_status_t ddp_step(mt_engine_t e, float lr, float grad_scale) {
    return mt_optim_step(e->opt, lr, grad_scale);
}

const engine_ops_t mt_engine_ddp_ops = {
    .layout = ddp_layout,
    .grad_sumsq = ddp_grad_sumsq,
    .step = ddp_step,
};
