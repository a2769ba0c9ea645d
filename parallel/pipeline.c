/* Pipeline stages: splitting the module list (by hand or balanced by compute), the stage's parameter
 * storage, the step (schedule in pipeline_sched.c, then the tied-embedding gradient sum and the loss
 * broadcast), and the cross-stage reductions and gathers the training loop and tests need.
 * SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/pipeline_impl.h"
#include "parallel/tp_wait.h"
#include "runtime/alloc.h"

bool mt_pp_schedule_parse(const char *s, mt_pp_schedule_t *out) {
    if (s && strcmp(s, "gpipe") == 0) {
        *out = MT_PP_GPIPE;
        return true;
    }
    if (s && strcmp(s, "1f1b") == 0) {
        *out = MT_PP_1F1B;
        return true;
    }
    return false;
}

const char *mt_pp_schedule_name(mt_pp_schedule_t s) {
    return s == MT_PP_GPIPE ? "gpipe" : s == MT_PP_1F1B ? "1f1b" : "?";
}

int mt_pipeline_max_in_flight(mt_pp_schedule_t schedule, int p, int s, int m) {
    if (schedule == MT_PP_GPIPE) {
        return m;
    }
    return p - s < m ? p - s : m;
}

static double pl_timeout(const struct mt_pipeline *pl) {
    return pl->p.timeout_s > 0 ? pl->p.timeout_s : -1.0;
}

/* ---- splitting ------------------------------------------------------------------------------- */

/* Elements of the 2-D weights module i multiplies by per token (see mt_pipeline_split). */
static double module_cost(mt_model_t m, int i) {
    double c = 0.0;
    int n = mt_model_n_params(m);
    for (int k = 0; k < n; k++) {
        const mt_param_t *p = mt_model_param(m, k);
        if (p->ndim != 2) {
            continue;
        }
        bool charged = (p->module == i && p->tied_module < 0) || p->tied_module == i;
        if (charged) {
            c += (double)p->global_shape[0] * (double)p->global_shape[1];
        }
    }
    /* model.head_chunks > 1: the head's product runs again in backward, 8 FLOPs per weight and token, not 6 */
    if (i == mt_model_n_modules(m) - 1 && mt_model_config(m)->head_chunks > 1) {
        c *= 4.0 / 3.0;
    }
    return c;
}

static mt_status_t split_by_hand(int n, int pp, const char *spec, int *bounds) {
    int middle = n - 2;
    if (middle < 0) {
        return mt_error(MT_ERR_INVALID_ARG, "parallel.stage_layers: the model has only %d modules; leave it empty", n);
    }
    int counts[pp];
    const char *s = spec;
    int k = 0;
    while (*s) {
        if (k == pp) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "parallel.stage_layers = \"%s\" has more than parallel.pp = %d entries; give one block "
                            "count per stage",
                            spec, pp);
        }
        char *end = NULL;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno != 0 || v < 0 || v > (1 << 20) || (*end != ',' && *end != '\0')) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "parallel.stage_layers = \"%s\": entry %d is not a non-negative integer; write block "
                            "counts like \"3,3,2,2\"",
                            spec, k + 1);
        }
        counts[k++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end == ',' && *s == '\0') {
            return mt_error(MT_ERR_INVALID_ARG, "parallel.stage_layers = \"%s\" ends with a comma", spec);
        }
    }
    if (k != pp) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "parallel.stage_layers = \"%s\" has %d entries but parallel.pp = %d; give one block count "
                        "per stage",
                        spec, k, pp);
    }
    int sum = 0;
    for (int i = 0; i < pp; i++) {
        sum += counts[i];
    }
    if (sum != middle) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "parallel.stage_layers = \"%s\" sums to %d blocks but the model has %d (model.n_layer); the "
                        "counts must add up to it",
                        spec, sum, middle);
    }
    bounds[0] = 0;
    int at = 1; /* module 0 (the embedding) goes with the first stage */
    for (int i = 0; i < pp; i++) {
        at += counts[i];
        bounds[i + 1] = i == pp - 1 ? n : at;
        if (bounds[i + 1] <= bounds[i]) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "parallel.stage_layers = \"%s\": stage %d would have no module; only the first and the "
                            "last stage may have 0 blocks",
                            spec, i);
        }
    }
    return MT_OK;
}

/* Minimises the most expensive stage over all contiguous splits (dynamic programme, O(pp n^2)). */
static mt_status_t split_balanced(mt_model_t m, int n, int pp, int *bounds) {
    double *cost = calloc((size_t)n, sizeof(double));
    double *prefix = calloc((size_t)n + 1, sizeof(double));
    double *best = calloc((size_t)(pp + 1) * (size_t)(n + 1), sizeof(double));
    int *arg = calloc((size_t)(pp + 1) * (size_t)(n + 1), sizeof(int));
    mt_status_t st = MT_OK;
    if (!cost || !prefix || !best || !arg) {
        st = mt_error(MT_ERR_OOM, "pipeline: out of memory splitting %d modules", n);
        goto exit;
    }
    double total = 0.0;
    int n_costly = 0;
    for (int i = 0; i < n; i++) {
        cost[i] = module_cost(m, i);
        total += cost[i];
        n_costly += cost[i] > 0.0;
    }
    double floor_cost = n_costly ? 0.01 * total / n_costly : 1.0;
    for (int i = 0; i < n; i++) {
        if (cost[i] <= 0.0) {
            cost[i] = floor_cost;
        }
        prefix[i + 1] = prefix[i] + cost[i];
    }
#define BEST(s, j) best[(size_t)(s) * (size_t)(n + 1) + (size_t)(j)]
#define ARG(s, j) arg[(size_t)(s) * (size_t)(n + 1) + (size_t)(j)]
    /* BEST(s, j): smallest possible maximum stage cost splitting modules [0, j) into s stages. */
    for (int j = 0; j <= n; j++) {
        BEST(1, j) = j >= 1 ? prefix[j] : 1e300;
        ARG(1, j) = 0;
    }
    for (int s = 2; s <= pp; s++) {
        for (int j = 0; j <= n; j++) {
            BEST(s, j) = 1e300;
            for (int i = s - 1; i < j; i++) {
                double c = prefix[j] - prefix[i];
                double v = BEST(s - 1, i) > c ? BEST(s - 1, i) : c;
                if (v < BEST(s, j)) {
                    BEST(s, j) = v;
                    ARG(s, j) = i;
                }
            }
        }
    }
    bounds[pp] = n;
    for (int s = pp; s >= 1; s--) {
        bounds[s - 1] = ARG(s, bounds[s]);
    }
#undef BEST
#undef ARG
exit:
    free(cost);
    free(prefix);
    free(best);
    free(arg);
    return st;
}

mt_status_t mt_pipeline_split(mt_model_t model, int pp, const char *stage_layers, int *bounds) {
    int n = mt_model_n_modules(model);
    if (pp < 1 || pp > n) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "parallel.pp = %d: the model has %d modules (model.n_layer + 2), so at most %d pipeline "
                        "stages",
                        pp, n, n);
    }
    if (stage_layers && stage_layers[0]) {
        MT_CHECK(split_by_hand(n, pp, stage_layers, bounds));
    } else {
        MT_CHECK(split_balanced(model, n, pp, bounds));
    }
    for (int s = 0; s < pp; s++) {
        MT_ASSERT(bounds[s] < bounds[s + 1]);
    }
    MT_ASSERT(bounds[0] == 0 && bounds[pp] == n);
    return MT_OK;
}

/* ---- lifetime -------------------------------------------------------------------------------- */

static int stage_of_module(const struct mt_pipeline *pl, int module) {
    for (int s = 0; s < pl->n_stages; s++) {
        if (module >= pl->bounds[s] && module < pl->bounds[s + 1]) {
            return s;
        }
    }
    return -1;
}

static mt_status_t hook_pre_forward(void *arg, int module);
static mt_status_t hook_post_forward(void *arg, int module);
static mt_status_t hook_pre_backward(void *arg, int module);
static mt_status_t hook_post_backward(void *arg, int module);

/* Every stage must run the same configuration: compare a fingerprint with a MIN and a MAX reduction. */
static mt_status_t check_agreement(struct mt_pipeline *pl) {
    mt_work_t w_ = NULL;
    if (!pl->pp_comm || pl->n_stages == 1) {
        return MT_OK;
    }
    uint64_t h = 1469598103934665603ull;
    int64_t vals[8] = {pl->p.schedule,
                       pl->p.microbatches,
                       pl->p.micro_batch,
                       pl->p.seq_len,
                       pl->n_modules,
                       mt_model_act_width(pl->model),
                       (int64_t)mt_model_numel(pl->model),
                       pl->n_stages};
    for (int i = 0; i < 8; i++) {
        h = (h ^ (uint64_t)vals[i]) * 1099511628211ull;
    }
    for (int s = 0; s <= pl->n_stages; s++) {
        h = (h ^ (uint64_t)pl->bounds[s]) * 1099511628211ull;
    }
    int64_t mn = (int64_t)(h >> 1), mx = mn;
    MT_CHECK(mt_mp_wait(mt_coll_all_reduce(pl->pp_comm, &mn, &mn, 1, MT_COLL_I64, MT_REDOP_MIN, NULL, &w_), &w_,
                        pl_timeout(pl)));
    MT_CHECK(mt_mp_wait(mt_coll_all_reduce(pl->pp_comm, &mx, &mx, 1, MT_COLL_I64, MT_REDOP_MAX, NULL, &w_), &w_,
                        pl_timeout(pl)));
    if (mn != mx) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "pipeline: the stages disagree on the schedule, micro-batches, shapes or the split (stage %d "
                        "has %s, m=%d, B=%d, T=%d, modules [%d, %d)); every rank must get the same config",
                        pl->stage, mt_pp_schedule_name(pl->p.schedule), pl->p.microbatches, pl->p.micro_batch,
                        pl->p.seq_len, pl->lo, pl->hi);
    }
    return MT_OK;
}

/* One neighbour message buffer (payload and tag) on the pipeline's device. */
static mt_status_t msg_alloc(mt_pipeline_t pl, float **buf, size_t bytes, const char *owner) {
    mt_status_t st = mt_device_alloc(pl->dev, (void **)buf, bytes, MT_MEM_COMM, owner, pl->p.stream);
    if (st != MT_OK) {
        char inner[512]; /* the callee's message: mt_error reuses its buffer */
        snprintf(inner, sizeof(inner), "%s", mt_last_error_msg());
        return mt_error(st, "pipeline: cannot allocate the %zu-byte message buffer %s: %s", bytes, owner, inner);
    }
    return MT_OK;
}

mt_status_t mt_pipeline_init(mt_model_t model, mt_comm_t pp_comm, mt_comm_t emb_comm, const mt_pipeline_params_t *p,
                             mt_pipeline_t *out) {
    *out = NULL;
    if (!model || !p || p->size != sizeof(mt_pipeline_params_t)) {
        return mt_error(MT_ERR_INVALID_ARG, "pipeline: model or params NULL, or params not from "
                                            "MT_PIPELINE_PARAMS_INIT");
    }
    const mt_model_config_t *mc = mt_model_config(model);
    if (p->microbatches < 1 || p->micro_batch < 1 || p->seq_len < 1 || p->seq_len > mc->seq_len) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "pipeline: microbatches (%d) and micro_batch (%d) must be >= 1 and seq_len (%d) in [1, "
                        "model.seq_len = %d]",
                        p->microbatches, p->micro_batch, p->seq_len, mc->seq_len);
    }
    if (p->schedule != MT_PP_GPIPE && p->schedule != MT_PP_1F1B) {
        return mt_error(MT_ERR_INVALID_ARG, "pipeline: unknown schedule %d (parallel.schedule: gpipe | 1f1b)",
                        (int)p->schedule);
    }
    MT_CHECK(mt_device_require_host(p->device, "pipeline"));
    struct mt_pipeline *pl = calloc(1, sizeof(*pl));
    if (!pl) {
        return mt_error(MT_ERR_OOM, "pipeline: out of memory");
    }
    mt_status_t st = MT_OK;
    pl->model = model;
    pl->p = *p;
    pl->dev = p->device ? p->device : mt_device_cpu();
    pl->pp_comm = pp_comm;
    pl->emb_comm = emb_comm;
    pl->n_stages = pp_comm ? mt_comm_size(pp_comm) : 1;
    pl->stage = pp_comm ? mt_comm_rank(pp_comm) : 0;
    pl->n_modules = mt_model_n_modules(model);
    int np = mt_model_n_params(model);
    pl->bounds = calloc((size_t)pl->n_stages + 1, sizeof(int));
    pl->needs = calloc((size_t)np, sizeof(bool));
    pl->owns = calloc((size_t)np, sizeof(bool));
    if (!pl->bounds || !pl->needs || !pl->owns) {
        st = mt_error(MT_ERR_OOM, "pipeline: out of memory");
        goto fail;
    }
    /* Every stage computes the split; a bad stage_layers fails identically everywhere. */
    MT_CHECK_GOTO(mt_pipeline_split(model, pl->n_stages, p->stage_layers, pl->bounds), st, fail);
    pl->lo = pl->bounds[pl->stage];
    pl->hi = pl->bounds[pl->stage + 1];
    for (int i = 0; i < np; i++) {
        const mt_param_t *q = mt_model_param(model, i);
        pl->owns[i] = q->module >= pl->lo && q->module < pl->hi;
        pl->needs[i] = pl->owns[i] || (q->tied_module >= pl->lo && q->tied_module < pl->hi);
    }
    MT_CHECK_GOTO(check_agreement(pl), st, fail);

    pl->n_acts = mt_pipeline_max_in_flight(p->schedule, pl->n_stages, pl->stage, p->microbatches);
    pl->acts = calloc((size_t)pl->n_acts, sizeof(mt_acts_t));
    pl->busy = malloc((size_t)pl->n_acts * sizeof(int));
    if (!pl->acts || !pl->busy) {
        st = mt_error(MT_ERR_OOM, "pipeline: out of memory");
        goto fail;
    }
    for (int i = 0; i < pl->n_acts; i++) {
        pl->busy[i] = -1;
        MT_CHECK_GOTO(mt_acts_init(model, p->micro_batch, p->seq_len, &pl->acts[i]), st, fail);
    }
    /* (B,T,W) floats, or this tp rank's rows of them with sequence parallelism, plus the tag */
    pl->msg_floats = mt_model_act_floats(model, p->micro_batch, p->seq_len) + 1;
    size_t bytes = pl->msg_floats * sizeof(float);
    if (pl->stage < pl->n_stages - 1) {
        MT_CHECK_GOTO(msg_alloc(pl, &pl->act_send, bytes, "pipeline act send"), st, fail);
        MT_CHECK_GOTO(msg_alloc(pl, &pl->grad_recv, bytes, "pipeline grad recv"), st, fail);
    }
    if (pl->stage > 0) {
        MT_CHECK_GOTO(msg_alloc(pl, &pl->act_recv, bytes, "pipeline act recv"), st, fail);
        MT_CHECK_GOTO(msg_alloc(pl, &pl->grad_send, bytes, "pipeline grad send"), st, fail);
    }
    mt_model_get_hooks(model, &pl->inner);
    mt_model_hooks_t hk = {hook_pre_forward, hook_post_forward, hook_pre_backward, hook_post_backward, pl};
    mt_model_set_hooks(model, &hk);
    pl->hooks_installed = true;
    MT_INFO(MT_LOG_PAR, "pipeline stage %d/%d: modules [%d, %d) (%s .. %s), %s, %d micro-batches, %d held at most",
            pl->stage, pl->n_stages, pl->lo, pl->hi, mt_model_module_name(model, pl->lo),
            mt_model_module_name(model, pl->hi - 1), mt_pp_schedule_name(p->schedule), p->microbatches, pl->n_acts);
    *out = pl;
    return MT_OK;
fail:
    mt_pipeline_free(pl);
    return st;
}

void mt_pipeline_free(mt_pipeline_t pl) {
    if (!pl) {
        return;
    }
    if (pl->hooks_installed) {
        mt_model_set_hooks(pl->model, &pl->inner); /* whatever was there before the pipeline */
    }
    if (pl->acts) {
        for (int i = 0; i < pl->n_acts; i++) {
            mt_acts_free(pl->acts[i]);
        }
    }
    if (pl->params_flat || pl->grads_flat) {
        /* Unbind what we bound so the model never points into freed storage. */
        int np = mt_model_n_params(pl->model);
        for (int i = 0; i < np; i++) {
            if (pl->needs[i]) {
                mt_param_t *q = mt_model_param(pl->model, i);
                q->data = NULL;
                q->grad = NULL;
            }
        }
    }
    mt_device_free(pl->dev, pl->params_flat);
    mt_device_free(pl->dev, pl->grads_flat);
    mt_device_free(pl->dev, pl->act_send);
    mt_device_free(pl->dev, pl->act_recv);
    mt_device_free(pl->dev, pl->grad_send);
    mt_device_free(pl->dev, pl->grad_recv);
    free(pl->acts);
    free(pl->busy);
    free(pl->bounds);
    free(pl->needs);
    free(pl->owns);
    free(pl);
}

int mt_pipeline_stage(mt_pipeline_t pl) {
    return pl->stage;
}
int mt_pipeline_n_stages(mt_pipeline_t pl) {
    return pl->n_stages;
}
void mt_pipeline_range(mt_pipeline_t pl, int *lo, int *hi) {
    *lo = pl->lo;
    *hi = pl->hi;
}
bool mt_pipeline_needs_param(mt_pipeline_t pl, int i) {
    return i >= 0 && i < mt_model_n_params(pl->model) && pl->needs[i];
}
bool mt_pipeline_owns_param(mt_pipeline_t pl, int i) {
    return i >= 0 && i < mt_model_n_params(pl->model) && pl->owns[i];
}

mt_status_t mt_pipeline_alloc_params(mt_pipeline_t pl) {
    if (pl->params_flat) {
        return mt_error(MT_ERR_INVALID_USAGE, "pipeline: parameters already allocated");
    }
    int np = mt_model_n_params(pl->model);
    size_t total = 0;
    for (int i = 0; i < np; i++) {
        if (pl->needs[i]) {
            total += mt_model_param(pl->model, i)->numel;
        }
    }
    mt_status_t st = mt_device_alloc(pl->dev, (void **)&pl->params_flat, total * sizeof(float), MT_MEM_PARAMS,
                                     "pipeline stage params", pl->p.stream);
    if (st == MT_OK) {
        st = mt_device_calloc(pl->dev, (void **)&pl->grads_flat, total * sizeof(float), MT_MEM_GRADS,
                              "pipeline stage grads", pl->p.stream);
    }
    if (st != MT_OK) {
        char inner[512]; /* the callee's message: mt_error reuses its buffer */
        snprintf(inner, sizeof(inner), "%s", mt_last_error_msg());
        mt_device_free(pl->dev, pl->params_flat);
        pl->params_flat = NULL;
        return mt_error(st, "pipeline: cannot allocate stage %d's parameters and gradients (2 x %zu bytes): %s",
                        pl->stage, total * sizeof(float), inner);
    }
    pl->flat_floats = total;
    size_t off = 0;
    for (int i = 0; i < np; i++) {
        if (!pl->needs[i]) {
            continue;
        }
        mt_param_t *q = mt_model_param(pl->model, i);
        q->data = pl->params_flat + off;
        q->grad = pl->grads_flat + off;
        mt_model_param_init_values(pl->model, i, 0, q->numel, q->data);
        off += q->numel;
    }
    return MT_OK;
}

mt_status_t mt_pipeline_zero_grads(mt_pipeline_t pl) {
    if (!pl->grads_flat) {
        mt_model_zero_grads(pl->model);
        return MT_OK;
    }
    return mt_device_zero(pl->dev, pl->grads_flat, pl->flat_floats * sizeof(float), pl->p.stream);
}

/* Every step starts with all activation slots free, also after a step that failed half-way. */
static void reset_slots(mt_pipeline_t pl) {
    for (int i = 0; i < pl->n_acts; i++) {
        pl->busy[i] = -1;
    }
    pl->in_flight = 0;
}

/* ---- the step -------------------------------------------------------------------------------- */

/* Whether parameter i is read on two different stages (GPT-2's wte: embedding and head). */
static bool split_tied(mt_pipeline_t pl, int i) {
    const mt_param_t *q = mt_model_param(pl->model, i);
    return q->tied_module >= 0 && stage_of_module(pl, q->module) != stage_of_module(pl, q->tied_module);
}

static mt_status_t reduce_tied_param(mt_pipeline_t pl, int i) {
    mt_work_t w_ = NULL;
    mt_param_t *q = mt_model_param(pl->model, i);
    if (!pl->emb_comm) {
        return mt_error(MT_ERR_INVALID_USAGE,
                        "pipeline stage %d: parameter %s is read on stages %d and %d but no embedding-group "
                        "communicator was given (mt_mesh_embedding_group)",
                        pl->stage, q->name, stage_of_module(pl, q->module), stage_of_module(pl, q->tied_module));
    }
    if (!q->grad) {
        return mt_error(MT_ERR_INVALID_ARG, "pipeline: tied parameter %s has no gradient bound", q->name);
    }
    int n = mt_comm_size(pl->emb_comm);
    pl->stats.bytes_tied += (int64_t)(2.0 * (double)(q->numel * sizeof(float)) * (n - 1) / n);
    return mt_mp_wait(
        mt_coll_all_reduce(pl->emb_comm, q->grad, q->grad, q->numel, MT_COLL_F32, MT_REDOP_SUM, NULL, &w_), &w_,
        pl_timeout(pl));
}

/* Tied parameters this stage reads through the tied module (not owned here): summed after the schedule, in
 * the order the owning stage sums them (modules in backward order, parameters in registration order). */
static mt_status_t reduce_tied_readers(mt_pipeline_t pl) {
    int np = mt_model_n_params(pl->model);
    for (int mod = pl->n_modules - 1; mod >= 0; mod--) {
        for (int i = 0; i < np; i++) {
            const mt_param_t *q = mt_model_param(pl->model, i);
            if (q->module == mod && pl->needs[i] && !pl->owns[i] && split_tied(pl, i)) {
                MT_CHECK(reduce_tied_param(pl, i));
            }
        }
    }
    return MT_OK;
}

void mt_pipeline_begin_final_pass(mt_pipeline_t pl) {
    pl->final_pass = true;
}

/* ---- hooks: the pipeline's work, then the wrapped hooks --------------------------------------- */

static mt_status_t hook_pre_forward(void *arg, int module) {
    mt_pipeline_t pl = arg;
    return pl->inner.pre_forward ? pl->inner.pre_forward(pl->inner.arg, module) : MT_OK;
}
static mt_status_t hook_post_forward(void *arg, int module) {
    mt_pipeline_t pl = arg;
    return pl->inner.post_forward ? pl->inner.post_forward(pl->inner.arg, module) : MT_OK;
}
static mt_status_t hook_pre_backward(void *arg, int module) {
    mt_pipeline_t pl = arg;
    return pl->inner.pre_backward ? pl->inner.pre_backward(pl->inner.arg, module) : MT_OK;
}
/* On the final pass, module's gradients are complete here: sum the tied ones this stage owns over the
 * embedding group and run grads_ready before the wrapped hook (e.g. DDP launching the bucket). */
static mt_status_t hook_post_backward(void *arg, int module) {
    mt_pipeline_t pl = arg;
    if (pl->final_pass) {
        int first = 0, count = 0;
        mt_model_module_params(pl->model, module, &first, &count);
        for (int i = first; i < first + count; i++) {
            if (pl->owns[i] && split_tied(pl, i)) {
                MT_CHECK(reduce_tied_param(pl, i));
            }
        }
    }
    if (pl->p.grads_ready && (pl->final_pass || pl->p.grads_ready_each_pass)) {
        MT_CHECK(pl->p.grads_ready(pl->p.grads_ready_arg, module));
    }
    return pl->inner.post_backward ? pl->inner.post_backward(pl->inner.arg, module) : MT_OK;
}

mt_status_t mt_pipeline_step(mt_pipeline_t pl, const int32_t *tokens, const int32_t *targets, float *loss) {
    mt_work_t w_ = NULL;
    if (pl->lo == 0 && !tokens) {
        return mt_error(MT_ERR_INVALID_ARG, "pipeline: the first stage needs the step's tokens");
    }
    if (pl->hi == pl->n_modules && !targets) {
        return mt_error(MT_ERR_INVALID_ARG, "pipeline: the last stage needs the step's targets");
    }
    memset(&pl->stats, 0, sizeof(pl->stats));
    pl->stats.n_acts = pl->n_acts;
    pl->loss_sum = 0.0f;
    reset_slots(pl);
    double t0 = mt_now();
    pl->final_pass = false;
    mt_status_t st = mt_pipeline_run_schedule(pl, tokens, targets);
    pl->final_pass = false;
    MT_CHECK(st);
    MT_ASSERT(pl->in_flight == 0 && pl->stats.n_backward == pl->p.microbatches);
    pl->stats.step_s = mt_now() - t0;
    MT_CHECK(reduce_tied_readers(pl));
    float l = pl->loss_sum / (float)pl->p.microbatches;
    if (pl->pp_comm && pl->n_stages > 1) {
        pl->stats.bytes_loss += (int64_t)((double)sizeof(float) * (pl->n_stages - 1) / pl->n_stages);
        MT_CHECK(mt_mp_wait(mt_coll_broadcast(pl->pp_comm, &l, &l, 1, MT_COLL_F32, pl->n_stages - 1, NULL, &w_), &w_,
                            pl_timeout(pl)));
    }
    if (loss) {
        *loss = l;
    }
    return MT_OK;
}

mt_status_t mt_pipeline_eval(mt_pipeline_t pl, const int32_t *tokens, const int32_t *targets, float *loss) {
    mt_work_t w_ = NULL;
    if (pl->lo == 0 && !tokens) {
        return mt_error(MT_ERR_INVALID_ARG, "pipeline: the first stage needs the batch's tokens");
    }
    if (pl->hi == pl->n_modules && !targets) {
        return mt_error(MT_ERR_INVALID_ARG, "pipeline: the last stage needs the batch's targets");
    }
    pl->loss_sum = 0.0f;
    reset_slots(pl);
    MT_CHECK(mt_pipeline_run_forward(pl, tokens, targets));
    float l = pl->loss_sum / (float)pl->p.microbatches;
    if (pl->pp_comm && pl->n_stages > 1) {
        MT_CHECK(mt_mp_wait(mt_coll_broadcast(pl->pp_comm, &l, &l, 1, MT_COLL_F32, pl->n_stages - 1, NULL, &w_), &w_,
                            pl_timeout(pl)));
    }
    if (loss) {
        *loss = l;
    }
    return MT_OK;
}

mt_status_t mt_pipeline_grad_sumsq(mt_pipeline_t pl, double *total) {
    mt_work_t w_ = NULL;
    double s = 0.0;
    int np = mt_model_n_params(pl->model);
    for (int i = 0; i < np; i++) {
        const mt_param_t *q = mt_model_param(pl->model, i);
        if (!pl->owns[i] || !q->grad) {
            continue;
        }
        double qs = 0.0;
        MT_CHECK(mt_device_sumsq(pl->dev, &qs, NULL, q->grad, q->numel, pl->p.stream));
        s += qs;
    }
    if (pl->pp_comm && pl->n_stages > 1) {
        MT_CHECK(mt_mp_wait(mt_coll_all_reduce(pl->pp_comm, &s, &s, 1, MT_COLL_F64, MT_REDOP_SUM, NULL, &w_), &w_,
                            pl_timeout(pl)));
    }
    *total = s;
    return MT_OK;
}

mt_status_t mt_pipeline_gather_param(mt_pipeline_t pl, int i, int root, float *out) {
    if (i < 0 || i >= mt_model_n_params(pl->model) || root < 0 || root >= pl->n_stages) {
        return mt_error(MT_ERR_INVALID_ARG, "pipeline: gather of parameter %d to stage %d out of range", i, root);
    }
    const mt_param_t *q = mt_model_param(pl->model, i);
    int owner = stage_of_module(pl, q->module);
    if (pl->stage == owner && !q->data) {
        return mt_error(MT_ERR_INVALID_ARG, "pipeline: parameter %s has no data bound on its stage %d", q->name, owner);
    }
    if (owner == root) {
        if (pl->stage == root) {
            MT_CHECK(mt_device_copy(pl->dev, out, q->data, q->numel * sizeof(float), pl->p.stream));
            return mt_device_wait(pl->dev, pl->p.stream);
        }
        return MT_OK;
    }
    mt_work_t w = NULL;
    double timeout = pl->p.timeout_s > 0 ? pl->p.timeout_s : -1.0;
    if (pl->stage == owner) {
        MT_CHECK(mt_coll_send(pl->pp_comm, q->data, q->numel, MT_COLL_F32, root, NULL, &w));
    } else if (pl->stage == root) {
        MT_CHECK(mt_coll_recv(pl->pp_comm, out, q->numel, MT_COLL_F32, owner, NULL, &w));
    } else {
        return MT_OK;
    }
    mt_status_t st = mt_work_wait(w, timeout);
    mt_work_free(w);
    if (st != MT_OK) {
        char inner[512]; /* the callee's message: mt_error reuses its buffer */
        snprintf(inner, sizeof(inner), "%s", mt_last_error_msg());
        return mt_error(st, "pipeline stage %d: gathering parameter %s (stage %d -> %d) failed: %s", pl->stage, q->name,
                        owner, root, inner);
    }
    return MT_OK;
}

void mt_pipeline_stats(mt_pipeline_t pl, mt_pipeline_stats_t *out) {
    *out = pl->stats;
}
