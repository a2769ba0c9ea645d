/* What the plain GPT-2 (gpt2.c) and the tensor-parallel one (gpt2_tp.c) share: the parameter layout of a
 * block, the shape of one rank's share of a micro-batch, and where each saved activation of a block and of
 * the head lies in its module buffer. The plain model is the tp = 1 case of the same layout; the math of
 * the two stays apart (the plain model fuses biases into its matmuls, the sharded one cannot).
 * SPDX-License-Identifier: MIT */
#ifndef MT_GPT2_IMPL_H
#define MT_GPT2_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "models/model_impl.h"

/* Parameters of a block, in registration order (also llm.c's per-layer order). Block l's start at
 * BLOCK0 + l * NBP (wte, wpe come first); the head's ln_f weight and bias follow the last block. */
enum { LN1W, LN1B, QKVW, QKVB, PROJW, PROJB, LN2W, LN2B, FCW, FCB, FCPW, FCPB, NBP };
#define BLOCK0 2

/* The name of block parameter k after "h.<l>." ("ln_1.weight", ..., "mlp.proj.bias"). */
extern const char *const mt_gpt2_block_suffix[NBP];

/* One rank's share of a B x T micro-batch. tp = 1 without sequence parallelism is the plain model. */
typedef struct {
    int B, T;
    size_t N;            /* B*T rows */
    size_t R;            /* rows held outside the tp regions: N, or N/tp with sequence parallelism */
    int C;               /* channels */
    int Cl, NHl, Hl, Vl; /* this rank's C/tp channels, NH/tp heads, 4C/tp MLP width, Vp/tp vocabulary rows */
    bool sp;             /* sequence parallelism: LayerNorm outputs kept gathered (N,C), their R rows transient */
    bool attn_recompute; /* attention keeps lse (B,NHl,T) instead of the probabilities (B,NHl,T,T) */
    int head_chunks;     /* model.head_chunks: > 1, the head's logits live in the model's workspace, a chunk at a time */
} mt_gpt2_geom_t;

/* The geometry of config c sharded over tp ranks (sp: with sequence parallelism; the caller has checked
 * that tp divides n_head, padded_vocab and, with sp, B*T). */
void mt_gpt2_geom(const mt_model_config_t *c, int tp, bool sp, int B, int T, mt_gpt2_geom_t *g);

/* Saved activations of one block on this rank, in buffer order. */
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd; /* (R,C) (R) (R); ln1 NULL with sp */
    float *ln1_full;                  /* (N,C) gathered, with sp only (else NULL) */
    float *qkv;                       /* (N,3Cl) local Q|K|V */
    float *atty;                      /* (N,Cl) attention output before the projection */
    float *att;                       /* (B,NHl,T,T) probabilities, or NULL with attn_recompute */
    float *lse;                       /* (B,NHl,T) per-row log-sum-exp with attn_recompute, else NULL */
    float *r2;                        /* (R,C) residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd; /* as ln1 */
    float *ln2_full;                  /* as ln1_full */
    float *fch, *fch_gelu;            /* (N,Hl) */
    float *out;                       /* (R,C) block output = next module's input; NULL unless with_out */
} mt_gpt2_blk_t;

/* Points b's fields into base (NULL base or NULL b: only counts); the output only with with_out.
 * Returns the floats used. */
size_t mt_gpt2_carve_block(float *base, const mt_gpt2_geom_t *g, bool with_out, mt_gpt2_blk_t *b);

/* The head's buffer on this rank, in buffer order. */
typedef struct {
    float *lnf;          /* (R,C) ln_f output; NULL with sp (its rows are transient: the caller's scratch) */
    float *lnf_full;     /* (N,C) gathered, with sp only (else NULL) */
    float *mean, *rstd;  /* (R) (R) */
    float *logits;       /* (N,Vl); NULL with head_chunks > 1 (a chunk's rows are in the workspace) */
    float *losses, *lse; /* (N) (N) */
} mt_gpt2_head_t;

/* Points h's fields into base (NULL base or NULL h: only counts). Returns the floats used. */
size_t mt_gpt2_carve_head(float *base, const mt_gpt2_geom_t *g, mt_gpt2_head_t *h);

#endif /* MT_GPT2_IMPL_H */
