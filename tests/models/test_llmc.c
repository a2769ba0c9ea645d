/* llm.c checkpoints: export -> import bit-exact, the file layout (header, tensor order grouped by kind),
 * the architecture from the header with contradicting config values named, and malformed files
 * (bad magic, wrong version, truncated, trailing bytes, absurd sizes) rejected with clear errors
 * and without allocating.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <unistd.h>

#include "model_testutil.h"
#include "models/llmc.h"
#include "runtime/alloc.h"

static mt_model_config_t cfg_small(uint64_t seed) {
    mt_model_config_t c = MT_MODEL_CONFIG_INIT;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 8;
    c.seq_len = 6;
    c.vocab_size = 11;
    c.padded_vocab = 16;
    c.seed = seed;
    return c;
}

static char path[256];

static void write_file(const char *p, const void *data, size_t n) {
    FILE *f = fopen(p, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
}

static void *read_all(const char *p, size_t *n) {
    FILE *f = fopen(p, "rb");
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *d = malloc(*n);
    if (fread(d, 1, *n, f) != *n) {
        *n = 0;
    }
    fclose(f);
    return d;
}

static void expect_bad(const char *what, const void *data, size_t n, const char *needle) {
    char bad[300];
    snprintf(bad, sizeof bad, "%s.bad", path);
    write_file(bad, data, n);
    mt_llmc_header_t h;
    mt_mem_stats_t s0, s1;
    mt_mem_stats(MT_MEM_HOST, &s0);
    mt_status_t st = mt_llmc_read_header(bad, &h);
    mt_mem_stats(MT_MEM_HOST, &s1);
    CHECK(st == MT_ERR_INVALID_ARG && strstr(mt_last_error_msg(), needle) != NULL, "%s: %s (%s)", what,
          mt_status_str(st), mt_last_error_msg());
    CHECK(s1.n_allocs == s0.n_allocs, "%s: nothing allocated", what);
    unlink(bad);
}

int main(void) {
    snprintf(path, sizeof path, "/tmp/mt_test_llmc_%d.bin", (int)getpid());
    mt_model_config_t c = cfg_small(1);
    mt_model_t m = tm_build(&c);
    CHECK_OK(mt_llmc_save(m, path));
    size_t n;
    int32_t *file = read_all(path, &n);
    int64_t C = 8, L = 2, Vp = 16, maxT = 6;
    int64_t floats = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C;
    CHECK(n == (size_t)(1024 + 4 * floats), "file size %zu", n);
    CHECK(file[0] == 20240326 && file[1] == 3 && file[2] == 6 && file[3] == 11 && file[4] == 2 && file[5] == 2 &&
              file[6] == 8 && file[7] == 16 && file[8] == 0,
          "header");
    /* grouped by kind over layers: qkvw of layer 1 follows qkvw of layer 0, after wte, wpe, ln1w, ln1b */
    const float *params = (const float *)(file + 256);
    size_t off = (size_t)(Vp * C + maxT * C + 2 * L * C + 3 * C * C);
    mt_param_t *q1 = mt_model_param(m, mt_model_find_param(m, "h.1.attn.qkv.weight"));
    CHECK(memcmp(params + off, q1->data, q1->numel * 4) == 0, "h.1 qkv weight at llm.c's offset");
    /* every tensor at the offset llm.c's fill_in_parameter_sizes implies, layer by layer */
    {
        static const char *kind[16] = {"wte", "wpe", "ln_1.weight", "ln_1.bias", "attn.qkv.weight",
                                       "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias", "ln_2.weight",
                                       "ln_2.bias", "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight",
                                       "mlp.proj.bias", "ln_f.weight", "ln_f.bias"};
        int64_t per[16] = {Vp * C, maxT * C, C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C,
                           C, C};
        int64_t at = 0;
        int placed = 0;
        for (int k = 0; k < 16; k++) {
            int layers = (k >= 2 && k <= 13) ? (int)L : 1;
            for (int l = 0; l < layers; l++) {
                char nm[64];
                if (layers > 1) {
                    snprintf(nm, sizeof nm, "h.%d.%s", l, kind[k]);
                } else {
                    snprintf(nm, sizeof nm, "%s", kind[k]);
                }
                mt_param_t *p = mt_model_param(m, mt_model_find_param(m, nm));
                placed += p && (int64_t)p->numel == per[k] && memcmp(params + at, p->data, p->numel * 4) == 0;
                at += per[k];
            }
        }
        CHECK(placed == 2 + 12 * (int)L + 2 && at == floats, "every tensor at llm.c's offset (%d placed)", placed);
    }
    mt_param_t *lnfb = mt_model_param(m, mt_model_find_param(m, "ln_f.bias"));
    lnfb->data[3] = 0.25f;
    CHECK_OK(mt_llmc_save(m, path));
    free(file);
    file = read_all(path, &n);
    params = (const float *)(file + 256);
    CHECK(params[floats - 8 + 3] == 0.25f, "ln_f.bias is last");
    /* round trip into a differently initialised model: bit-exact */
    mt_model_config_t c2 = cfg_small(99);
    mt_model_t m2 = tm_build(&c2);
    CHECK(memcmp(mt_model_params_flat(m2), mt_model_params_flat(m), mt_model_numel(m) * 4) != 0, "differs before");
    CHECK_OK(mt_llmc_load(m2, path));
    CHECK(memcmp(mt_model_params_flat(m2), mt_model_params_flat(m), mt_model_numel(m) * 4) == 0,
          "export -> import is bit-exact");
    char path2[300];
    snprintf(path2, sizeof path2, "%s.2", path);
    CHECK_OK(mt_llmc_save(m2, path2));
    size_t n2;
    void *file2 = read_all(path2, &n2);
    CHECK(n2 == n && memcmp(file2, file, n) == 0, "import -> export reproduces the file byte for byte");
    free(file2);
    unlink(path2);
    /* the architecture comes from the header */
    mt_llmc_header_t h;
    CHECK_OK(mt_llmc_read_header(path, &h));
    mt_model_config_t u = MT_MODEL_CONFIG_INIT;
    CHECK_OK(mt_llmc_apply_header(&h, path, 0, &u));
    CHECK(u.n_layer == 2 && u.n_head == 2 && u.n_embd == 8 && u.seq_len == 6 && u.vocab_size == 11 &&
              u.padded_vocab == 16,
          "config from the header");
    u = (mt_model_config_t)MT_MODEL_CONFIG_INIT;
    u.n_layer = 6;
    CHECK(mt_llmc_apply_header(&h, path, MT_LLMC_SET_N_LAYER, &u) == MT_ERR_INVALID_ARG &&
              strstr(mt_last_error_msg(), "model.n_layer = 6") && strstr(mt_last_error_msg(), "n_layer = 2"),
          "contradiction names both values: %s", mt_last_error_msg());
    u = (mt_model_config_t)MT_MODEL_CONFIG_INIT;
    u.n_layer = 2;
    CHECK_OK(mt_llmc_apply_header(&h, path, MT_LLMC_SET_N_LAYER, &u));
    /* a model of another shape refuses the file */
    mt_model_config_t c3 = cfg_small(1);
    c3.n_embd = 16;
    mt_model_t m3 = tm_build(&c3);
    CHECK(mt_llmc_load(m3, path) == MT_ERR_INVALID_ARG && strstr(mt_last_error_msg(), "n_embd"), "shape mismatch: %s",
          mt_last_error_msg());
    mt_model_free(m3);
    /* malformed files */
    int32_t *bad = malloc(n);
    memcpy(bad, file, n);
    bad[0] = 20240520;
    expect_bad("bad magic", bad, n, "bad magic");
    memcpy(bad, file, n);
    bad[1] = 5;
    expect_bad("version", bad, n, "version 5");
    expect_bad("truncated data", file, n - 4, "truncated");
    expect_bad("truncated header", file, 100, "truncated header");
    memcpy(bad, file, n);
    bad[4] = 1000000;
    expect_bad("absurd n_layer", bad, n, "n_layer = 1000000");
    memcpy(bad, file, n);
    bad[6] = 65536;
    bad[5] = 1;
    expect_bad("huge but in range", bad, n, "truncated");
    memcpy(bad, file, n);
    bad[7] = 5;
    expect_bad("padded < vocab", bad, n, "padded_vocab_size");
    void *longer = calloc(1, n + 4);
    memcpy(longer, file, n);
    expect_bad("trailing bytes", longer, n + 4, "trailing");
    free(longer);
    CHECK(mt_llmc_read_header("/nonexistent/x.bin", &h) == MT_ERR_IO, "missing file");
    mt_model_config_t cm = MT_MODEL_CONFIG_INIT;
    cm.kind = MT_MODEL_MLP;
    mt_model_t mm = tm_build(&cm);
    CHECK(mt_llmc_save(mm, path2) == MT_ERR_INVALID_USAGE, "an MLP cannot be exported as GPT-2");
    mt_model_free(mm);
    free(bad);
    free(file);
    unlink(path);
    mt_model_free(m);
    mt_model_free(m2);
    return mt_test_finish("test_llmc");
}
