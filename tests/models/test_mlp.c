/* MLP: forward equals a double-precision composition of the reference ops, whole-model gradient check,
 * recompute = block identical with a lower activation peak, module-range execution, model FLOPs per token.
 * SPDX-License-Identifier: MIT */
#include <math.h>

#include "model_testutil.h"
#include "models/layers/layers_ref.h"
#include "runtime/alloc.h"

enum { B = 3, T = 4, H = 16, V = 9, L = 3 };

static mt_model_config_t cfg_mlp(mt_recompute_t rc) {
    mt_model_config_t c = MT_MODEL_CONFIG_INIT;
    c.kind = MT_MODEL_MLP;
    c.n_layer = L;
    c.n_embd = H;
    c.seq_len = T;
    c.vocab_size = V;
    c.recompute = rc;
    c.seed = 5;
    return c;
}

static double *pd(mt_model_t m, const char *name) {
    mt_param_t *p = mt_model_param(m, mt_model_find_param(m, name));
    double *d = malloc(p->numel * sizeof(double));
    for (size_t i = 0; i < p->numel; i++) {
        d[i] = p->data[i];
    }
    return d;
}

static double ref_loss(mt_model_t m, const int32_t *tok, const int32_t *tgt) {
    int N = B * T;
    double *x = malloc(sizeof(double) * N * H), *y = malloc(sizeof(double) * N * H),
           *lg = malloc(sizeof(double) * N * V);
    double *wte = pd(m, "wte");
    mt_embedding_ref(x, tok, wte, NULL, B, T, H);
    char nm[64];
    for (int l = 0; l < L; l++) {
        snprintf(nm, sizeof nm, "fc.%d.weight", l);
        double *w = pd(m, nm);
        snprintf(nm, sizeof nm, "fc.%d.bias", l);
        double *b = pd(m, nm);
        mt_matmul_ref(y, x, w, b, N, H, H);
        mt_gelu_ref(x, y, (size_t)N * H);
        free(w), free(b);
    }
    double *hw = pd(m, "head.weight"), *hb = pd(m, "head.bias");
    mt_matmul_ref(lg, x, hw, hb, N, H, V);
    double loss = mt_softmax_ce_ref(NULL, lg, tgt, N, V, V);
    free(x), free(y), free(lg), free(wte), free(hw), free(hb);
    return loss;
}

int main(void) {
    int32_t tok[B * T], tgt[B * T];
    tm_data(tok, tgt, B * T, V, 5, 11);
    mt_model_config_t c0 = cfg_mlp(MT_RECOMPUTE_NONE), c1 = cfg_mlp(MT_RECOMPUTE_BLOCK);
    mt_model_t m0 = tm_build(&c0), m1 = tm_build(&c1);
    CHECK(mt_model_n_modules(m0) == L + 2, "embedding + %d layers + head", L);
    /* model FLOPs: 6 x the weights of the products (the hidden layers and the head), not wte's lookup */
    CHECK_CLOSE(mt_model_flops_per_token(m0, T), 6.0 * (L * (H * H + H) + V * H + V), 1e-12, 0);
    mt_acts_t a0, a1;
    mt_mem_stats_t s;
    mt_mem_stats(MT_MEM_HOST, &s);
    int64_t base = s.current[MT_MEM_ACTIVATIONS];
    mt_mem_reset_peak(MT_MEM_HOST);
    CHECK_OK(mt_acts_init(m0, B, T, &a0));
    float l0, l1;
    CHECK_OK(mt_model_step(m0, a0, tok, tgt, true, &l0));
    mt_mem_stats(MT_MEM_HOST, &s);
    int64_t peak0 = s.peak[MT_MEM_ACTIVATIONS] - base;
    base = s.current[MT_MEM_ACTIVATIONS];
    mt_mem_reset_peak(MT_MEM_HOST);
    CHECK_OK(mt_acts_init(m1, B, T, &a1));
    CHECK_OK(mt_model_step(m1, a1, tok, tgt, true, &l1));
    mt_mem_stats(MT_MEM_HOST, &s);
    int64_t peak1 = s.peak[MT_MEM_ACTIVATIONS] - base;
    CHECK_CLOSE(l0, ref_loss(m0, tok, tgt), 1e-5, 0);
    CHECK(l0 == l1 && memcmp(mt_model_grads_flat(m0), mt_model_grads_flat(m1), mt_model_numel(m0) * 4) == 0,
          "recompute=block: identical loss and gradients");
    CHECK(peak1 < peak0, "recompute=block lowers the activation peak: %lld vs %lld", (long long)peak1,
          (long long)peak0);
    tm_grad_check(m0, a0, tok, tgt, 1e-3, 2e-4);
    tm_grad_check(m1, a1, tok, tgt, 1e-3, 2e-4);
    /* module ranges */
    float *gfull = tm_grads_copy(m0);
    int n = mt_model_n_modules(m0);
    float act[B * T * H], grad[B * T * H], lk;
    mt_acts_t s1, s2;
    CHECK_OK(mt_acts_init(m0, B, T, &s1));
    CHECK_OK(mt_acts_init(m0, B, T, &s2));
    mt_model_zero_grads(m0);
    CHECK_OK(mt_model_step(m0, a0, tok, tgt, true, &l0));
    memcpy(gfull, mt_model_grads_flat(m0), mt_model_numel(m0) * 4);
    mt_model_zero_grads(m0);
    CHECK_OK(mt_model_forward(m0, s1, 0, 2, tok, NULL, NULL, act, NULL));
    CHECK_OK(mt_model_forward(m0, s2, 2, n, NULL, tgt, act, NULL, &lk));
    CHECK_OK(mt_model_backward(m0, s2, 2, n, NULL, grad, 1.0f));
    CHECK_OK(mt_model_backward(m0, s1, 0, 2, grad, NULL, 1.0f));
    CHECK(lk == l0 && memcmp(gfull, mt_model_grads_flat(m0), mt_model_numel(m0) * 4) == 0,
          "split [0,2) + [2,n) equals [0,n)");
    free(gfull);
    mt_acts_free(s1), mt_acts_free(s2), mt_acts_free(a0), mt_acts_free(a1);
    mt_model_free(m0), mt_model_free(m1);
    return mt_test_finish("test_mlp");
}
