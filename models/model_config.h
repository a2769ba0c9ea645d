/* Building a model from the job configuration (the model.* keys of runtime/config_schema.c, plus
 * train.seed), including model.init = "llmc:PATH", whose header decides the architecture.
 * SPDX-License-Identifier: MIT */
#ifndef MT_MODEL_CONFIG_H
#define MT_MODEL_CONFIG_H

#include "models/model.h"
#include "runtime/config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The model.* keys and train.seed alone, as mt_model_config_from reads them, without looking at model.init
 * (no file is read; cannot fail). For callers that only need the configured shape. */
void mt_model_config_keys(const mt_config_t *cfg, mt_model_config_t *out);

/* model.init = "llmc:PATH" with a non-empty PATH: PATH (borrowed from cfg); otherwise NULL. */
const char *mt_model_config_llmc_path(const mt_config_t *cfg);

/* Fills *out from cfg: model.kind, n_layer, n_head, n_embd, seq_len, vocab_size, padded_vocab, recompute,
 * attn_recompute, head_chunks, train.seed; tp_rank/tp_size/tp_ops are left at 0/1/NULL for the caller. With
 * model.init = "llmc:PATH" the architecture is read from PATH's header; a model.* value given in the file
 * or on the command line that contradicts it is MT_ERR_INVALID_ARG naming both values. Errors from
 * reading the header as mt_llmc_read_header. A model.init other than "random" or "llmc:PATH", or an llm.c
 * checkpoint with model.kind other than "gpt2", is MT_ERR_INVALID_ARG naming the key. */
mt_status_t mt_model_config_from(const mt_config_t *cfg, mt_model_config_t *out);

/* Writes the initial weights into the bound p->data: GPT-2 initialisation from the seed, or the llm.c
 * checkpoint named by model.init. */
mt_status_t mt_model_init_from_config(mt_model_t m, const mt_config_t *cfg);

#ifdef __cplusplus
}
#endif
#endif /* MT_MODEL_CONFIG_H */
