/* DP: the DataParallel pattern, kept as the baseline that shows why DDP exists. The root of the group
 * holds the parameters of record and the optimizer; it scatters each micro-batch of the global batch,
 * after backward the gradients are reduced (averaged) to it, it steps, and it broadcasts the updated
 * parameters (the initial ones at init), so every replica is current between steps.
 * Nothing overlaps: communication waits for compute and compute for communication.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <string.h>

#include "parallel/engine_impl.h"

static mt_status_t dp_layout(mt_engine_t e) {
    return eng_layout_one(e);
}

static mt_status_t dp_finish_grads(mt_engine_t e) {
    if (e->size > 1) {
        e->cur.t_comm_first = mt_now();
        MT_CHECK(eng_reduce(e, e->gflat, e->units[0].numel, 0));
        e->cur.t_comm_done = mt_now();
        e->cur.comm_busy_s = e->cur.t_comm_done - e->cur.t_comm_first;
    }
    return MT_OK;
}

static mt_status_t dp_grad_sumsq(mt_engine_t e, double *local) {
    *local = 0.0;
    if (e->rank == 0) {
        MT_CHECK(eng_sumsq_add(e, e->gflat, e->units[0].numel, local));
    }
    return MT_OK;
}

/* The root updates; its parameters then reach every replica. */
static mt_status_t dp_step(mt_engine_t e, float lr, float grad_scale) {
    if (e->rank == 0) {
        MT_CHECK(mt_optim_step(e->opt, lr, grad_scale));
    }
    return e->size > 1 ? eng_broadcast(e, true, e->pflat, e->units[0].numel, MT_COLL_F32, 0) : MT_OK;
}

mt_status_t mt_engine_scatter_batch(mt_engine_t e, const int32_t *root_buf, int32_t *buf, size_t n) {
    if (e->p.kind != MT_ENGINE_DP) {
        return mt_error(MT_ERR_INVALID_USAGE,
                        "engine %s: every rank loads its own slice of the batch; mt_engine_scatter_batch is DP's data "
                        "path (check mt_engine_root_loads_batch)",
                        e->name);
    }
    if (!buf || (e->rank == 0 && !root_buf)) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "engine dp: scatter_batch needs buf on every rank and root_buf on the root");
    }
    if (e->rank == 0) {
        memcpy(buf, root_buf, n * sizeof(int32_t));
    }
    if (e->size == 1) {
        return MT_OK;
    }
    mt_status_t st = mt_coll_group_start(e->comm);
    char inner[512];
    if (st != MT_OK) {
        snprintf(inner, sizeof(inner), "%s", mt_last_error_msg());
        return mt_error(st, "engine dp: scatter: %s", inner);
    }
    for (int r = 1; e->rank == 0 && r < e->size && st == MT_OK; r++) {
        st = mt_coll_send(e->comm, root_buf + (size_t)r * n, n, MT_COLL_I32, r, NULL, NULL);
        eng_count_send(e, false, (double)(n * sizeof(int32_t)));
    }
    if (e->rank != 0 && st == MT_OK) {
        st = mt_coll_recv(e->comm, buf, n, MT_COLL_I32, 0, NULL, NULL);
    }
    mt_work_t w = NULL;
    mt_status_t st2 = mt_coll_group_end(e->comm, NULL, &w); /* waited with the comm's timeout */
    e->cur.n_calls++;
    st = st != MT_OK ? st : st2;
    if (st == MT_OK) {
        st = eng_wait(e, &w);
        if (st != MT_OK) {
            eng_keep_stuck(e, w); /* the receive may still land in buf */
        }
        return st;
    }
    if (st != MT_OK) {
        snprintf(inner, sizeof(inner), "%s", mt_last_error_msg());
        return mt_error(st, "engine dp (dp rank %d): scattering %zu values per rank failed: %s", e->rank, n, inner);
    }
    return MT_OK;
}

const engine_ops_t mt_engine_dp_ops = {
    .layout = dp_layout,
    .finish_grads = dp_finish_grads,
    .grad_sumsq = dp_grad_sumsq,
    .step = dp_step,
};
