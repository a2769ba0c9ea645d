/* Per-rank memory of a layout, in the bytes the runtime allocator accounts, by category. The model's share
 * (parameter shapes per tensor-parallel rank, each module's saved activations, the model's workspace) and
 * the optimizer's state come from the functions that size those allocations: mt_model_init's parameter
 * registry, mt_model_act_mem, mt_optim_state_buffers and mt_alloc_accounted; the data-parallel engines'
 * storage from mt_engine_plan_mem (parallel/bucket.c); the pipeline's stage split, activations in flight and
 * message buffers from parallel/pipeline.h (mt_pipeline_split, mt_pipeline_max_in_flight, mt_model_act_floats);
 * bf16/fp16's CPU emulation scratch from mt_model_lowp_floats.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "parallel/engine.h"
#include "parallel/parallel3d.h"
#include "parallel/pipeline.h"
#include "plan/plan_impl.h"
#include "runtime/mesh.h"

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
static mt_status_t no_tp_rs(void *ctx, const float *send, float *recv, size_t count) {
    return no_tp_gather(ctx, send, recv, count);
}
static const mt_tp_ops_t plan_tp_ops = {.ctx = NULL,
                                        .all_reduce_sum = no_tp_op,
                                        .all_gather = no_tp_gather,
                                        .reduce_scatter_sum = no_tp_rs,
                                        .all_reduce_max = no_tp_op};

mt_status_t plan_build_model(const mt_plan_job_t *job, int tp, bool sp, mt_plan_rc_t rc, mt_model_t *out) {
    mt_model_config_t c = job->model;
    c.tp_rank = 0;
    c.tp_size = tp;
    c.tp_ops = tp > 1 ? &plan_tp_ops : NULL;
    c.sequence_parallel = sp && tp > 1;
    c.recompute = rc == MT_PLAN_RC_BLOCK || rc == MT_PLAN_RC_BLOCK_ATTN ? MT_RECOMPUTE_BLOCK : MT_RECOMPUTE_NONE;
    if (tp > 1 && job->gpu) { /* the GPU engine's host model of shards does not recompute; its trainer does
                               * (plan_stage_mem_gpu passes it the layout's recomputation) */
        c.recompute = MT_RECOMPUTE_NONE;
    }
    c.attn_recompute = rc == MT_PLAN_RC_ATTN || rc == MT_PLAN_RC_BLOCK_ATTN;
    return mt_model_init(&c, out);
}

/* ---- pipeline stages ---------------------------------------------------------------------------- */

/* The pipeline's own split (balanced by compute; parallel.stage_layers is not planned). */
mt_status_t plan_split(mt_model_t m, int pp, int *bounds) {
    return mt_pipeline_split(m, pp, NULL, bounds);
}

/* ---- storage of parameters, gradients and optimizer state --------------------------------------- */

static int64_t acc(size_t bytes) {
    return (int64_t)mt_alloc_accounted(bytes);
}

static bool stage_needs(const mt_param_t *p, int lo, int hi) {
    return (p->module >= lo && p->module < hi) || (p->tied_module >= lo && p->tied_module < hi);
}

/* A data-parallel engine over the stage's parameters (the whole model with tp = pp = 1; as the training loop
 * and parallel3d.c create it) on dp ranks, dp rank 0: parallel/engine.h's own sizing (mt_engine_plan_mem:
 * the layout and buffers of bucket.c, the optimizer's pieces, the pools at their bound), with the parameters
 * the training loop passes (parallel/job_engine.c). */
static mt_status_t engine_mem(const mt_plan_job_t *job, mt_model_t m, const int *bounds, int stage,
                              const mt_plan_layout_t *l, int64_t mem[MT_MEM_NCAT]) {
    mt_engine_params_t ep = MT_ENGINE_PARAMS_INIT;
    uint8_t *flags = NULL;
    if (l->tp > 1 || l->pp > 1) { /* parallel3d.c: the engine holds the stage's parameters only */
        flags = malloc((size_t)MT_MAX(mt_model_n_params(m), 1));
        if (!flags) {
            return mt_error(MT_ERR_OOM, "plan: out of memory");
        }
        mt_par3d_stage_flags(m, bounds, l->pp, stage, 0, flags);
        ep.param_flags = flags;
    }
    ep.kind = l->engine == MT_PLAN_DDP ? MT_ENGINE_DDP : MT_ENGINE_ZERO;
    ep.zero_stage = l->engine == MT_PLAN_DDP ? 1 : (int)l->engine;
    ep.grad_accum = l->microbatches;
    ep.bucket_mb = job->bucket_mb;
    ep.persist_threshold = job->persist_threshold;
    ep.optim = job->optim;
    mt_engine_mem_t em;
    mt_status_t st = mt_engine_plan_mem(m, l->dp, 0, &ep, &em);
    free(flags);
    MT_CHECK(st);
    mem[MT_MEM_PARAMS] += em.params;
    mem[MT_MEM_GRADS] += em.grads;
    mem[MT_MEM_OPTIMIZER] += em.optimizer;
    mem[MT_MEM_COMM] += em.comm;
    return MT_OK;
}

/* ---- the shared-memory collectives' segments -------------------------------------------------------- */

#define BIT(a) MT_AXIS_BIT(MT_AXIS_##a)

/* The shm backend's bytes on world rank `me` for a host comm over ranks[0..n) (in comm-rank order) created
 * with default params: its placement (block placement of job->node_ranks per node) for
 * mt_coll_shm_plan_bytes. */
static mt_status_t comm_shm(const mt_plan_job_t *job, int world, const int *ranks, int n, int me, int64_t *bytes) {
    int rpn = job->node_ranks > 0 ? job->node_ranks : world;
    int my_node = me / rpn;
    mt_coll_host_place_t pl = {.size = n, .n_nodes = 0};
    for (int i = 0; i < n; i++) {
        int node = ranks[i] / rpn, on_node = 0, first = 1;
        for (int j = 0; j < n; j++) {
            on_node += ranks[j] / rpn == node;
            first &= !(j < i && ranks[j] / rpn == node);
        }
        pl.n_nodes += first;
        pl.max_local_size = MT_MAX(pl.max_local_size, on_node);
        if (node == my_node) {
            pl.local_size++;
            pl.local_rank += ranks[i] < me ? 1 : 0; /* comm ranks ascend with world ranks in these groups */
        }
    }
    pl.oversubscribed = job->node_cpus > 0 && pl.local_size > job->node_cpus;
    return mt_coll_shm_plan_bytes(&pl, NULL, bytes);
}

mt_status_t mt_plan_stage_shm_bytes(const mt_plan_job_t *job, const mt_plan_layout_t *l, int stage,
                                    mt_plan_path_t path, int64_t *bytes) {
    *bytes = 0;
    int world = l->tp * l->pp * l->dp;
    mt_mesh_t *mesh = NULL;
    if (mt_mesh_create(world, l->tp, l->pp, l->dp, l->order, &mesh) != MT_OK) {
        MT_CHECK(mt_mesh_create(world, l->tp, l->pp, l->dp, "tp-dp-pp", &mesh));
    }
    /* the comms each path creates (train/job_parallel.c par_init; parallel/parallel3d.c make_comms, which
     * train/job_mp.c uses); the embedding pair apart */
    static const unsigned dp_only[] = {BIT(DP)};
    static const unsigned p3d[] = {BIT(TP), BIT(DP), BIT(PP)};
    bool model_parallel = l->tp > 1 || l->pp > 1;
    const unsigned *masks = path == MT_PLAN_PATH_TRAIN3D || model_parallel ? p3d : dp_only;
    int n_masks = path == MT_PLAN_PATH_TRAIN3D || model_parallel ? 3 : 1;
    bool emb = path == MT_PLAN_PATH_TRAIN3D || model_parallel;
    int *ranks = malloc(sizeof(int) * (size_t)world);
    mt_status_t st = ranks ? MT_OK : mt_error(MT_ERR_OOM, "plan: out of memory");
    int coords[MT_AXIS_N] = {0};
    coords[MT_AXIS_PP] = stage;
    int me = mt_mesh_rank_of(mesh, coords);
    for (int k = 0; k < n_masks && st == MT_OK; k++) {
        int64_t b = 0;
        int n = mt_mesh_group(mesh, me, masks[k], ranks, NULL);
        st = comm_shm(job, world, ranks, n, me, &b);
        *bytes += b;
    }
    int er[2];
    if (st == MT_OK && emb && mt_mesh_embedding_group(mesh, me, er) == 2 && (er[0] == me || er[1] == me)) {
        int64_t b = 0;
        int pair[2] = {MT_MIN(er[0], er[1]), MT_MAX(er[0], er[1])};
        st = comm_shm(job, world, pair, 2, me, &b);
        *bytes += b;
    }
    free(ranks);
    mt_mesh_free(mesh);
    return st;
}

mt_status_t plan_stage_mem_model(const mt_plan_job_t *job, mt_model_t m, const int *bounds, const mt_plan_layout_t *l,
                                 int s, int64_t mem[MT_MEM_NCAT]) {
    if (job->gpu) {
        return plan_stage_mem_gpu(job, m, bounds, l, s, mem);
    }
    memset(mem, 0, sizeof(int64_t) * MT_MEM_NCAT);
    int lo = bounds[s], hi = bounds[s + 1];
    /* activations: one object per micro-batch the schedule holds at once (the training loop without a
     * pipeline reuses one), each with the stage's module buffers, plus the model's shared workspace */
    mt_model_act_mem_t am;
    MT_CHECK(mt_model_act_mem(m, lo, hi, l->micro_batch, job->seq_len, &am));
    bool model_parallel = l->tp > 1 || l->pp > 1;
    int in_flight = 1;
    if (model_parallel) { /* the pipeline's pool of activation objects (parallel3d.c runs one even at pp = 1) */
        in_flight = mt_pipeline_max_in_flight(l->schedule == MT_PLAN_GPIPE ? MT_PP_GPIPE : MT_PP_1F1B, l->pp, s,
                                              l->microbatches);
    }
    mem[MT_MEM_ACTIVATIONS] = am.per_acts * in_flight + am.workspace;
    if (l->pp > 1) { /* message buffers: activation and gradient, one pair per neighbour (pipeline.c) */
        size_t msg = (mt_model_act_floats(m, l->micro_batch, job->seq_len) + 1) * sizeof(float);
        int pairs = (s < l->pp - 1) + (s > 0);
        mem[MT_MEM_COMM] += 2 * pairs * (int64_t)mt_alloc_accounted(msg);
    }
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
        mem[MT_MEM_COMM] += l->dp > 1 ? acc(numel * sizeof(float)) : 0;
    } else {
        MT_CHECK(engine_mem(job, m, bounds, s, l, mem));
    }
    if (mt_prec_storage(job->prec) != MT_F32) {
        /* bf16/fp16 emulated on the CPU (mt_model_set_compute): the wrapper's rounded weight copy and gradient
         * staging, each the most parameter floats one module of the whole model reads (any stage) */
        int64_t lp = acc(mt_model_lowp_floats(m) * sizeof(float));
        mem[MT_MEM_PARAMS] += lp;
        mem[MT_MEM_GRADS] += lp;
    }
    int64_t shm = 0; /* the node-local segments of the job's host communicators */
    MT_CHECK(mt_plan_stage_shm_bytes(job, l, s, MT_PLAN_PATH_TRAIN, &shm));
    mem[MT_MEM_COMM] += shm;
    return MT_OK;
}

mt_status_t mt_plan_stage_mem(const mt_plan_job_t *job, const mt_plan_layout_t *l, int stage,
                              int64_t mem[MT_MEM_NCAT]) {
    mt_model_t m = NULL;
    MT_CHECK(plan_build_model(job, l->tp, l->sp, l->recompute, &m));
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

/* ---- validity of tp / pp layouts ---------------------------------------------------------------- */

mt_status_t plan_check_3d(const mt_plan_job_t *job, int world, const mt_plan_layout_t *l) {
    mt_par3d_params_t p = MT_PAR3D_PARAMS_INIT;
    p.tp = l->tp;
    p.pp = l->pp;
    p.dp = l->dp;
    p.order = l->order;
    p.schedule = l->schedule == MT_PLAN_GPIPE ? MT_PP_GPIPE : MT_PP_1F1B;
    p.microbatches = l->microbatches;
    p.micro_batch = l->micro_batch;
    p.seq_len = job->seq_len;
    p.sequence_parallel = l->sp;
    p.dp_mode = l->engine == MT_PLAN_ALLREDUCE ? MT_P3D_ALLREDUCE : MT_P3D_ENGINE;
    p.engine_kind = l->engine == MT_PLAN_DDP ? MT_ENGINE_DDP : MT_ENGINE_ZERO;
    p.zero_stage = l->engine >= MT_PLAN_ZERO1 && l->engine <= MT_PLAN_ZERO3 ? (int)l->engine : 1;
    p.grad_clip = (float)job->grad_clip;
    p.optim = job->optim;
    mt_model_config_t mc = job->model;
    bool block = l->recompute == MT_PLAN_RC_BLOCK || l->recompute == MT_PLAN_RC_BLOCK_ATTN;
    /* the GPU engine's trainer recomputes sharded blocks (its host model of shards, which the 3-D path's check
     * describes, does not) */
    mc.recompute = block && !(job->gpu && l->tp > 1) ? MT_RECOMPUTE_BLOCK : MT_RECOMPUTE_NONE;
    mc.attn_recompute = l->recompute == MT_PLAN_RC_ATTN || l->recompute == MT_PLAN_RC_BLOCK_ATTN;
    return mt_par3d_check(&p, world, &mc);
}
