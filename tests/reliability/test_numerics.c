/* Non-finite detection: the finiteness checks on every kind of bad value, the per-module gradient scan
 * on a real GPT-2 backward (an injected NaN names its module; a NaN loss names the head, where backward
 * starts), the NaN test knob, and the verdict every rank agrees on (1 and 4 ranks).
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/grad_check.h"
#include "models/model.h"
#include "runtime/numerics.h"
#include "runtime/rt.h"
#include "testutil.h"

static void finite_checks(void) {
    enum { N = 10007 };
    static float x[N];
    for (int i = 0; i < N; i++) {
        x[i] = (float)(i % 17) * 1e30f - 3e31f; /* large but finite */
    }
    x[5] = 1e-42f; /* subnormal */
    CHECK(mt_f32_all_finite(x, N), "finite buffer");
    CHECK(mt_f32_first_nonfinite(x, N) == N, "no index");
    CHECK(mt_f32_all_finite(x, 0) && mt_f32_first_nonfinite(x, 0) == 0, "empty");
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    const size_t at[4] = {0, 4095, 4096, N - 1}; /* block edges of the blocked check */
    for (int b = 0; b < 3; b++) {
        for (int k = 0; k < 4; k++) {
            float keep = x[at[k]];
            x[at[k]] = bad[b];
            CHECK(!mt_f32_all_finite(x, N), "value %g at %zu not caught", (double)bad[b], at[k]);
            CHECK(mt_f32_first_nonfinite(x, N) == at[k], "index of %g: %zu", (double)bad[b],
                  mt_f32_first_nonfinite(x, N));
            x[at[k]] = keep;
        }
    }
}

static mt_model_t tiny_gpt2(void) {
    mt_model_config_t c = MT_MODEL_CONFIG_INIT;
    c.kind = MT_MODEL_GPT2;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 16;
    c.seq_len = 8;
    c.vocab_size = 32;
    c.padded_vocab = 32;
    mt_model_t m = NULL;
    CHECK_OK(mt_model_init(&c, &m));
    CHECK_OK(mt_model_alloc_params(m));
    CHECK_OK(mt_model_alloc_grads(m));
    mt_model_init_weights(m);
    return m;
}

static float run_step(mt_model_t m, mt_acts_t a) {
    int32_t tok[2 * 8], tgt[2 * 8];
    for (int i = 0; i < 16; i++) {
        tok[i] = (i * 7) % 32;
        tgt[i] = (i * 5 + 1) % 32;
    }
    mt_model_zero_grads(m);
    float loss = 0;
    CHECK_OK(mt_model_step(m, a, tok, tgt, true, &loss));
    return loss;
}

static void scan_checks(int rank) {
    mt_model_t m = tiny_gpt2();
    mt_acts_t a = NULL;
    CHECK_OK(mt_acts_init(m, 2, 8, &a));
    float loss = run_step(m, a);
    char name[64];
    CHECK(isfinite(loss), "loss %g", loss);
    CHECK(mt_model_first_nonfinite_grad(m, name, sizeof(name)) == -1 && name[0] == '\0', "healthy step: %s", name);
    /* The knob: MESHTRAIN_TEST_NAN_STEP=3, MODULE=block.0, RANK=-1 set in main. */
    CHECK(!mt_model_test_inject_nan(m, 2, rank), "not at step 2");
    CHECK(mt_model_test_inject_nan(m, 3, rank), "at step 3");
    int mod = mt_model_first_nonfinite_grad(m, name, sizeof(name));
    CHECK(mod == 1 && !strcmp(mt_model_module_name(m, mod), "block.0") && !strcmp(name, "h.0.ln_1.weight"),
          "injected: module %d (%s), param %s", mod, mt_model_module_name(m, mod), name);
    /* A NaN weight in block 1: the loss goes NaN, backward starts non-finite at the head. */
    run_step(m, a);
    int q = mt_model_find_param(m, "h.1.mlp.fc.weight");
    CHECK(q >= 0, "param found");
    mt_model_param(m, q)->data[3] = NAN;
    loss = run_step(m, a);
    mod = mt_model_first_nonfinite_grad(m, name, sizeof(name));
    CHECK(isnan(loss), "loss %g", loss);
    CHECK(mod == mt_model_n_modules(m) - 1, "NaN loss: first module %d (%s), expected the head", mod,
          mt_model_module_name(m, mod));
    mt_acts_free(a);
    mt_model_free(m);
}

static void agree_checks(void) {
    const mt_world_t *w = mt_rt_world();
    mt_nan_verdict_t v;
    CHECK_OK(mt_nan_agree(w->comm, true, -1, &v));
    CHECK(v.finite && v.module == -1 && v.rank == -1 && v.n_bad_ranks == 0, "all finite");
    /* Odd ranks see a NaN in module = their rank (rank 0 alone when there is one rank). */
    bool bad = w->size == 1 || w->rank % 2 == 1;
    CHECK_OK(mt_nan_agree(w->comm, !bad, bad ? w->rank + 1 : -1, &v));
    int expect_rank = w->size == 1 ? 0 : (w->size % 2 == 0 ? w->size - 1 : w->size - 2);
    CHECK(!v.finite && v.module == expect_rank + 1 && v.rank == expect_rank, "verdict module %d rank %d", v.module,
          v.rank);
    CHECK(v.n_bad_ranks == (w->size == 1 ? 1 : w->size / 2), "bad ranks %d", v.n_bad_ranks);
    /* A non-finite loss with no module known. */
    CHECK_OK(mt_nan_agree(w->comm, w->rank != w->size - 1, -1, &v));
    CHECK(!v.finite && v.module == -1 && v.rank == w->size - 1 && v.n_bad_ranks == 1, "loss only: rank %d", v.rank);
    char msg[2048];
    mt_nan_verdict_t vv = {false, 2, 3, 1};
    mt_nan_describe(msg, sizeof(msg), 7, NAN, INFINITY, &vv, "block.1", "/ckpt/step-000005");
    CHECK(strstr(msg, "step 7:") && strstr(msg, "module 2 'block.1' (rank 3") &&
              strstr(msg, "last good checkpoint: /ckpt/step-000005") && strstr(msg, "without writing a checkpoint"),
          "%s", msg);
    mt_nan_describe(msg, sizeof(msg), 1, NAN, NAN, &vv, "block.1", NULL);
    CHECK(strstr(msg, "no checkpoint written yet") != NULL, "%s", msg);
}

int main(int argc, char **argv) {
    setenv("MESHTRAIN_TEST_NAN_STEP", "3", 1);
    setenv("MESHTRAIN_TEST_NAN_MODULE", "block.0", 1);
    setenv("MESHTRAIN_TEST_NAN_RANK", "-1", 1);
    CHECK_OK(mt_rt_init(&argc, &argv));
    finite_checks();
    scan_checks(mt_rt_world()->rank);
    agree_checks();
    return mt_test_finish_mpi("numerics");
}
