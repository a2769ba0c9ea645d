/* The device GPT-2's forward and backward of one micro-batch (models/cuda/gpt2_cuda.c builds the trainer, see its
 * head for the fusions and the shape legend; gpt2_cuda_tp.c holds the tensor-parallel region boundaries;
 * gpt2_cuda_step.c the optimizer step): the blocks in the order of models/gpt2/gpt2.c, the MLP's layers, the head
 * (whole or in chunks), ZeRO-3's weight gathers ahead of each block, the gradient hooks as runs complete.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <string.h>

#include "models/cuda/gpt2_cuda_impl.h"

/* Where a LayerNorm whose output enters a column-parallel region writes: full (N,C) itself, or with sequence
 * parallelism this rank's R rows, which gpt2_cuda_tp_gather then gathers into full. */
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
    MT_CHECK(gpt2_cuda_colpar_forward(g, a->ln1, a->qkv, 3 * Cl, NULL, W(p + QKVW), W(p + QKVB), 3 * Cl));
    OP(PROF_ATTN_FWD, mt_cuda_attention_forward(a->atty, a->lse, a->qkv, B, T, Cl, g->NHl, dt, s));
    MT_CHECK(gpt2_cuda_rowpar_forward(g, a->atty, Cl, W(p + PROJW), ROW_BIAS(p + PROJB), &x));
    OP(PROF_LN_FWD, mt_cuda_residual_layernorm_forward(a->r2, LN_DST(a->ln2), a->ln2_mean, a->ln2_rstd, x, RES(l),
                                                       W(p + LN2W), W(p + LN2B), R, C, dt, s));
    if (g->p.fused_gelu) {
        return gpt2_cuda_colpar_forward(g, a->ln2, a->fch_gelu, Hl, a->fch, W(p + FCW), W(p + FCB), Hl);
    }
    MT_CHECK(gpt2_cuda_colpar_forward(g, a->ln2, a->fch, Hl, NULL, W(p + FCW), W(p + FCB), Hl));
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
 * place, d lnf's rows (into da) and dwte += dlogits^T lnf; the tp reduction of da (*x as gpt2_cuda_tp_reduce_async
 * gives it) starts after the last chunk's input gradient, overlapping its weight gradient, as the unchunked head's
 * does. */
static mt_status_t head_chunks_backward(mt_gpt2_cuda_t g, float scale, void **x) {
    int N = g->N, C = g->C, dt = g->dt;
    size_t rowb = (size_t)C * g->es;
    void *s = g->stream;
    if (g->Vr == 0) { /* tp: no real vocabulary row here, no part of d lnf */
        OP(PROF_OTHER, cudaMemsetAsync(g->da, 0, (size_t)N * rowb, (cudaStream_t)s));
        return gpt2_cuda_tp_reduce_async(g, g->da, g->tmp_r, x);
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
            MT_CHECK(gpt2_cuda_tp_reduce_async(g, g->da, g->tmp_r, x));
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
    MT_CHECK(gpt2_cuda_tp_rejoin(g));
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
        MT_CHECK(gpt2_cuda_tp_reduce(g, emb, RES(0), &x));
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
        MT_CHECK(gpt2_cuda_rowpar_forward(g, a->fch_gelu, Hl, W(p + FCPW), ROW_BIAS(p + FCPB), &x));
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
    MT_CHECK(gpt2_cuda_colpar_forward(g, g->A->lnf, g->A->logits, g->Vl, NULL, W(0), NULL, g->hk > 1 ? 0 : g->Vr));
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
    MT_CHECK(gpt2_cuda_tp_rejoin(g));
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
            MT_CHECK(gpt2_cuda_tp_reduce_async(g, g->da, g->tmp_r, &x));
            OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, NULL, G(0), NULL, g->A->logits, g->Vl, g->A->lnf,
                                                            W(0), N, C, g->Vr, dt, NULL, s));
        } else { /* tp: no real vocabulary row here, no part of d lnf */
            OP(PROF_OTHER, cudaMemsetAsync(g->da, 0, NC * es, cs));
            MT_CHECK(gpt2_cuda_tp_reduce_async(g, g->da, g->tmp_r, &x));
        }
    }
    if (g->last) {
        MT_CHECK(gpt2_cuda_tp_join(g));
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
        MT_CHECK(gpt2_cuda_rowpar_backward(g, g->dfg, a->fch_gelu, Hl, W(p + FCPW), G(p + FCPW), G(p + FCPB)));
        OP(PROF_GELU, mt_cuda_gelu_backward_set(g->dfc, a->fch, g->dfg, (size_t)N * Hl, dt, s));
        OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, g->da, NULL, NULL, g->dfc, Hl, a->ln2, W(p + FCW), N,
                                                        C, Hl, dt, g->col_scratch, s));
        MT_CHECK(gpt2_cuda_tp_reduce_async(g, g->da, g->tmp_r, &x)); /* tp: each rank's columns' part of d ln2 */
        OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, NULL, G(p + FCW), G(p + FCB), g->dfc, Hl, a->ln2,
                                                        W(p + FCW), N, C, Hl, dt, g->col_scratch, s));
        MT_CHECK(gpt2_cuda_tp_join(g));
        MT_CHECK(ln_grads_begin(g, 2)); /* sp: ln2's and ln1's weight/bias gradients reduced together, below */
        MT_CHECK(ln_backward(g, g->dresid, G(p + LN2W), 0, x, a->r2, W(p + LN2W), a->ln2_mean, a->ln2_rstd));
        /* attention branch: r2 = x_l + proj(attn(qkv(ln1(x_l)))); dresid now holds d r2 */
        MT_CHECK(gpt2_cuda_rowpar_backward(g, g->da, a->atty, Cl, W(p + PROJW), G(p + PROJW), G(p + PROJB)));
        void *dqkv = g->dfg; /* (N,3Cl) fits in (N,Hl) */
        OP(PROF_OTHER, cudaMemsetAsync(dqkv, 0, 3 * (size_t)N * Cl * es, cs));
        OP(PROF_ATTN_BWD,
           mt_cuda_attention_backward(dqkv, g->da, a->qkv, a->atty, a->lse, B, T, Cl, g->NHl, dt, g->attn_scratch, s));
        void *dln1 = g->da; /* (N,C): attention backward has read da (its dout) */
        OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, dln1, NULL, NULL, dqkv, 3 * Cl, a->ln1, W(p + QKVW), N,
                                                        C, 3 * Cl, dt, g->col_scratch, s));
        MT_CHECK(gpt2_cuda_tp_reduce_async(g, dln1, g->tmp_r, &x)); /* tp: each rank's heads' part of d ln1 */
        OP(PROF_MATMUL_BWD, mt_cuda_matmul_backward_set(g->ctx, NULL, G(p + QKVW), G(p + QKVB), dqkv, 3 * Cl, a->ln1,
                                                        W(p + QKVW), N, C, 3 * Cl, dt, g->col_scratch, s));
        MT_CHECK(gpt2_cuda_tp_join(g));
        MT_CHECK(ln_backward(g, g->dresid, G(p + LN1W), 1, x, RES(l), W(p + LN1W), a->ln1_mean, a->ln1_rstd));
        float *lns[] = {G(p + LN2W), G(p + LN1W)};
        MT_CHECK(ln_grads_reduce(g, lns, 2));
        MT_CHECK(grads_done(g, p, p + g->nbp, g->slot_free[l % 2]));
    }
    if (g->first) { /* a later stage leaves d x_lo in dresid for the previous one; sp: every rank's rows */
        MT_CHECK(gpt2_cuda_tp_gather(g, g->dresid, g->tmp_c));
        OP(PROF_EMBED, mt_cuda_embedding_backward_shard(G(0), G(1), g->sp ? g->tmp_c : g->dresid, g->A->tokens_d,
                                                        g->v0, g->Vl, B, T, C, dt, s));
    }
    return grads_done(g, 0, g->b0, g->outer_free); /* wte and wpe; on the last stage only wte, from the head */
}
