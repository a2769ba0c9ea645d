/* Private parts of the device GPT-2 trainer shared by models/cuda/gpt2_cuda.c (set-up), gpt2_cuda_pass.c (forward
 * and backward), gpt2_cuda_tp.c (the tensor-parallel region boundaries) and gpt2_cuda_step.c (the optimizer step,
 * gradient statistics, profiling, the state engines and checkpoints read and set): the trainer's struct, the flat
 * layout's parameter indices and the launch macros.
 * SPDX-License-Identifier: MIT */
#ifndef MT_GPT2_CUDA_IMPL_H
#define MT_GPT2_CUDA_IMPL_H

#include <cuda_runtime_api.h>

#include "models/cuda/cuda_backend.h"
#include "models/cuda/gpt2_cuda.h"

/* A GPT-2 block's parameters, from its first (g->b0 + l * g->nbp for block l) */
enum { LN1W, LN1B, QKVW, QKVB, PROJW, PROJB, LN2W, LN2B, FCW, FCB, FCPW, FCPB, GPT2_NBP };
/* The MLP's hidden layer's (models/mlp/mlp.c) and its head's, from the first after the layers (g->pf) */
enum { MLP_W, MLP_B, MLP_NBP };
#define MAX_BUFS 64
#define PROF_MARKS 1024

typedef struct {
    void *ln1, *qkv, *atty, *r2, *ln2, *fch, *fch_gelu; /* (N,C) (N,3Cl) (N,Cl) (R,C) (N,C) (N,Hl) (N,Hl) */
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;   /* (R) */
    float *lse;                                         /* (B,NHl,T) */
} layer_acts_t;

/* Everything one micro-batch's backward reads that its forward wrote: the block inputs, the internals of each
 * block (shared by the sets under recompute = block), the head's activations, the tokens and targets. */
typedef struct {
    void *resid;      /* (nb+1) x (R,C): resid[l - lo] is block l's input, the last the stage's output */
    layer_acts_t *la; /* nb blocks */
    void *lnf, *logits; /* logits (N,Vl): NULL with head_chunks > 1 (g->logits_chunk) */
    float *lnf_mean, *lnf_rstd, *losses, *lse_ce, *mean_loss;
    int *n_valid;
    int32_t *tokens_d, *targets_d;
} acts_t;

/* What a step leaves for the host, copied into pinned memory in the stream's order, so the one synchronisation
 * that follows is the step's only wait (no synchronous copy after it). */
struct gpt2_cuda_readback {
    double sumsq;  /* the gradient's sum of squares (unsharded, or tp rank 0's) */
    float loss;    /* the micro-batch's mean loss */
    float norm;    /* the gradient's global norm (mt_cuda_clip_coef's) */
    int found_inf; /* fp16: inf/NaN in the gradients */
    int pad;
    double shd[]; /* tp rank > 0: the sharded runs' sums of squares (n_shd) */
};

struct mt_gpt2_cuda {
    mt_model_t m;
    mt_gpt2_cuda_params_t p;
    int L, C, NH, V, Vp, B, T, N, dt;
    bool mlp;        /* model.kind = "mlp" (models/mlp/mlp.c): L hidden layers as the blocks, no tp */
    bool tied;       /* gpt2: the head reads wte (parameter 0), so wte is on the first and the last stage */
    int b0, nbp, pf; /* the layout: parameters before the first block (gpt2: wte, wpe; mlp: wte), per block, and the
                      * first after the blocks (gpt2: ln_f; mlp: the head's weight, then its bias) */
    int tp, tpr;                 /* tensor parallelism: the group's size and this rank (1, 0: none) */
    int Cl, NHl, Hl, Vl, v0, Vr; /* this rank's channels, heads, MLP columns, vocabulary rows (and real ones) */
    bool sp;                     /* sequence parallelism (tp > 1): R = N / tp rows outside the sharded regions */
    cudaStream_t tp_stream;      /* tp: backward's input-gradient reductions, overlapping the weight gradients */
    cudaEvent_t tp_in, tp_out;   /* tp: the reduction's input is complete (compute stream); its result is there */
    bool tp_pending;             /* tp: a reduction on tp_stream the compute stream has yet to wait for */
    int R;                       /* rows of the residual stream this rank holds: N, or N / tp */
    void *tmp_r, *lnloc;         /* sp: (R,C) a reduce-scatter's result, a LayerNorm's rows before their gather */
    float *lng; /* sp: (2 x 2C) a block's two LayerNorms' weight and bias gradients over this rank's rows */
    float *ce_part, *ce_parts;   /* tp: the cross-entropy's (N,3) statistics and the group's (tp,N,3) */
    size_t *shd_lo, *shd_hi;     /* tp: runs of sharded parameters (tp_dim >= 0) in the stage layout, which alone a */
    int n_shd;                   /* tp rank but 0 counts in the norm (the whole parameters are rank 0's) */
    double *shd_sumsq;           /* tp: device sums of squares of those runs (n_shd) */
    int lo, hi;       /* the pipeline stage's blocks [lo, hi) (the whole model: 0, L) */
    bool first, last; /* the stage holds the embeddings (first), ln_f and the head (last); wte on either */
    bool *held;       /* parameter i is on this stage */
    bool recompute;   /* model.recompute = block: one layer_acts_t shared by every block, refilled in backward */
    int hk;           /* model.head_chunks: > 1, the head's logits a chunk of rows at a time, recomputed in backward */
    void *logits_chunk; /* hk > 1, last stage: one chunk's logits (N/hk rounded up, Vl), shared by every set */
    size_t es, numel;
    cudaStream_t stream;
    cudaEvent_t copied[2]; /* the token copy out of pinned slot i finished */
    int slot;              /* the pinned slot the next forward fills: two, so the host never waits for the
                            * previous micro-batch's work before it enqueues the next forward */
    mt_cuda_ctx_t ctx;
    void *ws;
    float *grads, *adam_m, *adam_v; /* gradients (numel), AdamW moments of the slice (sh_hi - sh_lo) */
    float *master;                  /* f32 master weights of the slice: master[i - sh_lo] (in wc for f32 storage) */
    void *wc;                       /* compute copy in the storage dtype, sh_n * sh_len elements (NULL: zero3) */
    bool zero3;                     /* ZeRO-3: weights gathered per block into wpool, wte/wpe/ln_f into wouter */
    void *wpool;                    /* zero3: three block-sized weight slots, block l's weights in slot l % 3 */
    void *wouter;                   /* zero3: wte, wpe, ln_f in the layout of gouter */
    void *wslice;                   /* zero3: the slice of the compute copy (== master for f32 storage) */
    int wslot[3];                   /* zero3: the block each slot holds (-1: none or stale) */
    bool outer_stale;               /* zero3: wouter predates the last step */
    cudaEvent_t wready[3];          /* zero3: recorded on the comm stream after a slot's gather */
    cudaEvent_t wmark;              /* zero3: the compute stream's progress, for the comm stream to wait on */
    mt_gpt2_cuda_weight_hook_t whook;
    void *whook_arg;
    int sh_n, sh_r;              /* ZeRO-1/2: shards and this model's (1, 0: unsharded) */
    size_t sh_lo, sh_hi, sh_len; /* the slice this model updates, the slice length */
    bool zero2;                  /* ZeRO-2: no whole gradient (grads NULL): backward writes the pool below */
    float *gpool;                /* zero2: two block-sized slots, block l's gradients in slot l % 2 */
    float *gouter;               /* zero2: the parameters before the blocks [0, offs[b0]), then those after them,
                                  * [offs[pf], numel) */
    float *gshard;               /* zero2: the slice's gradient, accumulated by the hook's consumer */
    size_t tied_acc;             /* zero2 on a pipeline's end stage: wte's elements (gouter's first), which
                                  * accumulate over a step's passes (0: none; every pass starts from zero) */
    size_t blk_numel;            /* zero2: elements of one block's parameters */
    cudaEvent_t slot_free[2];    /* zero2: recorded on the consumer stream after a slot's hook */
    cudaEvent_t outer_free;      /* zero2: ... after the embedding's hook (the last use of gouter) */
    cudaStream_t consumer;       /* the stream the hook's consumer reads the gradients on */
    size_t *offs; /* each parameter's offset in the stage's flat layout (an absent one: zero length there) */
    bool *decay;
    int n_params;
    acts_t *sets; /* params.act_sets of them: micro-batches in flight (a pipeline stage's) */
    int n_sets;
    acts_t *A;            /* the set forward and backward use (mt_gpt2_cuda_use_acts) */
    acts_t *last_fwd;     /* the set of the last forward, until a backward (recompute: whose internals are there) */
    layer_acts_t *la_all; /* every set's block views */
    void *tmp_c, *dresid, *da, *dfg, *dfc; /* (N,C) (R,C) (N,C) (N,Hl) (N,Hl); dfc (N,C) if that is more and
                                            * rowpar_backward packs chunks in it */
    size_t dfc_numel;
    float *col_scratch, *ln_scratch, *attn_scratch, *coef, *norm;
    double *sumsq, *sumsq_scratch;
    int *found_inf;
    int32_t *pinned;
    struct gpt2_cuda_readback *rb; /* pinned, after the token slots: a step's scalars for the host */
    mt_loss_scaler_t scaler;
    int64_t t;      /* AdamW steps taken */
    bool nonfinite; /* the last mt_gpt2_cuda_grad_stats found inf/NaN */
    mt_gpt2_cuda_grad_hook_t hook;
    void *hook_arg;
    bool stepped; /* a step is pending its result */
    size_t act_bytes;
    void *bufs[MAX_BUFS]; /* device buffers to free, with sub-allocations carved from them */
    int n_bufs;
    struct gpt2_cuda_dry *dry; /* mt_gpt2_cuda_requests: init records its allocations and touches no device */
    bool prof;                   /* per-kernel timing on */
    cudaEvent_t *marks;          /* PROF_MARKS events, recorded after each launch */
    int8_t mark_cat[PROF_MARKS]; /* category of the launch each mark ends; -1 = a start mark */
    int n_marks;
    double prof_ms[MT_GPT2_PROF_COUNT];
    int64_t prof_steps;
};

#define CK(call) MT_CHECK(mt_cuda_status((call), #call))
#define W(i) weight_ptr(g, i)

/* Where parameter i's compute copy lives: the whole copy, or under ZeRO-3 its gathered slot. */
static inline void *weight_ptr(mt_gpt2_cuda_t g, int i) {
    if (!g->zero3) {
        return (char *)g->wc + g->offs[i] * g->es;
    }
    if (i < g->b0) {
        return (char *)g->wouter + g->offs[i] * g->es;
    }
    if (i >= g->pf) {
        return (char *)g->wouter + (g->offs[g->b0] + g->offs[i] - g->offs[g->pf]) * g->es;
    }
    int l = (i - g->b0) / g->nbp;
    return (char *)g->wpool + ((size_t)(l % 3) * g->blk_numel + g->offs[i] - g->offs[g->b0 + l * g->nbp]) * g->es;
}
#define G(i) grad_ptr(g, i)

/* Where parameter i's gradient lives: the whole gradient's flat layout, or under ZeRO-2 the pool. */
static inline float *grad_ptr(mt_gpt2_cuda_t g, int i) {
    if (!g->zero2) {
        return g->grads + g->offs[i];
    }
    if (i < g->b0) {
        return g->gouter + g->offs[i];
    }
    if (i >= g->pf) {
        return g->gouter + g->offs[g->b0] + (g->offs[i] - g->offs[g->pf]);
    }
    int l = (i - g->b0) / g->nbp;
    return g->gpool + (size_t)(l % 2) * g->blk_numel + (g->offs[i] - g->offs[g->b0 + l * g->nbp]);
}

/* Records the end of a launch of category cat (or, cat < 0, the start of a timed stretch) when profiling. */
mt_status_t gpt2_cuda_prof_mark(mt_gpt2_cuda_t g, int cat);
#define OP(cat, call)                                                                                                  \
    do {                                                                                                               \
        CK(call);                                                                                                      \
        MT_CHECK(gpt2_cuda_prof_mark(g, MT_GPT2_##cat));                                                               \
    } while (0)
#define MT_GPT2_PROF_START (-1)

/* Block l's input (l = hi: the stage's output, or the final residual) and internals, on the stage. */
#define RES(l) ((void *)((char *)g->A->resid + (size_t)((l)-g->lo) * MT_DIV_UP((size_t)g->R * g->C * g->es, 256) * 256))
#define LA(l) (&g->A->la[(l)-g->lo])

/* gpt2_cuda.c: whole f32 weights (numel floats in the host layout; NULL: each parameter's host data) into the
 * compute copy and the slice's master weights; the gradients zeroed. */
mt_status_t gpt2_cuda_upload_weights(mt_gpt2_cuda_t g, const float *flat);

/* gpt2_cuda_tp.c: tensor parallelism's region boundaries, each collective in the compute stream's order (see
 * there). f and g: the group's sum of part (in place; sequence parallelism: this rank's R rows of it at rows),
 * synchronously or on tp_stream (rejoined by gpt2_cuda_tp_rejoin / _join); the sequence-parallel gather of every
 * rank's rows into full; the row- and column-parallel products with their collectives (params.tp_chunks). */
mt_status_t gpt2_cuda_tp_reduce(mt_gpt2_cuda_t g, void *part, void *rows, void **out);
mt_status_t gpt2_cuda_tp_rejoin(mt_gpt2_cuda_t g);
mt_status_t gpt2_cuda_tp_reduce_async(mt_gpt2_cuda_t g, void *part, void *rows, void **out);
mt_status_t gpt2_cuda_tp_join(mt_gpt2_cuda_t g);
mt_status_t gpt2_cuda_tp_gather(mt_gpt2_cuda_t g, const void *rows, void *full);
mt_status_t gpt2_cuda_rowpar_forward(mt_gpt2_cuda_t g, const void *inp, int Cin, const void *w, const void *bias,
                                     void **x);
mt_status_t gpt2_cuda_colpar_forward(mt_gpt2_cuda_t g, void *full, void *out, int ldo, void *gelu_pre, const void *w,
                                     const void *bias, int OC);
mt_status_t gpt2_cuda_rowpar_backward(mt_gpt2_cuda_t g, void *dinp, const void *inp, int Cin, const void *w, float *dw,
                                      float *db);

#endif /* MT_GPT2_CUDA_IMPL_H */
