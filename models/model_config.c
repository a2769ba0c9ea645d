/* model.* config keys -> mt_model_config_t, and model.init (random or an llm.c checkpoint).
 * SPDX-License-Identifier: MIT */
#include "models/model_config.h"

#include <string.h>

#include "models/llmc.h"

static bool is_set(const mt_config_t *cfg, const char *key) {
    mt_cfg_source_t s = mt_config_source(cfg, key);
    return s == MT_CFG_SRC_FILE || s == MT_CFG_SRC_OVERRIDE;
}

const char *mt_model_config_llmc_path(const mt_config_t *cfg) {
    const char *init = mt_config_str(cfg, "model.init");
    return init && strncmp(init, "llmc:", 5) == 0 && init[5] != '\0' ? init + 5 : NULL;
}

void mt_model_config_keys(const mt_config_t *cfg, mt_model_config_t *out) {
    mt_model_config_t c = MT_MODEL_CONFIG_INIT;
    c.kind = strcmp(mt_config_str(cfg, "model.kind"), "mlp") == 0 ? MT_MODEL_MLP : MT_MODEL_GPT2;
    c.n_layer = (int)mt_config_int(cfg, "model.n_layer");
    c.n_head = (int)mt_config_int(cfg, "model.n_head");
    c.n_embd = (int)mt_config_int(cfg, "model.n_embd");
    c.seq_len = (int)mt_config_int(cfg, "model.seq_len");
    c.vocab_size = (int)mt_config_int(cfg, "model.vocab_size");
    c.padded_vocab = (int)mt_config_int(cfg, "model.padded_vocab");
    c.recompute = strcmp(mt_config_str(cfg, "model.recompute"), "block") == 0 ? MT_RECOMPUTE_BLOCK : MT_RECOMPUTE_NONE;
    c.attn_recompute = mt_config_bool(cfg, "model.attn_recompute");
    c.head_chunks = (int)mt_config_int(cfg, "model.head_chunks");
    c.seed = (uint64_t)mt_config_int(cfg, "train.seed");
    *out = c;
}

mt_status_t mt_model_config_from(const mt_config_t *cfg, mt_model_config_t *out) {
    mt_model_config_t c;
    mt_model_config_keys(cfg, &c);
    const char *init = mt_config_str(cfg, "model.init");
    const char *path = mt_model_config_llmc_path(cfg);
    if (!path && init && strcmp(init, "random") != 0) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "model.init = \"%s\": expected \"random\" or \"llmc:PATH\" (an llm.c GPT-2 checkpoint)", init);
    }
    if (path) {
        if (c.kind != MT_MODEL_GPT2) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "model.init = \"%s\" is a GPT-2 checkpoint but model.kind = \"%s\": set model.kind = "
                            "\"gpt2\"",
                            init, mt_config_str(cfg, "model.kind"));
        }
        mt_llmc_header_t h;
        MT_CHECK(mt_llmc_read_header(path, &h));
        unsigned mask = (is_set(cfg, "model.n_layer") ? MT_LLMC_SET_N_LAYER : 0) |
                        (is_set(cfg, "model.n_head") ? MT_LLMC_SET_N_HEAD : 0) |
                        (is_set(cfg, "model.n_embd") ? MT_LLMC_SET_N_EMBD : 0) |
                        (is_set(cfg, "model.seq_len") ? MT_LLMC_SET_SEQ_LEN : 0) |
                        (is_set(cfg, "model.vocab_size") ? MT_LLMC_SET_VOCAB : 0) |
                        (is_set(cfg, "model.padded_vocab") ? MT_LLMC_SET_PADDED_VOCAB : 0);
        MT_CHECK(mt_llmc_apply_header(&h, path, mask, &c));
    }
    *out = c;
    return MT_OK;
}

mt_status_t mt_model_init_from_config(mt_model_t m, const mt_config_t *cfg) {
    const char *path = mt_model_config_llmc_path(cfg);
    if (path) {
        return mt_llmc_load(m, path);
    }
    mt_model_init_weights(m);
    return MT_OK;
}
