/* The generic model: parameter registry, flat storage, layout-independent initialisation, hooks, and
 * the module-range forward/backward driver over per-micro-batch activation objects. Model families
 * (gpt2/, mlp/) supply the per-module math through mt_model_ops_t.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/layers/layers.h"
#include "models/model_impl.h"
#include "runtime/alloc.h"
#include "runtime/precision.h"

/* ---- registry ------------------------------------------------------------------------------- */

mt_status_t mt_model_add_module(mt_model_t m, const char *name) {
    int n = m->n_modules + 1;
    void *names = realloc(m->module_names, (size_t)n * sizeof(*m->module_names));
    int *first = realloc(m->mod_first, (size_t)n * sizeof(int));
    int *count = first ? realloc(m->mod_count, (size_t)n * sizeof(int)) : NULL;
    if (names) {
        m->module_names = names;
    }
    if (first) {
        m->mod_first = first;
    }
    if (count) {
        m->mod_count = count;
    }
    if (!names || !first || !count) {
        return mt_error(MT_ERR_OOM, "model: out of memory registering module %s", name);
    }
    snprintf(m->module_names[n - 1], MT_MODULE_NAME_MAX, "%s", name);
    m->mod_first[n - 1] = m->n_params;
    m->mod_count[n - 1] = 0;
    m->n_modules = n;
    return MT_OK;
}

mt_status_t mt_model_add_param(mt_model_t m, const char *name, int ndim, int64_t d0, int64_t d1, float init_std,
                               float init_const, int tp_dim, int tp_parts) {
    MT_ASSERT(m->n_modules > 0 && ndim >= 1 && ndim <= MT_PARAM_MAX_DIM);
    if (m->n_params == m->cap_params) {
        int cap = m->cap_params ? 2 * m->cap_params : 64;
        mt_param_t *p = realloc(m->params, (size_t)cap * sizeof(*p));
        int64_t *r = p ? realloc(m->init_rows, (size_t)cap * sizeof(int64_t)) : NULL;
        if (p) {
            m->params = p;
        }
        if (r) {
            m->init_rows = r;
        }
        if (!p || !r) {
            return mt_error(MT_ERR_OOM, "model: out of memory registering parameter %s", name);
        }
        m->cap_params = cap;
    }
    int tp = m->cfg.tp_size;
    if (tp_dim >= ndim) {
        tp_dim = -1;
    }
    mt_param_t *p = &m->params[m->n_params];
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->ndim = ndim;
    p->global_shape[0] = d0;
    p->global_shape[1] = ndim > 1 ? d1 : 1;
    p->shape[0] = p->global_shape[0];
    p->shape[1] = p->global_shape[1];
    if (tp_dim >= 0 && tp > 1) {
        if (p->global_shape[tp_dim] % ((int64_t)tp * tp_parts) != 0) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "model: parameter %s dimension %d (%lld) does not split over %d tp ranks", name, tp_dim,
                            (long long)p->global_shape[tp_dim], tp);
        }
        p->shape[tp_dim] /= tp;
    }
    p->numel = (size_t)(p->shape[0] * p->shape[1]);
    p->offset = m->numel;
    p->module = m->n_modules - 1;
    p->tied_module = -1;
    p->is_weight2d = ndim == 2;
    p->tp_dim = tp > 1 ? tp_dim : -1;
    p->tp_parts = tp_parts < 1 ? 1 : tp_parts;
    p->init_std = init_std;
    p->init_const = init_const;
    m->init_rows[m->n_params] = p->global_shape[0];
    m->numel += p->numel;
    m->mod_count[m->n_modules - 1]++;
    m->n_params++;
    return MT_OK;
}

mt_status_t mt_model_realloc_scratch(float **p, size_t floats, const char *owner) {
    float *n = mt_alloc(floats * sizeof(float), MT_MEM_ACTIVATIONS, owner);
    if (!n) {
        return mt_error(MT_ERR_OOM, "model: cannot allocate %zu bytes of %s", floats * sizeof(float), owner);
    }
    mt_free(*p);
    *p = n;
    return MT_OK;
}

mt_status_t mt_model_init(const mt_model_config_t *cfg, mt_model_t *out) {
    *out = NULL;
    if (!cfg || cfg->size != sizeof(mt_model_config_t)) {
        return mt_error(MT_ERR_INVALID_ARG, "model: config is NULL or not initialised with MT_MODEL_CONFIG_INIT");
    }
    if (cfg->n_layer < 1 || cfg->n_embd < 1 || cfg->seq_len < 1 || cfg->vocab_size < 2) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "model: n_layer (%d), n_embd (%d), seq_len (%d) must be >= 1 and vocab_size (%d) >= 2",
                        cfg->n_layer, cfg->n_embd, cfg->seq_len, cfg->vocab_size);
    }
    if (cfg->tp_size < 1 || cfg->tp_rank < 0 || cfg->tp_rank >= cfg->tp_size) {
        return mt_error(MT_ERR_INVALID_ARG, "model: tp_rank %d is not in [0, tp_size %d)", cfg->tp_rank, cfg->tp_size);
    }
    if (cfg->head_chunks < 1) {
        return mt_error(MT_ERR_INVALID_ARG, "model: head_chunks (%d) must be >= 1 (model.head_chunks; 1 keeps the "
                        "whole logits)", cfg->head_chunks);
    }
    if (cfg->tp_size > 1 && (!cfg->tp_ops || !cfg->tp_ops->all_reduce_sum)) {
        return mt_error(MT_ERR_INVALID_ARG, "model: tp_size %d needs tp_ops with all_reduce_sum", cfg->tp_size);
    }
    struct mt_model *m = calloc(1, sizeof(*m));
    if (!m) {
        return mt_error(MT_ERR_OOM, "model: out of memory");
    }
    m->cfg = *cfg;
    m->compute_dt = (int)MT_F32;
    m->loss_scale = 1.0f;
    if (m->cfg.padded_vocab == 0) {
        int mult = 128 * cfg->tp_size; /* each tp rank's vocabulary slice stays a multiple of 128 */
        m->cfg.padded_vocab = (cfg->vocab_size + mult - 1) / mult * mult;
    }
    mt_status_t st;
    if (cfg->kind == MT_MODEL_GPT2) {
        st = mt_gpt2_build(m);
    } else if (cfg->kind == MT_MODEL_MLP) {
        st = mt_mlp_build(m);
    } else {
        st = mt_error(MT_ERR_INVALID_ARG, "model: unknown kind %d (gpt2 = 0, mlp = 1)", (int)cfg->kind);
    }
    if (st != MT_OK) {
        mt_model_free(m);
        return st;
    }
    MT_INFO(MT_LOG_MODEL, "model %s: %d modules, %d parameters, %zu elements",
            cfg->kind == MT_MODEL_GPT2 ? "gpt2" : "mlp", m->n_modules, m->n_params, m->numel);
    *out = m;
    return MT_OK;
}

void mt_model_free(mt_model_t m) {
    if (!m) {
        return;
    }
    if (m->ops && m->ops->free_impl) {
        m->ops->free_impl(m);
    }
    mt_free(m->gbuf[0]);
    mt_free(m->gbuf[1]);
    mt_free(m->lp_w);
    mt_free(m->lp_g);
    free(m->lp_saved);
    mt_free(m->params_flat);
    mt_free(m->grads_flat);
    free(m->params);
    free(m->init_rows);
    free(m->module_names);
    free(m->mod_first);
    free(m->mod_count);
    free(m);
}

const mt_model_config_t *mt_model_config(mt_model_t m) {
    return &m->cfg;
}
int mt_model_n_modules(mt_model_t m) {
    return m->n_modules;
}
const char *mt_model_module_name(mt_model_t m, int module) {
    return module >= 0 && module < m->n_modules ? m->module_names[module] : "?";
}
void mt_model_module_params(mt_model_t m, int module, int *first, int *count) {
    MT_ASSERT(module >= 0 && module < m->n_modules);
    *first = m->mod_first[module];
    *count = m->mod_count[module];
}
int mt_model_n_params(mt_model_t m) {
    return m->n_params;
}
mt_param_t *mt_model_param(mt_model_t m, int i) {
    return i >= 0 && i < m->n_params ? &m->params[i] : NULL;
}
int mt_model_find_param(mt_model_t m, const char *name) {
    for (int i = 0; i < m->n_params; i++) {
        if (strcmp(m->params[i].name, name) == 0) {
            return i;
        }
    }
    return -1;
}
size_t mt_model_numel(mt_model_t m) {
    return m->numel;
}
int mt_model_act_width(mt_model_t m) {
    return m->width;
}
float *mt_model_params_flat(mt_model_t m) {
    return m->params_flat;
}
float *mt_model_grads_flat(mt_model_t m) {
    return m->grads_flat;
}

mt_status_t mt_model_alloc_params(mt_model_t m) {
    if (!m->params_flat) {
        m->params_flat = mt_alloc(m->numel * sizeof(float), MT_MEM_PARAMS, "model params");
        if (!m->params_flat) {
            return mt_error(MT_ERR_OOM, "model: cannot allocate %zu bytes of parameters", m->numel * sizeof(float));
        }
    }
    for (int i = 0; i < m->n_params; i++) {
        m->params[i].data = m->params_flat + m->params[i].offset;
    }
    return MT_OK;
}

mt_status_t mt_model_alloc_grads(mt_model_t m) {
    if (!m->grads_flat) {
        m->grads_flat = mt_calloc(m->numel * sizeof(float), MT_MEM_GRADS, "model grads");
        if (!m->grads_flat) {
            return mt_error(MT_ERR_OOM, "model: cannot allocate %zu bytes of gradients", m->numel * sizeof(float));
        }
    }
    for (int i = 0; i < m->n_params; i++) {
        m->params[i].grad = m->grads_flat + m->params[i].offset;
    }
    return MT_OK;
}

void mt_model_zero_grads(mt_model_t m) {
    for (int i = 0; i < m->n_params; i++) {
        if (m->params[i].grad) {
            memset(m->params[i].grad, 0, m->params[i].numel * sizeof(float));
        }
    }
}

void mt_model_get_hooks(mt_model_t m, mt_model_hooks_t *out) {
    *out = m->hooks;
}

void mt_model_set_hooks(mt_model_t m, const mt_model_hooks_t *hooks) {
    if (hooks) {
        m->hooks = *hooks;
    } else {
        memset(&m->hooks, 0, sizeof(m->hooks));
    }
}

/* ---- initialisation -------------------------------------------------------------------------- */

/* SplitMix64's finaliser: a bijective 64-bit mixer. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t name_key(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const char *c = name; *c; c++) {
        h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    }
    return mix64(mix64(seed) ^ h);
}

/* Standard normal number for element gidx of the stream key: Box-Muller on two counter-hashed uniforms. */
static double normal_at(uint64_t key, uint64_t gidx) {
    uint64_t a = mix64(key + (2 * gidx + 1) * 0x9e3779b97f4a7c15ull);
    uint64_t b = mix64(key + (2 * gidx + 2) * 0x9e3779b97f4a7c15ull);
    double u1 = ((double)(a >> 11) + 1.0) * 0x1.0p-53; /* (0, 1] */
    double u2 = (double)(b >> 11) * 0x1.0p-53;         /* [0, 1) */
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Global (row, col) of local element li of parameter p on this tp rank. */
static void global_coords(const mt_param_t *p, int tp_rank, int tp_size, size_t li, int64_t *gr, int64_t *gc) {
    int64_t r = (int64_t)(li / (size_t)p->shape[1]), c = (int64_t)(li % (size_t)p->shape[1]);
    if (p->tp_dim == 0) {
        int64_t pl = p->shape[0] / p->tp_parts;
        r = (r / pl) * pl * tp_size + (int64_t)tp_rank * pl + r % pl;
    } else if (p->tp_dim == 1) {
        int64_t pl = p->shape[1] / p->tp_parts;
        c = (c / pl) * pl * tp_size + (int64_t)tp_rank * pl + c % pl;
    }
    *gr = r;
    *gc = c;
}

void mt_model_param_init_values(mt_model_t m, int i, size_t start, size_t count, float *out) {
    MT_ASSERT(i >= 0 && i < m->n_params);
    const mt_param_t *p = &m->params[i];
    MT_ASSERT(start + count <= p->numel);
    if (p->init_std == 0.0f) {
        for (size_t k = 0; k < count; k++) {
            out[k] = p->init_const;
        }
        return;
    }
    uint64_t key = name_key(m->cfg.seed, p->name);
    int64_t rows = m->init_rows[i];
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < count; k++) {
        int64_t gr, gc;
        global_coords(p, m->cfg.tp_rank, m->cfg.tp_size, start + k, &gr, &gc);
        if (gr >= rows) {
            out[k] = 0.0f;
        } else {
            out[k] = (float)(p->init_std * normal_at(key, (uint64_t)(gr * p->global_shape[1] + gc)));
        }
    }
}

void mt_model_init_weights(mt_model_t m) {
    for (int i = 0; i < m->n_params; i++) {
        if (m->params[i].data) {
            mt_model_param_init_values(m, i, 0, m->params[i].numel, m->params[i].data);
        }
    }
}

size_t mt_model_head_chunk(size_t N, int k, int j, size_t *j0) {
    *j0 = N * (size_t)j / (size_t)k;
    return N * (size_t)(j + 1) / (size_t)k - *j0;
}

size_t mt_model_head_chunk_rows(size_t N, int k) {
    return (N + (size_t)k - 1) / (size_t)k;
}

double mt_model_flops_per_token(mt_model_t m, int T) {
    const mt_model_config_t *c = &m->cfg;
    double n = 0.0;
    for (int i = 0; i < m->n_params; i++) {
        const mt_param_t *p = &m->params[i];
        if (p->module == 0 && p->tied_module < 0) {
            continue; /* read by the embedding's lookup alone (gpt2's wpe, the mlp's wte): no matmul */
        }
        double e = (double)p->global_shape[0] * (double)p->global_shape[1];
        if (m->init_rows[i] < p->global_shape[0]) {
            e = (double)m->init_rows[i] * (double)p->global_shape[1]; /* padded vocabulary rows are never used */
        }
        n += e;
    }
    double f = 6.0 * n;
    if (c->kind == MT_MODEL_GPT2) {
        f += 12.0 * c->n_layer * (double)c->n_embd * T; /* 12 L H Q T with H*Q = C */
    }
    return f;
}

/* ---- activations ----------------------------------------------------------------------------- */

mt_status_t mt_acts_init(mt_model_t m, int B, int T, mt_acts_t *out) {
    *out = NULL;
    if (B < 1 || T < 1 || T > m->cfg.seq_len) {
        return mt_error(MT_ERR_INVALID_ARG, "model: micro-batch B=%d T=%d invalid (need B >= 1, 1 <= T <= seq_len %d)",
                        B, T, m->cfg.seq_len);
    }
    struct mt_acts *a = calloc(1, sizeof(*a));
    int n = m->n_modules;
    if (a) {
        a->mod_buf = calloc((size_t)n, sizeof(float *));
        a->mod_out = calloc((size_t)n, sizeof(float *));
        a->mod_inp = calloc((size_t)n, sizeof(float *));
        a->fwd_done = calloc((size_t)n, sizeof(bool));
        a->tokens = mt_alloc((size_t)B * T * sizeof(int32_t), MT_MEM_ACTIVATIONS, "acts tokens");
        a->targets = mt_alloc((size_t)B * T * sizeof(int32_t), MT_MEM_ACTIVATIONS, "acts targets");
    }
    if (!a || !a->mod_buf || !a->mod_out || !a->mod_inp || !a->fwd_done || !a->tokens || !a->targets) {
        mt_acts_free(a);
        return mt_error(MT_ERR_OOM, "model: out of memory creating activations for B=%d T=%d", B, T);
    }
    a->m = m;
    a->B = B;
    a->T = T;
    *out = a;
    return MT_OK;
}

void mt_acts_free(mt_acts_t a) {
    if (!a) {
        return;
    }
    if (a->mod_buf) {
        for (int i = 0; i < a->m->n_modules; i++) {
            mt_free(a->mod_buf[i]);
        }
    }
    mt_free(a->in);
    mt_free(a->tokens);
    mt_free(a->targets);
    free(a->mod_buf);
    free(a->mod_out);
    free(a->mod_inp);
    free(a->fwd_done);
    free(a);
}

int mt_acts_B(mt_acts_t a) {
    return a->B;
}
int mt_acts_T(mt_acts_t a) {
    return a->T;
}

/* ---- compute precision: the per-module rounding wrapper -------------------------------------- */

mt_status_t mt_model_set_compute(mt_model_t m, int dt) {
    if (dt != (int)MT_F32 && dt != (int)MT_BF16 && dt != (int)MT_F16) {
        return mt_error(MT_ERR_INVALID_ARG, "model: compute dtype %d is not f32, bf16 or f16", dt);
    }
    m->compute_dt = dt;
    return MT_OK;
}

int mt_model_compute(mt_model_t m) {
    return m->compute_dt;
}

void mt_model_set_loss_scale(mt_model_t m, float scale) {
    m->loss_scale = scale;
}

static bool reads_param(const mt_param_t *p, int module) {
    return p->module == module || p->tied_module == module;
}

size_t mt_model_lowp_floats(mt_model_t m) {
    size_t most = 0;
    for (int k = 0; k < m->n_modules; k++) {
        size_t f = 0;
        for (int i = 0; i < m->n_params; i++) {
            f += reads_param(&m->params[i], k) ? m->params[i].numel : 0;
        }
        most = MT_MAX(most, f);
    }
    return MT_MAX(most, 1);
}

/* The scratch of the wrapper, sized once for the module that reads the most parameter floats. */
static mt_status_t lp_ensure(mt_model_t m) {
    if (m->lp_saved) {
        return MT_OK;
    }
    size_t most = mt_model_lowp_floats(m);
    m->lp_w = mt_alloc(most * sizeof(float), MT_MEM_PARAMS, "model rounded weights");
    m->lp_g = mt_alloc(most * sizeof(float), MT_MEM_GRADS, "model rounded gradients");
    m->lp_saved = calloc(2 * (size_t)MT_MAX(m->n_params, 1), sizeof(float *));
    if (!m->lp_w || !m->lp_g || !m->lp_saved) {
        mt_free(m->lp_w);
        mt_free(m->lp_g);
        free(m->lp_saved);
        m->lp_w = m->lp_g = NULL;
        m->lp_saved = NULL;
        return mt_error(MT_ERR_OOM, "model: cannot allocate 2 x %zu bytes of %s compute scratch",
                        most * sizeof(float), mt_dtype_name((mt_dtype_t)m->compute_dt));
    }
    m->lp_floats = most;
    return MT_OK;
}

/* n floats set to 0, threaded over large arrays (the gradient staging of a whole embedding is megabytes). */
static void zero_floats(float *x, size_t n) {
    enum { PIECE = 1 << 16 };
    size_t pieces = (n + PIECE - 1) / PIECE;
#pragma omp parallel for schedule(static) if (pieces > 1)
    for (size_t k = 0; k < pieces; k++) {
        size_t lo = k * PIECE, len = n - lo < PIECE ? n - lo : PIECE;
        memset(x + lo, 0, len * sizeof(float));
    }
}

/* Before module's call (after the engine's pre hook bound p->data, p->grad): points the parameters it
 * reads at their rounded copies and, for backward, the gradients at zeroed staging. */
static void lp_swap_in(mt_model_t m, int module, bool grads) {
    mt_dtype_t dt = (mt_dtype_t)m->compute_dt;
    size_t off = 0;
    for (int i = 0; i < m->n_params; i++) {
        mt_param_t *p = &m->params[i];
        if (!reads_param(p, module)) {
            continue;
        }
        float *w = m->lp_w + off;
        mt_prec_round_copy(w, p->data, p->numel, dt);
        m->lp_saved[2 * i] = p->data;
        p->data = w;
        if (grads) {
            zero_floats(m->lp_g + off, p->numel);
            m->lp_saved[2 * i + 1] = p->grad;
            p->grad = m->lp_g + off;
        }
        off += p->numel;
    }
    mt_layers_set_product_dtype((int)dt); /* bf16: the products in bf16 where the CPU has them (layers.h) */
}

/* After the call: the engine's pointers back; backward's gradients rounded to dt (in fp16 they carry the
 * loss scale, so an overflow becomes inf here) and added to the engine's f32 gradients. */
static void lp_swap_out(mt_model_t m, int module, bool grads) {
    mt_dtype_t dt = (mt_dtype_t)m->compute_dt;
    mt_layers_set_product_dtype((int)MT_F32);
    for (int i = 0; i < m->n_params; i++) {
        mt_param_t *p = &m->params[i];
        if (!reads_param(p, module)) {
            continue;
        }
        p->data = m->lp_saved[2 * i];
        if (grads) {
            float *dst = m->lp_saved[2 * i + 1];
            mt_prec_round_add(dst, p->grad, p->numel, dt);
            p->grad = dst;
        }
    }
}

/* ---- execution ------------------------------------------------------------------------------- */

static mt_status_t check_bound(mt_model_t m, int module, bool need_grad) {
    for (int i = 0; i < m->n_params; i++) {
        const mt_param_t *p = &m->params[i];
        if (p->module != module && p->tied_module != module) {
            continue;
        }
        if (!p->data || (need_grad && !p->grad)) {
            return mt_error(MT_ERR_INVALID_ARG, "model: parameter %s of module %s has no %s bound", p->name,
                            m->module_names[module], !p->data ? "data" : "grad");
        }
    }
    return MT_OK;
}

static mt_status_t check_range(mt_model_t m, int lo, int hi) {
    if (lo < 0 || hi > m->n_modules || lo >= hi) {
        return mt_error(MT_ERR_INVALID_ARG, "model: module range [%d, %d) invalid for %d modules", lo, hi,
                        m->n_modules);
    }
    return MT_OK;
}

static size_t act_rows(mt_model_t m, int B, int T) {
    return m->ops->act_rows ? m->ops->act_rows(m, B, T) : (size_t)B * T;
}

size_t mt_model_act_floats(mt_model_t m, int B, int T) {
    return act_rows(m, B, T) * (size_t)m->width;
}

/* A family's sticky error (a failed tp collective inside a module), returned once. */
static mt_status_t take_error(mt_model_t m) {
    return m->ops->take_error ? m->ops->take_error(m) : MT_OK;
}

mt_status_t mt_model_forward(mt_model_t m, mt_acts_t a, int lo, int hi, const int32_t *tokens,
                             const int32_t *targets, const float *in_act, float *out_act, float *loss) {
    MT_CHECK(check_range(m, lo, hi));
    int n = m->n_modules, N = a->B * a->T, V = m->cfg.vocab_size;
    size_t AF = mt_model_act_floats(m, a->B, a->T);
    if (lo == 0) {
        if (!tokens) {
            return mt_error(MT_ERR_INVALID_ARG, "model: forward from module 0 needs tokens");
        }
        for (int i = 0; i < N; i++) {
            if (tokens[i] < 0 || tokens[i] >= V) {
                return mt_error(MT_ERR_INVALID_ARG, "model: token %d at position %d is outside the vocabulary [0, %d)",
                                tokens[i], i, V);
            }
        }
        memcpy(a->tokens, tokens, (size_t)N * sizeof(int32_t));
    } else {
        if (!in_act) {
            return mt_error(MT_ERR_INVALID_ARG, "model: forward from module %d needs in_act from the previous stage",
                            lo);
        }
        if (!a->in) {
            a->in = mt_alloc(AF * sizeof(float), MT_MEM_ACTIVATIONS, "acts stage input");
            if (!a->in) {
                return mt_error(MT_ERR_OOM, "model: cannot allocate the stage input (%zu bytes)", AF * 4);
            }
        }
        memcpy(a->in, in_act, AF * sizeof(float));
    }
    if (hi == n) {
        if (!targets || !loss) {
            return mt_error(MT_ERR_INVALID_ARG, "model: forward through the head needs targets and a loss pointer");
        }
        for (int i = 0; i < N; i++) {
            if (targets[i] < -1 || targets[i] >= V) {
                return mt_error(MT_ERR_INVALID_ARG,
                                "model: target %d at position %d is outside [0, %d) and not the ignore index -1",
                                targets[i], i, V);
            }
        }
        memcpy(a->targets, targets, (size_t)N * sizeof(int32_t));
    }
    MT_CHECK(m->ops->ensure_workspace(m, a->B, a->T, hi == m->n_modules));
    bool lowp = m->compute_dt != (int)MT_F32;
    if (lowp) {
        MT_CHECK(lp_ensure(m));
    }
    for (int i = lo; i < hi; i++) {
        if (m->hooks.pre_forward) {
            MT_CHECK(m->hooks.pre_forward(m->hooks.arg, i));
        }
        MT_CHECK(check_bound(m, i, false));
        if (!a->mod_buf[i]) {
            size_t fl = m->ops->module_floats(m, i, a->B, a->T);
            a->mod_buf[i] = mt_alloc(fl * sizeof(float), MT_MEM_ACTIVATIONS, "acts module");
            if (!a->mod_buf[i]) {
                return mt_error(MT_ERR_OOM, "model: cannot allocate %zu bytes of activations for module %s",
                                fl * sizeof(float), m->module_names[i]);
            }
            a->mod_out[i] = m->ops->module_out(m, a, i);
        }
        const float *inp = i == 0 ? NULL : (i == lo ? a->in : a->mod_out[i - 1]);
        a->mod_inp[i] = inp;
        if (lowp) {
            lp_swap_in(m, i, false);
        }
        m->ops->forward(m, a, i, inp);
        if (lowp) {
            lp_swap_out(m, i, false);
            if (i < n - 1 && a->mod_out[i]) {
                mt_prec_round(a->mod_out[i], AF, (mt_dtype_t)m->compute_dt); /* the activation passed on */
            }
        }
        MT_CHECK(take_error(m));
        a->fwd_done[i] = true;
        if (m->hooks.post_forward) {
            MT_CHECK(m->hooks.post_forward(m->hooks.arg, i));
        }
    }
    if (hi < n && out_act) {
        memcpy(out_act, a->mod_out[hi - 1], AF * sizeof(float));
    }
    if (hi == n) {
        *loss = a->loss;
    }
    return MT_OK;
}

mt_status_t mt_model_backward(mt_model_t m, mt_acts_t a, int lo, int hi, const float *dout, float *din,
                              float loss_grad_scale) {
    MT_CHECK(check_range(m, lo, hi));
    int n = m->n_modules;
    size_t AF = mt_model_act_floats(m, a->B, a->T);
    for (int i = lo; i < hi; i++) {
        if (!a->fwd_done[i]) {
            return mt_error(MT_ERR_INVALID_USAGE,
                            "model: backward of module %s without its forward on this micro-batch", m->module_names[i]);
        }
    }
    if ((hi == n) != (dout == NULL)) {
        return mt_error(MT_ERR_INVALID_ARG, "model: backward of [%d, %d): dout must be %s", lo, hi,
                        hi == n ? "NULL (the gradient starts at the loss)" : "given (gradient from the next stage)");
    }
    if (lo > 0 && !din) {
        return mt_error(MT_ERR_INVALID_ARG, "model: backward to module %d needs din for the previous stage", lo);
    }
    MT_CHECK(m->ops->ensure_workspace(m, a->B, a->T, hi == m->n_modules));
    if (m->gbuf_floats < AF) {
        MT_CHECK(mt_model_realloc_scratch(&m->gbuf[0], AF, "model grad buffer"));
        MT_CHECK(mt_model_realloc_scratch(&m->gbuf[1], AF, "model grad buffer"));
        m->gbuf_floats = AF;
    }
    bool lowp = m->compute_dt != (int)MT_F32;
    if (lowp) {
        MT_CHECK(lp_ensure(m));
    }
    float *gcur = m->gbuf[0], *gnext = m->gbuf[1];
    if (dout) {
        memcpy(gcur, dout, AF * sizeof(float));
    }
    for (int i = hi - 1; i >= lo; i--) {
        if (m->hooks.pre_backward) {
            MT_CHECK(m->hooks.pre_backward(m->hooks.arg, i));
        }
        MT_CHECK(check_bound(m, i, true));
        if (lowp) {
            lp_swap_in(m, i, true);
        }
        m->ops->backward(m, a, i, a->mod_inp[i], i == n - 1 ? NULL : gcur, i > 0 ? gnext : NULL,
                         i == n - 1 ? loss_grad_scale * m->loss_scale : loss_grad_scale);
        if (lowp) {
            lp_swap_out(m, i, true);
            if (i > 0) {
                mt_prec_round(gnext, AF, (mt_dtype_t)m->compute_dt); /* the gradient passed back */
            }
        }
        MT_CHECK(take_error(m));
        if (i == n - 1) {
            a->fwd_done[i] = false; /* the head's backward consumed its logits in place */
        }
        float *t = gcur;
        gcur = gnext;
        gnext = t;
        if (m->hooks.post_backward) {
            MT_CHECK(m->hooks.post_backward(m->hooks.arg, i));
        }
    }
    if (lo > 0) {
        memcpy(din, gcur, AF * sizeof(float));
    }
    return MT_OK;
}

mt_status_t mt_model_step(mt_model_t m, mt_acts_t a, const int32_t *tokens, const int32_t *targets, bool do_backward,
                          float *loss) {
    MT_CHECK(mt_model_forward(m, a, 0, m->n_modules, tokens, targets, NULL, NULL, loss));
    if (do_backward) {
        MT_CHECK(mt_model_backward(m, a, 0, m->n_modules, NULL, NULL, 1.0f));
    }
    return MT_OK;
}

/* ---- sizing (for planning) -------------------------------------------------------------------- */

/* Mirrors the allocations of mt_acts_init (tokens, targets), mt_model_forward (stage input, one buffer per
 * module from module_floats), the family's ensure_workspace (workspace_floats) and mt_model_backward
 * (two gradient buffers of mt_model_act_floats), each through mt_alloc_accounted. */
mt_status_t mt_model_act_mem(mt_model_t m, int lo, int hi, int B, int T, mt_model_act_mem_t *out) {
    memset(out, 0, sizeof(*out));
    if (lo < 0 || hi > m->n_modules || lo >= hi || B < 1 || T < 1 || T > m->cfg.seq_len) {
        return mt_error(MT_ERR_INVALID_ARG, "model: sizing modules [%d, %d) for B=%d T=%d: invalid range or shape", lo,
                        hi, B, T);
    }
    size_t N = (size_t)B * T, AF = mt_model_act_floats(m, B, T);
    int64_t a = 2 * (int64_t)mt_alloc_accounted(N * sizeof(int32_t));
    if (lo > 0) {
        a += (int64_t)mt_alloc_accounted(AF * sizeof(float));
    }
    for (int i = lo; i < hi; i++) {
        a += (int64_t)mt_alloc_accounted(m->ops->module_floats(m, i, B, T) * sizeof(float));
    }
    int64_t w = 2 * (int64_t)mt_alloc_accounted(AF * sizeof(float));
    size_t fl[MT_MODEL_MAX_WORKSPACE];
    int n = m->ops->workspace_floats ? m->ops->workspace_floats(m, B, T, hi == m->n_modules, fl) : 0;
    for (int k = 0; k < n; k++) {
        w += (int64_t)mt_alloc_accounted(fl[k] * sizeof(float));
    }
    out->per_acts = a;
    out->workspace = w;
    return MT_OK;
}
