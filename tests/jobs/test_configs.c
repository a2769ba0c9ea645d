/* Every ready job in launch/configs/ is a valid configuration for the world it is written for, and the
 * GPT-2 124M config has the published size (124,475,904 parameters with the vocabulary padded to 50304,
 * the count llm.c prints).
 * SPDX-License-Identifier: MIT */
#include <stdio.h>

#include "train/job.h"
#include "testutil.h"

static mt_config_t *load(const char *dir, const char *name, int world) {
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    mt_config_t *cfg = NULL;
    mt_status_t st = mt_config_load(path, 0, NULL, world, &cfg, stderr);
    CHECK(st == MT_OK, "%s loads for %d ranks: %s", name, world, mt_last_error_msg());
    return cfg;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "launch/configs";
    struct {
        const char *name;
        int world, tp, pp, dp;
    } jobs[] = {{"demo.toml", 4, -1, -1, -1},
                {"gpt2-124m.toml", 8, 1, 1, 8},
                {"3d-small.toml", 8, 2, 2, 2},
                {"zero3.toml", 4, 1, 1, 4}};
    for (size_t i = 0; i < MT_ARRAY_LEN(jobs); i++) {
        mt_config_t *cfg = load(dir, jobs[i].name, jobs[i].world);
        if (!cfg) {
            continue;
        }
        int64_t tp = mt_config_int(cfg, "parallel.tp"), pp = mt_config_int(cfg, "parallel.pp");
        int64_t dp = mt_config_int(cfg, "parallel.dp");
        CHECK(tp * pp * dp == jobs[i].world, "%s: tp x pp x dp = world", jobs[i].name);
        if (jobs[i].tp > 0) {
            CHECK(tp == jobs[i].tp && pp == jobs[i].pp && dp == jobs[i].dp, "%s: layout %lldx%lldx%lld", jobs[i].name,
                  (long long)tp, (long long)pp, (long long)dp);
        } else {
            CHECK((tp > 1) + (pp > 1) + (dp > 1) >= 2, "%s composes at least two kinds of parallelism", jobs[i].name);
        }
        mt_config_free(cfg);
    }
    mt_config_t *cfg = load(dir, "gpt2-124m.toml", 8);
    if (cfg) {
        mt_model_config_t mc;
        mt_job_model_config(cfg, &mc);
        CHECK(mc.n_layer == 12 && mc.n_embd == 768 && mc.n_head == 12 && mc.seq_len == 1024 && mc.vocab_size == 50257,
              "published GPT-2 small shape");
        mt_model_t m = NULL;
        CHECK_OK(mt_model_init(&mc, &m));
        if (m) {
            CHECK(mt_model_numel(m) == 124475904u, "124M parameters: %zu (llm.c with Vp 50304: 124475904)",
                  mt_model_numel(m));
            mt_model_free(m);
        }
        mt_config_free(cfg);
    }
    return mt_test_finish("test_configs");
}
