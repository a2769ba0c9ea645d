/* llm.c interoperability: GPT-2 checkpoints in llm.c's format (train_gpt2.c, gpt2_build_from_checkpoint).
 * File: 256 int32 header {20240326, 3 (fp32), max_seq_len, vocab_size, n_layer, n_head, channels,
 * padded_vocab_size, 0...}, then fp32 parameters grouped by KIND over layers: wte (Vp,C), wpe (maxT,C),
 * ln1w (L,C), ln1b (L,C), qkvw (L,3C,C), qkvb (L,3C), attprojw (L,C,C), attprojb (L,C), ln2w, ln2b (L,C),
 * fcw (L,4C,C), fcb (L,4C), fcprojw (L,C,4C), fcprojb (L,C), lnfw (C), lnfb (C). Our per-layer
 * parameters hold the same row-major matrices, so import/export is a regrouping, bit-exact.
 * SPDX-License-Identifier: MIT */
#ifndef MT_LLMC_H
#define MT_LLMC_H

#include "models/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_LLMC_MAGIC 20240326
#define MT_LLMC_VERSION_FP32 3

typedef struct {
    int max_seq_len, vocab_size, n_layer, n_head, channels, padded_vocab;
    int64_t n_floats; /* parameters the header implies */
} mt_llmc_header_t;

/* Reads and validates the header of path: magic, version 3, every size in a sane range, and the file
 * size equal to 1024 + 4 * n_floats (a short file is "truncated", a long one "has trailing bytes").
 * Allocates nothing. Errors: MT_ERR_IO (cannot open/read), MT_ERR_INVALID_ARG (malformed), each
 * message naming the file and the offending value. */
mt_status_t mt_llmc_read_header(const char *path, mt_llmc_header_t *h);

/* Which config fields the user set explicitly (the rest are taken from the checkpoint). */
enum {
    MT_LLMC_SET_N_LAYER = 1u << 0,
    MT_LLMC_SET_N_HEAD = 1u << 1,
    MT_LLMC_SET_N_EMBD = 1u << 2,
    MT_LLMC_SET_SEQ_LEN = 1u << 3,
    MT_LLMC_SET_VOCAB = 1u << 4,
    MT_LLMC_SET_PADDED_VOCAB = 1u << 5,
};

/* Makes cfg describe the checkpoint's architecture (kind gpt2, n_layer, n_head, n_embd, seq_len,
 * vocab_size, padded_vocab from h). A field flagged in explicit_mask whose value differs from the
 * header's is an error naming both values ("model.n_layer = 6 contradicts the checkpoint's n_layer = 12").
 * (Train on shorter sequences with an acts object of smaller T; wpe keeps all max_seq_len rows.) */
mt_status_t mt_llmc_apply_header(const mt_llmc_header_t *h, const char *path, unsigned explicit_mask,
                                 mt_model_config_t *cfg);

/* Loads the checkpoint's parameters into the bound p->data of a GPT-2 model whose architecture equals
 * the header's (wpe rows: the model's seq_len must equal max_seq_len). Reads straight into the parameters
 * (no staging buffer). Errors as mt_llmc_read_header, plus MT_ERR_INVALID_ARG for an architecture
 * mismatch naming both values. */
mt_status_t mt_llmc_load(mt_model_t m, const char *path);

/* Writes the model's parameters (p->data) as an llm.c fp32 checkpoint to path (via path.tmp + rename).
 * Errors: MT_ERR_INVALID_USAGE for a non-GPT-2 model or tp_size > 1, MT_ERR_IO. */
mt_status_t mt_llmc_save(mt_model_t m, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* MT_LLMC_H */
