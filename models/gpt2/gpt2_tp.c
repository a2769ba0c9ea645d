/* Tensor-parallel GPT-2 (Megatron-LM, Shoeybi et al. 2019; sequence parallelism, Korthikanti et al. 2022):
 * the math of each rank's shard. Communication goes through the mt_tp_ops_t seam that parallel/tp.c
 * supplies; this file never calls MPI. Per block: QKV column-parallel (whole heads per rank), attention on
 * the local heads, output projection row-parallel; MLP fc column-parallel, proj row-parallel. Megatron's
 * two conjugate operators mark the region boundaries:
 *   f (entering a column-parallel region): forward identity,   backward all-reduce of the input gradient
 *   g (leaving a row-parallel region):     forward all-reduce, backward identity
 * so a block does exactly one all-reduce per attention and one per MLP, forward and backward. With
 * sequence parallelism the activations outside those regions (LayerNorm, residual, between modules) are
 * split along the B*T rows: f becomes all-gather (backward reduce-scatter) and g reduce-scatter (backward
 * all-gather), moving the same bytes. The token embedding is vocabulary-parallel (each rank a slice of
 * the padded vocabulary; out-of-slice tokens contribute zero; g), the tied output projection computes
 * only the local vocabulary columns and the cross-entropy reduces per-row max, sum of exponentials and
 * target logit over tp: logits are never gathered.
 * Shapes: N = B*T rows, R = rows held outside the regions (N, or N/tp with sequence parallelism), C
 * channels, Cl = C/tp, NHl = NH/tp local heads, Hl = 4C/tp local MLP width, Vl = Vp/tp local vocabulary
 * rows of which the first Vr = clamp(V - v0, 0, Vl) are real (v0 = first global row of this rank).
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/gpt2/gpt2_impl.h"
#include "models/layers/layers.h"
#include "runtime/alloc.h"

typedef struct {
    const mt_tp_ops_t *ops;
    int tp, rank;
    bool sp;
    int Cl, NHl, Hl, Vl, v0, Vr;
    mt_status_t err; /* first failed collective since the driver last asked */
    float *ws;       /* workspace, see ensure_workspace */
    float *attn_scratch;
    size_t rows; /* N the workspace fits */
    int T;
    bool ws_head; /* the workspace holds a chunk of the logits (head_chunks > 1, a range with the head) */
} tp_impl_t;

static size_t rows_local(const tp_impl_t *g, size_t N) {
    return g->sp ? N / (size_t)g->tp : N;
}

/* This rank's geometry for B x T (gpt2_impl.h). */
static void geom(mt_model_t m, int B, int T, mt_gpt2_geom_t *geo) {
    const tp_impl_t *g = m->impl;
    mt_gpt2_geom(&m->cfg, g->tp, g->sp, B, T, geo);
}

static size_t tp_module_floats(mt_model_t m, int module, int B, int T) {
    mt_gpt2_geom_t geo;
    geom(m, B, T, &geo);
    if (module == 0) {
        return geo.R * m->cfg.n_embd;
    }
    if (module == m->n_modules - 1) {
        return mt_gpt2_carve_head(NULL, &geo, NULL);
    }
    return mt_gpt2_carve_block(NULL, &geo, true, NULL);
}

static float *tp_module_out(mt_model_t m, mt_acts_t a, int module) {
    if (module == m->n_modules - 1) {
        return NULL;
    }
    if (module == 0) {
        return a->mod_buf[0];
    }
    mt_gpt2_blk_t b;
    mt_gpt2_geom_t geo;
    geom(m, a->B, a->T, &geo);
    mt_gpt2_carve_block(a->mod_buf[module], &geo, true, &b);
    return b.out;
}

static size_t tp_act_rows(mt_model_t m, int B, int T) {
    return rows_local(m->impl, (size_t)B * T);
}

/* Workspace of N full rows: P (N,C) partial sums, D1 (N,C), D2 (N,C), G1 (N,Hl), G2 (N,Hl), E1 (R,C),
 * E2 (R,C), 3N floats of per-row statistics for the cross-entropy, and with head_chunks > 1 for a range with the
 * head one chunk of the local logits (N/k rounded up, Vl). */
static size_t ws_stats(const mt_model_config_t *c, const tp_impl_t *g, size_t N) {
    size_t C = (size_t)c->n_embd;
    return 3 * N * C + 2 * N * (size_t)g->Hl + 2 * rows_local(g, N) * C;
}
static size_t ws_floats(const mt_model_config_t *c, const tp_impl_t *g, size_t N, bool head) {
    size_t chunk = head && c->head_chunks > 1 ? mt_model_head_chunk_rows(N, c->head_chunks) * (size_t)g->Vl : 0;
    return ws_stats(c, g, N) + 3 * N + chunk;
}

/* The scratch tp_ensure_workspace allocates for B x T: the workspace and the attention scratch (pure; the
 * planner sizes activations with it through mt_model_act_mem). */
static int tp_workspace_floats(mt_model_t m, int B, int T, bool head, size_t *floats) {
    floats[0] = ws_floats(&m->cfg, m->impl, (size_t)B * T, head);
    floats[1] = mt_attention_scratch_floats(T, m->cfg.n_embd / m->cfg.n_head);
    return 2;
}

static mt_status_t tp_ensure_workspace(mt_model_t m, int B, int T, bool head) {
    tp_impl_t *g = m->impl;
    size_t N = (size_t)B * T;
    if (g->sp && N % (size_t)g->tp != 0) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "gpt2: sequence parallelism splits the B*T = %zu rows of a micro-batch over tp = %d ranks: "
                        "choose train.micro_batch x model.seq_len divisible by parallel.tp",
                        N, g->tp);
    }
    bool wh = g->ws_head || (head && m->cfg.head_chunks > 1);
    if (N > g->rows || T > g->T || wh != g->ws_head) {
        size_t rows = N > g->rows ? N : g->rows;
        int tt = T > g->T ? T : g->T;
        MT_CHECK(mt_model_realloc_scratch(&g->ws, ws_floats(&m->cfg, g, rows, wh), "gpt2 tp workspace"));
        size_t af = mt_attention_scratch_floats(tt, m->cfg.n_embd / m->cfg.n_head);
        MT_CHECK(mt_model_realloc_scratch(&g->attn_scratch, af, "attention scratch"));
        g->rows = rows;
        g->T = tt;
        g->ws_head = wh;
    }
    return MT_OK;
}

static void tp_free_impl(mt_model_t m) {
    tp_impl_t *g = m->impl;
    if (g) {
        mt_free(g->ws);
        mt_free(g->attn_scratch);
        free(g);
    }
}

static mt_status_t tp_take_error(mt_model_t m) {
    tp_impl_t *g = m->impl;
    mt_status_t st = g->err;
    g->err = MT_OK;
    return st;
}

/* The workspace's E1 region (R,C): transient local LayerNorm rows before an all-gather (forward only). */
static float *ws_rows(const mt_model_config_t *c, tp_impl_t *g, size_t N) {
    return g->ws + 3 * N * (size_t)c->n_embd + 2 * N * (size_t)g->Hl;
}

/* ---- communication through the seam (a failure is kept and reported by the driver) ---------- */

static void note(tp_impl_t *g, mt_status_t st, const char *what) {
    if (st != MT_OK && g->err == MT_OK) {
        char inner[512]; /* the callee's message: mt_error reuses its buffer */
        snprintf(inner, sizeof(inner), "%s", mt_last_error_msg());
        g->err = mt_error(st, "gpt2 tp rank %d: %s over the tp group failed: %s", g->rank, what, inner);
    }
}
static void all_reduce(tp_impl_t *g, float *buf, size_t n) {
    if (g->err == MT_OK) {
        note(g, g->ops->all_reduce_sum(g->ops->ctx, buf, n), "all-reduce");
    }
}
static void all_gather(tp_impl_t *g, const float *send, float *recv, size_t n) {
    if (g->err == MT_OK) {
        note(g, g->ops->all_gather(g->ops->ctx, send, recv, n), "all-gather");
    }
}
static void reduce_scatter(tp_impl_t *g, const float *send, float *recv, size_t n) {
    if (g->err == MT_OK) {
        note(g, g->ops->reduce_scatter_sum(g->ops->ctx, send, recv, n), "reduce-scatter");
    }
}

/* f forward: the (R,C) input of a column-parallel region as (N,C) rows: identity, or all-gather into full. */
static const float *f_forward(tp_impl_t *g, const float *local, float *full, size_t N, int C) {
    if (!g->sp) {
        return local;
    }
    all_gather(g, local, full, rows_local(g, N) * C);
    return full;
}
/* f backward: partial (N,C) input gradients of the region -> this rank's (R,C): all-reduce (in place,
 * returns part) or reduce-scatter into local. */
static float *f_backward(tp_impl_t *g, float *part, float *local, size_t N, int C) {
    if (!g->sp) {
        all_reduce(g, part, N * C);
        return part;
    }
    reduce_scatter(g, part, local, rows_local(g, N) * C);
    return local;
}
/* g forward: partial (N,C) outputs of a row-parallel region -> (R,C) out: all-reduce or reduce-scatter. */
static void g_forward(tp_impl_t *g, float *part, float *out, size_t N, int C) {
    if (!g->sp) {
        all_reduce(g, part, N * C);
        memcpy(out, part, N * C * sizeof(float));
    } else {
        reduce_scatter(g, part, out, rows_local(g, N) * C);
    }
}
/* g backward: the (R,C) output gradient as (N,C) for the region's matmul: identity or all-gather. */
static const float *g_backward(tp_impl_t *g, const float *local, float *full, size_t N, int C) {
    return f_forward(g, local, full, N, C);
}

/* out (R,C) += bias (C) per row, then += res (R,C). */
static void add_bias_residual(float *out, const float *bias, const float *res, size_t R, int C) {
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < R; r++) {
        float *o = out + r * C;
        const float *x = res + r * C;
        for (int c = 0; c < C; c++) {
            o[c] = o[c] + bias[c] + x[c];
        }
    }
}

#define PD(i) (m->params[(i)].data)
#define PG(i) (m->params[(i)].grad)

/* ---- embedding (vocabulary-parallel) --------------------------------------------------------- */

static void embedding_forward(mt_model_t m, mt_acts_t a) {
    tp_impl_t *g = m->impl;
    int T = a->T, C = m->cfg.n_embd;
    size_t N = (size_t)a->B * T, R = rows_local(g, N), row0 = g->sp ? (size_t)g->rank * R : 0;
    float *part = g->ws, *out = a->mod_buf[0];
    const float *wte = PD(0), *wpe = PD(1);
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        int v = a->tokens[n] - g->v0;
        float *p = part + n * C;
        if (v >= 0 && v < g->Vl) {
            memcpy(p, wte + (size_t)v * C, (size_t)C * sizeof(float));
        } else {
            memset(p, 0, (size_t)C * sizeof(float)); /* another rank's token */
        }
    }
    g_forward(g, part, out, N, C);
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < R; r++) {
        const float *pe = wpe + ((row0 + r) % (size_t)T) * C;
        for (int c = 0; c < C; c++) {
            out[r * C + c] += pe[c];
        }
    }
}

static void embedding_backward(mt_model_t m, mt_acts_t a, const float *dout) {
    tp_impl_t *g = m->impl;
    int T = a->T, C = m->cfg.n_embd;
    size_t N = (size_t)a->B * T, R = rows_local(g, N), row0 = g->sp ? (size_t)g->rank * R : 0;
    float *dwte = PG(0), *dwpe = PG(1);
    const float *dfull = g_backward(g, dout, g->ws, N, C);
    enum { CHUNK = 64 };
    int n_chunks = (C + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static)
    for (int k = 0; k < n_chunks; k++) {
        int c0 = k * CHUNK, c1 = c0 + CHUNK < C ? c0 + CHUNK : C;
        for (size_t n = 0; n < N; n++) {
            int v = a->tokens[n] - g->v0;
            if (v < 0 || v >= g->Vl) {
                continue;
            }
            float *w = dwte + (size_t)v * C;
            const float *d = dfull + n * C;
            for (int i = c0; i < c1; i++) {
                w[i] += d[i];
            }
        }
        for (size_t r = 0; r < R; r++) {
            float *p = dwpe + ((row0 + r) % (size_t)T) * C;
            const float *d = dout + r * C;
            for (int i = c0; i < c1; i++) {
                p[i] += d[i];
            }
        }
    }
}

/* ---- transformer block ----------------------------------------------------------------------- */

static void block_forward(mt_model_t m, mt_acts_t a, int l, const float *inp, mt_gpt2_blk_t *b) {
    tp_impl_t *g = m->impl;
    int B = a->B, T = a->T, C = m->cfg.n_embd;
    size_t N = (size_t)B * T, R = rows_local(g, N);
    int p = BLOCK0 + l * NBP;
    float *part = g->ws;
    float *ln = g->sp ? ws_rows(&m->cfg, g, N) : b->ln1;
    mt_layernorm_forward(ln, b->ln1_mean, b->ln1_rstd, inp, PD(p + LN1W), PD(p + LN1B), (int)R, C);
    const float *x1 = f_forward(g, ln, b->ln1_full, N, C);
    mt_matmul_forward(b->qkv, 3 * g->Cl, x1, PD(p + QKVW), PD(p + QKVB), (int)N, C, 3 * g->Cl);
    mt_attention_forward(b->atty, b->att, b->lse, b->qkv, B, T, g->Cl, g->NHl, g->attn_scratch);
    mt_matmul_forward(part, C, b->atty, PD(p + PROJW), NULL, (int)N, g->Cl, C);
    g_forward(g, part, b->r2, N, C);
    add_bias_residual(b->r2, PD(p + PROJB), inp, R, C);
    ln = g->sp ? ws_rows(&m->cfg, g, N) : b->ln2;
    mt_layernorm_forward(ln, b->ln2_mean, b->ln2_rstd, b->r2, PD(p + LN2W), PD(p + LN2B), (int)R, C);
    const float *x2 = f_forward(g, ln, b->ln2_full, N, C);
    mt_matmul_forward(b->fch, g->Hl, x2, PD(p + FCW), PD(p + FCB), (int)N, C, g->Hl);
    mt_gelu_forward(b->fch_gelu, b->fch, N * (size_t)g->Hl);
    mt_matmul_forward(part, C, b->fch_gelu, PD(p + FCPW), NULL, (int)N, g->Hl, C);
    g_forward(g, part, b->out, N, C);
    add_bias_residual(b->out, PD(p + FCPB), b->r2, R, C);
}

static void block_backward(mt_model_t m, mt_acts_t a, int l, const float *inp, const float *dout, float *dinp,
                           mt_gpt2_blk_t *b) {
    tp_impl_t *g = m->impl;
    int B = a->B, T = a->T, C = m->cfg.n_embd;
    size_t N = (size_t)B * T, R = rows_local(g, N), NC = N * C;
    int p = BLOCK0 + l * NBP;
    float *D1 = g->ws + NC, *D2 = D1 + NC, *G1 = D2 + NC, *G2 = G1 + N * g->Hl, *E1 = G2 + N * g->Hl, *E2 = E1 + R * C;
    float *dr2 = E1;
    const float *x1 = g->sp ? b->ln1_full : b->ln1, *x2 = g->sp ? b->ln2_full : b->ln2;
    /* MLP: out = r2 + g(gelu(fc(f(ln2(r2)))) @ Wfcp^T) + bfcp */
    memcpy(dr2, dout, R * C * sizeof(float));
    mt_bias_backward(PG(p + FCPB), dout, C, (int)R, C);
    const float *dfull = g_backward(g, dout, D1, N, C);
    memset(G1, 0, N * g->Hl * sizeof(float));
    mt_matmul_backward(G1, PG(p + FCPW), NULL, dfull, C, b->fch_gelu, PD(p + FCPW), (int)N, g->Hl, C);
    memset(G2, 0, N * g->Hl * sizeof(float));
    mt_gelu_backward(G2, b->fch, G1, N * (size_t)g->Hl);
    memset(D2, 0, NC * sizeof(float));
    mt_matmul_backward(D2, PG(p + FCW), PG(p + FCB), G2, g->Hl, x2, PD(p + FCW), (int)N, C, g->Hl);
    const float *dln2 = f_backward(g, D2, E2, N, C);
    mt_layernorm_backward(dr2, PG(p + LN2W), PG(p + LN2B), dln2, b->r2, PD(p + LN2W), b->ln2_mean, b->ln2_rstd, (int)R,
                          C);
    /* attention: r2 = inp + g(attn(qkv(f(ln1(inp)))) @ Wproj^T) + bproj */
    memcpy(dinp, dr2, R * C * sizeof(float));
    mt_bias_backward(PG(p + PROJB), dr2, C, (int)R, C);
    dfull = g_backward(g, dr2, D1, N, C);
    float *datty = G2;
    memset(datty, 0, N * g->Cl * sizeof(float));
    mt_matmul_backward(datty, PG(p + PROJW), NULL, dfull, C, b->atty, PD(p + PROJW), (int)N, g->Cl, C);
    float *dqkv = G1; /* (N,3Cl) fits in (N,Hl) */
    memset(dqkv, 0, 3 * N * g->Cl * sizeof(float));
    mt_attention_backward(dqkv, datty, b->qkv, b->att, b->lse, B, T, g->Cl, g->NHl, g->attn_scratch);
    memset(D2, 0, NC * sizeof(float));
    mt_matmul_backward(D2, PG(p + QKVW), PG(p + QKVB), dqkv, 3 * g->Cl, x1, PD(p + QKVW), (int)N, C, 3 * g->Cl);
    const float *dln1 = f_backward(g, D2, E2, N, C);
    mt_layernorm_backward(dinp, PG(p + LN1W), PG(p + LN1B), dln1, inp, PD(p + LN1W), b->ln1_mean, b->ln1_rstd, (int)R,
                          C);
}

/* ---- head: ln_f, tied vocabulary-parallel projection, vocabulary-parallel cross-entropy --------- */

static void head_carve(mt_model_t m, mt_acts_t a, mt_gpt2_head_t *h) {
    tp_impl_t *g = m->impl;
    mt_gpt2_geom_t geo;
    geom(m, a->B, a->T, &geo);
    mt_gpt2_carve_head(a->mod_buf[m->n_modules - 1], &geo, h);
    if (g->sp) {
        h->lnf = ws_rows(&m->cfg, g, geo.N); /* transient: only the gathered rows are kept */
    }
}

/* The logits of rows [j0, j0 + n) of x (N,C), this rank's Vr real vocabulary columns (stride Vl): the head's buffer
 * with head_chunks = 1 (all N rows, j0 = 0), else the workspace's chunk (forward, and again in backward). */
static float *head_logits(mt_model_t m, const mt_gpt2_head_t *h, const float *x, size_t N, size_t j0, size_t n) {
    tp_impl_t *g = m->impl;
    int C = m->cfg.n_embd;
    float *l = h->logits ? h->logits : g->ws + ws_stats(&m->cfg, g, N) + 3 * N;
    if (g->Vr > 0) {
        mt_matmul_forward(l, g->Vl, x + j0 * (size_t)C, PD(0), NULL, (int)n, C, g->Vr);
    }
    return l;
}

/* lse_n = max_n + log sum_v exp(l_nv - max_n) over the whole vocabulary, from per-rank partials: each rank's
 * rows' local maxima m_n, sums of exp(l_nv - m_n) and target logits, over all N rows or (head_chunks > 1) chunk by
 * chunk; then, once for all rows, an all-reduce MAX of the maxima and one all-reduce SUM of
 * [sum of exponentials rescaled to the global maximum | target logit]. Two collectives per micro-batch for any k. */
static void head_forward(mt_model_t m, mt_acts_t a, const float *inp) {
    tp_impl_t *g = m->impl;
    int C = m->cfg.n_embd, L = m->cfg.n_layer, k = m->cfg.head_chunks;
    size_t N = (size_t)a->B * a->T, R = rows_local(g, N);
    int p = BLOCK0 + L * NBP, Vl = g->Vl, Vr = g->Vr;
    mt_gpt2_head_t h;
    head_carve(m, a, &h);
    mt_layernorm_forward(h.lnf, h.mean, h.rstd, inp, PD(p), PD(p + 1), (int)R, C);
    const float *x = f_forward(g, h.lnf, h.lnf_full, N, C);
    float *mx = g->ws + ws_stats(&m->cfg, g, N), *sums = mx + N; /* [local max | sumexp | target logit] (N each) */
    for (int j = 0; j < k; j++) {
        size_t j0, n = mt_model_head_chunk(N, k, j, &j0);
        if (n == 0) {
            continue;
        }
        const float *lg = head_logits(m, &h, x, N, j0, n);
        const int32_t *tg = a->targets + j0;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) {
            const float *l = lg + i * Vl;
            float v = -INFINITY, s = 0.0f;
            for (int c = 0; c < Vr; c++) {
                v = l[c] > v ? l[c] : v;
            }
            for (int c = 0; c < Vr; c++) {
                s += expf(l[c] - v);
            }
            mx[j0 + i] = v;
            sums[j0 + i] = s;
            int t = tg[i] - g->v0;
            sums[N + j0 + i] = tg[i] >= 0 && t >= 0 && t < Vr ? l[t] : 0.0f;
        }
    }
    float *gmax = h.lse; /* the global maxima, until lse is written over them */
    memcpy(gmax, mx, N * sizeof(float));
    if (g->err == MT_OK) {
        note(g, g->ops->all_reduce_max(g->ops->ctx, gmax, N), "all-reduce (max)");
    }
    for (size_t i = 0; i < N && Vr > 0; i++) { /* a rank with no real column adds 0 (its local max is -inf) */
        sums[i] *= expf(mx[i] - gmax[i]);
    }
    all_reduce(g, sums, 2 * N);
    for (size_t i = 0; i < N; i++) {
        float z = gmax[i] + logf(sums[i]);
        h.lse[i] = z;
        h.losses[i] = a->targets[i] >= 0 ? z - sums[N + i] : 0.0f;
    }
    a->n_valid = mt_softmax_ce_mean(&a->loss, h.losses, a->targets, N);
}

static void head_backward(mt_model_t m, mt_acts_t a, const float *inp, float *dinp, float scale) {
    tp_impl_t *g = m->impl;
    int C = m->cfg.n_embd, L = m->cfg.n_layer, k = m->cfg.head_chunks;
    size_t N = (size_t)a->B * a->T, R = rows_local(g, N), NC = N * C;
    int p = BLOCK0 + L * NBP, Vl = g->Vl, Vr = g->Vr;
    mt_gpt2_head_t h;
    head_carve(m, a, &h);
    memset(dinp, 0, R * C * sizeof(float));
    if (a->n_valid == 0) {
        return; /* every target ignored: the loss is the constant 0 (the same on every tp rank) */
    }
    float s = scale / (float)a->n_valid;
    const float *x = g->sp ? h.lnf_full : h.lnf;
    float *D2 = g->ws + 2 * NC, *E2 = g->ws + 3 * NC + 2 * N * g->Hl + R * C;
    memset(D2, 0, NC * sizeof(float));
    for (int j = 0; j < k; j++) { /* all N rows at once, or each chunk's logits recomputed */
        size_t j0, n = mt_model_head_chunk(N, k, j, &j0);
        if (n == 0) {
            continue;
        }
        float *lg = k > 1 ? head_logits(m, &h, x, N, j0, n) : h.logits;
        /* dlogits = s (softmax - onehot(target)) on the local columns, in place */
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) {
            float *l = lg + i * Vl;
            int tg = a->targets[j0 + i];
            if (tg < 0) {
                memset(l, 0, (size_t)Vl * sizeof(float));
                continue;
            }
            for (int c = 0; c < Vr; c++) {
                l[c] = s * expf(l[c] - h.lse[j0 + i]);
            }
            int t = tg - g->v0;
            if (t >= 0 && t < Vr) {
                l[t] -= s;
            }
        }
        if (Vr > 0) {
            mt_matmul_backward(D2 + j0 * C, PG(0), NULL, lg, Vl, x + j0 * C, PD(0), (int)n, C, Vr);
        }
    }
    const float *dlnf = f_backward(g, D2, E2, N, C);
    mt_layernorm_backward(dinp, PG(p), PG(p + 1), dlnf, inp, PD(p), h.mean, h.rstd, (int)R, C);
}

/* ---- module dispatch ------------------------------------------------------------------------- */

static void tp_forward(mt_model_t m, mt_acts_t a, int module, const float *inp) {
    int L = m->cfg.n_layer;
    if (module == 0) {
        embedding_forward(m, a);
    } else if (module <= L) {
        mt_gpt2_blk_t b;
        mt_gpt2_geom_t geo;
        geom(m, a->B, a->T, &geo);
        mt_gpt2_carve_block(a->mod_buf[module], &geo, true, &b);
        block_forward(m, a, module - 1, inp, &b);
    } else {
        head_forward(m, a, inp);
    }
}

static void tp_backward(mt_model_t m, mt_acts_t a, int module, const float *inp, const float *dout, float *dinp,
                        float scale) {
    int L = m->cfg.n_layer;
    if (module == 0) {
        embedding_backward(m, a, dout);
    } else if (module <= L) {
        mt_gpt2_blk_t b;
        mt_gpt2_geom_t geo;
        geom(m, a->B, a->T, &geo);
        mt_gpt2_carve_block(a->mod_buf[module], &geo, true, &b);
        block_backward(m, a, module - 1, inp, dout, dinp, &b);
    } else {
        head_backward(m, a, inp, dinp, scale);
    }
}

static const mt_model_ops_t gpt2_tp_ops = {
    .module_floats = tp_module_floats,
    .module_out = tp_module_out,
    .ensure_workspace = tp_ensure_workspace,
    .workspace_floats = tp_workspace_floats,
    .free_impl = tp_free_impl,
    .forward = tp_forward,
    .backward = tp_backward,
    .take_error = tp_take_error,
    .act_rows = tp_act_rows,
};

mt_status_t mt_gpt2_tp_attach(mt_model_t m) {
    const mt_model_config_t *c = &m->cfg;
    int tp = c->tp_size;
    const mt_tp_ops_t *o = c->tp_ops;
    if (!o || !o->all_reduce_sum || !o->all_gather || !o->all_reduce_max ||
        (c->sequence_parallel && !o->reduce_scatter_sum)) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "gpt2: tp_size %d needs tp_ops with all_reduce_sum, all_gather, "
                        "all_reduce_max%s (parallel/tp.c supplies them)",
                        tp, c->sequence_parallel ? " and reduce_scatter_sum" : "");
    }
    if (c->n_head % tp != 0) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "gpt2: model.n_head = %d is not divisible by parallel.tp = %d: tensor "
                        "parallelism gives each rank whole heads",
                        c->n_head, tp);
    }
    if (c->padded_vocab % tp != 0) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "gpt2: model.padded_vocab = %d is not divisible by parallel.tp = %d: "
                        "each rank holds an equal slice of the vocabulary",
                        c->padded_vocab, tp);
    }
    if (c->recompute != MT_RECOMPUTE_NONE) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "gpt2: model.recompute = \"block\" is not supported with parallel.tp = "
                        "%d (recomputing would repeat the block's collectives): set "
                        "model.recompute = \"none\"",
                        tp);
    }
    /* Registered by mt_gpt2_build in the layout of gpt2_impl.h (which asserts every block's indices). */
    MT_ASSERT(m->n_params == BLOCK0 + c->n_layer * NBP + 2 && !strcmp(m->params[0].name, "wte"));
    tp_impl_t *g = calloc(1, sizeof(*g));
    if (!g) {
        return mt_error(MT_ERR_OOM, "gpt2: out of memory");
    }
    g->ops = o;
    g->tp = tp;
    g->rank = c->tp_rank;
    g->sp = c->sequence_parallel;
    g->Cl = c->n_embd / tp;
    g->NHl = c->n_head / tp;
    g->Hl = 4 * c->n_embd / tp;
    g->Vl = c->padded_vocab / tp;
    g->v0 = g->rank * g->Vl;
    int vr = c->vocab_size - g->v0;
    g->Vr = vr < 0 ? 0 : vr > g->Vl ? g->Vl : vr;
    if (m->ops && m->ops->free_impl) {
        m->ops->free_impl(m);
    }
    m->impl = g;
    m->ops = &gpt2_tp_ops;
    return MT_OK;
}
