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

/* Tensor parallelism, the region boundaries (gpt2_tp.c), each collective in the compute stream's order.
 * g forward and f backward: part (N,C) holds this rank's partial sums; *out the group's sum: part itself (an
 * in-place all-reduce; nothing with tp = 1) or, with sequence parallelism, this rank's R rows of it at rows
 * (a reduce-scatter). */
static mt_status_t tp_reduce_on(mt_gpt2_cuda_t g, void *part, void *rows, void **out, cudaStream_t s) {
    *out = part;
    if (g->tp == 1) {
        return MT_OK;
    }
    const mt_gpt2_cuda_tp_ops_t *o = g->p.tp_ops;
    size_t C = (size_t)g->C;
    if (!g->sp) {
        MT_CHECK(o->all_reduce_sum(o->ctx, part, (size_t)g->N * C, g->dt, s));
    } else {
        MT_CHECK(o->reduce_scatter_sum(o->ctx, part, rows, (size_t)g->R * C, g->dt, s));
        *out = rows;
    }
    return MT_OK;
}

static mt_status_t tp_reduce(mt_gpt2_cuda_t g, void *part, void *rows, void **out) {
    MT_CHECK(tp_reduce_on(g, part, rows, out, g->stream));
    return g->tp > 1 ? gpt2_cuda_prof_mark(g, MT_GPT2_PROF_TP) : MT_OK;
}

/* The compute stream waits for the reduction tp_reduce_async left pending, if any (at the start of a forward
 * or backward: one a failed backward left unjoined), before anything else writes its buffers or uses the tp
 * group. */
static mt_status_t tp_rejoin(mt_gpt2_cuda_t g) {
    if (g->tp_pending) {
        g->tp_pending = false;
        CK(cudaStreamWaitEvent(g->stream, g->tp_out, 0));
    }
    return MT_OK;
}

/* Backward, after a column-parallel product's input gradient (part) and before its weight gradient: the
 * reduction starts on tp_stream once part is complete, and the compute stream goes on with the weight
 * gradient, which reads neither part nor rows (Megatron's overlap of the input gradient's all-reduce with the
 * weight gradient). tp_join puts the compute stream behind it, before anything reads *out or the tp group
 * runs another collective (so the group's calls keep one order on every rank). */
static mt_status_t tp_reduce_async(mt_gpt2_cuda_t g, void *part, void *rows, void **out) {
    if (g->tp == 1) {
        *out = part;
        return MT_OK;
    }
    MT_CHECK(tp_rejoin(g));
    CK(cudaEventRecord(g->tp_in, g->stream));
    CK(cudaStreamWaitEvent(g->tp_stream, g->tp_in, 0));
    mt_status_t st = tp_reduce_on(g, part, rows, out, g->tp_stream);
    st = st != MT_OK ? st : mt_cuda_status(cudaEventRecord(g->tp_out, g->tp_stream), "tp event");
    if (st != MT_OK) { /* what was queued there must not outlive the call unordered: finish it */
        cudaStreamSynchronize(g->tp_stream);
        return st;
    }
    g->tp_pending = true;
    return MT_OK;
}

/* The compute stream waits for the reduction tp_reduce_async started; the profile's TP time is then what the
 * weight gradient did not hide. */
static mt_status_t tp_join(mt_gpt2_cuda_t g) {
    bool pending = g->tp_pending;
    MT_CHECK(tp_rejoin(g));
    return pending ? gpt2_cuda_prof_mark(g, MT_GPT2_PROF_TP) : MT_OK;
}

/* f forward and g backward with sequence parallelism: every rank's R rows at rows into full (N,C), in rank
 * order; without it rows is full already. */
static mt_status_t tp_gather(mt_gpt2_cuda_t g, const void *rows, void *full) {
    if (!g->sp) {
        return MT_OK;
    }
    const mt_gpt2_cuda_tp_ops_t *o = g->p.tp_ops;
    MT_CHECK(o->all_gather(o->ctx, rows, full, (size_t)g->R * g->C, g->dt, g->stream));
    return gpt2_cuda_prof_mark(g, MT_GPT2_PROF_TP);
}

/* Chunk j of k over `rows` rows: its first row *j0 and its row count, which is 0 when there are more chunks than
 * rows (the same on every rank, so every rank skips the same chunks). */
static int chunk_rows(int rows, int k, int j, int *j0) {
    *j0 = (int)((int64_t)rows * j / k);
    return (int)((int64_t)rows * (j + 1) / k) - *j0;
}

/* Forward, a row-parallel product into g->tmp_c (inp (N, Cin): this rank's heads or MLP columns; w its rows of the
 * weight; bias tp rank 0's) and its reduction over tp (g), *x as tp_reduce gives it. With params.tp_chunks = k > 1
 * the rows go in k chunks: chunk j's collective starts on tp_stream as soon as its product is written and runs
 * while the compute stream computes chunk j + 1, and the compute stream waits for the last before anything reads
 * *x (the row-parallel output's communication overlapped with its product: only the last chunk's is exposed).
 * With sequence parallelism chunk j holds, for each rank r, rows [j0, j1) of r's R rows (one product per rank),
 * packed rank after rank, so its reduce-scatter leaves rows [j0, j1) of this rank's R at the same rows of
 * tmp_r. Each row's product is the unchunked one's, and each element's sum is over the same ranks. */
static mt_status_t rowpar_forward(mt_gpt2_cuda_t g, const void *inp, int Cin, const void *w, const void *bias,
                                  void **x) {
    int N = g->N, C = g->C, R = g->R, dt = g->dt, k = g->p.tp_chunks, tp = g->tp;
    void *s = g->stream;
    if (tp == 1 || k <= 1) {
        OP(PROF_MATMUL_FWD, mt_cuda_matmul_forward(g->ctx, g->tmp_c, C, NULL, inp, w, bias, N, Cin, C, dt, s));
        return tp_reduce(g, g->tmp_c, g->tmp_r, x);
    }
    const mt_gpt2_cuda_tp_ops_t *o = g->p.tp_ops;
    const char *in = inp;
    char *out = g->tmp_c;
    size_t es = g->es;
    int rows = g->sp ? R : N; /* what is cut into chunks: each rank's R rows, or all N */
    bool queued = false;      /* a collective is on tp_stream: an error must not leave it unordered */
    mt_status_t st = MT_OK;
    for (int j = 0; j < k && st == MT_OK; j++) {
        int j0 = 0, n = chunk_rows(rows, k, j, &j0);
        if (n == 0) {
            continue;
        }
        char *pack = out + (size_t)(g->sp ? tp : 1) * (size_t)j0 * C * es;
        for (int r = 0; r < (g->sp ? tp : 1) && st == MT_OK; r++) { /* r > 0 only with sequence parallelism */
            st = mt_cuda_status(mt_cuda_matmul_forward(g->ctx, pack + (size_t)r * n * C * es, C, NULL,
                                                       in + ((size_t)r * R + j0) * Cin * es, w, bias, n, Cin,
                                                       C, dt, s),
                                "row-parallel product");
            st = st != MT_OK ? st : gpt2_cuda_prof_mark(g, MT_GPT2_PROF_MATMUL_FWD);
        }
        st = st != MT_OK ? st : mt_cuda_status(cudaEventRecord(g->tp_in, s), "tp event");
        st = st != MT_OK ? st : mt_cuda_status(cudaStreamWaitEvent(g->tp_stream, g->tp_in, 0), "tp event wait");
        if (st == MT_OK) {
            queued = true;
            st = g->sp ? o->reduce_scatter_sum(o->ctx, pack, (char *)g->tmp_r + (size_t)j0 * C * es, (size_t)n * C,
                                               dt, g->tp_stream)
                       : o->all_reduce_sum(o->ctx, pack, (size_t)n * C, dt, g->tp_stream);
        }
    }
    st = st != MT_OK ? st : mt_cuda_status(cudaEventRecord(g->tp_out, g->tp_stream), "tp event");
    st = st != MT_OK ? st : mt_cuda_status(cudaStreamWaitEvent(s, g->tp_out, 0), "tp event wait");
    if (st != MT_OK) {
        if (queued) {
            cudaStreamSynchronize(g->tp_stream);
        }
        return st;
    }
    *x = g->sp ? g->tmp_r : g->tmp_c;
    return gpt2_cuda_prof_mark(g, MT_GPT2_PROF_TP);
}

/* Sequence parallelism with params.tp_chunks > 1, one chunk of a gather (f forward, g backward): rows [j0, j0 + n)
 * of every rank's R rows at src gathered on tp_stream into pack, rank after rank, the compute stream put behind
 * it, and rank r's n rows copied to rows r R + j0 of full (N,C). The caller has ordered tp_stream after src's
 * writer and after pack's last reader; *queued is set once a collective is on tp_stream. */
static mt_status_t sp_gather_chunk(mt_gpt2_cuda_t g, const void *src, char *pack, void *full, int j0, int n,
                                   bool *queued) {
    const mt_gpt2_cuda_tp_ops_t *o = g->p.tp_ops;
    size_t rowb = (size_t)g->C * g->es, R = (size_t)g->R;
    *queued = true;
    mt_status_t st = o->all_gather(o->ctx, (const char *)src + (size_t)j0 * rowb, pack, (size_t)n * g->C, g->dt,
                                   g->tp_stream);
    st = st != MT_OK ? st : mt_cuda_status(cudaEventRecord(g->tp_out, g->tp_stream), "tp event");
    st = st != MT_OK ? st : mt_cuda_status(cudaStreamWaitEvent(g->stream, g->tp_out, 0), "tp event wait");
    st = st != MT_OK ? st : gpt2_cuda_prof_mark(g, MT_GPT2_PROF_TP);
    st = st != MT_OK ? st
                     : mt_cuda_status(cudaMemcpy2DAsync((char *)full + (size_t)j0 * rowb, R * rowb, pack,
                                                        (size_t)n * rowb, (size_t)n * rowb, (size_t)g->tp,
                                                        cudaMemcpyDeviceToDevice, g->stream),
                                      "gathered rows");
    return st != MT_OK ? st : gpt2_cuda_prof_mark(g, MT_GPT2_PROF_OTHER);
}

/* Forward, a column-parallel region's entry: with sequence parallelism every rank's R rows of the LayerNorm output
 * (at g->lnloc) gathered into full (N, C), which backward keeps; then out (N, ldo) = full @ w^T + bias, OC columns
 * (gelu_pre: the fc layer's fused epilogue; OC = 0: the gather alone). With params.tp_chunks = k > 1 and sequence
 * parallelism the gather goes in k chunks on tp_stream (sp_gather_chunk, packed into g->tmp_c, free here), and
 * the compute stream, once chunk j is in its rows of full, computes their products (one per rank) while chunk
 * j + 1 is gathered. */
static mt_status_t colpar_forward(mt_gpt2_cuda_t g, void *full, void *out, int ldo, void *gelu_pre, const void *w,
                                  const void *bias, int OC) {
    int N = g->N, C = g->C, R = g->R, dt = g->dt, k = g->p.tp_chunks, tp = g->tp;
    void *s = g->stream;
    if (!g->sp || k <= 1) {
        MT_CHECK(tp_gather(g, g->lnloc, full));
        if (OC > 0) {
            OP(PROF_MATMUL_FWD, mt_cuda_matmul_forward(g->ctx, out, ldo, gelu_pre, full, w, bias, N, C, OC, dt, s));
        }
        return MT_OK;
    }
    size_t es = g->es, rowb = (size_t)C * es, outb = (size_t)ldo * es;
    bool queued = false; /* a collective is on tp_stream: an error must not leave it unordered */
    mt_status_t st = mt_cuda_status(cudaEventRecord(g->tp_in, s), "tp event"); /* lnloc is written */
    st = st != MT_OK ? st : mt_cuda_status(cudaStreamWaitEvent(g->tp_stream, g->tp_in, 0), "tp event wait");
    for (int j = 0; j < k && st == MT_OK; j++) {
        int j0 = 0, n = chunk_rows(R, k, j, &j0);
        if (n == 0) {
            continue;
        }
        char *pack = (char *)g->tmp_c + (size_t)tp * j0 * rowb;
        st = sp_gather_chunk(g, g->lnloc, pack, full, j0, n, &queued);
        for (int r = 0; r < tp && OC > 0 && st == MT_OK; r++) {
            size_t row = (size_t)r * R + j0;
            st = mt_cuda_status(mt_cuda_matmul_forward(g->ctx, (char *)out + row * outb, ldo,
                                                       gelu_pre ? (char *)gelu_pre + row * OC * es : NULL,
                                                       pack + (size_t)r * n * rowb, w, bias, n, C, OC, dt, s),
                                "column-parallel product");
            st = st != MT_OK ? st : gpt2_cuda_prof_mark(g, MT_GPT2_PROF_MATMUL_FWD);
        }
    }
    if (st != MT_OK && queued) {
        cudaStreamSynchronize(g->tp_stream);
    }
    return st;
}

/* Backward, a row-parallel region's product (inp (N, Cin) and w as rowpar_forward's): dinp (N, Cin) = dout @ w,
 * dw += dout^T inp and db += dout's column sums (whole on every tp rank), where dout (N,C) is the
 * gradient of the region's output, dresid: with sequence parallelism every rank's R rows of it gathered into
 * g->tmp_c (g backward). With params.tp_chunks = k > 1 the gather goes in k chunks on tp_stream (sp_gather_chunk,
 * packed into g->dfc, free here: its last reader is enqueued before), and the compute stream computes chunk j's
 * rows of dinp (one product per rank) while chunk j + 1 is gathered; dw and db then read the whole of tmp_c, as
 * unchunked. */
static mt_status_t rowpar_backward(mt_gpt2_cuda_t g, void *dinp, const void *inp, int Cin, const void *w, float *dw,
                                   float *db) {
    int N = g->N, C = g->C, R = g->R, dt = g->dt, k = g->p.tp_chunks, tp = g->tp;
    void *s = g->stream;
    if (!g->sp || k <= 1) {
        MT_CHECK(tp_gather(g, g->dresid, g->tmp_c));
        OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, dinp, dw, db, g->sp ? g->tmp_c : g->dresid, C, inp,
                                                        w, N, Cin, C, dt, g->col_scratch, s));
        return MT_OK;
    }
    size_t es = g->es, rowb = (size_t)C * es;
    MT_ASSERT(g->dfc_numel >= (size_t)N * C); /* every chunk's pack fits */
    bool queued = false; /* a collective is on tp_stream: an error must not leave it unordered */
    mt_status_t st = mt_cuda_status(cudaEventRecord(g->tp_in, s), "tp event"); /* dresid is complete */
    st = st != MT_OK ? st : mt_cuda_status(cudaStreamWaitEvent(g->tp_stream, g->tp_in, 0), "tp event wait");
    for (int j = 0; j < k && st == MT_OK; j++) {
        int j0 = 0, n = chunk_rows(R, k, j, &j0);
        if (n == 0) {
            continue;
        }
        char *pack = (char *)g->dfc + (size_t)tp * j0 * rowb;
        st = sp_gather_chunk(g, g->dresid, pack, g->tmp_c, j0, n, &queued);
        for (int r = 0; r < tp && st == MT_OK; r++) {
            size_t row = (size_t)r * R + j0;
            st = mt_cuda_status(mt_cuda_matmul_backward_set(g->ctx, (char *)dinp + row * Cin * es, NULL, NULL,
                                                            pack + (size_t)r * n * rowb, C, NULL, w, n, Cin, C,
                                                            dt, NULL, s),
                                "row-parallel input gradient");
            st = st != MT_OK ? st : gpt2_cuda_prof_mark(g, MT_GPT2_PROF_MATMUL_BWD);
        }
    }
    if (st != MT_OK) {
        if (queued) {
            cudaStreamSynchronize(g->tp_stream);
        }
        return st;
    }
    OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, NULL, dw, db, g->tmp_c, C, inp, w, N, Cin, C, dt,
                                                    g->col_scratch, s));
    return MT_OK;
}

/* Where a LayerNorm whose output enters a column-parallel region writes: full (N,C) itself, or with sequence
 * parallelism this rank's R rows, which tp_gather then gathers into full. */
#define LN_DST(full) (g->sp ? g->lnloc : (full))

/* The row-parallel projections' bias: added by tp rank 0 alone, so the group's sum holds it once. */
#define ROW_BIAS(i) (g->tpr == 0 ? W(i) : NULL)

/* ZeRO-3: enqueues on the comm stream the gather of block l's weights into slot l % 3 unless the slot holds
 * them, after everything enqueued on the compute stream so far (the slot's previous block is done). */
static mt_status_t wfetch(mt_gpt2_cuda_t g, int l) {
    if (l < g->lo || l >= g->hi || g->wslot[l % 3] == l) { /* not on this stage, or there */
        return MT_OK;
    }
    CK(cudaEventRecord(g->wmark, g->stream));
    CK(cudaStreamWaitEvent(g->consumer, g->wmark, 0));
    size_t b0 = g->offs[g->b0 + l * g->nbp];
    MT_CHECK(g->whook(g->whook_arg, b0, b0 + g->blk_numel, W(g->b0 + l * g->nbp)));
    CK(cudaEventRecord(g->wready[l % 3], g->consumer));
    g->wslot[l % 3] = l;
    return MT_OK;
}

/* ZeRO-3, before block l's launches going in direction d (+1 forward, -1 backward): block l's weights and
 * block l + d's (the forward's fused residual + LayerNorm reads the next block's ln_1) gathered and waited
 * for on the compute stream, block l + 2d's gather started (into the slot of block l - d, done with). */
static mt_status_t wneed(mt_gpt2_cuda_t g, int l, int d) {
    if (!g->zero3) {
        return MT_OK;
    }
    MT_CHECK(wfetch(g, l));
    MT_CHECK(wfetch(g, l + d));
    for (int k = l; k != l + 2 * d; k += d) {
        if (k >= g->lo && k < g->hi) {
            CK(cudaStreamWaitEvent(g->stream, g->wready[k % 3], 0));
        }
    }
    return wfetch(g, l + 2 * d);
}

/* ZeRO-3, at the start of a forward after a step: wte, wpe and ln_f gathered again, whole, and waited for. */
static mt_status_t wouter_fresh(mt_gpt2_cuda_t g) {
    if (!g->zero3 || !g->outer_stale) {
        return MT_OK;
    }
    if (!g->whook || !g->consumer) {
        return mt_error(MT_ERR_INVALID_USAGE, "gpt2_cuda: ZeRO-3 keeps a slice of the weights: set a weight hook and "
                                              "the comm stream before forward");
    }
    int pf = g->pf;
    CK(cudaEventRecord(g->wmark, g->stream));
    CK(cudaStreamWaitEvent(g->consumer, g->wmark, 0));
    MT_CHECK(g->whook(g->whook_arg, 0, g->offs[g->b0], W(0)));
    MT_CHECK(g->whook(g->whook_arg, g->offs[pf], g->numel, W(pf)));
    CK(cudaEventRecord(g->wmark, g->consumer));
    CK(cudaStreamWaitEvent(g->stream, g->wmark, 0));
    g->outer_stale = false;
    return MT_OK;
}

/* Block l from its ln_1 output (a->ln1, or with sequence parallelism this rank's rows of it at g->lnloc) up to
 * gelu(fc): the attention branch, its residual and ln_2, and the MLP's column-parallel product. */
static mt_status_t block_forward_to_gelu(mt_gpt2_cuda_t g, int l) {
    int N = g->N, C = g->C, B = g->B, T = g->T, dt = g->dt, Cl = g->Cl, Hl = g->Hl, R = g->R;
    void *s = g->stream;
    layer_acts_t *a = LA(l);
    int p = g->b0 + l * g->nbp;
    void *x = NULL; /* a row-parallel region's output: the group's sum (sp: this rank's rows of it) */
    MT_CHECK(colpar_forward(g, a->ln1, a->qkv, 3 * Cl, NULL, W(p + QKVW), W(p + QKVB), 3 * Cl));
    OP(PROF_ATTN_FWD, mt_cuda_attention_forward(a->atty, a->lse, a->qkv, B, T, Cl, g->NHl, dt, s));
    MT_CHECK(rowpar_forward(g, a->atty, Cl, W(p + PROJW), ROW_BIAS(p + PROJB), &x));
    OP(PROF_LN_FWD, mt_cuda_residual_layernorm_forward(a->r2, LN_DST(a->ln2), a->ln2_mean, a->ln2_rstd, x, RES(l),
                                                       W(p + LN2W), W(p + LN2B), R, C, dt, s));
    if (g->p.fused_gelu) {
        return colpar_forward(g, a->ln2, a->fch_gelu, Hl, a->fch, W(p + FCW), W(p + FCB), Hl);
    }
    MT_CHECK(colpar_forward(g, a->ln2, a->fch, Hl, NULL, W(p + FCW), W(p + FCB), Hl));
    OP(PROF_GELU, mt_cuda_gelu_forward(a->fch_gelu, a->fch, (size_t)N * Hl, dt, s));
    return MT_OK;
}

/* model.head_chunks = k > 1: the logits (n, Vl) of rows [j0, j0 + n) of the head's input x (N, C: gpt2's gathered
 * ln_f output, the mlp's resid[L]) into g->logits_chunk, the Vr real columns = x W^T (+ bias: the mlp's), in
 * forward and again in backward (the same product of the same rows: the same values). */
static mt_status_t head_chunk_logits(mt_gpt2_cuda_t g, const void *x, const void *w, const void *bias, size_t j0,
                                     int n) {
    if (g->Vr > 0) {
        OP(PROF_MATMUL_FWD,
           mt_cuda_matmul_forward(g->ctx, g->logits_chunk, g->Vl, NULL, (const char *)x + j0 * (size_t)g->C * g->es, w,
                                  bias, n, g->C, g->Vr, g->dt, g->stream));
    }
    return MT_OK;
}

/* GPT-2's head backward with head_chunks > 1, the last stage: each chunk's logits recomputed, their gradient in
 * place, d lnf's rows (into da) and dwte += dlogits^T lnf; the tp reduction of da (*x as tp_reduce_async gives it)
 * starts after the last chunk's input gradient, overlapping its weight gradient, as the unchunked head's does. */
static mt_status_t head_chunks_backward(mt_gpt2_cuda_t g, float scale, void **x) {
    int N = g->N, C = g->C, dt = g->dt;
    size_t rowb = (size_t)C * g->es;
    void *s = g->stream;
    if (g->Vr == 0) { /* tp: no real vocabulary row here, no part of d lnf */
        OP(PROF_OTHER, cudaMemsetAsync(g->da, 0, (size_t)N * rowb, (cudaStream_t)s));
        return tp_reduce_async(g, g->da, g->tmp_r, x);
    }
    int last = 0;
    for (int j = 0; j < g->hk; j++) {
        size_t j0;
        last = mt_model_head_chunk((size_t)N, g->hk, j, &j0) > 0 ? j : last;
    }
    for (int j = 0; j <= last; j++) {
        size_t j0, n = mt_model_head_chunk((size_t)N, g->hk, j, &j0);
        if (n == 0) {
            continue;
        }
        void *lg = g->logits_chunk;
        const char *lnf = (const char *)g->A->lnf + j0 * rowb;
        MT_CHECK(head_chunk_logits(g, g->A->lnf, W(0), NULL, j0, (int)n));
        OP(PROF_CE, mt_cuda_softmax_ce_backward_shard(lg, lg, g->A->lse_ce + j0, g->A->targets_d + j0, g->A->n_valid,
                                                      g->v0, (int)n, g->Vr, g->Vl, scale, dt, s));
        OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, (char *)g->da + j0 * rowb, NULL, NULL, lg, g->Vl, lnf,
                                                        W(0), (int)n, C, g->Vr, dt, NULL, s));
        if (j == last) {
            MT_CHECK(tp_reduce_async(g, g->da, g->tmp_r, x));
        }
        OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, NULL, G(0), NULL, lg, g->Vl, lnf, W(0), (int)n, C,
                                                        g->Vr, dt, NULL, s));
    }
    return MT_OK;
}

/* model.kind = "mlp" (models/mlp/mlp.c), forward of the stage once the tokens and targets are on the device: the
 * embedding (first stage) into resid[0], each hidden layer l from its input resid[l] to resid[l + 1] =
 * gelu(resid[l] W^T + b) (the bias and GELU in the product's epilogue, the pre-activation kept for backward in
 * LA(l)->fch), the head's logits = resid[L] Wh^T + bh and the fused softmax + cross-entropy (last stage). */
static mt_status_t mlp_forward(mt_gpt2_cuda_t g) {
    int N = g->N, C = g->C, dt = g->dt;
    void *s = g->stream;
    if (g->first) {
        OP(PROF_EMBED, mt_cuda_embedding_forward_shard(RES(0), g->A->tokens_d, W(0), NULL, 0, g->Vl, g->B, g->T, C,
                                                       dt, s));
    }
    for (int l = g->lo; l < g->hi; l++) {
        int p = g->b0 + l * g->nbp;
        MT_CHECK(wneed(g, l, +1));
        if (g->p.fused_gelu) {
            OP(PROF_MATMUL_FWD, mt_cuda_matmul_forward(g->ctx, RES(l + 1), C, LA(l)->fch, RES(l), W(p + MLP_W),
                                                       W(p + MLP_B), N, C, C, dt, s));
        } else {
            OP(PROF_MATMUL_FWD, mt_cuda_matmul_forward(g->ctx, LA(l)->fch, C, NULL, RES(l), W(p + MLP_W),
                                                       W(p + MLP_B), N, C, C, dt, s));
            OP(PROF_GELU, mt_cuda_gelu_forward(RES(l + 1), LA(l)->fch, (size_t)N * C, dt, s));
        }
    }
    if (!g->last) {
        return MT_OK;
    }
    int pf = g->pf;
    if (g->hk > 1) { /* each chunk's logits and its rows' statistics, then the mean over all rows */
        for (int j = 0; j < g->hk; j++) {
            size_t j0, n = mt_model_head_chunk((size_t)N, g->hk, j, &j0);
            if (n > 0) {
                MT_CHECK(head_chunk_logits(g, RES(g->L), W(pf + MLP_W), W(pf + MLP_B), j0, (int)n));
                OP(PROF_CE, mt_cuda_softmax_ce_forward(g->A->losses + j0, g->A->lse_ce + j0, NULL, NULL,
                                                       g->logits_chunk, g->A->targets_d + j0, (int)n, g->V, g->Vl,
                                                       dt, s));
            }
        }
        OP(PROF_CE, mt_cuda_softmax_ce_mean(g->A->mean_loss, g->A->n_valid, g->A->losses, g->A->targets_d, N, s));
        return MT_OK;
    }
    OP(PROF_MATMUL_FWD, mt_cuda_matmul_forward(g->ctx, g->A->logits, g->Vl, NULL, RES(g->L), W(pf + MLP_W),
                                               W(pf + MLP_B), N, C, g->V, dt, s));
    OP(PROF_CE, mt_cuda_softmax_ce_forward(g->A->losses, g->A->lse_ce, g->A->mean_loss, g->A->n_valid, g->A->logits,
                                           g->A->targets_d, N, g->V, g->Vl, dt, s));
    return MT_OK;
}

mt_status_t mt_gpt2_cuda_forward(mt_gpt2_cuda_t g, const int32_t *tokens, const int32_t *targets) {
    int N = g->N, C = g->C, L = g->L, B = g->B, T = g->T, dt = g->dt, Hl = g->Hl, R = g->R;
    void *s = g->stream;
    MT_CHECK(tp_rejoin(g));
    if ((g->first && !tokens) || (g->last && !targets)) {
        return mt_error(MT_ERR_INVALID_USAGE, "gpt2_cuda: the %s stage needs the %s", g->first ? "first" : "last",
                        g->first && !tokens ? "tokens" : "targets");
    }
    for (int i = 0; i < N; i++) {
        if (g->first && (tokens[i] < 0 || tokens[i] >= g->V)) {
            return mt_error(MT_ERR_INVALID_ARG, "gpt2_cuda: token %d at position %d is outside [0, %d)", tokens[i], i,
                            g->V);
        }
        if (g->last && (targets[i] < -1 || targets[i] >= g->V)) {
            return mt_error(MT_ERR_INVALID_ARG, "gpt2_cuda: target %d at position %d is outside [0, %d) and not -1",
                            targets[i], i, g->V);
        }
    }
    /* the copy out of this slot two forwards ago is done (long since, unless the host runs far ahead) */
    int k = g->slot;
    g->slot ^= 1;
    int32_t *pin = g->pinned + (size_t)k * 2 * N;
    CK(cudaEventSynchronize(g->copied[k]));
    if (g->first) {
        memcpy(pin, tokens, (size_t)N * 4);
        CK(cudaMemcpyAsync(g->A->tokens_d, pin, (size_t)N * 4, cudaMemcpyHostToDevice, g->stream));
    }
    if (g->last) {
        memcpy(pin + N, targets, (size_t)N * 4);
        CK(cudaMemcpyAsync(g->A->targets_d, pin + N, (size_t)N * 4, cudaMemcpyHostToDevice, g->stream));
    }
    CK(cudaEventRecord(g->copied[k], g->stream));
    if (g->zero3 && (!g->whook || !g->consumer)) {
        return mt_error(MT_ERR_INVALID_USAGE, "gpt2_cuda: ZeRO-3 keeps a slice of the weights: set a weight hook and "
                                              "the comm stream before forward");
    }
    MT_CHECK(wouter_fresh(g));
    g->last_fwd = g->A;
    MT_CHECK(gpt2_cuda_prof_mark(g, MT_GPT2_PROF_START));
    if (g->mlp) {
        return mlp_forward(g);
    }
    if (g->first) { /* later stages find their input in resid[lo] (mt_gpt2_cuda_stage_input) */
        /* tp: each token's row from its rank and wpe from rank 0, summed (sp: this rank's rows of the sum) */
        void *emb = g->sp ? g->tmp_c : RES(0), *x = NULL;
        OP(PROF_EMBED, mt_cuda_embedding_forward_shard(emb, g->A->tokens_d, W(0), ROW_BIAS(1), g->v0, g->Vl, B, T, C,
                                                       dt, s));
        MT_CHECK(tp_reduce(g, emb, RES(0), &x));
    }
    int pf = g->pf;       /* ln_f */
    if (g->lo == g->hi && g->last) { /* no block to fuse ln_f into */
        OP(PROF_LN_FWD, mt_cuda_layernorm_forward(LN_DST(g->A->lnf), g->A->lnf_mean, g->A->lnf_rstd, RES(L), W(pf),
                                                  W(pf + 1), R, C, dt, s));
    }
    /* each LayerNorm output entering a column-parallel region (ln_1, ln_2, ln_f) is gathered by the region's
     * colpar_forward (sequence parallelism), after the ZeRO-3 weight waits */
    for (int l = g->lo; l < g->hi; l++) {
        layer_acts_t *a = LA(l);
        int p = g->b0 + l * g->nbp;
        MT_CHECK(wneed(g, l, +1));
        if (l == g->lo) { /* later blocks get ln_1 from the previous block's fused residual + LayerNorm */
            OP(PROF_LN_FWD, mt_cuda_layernorm_forward(LN_DST(a->ln1), a->ln1_mean, a->ln1_rstd, RES(l), W(p + LN1W),
                                                      W(p + LN1B), R, C, dt, s));
        }
        MT_CHECK(block_forward_to_gelu(g, l));
        void *x = NULL; /* a row-parallel region's output: the group's sum (sp: this rank's rows of it) */
        MT_CHECK(rowpar_forward(g, a->fch_gelu, Hl, W(p + FCPW), ROW_BIAS(p + FCPB), &x));
        if (l + 1 < g->hi) {
            layer_acts_t *nx = LA(l + 1);
            int pn = p + g->nbp;
            OP(PROF_LN_FWD,
               mt_cuda_residual_layernorm_forward(RES(l + 1), LN_DST(nx->ln1), nx->ln1_mean, nx->ln1_rstd, x, a->r2,
                                                  W(pn + LN1W), W(pn + LN1B), R, C, dt, s));
        } else if (g->last) {
            OP(PROF_LN_FWD, mt_cuda_residual_layernorm_forward(RES(L), LN_DST(g->A->lnf), g->A->lnf_mean,
                                                               g->A->lnf_rstd, x, a->r2, W(pf), W(pf + 1), R, C, dt,
                                                               s));
        } else { /* the stage's output x_hi, for the next stage (unfused: its ln_1 is there) */
            OP(PROF_OTHER, mt_cuda_residual_forward(RES(l + 1), x, a->r2, (size_t)R * C, dt, s));
        }
    }
    if (!g->last) {
        return MT_OK;
    }
    /* logits (N, Vl): the Vr real columns; padded columns are never read. tp: this rank's vocabulary rows, the
     * cross-entropy from every rank's per-row statistics. head_chunks: the gather alone, then each chunk's logits
     * and its rows' statistics */
    MT_CHECK(colpar_forward(g, g->A->lnf, g->A->logits, g->Vl, NULL, W(0), NULL, g->hk > 1 ? 0 : g->Vr));
    if (g->hk > 1) {
        for (int j = 0; j < g->hk; j++) {
            size_t j0, n = mt_model_head_chunk((size_t)N, g->hk, j, &j0);
            if (n == 0) {
                continue;
            }
            void *lg = g->logits_chunk;
            MT_CHECK(head_chunk_logits(g, g->A->lnf, W(0), NULL, j0, (int)n));
            if (g->tp == 1) {
                OP(PROF_CE, mt_cuda_softmax_ce_forward(g->A->losses + j0, g->A->lse_ce + j0, NULL, NULL, lg,
                                                       g->A->targets_d + j0, (int)n, g->V, g->Vl, dt, s));
            } else {
                OP(PROF_CE, mt_cuda_softmax_ce_partial(g->ce_part + 3 * j0, lg, g->A->targets_d + j0, g->v0, (int)n,
                                                       g->Vr, g->Vl, dt, s));
            }
        }
        if (g->tp == 1) {
            OP(PROF_CE, mt_cuda_softmax_ce_mean(g->A->mean_loss, g->A->n_valid, g->A->losses, g->A->targets_d, N, s));
            return MT_OK;
        }
    } else if (g->tp == 1) {
        OP(PROF_CE, mt_cuda_softmax_ce_forward(g->A->losses, g->A->lse_ce, g->A->mean_loss, g->A->n_valid,
                                               g->A->logits, g->A->targets_d, N, g->V, g->Vp, dt, s));
        return MT_OK;
    } else {
        OP(PROF_CE,
           mt_cuda_softmax_ce_partial(g->ce_part, g->A->logits, g->A->targets_d, g->v0, N, g->Vr, g->Vl, dt, s));
    }
    MT_CHECK(g->p.tp_ops->all_gather(g->p.tp_ops->ctx, g->ce_part, g->ce_parts, (size_t)N * 3, MT_CU_F32, s));
    MT_CHECK(gpt2_cuda_prof_mark(g, MT_GPT2_PROF_TP));
    OP(PROF_CE, mt_cuda_softmax_ce_combine(g->A->losses, g->A->lse_ce, g->A->mean_loss, g->A->n_valid, g->ce_parts,
                                           g->tp, g->A->targets_d, N, s));
    return MT_OK;
}

/* The gradients of parameters [p0, p1) are complete in stream order: tells the hook their flat range and
 * where they are; under ZeRO-2 then marks (on the consumer's stream) when the storage may be written again:
 * ev, the slot's event or the embedding's. */
static mt_status_t grads_done(mt_gpt2_cuda_t g, int p0, int p1, cudaEvent_t ev) {
    if (!g->hook) {
        return MT_OK;
    }
    size_t lo = g->offs[p0], hi = p1 < g->n_params ? g->offs[p1] : g->numel;
    if (lo == hi) { /* none of them on this stage */
        return MT_OK;
    }
    MT_CHECK(g->hook(g->hook_arg, lo, hi, G(p0)));
    if (g->zero2 && ev) {
        CK(cudaEventRecord(ev, g->consumer));
    }
    return MT_OK;
}

/* recompute = block: refills the shared internals of block l from its input resid[l] with the forward's kernels
 * and collectives, chunked as the forward's (ln_1 unfused here: the fused kernel normalises the stored sum, so
 * the bits are the same), up to gelu(fc): the block's output is not needed again. g->tmp_c is free during
 * backward. */
static mt_status_t block_recompute(mt_gpt2_cuda_t g, int l) {
    layer_acts_t *a = LA(l);
    int p = g->b0 + l * g->nbp;
    OP(PROF_LN_FWD, mt_cuda_layernorm_forward(LN_DST(a->ln1), a->ln1_mean, a->ln1_rstd, RES(l), W(p + LN1W),
                                              W(p + LN1B), g->R, g->C, g->dt, g->stream));
    return block_forward_to_gelu(g, l);
}

/* LayerNorm backward over this rank's R rows: dinp (R,C) += ..., and the gradients of its weight and bias (C each,
 * contiguous at dwb) accumulate. With sequence parallelism each rank sees its own rows only: they accumulate in
 * slot `slot` (0 or 1) of the scratch lng instead, which ln_grads_begin zeroed, and ln_grads_reduce sums the
 * slots over the tp group in one all-reduce and adds them to their gradients (a block's two LayerNorms in one:
 * L + 1 all-reduces per backward pass, not 2L + 1). */
static mt_status_t ln_backward(mt_gpt2_cuda_t g, void *dinp, float *dwb, int slot, const void *dout, const void *inp,
                               const void *w, const float *mean, const float *rstd) {
    int C = g->C;
    float *dst = g->sp ? g->lng + (size_t)slot * 2 * C : dwb;
    OP(PROF_LN_BWD, mt_cuda_layernorm_backward(dinp, dst, dst + C, dout, inp, w, mean, rstd, g->R, C, g->dt,
                                               g->ln_scratch, g->stream));
    return MT_OK;
}

/* sp: zeroes the first n slots of lng before n LayerNorm backwards. */
static mt_status_t ln_grads_begin(mt_gpt2_cuda_t g, int n) {
    if (g->sp) {
        OP(PROF_OTHER, cudaMemsetAsync(g->lng, 0, (size_t)n * 2 * (size_t)g->C * 4, g->stream));
    }
    return MT_OK;
}

/* sp: slots 0 .. n-1 of lng summed over the tp group (one all-reduce) and added to dwb[0 .. n-1]. */
static mt_status_t ln_grads_reduce(mt_gpt2_cuda_t g, float *const *dwb, int n) {
    if (!g->sp) {
        return MT_OK;
    }
    size_t C2 = 2 * (size_t)g->C;
    MT_CHECK(g->p.tp_ops->all_reduce_sum(g->p.tp_ops->ctx, g->lng, (size_t)n * C2, MT_CU_F32, g->stream));
    MT_CHECK(gpt2_cuda_prof_mark(g, MT_GPT2_PROF_TP));
    for (int k = 0; k < n; k++) {
        OP(PROF_OTHER, mt_cuda_residual_forward(dwb[k], dwb[k], g->lng + (size_t)k * C2, C2, MT_CU_F32, g->stream));
    }
    return MT_OK;
}

/* model.kind = "mlp", backward of the stage after mt_gpt2_cuda_backward's set-up (scale: the loss gradient's;
 * fresh: the shared internals under recompute = block hold the last layer's forward values). dresid carries the
 * gradient of the current layer's output down the stage, overwritten by each product's input gradient (it is
 * read only by the GELU backward before it): the head's d resid[L] (last stage; a stage before it finds d
 * resid[hi] there, mt_gpt2_cuda_stage_grad), each layer's d resid[l], then the embedding's gradient. */
static mt_status_t mlp_backward(mt_gpt2_cuda_t g, float scale, bool fresh) {
    int N = g->N, C = g->C, dt = g->dt, pf = g->pf;
    void *s = g->stream;
    if (g->last) { /* dlogits in place; d resid[L], dWh and dbh (head_chunks: each chunk's logits recomputed) */
        for (int j = 0; j < g->hk; j++) {
            size_t j0, n = mt_model_head_chunk((size_t)N, g->hk, j, &j0), rowb = (size_t)C * g->es;
            void *lg = g->hk > 1 ? g->logits_chunk : g->A->logits;
            if (n == 0) {
                continue;
            }
            if (g->hk > 1) {
                MT_CHECK(head_chunk_logits(g, RES(g->L), W(pf + MLP_W), W(pf + MLP_B), j0, (int)n));
            }
            OP(PROF_CE, mt_cuda_softmax_ce_backward(lg, lg, g->A->lse_ce + j0, g->A->targets_d + j0, g->A->n_valid,
                                                    (int)n, g->V, g->Vl, scale, dt, s));
            OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, (char *)g->dresid + j0 * rowb, G(pf + MLP_W),
                                                            G(pf + MLP_B), lg, g->Vl, (const char *)RES(g->L) + j0 * rowb,
                                                            W(pf + MLP_W), (int)n, C, g->V, dt, g->col_scratch, s));
        }
        /* ZeRO-2: on a stage without wte (a pipeline's last) the head's run is gouter's last use, so its hook
         * marks outer_free, which the next pass waits for before it clears gouter */
        MT_CHECK(grads_done(g, pf, g->n_params, g->held[0] ? NULL : g->outer_free));
    }
    for (int l = g->hi - 1; l >= g->lo; l--) {
        int p = g->b0 + l * g->nbp;
        void *pre = LA(l)->fch;
        MT_CHECK(wneed(g, l, -1));
        if (g->recompute && (l + 1 < g->hi || !fresh)) { /* the forward's product again (the same kernel: the same
                                                          * bits), its GELU output into tmp_c, free in backward */
            OP(PROF_MATMUL_FWD, mt_cuda_matmul_forward(g->ctx, g->p.fused_gelu ? g->tmp_c : pre, C,
                                                       g->p.fused_gelu ? pre : NULL, RES(l), W(p + MLP_W),
                                                       W(p + MLP_B), N, C, C, dt, s));
        }
        if (g->zero2) { /* the slot's previous layer has been consumed */
            CK(cudaStreamWaitEvent(g->stream, g->slot_free[l % 2], 0));
            OP(PROF_OTHER, cudaMemsetAsync(G(p), 0, g->blk_numel * 4, g->stream));
        }
        OP(PROF_GELU, mt_cuda_gelu_backward_set(g->dfc, pre, g->dresid, (size_t)N * C, dt, s));
        OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, g->dresid, G(p + MLP_W), G(p + MLP_B), g->dfc, C,
                                                        RES(l), W(p + MLP_W), N, C, C, dt, g->col_scratch, s));
        MT_CHECK(grads_done(g, p, p + g->nbp, g->slot_free[l % 2]));
    }
    if (g->first) {
        OP(PROF_EMBED, mt_cuda_embedding_backward_shard(G(0), NULL, g->dresid, g->A->tokens_d, 0, g->Vl, g->B, g->T,
                                                        C, dt, s));
    }
    return grads_done(g, 0, g->b0, g->outer_free);
}

mt_status_t mt_gpt2_cuda_backward(mt_gpt2_cuda_t g, float loss_grad_scale) {
    int N = g->N, C = g->C, L = g->L, B = g->B, T = g->T, dt = g->dt, Cl = g->Cl, Hl = g->Hl;
    size_t NC = (size_t)N * C, RC = (size_t)g->R * C, es = g->es;
    void *x = NULL;           /* f backward's result: the group's sum of an input gradient (sp: this rank's rows) */
    void *s = g->stream;
    cudaStream_t cs = g->stream;
    int pf = g->pf;
    float scale = loss_grad_scale * mt_loss_scaler_scale(&g->scaler);
    if (g->zero2 && (!g->hook || !g->consumer)) {
        return mt_error(MT_ERR_INVALID_USAGE, "gpt2_cuda: ZeRO-2 keeps no whole gradient: set a gradient hook and "
                                              "the comm stream before backward");
    }
    MT_CHECK(tp_rejoin(g));
    MT_CHECK(gpt2_cuda_prof_mark(g, MT_GPT2_PROF_START));
    /* recompute = block: the shared internals hold the last block's forward values only if the last forward
     * was this set's and no backward has refilled them since */
    bool fresh = g->last_fwd == g->A;
    g->last_fwd = NULL;
    if (g->zero2) { /* every pass starts from zero: the consumer accumulated the last one into its slice (a
                     * pipeline's tied wte accumulates here until the step's end: zero_grads clears it) */
        CK(cudaStreamWaitEvent(cs, g->outer_free, 0));
        size_t outer = g->offs[g->b0] + (g->numel - g->offs[pf]);
        OP(PROF_OTHER, cudaMemsetAsync(g->gouter + g->tied_acc, 0, (outer - g->tied_acc) * 4, cs));
    }
    if (g->mlp) {
        return mlp_backward(g, scale, fresh);
    }
    /* head: dlogits in place, dlnf = dlogits @ wte (and dwte += dlogits^T lnf), ln_f backward; a stage before
     * the last finds d x_hi in dresid (mt_gpt2_cuda_stage_grad) */
    if (g->last && g->hk > 1) {
        MT_CHECK(head_chunks_backward(g, scale, &x));
    } else if (g->last) {
        OP(PROF_CE, mt_cuda_softmax_ce_backward_shard(g->A->logits, g->A->logits, g->A->lse_ce, g->A->targets_d,
                                                      g->A->n_valid, g->v0, N, g->Vr, g->Vl, scale, dt, s));
        if (g->Vr > 0) { /* d lnf, reduced over tp while dwte += dlogits^T lnf */
            OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, g->da, NULL, NULL, g->A->logits, g->Vl, g->A->lnf,
                                                            W(0), N, C, g->Vr, dt, NULL, s));
            MT_CHECK(tp_reduce_async(g, g->da, g->tmp_r, &x));
            OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, NULL, G(0), NULL, g->A->logits, g->Vl, g->A->lnf,
                                                            W(0), N, C, g->Vr, dt, NULL, s));
        } else { /* tp: no real vocabulary row here, no part of d lnf */
            OP(PROF_OTHER, cudaMemsetAsync(g->da, 0, NC * es, cs));
            MT_CHECK(tp_reduce_async(g, g->da, g->tmp_r, &x));
        }
    }
    if (g->last) {
        MT_CHECK(tp_join(g));
        OP(PROF_OTHER, cudaMemsetAsync(g->dresid, 0, RC * es, cs));
        MT_CHECK(ln_grads_begin(g, 1));
        MT_CHECK(ln_backward(g, g->dresid, G(pf), 0, x, RES(L), W(pf), g->A->lnf_mean, g->A->lnf_rstd));
        float *lnf[] = {G(pf)};
        MT_CHECK(ln_grads_reduce(g, lnf, 1));
        MT_CHECK(grads_done(g, pf, g->n_params, NULL));
    }
    for (int l = g->hi - 1; l >= g->lo; l--) {
        layer_acts_t *a = LA(l);
        int p = g->b0 + l * g->nbp;
        MT_CHECK(wneed(g, l, -1));
        if (g->recompute && (l + 1 < g->hi || !fresh)) {
            MT_CHECK(block_recompute(g, l));
        }
        if (g->zero2) { /* the slot's previous block has been consumed */
            CK(cudaStreamWaitEvent(cs, g->slot_free[l % 2], 0));
            OP(PROF_OTHER, cudaMemsetAsync(G(p), 0, g->blk_numel * 4, cs));
        }
        /* MLP branch: x_{l+1} = r2 + fcproj(gelu(fc(ln2(r2)))); dresid holds d x_{l+1}. The activation gradients
         * da, dfg, dfc, dln1 are written (not accumulated): no zeroing before the products. sp: the row-parallel
         * region reads every rank's rows of dresid, gathered into tmp_c (free in backward), and its bias gradient
         * sums all N rows, whole on every rank */
        MT_CHECK(rowpar_backward(g, g->dfg, a->fch_gelu, Hl, W(p + FCPW), G(p + FCPW), G(p + FCPB)));
        OP(PROF_GELU, mt_cuda_gelu_backward_set(g->dfc, a->fch, g->dfg, (size_t)N * Hl, dt, s));
        OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, g->da, NULL, NULL, g->dfc, Hl, a->ln2, W(p + FCW), N,
                                                        C, Hl, dt, g->col_scratch, s));
        MT_CHECK(tp_reduce_async(g, g->da, g->tmp_r, &x)); /* tp: each rank's columns' part of d ln2 */
        OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, NULL, G(p + FCW), G(p + FCB), g->dfc, Hl, a->ln2,
                                                        W(p + FCW), N, C, Hl, dt, g->col_scratch, s));
        MT_CHECK(tp_join(g));
        MT_CHECK(ln_grads_begin(g, 2)); /* sp: ln2's and ln1's weight/bias gradients reduced together, below */
        MT_CHECK(ln_backward(g, g->dresid, G(p + LN2W), 0, x, a->r2, W(p + LN2W), a->ln2_mean, a->ln2_rstd));
        /* attention branch: r2 = x_l + proj(attn(qkv(ln1(x_l)))); dresid now holds d r2 */
        MT_CHECK(rowpar_backward(g, g->da, a->atty, Cl, W(p + PROJW), G(p + PROJW), G(p + PROJB)));
        void *dqkv = g->dfg; /* (N,3Cl) fits in (N,Hl) */
        OP(PROF_OTHER, cudaMemsetAsync(dqkv, 0, 3 * (size_t)N * Cl * es, cs));
        OP(PROF_ATTN_BWD,
           mt_cuda_attention_backward(dqkv, g->da, a->qkv, a->atty, a->lse, B, T, Cl, g->NHl, dt, g->attn_scratch, s));
        void *dln1 = g->da; /* (N,C): attention backward has read da (its dout) */
        OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, dln1, NULL, NULL, dqkv, 3 * Cl, a->ln1, W(p + QKVW), N,
                                                        C, 3 * Cl, dt, g->col_scratch, s));
        MT_CHECK(tp_reduce_async(g, dln1, g->tmp_r, &x)); /* tp: each rank's heads' part of d ln1 */
        OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, NULL, G(p + QKVW), G(p + QKVB), dqkv, 3 * Cl, a->ln1,
                                                        W(p + QKVW), N, C, 3 * Cl, dt, g->col_scratch, s));
        MT_CHECK(tp_join(g));
        MT_CHECK(ln_backward(g, g->dresid, G(p + LN1W), 1, x, RES(l), W(p + LN1W), a->ln1_mean, a->ln1_rstd));
        float *lns[] = {G(p + LN2W), G(p + LN1W)};
        MT_CHECK(ln_grads_reduce(g, lns, 2));
        MT_CHECK(grads_done(g, p, p + g->nbp, g->slot_free[l % 2]));
    }
    if (g->first) { /* a later stage leaves d x_lo in dresid for the previous one; sp: every rank's rows */
        MT_CHECK(tp_gather(g, g->dresid, g->tmp_c));
        OP(PROF_EMBED, mt_cuda_embedding_backward_shard(G(0), G(1), g->sp ? g->tmp_c : g->dresid, g->A->tokens_d,
                                                        g->v0, g->Vl, B, T, C, dt, s));
    }
    return grads_done(g, 0, g->b0, g->outer_free); /* wte and wpe; on the last stage only wte, from the head */
}
