/* The single-process reference of the model-parallel equivalence tests (see eqref.h).
 * SPDX-License-Identifier: MIT */
#include "eqref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/alloc.h"

mt_model_config_t eq_tiny_gpt2(void) {
    mt_model_config_t mc = MT_MODEL_CONFIG_INIT;
    mc.kind = MT_MODEL_GPT2;
    mc.n_layer = 4;
    mc.n_head = 4;
    mc.n_embd = 32;
    mc.seq_len = 16;
    mc.vocab_size = 64;
    mc.padded_vocab = 128; /* fixed, so every tp size shards the same padded table */
    mc.seed = 42;
    return mc;
}

void eq_setup_default(eq_setup_t *s, bool adamw) {
    memset(s, 0, sizeof(*s));
    s->model = eq_tiny_gpt2();
    s->global_batch = 8;
    s->seq_len = 16;
    s->steps = 5;
    mt_optim_params_t op = MT_OPTIM_PARAMS_INIT;
    if (adamw) {
        op.kind = MT_OPTIM_ADAMW;
        op.weight_decay = 0.1f;
        s->lr = 1e-2f;
    } else {
        op.kind = MT_OPTIM_SGD;
        op.weight_decay = 0.0f;
        op.momentum = 0.0f;
        s->lr = 0.5f;
    }
    s->optim = op;
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void eq_batch(const eq_setup_t *s, int step, int row0, int n, int32_t *tokens, int32_t *targets) {
    int T = s->seq_len, V = s->model.vocab_size;
    for (int r = 0; r < n; r++) {
        for (int t = 0; t <= T; t++) {
            /* Uniform tokens from a hash of (step, row, position): every layout sees the same data. */
            uint64_t h = mix64(((uint64_t)step << 40) ^ ((uint64_t)(row0 + r) << 20) ^ (uint64_t)t ^ 0x5eedull);
            int32_t tok = (int32_t)(h % (uint64_t)V);
            if (t < T) {
                tokens[(size_t)r * T + t] = tok;
            }
            if (t > 0) {
                targets[(size_t)r * T + t - 1] = tok;
            }
        }
    }
}

mt_status_t eq_optim_add_bound(mt_optim_t opt, mt_model_t m, const bool *use) {
    for (int i = 0; i < mt_model_n_params(m); i++) {
        mt_param_t *p = mt_model_param(m, i);
        if ((use && !use[i]) || !p->data) {
            continue;
        }
        MT_CHECK(mt_optim_add(opt, p->name, p->data, p->grad, p->numel, p->is_weight2d, NULL));
    }
    return MT_OK;
}

mt_status_t eq_serial_run(const eq_setup_t *s, double *losses, mt_model_t *out) {
    mt_model_t m = NULL;
    mt_acts_t a = NULL;
    mt_optim_t opt = NULL;
    int B = s->global_batch, T = s->seq_len;
    int32_t *tok = malloc((size_t)B * T * sizeof(int32_t)), *tgt = malloc((size_t)B * T * sizeof(int32_t));
    mt_status_t st = MT_OK;
    *out = NULL;
    MT_CHECK_GOTO(tok && tgt ? MT_OK : MT_ERR_OOM, st, exit);
    MT_CHECK_GOTO(mt_model_init(&s->model, &m), st, exit);
    MT_CHECK_GOTO(mt_model_alloc_params(m), st, exit);
    MT_CHECK_GOTO(mt_model_alloc_grads(m), st, exit);
    mt_model_init_weights(m);
    MT_CHECK_GOTO(mt_acts_init(m, B, T, &a), st, exit);
    MT_CHECK_GOTO(mt_optim_init(&s->optim, &opt), st, exit);
    MT_CHECK_GOTO(eq_optim_add_bound(opt, m, NULL), st, exit);
    for (int step = 0; step < s->steps; step++) {
        eq_batch(s, step, 0, B, tok, tgt);
        mt_model_zero_grads(m);
        float loss = 0.0f;
        MT_CHECK_GOTO(mt_model_step(m, a, tok, tgt, true, &loss), st, exit);
        losses[step] = loss;
        double sumsq = 0.0, norm = 0.0;
        for (int i = 0; i < mt_model_n_params(m); i++) {
            const mt_param_t *p = mt_model_param(m, i);
            sumsq += mt_clip_sumsq(p->grad, p->numel);
        }
        float coef = mt_clip_coef(sumsq, s->grad_clip, &norm);
        MT_CHECK_GOTO(mt_optim_step(opt, s->lr, coef), st, exit);
    }
    *out = m;
    m = NULL;
exit:
    mt_optim_free(opt);
    mt_acts_free(a);
    mt_model_free(m);
    free(tok);
    free(tgt);
    return st;
}

double eq_rel_err(const float *a, const float *b, size_t n) {
    double d = 0.0, r = 0.0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return sqrt(d) / fmax(sqrt(r), 1e-30);
}

bool eq_param_close(const char *name, const float *got, const float *ref, size_t n, int n_embd, double tol,
                    double key_bound, double *err) {
    size_t len = strlen(name), suf = strlen("attn.qkv.bias");
    if (len < suf || strcmp(name + len - suf, "attn.qkv.bias") != 0 || n != 3 * (size_t)n_embd) {
        *err = eq_rel_err(got, ref, n);
        return *err <= tol;
    }
    size_t C = (size_t)n_embd;
    double d = 0.0, r = 0.0;
    bool key_ok = true;
    for (size_t i = 0; i < n; i++) {
        if (i >= C && i < 2 * C) {
            key_ok = key_ok && fabs(got[i]) <= key_bound && fabs(ref[i]) <= key_bound;
            continue;
        }
        d += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        r += (double)ref[i] * ref[i];
    }
    *err = key_ok ? sqrt(d) / fmax(sqrt(r), 1e-30) : INFINITY;
    return key_ok && *err <= tol;
}

double eq_key_bound(const eq_setup_t *s) {
    return s->optim.kind == MT_OPTIM_ADAMW ? 1.1 * s->lr * s->steps : 1e-5;
}
