/* GPT-2 as published (Radford et al. 2019; the layout of llm.c): token + learned position embedding,
 * n_layer pre-LayerNorm blocks (LN -> causal MHA -> residual, LN -> MLP 4C with GELU(tanh) -> residual),
 * final LayerNorm, output projection tied to the token embedding, LN eps 1e-5, no dropout.
 * Modules: 0 = embedding, 1..L = blocks, L+1 = head (ln_f + tied projection + softmax/cross-entropy).
 * Shape legend: B batch, T time, C channels, NH heads, hs = C/NH, N = B*T, V vocab, Vp padded vocab.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/gpt2/gpt2_impl.h"
#include "models/layers/layers.h"
#include "runtime/alloc.h"

typedef struct {
    float *recomp;   /* recompute = block: one block's internal activations */
    float *gscratch; /* backward scratch: dr2 (N,C), dA (N,C), dfg (N,4C), dfc (N,4C) */
    float *attn_scratch;
    size_t rows; /* N the workspace fits */
    int T;       /* T the attention scratch fits */
    size_t attn_floats; /* attention scratch size (per-thread rows: grows with the OpenMP thread count) */
    float *logits;      /* head_chunks > 1, a range with the head: one chunk's logits (rows/k rounded up, Vp) */
    size_t logit_rows;  /* N the chunk fits */
} gpt2_impl_t;

/* The plain model's geometry: tp = 1, whole rows, heads and vocabulary (gpt2_impl.h). */
static void geom(const mt_model_config_t *c, int B, int T, mt_gpt2_geom_t *g) {
    mt_gpt2_geom(c, 1, false, B, T, g);
}

/* The block's activations: its own buffer, or (recompute = block) the shared scratch plus its own output. */
static void block_acts(mt_model_t m, mt_acts_t a, int module, mt_gpt2_blk_t *b) {
    gpt2_impl_t *g = m->impl;
    mt_gpt2_geom_t geo;
    geom(&m->cfg, a->B, a->T, &geo);
    if (m->cfg.recompute == MT_RECOMPUTE_BLOCK) {
        mt_gpt2_carve_block(g->recomp, &geo, false, b);
        b->out = a->mod_buf[module];
    } else {
        mt_gpt2_carve_block(a->mod_buf[module], &geo, true, b);
    }
}

static size_t gpt2_module_floats(mt_model_t m, int module, int B, int T) {
    const mt_model_config_t *c = &m->cfg;
    size_t N = (size_t)B * T;
    mt_gpt2_geom_t geo;
    geom(c, B, T, &geo);
    if (module == 0) {
        return N * c->n_embd;
    }
    if (module == m->n_modules - 1) {
        return mt_gpt2_carve_head(NULL, &geo, NULL);
    }
    if (c->recompute == MT_RECOMPUTE_BLOCK) {
        return N * c->n_embd;
    }
    return mt_gpt2_carve_block(NULL, &geo, true, NULL);
}

static float *gpt2_module_out(mt_model_t m, mt_acts_t a, int module) {
    if (module == m->n_modules - 1) {
        return NULL;
    }
    if (module == 0 || m->cfg.recompute == MT_RECOMPUTE_BLOCK) {
        return a->mod_buf[module];
    }
    mt_gpt2_blk_t b;
    mt_gpt2_geom_t geo;
    geom(&m->cfg, a->B, a->T, &geo);
    mt_gpt2_carve_block(a->mod_buf[module], &geo, true, &b);
    return b.out;
}

/* head_chunks > 1: the floats of one chunk of the logits of `rows` rows */
static size_t chunk_floats(const mt_model_config_t *c, size_t rows) {
    return mt_model_head_chunk_rows(rows, c->head_chunks) * (size_t)c->padded_vocab;
}

/* The workspace for up to `rows` rows (B*T) and sequences of up to tt: [0] gradient scratch, [1]
 * attention scratch, then (recompute = block) one block's activations, then (head_chunks > 1, a range with the
 * head) one chunk of the head's logits. Blocks are carved per (B, T) and never exceed it because B*T <= rows
 * and every term grows with B*T or B*T*T <= rows*tt. */
static int gpt2_workspace(const mt_model_config_t *c, size_t rows, int tt, bool head, size_t *floats) {
    int n = 0;
    floats[n++] = 10 * rows * c->n_embd;             /* dr2 (N,C), dA (N,C), dfg (N,4C), dfc (N,4C) */
    /* per thread: grows with the OpenMP thread count */
    floats[n++] = mt_attention_scratch_floats(tt, c->n_embd / c->n_head);
    if (c->recompute == MT_RECOMPUTE_BLOCK) {
        mt_gpt2_geom_t geo;
        geom(c, (int)rows, 1, &geo);
        size_t need = mt_gpt2_carve_block(NULL, &geo, false, NULL);
        if (!c->attn_recompute) {
            need += rows * (size_t)c->n_head * tt; /* B*NH*T*T <= rows*NH*tt */
        }
        floats[n++] = need;
    }
    if (head && c->head_chunks > 1) {
        floats[n++] = chunk_floats(c, rows);
    }
    return n;
}

static int gpt2_workspace_floats(mt_model_t m, int B, int T, bool head, size_t *floats) {
    return gpt2_workspace(&m->cfg, (size_t)B * T, T, head, floats);
}

static mt_status_t gpt2_ensure_workspace(mt_model_t m, int B, int T, bool head) {
    gpt2_impl_t *g = m->impl;
    size_t N = (size_t)B * T;
    if (N > g->rows || T > g->T) {
        size_t rows = N > g->rows ? N : g->rows;
        int tt = T > g->T ? T : g->T;
        size_t fl[MT_MODEL_MAX_WORKSPACE];
        if (gpt2_workspace(&m->cfg, rows, tt, false, fl) > 2) {
            MT_CHECK(mt_model_realloc_scratch(&g->recomp, fl[2], "gpt2 recompute scratch"));
        }
        MT_CHECK(mt_model_realloc_scratch(&g->gscratch, fl[0], "gpt2 backward scratch"));
        g->rows = rows;
        g->T = tt;
    }
    if (head && m->cfg.head_chunks > 1 && N > g->logit_rows) { /* the stages before the last never hold one */
        MT_CHECK(mt_model_realloc_scratch(&g->logits, chunk_floats(&m->cfg, N), "gpt2 logits chunk"));
        g->logit_rows = N;
    }
    /* re-checked: the thread count may have grown since */
    size_t af = mt_attention_scratch_floats(g->T, m->cfg.n_embd / m->cfg.n_head);
    if (af > g->attn_floats) {
        MT_CHECK(mt_model_realloc_scratch(&g->attn_scratch, af, "attention scratch"));
        g->attn_floats = af;
    }
    return MT_OK;
}

static void gpt2_free_impl(mt_model_t m) {
    gpt2_impl_t *g = m->impl;
    if (g) {
        mt_free(g->recomp);
        mt_free(g->gscratch);
        mt_free(g->attn_scratch);
        mt_free(g->logits);
        free(g);
    }
}

#define PD(i) (m->params[(i)].data)
#define PG(i) (m->params[(i)].grad)

/* inp (N,C) -> b (all fields; out only when need_out). */
static void block_forward(mt_model_t m, mt_acts_t a, int l, const float *inp, mt_gpt2_blk_t *b, bool need_out) {
    const mt_model_config_t *c = &m->cfg;
    int B = a->B, T = a->T, N = B * T, C = c->n_embd;
    int p = BLOCK0 + l * NBP;
    gpt2_impl_t *g = m->impl;
    mt_layernorm_forward(b->ln1, b->ln1_mean, b->ln1_rstd, inp, PD(p + LN1W), PD(p + LN1B), N, C);
    mt_matmul_forward(b->qkv, 3 * C, b->ln1, PD(p + QKVW), PD(p + QKVB), N, C, 3 * C);
    mt_attention_forward(b->atty, b->att, b->lse, b->qkv, B, T, C, c->n_head, g->attn_scratch);
    mt_matmul_forward(b->r2, C, b->atty, PD(p + PROJW), PD(p + PROJB), N, C, C);
    mt_residual_forward(b->r2, b->r2, inp, (size_t)N * C);
    mt_layernorm_forward(b->ln2, b->ln2_mean, b->ln2_rstd, b->r2, PD(p + LN2W), PD(p + LN2B), N, C);
    mt_matmul_forward(b->fch, 4 * C, b->ln2, PD(p + FCW), PD(p + FCB), N, C, 4 * C);
    mt_gelu_forward(b->fch_gelu, b->fch, (size_t)N * 4 * C);
    if (need_out) {
        mt_matmul_forward(b->out, C, b->fch_gelu, PD(p + FCPW), PD(p + FCPB), N, 4 * C, C);
        mt_residual_forward(b->out, b->out, b->r2, (size_t)N * C);
    }
}

/* head_chunks > 1: rows [j0, j0 + n) of the logits (n, Vp) into the workspace's chunk, from the same rows of lnf (N,C)
 * (forward, and again in backward: the same product of the same rows). */
static float *head_chunk_logits(mt_model_t m, const float *lnf, size_t j0, size_t n) {
    const mt_model_config_t *c = &m->cfg;
    float *logits = ((gpt2_impl_t *)m->impl)->logits;
    mt_matmul_forward(logits, c->padded_vocab, lnf + j0 * (size_t)c->n_embd, PD(0), NULL, (int)n, c->n_embd,
                      c->vocab_size);
    return logits;
}

static void gpt2_forward(mt_model_t m, mt_acts_t a, int module, const float *inp) {
    const mt_model_config_t *c = &m->cfg;
    int B = a->B, T = a->T, N = B * T, C = c->n_embd, L = c->n_layer;
    if (module == 0) {
        mt_embedding_forward(a->mod_buf[0], a->tokens, PD(0), PD(1), B, T, C);
    } else if (module <= L) {
        mt_gpt2_blk_t b;
        block_acts(m, a, module, &b);
        block_forward(m, a, module - 1, inp, &b, true);
    } else {
        int p = BLOCK0 + L * NBP, Vp = c->padded_vocab;
        mt_gpt2_geom_t geo;
        mt_gpt2_head_t h;
        geom(c, B, T, &geo);
        mt_gpt2_carve_head(a->mod_buf[module], &geo, &h);
        mt_layernorm_forward(h.lnf, h.mean, h.rstd, inp, PD(p), PD(p + 1), N, C);
        if (c->head_chunks == 1) {
            /* logits (N, Vp): only the V real vocabulary columns are computed; padded rows of wte are never used */
            mt_matmul_forward(h.logits, Vp, h.lnf, PD(0), NULL, N, C, c->vocab_size);
            a->n_valid = mt_softmax_ce_forward(h.losses, h.lse, &a->loss, h.logits, a->targets, N, c->vocab_size, Vp);
            return;
        }
        /* in chunks of rows: each row's loss and lse kept, its logits not */
        for (int j = 0; j < c->head_chunks; j++) {
            size_t j0, n = mt_model_head_chunk((size_t)N, c->head_chunks, j, &j0);
            float chunk_mean;
            if (n > 0) {
                float *logits = head_chunk_logits(m, h.lnf, j0, n);
                mt_softmax_ce_forward(h.losses + j0, h.lse + j0, &chunk_mean, logits, a->targets + j0, (int)n,
                                      c->vocab_size, Vp);
            }
        }
        a->n_valid = mt_softmax_ce_mean(&a->loss, h.losses, a->targets, (size_t)N);
    }
}

static void gpt2_backward(mt_model_t m, mt_acts_t a, int module, const float *inp, const float *dout, float *dinp,
                          float scale) {
    const mt_model_config_t *c = &m->cfg;
    gpt2_impl_t *g = m->impl;
    int B = a->B, T = a->T, N = B * T, C = c->n_embd, L = c->n_layer;
    size_t NC = (size_t)N * C;
    float *dr2 = g->gscratch, *dA = dr2 + NC, *dfg = dA + NC, *dfc = dfg + 4 * NC;
    if (module == 0) {
        mt_embedding_backward(PG(0), PG(1), dout, a->tokens, B, T, C);
        return;
    }
    if (module == L + 1) {
        int p = BLOCK0 + L * NBP, Vp = c->padded_vocab, V = c->vocab_size;
        mt_gpt2_geom_t geo;
        mt_gpt2_head_t h;
        geom(c, B, T, &geo);
        mt_gpt2_carve_head(a->mod_buf[module], &geo, &h);
        memset(dinp, 0, NC * sizeof(float));
        if (a->n_valid == 0) {
            return; /* every target ignored: the loss is the constant 0 */
        }
        /* dlogits = scale/n_valid (softmax - onehot), in place over the logits (with head_chunks, over each chunk's
         * recomputed logits); dlnf = dlogits @ wte, dwte += dlogits^T lnf */
        float s = scale / (float)a->n_valid;
        memset(dA, 0, NC * sizeof(float));
        if (c->head_chunks == 1) {
            mt_softmax_ce_backward(h.logits, h.logits, h.lse, a->targets, N, V, Vp, s);
            mt_matmul_backward(dA, PG(0), NULL, h.logits, Vp, h.lnf, PD(0), N, C, V);
        }
        for (int j = 0; c->head_chunks > 1 && j < c->head_chunks; j++) {
            size_t j0, n = mt_model_head_chunk((size_t)N, c->head_chunks, j, &j0);
            if (n > 0) {
                float *dlogits = head_chunk_logits(m, h.lnf, j0, n);
                mt_softmax_ce_backward(dlogits, dlogits, h.lse + j0, a->targets + j0, (int)n, V, Vp, s);
                mt_matmul_backward(dA + j0 * C, PG(0), NULL, dlogits, Vp, h.lnf + j0 * C, PD(0), (int)n, C, V);
            }
        }
        mt_layernorm_backward(dinp, PG(p), PG(p + 1), dA, inp, PD(p), h.mean, h.rstd, N, C);
        return;
    }
    int l = module - 1, p = BLOCK0 + l * NBP;
    mt_gpt2_blk_t b;
    block_acts(m, a, module, &b);
    if (c->recompute == MT_RECOMPUTE_BLOCK) {
        block_forward(m, a, l, inp, &b, false); /* same inputs, same kernels: bit-identical activations */
    }
    /* MLP branch: out = r2 + fcproj(gelu(fc(ln2(r2)))) */
    memcpy(dr2, dout, NC * sizeof(float));
    memset(dfg, 0, 4 * NC * sizeof(float));
    mt_matmul_backward(dfg, PG(p + FCPW), PG(p + FCPB), dout, C, b.fch_gelu, PD(p + FCPW), N, 4 * C, C);
    memset(dfc, 0, 4 * NC * sizeof(float));
    mt_gelu_backward(dfc, b.fch, dfg, 4 * NC);
    memset(dA, 0, NC * sizeof(float));
    mt_matmul_backward(dA, PG(p + FCW), PG(p + FCB), dfc, 4 * C, b.ln2, PD(p + FCW), N, C, 4 * C);
    mt_layernorm_backward(dr2, PG(p + LN2W), PG(p + LN2B), dA, b.r2, PD(p + LN2W), b.ln2_mean, b.ln2_rstd, N, C);
    /* attention branch: r2 = inp + proj(attn(qkv(ln1(inp)))) */
    memcpy(dinp, dr2, NC * sizeof(float));
    memset(dA, 0, NC * sizeof(float));
    mt_matmul_backward(dA, PG(p + PROJW), PG(p + PROJB), dr2, C, b.atty, PD(p + PROJW), N, C, C);
    float *dqkv = dfg; /* (N,3C) fits in the (N,4C) buffer, free again */
    memset(dqkv, 0, 3 * NC * sizeof(float));
    mt_attention_backward(dqkv, dA, b.qkv, b.att, b.lse, B, T, C, c->n_head, g->attn_scratch);
    memset(dA, 0, NC * sizeof(float));
    mt_matmul_backward(dA, PG(p + QKVW), PG(p + QKVB), dqkv, 3 * C, b.ln1, PD(p + QKVW), N, C, 3 * C);
    mt_layernorm_backward(dinp, PG(p + LN1W), PG(p + LN1B), dA, inp, PD(p + LN1W), b.ln1_mean, b.ln1_rstd, N, C);
}

static const mt_model_ops_t gpt2_ops = {
    .module_floats = gpt2_module_floats,
    .module_out = gpt2_module_out,
    .ensure_workspace = gpt2_ensure_workspace,
    .workspace_floats = gpt2_workspace_floats,
    .free_impl = gpt2_free_impl,
    .forward = gpt2_forward,
    .backward = gpt2_backward,
};

mt_status_t mt_gpt2_build(mt_model_t m) {
    mt_model_config_t *c = &m->cfg;
    if (c->n_head < 1 || c->n_embd % c->n_head != 0) {
        return mt_error(MT_ERR_INVALID_ARG, "gpt2: n_embd (%d) must be a multiple of n_head (%d)", c->n_embd,
                        c->n_head);
    }
    if (c->padded_vocab < c->vocab_size) {
        return mt_error(MT_ERR_INVALID_ARG, "gpt2: padded_vocab (%d) is smaller than vocab_size (%d)", c->padded_vocab,
                        c->vocab_size);
    }
    if (c->tp_size > 1 && c->n_head % c->tp_size != 0) {
        return mt_error(MT_ERR_INVALID_ARG, "gpt2: n_head (%d) must be a multiple of tp_size (%d)", c->n_head,
                        c->tp_size);
    }
    gpt2_impl_t *g = calloc(1, sizeof(*g));
    if (!g) {
        return mt_error(MT_ERR_OOM, "gpt2: out of memory");
    }
    m->impl = g;
    m->ops = &gpt2_ops;
    m->width = c->n_embd;
    int64_t C = c->n_embd, L = c->n_layer;
    float std = 0.02f, res_std = (float)(0.02 / sqrt(2.0 * (double)L));
    char name[MT_PARAM_NAME_MAX];
    MT_CHECK(mt_model_add_module(m, "embedding"));
    /* vocabulary-parallel with tp: each rank holds padded_vocab / tp rows (gpt2_tp.c) */
    MT_CHECK(mt_model_add_param(m, "wte", 2, c->padded_vocab, C, std, 0, 0, 1));
    m->init_rows[0] = c->vocab_size; /* padded rows start (and, never used, stay) at zero */
    m->params[0].tied_module = (int)L + 1;
    MT_CHECK(mt_model_add_param(m, "wpe", 2, c->seq_len, C, std, 0, -1, 1));
    for (int l = 0; l < L; l++) {
        snprintf(name, sizeof(name), "block.%d", l);
        MT_CHECK(mt_model_add_module(m, name));
/* Block parameter k, registered at its index in the shared layout (gpt2_impl.h) under its shared name. */
#define P(k, nd, d0, d1, sd, cst, tpd, parts)                                                                          \
    do {                                                                                                               \
        MT_ASSERT(m->n_params == BLOCK0 + l * NBP + (k));                                                              \
        snprintf(name, sizeof(name), "h.%d.%s", l, mt_gpt2_block_suffix[k]);                                           \
        MT_CHECK(mt_model_add_param(m, name, nd, d0, d1, sd, cst, tpd, parts));                                        \
    } while (0)
        P(LN1W, 1, C, 1, 0, 1, -1, 1);
        P(LN1B, 1, C, 1, 0, 0, -1, 1);
        P(QKVW, 2, 3 * C, C, std, 0, 0, 3); /* column-parallel, Q|K|V each split by heads */
        P(QKVB, 1, 3 * C, 1, 0, 0, 0, 3);
        P(PROJW, 2, C, C, res_std, 0, 1, 1); /* row-parallel */
        P(PROJB, 1, C, 1, 0, 0, -1, 1);
        P(LN2W, 1, C, 1, 0, 1, -1, 1);
        P(LN2B, 1, C, 1, 0, 0, -1, 1);
        P(FCW, 2, 4 * C, C, std, 0, 0, 1);
        P(FCB, 1, 4 * C, 1, 0, 0, 0, 1);
        P(FCPW, 2, C, 4 * C, res_std, 0, 1, 1);
        P(FCPB, 1, C, 1, 0, 0, -1, 1);
#undef P
    }
    MT_CHECK(mt_model_add_module(m, "head"));
    MT_CHECK(mt_model_add_param(m, "ln_f.weight", 1, C, 1, 0, 1, -1, 1));
    MT_CHECK(mt_model_add_param(m, "ln_f.bias", 1, C, 1, 0, 0, -1, 1));
    if (c->tp_size > 1) {
        MT_CHECK(mt_gpt2_tp_attach(m)); /* sharded forward/backward */
    }
    return MT_OK;
}
