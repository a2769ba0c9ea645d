/* The shared driver: per step, zero gradients; per micro-batch, forward and backward with the loss
 * gradient scaled by 1/grad_accum; clip by the global norm; optimizer step. Rank r of N takes rows
 * [r*B/N, (r+1)*B/N) of the step's global batch, micro-batch k of those its k-th contiguous part; DP's
 * root loads every rank's rows and scatters them.
 * SPDX-License-Identifier: MIT */
#include "driver.h"

#include <stdlib.h>
#include <string.h>

#include "models/data/data.h"
#include "runtime/alloc.h"

void drv_cfg_gpt2_tiny(drv_cfg_t *c) {
    memset(c, 0, sizeof(*c));
    mt_model_config_t m = MT_MODEL_CONFIG_INIT;
    m.kind = MT_MODEL_GPT2;
    m.n_layer = 2;
    m.n_head = 2;
    m.n_embd = 32;
    m.seq_len = 16;
    m.vocab_size = 96;
    m.seed = 7;
    c->model = m;
    mt_optim_params_t o = MT_OPTIM_PARAMS_INIT;
    c->optim = o;
    c->global_batch = 24;
    c->grad_accum = 2;
    c->seq_len = 16;
    c->steps = 5;
    c->lr = 1e-2f;
    c->clip = 0.0f;
    c->data_seed = 11;
}

void drv_cfg_mlp_tiny(drv_cfg_t *c) {
    drv_cfg_gpt2_tiny(c);
    c->model.kind = MT_MODEL_MLP;
    c->model.n_layer = 2;
    c->model.n_embd = 29;
    c->model.vocab_size = 37;
    c->model.padded_vocab = 37; /* odd sizes: 3923 parameters, divisible by none of 2, 3, 4 */
    c->seq_len = 8;
    c->model.seq_len = 8;
}

void drv_result_free(drv_result_t *r) {
    mt_free(r->params);
    r->params = NULL;
}

static mt_status_t open_data(const drv_cfg_t *c, mt_data_t *d) {
    mt_data_params_t p = MT_DATA_PARAMS_INIT;
    p.kind = MT_DATA_SYNTHETIC;
    p.seed = c->data_seed;
    p.global_batch = c->global_batch;
    p.seq_len = c->seq_len;
    p.vocab_size = c->model.vocab_size;
    p.prefetch = false;
    p.what = "test data";
    return mt_data_open(&p, d);
}

/* rows [row0, row0 + n) of step's global batch as inputs and targets (n x T each). */
static mt_status_t load_rows(mt_data_t d, const drv_cfg_t *c, int step, int row0, int n, int32_t *win, int32_t *tok,
                             int32_t *tgt) {
    int T = c->seq_len;
    MT_CHECK(mt_data_global_rows(d, step, row0, n, win));
    for (int i = 0; i < n; i++) {
        memcpy(tok + (size_t)i * T, win + (size_t)i * (T + 1), (size_t)T * sizeof(int32_t));
        memcpy(tgt + (size_t)i * T, win + (size_t)i * (T + 1) + 1, (size_t)T * sizeof(int32_t));
    }
    return MT_OK;
}

typedef struct {
    mt_model_t model;
    mt_acts_t acts;
    mt_data_t data;
    int32_t *win, *tok, *tgt, *gtok, *gtgt;
} drv_state_t;

static void state_free(drv_state_t *s) {
    mt_acts_free(s->acts);
    mt_data_close(s->data);
    mt_free(s->win);
    mt_free(s->tok);
    mt_free(s->tgt);
    mt_free(s->gtok);
    mt_free(s->gtgt);
}

static mt_status_t state_init(const drv_cfg_t *c, mt_model_t model, int rows_total, int mb, drv_state_t *s) {
    memset(s, 0, sizeof(*s));
    s->model = model;
    size_t T = (size_t)c->seq_len;
    MT_CHECK(mt_acts_init(model, mb, c->seq_len, &s->acts));
    MT_CHECK(open_data(c, &s->data));
    s->win = mt_alloc((size_t)rows_total * (T + 1) * sizeof(int32_t), MT_MEM_OTHER, "test batch");
    s->tok = mt_alloc((size_t)mb * T * sizeof(int32_t), MT_MEM_OTHER, "test batch");
    s->tgt = mt_alloc((size_t)mb * T * sizeof(int32_t), MT_MEM_OTHER, "test batch");
    s->gtok = mt_alloc((size_t)rows_total * T * sizeof(int32_t), MT_MEM_OTHER, "test batch");
    s->gtgt = mt_alloc((size_t)rows_total * T * sizeof(int32_t), MT_MEM_OTHER, "test batch");
    if (!s->win || !s->tok || !s->tgt || !s->gtok || !s->gtgt) {
        return mt_error(MT_ERR_OOM, "test driver: out of memory");
    }
    return MT_OK;
}

mt_status_t drv_run_serial(const drv_cfg_t *c, drv_result_t *r) {
    memset(r, 0, sizeof(*r));
    mt_model_t model = NULL;
    mt_optim_t opt = NULL;
    drv_state_t s;
    memset(&s, 0, sizeof(s));
    mt_status_t st = MT_OK;
    int ga = c->grad_accum, mb = c->global_batch / ga, n = 0;
    MT_CHECK_GOTO(mt_model_init(&c->model, &model), st, out);
    n = mt_model_n_modules(model);
    MT_CHECK_GOTO(mt_model_alloc_params(model), st, out);
    MT_CHECK_GOTO(mt_model_alloc_grads(model), st, out);
    mt_model_init_weights(model);
    MT_CHECK_GOTO(mt_optim_init(&c->optim, &opt), st, out);
    for (int i = 0; i < mt_model_n_params(model); i++) {
        mt_param_t *p = mt_model_param(model, i);
        MT_CHECK_GOTO(mt_optim_add(opt, p->name, p->data, p->grad, p->numel, p->is_weight2d, NULL), st, out);
    }
    MT_CHECK_GOTO(state_init(c, model, c->global_batch, mb, &s), st, out);
    double t0 = mt_now();
    for (int step = 0; step < c->steps; step++) {
        mt_model_zero_grads(model);
        double loss = 0.0;
        for (int k = 0; k < ga; k++) {
            float l = 0.0f;
            MT_CHECK_GOTO(load_rows(s.data, c, step, k * mb, mb, s.win, s.tok, s.tgt), st, out);
            MT_CHECK_GOTO(mt_model_forward(model, s.acts, 0, n, s.tok, s.tgt, NULL, NULL, &l), st, out);
            MT_CHECK_GOTO(mt_model_backward(model, s.acts, 0, n, NULL, NULL, 1.0f / (float)ga), st, out);
            loss += l;
        }
        double sumsq = 0.0, norm = 0.0;
        for (int i = 0; i < mt_model_n_params(model); i++) {
            sumsq += mt_clip_sumsq(mt_model_param(model, i)->grad, mt_model_param(model, i)->numel);
        }
        float coef = mt_clip_coef(sumsq, c->clip, &norm);
        MT_CHECK_GOTO(mt_optim_step(opt, c->lr, coef), st, out);
        r->loss[step] = loss / ga;
        r->norm[step] = norm;
    }
    r->seconds = mt_now() - t0;
    r->steps = c->steps;
    r->numel = mt_model_numel(model);
    r->params = mt_alloc(r->numel * sizeof(float), MT_MEM_OTHER, "test result");
    if (!r->params) {
        st = mt_error(MT_ERR_OOM, "test driver: out of memory");
        goto out;
    }
    memcpy(r->params, mt_model_params_flat(model), r->numel * sizeof(float));
out:
    state_free(&s);
    mt_optim_free(opt);
    mt_model_free(model);
    return st;
}

mt_status_t drv_run_engine(const drv_cfg_t *c, mt_comm_t dp, const mt_engine_params_t *ep_in, drv_result_t *r) {
    memset(r, 0, sizeof(*r));
    int N = mt_comm_size(dp), rank = mt_comm_rank(dp), ga = c->grad_accum;
    if (c->global_batch % (N * ga) != 0) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "test driver: global batch %d does not split over %d ranks x %d micro-batches", c->global_batch,
                        N, ga);
    }
    int rows = c->global_batch / N, mb = rows / ga;
    size_t T = (size_t)c->seq_len;
    mt_engine_params_t ep = *ep_in;
    ep.grad_accum = ga;
    ep.optim = c->optim;
    mt_model_t model = NULL;
    mt_engine_t e = NULL;
    float *act = NULL, *dact = NULL;
    drv_state_t s;
    memset(&s, 0, sizeof(s));
    mt_status_t st = MT_OK;
    MT_CHECK_GOTO(mt_model_init(&c->model, &model), st, out);
    int n = mt_model_n_modules(model);
    mt_mem_stats(MT_MEM_HOST, &r->mem_base);
    MT_CHECK_GOTO(mt_engine_init(model, dp, &ep, &e), st, out);
    bool scatter = mt_engine_root_loads_batch(e);
    MT_CHECK_GOTO(state_init(c, model, scatter ? N * mb : mb, mb, &s), st, out);
    if (c->split_at > 0) {
        size_t nact = (size_t)mb * T * (size_t)mt_model_act_width(model);
        act = mt_alloc(nact * sizeof(float), MT_MEM_OTHER, "test stage activations");
        dact = mt_alloc(nact * sizeof(float), MT_MEM_OTHER, "test stage activations");
        if (!act || !dact) {
            st = mt_error(MT_ERR_OOM, "test driver: out of memory");
            goto out;
        }
    }
    double t0 = mt_now();
    for (int step = 0; step < c->steps; step++) {
        MT_CHECK_GOTO(mt_engine_zero_grads(e), st, out);
        double loss = 0.0;
        for (int k = 0; k < ga; k++) {
            if (scatter) {
                /* The root loads micro-batch k of every rank (rank q's rows at q*mb) and scatters it. */
                for (int q = 0; rank == 0 && q < N; q++) {
                    MT_CHECK_GOTO(load_rows(s.data, c, step, q * rows + k * mb, mb, s.win, s.gtok + (size_t)q * mb * T,
                                            s.gtgt + (size_t)q * mb * T),
                                  st, out);
                }
                MT_CHECK_GOTO(mt_engine_scatter_batch(e, rank == 0 ? s.gtok : NULL, s.tok, (size_t)mb * T), st, out);
                MT_CHECK_GOTO(mt_engine_scatter_batch(e, rank == 0 ? s.gtgt : NULL, s.tgt, (size_t)mb * T), st, out);
            } else {
                MT_CHECK_GOTO(load_rows(s.data, c, step, rank * rows + k * mb, mb, s.win, s.tok, s.tgt), st, out);
            }
            float l = 0.0f;
            if (c->split_at > 0) {
                int k0 = c->split_at;
                MT_CHECK_GOTO(mt_model_forward(model, s.acts, 0, k0, s.tok, NULL, NULL, act, NULL), st, out);
                MT_CHECK_GOTO(mt_model_forward(model, s.acts, k0, n, NULL, s.tgt, act, NULL, &l), st, out);
                MT_CHECK_GOTO(mt_model_backward(model, s.acts, k0, n, NULL, dact, 1.0f / (float)ga), st, out);
                MT_CHECK_GOTO(mt_model_backward(model, s.acts, 0, k0, dact, NULL, 1.0f / (float)ga), st, out);
            } else {
                MT_CHECK_GOTO(mt_model_forward(model, s.acts, 0, n, s.tok, s.tgt, NULL, NULL, &l), st, out);
                MT_CHECK_GOTO(mt_model_backward(model, s.acts, 0, n, NULL, NULL, 1.0f / (float)ga), st, out);
            }
            loss += l;
        }
        loss /= ga;
        MT_CHECK_GOTO(mt_engine_finish_grads(e), st, out);
        double sumsq = 0.0, norm = 0.0;
        MT_CHECK_GOTO(mt_engine_grad_sumsq(e, &sumsq), st, out);
        float coef = mt_clip_coef(sumsq, c->clip, &norm);
        MT_CHECK_GOTO(mt_engine_reduce_loss(e, &loss), st, out);
        MT_CHECK_GOTO(mt_engine_step(e, c->lr, coef), st, out);
        r->loss[step] = loss;
        r->norm[step] = norm;
        mt_engine_comm_stats(e, &r->comm[step]);
    }
    r->seconds = mt_now() - t0;
    r->steps = c->steps;
    r->numel = mt_model_numel(model);
    mt_engine_mem(e, &r->mem);
    mt_mem_stats(MT_MEM_HOST, &r->mem_end);
    r->params = mt_alloc(r->numel * sizeof(float), MT_MEM_OTHER, "test result");
    if (!r->params) {
        st = mt_error(MT_ERR_OOM, "test driver: out of memory");
        goto out;
    }
    MT_CHECK_GOTO(mt_engine_gather_params(e, 0, r->params), st, out);
    for (int q = 0; c->replica_sums && q < N; q++) {
        float *buf = q == 0 ? r->params : (float *)s.win; /* reuse: only the sum is kept */
        if (q != 0 && q == rank) {
            buf = mt_alloc(r->numel * sizeof(float), MT_MEM_OTHER, "test replica");
            if (!buf) {
                st = mt_error(MT_ERR_OOM, "test driver: out of memory");
                goto out;
            }
        }
        st = mt_engine_gather_params(e, q, q == rank ? buf : NULL);
        if (st == MT_OK && q == rank) {
            double sum = 0.0;
            for (size_t i = 0; i < r->numel; i++) {
                sum += (double)buf[i] * (double)(1 + i % 7);
            }
            r->replica_sum = sum;
        }
        if (q != 0 && q == rank) {
            mt_free(buf);
        }
        MT_CHECK_GOTO(st, st, out);
    }
out:
    mt_free(act);
    mt_free(dact);
    state_free(&s);
    mt_engine_free(e);
    mt_model_free(model);
    return st;
}
