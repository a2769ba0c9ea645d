/* model.* config keys -> model config; model.init = "llmc:PATH": the architecture from the checkpoint,
 * a contradicting key an error naming both values, weights loaded bit-exact; a bad model.init refused.
 * SPDX-License-Identifier: MIT */
#include <unistd.h>

#include "model_testutil.h"
#include "models/llmc.h"
#include "models/model_config.h"

static mt_config_t *load(int n, char **over) {
    mt_config_t *c = NULL;
    mt_status_t st = mt_config_load(NULL, n, over, 0, &c, stderr);
    CHECK(st == MT_OK, "config load: %s", mt_last_error_msg());
    return c;
}

int main(void) {
    char *o1[] = {"--model.kind=mlp",        "--model.n_layer=3",           "--model.n_embd=32",
                  "--model.recompute=block", "--model.attn_recompute=true", "--train.seed=77",
                  "--model.vocab_size=50"};
    mt_config_t *c = load(7, o1);
    mt_model_config_t mc;
    CHECK_OK(mt_model_config_from(c, &mc));
    CHECK(mc.kind == MT_MODEL_MLP && mc.n_layer == 3 && mc.n_embd == 32 && mc.recompute == MT_RECOMPUTE_BLOCK &&
              mc.attn_recompute && mc.seed == 77 && mc.vocab_size == 50,
          "keys mapped");
    mt_config_free(c);

    /* an llm.c checkpoint decides the architecture */
    char path[128], arg[160];
    snprintf(path, sizeof path, "/tmp/mt_test_model_config_%d.bin", (int)getpid());
    mt_model_config_t g = MT_MODEL_CONFIG_INIT;
    g.n_layer = 2;
    g.n_head = 2;
    g.n_embd = 16;
    g.seq_len = 8;
    g.vocab_size = 40;
    g.seed = 3;
    mt_model_t src = tm_build(&g);
    CHECK_OK(mt_llmc_save(src, path));
    snprintf(arg, sizeof arg, "--model.init=llmc:%s", path);
    char *o2[] = {arg};
    c = load(1, o2);
    CHECK_OK(mt_model_config_from(c, &mc));
    CHECK(mc.n_layer == 2 && mc.n_head == 2 && mc.n_embd == 16 && mc.seq_len == 8 && mc.vocab_size == 40 &&
              mc.padded_vocab == 128,
          "architecture from the header (n_layer %d, n_embd %d, padded %d)", mc.n_layer, mc.n_embd, mc.padded_vocab);
    mt_model_t m;
    CHECK_OK(mt_model_init(&mc, &m));
    CHECK_OK(mt_model_alloc_params(m));
    CHECK_OK(mt_model_init_from_config(m, c));
    CHECK(memcmp(mt_model_params_flat(m), mt_model_params_flat(src), mt_model_numel(m) * 4) == 0, "weights loaded");
    mt_model_free(m);
    mt_config_free(c);
    char *o3[] = {arg, "--model.n_layer=5"};
    c = load(2, o3);
    CHECK(mt_model_config_from(c, &mc) == MT_ERR_INVALID_ARG && strstr(mt_last_error_msg(), "model.n_layer = 5") &&
              strstr(mt_last_error_msg(), "n_layer = 2"),
          "contradiction: %s", mt_last_error_msg());
    mt_config_free(c);
    char *o4[] = {"--model.init=checkpoint.bin"};
    c = load(1, o4);
    CHECK(mt_model_config_from(c, &mc) == MT_ERR_INVALID_ARG && strstr(mt_last_error_msg(), "llmc:PATH"),
          "bad model.init: %s", mt_last_error_msg());
    mt_config_free(c);
    /* the keys alone (what the training loop's mt_job_model_config gives): no file read */
    c = load(2, o3);
    mt_model_config_keys(c, &mc);
    CHECK(mc.n_layer == 5 && mt_model_config_llmc_path(c) && !strcmp(mt_model_config_llmc_path(c), path),
          "keys without the header: n_layer %d", mc.n_layer);
    mt_config_free(c);
    /* a GPT-2 checkpoint for an MLP, and an empty path, are refused naming the key */
    char *o5[] = {arg, "--model.kind=mlp"};
    c = load(2, o5);
    CHECK(mt_model_config_from(c, &mc) == MT_ERR_INVALID_ARG && strstr(mt_last_error_msg(), "model.kind = \"mlp\""),
          "llmc for an mlp: %s", mt_last_error_msg());
    mt_config_free(c);
    char *o6[] = {"--model.init=llmc:"};
    c = load(1, o6);
    CHECK(mt_model_config_from(c, &mc) == MT_ERR_INVALID_ARG && !mt_model_config_llmc_path(c),
          "empty llmc path: %s", mt_last_error_msg());
    mt_config_free(c);
    unlink(path);
    mt_model_free(src);
    return mt_test_finish("test_model_config");
}
