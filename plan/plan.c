/* The planner's layouts and time model: which layouts meshtrain can run for a world, and for each the step
 * time = compute (model FLOPs of the slowest stage over the device rate x calibrated efficiency) +
 * tensor-parallel collectives + activation sends + data-parallel traffic not hidden behind backward +
 * pipeline bubble + optimizer step. Memory comes from plan_mem.c. The model is documented with its
 * calibration in docs/planning.md.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/model_config.h"
#include "parallel/settings.h"
#include "plan/plan_impl.h"
#include "runtime/mesh.h"
#include "runtime/topo.h"

/* ---- names ------------------------------------------------------------------------------------- */

const char *mt_plan_engine_name(mt_plan_engine_t e) {
    static const char *names[] = {"ddp", "zero-1", "zero-2", "zero-3", "allreduce"};
    return (unsigned)e < MT_PLAN_NENG ? names[e] : "?";
}

const char *mt_plan_rc_name(mt_plan_rc_t rc) {
    static const char *names[] = {"none", "attn", "block", "block+attn"};
    return (unsigned)rc < MT_PLAN_NRC ? names[rc] : "?";
}

static bool rc_block(mt_plan_rc_t rc) {
    return rc == MT_PLAN_RC_BLOCK || rc == MT_PLAN_RC_BLOCK_ATTN;
}

void mt_plan_layout_str(const mt_plan_layout_t *l, char *buf, size_t len) {
    snprintf(buf, len, "tp%d pp%d dp%d %s%s b%d m%d%s%s%s %s", l->tp, l->pp, l->dp, mt_plan_engine_name(l->engine),
             l->pp > 1 ? (l->schedule == MT_PLAN_GPIPE ? " gpipe" : " 1f1b") : "", l->micro_batch, l->microbatches,
             l->sp ? " sp" : "", l->recompute != MT_PLAN_RC_NONE ? " rc=" : "",
             l->recompute != MT_PLAN_RC_NONE ? mt_plan_rc_name(l->recompute) : "", l->order);
}

void mt_plan_layout_overrides(const mt_plan_layout_t *l, char *buf, size_t len) {
    const char *engine = "ddp";
    int zs = 1;
    switch (l->engine) {
    case MT_PLAN_ZERO1:
    case MT_PLAN_ZERO2:
    case MT_PLAN_ZERO3:
        engine = "zero";
        zs = (int)l->engine;
        break;
    default:
        break; /* ddp, or the all-reduce path (below) */
    }
    int o = snprintf(buf, len,
             "--parallel.tp=%d --parallel.pp=%d --parallel.dp=%d --parallel.order=%s --parallel.engine=%s "
             "--parallel.zero_stage=%d --parallel.schedule=%s --parallel.sequence_parallel=%s "
             "--train.micro_batch=%d --train.grad_accum=%d --model.recompute=%s --model.attn_recompute=%s",
             l->tp, l->pp, l->dp, l->order, engine, zs, l->schedule == MT_PLAN_GPIPE ? "gpipe" : "1f1b",
             l->sp ? "true" : "false", l->micro_batch, l->microbatches, rc_block(l->recompute) ? "block" : "none",
             l->recompute == MT_PLAN_RC_ATTN || l->recompute == MT_PLAN_RC_BLOCK_ATTN ? "true" : "false");
    if (l->engine == MT_PLAN_ALLREDUCE && o > 0 && (size_t)o < len) {
        snprintf(buf + o, len - (size_t)o, " --parallel.dp_reduce=allreduce");
    }
}

void mt_plan_layout_from_settings(const mt_parallel_settings_t *p, mt_plan_layout_t *l) {
    memset(l, 0, sizeof(*l));
    l->tp = p->tp;
    l->pp = p->pp;
    l->dp = p->dp;
    l->sp = p->sequence_parallel;
    l->schedule = p->pp == 1 || p->schedule == MT_PP_1F1B ? MT_PLAN_1F1B : MT_PLAN_GPIPE;
    int zero = mt_settings_zero(p);
    l->engine = zero ? (mt_plan_engine_t)(MT_PLAN_ZERO1 + zero - 1) : MT_PLAN_DDP;
    if ((p->tp > 1 || p->pp > 1) && !mt_settings_dp_engine(p, p->dp)) {
        l->engine = MT_PLAN_ALLREDUCE; /* `meshtrain train`'s built-in path (train/job_mp.c) */
    }
    snprintf(l->order, sizeof(l->order), "%s", p->order);
}

/* ---- job --------------------------------------------------------------------------------------- */

mt_status_t mt_plan_job_from_config(const mt_config_t *cfg, mt_plan_job_t *out) {
    memset(out, 0, sizeof(*out));
    MT_CHECK(mt_model_config_from(cfg, &out->model));
    mt_settings_t set;
    MT_CHECK(mt_settings_read(cfg, &set));
    out->optim = set.optim;
    out->global_batch = mt_config_int(cfg, "train.global_batch");
    out->seq_len = out->model.seq_len;
    out->prec = set.prec.compute;
    out->bucket_mb = set.par.bucket_mb;
    out->grad_clip = set.grad_clip;
    out->persist_threshold = set.par.persist_threshold;
    out->eval_batches = set.eval_chunk;
    out->tp_chunks = set.par.tp_comm_chunks;
    out->cpu_only = !strcmp(mt_config_str(cfg, "runtime.device"), "cpu");
    out->gpu_staged = !strcmp(mt_config_str(cfg, "runtime.gpu_comm"), "mpi");
    mt_model_t m = NULL;
    MT_CHECK(mt_model_init(&out->model, &m)); /* the shape is valid for one rank */
    mt_model_free(m);
    return MT_OK;
}

/* ---- validity ------------------------------------------------------------------------------------ */

/* The combinations meshtrain refuses (parallel/parallel3d.c mt_par3d_check, parallel/engine.c) and the
 * batch arithmetic of runtime/config.c. */
static mt_status_t check_layout(const mt_plan_job_t *job, int world, const mt_plan_layout_t *l, int n_modules) {
    const mt_model_config_t *mc = &job->model;
    if (l->tp < 1 || l->pp < 1 || l->dp < 1 || l->tp * l->pp * l->dp != world) {
        return mt_error(MT_ERR_INVALID_ARG, "tp x pp x dp = %d x %d x %d is not the world of %d ranks", l->tp, l->pp,
                        l->dp, world);
    }
    if (l->micro_batch < 1 || l->microbatches < 1 ||
        (int64_t)l->micro_batch * l->microbatches * l->dp != job->global_batch) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "micro_batch x microbatches x dp = %d x %d x %d is not train.global_batch = %lld",
                        l->micro_batch, l->microbatches, l->dp, (long long)job->global_batch);
    }
    if (l->pp > n_modules) {
        return mt_error(MT_ERR_INVALID_ARG, "parallel.pp = %d: the model has %d modules", l->pp, n_modules);
    }
    if (l->tp > 1) {
        if (mc->kind != MT_MODEL_GPT2) {
            return mt_error(MT_ERR_INVALID_ARG, "tensor parallelism shards GPT-2 only");
        }
        if (mc->n_head % l->tp != 0) {
            return mt_error(MT_ERR_INVALID_ARG, "model.n_head = %d is not divisible by parallel.tp = %d", mc->n_head,
                            l->tp);
        }
        if (mc->padded_vocab > 0 && mc->padded_vocab % l->tp != 0) {
            return mt_error(MT_ERR_INVALID_ARG, "model.padded_vocab = %d is not divisible by parallel.tp = %d",
                            mc->padded_vocab, l->tp);
        }
        if (rc_block(l->recompute) && !job->gpu) { /* the GPU engine's trainer recomputes sharded blocks */
            return mt_error(MT_ERR_INVALID_ARG, "model.recompute = \"block\" is refused with parallel.tp > 1 on "
                                                "CPUs");
        }
        if (l->sp && ((int64_t)l->micro_batch * job->seq_len) % l->tp != 0) {
            return mt_error(MT_ERR_INVALID_ARG, "sequence parallelism needs micro_batch x seq_len divisible by tp");
        }
    } else if (l->sp) {
        return mt_error(MT_ERR_INVALID_ARG, "sequence parallelism needs parallel.tp > 1");
    }
    bool model_parallel = l->tp > 1 || l->pp > 1;
    if (l->engine == MT_PLAN_ALLREDUCE && !model_parallel) {
        return mt_error(MT_ERR_INVALID_ARG, "the all-reduce path is the tp/pp one; with tp = pp = 1 an engine "
                                            "averages the gradients");
    }
    if (l->dp == 1 && l->engine != MT_PLAN_DDP && l->engine != MT_PLAN_ALLREDUCE) {
        return mt_error(MT_ERR_INVALID_ARG, "ZeRO shards over dp; with dp = 1 it is DDP's layout");
    }
    if (model_parallel && l->dp == 1 && l->engine != MT_PLAN_ALLREDUCE) {
        /* train/job_mp.c: with dp = 1 there is nothing to average; the stage keeps its own storage */
        return mt_error(MT_ERR_INVALID_ARG, "with tp or pp > 1 and dp = 1 `meshtrain train` runs no data-parallel "
                                            "engine (the all-reduce path's storage)");
    }
    if (model_parallel) { /* the 3-D path's own verdict (parallel3d.c) */
        MT_CHECK(plan_check_3d(job, world, l));
    }
    if (job->gpu && l->pp > 1 && l->microbatches > MT_SETTINGS_GPU_MAX_PP_MICROBATCHES) {
        return mt_error(MT_ERR_INVALID_ARG, "the GPU engine's pipeline runs at most %d micro-batches a step",
                        MT_SETTINGS_GPU_MAX_PP_MICROBATCHES);
    }
    if (job->gpu && l->engine == MT_PLAN_ALLREDUCE && l->dp > 1) {
        /* the GPU engine averages over dp by parallel.engine (it has no dp_reduce): the DDP layout's */
        return mt_error(MT_ERR_INVALID_ARG, "the GPU engine has no all-reduce path: parallel.engine averages");
    }
    if ((l->pp == 1 || l->microbatches == 1) && l->schedule != MT_PLAN_1F1B) {
        /* one stage, or one micro-batch: GPipe and 1F1B run the same steps; the plan lists 1F1B */
        return mt_error(MT_ERR_INVALID_ARG, "a schedule is chosen only with pipeline stages and micro-batches");
    }
    return MT_OK;
}

/* ---- collectives ----------------------------------------------------------------------------------- */

typedef enum { C_ALLREDUCE = 0, C_REDUCE_SCATTER, C_ALLGATHER, C_SENDRECV } coll_t;
static const char *coll_bench_name[] = {"allreduce", "reduce_scatter", "allgather", "sendrecv"};

/* nccl-tests bus-bandwidth factor (docs/collectives.md) and ring steps of one collective on n ranks. */
static double bus_factor(coll_t op, int n) {
    return op == C_ALLREDUCE ? 2.0 * (n - 1) / n : op == C_SENDRECV ? 1.0 : (double)(n - 1) / n;
}
static int ring_steps(coll_t op, int n) {
    return op == C_ALLREDUCE ? 2 * (n - 1) : op == C_SENDRECV ? 1 : n - 1;
}

static double curve_at(const mt_plan_curve_t *cv, double bytes) {
    if (bytes <= cv->size[0]) {
        return cv->time[0];
    }
    int k = 1;
    while (k < cv->n && cv->size[k] < bytes) {
        k++;
    }
    if (k == cv->n) { /* beyond the largest measurement: its bandwidth */
        return cv->time[cv->n - 1] * bytes / cv->size[cv->n - 1];
    }
    double f = (bytes - cv->size[k - 1]) / (cv->size[k] - cv->size[k - 1]);
    return cv->time[k - 1] + f * (cv->time[k] - cv->time[k - 1]);
}

/* Seconds of one collective of `bytes` (the buffer as nccl-tests counts it) on a group of n ranks over the
 * inter- or intra-node link: the measured curve of that op nearest in rank count, scaled by the ratio of
 * bus factors, or latency x ring steps + bus factor x bytes / bandwidth. */
static double coll_time(const mt_plan_cluster_t *c, coll_t op, int n, double bytes, bool inter) {
    if (n <= 1 || bytes <= 0) {
        return 0.0;
    }
    const mt_plan_curve_t *best = NULL;
    for (int k = 0; k < c->n_curves; k++) {
        const mt_plan_curve_t *cv = &c->curves[k];
        if (cv->inter != inter || strcmp(cv->op, coll_bench_name[op]) != 0 || cv->ranks < 2) {
            continue;
        }
        if (!best || abs(cv->ranks - n) < abs(best->ranks - n)) {
            best = cv;
        }
    }
    if (best) {
        double scale = op == C_SENDRECV ? 1.0 : bus_factor(op, n) / bus_factor(op, best->ranks);
        return curve_at(best, bytes) * scale;
    }
    const mt_plan_link_t *lk = inter ? &c->inter : &c->intra;
    double bw = lk->bw > 0 ? lk->bw : (inter ? c->intra.bw : c->inter.bw);
    if (bw <= 0) {
        bw = 1e9;
    }
    return ring_steps(op, n) * lk->latency_s + bus_factor(op, n) * bytes / bw;
}

/* ---- FLOPs ----------------------------------------------------------------------------------------- */

/* Model FLOPs per token of modules [lo, hi) for sequence length T, the split of mt_model_flops_per_token:
 * *mm = 6 x (elements of the parameters each module multiplies by: its own, a tied weight at the module that
 * multiplies by it, no embedding read by a lookup alone (gpt2's wpe, the mlp's wte), no padded vocabulary rows);
 * *att = 12 C T per transformer block (attention's score and value products). Block recomputation adds the
 * block's forward again (2 x elements to *mm, the MLP's hidden layer's product included, 4 C T to *att; gpu: the
 * GPU trainer's recomputation stops at gelu(fc), without the MLP's output projection); attention recomputation
 * the attention forward (4 C T to *att; inside a recomputed block, again); model.head_chunks > 1 the head's
 * product again (its logits recomputed in backward, 2 x elements to *mm). Global shapes: the caller divides by
 * tp. */
static void stage_flops(mt_model_t m, int lo, int hi, int T, mt_plan_rc_t rc, bool gpu, double *mm, double *att) {
    const mt_model_config_t *c = mt_model_config(m);
    double f = 0;
    for (int k = 0; k < mt_model_n_params(m); k++) {
        const mt_param_t *p = mt_model_param(m, k);
        if (p->module == 0 && p->tied_module < 0) { /* a lookup alone: gpt2's wpe, the mlp's wte */
            continue;
        }
        int user = p->tied_module >= 0 ? p->tied_module : p->module;
        if (user < lo || user >= hi) {
            continue;
        }
        double rows = (double)p->global_shape[0];
        if (k == 0 && c->kind == MT_MODEL_GPT2) {
            rows = c->vocab_size; /* the padded rows of wte are never used */
        }
        double e = rows * (double)p->global_shape[1];
        bool in_block = p->module > 0 && p->module < mt_model_n_modules(m) - 1; /* mlp: a hidden layer */
        bool again = rc_block(rc) && in_block && !(gpu && strstr(p->name, "mlp.proj."));
        /* model.head_chunks > 1: backward recomputes the logits, the head's product again */
        again |= c->head_chunks > 1 && user == mt_model_n_modules(m) - 1 && p->is_weight2d;
        f += 6 * e + (again ? 2 * e : 0);
    }
    *mm = f;
    *att = 0;
    if (c->kind == MT_MODEL_GPT2) {
        int blocks = 0;
        for (int i = lo; i < hi; i++) {
            blocks += i > 0 && i < mt_model_n_modules(m) - 1;
        }
        double ct = (double)c->n_embd * T;
        bool attn = rc == MT_PLAN_RC_ATTN || rc == MT_PLAN_RC_BLOCK_ATTN;
        *att = blocks * (12 * ct + (rc_block(rc) ? 4 * ct : 0) + (attn ? 4 * ct : 0));
    }
}

/* ---- one layout ------------------------------------------------------------------------------------- */

typedef struct {
    mt_model_t m;
    int *bounds;
} plan_shape_t;

static mt_topo_node_shape_t node_shape(const mt_plan_cluster_t *c) {
    mt_topo_node_shape_t s = {.n_devices = c->devices_per_node, .domain_of_local = NULL, .switch_of_local = NULL};
    return s;
}

static bool crosses(const mt_plan_cluster_t *c, int world, const mt_plan_layout_t *l, mt_axis_t axis) {
    mt_topo_node_shape_t s = node_shape(c);
    int64_t nodes = 0, dom = 0;
    mt_topo_mesh_crossings(&s, world, c->devices_per_node, l->tp, l->pp, l->dp, l->order, MT_AXIS_BIT(axis), &nodes,
                           &dom, NULL);
    return nodes > 0;
}

static int ranks_per_node(const mt_plan_cluster_t *c, int world) {
    return MT_MIN(world, c->devices_per_node);
}

/* Peak FLOP/s of one rank: the device's, or on a shared node its share of the node's cores (cores / ranks
 * of them; a rank running on several cores gets multithread_efficiency of each). */
static double device_rate(const mt_plan_cluster_t *c, mt_prec_t prec, int world) {
    double peak = c->peak_flops[prec] > 0 ? c->peak_flops[prec] : c->peak_flops[MT_PREC_FP32];
    for (int p = 0; peak <= 0 && p < MT_PREC_COUNT; p++) {
        peak = c->peak_flops[p];
    }
    if (!c->shared_node) {
        return peak;
    }
    double cores = c->cores_per_node > 0 ? c->cores_per_node : 1;
    double per_rank = cores / ranks_per_node(c, world);
    return peak / cores * per_rank * (per_rank > 1 ? c->multithread_efficiency : 1.0);
}

static double device_mem(const mt_plan_cluster_t *c, int world) {
    double m = c->shared_node ? c->mem_bytes / ranks_per_node(c, world) : c->mem_bytes;
    return m - c->reserve_bytes;
}

/* Crossing flags of a layout's tp, dp and pp groups (which groups span nodes under block placement). */
typedef struct {
    bool tp, dp, pp;
} cross_t;

static cross_t crossings(const mt_plan_cluster_t *c, int world, const mt_plan_layout_t *l) {
    cross_t x = {l->tp > 1 && crosses(c, world, l, MT_AXIS_TP), l->dp > 1 && crosses(c, world, l, MT_AXIS_DP),
                 l->pp > 1 && crosses(c, world, l, MT_AXIS_PP)};
    return x;
}

static int n_modules_of(const mt_plan_job_t *job);

/* The stage (of pp, split at bounds) that holds module. */
static int stage_of(const int *bounds, int pp, int module) {
    int s = 0;
    while (s + 1 < pp && module >= bounds[s + 1]) {
        s++;
    }
    return s;
}

static mt_status_t predict(const mt_plan_job_t *job, const mt_plan_cluster_t *c, int world, const mt_plan_layout_t *l,
                           const plan_shape_t *sh, const int64_t (*stage_mem)[MT_MEM_NCAT], cross_t xs,
                           mt_plan_pred_t *out) {
    memset(out, 0, sizeof(*out));
    out->l = *l;
    /* memory: the fullest stage; what must fit adds NCCL's own buffers (GPU engine), which may make another
     * stage the one that needs the most */
    int64_t need = 0;
    for (int s = 0; s < l->pp; s++) {
        int64_t tot = 0;
        for (int k = 0; k < MT_MEM_NCAT; k++) {
            tot += stage_mem[s][k];
        }
        if (s == 0 || tot > out->mem_total) {
            out->mem_total = tot;
            out->mem_stage = s;
            memcpy(out->mem, stage_mem[s], sizeof(out->mem));
        }
        int64_t nccl = job->gpu ? (int64_t)(plan_gpu_comms(job, sh->m, l, s) * c->nccl_comm_bytes) : 0;
        if (s == 0 || tot + nccl > need) {
            need = tot + nccl;
            out->nccl = nccl;
        }
    }
    double avail = device_mem(c, world);
    out->fits = (double)need <= avail;
    out->over = out->fits ? 0 : (int64_t)((double)need - avail);
    out->tp_cross_node = xs.tp;
    out->dp_cross_node = xs.dp;
    out->pp_cross_node = xs.pp;

    const mt_model_config_t *mc = mt_model_config(sh->m);
    int T = job->seq_len, B = l->micro_batch, mb = l->microbatches, p = l->pp;
    double tokens = (double)B * T;
    double work = tokens * mc->n_embd * ((double)mc->n_embd / l->tp); /* one C x C/tp product's multiply-adds */
    double eff = c->efficiency * (c->eff_half_work > 0 ? work / (work + c->eff_half_work) : 1.0);
    double rate = device_rate(c, job->prec, world) * eff;
    double act_bytes = tokens * mt_model_act_width(sh->m) * sizeof(float);
    /* the slowest stage's micro-batch: compute, tensor-parallel collectives */
    double micro = 0, micro_compute = 0, micro_tp = 0;
    for (int s = 0; s < p; s++) {
        int lo = sh->bounds[s], hi = sh->bounds[s + 1];
        double f_mm = 0, f_att = 0;
        stage_flops(sh->m, lo, hi, T, l->recompute, job->gpu, &f_mm, &f_att);
        double fc = (f_mm + f_att / c->attention_efficiency) * tokens / l->tp / rate;
        double ftp = 0;
        if (l->tp > 1) {
            int blocks = 0;
            for (int i = lo; i < hi; i++) {
                blocks += i > 0 && i < mt_model_n_modules(sh->m) - 1;
            }
            /* Megatron layers: 2 all-reduces forward and 2 backward per block (sequence parallelism: an
             * all-gather + reduce-scatter pair each, the same bus traffic), 1 for the vocabulary-parallel
             * embedding and 1 for the head's input gradient */
            int n_ar = 4 * blocks + (lo == 0) + (hi == mt_model_n_modules(sh->m));
            bool x = out->tp_cross_node;
            double ag = coll_time(c, C_ALLGATHER, l->tp, act_bytes, x);
            double rs = coll_time(c, C_REDUCE_SCATTER, l->tp, act_bytes, x);
            double ar = coll_time(c, C_ALLREDUCE, l->tp, act_bytes, x);
            ftp = n_ar * (l->sp ? ag + rs : ar);
            if (rc_block(l->recompute)) { /* the GPU trainer's recomputation, up to gelu(fc), in every block (at
                                           * most one fewer: a stage's last block when its forward was the last):
                                           * the attention projection's all-reduce again, or with sequence
                                           * parallelism the gathers before qkv and fc and its reduce-scatter */
                ftp += blocks * (l->sp ? 2 * ag + rs : ar);
            }
        }
        if (fc + ftp > micro) {
            micro = fc + ftp;
            micro_compute = fc;
            micro_tp = ftp;
        }
    }
    double send = p > 1 ? coll_time(c, C_SENDRECV, 2, act_bytes / (l->sp ? l->tp : 1), out->pp_cross_node) : 0;
    out->t_compute = mb * micro_compute;
    out->t_tp = mb * micro_tp;
    out->t_pp = p > 1 ? 2.0 * mb * send : 0;
    out->t_bubble = (p - 1) * (micro + (p > 1 ? 2 * send : 0));

    /* data-parallel traffic of the elements this rank's dp group averages. `once`: a tied parameter whose two
     * users are on different stages (GPT-2's wte on the end stages), which ZeRO-2/3 reduce once per step after
     * the last pass rather than per micro-batch (the CPU engines' MT_ENGINE_PARAM_ONCE, a reduce-scatter; the
     * GPU engine's on_grads, an all-reduce), and which every engine sums over the two end stages once per step
     * (charged with the dp traffic after the schedule). `outer`: the embedding's and the head's own parameters
     * (gpt2 wte, wpe, ln_f; mlp wte and the head's), which the GPU engine's ZeRO-3 keeps whole and gathers once
     * per step (wouter_fresh), the blocks per micro-batch. */
    size_t psi = 0, once = 0, outer = 0;
    int lo0 = sh->bounds[out->mem_stage], hi0 = sh->bounds[out->mem_stage + 1], last_mod = n_modules_of(job) - 1;
    for (int k = 0; k < mt_model_n_params(sh->m); k++) {
        const mt_param_t *q = mt_model_param(sh->m, k);
        bool on_stage = (q->module >= lo0 && q->module < hi0) || (q->tied_module >= lo0 && q->tied_module < hi0);
        psi += on_stage ? q->numel : 0; /* engines, too, hold only the stage's parameters */
        bool split = q->tied_module >= 0 && stage_of(sh->bounds, p, q->module) != stage_of(sh->bounds, p,
                                                                                             q->tied_module);
        once += on_stage && split ? q->numel : 0;
        outer += on_stage && (q->module == 0 || q->module == last_mod) ? q->numel : 0;
    }
    double bytes = (double)psi * sizeof(float), once_b = (double)once * sizeof(float);
    double outer_b = job->gpu ? (double)outer * sizeof(float) : 0.0;
    double bwd = micro_compute * 2.0 / 3.0, hide = c->overlap_dp;
    int dp = l->dp;
    bool x = out->dp_cross_node;
    coll_t once_op = job->gpu ? C_ALLREDUCE : C_REDUCE_SCATTER;
    double t_dp = 0;
    switch (l->engine) {
    case MT_PLAN_DDP:
        t_dp = MT_MAX(0.0, coll_time(c, C_ALLREDUCE, dp, bytes, x) - hide * bwd);
        break;
    case MT_PLAN_ZERO1:
        t_dp = MT_MAX(0.0, coll_time(c, C_REDUCE_SCATTER, dp, bytes, x) - hide * bwd) +
               coll_time(c, C_ALLGATHER, dp, bytes, x);
        break;
    case MT_PLAN_ZERO2:
        t_dp = mb * MT_MAX(0.0, coll_time(c, C_REDUCE_SCATTER, dp, bytes - once_b, x) - hide * bwd) +
               coll_time(c, once_op, dp, once_b, x) + coll_time(c, C_ALLGATHER, dp, bytes, x);
        break;
    case MT_PLAN_ZERO3:
        t_dp = mb * MT_MAX(0.0, 2 * coll_time(c, C_ALLGATHER, dp, bytes - outer_b, x) +
                                    coll_time(c, C_REDUCE_SCATTER, dp, bytes - once_b, x) - hide * micro_compute) +
               coll_time(c, C_ALLGATHER, dp, outer_b, x) + coll_time(c, once_op, dp, once_b, x);
        break;
    default:
        t_dp = coll_time(c, C_ALLREDUCE, dp, bytes, x);
        break;
    }
    /* the loss and gradient-norm all-reduces: latency; the end stages' sum of the tied wte */
    t_dp += dp > 1 ? 2 * coll_time(c, C_ALLREDUCE, dp, 8, x) : 0;
    t_dp += coll_time(c, C_ALLREDUCE, 2, once_b, out->pp_cross_node);
    out->t_dp = t_dp;
    /* optimizer: memory-bound pass over what the rank owns (parameter, gradient, state read; parameter and
     * state written) */
    int nbuf = mt_optim_state_buffers(&job->optim);
    double owned = (l->engine >= MT_PLAN_ZERO1 && l->engine <= MT_PLAN_ZERO3) ? (double)psi / dp : (double)psi;
    double mem_bw = c->shared_node ? c->mem_bw / ranks_per_node(c, world) : c->mem_bw;
    out->t_optim = owned * sizeof(float) * (3 + 2 * nbuf) / mem_bw;
    out->t_step = out->t_compute + out->t_tp + out->t_pp + out->t_bubble + out->t_dp + out->t_optim;
    return MT_OK;
}

/* Model, stage split and per-stage memory of a layout (independent of the mesh order). */
static mt_status_t shape_and_mem(const mt_plan_job_t *job, const mt_plan_layout_t *l, plan_shape_t *sh,
                                 int64_t (**mem)[MT_MEM_NCAT]) {
    sh->m = NULL;
    sh->bounds = calloc((size_t)l->pp + 1, sizeof(int));
    *mem = calloc((size_t)l->pp, sizeof(**mem));
    if (!sh->bounds || !*mem) {
        return mt_error(MT_ERR_OOM, "plan: out of memory");
    }
    MT_CHECK(plan_build_model(job, l->tp, l->sp, l->recompute, &sh->m));
    MT_CHECK(plan_split(sh->m, l->pp, sh->bounds));
    for (int s = 0; s < l->pp; s++) {
        MT_CHECK(plan_stage_mem_model(job, sh->m, sh->bounds, l, s, (*mem)[s]));
    }
    return MT_OK;
}

static void shape_free(plan_shape_t *sh, int64_t (*mem)[MT_MEM_NCAT]) {
    mt_model_free(sh->m);
    free(sh->bounds);
    free(mem);
}

/* GPT-2: embedding, n_layer blocks, head; MLP: embedding, n_layer layers, head. */
static int n_modules_of(const mt_plan_job_t *job) {
    return job->model.n_layer + 2;
}

/* The job placed on the cluster's nodes: block placement of ranks_per_node, each rank bound to its share
 * of the node's cores (cores / ranks of them, at least one), as meshtrain train's runtime.bind = "auto"
 * splits them (runtime/topo_plan.c). */
static mt_plan_job_t placed(const mt_plan_job_t *job, const mt_plan_cluster_t *c, int world) {
    mt_plan_job_t j = *job;
    j.node_ranks = ranks_per_node(c, world);
    j.node_cpus = c->cores_per_node > 0 ? MT_MAX(1, c->cores_per_node / j.node_ranks) : 0;
    j.gpu = c->gpu && !job->cpu_only;
    return j;
}

/* model.attn_recompute changes nothing on the GPU engine (its attention never stores the probabilities): the
 * enumeration lists each layout once, without it; a run with it is planned as without. */
static mt_plan_rc_t gpu_rc(const mt_plan_job_t *job, mt_plan_rc_t rc) {
    if (!job->gpu) {
        return rc;
    }
    return rc == MT_PLAN_RC_ATTN ? MT_PLAN_RC_NONE : rc == MT_PLAN_RC_BLOCK_ATTN ? MT_PLAN_RC_BLOCK : rc;
}

mt_status_t mt_plan_predict(const mt_plan_job_t *job_in, const mt_plan_cluster_t *c, int world,
                            const mt_plan_layout_t *l_in, mt_plan_pred_t *out) {
    mt_plan_job_t placed_job = placed(job_in, c, world);
    const mt_plan_job_t *job = &placed_job;
    mt_plan_layout_t gl = *l_in;
    gl.recompute = gpu_rc(job, gl.recompute);
    const mt_plan_layout_t *l = &gl;
    MT_CHECK(check_layout(job, world, l, n_modules_of(job)));
    mt_mesh_t *mesh = NULL;
    MT_CHECK(mt_mesh_create(world, l->tp, l->pp, l->dp, l->order, &mesh)); /* validates the order */
    mt_mesh_free(mesh);
    plan_shape_t sh;
    int64_t(*mem)[MT_MEM_NCAT] = NULL;
    mt_status_t st = shape_and_mem(job, l, &sh, &mem);
    if (st == MT_OK) {
        st = predict(job, c, world, l, &sh, (const int64_t(*)[MT_MEM_NCAT])mem, crossings(c, world, l), out);
    }
    shape_free(&sh, mem);
    return st;
}

void mt_plan_resolve_order(const mt_plan_cluster_t *c, int world, mt_plan_layout_t *l) {
    if (strcmp(l->order, "auto") != 0) {
        return;
    }
    mt_topo_node_shape_t s = node_shape(c);
    char order[16], why[256];
    if (mt_topo_auto_order(&s, world, c->devices_per_node, l->tp, l->pp, l->dp, order, why, sizeof(why), NULL, 0) ==
        MT_OK) {
        snprintf(l->order, sizeof(l->order), "%s", order);
    }
}

/* ---- enumeration ----------------------------------------------------------------------------------- */

static const char *orders[] = {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"};

static int cmp_pred(const void *a, const void *b) {
    const mt_plan_pred_t *x = a, *y = b;
    if (x->fits != y->fits) {
        return x->fits ? -1 : 1;
    }
    double kx = x->fits ? x->t_step : (double)x->over, ky = y->fits ? y->t_step : (double)y->over;
    if (kx != ky) {
        return kx < ky ? -1 : 1;
    }
    return x->mem_total < y->mem_total ? -1 : x->mem_total > y->mem_total ? 1 : 0; /* then the smaller */
}

typedef struct {
    mt_plan_pred_t *v;
    int n, cap;
} pred_vec_t;

static mt_status_t push_pred(pred_vec_t *pv, const mt_plan_pred_t *p) {
    if (pv->n == pv->cap) {
        int cap = pv->cap ? 2 * pv->cap : 256;
        mt_plan_pred_t *v = realloc(pv->v, (size_t)cap * sizeof(*v));
        if (!v) {
            return mt_error(MT_ERR_OOM, "plan: out of memory for %d predictions", cap);
        }
        pv->v = v;
        pv->cap = cap;
    }
    pv->v[pv->n++] = *p;
    return MT_OK;
}

/* The orders worth predicting for a (tp, pp, dp): the one "auto" resolves to first, then every other whose
 * groups cross nodes differently (orders with the same crossings have the same prediction). */
static int distinct_orders(const mt_plan_cluster_t *c, int world, mt_plan_layout_t l, char out[6][16], cross_t xs[6]) {
    mt_topo_node_shape_t s = node_shape(c);
    char autoo[16], why[256];
    int n = 0;
    if (mt_topo_auto_order(&s, world, c->devices_per_node, l.tp, l.pp, l.dp, autoo, why, sizeof(why), NULL, 0) ==
        MT_OK) {
        snprintf(out[n], 16, "%s", autoo);
        snprintf(l.order, sizeof(l.order), "%s", autoo);
        xs[n++] = crossings(c, world, &l);
    }
    for (int k = 0; k < 6; k++) {
        snprintf(l.order, sizeof(l.order), "%s", orders[k]);
        cross_t x = crossings(c, world, &l);
        bool dup = false;
        for (int j = 0; j < n; j++) {
            dup = dup || (xs[j].tp == x.tp && xs[j].dp == x.dp && xs[j].pp == x.pp);
        }
        if (!dup) {
            snprintf(out[n], 16, "%s", orders[k]);
            xs[n++] = x;
        }
    }
    return n;
}

mt_status_t mt_plan_enumerate(const mt_plan_job_t *job_in, const mt_plan_cluster_t *c, const mt_plan_opts_t *o,
                              mt_plan_pred_t **out, int *n_out) {
    *out = NULL;
    *n_out = 0;
    int world = o->world;
    mt_plan_job_t placed_job = placed(job_in, c, world);
    const mt_plan_job_t *job = &placed_job;
    pred_vec_t pv = {0};
    int n_refused = 0;
    char refused[256] = "";
    mt_status_t st = MT_OK;
    int nmod = n_modules_of(job);
    int64_t(*mem)[MT_MEM_NCAT] = calloc((size_t)nmod + 1, sizeof(*mem));
    int *bounds = calloc((size_t)nmod + 2, sizeof(int));
    if (!mem || !bounds) {
        free(mem);
        free(bounds);
        return mt_error(MT_ERR_OOM, "plan: out of memory");
    }
    for (int tp = 1; tp <= world && st == MT_OK; tp++) {
        if (world % tp) {
            continue;
        }
        for (int rcsp = 0; rcsp < 2 * MT_PLAN_NRC && st == MT_OK; rcsp++) {
            int rc = rcsp / 2, sp = rcsp % 2;
            mt_model_t m = NULL;
            if ((sp && tp == 1) || gpu_rc(job, (mt_plan_rc_t)rc) != (mt_plan_rc_t)rc ||
                plan_build_model(job, tp, sp, (mt_plan_rc_t)rc, &m) != MT_OK) {
                continue; /* this tp does not split the model (heads, vocabulary): no layout with it */
            }
            plan_shape_t sh = {.m = m, .bounds = bounds};
            for (int pp = 1; pp <= world / tp && pp <= nmod && st == MT_OK; pp++) {
                if ((world / tp) % pp) {
                    continue;
                }
                int dp = world / (tp * pp);
                if (job->global_batch % dp || plan_split(m, pp, bounds) != MT_OK) {
                    continue;
                }
                mt_plan_layout_t base = {.tp = tp, .pp = pp, .dp = dp};
                snprintf(base.order, sizeof(base.order), "tp-dp-pp");
                char ords[6][16];
                cross_t xs[6];
                int no = distinct_orders(c, world, base, ords, xs);
                int64_t per_dp = job->global_batch / dp;
                for (int64_t b = 1; b <= per_dp && st == MT_OK; b++) {
                    if (per_dp % b || (o->micro_batch > 0 && b != o->micro_batch)) {
                        continue;
                    }
                    for (int eng = 0; eng < MT_PLAN_NENG && st == MT_OK; eng++) {
                        for (int sched = 0; sched < 2 && st == MT_OK; sched++) {
                            {
                                mt_plan_layout_t l = base;
                                l.engine = (mt_plan_engine_t)eng;
                                l.schedule = (mt_plan_sched_t)sched;
                                l.micro_batch = (int)b;
                                l.microbatches = (int)(per_dp / b);
                                l.sp = sp;
                                l.recompute = (mt_plan_rc_t)rc;
                                if (check_layout(job, world, &l, nmod) != MT_OK) {
                                    continue;
                                }
                                for (int s = 0; s < pp && st == MT_OK; s++) {
                                    st = plan_stage_mem_model(job, m, bounds, &l, s, mem[s]);
                                }
                                if (st == MT_ERR_INVALID_ARG && job->gpu) {
                                    /* a micro-batch or stage the GPU trainer refuses (its checks of the shape):
                                     * not a layout; the first reason is reported if no layout is left */
                                    if (n_refused++ == 0) {
                                        snprintf(refused, sizeof(refused), "%s", mt_last_error_msg());
                                    }
                                    st = MT_OK;
                                    continue;
                                }
                                for (int k = 0; k < no && st == MT_OK; k++) {
                                    /* the shm segments depend on which ranks share a node: the order's (host
                                     * memory: not in a GPU's) */
                                    for (int s = 0; s < pp && st == MT_OK && !job->gpu; s++) {
                                        int64_t was = 0, now = 0;
                                        st = mt_plan_stage_shm_bytes(job, &l, s, MT_PLAN_PATH_TRAIN, &was);
                                        mt_plan_layout_t lk = l;
                                        snprintf(lk.order, sizeof(lk.order), "%s", ords[k]);
                                        if (st == MT_OK) {
                                            st = mt_plan_stage_shm_bytes(job, &lk, s, MT_PLAN_PATH_TRAIN, &now);
                                        }
                                        mem[s][MT_MEM_COMM] += now - was;
                                    }
                                    snprintf(l.order, sizeof(l.order), "%s", ords[k]);
                                    mt_plan_pred_t p;
                                    st = predict(job, c, world, &l, &sh, (const int64_t(*)[MT_MEM_NCAT])mem, xs[k], &p);
                                    if (st == MT_OK) {
                                        st = push_pred(&pv, &p);
                                    }
                                }
                            }
                        }
                    }
                }
            }
            mt_model_free(m);
        }
    }
    free(mem);
    free(bounds);
    if (st != MT_OK) {
        free(pv.v);
        return st;
    }
    if (pv.n == 0 && n_refused > 0) {
        return mt_error(MT_ERR_INVALID_ARG, "no layout of %d ranks runs on the GPU engine: its trainer refuses all %d "
                        "(the first: %s); runtime.device = \"cpu\" plans the host engines", world, n_refused, refused);
    }
    if (pv.n > 1) { /* qsort's base must not be NULL, even for zero elements (UBSan) */
        qsort(pv.v, (size_t)pv.n, sizeof(*pv.v), cmp_pred);
    }
    *out = pv.v;
    *n_out = pv.n;
    return MT_OK;
}
