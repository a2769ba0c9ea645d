/* GPT-2 forward, backward and AdamW on one GPU, composed from the launchers of mt_cuda.h in the order of
 * models/gpt2/gpt2.c (see that file for the math of each step). Differences that save memory traffic: each residual add
 * is fused with the LayerNorm that follows it (attention residual + ln_2, MLP residual + the next block's ln_1 or
 * ln_f), the fc layer's bias and GELU run in the matmul epilogue, attention keeps only the log-sum-exp. model.recompute
 * = "block" keeps only each block's input (resid) and one block's internals, refilled by block_recompute before that
 * block's backward. Shape legend: B batch, T time, C channels, NH heads, N = B*T, V vocab, Vp padded vocab, L layers;
 * activations in the storage dtype of precision.compute, statistics f32. Tensor parallelism (tp > 1): Cl = C/tp
 * channels of NHl = NH/tp heads, Hl = 4C/tp MLP columns and Vl = Vp/tp vocabulary rows (the first Vr of them
 * real, from global row v0) per rank; the activations outside the sharded regions (residual stream, LayerNorm
 * statistics) are whole on every rank, or with sequence parallelism R = N/tp rows of them (rank r's rows
 * [r R, (r + 1) R)); without it R = N. The MLP (models/mlp/mlp.c) shares everything but its forward and backward
 * (mlp_forward, mlp_backward): its hidden layers are the blocks, of C columns.
 * This file builds the trainer (checks, the device allocations in the order mt_gpt2_cuda_requests replays them,
 * the upload of the weights) and frees it; gpt2_cuda_pass.c runs forward and backward, gpt2_cuda_tp.c holds the
 * tensor-parallel region boundaries, gpt2_cuda_step.c the optimizer step and the state engines read and set.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <string.h>

#include "models/cuda/gpt2_cuda_impl.h"
#include "runtime/alloc.h"
#include "runtime/cuda_alloc.h"

/* A dry init's record of the device allocations it would make, in order. */
struct gpt2_cuda_dry {
    size_t *bytes;
    mt_mem_cat_t *cats;
    int cap, n;
};

/* cudaSuccess without calling in a dry init (mt_gpt2_cuda_requests). */
#define DEV(g, call) ((g)->dry ? cudaSuccess : (call))

static mt_status_t dalloc(mt_gpt2_cuda_t g, void **p, size_t bytes, mt_mem_cat_t cat, const char *owner) {
    if (g->dry) { /* recorded; the pointer is never dereferenced, carve() only offsets it */
        if (g->dry->n < g->dry->cap) {
            g->dry->bytes[g->dry->n] = bytes;
            g->dry->cats[g->dry->n] = cat;
        }
        g->dry->n++;
        *p = (void *)((uintptr_t)1 << 40);
        return MT_OK;
    }
    MT_ASSERT(g->n_bufs < MAX_BUFS);
    MT_CHECK(mt_dev_malloc(p, bytes, cat, owner, g->stream));
    g->bufs[g->n_bufs++] = *p;
    return MT_OK;
}

/* Carves an aligned piece of `bytes` from *cursor. */
static void *carve(char **cursor, size_t bytes) {
    void *p = *cursor;
    *cursor += MT_DIV_UP(bytes, 256) * 256;
    return p;
}

static size_t layer_bytes(mt_gpt2_cuda_t g) {
    size_t N = (size_t)g->N, C = (size_t)g->C, es = g->es, r = 0;
    if (g->mlp) { /* a hidden layer's pre-activation */
        return MT_DIV_UP(N * C * es, 256) * 256;
    }
    size_t Cl = (size_t)g->Cl, Hl = (size_t)g->Hl, R = (size_t)g->R;
    size_t sizes[] = {N * C * es, 3 * N * Cl * es, N * Cl * es, R * C * es,
                      N * C * es, N * Hl * es,     N * Hl * es, R * 4,
                      R * 4,      R * 4,           R * 4,       (size_t)g->B * g->NHl * g->T * 4};
    for (size_t i = 0; i < MT_ARRAY_LEN(sizes); i++) {
        r += MT_DIV_UP(sizes[i], 256) * 256;
    }
    return r;
}

static mt_status_t check_model(mt_model_t m, const mt_gpt2_cuda_params_t *p, bool dry) {
    const mt_model_config_t *c = mt_model_config(m);
    if (c->kind != MT_MODEL_GPT2 && (c->kind != MT_MODEL_MLP || c->tp_size > 1)) {
        return mt_error(MT_ERR_INVALID_USAGE, "gpt2_cuda: the GPU path trains model.kind = \"gpt2\", and \"mlp\" "
                                              "without tensor parallelism");
    }
    if (!p || p->size != sizeof(*p) || (unsigned)p->prec >= MT_PREC_COUNT) {
        return mt_error(MT_ERR_INVALID_ARG, "gpt2_cuda: parameters not initialised with MT_GPT2_CUDA_PARAMS_INIT");
    }
    bool sp = c->tp_size > 1 && c->sequence_parallel;
    if (!dry && c->tp_size > 1 && (!p->tp_ops || !p->tp_ops->all_reduce_sum || !p->tp_ops->all_gather ||
                                   (sp && !p->tp_ops->reduce_scatter_sum))) {
        return mt_error(MT_ERR_INVALID_USAGE,
                        "gpt2_cuda: a tensor-parallel model (tp_size %d) needs the tp group's collectives "
                        "(params.tp_ops: all_reduce_sum, all_gather%s)",
                        c->tp_size, sp ? ", reduce_scatter_sum" : "");
    }
    if (sp && ((size_t)p->B * p->T) % (size_t)c->tp_size != 0) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "gpt2_cuda: sequence parallelism splits the B*T = %d x %d rows of a micro-batch over tp = %d "
                        "ranks: choose train.micro_batch x model.seq_len divisible by parallel.tp",
                        p->B, p->T, c->tp_size);
    }
    int hi = p->stage_hi < 0 ? c->n_layer : p->stage_hi;
    /* a stage without blocks is the first (the embeddings) or the last (ln_f and the head) */
    if (p->stage_lo < 0 || hi > c->n_layer || p->stage_lo > hi ||
        (p->stage_lo == hi && p->stage_lo != 0 && hi != c->n_layer)) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "gpt2_cuda: stage blocks [%d, %d) of %d: expected 0 <= lo <= hi <= n_layer, lo < hi in a "
                        "middle stage",
                        p->stage_lo, hi, c->n_layer);
    }
    int e = p->stage_ends;
    if (e < -1 || e > 3 || (e >= 0 && (((e & 1) && p->stage_lo != 0) || ((e & 2) && hi != c->n_layer) ||
                                        (p->stage_lo == hi && e == 0)))) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "gpt2_cuda: stage_ends = %d with blocks [%d, %d) of %d: expected -1, or bit 0 (the embedding) "
                        "only from block 0, bit 1 (the head) only to block n_layer, and one of them without blocks",
                        e, p->stage_lo, hi, c->n_layer);
    }
    if (p->opt_state < 0 || p->opt_state > 2) {
        return mt_error(MT_ERR_INVALID_ARG, "gpt2_cuda: opt_state = %d: expected 0 (plain SGD), 1 (SGD with "
                        "momentum) or 2 (AdamW)", p->opt_state);
    }
    if (p->tp_chunks < 1 || p->tp_chunks > 64) {
        return mt_error(MT_ERR_INVALID_ARG, "gpt2_cuda: tp_chunks = %d: expected 1 to 64 (parallel.tp_comm_chunks)",
                        p->tp_chunks);
    }
    if (p->act_sets < 1 || p->act_sets > 4096) {
        return mt_error(MT_ERR_INVALID_ARG, "gpt2_cuda: act_sets = %d: expected 1 to 4096", p->act_sets);
    }
    if (p->shard_weights && !p->shard_grads) {
        return mt_error(MT_ERR_INVALID_ARG, "gpt2_cuda: shard_weights (ZeRO-3) needs shard_grads (ZeRO-2's pool)");
    }
    if (p->shard_grads && p->shard_count < 2) {
        return mt_error(MT_ERR_INVALID_ARG, "gpt2_cuda: shard_grads (ZeRO-2) needs shard_count >= 2, not %d",
                        p->shard_count);
    }
    if (p->shard_count < 1 || p->shard_index < 0 || p->shard_index >= p->shard_count) {
        return mt_error(MT_ERR_INVALID_ARG, "gpt2_cuda: shard %d of %d: expected 0 <= shard_index < shard_count",
                        p->shard_index, p->shard_count);
    }
    if (p->B < 1 || p->T < 1 || p->T > c->seq_len) {
        return mt_error(MT_ERR_INVALID_ARG, "gpt2_cuda: micro-batch %d x %d must have B >= 1 and 1 <= T <= seq_len %d",
                        p->B, p->T, c->seq_len);
    }
    if ((size_t)p->B * p->T > INT32_MAX / 4 / (size_t)c->n_embd) {
        return mt_error(MT_ERR_INVALID_ARG, "gpt2_cuda: micro-batch %d x %d is too large", p->B, p->T);
    }
    if (c->kind == MT_MODEL_GPT2 && p->B > 65535) { /* the attention kernels' grids: one z layer per sequence */
        return mt_error(MT_ERR_INVALID_ARG, "gpt2_cuda: micro-batch of %d sequences: the GPU attention takes at most "
                        "65535 (CUDA's grid z limit); lower train.micro_batch and raise train.grad_accum", p->B);
    }
    for (int i = 0; !dry && i < mt_model_n_params(m); i++) {
        if (!mt_model_param(m, i)->data) {
            return mt_error(MT_ERR_INVALID_USAGE, "gpt2_cuda: parameter %s has no data to upload",
                            mt_model_param(m, i)->name);
        }
    }
    return MT_OK;
}

/* Uploads whole f32 weights (numel floats, flat layout; NULL: each parameter's host data) into the compute
 * copy and the master weights of the slice, on the compute stream (a pageable cudaMemcpy may return before
 * its DMA lands, and the non-blocking stream would not wait for it), and zeroes the gradients. In bf16/fp16
 * each parameter is staged in f32 in its own gradient storage (whole, or ZeRO-2's pool), so no extra
 * device memory is needed. */
mt_status_t gpt2_cuda_upload_weights(mt_gpt2_cuda_t g, const float *flat) {
    bool f32 = g->dt == MT_CU_F32;
    for (int i = 0; g->zero2 && i < 3; i++) { /* the pool's last consumer is done with it */
        CK(cudaStreamWaitEvent(g->stream, i < 2 ? g->slot_free[i] : g->outer_free, 0));
    }
    int pf = g->pf;
    for (int i = 0; i < g->n_params; i++) {
        const mt_param_t *pp = mt_model_param(g->m, i);
        if (!g->held[i]) {
            continue;
        }
        size_t off = g->offs[i], n = pp->numel; /* off: the stage's layout; pp->offset: the host's (the model's) */
        float *stage = f32 && !g->zero3 ? (float *)g->wc + off : G(i);
        CK(cudaMemcpyAsync(stage, flat ? flat + pp->offset : pp->data, n * 4, cudaMemcpyHostToDevice, g->stream));
        size_t a = MT_MAX(off, g->sh_lo), b = MT_MIN(off + n, g->sh_hi);
        if ((!f32 || g->zero3) && a < b) { /* the slice's master weights (and ZeRO-3's slice of the copy) */
            CK(cudaMemcpyAsync(g->master + (a - g->sh_lo), stage + (a - off), (b - a) * 4, cudaMemcpyDeviceToDevice,
                               g->stream));
            if (g->zero3 && !f32) {
                CK(mt_cuda_convert((char *)g->wslice + (a - g->sh_lo) * g->es, g->dt, stage + (a - off), MT_CU_F32,
                                   b - a, 1.0f, g->stream));
            }
        }
        if (!g->zero3 && !f32) {
            CK(mt_cuda_convert((char *)g->wc + off * g->es, g->dt, stage, MT_CU_F32, n, 1.0f, g->stream));
        } else if (g->zero3 && (i < g->b0 || i >= pf)) { /* wte, wpe, ln_f: whole on every rank */
            CK(mt_cuda_convert(W(i), g->dt, stage, MT_CU_F32, n, 1.0f, g->stream));
        }
    }
    for (int k = 0; k < 3; k++) { /* the slots are gathered again at their next use */
        g->wslot[k] = -1;
    }
    g->outer_stale = false;
    if (g->zero2) { /* the pool is cleared by each backward; the tied wte's accumulator held the staging */
        CK(cudaMemsetAsync(g->gshard, 0, (g->sh_hi - g->sh_lo) * 4, g->stream));
        CK(cudaMemsetAsync(g->gouter, 0, g->tied_acc * 4, g->stream));
    } else {
        CK(cudaMemsetAsync(g->grads, 0, g->numel * 4, g->stream));
    }
    return MT_OK;
}

/* mt_gpt2_cuda_init, or with dry its sizing alone (mt_gpt2_cuda_requests): the same code, every device call
 * skipped and every allocation recorded in dry. */
static mt_status_t gpt2_cuda_create(mt_model_t m, const mt_gpt2_cuda_params_t *p, struct gpt2_cuda_dry *dry,
                                    mt_gpt2_cuda_t *out) {
    *out = NULL;
    MT_CHECK(check_model(m, p, dry != NULL));
    if (!dry && mt_cuda_device_count() == 0) {
        return mt_error(MT_ERR_CUDA, "gpt2_cuda: no CUDA device");
    }
    const mt_model_config_t *c = mt_model_config(m);
    mt_gpt2_cuda_t g = mt_calloc(sizeof(*g), MT_MEM_OTHER, "gpt2_cuda");
    if (!g) {
        return mt_error(MT_ERR_OOM, "gpt2_cuda: no host memory");
    }
    mt_status_t st = MT_OK;
    g->dry = dry;
    g->m = m;
    g->p = *p;
    g->L = c->n_layer, g->C = c->n_embd, g->NH = c->n_head, g->V = c->vocab_size, g->Vp = c->padded_vocab;
    g->mlp = c->kind == MT_MODEL_MLP;
    g->tied = !g->mlp;
    g->b0 = g->mlp ? 1 : 2;
    g->nbp = g->mlp ? MLP_NBP : GPT2_NBP;
    g->pf = g->b0 + g->L * g->nbp;
    g->B = p->B, g->T = p->T, g->N = p->B * p->T;
    g->tp = MT_MAX(c->tp_size, 1), g->tpr = g->tp > 1 ? c->tp_rank : 0;
    g->sp = g->tp > 1 && c->sequence_parallel;
    g->R = g->sp ? g->N / g->tp : g->N;
    g->Cl = g->C / g->tp, g->NHl = g->NH / g->tp, g->Hl = 4 * g->C / g->tp, g->Vl = g->Vp / g->tp;
    if (g->mlp) { /* no attention; a hidden layer's width is C */
        g->NH = g->NHl = 0;
        g->Hl = g->C;
    }
    g->v0 = g->tpr * g->Vl;
    g->Vr = MT_MAX(0, MT_MIN(g->Vl, g->V - g->v0));
    g->dt = (int)mt_prec_storage(p->prec);
    g->es = mt_dtype_size((mt_dtype_t)g->dt);
    g->n_params = mt_model_n_params(m);
    g->lo = p->stage_lo;
    g->hi = p->stage_hi < 0 ? g->L : p->stage_hi;
    g->first = p->stage_ends < 0 ? g->lo == 0 : (p->stage_ends & 1) != 0;
    g->last = p->stage_ends < 0 ? g->hi == g->L : (p->stage_ends & 2) != 0;
    g->recompute = c->recompute == MT_RECOMPUTE_BLOCK || p->recompute_block;
    g->hk = c->head_chunks;
    size_t N = (size_t)g->N, C = (size_t)g->C, es = g->es;
    MT_CHECK_GOTO(mt_loss_scaler_init(&g->scaler, p->prec, p->init_scale, p->scale_window), st, fail);
    MT_CHECK_GOTO(mt_cuda_status(DEV(g, cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking)), "stream"), st,
                  fail);
    for (int i = 0; i < 2; i++) {
        MT_CHECK_GOTO(mt_cuda_status(DEV(g, cudaEventCreateWithFlags(&g->copied[i], cudaEventDisableTiming)), "event"),
                      st, fail);
    }
    if (g->tp > 1) {
        MT_CHECK_GOTO(mt_cuda_status(DEV(g, cudaStreamCreateWithFlags(&g->tp_stream, cudaStreamNonBlocking)), "stream"),
                      st, fail);
        MT_CHECK_GOTO(mt_cuda_status(DEV(g, cudaEventCreateWithFlags(&g->tp_in, cudaEventDisableTiming)), "event"), st,
                      fail);
        MT_CHECK_GOTO(mt_cuda_status(DEV(g, cudaEventCreateWithFlags(&g->tp_out, cudaEventDisableTiming)), "event"), st,
                      fail);
    }
    g->offs = mt_calloc(g->n_params * sizeof(size_t), MT_MEM_OTHER, "gpt2_cuda offsets");
    g->decay = mt_calloc(g->n_params * sizeof(bool), MT_MEM_OTHER, "gpt2_cuda decay");
    g->held = mt_calloc(g->n_params * sizeof(bool), MT_MEM_OTHER, "gpt2_cuda stage");
    g->n_sets = p->act_sets;
    g->sets = mt_calloc((size_t)g->n_sets * sizeof(acts_t), MT_MEM_OTHER, "gpt2_cuda activation sets");
    g->la_all = mt_calloc((size_t)g->n_sets * (size_t)MT_MAX(g->hi - g->lo, 1) * sizeof(layer_acts_t), MT_MEM_OTHER,
                          "gpt2_cuda layers");
    if (!g->offs || !g->decay || !g->held || !g->sets || !g->la_all) {
        st = mt_error(MT_ERR_OOM, "gpt2_cuda: no host memory");
        goto fail;
    }
    /* the stage's parameters, in registration order: gpt2 wte (first or last stage: the head reads it), wpe
     * (first), its blocks, ln_f (last); mlp wte (first), its layers, the head (last) */
    int pf = g->pf;
    g->numel = 0;
    for (int i = 0; i < g->n_params; i++) {
        const mt_param_t *pp = mt_model_param(m, i);
        int blk = i >= g->b0 && i < pf ? (i - g->b0) / g->nbp : -1;
        g->held[i] = i == 0 && g->tied ? g->first || g->last
                     : i < g->b0       ? g->first
                     : i >= pf         ? g->last
                                       : blk >= g->lo && blk < g->hi;
        g->offs[i] = g->numel;
        g->decay[i] = pp->is_weight2d;
        g->numel += g->held[i] ? pp->numel : 0;
    }
    if (g->tp > 1) { /* the runs of sharded parameters: a tp rank but 0 counts only those in the norm */
        g->shd_lo = mt_calloc((size_t)g->n_params * sizeof(size_t), MT_MEM_OTHER, "gpt2_cuda sharded runs");
        g->shd_hi = mt_calloc((size_t)g->n_params * sizeof(size_t), MT_MEM_OTHER, "gpt2_cuda sharded runs");
        if (!g->shd_lo || !g->shd_hi) {
            st = mt_error(MT_ERR_OOM, "gpt2_cuda: no host memory");
            goto fail;
        }
        for (int i = 0; i < g->n_params; i++) {
            const mt_param_t *pp = mt_model_param(m, i);
            if (!g->held[i] || pp->tp_dim < 0) {
                continue;
            }
            if (g->n_shd > 0 && g->shd_hi[g->n_shd - 1] == g->offs[i]) {
                g->shd_hi[g->n_shd - 1] += pp->numel;
            } else {
                g->shd_lo[g->n_shd] = g->offs[i];
                g->shd_hi[g->n_shd++] = g->offs[i] + pp->numel;
            }
        }
    }
    /* gpt2: ln_backward takes a LayerNorm's weight and bias gradients as one run */
    for (int l = 0; !g->mlp && l < g->L; l++) {
        int p0 = g->b0 + l * g->nbp;
        MT_ASSERT(g->offs[p0 + LN1B] == g->offs[p0 + LN1W] + (g->held[p0] ? (size_t)g->C : 0) &&
                  g->offs[p0 + LN2B] == g->offs[p0 + LN2W] + (g->held[p0] ? (size_t)g->C : 0));
    }
    /* ZeRO-1 slices: sh_len elements each (a multiple of 64, so every slice starts 256-byte aligned) */
    g->sh_n = p->shard_count;
    g->sh_r = p->shard_index;
    g->sh_len = g->sh_n > 1 ? MT_DIV_UP(MT_DIV_UP(g->numel, (size_t)g->sh_n), 64) * 64 : g->numel;
    g->sh_lo = MT_MIN((size_t)g->sh_r * g->sh_len, g->numel);
    g->sh_hi = MT_MIN(g->sh_lo + g->sh_len, g->numel);
    size_t slice = g->sh_hi - g->sh_lo, padded = g->sh_len * (size_t)g->sh_n;
    /* parameters: compute copy (the f32 master weights themselves for f32 storage), the master weights of
     * the slice (other storage), gradients, AdamW moments of the slice */
    g->zero3 = p->shard_weights;
    /* one block's parameters (every block has the same), from the stage's first block: a stage holds no other */
    g->blk_numel = g->hi > g->lo ? g->offs[g->b0 + (g->lo + 1) * g->nbp] - g->offs[g->b0 + g->lo * g->nbp] : 0;
    if (g->zero3) { /* the slice (master; a copy in the storage dtype), three block slots, wte/wpe/ln_f */
        size_t outer = g->offs[g->b0] + (g->numel - g->offs[pf]);
        MT_CHECK_GOTO(dalloc(g, (void **)&g->master, MT_MAX(slice, 1) * 4, MT_MEM_PARAMS, "gpt2_cuda master weights"),
                      st, fail);
        if (g->dt == MT_CU_F32) {
            g->wslice = g->master;
        } else {
            MT_CHECK_GOTO(dalloc(g, &g->wslice, MT_MAX(slice, 1) * es, MT_MEM_PARAMS, "gpt2_cuda weight slice"), st,
                          fail);
        }
        MT_CHECK_GOTO(dalloc(g, &g->wpool, MT_MAX(3 * g->blk_numel, 1) * es, MT_MEM_PARAMS, "gpt2_cuda weight slots"),
                      st, fail);
        MT_CHECK_GOTO(dalloc(g, &g->wouter, outer * es, MT_MEM_PARAMS, "gpt2_cuda embedding/ln_f weights"), st, fail);
        for (int i = 0; i < 4; i++) {
            cudaEvent_t *ev = i < 3 ? &g->wready[i] : &g->wmark;
            MT_CHECK_GOTO(mt_cuda_status(DEV(g, cudaEventCreateWithFlags(ev, cudaEventDisableTiming)), "event"), st,
                          fail);
        }
    } else {
        MT_CHECK_GOTO(dalloc(g, &g->wc, padded * es, MT_MEM_PARAMS,
                             g->dt == MT_CU_F32 ? "gpt2_cuda master weights" : "gpt2_cuda compute weights"),
                      st, fail);
        MT_CHECK_GOTO(mt_cuda_status(DEV(g, cudaMemsetAsync(g->wc, 0, padded * es, g->stream)), "memset"), st, fail);
        if (g->dt == MT_CU_F32) {
            g->master = (float *)g->wc + g->sh_lo;
        } else {
            MT_CHECK_GOTO(
                dalloc(g, (void **)&g->master, MT_MAX(slice, 1) * 4, MT_MEM_PARAMS, "gpt2_cuda master weights"), st,
                fail);
        }
    }
    g->zero2 = p->shard_grads;
    /* a pipeline's end stage under ZeRO-2: its copy of the tied wte is summed with the other end stage's once per
     * step, so its gradient accumulates over the step's passes (the first offs[1] elements of gouter) */
    g->tied_acc = g->zero2 && g->tied && g->held[0] && !(g->first && g->last) ? g->offs[1] : 0;
    if (g->zero2) {
        size_t outer = g->offs[g->b0] + (g->numel - g->offs[pf]);
        MT_CHECK_GOTO(
            dalloc(g, (void **)&g->gpool, MT_MAX(2 * g->blk_numel, 1) * 4, MT_MEM_GRADS, "gpt2_cuda gradient slots"),
            st, fail);
        MT_CHECK_GOTO(dalloc(g, (void **)&g->gouter, outer * 4, MT_MEM_GRADS, "gpt2_cuda embedding/ln_f gradients"), st,
                      fail);
        MT_CHECK_GOTO(dalloc(g, (void **)&g->gshard, MT_MAX(slice, 1) * 4, MT_MEM_GRADS, "gpt2_cuda gradient slice"),
                      st, fail);
        MT_CHECK_GOTO(mt_cuda_status(DEV(g, cudaMemsetAsync(g->gshard, 0, slice * 4, g->stream)), "memset"), st, fail);
        for (int i = 0; i < 3; i++) {
            cudaEvent_t *ev = i < 2 ? &g->slot_free[i] : &g->outer_free;
            MT_CHECK_GOTO(mt_cuda_status(DEV(g, cudaEventCreateWithFlags(ev, cudaEventDisableTiming)), "event"), st,
                          fail);
            MT_CHECK_GOTO(mt_cuda_status(DEV(g, cudaEventRecord(*ev, g->stream)), "event"), st, fail);
        }
    } else {
        MT_CHECK_GOTO(dalloc(g, (void **)&g->grads, g->numel * 4, MT_MEM_GRADS, "gpt2_cuda grads"), st, fail);
    }
    /* the optimizer's state of the slice: AdamW's m and v, SGD's momentum in adam_m, or none */
    float **state[2] = {&g->adam_m, &g->adam_v};
    static const char *const state_name[2] = {"gpt2_cuda optimizer m (SGD: momentum)", "gpt2_cuda optimizer v"};
    for (int i = 0; i < p->opt_state; i++) {
        MT_CHECK_GOTO(dalloc(g, (void **)state[i], MT_MAX(slice, 1) * 4, MT_MEM_OPTIMIZER, state_name[i]), st, fail);
        MT_CHECK_GOTO(mt_cuda_status(DEV(g, cudaMemsetAsync(*state[i], 0, slice * 4, g->stream)), "memset"), st,
                      fail);
    }
    if (!dry) {
        MT_CHECK_GOTO(gpt2_cuda_upload_weights(g, NULL), st, fail);
    }
    /* activations: one allocation for everything backward reads, per set */
    size_t lb = layer_bytes(g), head = 0;
    size_t hx = g->last ? 1 : 0, fx = g->mlp ? 0 : hx; /* ln_f's output (gpt2), the logits: on the last stage */
    size_t R = (size_t)g->R; /* the rows of the residual stream and of the LayerNorm statistics */
    size_t lrows = g->hk > 1 ? 0 : N, crows = g->hk > 1 ? hx * mt_model_head_chunk_rows(N, g->hk) : 0;
    size_t head_sizes[] = {fx * N * C * es, fx * R * 4, fx * R * 4, hx * lrows * (size_t)g->Vl * es, N * 4, N * 4, 256,
                           256,             N * 4,      N * 4};
    for (size_t i = 0; i < MT_ARRAY_LEN(head_sizes); i++) {
        head += MT_DIV_UP(head_sizes[i], 256) * 256;
    }
    size_t resid_bytes = MT_DIV_UP(R * C * es, 256) * 256;
    /* the block inputs resid[lo..hi] (resid[hi]: the stage's output, or the final residual); recompute =
     * block: they stay, the internals of one block are shared (by every set too) */
    int nb = g->hi - g->lo, n_la = g->recompute ? MT_MIN(nb, 1) : nb, K = g->n_sets;
    int n_int = g->recompute ? n_la : K * n_la; /* blocks of internals allocated */
    size_t chunk_bytes = MT_DIV_UP(crows * (size_t)g->Vl * es, 256) * 256; /* head_chunks: one chunk, every set's */
    g->act_bytes = (size_t)K * ((size_t)(nb + 1) * resid_bytes + head) + (size_t)n_int * lb + chunk_bytes;
    char *cur = NULL;
    MT_CHECK_GOTO(dalloc(g, (void **)&cur, g->act_bytes, MT_MEM_ACTIVATIONS, "gpt2_cuda activations"), st, fail);
    for (int k = 0; k < K; k++) {
        acts_t *A = &g->sets[k];
        A->la = g->la_all + (size_t)k * (size_t)MT_MAX(nb, 1);
        A->resid = carve(&cur, (size_t)(nb + 1) * resid_bytes);
        A->lnf = carve(&cur, fx * N * C * es);
        A->lnf_mean = carve(&cur, fx * R * 4);
        A->lnf_rstd = carve(&cur, fx * R * 4);
        A->logits = lrows ? carve(&cur, hx * N * (size_t)g->Vl * es) : NULL;
        A->losses = carve(&cur, N * 4);
        A->lse_ce = carve(&cur, N * 4);
        A->mean_loss = carve(&cur, 256);
        A->n_valid = carve(&cur, 256);
        A->tokens_d = carve(&cur, N * 4);
        A->targets_d = carve(&cur, N * 4);
    }
    for (int i = 0; i < n_int; i++) { /* set i / n_la's block i % n_la (recompute: the one shared set) */
        layer_acts_t *a = &g->sets[i / n_la].la[i % n_la];
        if (g->mlp) { /* a hidden layer's pre-activation */
            a->fch = carve(&cur, N * C * es);
            continue;
        }
        a->ln1 = carve(&cur, N * C * es);
        a->qkv = carve(&cur, 3 * N * (size_t)g->Cl * es);
        a->atty = carve(&cur, N * (size_t)g->Cl * es);
        a->r2 = carve(&cur, R * C * es);
        a->ln2 = carve(&cur, N * C * es);
        a->fch = carve(&cur, N * (size_t)g->Hl * es);
        a->fch_gelu = carve(&cur, N * (size_t)g->Hl * es);
        a->ln1_mean = carve(&cur, R * 4);
        a->ln1_rstd = carve(&cur, R * 4);
        a->ln2_mean = carve(&cur, R * 4);
        a->ln2_rstd = carve(&cur, R * 4);
        a->lse = carve(&cur, (size_t)g->B * g->NHl * g->T * 4);
    }
    g->logits_chunk = chunk_bytes ? carve(&cur, chunk_bytes) : NULL;
    for (int k = 0; k < K; k++) { /* recompute = block: every block's view of the shared internals */
        for (int l = n_la; l < nb; l++) {
            g->sets[k].la[l] = g->sets[0].la[0];
        }
        for (int l = 0; g->recompute && k > 0 && l < n_la; l++) {
            g->sets[k].la[l] = g->sets[0].la[l];
        }
    }
    g->A = g->last_fwd = &g->sets[0];
    /* scratch shared by the layers (forward temporaries, backward gradients, reductions) */
    size_t cs = mt_cuda_colsum_scratch_floats(MT_MAX(MT_MAX(g->Hl, g->C), g->mlp ? g->V : 0)); /* mlp: head bias */
    size_t ls = mt_cuda_layernorm_scratch_floats(g->C);
    size_t as = mt_cuda_attention_scratch_floats(g->B, g->T, g->NHl), ss = mt_cuda_sumsq_scratch_doubles();
    size_t Hl = (size_t)g->Hl, ce = g->tp > 1 ? N * 3 * 4 : 0, rep = (size_t)g->n_shd * 8;
    /* dfc (N, Hl) also packs rowpar_backward's chunked gathers, (N, C) */
    size_t dfc_w = g->sp && p->tp_chunks > 1 ? MT_MAX(Hl, C) : Hl;
    size_t scratch = 3 * MT_DIV_UP(N * C * es, 256) * 256 + MT_DIV_UP(N * Hl * es, 256) * 256 +
                     MT_DIV_UP(N * dfc_w * es, 256) * 256 +
                     MT_DIV_UP(cs * 4, 256) * 256 + MT_DIV_UP(ls * 4, 256) * 256 + MT_DIV_UP(as * 4, 256) * 256 +
                     MT_DIV_UP(ss * 8, 256) * 256 + 6 * 256 + MT_DIV_UP(ce, 256) * 256 +
                     MT_DIV_UP(ce * (size_t)g->tp, 256) * 256 + MT_DIV_UP(rep, 256) * 256 +
                     (g->sp ? 2 * MT_DIV_UP(R * C * es, 256) * 256 + MT_DIV_UP(4 * C * 4, 256) * 256 : 0);
    MT_CHECK_GOTO(dalloc(g, (void **)&cur, scratch, MT_MEM_OTHER, "gpt2_cuda scratch"), st, fail);
    g->tmp_c = carve(&cur, N * C * es);
    g->dresid = carve(&cur, R * C * es);
    g->da = carve(&cur, N * C * es);
    g->dfg = carve(&cur, N * Hl * es);
    g->dfc = carve(&cur, N * dfc_w * es);
    g->dfc_numel = N * dfc_w;
    g->col_scratch = carve(&cur, cs * 4);
    g->ln_scratch = carve(&cur, ls * 4);
    g->attn_scratch = carve(&cur, as * 4);
    g->sumsq_scratch = carve(&cur, ss * 8);
    g->sumsq = carve(&cur, 256);
    g->coef = carve(&cur, 256);
    g->norm = carve(&cur, 256);
    g->found_inf = carve(&cur, 256);
    g->ce_part = g->tp > 1 ? carve(&cur, ce) : NULL;
    g->ce_parts = g->tp > 1 ? carve(&cur, ce * (size_t)g->tp) : NULL;
    g->shd_sumsq = g->n_shd > 0 ? carve(&cur, rep) : NULL;
    g->tmp_r = g->sp ? carve(&cur, R * C * es) : NULL;
    g->lnloc = g->sp ? carve(&cur, R * C * es) : NULL;
    g->lng = g->sp ? carve(&cur, 4 * C * 4) : NULL;
    MT_CHECK_GOTO(dalloc(g, &g->ws, 32 << 20, MT_MEM_OTHER, "cuBLASLt workspace"), st, fail);
    MT_CHECK_GOTO(
        mt_cuda_status(DEV(g, mt_cuda_ctx_create(&g->ctx, g->ws, 32 << 20, p->prec == MT_PREC_TF32)), "cuBLASLt"), st,
        fail);
    /* two slots of tokens and targets, then the step's readback */
    size_t rb_bytes = sizeof(struct gpt2_cuda_readback) + (size_t)g->n_shd * sizeof(double);
    MT_CHECK_GOTO(mt_cuda_status(DEV(g, cudaMallocHost((void **)&g->pinned, 4 * N * 4 + rb_bytes)), "pinned tokens"),
                  st, fail);
    g->rb = g->pinned ? (struct gpt2_cuda_readback *)(void *)(g->pinned + 4 * N) : NULL;
    for (int i = 0; i < 2; i++) {
        MT_CHECK_GOTO(mt_cuda_status(DEV(g, cudaEventRecord(g->copied[i], g->stream)), "event"), st, fail);
    }
    MT_CHECK_GOTO(mt_cuda_status(DEV(g, cudaStreamSynchronize(g->stream)), "init"), st, fail);
    *out = g;
    return MT_OK;
fail:
    mt_gpt2_cuda_free(g);
    return st;
}

mt_status_t mt_gpt2_cuda_init(mt_model_t m, const mt_gpt2_cuda_params_t *p, mt_gpt2_cuda_t *out) {
    return gpt2_cuda_create(m, p, NULL, out);
}

mt_status_t mt_gpt2_cuda_requests(mt_model_t m, const mt_gpt2_cuda_params_t *p, size_t *bytes, mt_mem_cat_t *cats,
                                  int cap, int *n) {
    struct gpt2_cuda_dry dry = {bytes, cats, cap, 0};
    mt_gpt2_cuda_t g = NULL;
    *n = 0;
    MT_CHECK(gpt2_cuda_create(m, p, &dry, &g));
    mt_gpt2_cuda_free(g);
    *n = dry.n;
    if (dry.n > cap) {
        return mt_error(MT_ERR_INTERNAL, "gpt2_cuda: %d device allocations, room for %d", dry.n, cap);
    }
    return MT_OK;
}

void mt_gpt2_cuda_free(mt_gpt2_cuda_t g) {
    if (!g) {
        return;
    }
    if (g->stream) {
        cudaStreamSynchronize(g->stream);
    }
    if (g->tp_stream) { /* a failed backward may have left a reduction there, into buffers freed below */
        cudaStreamSynchronize(g->tp_stream);
    }
    mt_cuda_ctx_destroy(g->ctx);
    for (int i = g->n_bufs - 1; i >= 0; i--) {
        mt_dev_free(g->bufs[i]);
    }
    if (g->pinned) {
        cudaFreeHost(g->pinned);
    }
    for (int i = 0; i < 2; i++) {
        if (g->copied[i]) {
            cudaEventDestroy(g->copied[i]);
        }
    }
    if (g->tp_stream) {
        cudaStreamDestroy(g->tp_stream);
    }
    cudaEvent_t evs[] = {g->slot_free[0], g->slot_free[1], g->outer_free, g->wready[0], g->wready[1],
                         g->wready[2],    g->wmark,        g->tp_in,      g->tp_out};
    for (size_t i = 0; i < MT_ARRAY_LEN(evs); i++) {
        if (evs[i]) {
            cudaEventDestroy(evs[i]);
        }
    }
    if (g->stream) {
        cudaStreamDestroy(g->stream);
    }
    if (g->marks) {
        for (int i = 0; i < PROF_MARKS; i++) {
            cudaEventDestroy(g->marks[i]);
        }
        mt_free(g->marks);
    }
    mt_free(g->offs);
    mt_free(g->decay);
    mt_free(g->held);
    mt_free(g->shd_lo);
    mt_free(g->shd_hi);
    mt_free(g->sets);
    mt_free(g->la_all);
    mt_free(g);
}

mt_status_t mt_gpt2_cuda_zero_grads(mt_gpt2_cuda_t g) {
    if (g->zero2) { /* the pool is cleared by each backward, but for the tied wte's accumulator */
        for (int i = 0; i < 3; i++) { /* the hook's consumer is done with the pool (and has added to the slice) */
            CK(cudaStreamWaitEvent(g->stream, i < 2 ? g->slot_free[i] : g->outer_free, 0));
        }
        CK(cudaMemsetAsync(g->gouter, 0, g->tied_acc * 4, g->stream));
        return mt_cuda_status(cudaMemsetAsync(g->gshard, 0, (g->sh_hi - g->sh_lo) * 4, g->stream), "zero grads");
    }
    return mt_cuda_status(cudaMemsetAsync(g->grads, 0, g->numel * 4, g->stream), "zero grads");
}

/* Records the end of a launch of category cat (or, cat < 0, the start of a timed stretch). */
mt_status_t gpt2_cuda_prof_mark(mt_gpt2_cuda_t g, int cat) {
    if (!g->prof || g->n_marks >= PROF_MARKS) {
        return MT_OK;
    }
    g->mark_cat[g->n_marks] = (int8_t)cat;
    CK(cudaEventRecord(g->marks[g->n_marks], g->stream));
    g->n_marks++;
    return MT_OK;
}
