/* Per-rank memory of a layout, in the bytes the runtime allocator accounts, by category. The model's share
 * (parameter shapes per tensor-parallel rank, each module's saved activations, the model's workspace) and
 * the optimizer's state come from the functions that size those allocations: mt_model_init's parameter
 * registry, mt_model_act_mem, mt_optim_state_buffers and mt_alloc_accounted. The storage layouts of the
 * data-parallel engines and the pipeline stage split follow parallel/ (docs/parallel.md, docs/planning.md).
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "plan/plan_impl.h"

/* ---- the model of one tensor-parallel rank ----------------------------------------------------- */

static mt_status_t no_tp_op(void *ctx, float *buf, size_t count) {
    (void)ctx;
    (void)buf;
    (void)count;
    return mt_error(MT_ERR_INVALID_USAGE, "plan: a planning model never runs");
}
static mt_status_t no_tp_gather(void *ctx, const float *send, float *recv, size_t count) {
    (void)ctx;
    (void)send;
    (void)recv;
    (void)count;
    return mt_error(MT_ERR_INVALID_USAGE, "plan: a planning model never runs");
}
static const mt_tp_ops_t plan_tp_ops = {.ctx = NULL, .all_reduce_sum = no_tp_op, .all_gather = no_tp_gather};

mt_status_t plan_build_model(const mt_plan_job_t *job, int tp, mt_plan_rc_t rc, mt_model_t *out) {
    mt_model_config_t c = job->model;
    c.tp_rank = 0;
    c.tp_size = tp;
    c.tp_ops = tp > 1 ? &plan_tp_ops : NULL;
    c.recompute = rc == MT_PLAN_RC_BLOCK || rc == MT_PLAN_RC_BLOCK_ATTN ? MT_RECOMPUTE_BLOCK : MT_RECOMPUTE_NONE;
    c.attn_recompute = rc == MT_PLAN_RC_ATTN || rc == MT_PLAN_RC_BLOCK_ATTN;
    return mt_model_init(&c, out);
}

/* ---- pipeline stages ---------------------------------------------------------------------------- */

/* Cost of module i: elements of the 2-D weights it multiplies by per token (its own, except weights tied
 * to another module, plus tied weights it reads), or 1% of the average block when it has none: the rule of
 * parallel/pipeline.h (mt_pipeline_split, balanced). */
static void module_costs(mt_model_t m, double *cost) {
    int n = mt_model_n_modules(m);
    double sum = 0;
    int with = 0;
    for (int i = 0; i < n; i++) {
        cost[i] = 0;
    }
    for (int k = 0; k < mt_model_n_params(m); k++) {
        const mt_param_t *p = mt_model_param(m, k);
        if (!p->is_weight2d) {
            continue;
        }
        int user = p->tied_module >= 0 ? p->tied_module : p->module;
        cost[user] += (double)p->numel;
    }
    for (int i = 0; i < n; i++) {
        if (cost[i] > 0) {
            sum += cost[i];
            with++;
        }
    }
    for (int i = 0; i < n; i++) {
        if (cost[i] == 0) {
            cost[i] = with ? 0.01 * sum / with : 1.0;
        }
    }
}

/* Contiguous split of the modules into pp non-empty stages minimising the most expensive stage (dynamic
 * programming over prefix sums; ties go to the split with earlier boundaries). */
mt_status_t plan_split(mt_model_t m, int pp, int *bounds) {
    int n = mt_model_n_modules(m);
    if (pp < 1 || pp > n) {
        return mt_error(MT_ERR_INVALID_ARG, "parallel.pp = %d: the model has %d modules (a stage needs at least one)",
                        pp, n);
    }
    double *cost = calloc((size_t)n, sizeof(double)), *pre = calloc((size_t)n + 1, sizeof(double));
    double *best = calloc((size_t)(pp + 1) * (size_t)(n + 1), sizeof(double));
    int *arg = calloc((size_t)(pp + 1) * (size_t)(n + 1), sizeof(int));
    if (!cost || !pre || !best || !arg) {
        free(cost);
        free(pre);
        free(best);
        free(arg);
        return mt_error(MT_ERR_OOM, "plan: out of memory splitting %d modules", n);
    }
    module_costs(m, cost);
    for (int i = 0; i < n; i++) {
        pre[i + 1] = pre[i] + cost[i];
    }
#define B_(s, j) best[(size_t)(s) * (size_t)(n + 1) + (size_t)(j)]
#define A_(s, j) arg[(size_t)(s) * (size_t)(n + 1) + (size_t)(j)]
    for (int j = 0; j <= n; j++) {
        B_(1, j) = j >= 1 ? pre[j] : 1e300;
        A_(1, j) = 0;
    }
    for (int s = 2; s <= pp; s++) {
        for (int j = 0; j <= n; j++) {
            B_(s, j) = 1e300;
            for (int k = s - 1; k < j; k++) {
                double v = MT_MAX(B_(s - 1, k), pre[j] - pre[k]);
                if (v < B_(s, j) * (1 - 1e-12)) {
                    B_(s, j) = v;
                    A_(s, j) = k;
                }
            }
        }
    }
    bounds[pp] = n;
    for (int s = pp; s >= 1; s--) {
        bounds[s - 1] = A_(s, bounds[s]);
    }
#undef B_
#undef A_
    free(cost);
    free(pre);
    free(best);
    free(arg);
    return MT_OK;
}

/* ---- storage of parameters, gradients and optimizer state --------------------------------------- */

static int64_t acc(size_t bytes) {
    return (int64_t)mt_alloc_accounted(bytes);
}

static bool stage_needs(const mt_param_t *p, int lo, int hi) {
    return (p->module >= lo && p->module < hi) || (p->tied_module >= lo && p->tied_module < hi);
}

static size_t round_up(size_t n, size_t mult) {
    return (n + mult - 1) / mult * mult;
}

#define ENG_ALIGN_FLOATS 16 /* parallel/engine_impl.h: every unit starts 64-byte aligned */

/* A data-parallel engine over the whole model (as parallel3d.c creates it on every stage) on dp ranks,
 * dp rank 0: units as parallel/bucket.c lays them out (buckets in reverse registration order closed at
 * the first-bucket cap, then bucket_mb; ZeRO-3 one unit per module and per tied parameter), each padded to
 * a multiple of 16 floats (replicated) or dp x 16 (sharded); the optimizer holds this rank's pieces. */
static void engine_mem(const mt_plan_job_t *job, mt_model_t m, mt_plan_engine_t eng, int dp, int64_t mem[MT_MEM_NCAT]) {
    int np = mt_model_n_params(m), nbuf = mt_optim_state_buffers(&job->optim);
    int stage = eng == MT_PLAN_ZERO1 ? 1 : eng == MT_PLAN_ZERO2 ? 2 : eng == MT_PLAN_ZERO3 ? 3 : 0;
    bool sharded = stage > 0;
    size_t N = (size_t)dp, flat = 0, shard_len = 0, max_len = 0;
    int64_t opt = 0;
    /* units: lists of parameters */
    int *unit_of = calloc((size_t)np + 1, sizeof(int));
    int n_units = 0;
    if (!unit_of) {
        return;
    }
    if (stage == 3) {
        for (int mod = 0; mod < mt_model_n_modules(m); mod++) {
            int first = 0, count = 0;
            mt_model_module_params(m, mod, &first, &count);
            int plain = -1;
            for (int i = first; i < first + count; i++) {
                if (mt_model_param(m, i)->tied_module >= 0) {
                    unit_of[i] = n_units++;
                }
            }
            for (int i = first; i < first + count; i++) {
                if (mt_model_param(m, i)->tied_module < 0) {
                    if (plain < 0) {
                        plain = n_units++;
                    }
                    unit_of[i] = plain;
                }
            }
        }
    } else {
        double cap = 1.0 * 1048576.0, held = 0;
        int u = -1;
        for (int i = np - 1; i >= 0; i--) {
            if (u < 0) {
                u = n_units++;
                held = 0;
            }
            unit_of[i] = u;
            held += (double)mt_model_param(m, i)->numel * sizeof(float);
            if (held >= cap) {
                u = -1;
                cap = job->bucket_mb * 1048576.0;
            }
        }
    }
    /* parameters grouped by unit in the order the engine packs them: buckets are filled from the last
     * parameter backwards, ZeRO-3 module units forwards (counting sort) */
    int *start = calloc((size_t)n_units + 1, sizeof(int)), *order = calloc((size_t)np + 1, sizeof(int));
    if (!start || !order) {
        free(start);
        free(order);
        free(unit_of);
        return;
    }
    for (int i = 0; i < np; i++) {
        start[unit_of[i] + 1]++;
    }
    for (int u = 0; u < n_units; u++) {
        start[u + 1] += start[u];
    }
    int *fill = calloc((size_t)n_units + 1, sizeof(int));
    for (int k = 0; fill && k < np; k++) {
        int i = stage == 3 ? k : np - 1 - k;
        order[start[unit_of[i]] + fill[unit_of[i]]++] = i;
    }
    free(fill);
    for (int u = 0; u < n_units; u++) {
        size_t numel = 0;
        for (int j = start[u]; j < start[u + 1]; j++) {
            numel += mt_model_param(m, order[j])->numel;
        }
        size_t len = round_up(MT_MAX(numel, (size_t)1), sharded ? N * ENG_ALIGN_FLOATS : ENG_ALIGN_FLOATS);
        max_len = MT_MAX(max_len, len);
        if (sharded) {
            size_t shard = len / N, pos = 0;
            shard_len += shard;
            for (int j = start[u]; j < start[u + 1]; j++) { /* rank 0 owns unit elements [0, shard) */
                size_t e = mt_model_param(m, order[j])->numel, lo = pos, hi = MT_MIN(pos + e, shard);
                if (lo < hi) {
                    opt += nbuf * acc((hi - lo) * sizeof(float));
                }
                pos += e;
            }
        } else {
            for (int j = start[u]; j < start[u + 1]; j++) {
                opt += nbuf * acc(mt_model_param(m, order[j])->numel * sizeof(float));
            }
        }
        if (stage != 3) {
            flat += len;
        }
    }
    free(start);
    free(order);
    mem[MT_MEM_PARAMS] += flat ? acc(flat * sizeof(float)) : 0;
    mem[MT_MEM_GRADS] += flat && stage != 2 ? acc(flat * sizeof(float)) : 0;
    if (stage >= 2) {
        mem[MT_MEM_GRADS] += acc(shard_len * sizeof(float));
        mem[MT_MEM_COMM] += acc(max_len * sizeof(float)); /* at least one gradient bucket buffer */
    }
    if (stage == 3) {
        mem[MT_MEM_PARAMS] += acc(shard_len * sizeof(float));
        mem[MT_MEM_COMM] += 2 * acc(max_len * sizeof(float)); /* gathered parameters: the module and the next */
    }
    mem[MT_MEM_OPTIMIZER] += opt;
    free(unit_of);
}

mt_status_t plan_stage_mem_model(const mt_plan_job_t *job, mt_model_t m, const int *bounds, const mt_plan_layout_t *l,
                                 int s, int64_t mem[MT_MEM_NCAT]) {
    memset(mem, 0, sizeof(int64_t) * MT_MEM_NCAT);
    int lo = bounds[s], hi = bounds[s + 1];
    /* activations: one object per micro-batch the schedule holds at once (the training loop without a
     * pipeline reuses one), each with the stage's module buffers, plus the model's shared workspace */
    mt_model_act_mem_t am;
    MT_CHECK(mt_model_act_mem(m, lo, hi, l->micro_batch, job->seq_len, &am));
    int in_flight = 1;
    if (l->pp > 1) {
        in_flight = l->schedule == MT_PLAN_GPIPE ? l->microbatches : MT_MIN(l->pp - s, l->microbatches);
    }
    mem[MT_MEM_ACTIVATIONS] = am.per_acts * in_flight + am.workspace;
    int nbuf = mt_optim_state_buffers(&job->optim);
    if (l->engine == MT_PLAN_ALLREDUCE || (l->dp == 1 && l->tp == 1 && l->pp == 1)) {
        /* the stage's own storage (mt_pipeline_alloc_params; the local engine's flat buffers with one stage):
         * one contiguous buffer of parameters and one of gradients over the parameters the stage reads, the
         * optimizer's state per tensor, and (dp > 1) the packed gradients of the dp all-reduce */
        size_t numel = 0;
        for (int i = 0; i < mt_model_n_params(m); i++) {
            const mt_param_t *p = mt_model_param(m, i);
            if (stage_needs(p, lo, hi)) {
                numel += p->numel;
                mem[MT_MEM_OPTIMIZER] += nbuf * acc(p->numel * sizeof(float));
            }
        }
        mem[MT_MEM_PARAMS] = acc(numel * sizeof(float));
        mem[MT_MEM_GRADS] = acc(numel * sizeof(float));
        mem[MT_MEM_COMM] = l->dp > 1 ? acc(numel * sizeof(float)) : 0;
    } else {
        engine_mem(job, m, l->engine, l->dp, mem);
    }
    return MT_OK;
}

mt_status_t mt_plan_stage_mem(const mt_plan_job_t *job, const mt_plan_layout_t *l, int stage,
                              int64_t mem[MT_MEM_NCAT]) {
    mt_model_t m = NULL;
    MT_CHECK(plan_build_model(job, l->tp, l->recompute, &m));
    int *bounds = calloc((size_t)l->pp + 1, sizeof(int));
    mt_status_t st = bounds ? MT_OK : mt_error(MT_ERR_OOM, "plan: out of memory");
    if (st == MT_OK && (stage < 0 || stage >= l->pp)) {
        st = mt_error(MT_ERR_INVALID_ARG, "plan: stage %d outside [0, %d)", stage, l->pp);
    }
    if (st == MT_OK) {
        st = plan_split(m, l->pp, bounds);
    }
    if (st == MT_OK) {
        st = plan_stage_mem_model(job, m, bounds, l, stage, mem);
    }
    free(bounds);
    mt_model_free(m);
    return st;
}
