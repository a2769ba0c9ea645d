/* The GPT-2 layout both the plain and the tensor-parallel model use (gpt2_impl.h): block parameter names,
 * a rank's share of a micro-batch, and where the saved activations of a block and of the head lie.
 * SPDX-License-Identifier: MIT */
#include "models/gpt2/gpt2_impl.h"

const char *const mt_gpt2_block_suffix[NBP] = {
    [LN1W] = "ln_1.weight",       [LN1B] = "ln_1.bias",      [QKVW] = "attn.qkv.weight", [QKVB] = "attn.qkv.bias",
    [PROJW] = "attn.proj.weight", [PROJB] = "attn.proj.bias", [LN2W] = "ln_2.weight",    [LN2B] = "ln_2.bias",
    [FCW] = "mlp.fc.weight",      [FCB] = "mlp.fc.bias",      [FCPW] = "mlp.proj.weight", [FCPB] = "mlp.proj.bias",
};

/* s->field = the next n floats of base (NULL when only counting); off counts them. */
#define TAKE(s, field, n)                                                                                              \
    do {                                                                                                               \
        (s)->field = base ? base + off : NULL;                                                                         \
        off += (n);                                                                                                    \
    } while (0)

/* A LayerNorm output: with sequence parallelism only the gathered (N,C) rows are kept, into *full (for the
 * weight gradients, so backward repeats no all-gather), the R local rows being transient in the caller's
 * workspace (*local = NULL); otherwise (R,C) into *local (*full = NULL). */
static void take_ln(float *base, size_t *off, const mt_gpt2_geom_t *g, float **local, float **full) {
    float *p = base ? base + *off : NULL;
    *local = g->sp ? NULL : p;
    *full = g->sp ? p : NULL;
    *off += (g->sp ? g->N : g->R) * (size_t)g->C;
}

void mt_gpt2_geom(const mt_model_config_t *c, int tp, bool sp, int B, int T, mt_gpt2_geom_t *g) {
    g->B = B;
    g->T = T;
    g->N = (size_t)B * T;
    g->R = sp ? g->N / (size_t)tp : g->N;
    g->C = c->n_embd;
    g->Cl = c->n_embd / tp;
    g->NHl = c->n_head / tp;
    g->Hl = 4 * c->n_embd / tp;
    g->Vl = c->padded_vocab / tp;
    g->sp = sp;
    g->attn_recompute = c->attn_recompute;
    g->head_chunks = c->head_chunks;
}

size_t mt_gpt2_carve_block(float *base, const mt_gpt2_geom_t *g, bool with_out, mt_gpt2_blk_t *b) {
    size_t N = g->N, R = g->R, C = (size_t)g->C, off = 0;
    mt_gpt2_blk_t tmp;
    if (!b) {
        b = &tmp;
    }
    take_ln(base, &off, g, &b->ln1, &b->ln1_full);
    TAKE(b, ln1_mean, R);
    TAKE(b, ln1_rstd, R);
    TAKE(b, qkv, 3 * N * (size_t)g->Cl);
    TAKE(b, atty, N * (size_t)g->Cl);
    if (g->attn_recompute) {
        TAKE(b, lse, (size_t)g->B * g->NHl * g->T);
        b->att = NULL;
    } else {
        TAKE(b, att, (size_t)g->B * g->NHl * g->T * g->T);
        b->lse = NULL;
    }
    TAKE(b, r2, R * C);
    take_ln(base, &off, g, &b->ln2, &b->ln2_full);
    TAKE(b, ln2_mean, R);
    TAKE(b, ln2_rstd, R);
    TAKE(b, fch, N * (size_t)g->Hl);
    TAKE(b, fch_gelu, N * (size_t)g->Hl);
    if (with_out) {
        TAKE(b, out, R * C);
    } else {
        b->out = NULL;
    }
    return off;
}

size_t mt_gpt2_carve_head(float *base, const mt_gpt2_geom_t *g, mt_gpt2_head_t *h) {
    size_t N = g->N, R = g->R, off = 0;
    mt_gpt2_head_t tmp;
    if (!h) {
        h = &tmp;
    }
    take_ln(base, &off, g, &h->lnf, &h->lnf_full);
    TAKE(h, mean, R);
    TAKE(h, rstd, R);
    TAKE(h, logits, g->head_chunks > 1 ? 0 : N * (size_t)g->Vl);
    if (g->head_chunks > 1) {
        h->logits = NULL;
    }
    TAKE(h, losses, N);
    TAKE(h, lse, N);
    return off;
}

#undef TAKE
