/* A small MLP language model for tests: each position predicts the next token from its own token only.
 * Modules: 0 = embedding (wte (V,H)), 1..L = hidden layers h = gelu(h W^T + b) (W (H,H)), L+1 = head
 * (logits = h Wout^T + bout, Wout (V,H), softmax/cross-entropy). Activations between modules are (B,T,H).
 * recompute = block applies to the hidden layers: a layer keeps its output only and recomputes the
 * pre-activation in backward. Shape legend: N = B*T rows, H hidden width (n_embd), V vocabulary.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/layers/layers.h"
#include "models/model_impl.h"
#include "runtime/alloc.h"

typedef struct {
    float *pre;  /* recompute = block: (N,H) pre-activation of the layer being differentiated */
    float *dpre; /* backward scratch (N,H) */
    float *dlog; /* a range with the head: the logits' gradient (N,V), or (head_chunks > 1) one chunk's logits */
    size_t rows, dlog_rows; /* N the workspace and dlog fit */
} mlp_impl_t;

#define PD(i) (m->params[(i)].data)
#define PG(i) (m->params[(i)].grad)

static size_t mlp_module_floats(mt_model_t m, int module, int B, int T) {
    size_t N = (size_t)B * T, H = (size_t)m->cfg.n_embd, V = (size_t)m->cfg.vocab_size;
    if (module == 0) {
        return N * H;
    }
    if (module == m->n_modules - 1) {
        return (m->cfg.head_chunks > 1 ? 0 : N * V) + 2 * N; /* [logits,] losses, lse */
    }
    return m->cfg.recompute == MT_RECOMPUTE_BLOCK ? N * H : 2 * N * H; /* [pre,] out */
}

static float *mlp_module_out(mt_model_t m, mt_acts_t a, int module) {
    if (module == m->n_modules - 1) {
        return NULL;
    }
    if (module == 0 || m->cfg.recompute == MT_RECOMPUTE_BLOCK) {
        return a->mod_buf[module];
    }
    return a->mod_buf[module] + (size_t)a->B * a->T * m->cfg.n_embd;
}

/* The workspace for B*T rows: recompute scratch, backward scratch and, for a range with the head, the logits'
 * gradient (with head_chunks > 1 one chunk's rows, its logits recomputed there in place) (pure: planning uses
 * it). */
static int mlp_workspace_floats(mt_model_t m, int B, int T, bool head, size_t *floats) {
    size_t N = (size_t)B * T;
    floats[0] = N * m->cfg.n_embd;
    floats[1] = N * m->cfg.n_embd;
    floats[2] = mt_model_head_chunk_rows(N, m->cfg.head_chunks) * m->cfg.vocab_size;
    return head ? 3 : 2;
}

static mt_status_t mlp_ensure_workspace(mt_model_t m, int B, int T, bool head) {
    mlp_impl_t *g = m->impl;
    size_t N = (size_t)B * T, fl[MT_MODEL_MAX_WORKSPACE];
    mlp_workspace_floats(m, B, T, true, fl);
    if (N > g->rows) {
        MT_CHECK(mt_model_realloc_scratch(&g->pre, fl[0], "mlp recompute scratch"));
        MT_CHECK(mt_model_realloc_scratch(&g->dpre, fl[1], "mlp backward scratch"));
        g->rows = N;
    }
    if (head && N > g->dlog_rows) { /* the stages before the last never hold it */
        MT_CHECK(mt_model_realloc_scratch(&g->dlog, fl[2], "mlp backward scratch"));
        g->dlog_rows = N;
    }
    return MT_OK;
}

static void mlp_free_impl(mt_model_t m) {
    mlp_impl_t *g = m->impl;
    if (g) {
        mt_free(g->pre);
        mt_free(g->dpre);
        mt_free(g->dlog);
        free(g);
    }
}

/* Parameter index of layer module i's weight (its bias follows). */
static int layer_param(int module) {
    return 1 + 2 * (module - 1);
}

/* head_chunks > 1: the logits (n, V) of rows [j0, j0 + n) of the head's input h (N,H) into the workspace (forward,
 * and again in backward: the same product of the same rows). */
static float *head_chunk_logits(mt_model_t m, const float *h, size_t j0, size_t n) {
    int H = m->cfg.n_embd, V = m->cfg.vocab_size, p = layer_param(m->cfg.n_layer + 1);
    float *logits = ((mlp_impl_t *)m->impl)->dlog;
    mt_matmul_forward(logits, V, h + j0 * (size_t)H, PD(p), PD(p + 1), (int)n, H, V);
    return logits;
}

static void mlp_forward(mt_model_t m, mt_acts_t a, int module, const float *inp) {
    int N = a->B * a->T, H = m->cfg.n_embd, V = m->cfg.vocab_size, L = m->cfg.n_layer;
    if (module == 0) {
        mt_embedding_forward(a->mod_buf[0], a->tokens, PD(0), NULL, a->B, a->T, H);
    } else if (module <= L) {
        int p = layer_param(module);
        float *pre = m->cfg.recompute == MT_RECOMPUTE_BLOCK ? ((mlp_impl_t *)m->impl)->pre : a->mod_buf[module];
        mt_matmul_forward(pre, H, inp, PD(p), PD(p + 1), N, H, H);
        mt_gelu_forward(a->mod_out[module], pre, (size_t)N * H);
    } else {
        int p = layer_param(L + 1), k = m->cfg.head_chunks;
        float *losses = a->mod_buf[module] + (k > 1 ? 0 : (size_t)N * V), *lse = losses + N;
        if (k == 1) {
            float *logits = a->mod_buf[module];
            mt_matmul_forward(logits, V, inp, PD(p), PD(p + 1), N, H, V);
            a->n_valid = mt_softmax_ce_forward(losses, lse, &a->loss, logits, a->targets, N, V, V);
            return;
        }
        for (int j = 0; j < k; j++) { /* in chunks of rows: each row's loss and lse kept, its logits not */
            size_t j0, n = mt_model_head_chunk((size_t)N, k, j, &j0);
            float chunk_mean;
            if (n > 0) {
                float *logits = head_chunk_logits(m, inp, j0, n);
                mt_softmax_ce_forward(losses + j0, lse + j0, &chunk_mean, logits, a->targets + j0, (int)n, V, V);
            }
        }
        a->n_valid = mt_softmax_ce_mean(&a->loss, losses, a->targets, (size_t)N);
    }
}

static void mlp_backward(mt_model_t m, mt_acts_t a, int module, const float *inp, const float *dout, float *dinp,
                         float scale) {
    mlp_impl_t *g = m->impl;
    int N = a->B * a->T, H = m->cfg.n_embd, V = m->cfg.vocab_size, L = m->cfg.n_layer;
    if (module == 0) {
        mt_embedding_backward(PG(0), NULL, dout, a->tokens, a->B, a->T, H);
        return;
    }
    memset(dinp, 0, (size_t)N * H * sizeof(float));
    if (module == L + 1) {
        int p = layer_param(L + 1), k = m->cfg.head_chunks;
        float *logits = a->mod_buf[module], *lse = logits + (k > 1 ? 0 : (size_t)N * V) + N;
        if (a->n_valid == 0) {
            return;
        }
        float s = scale / (float)a->n_valid;
        if (k == 1) {
            mt_softmax_ce_backward(g->dlog, logits, lse, a->targets, N, V, V, s);
            mt_matmul_backward(dinp, PG(p), PG(p + 1), g->dlog, V, inp, PD(p), N, H, V);
            return;
        }
        for (int j = 0; j < k; j++) { /* each chunk's logits again, their gradient in place */
            size_t j0, n = mt_model_head_chunk((size_t)N, k, j, &j0);
            if (n > 0) {
                float *dlog = head_chunk_logits(m, inp, j0, n);
                mt_softmax_ce_backward(dlog, dlog, lse + j0, a->targets + j0, (int)n, V, V, s);
                mt_matmul_backward(dinp + j0 * H, PG(p), PG(p + 1), dlog, V, inp + j0 * H, PD(p), (int)n, H, V);
            }
        }
        return;
    }
    int p = layer_param(module);
    float *pre = a->mod_buf[module];
    if (m->cfg.recompute == MT_RECOMPUTE_BLOCK) {
        pre = g->pre;
        mt_matmul_forward(pre, H, inp, PD(p), PD(p + 1), N, H, H);
    }
    memset(g->dpre, 0, (size_t)N * H * sizeof(float));
    mt_gelu_backward(g->dpre, pre, dout, (size_t)N * H);
    mt_matmul_backward(dinp, PG(p), PG(p + 1), g->dpre, H, inp, PD(p), N, H, H);
}

static const mt_model_ops_t mlp_ops = {
    .module_floats = mlp_module_floats,
    .module_out = mlp_module_out,
    .ensure_workspace = mlp_ensure_workspace,
    .workspace_floats = mlp_workspace_floats,
    .free_impl = mlp_free_impl,
    .forward = mlp_forward,
    .backward = mlp_backward,
};

mt_status_t mt_mlp_build(mt_model_t m) {
    mt_model_config_t *c = &m->cfg;
    c->padded_vocab = c->vocab_size; /* the MLP's head has exactly V outputs */
    if (c->tp_size > 1) {
        return mt_error(MT_ERR_INVALID_USAGE, "mlp: tensor parallelism applies to gpt2 only (tp_size %d)", c->tp_size);
    }
    mlp_impl_t *g = calloc(1, sizeof(*g));
    if (!g) {
        return mt_error(MT_ERR_OOM, "mlp: out of memory");
    }
    m->impl = g;
    m->ops = &mlp_ops;
    m->width = c->n_embd;
    int64_t H = c->n_embd, V = c->vocab_size;
    float wstd = (float)(1.0 / sqrt((double)H));
    char name[MT_PARAM_NAME_MAX];
    MT_CHECK(mt_model_add_module(m, "embedding"));
    MT_CHECK(mt_model_add_param(m, "wte", 2, V, H, 1.0f, 0, -1, 1));
    for (int l = 0; l < c->n_layer; l++) {
        snprintf(name, sizeof(name), "fc.%d", l);
        MT_CHECK(mt_model_add_module(m, name));
        snprintf(name, sizeof(name), "fc.%d.weight", l);
        MT_CHECK(mt_model_add_param(m, name, 2, H, H, wstd, 0, -1, 1));
        snprintf(name, sizeof(name), "fc.%d.bias", l);
        MT_CHECK(mt_model_add_param(m, name, 1, H, 1, 0, 0, -1, 1));
    }
    MT_CHECK(mt_model_add_module(m, "head"));
    MT_CHECK(mt_model_add_param(m, "head.weight", 2, V, H, wstd, 0, -1, 1));
    MT_CHECK(mt_model_add_param(m, "head.bias", 1, V, 1, 0, 0, -1, 1));
    return MT_OK;
}
