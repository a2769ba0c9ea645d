/* Training data: llm.c token shards (read, validated, written) and a built-in synthetic source, served
 * as the batch of each optimizer step. A step's global batch depends only on (seed, step) and the data,
 * never on the parallel layout; data-parallel rank r takes its contiguous slice of rows (identical across
 * tensor-parallel ranks). A background thread loads the next step's batch while the current one computes.
 * SPDX-License-Identifier: MIT */
#ifndef MT_DATA_H
#define MT_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- llm.c token shards ----------------------------------------------------------------------
 * File layout (little-endian): int32 header[256] = {20240520 (magic), 1 (version), N (token count),
 * 0...}, then N uint16 tokens. The file size must be exactly 1024 + 2*N bytes. */
#define MT_SHARD_MAGIC 20240520
#define MT_SHARD_VERSION 1
#define MT_SHARD_HEADER_BYTES 1024

/* Writes a shard of n tokens to path (replacing it). MT_ERR_IO with the path and errno text on failure. */
mt_status_t mt_shard_write(const char *path, const uint16_t *tokens, size_t n);

/* Validates a shard completely: magic, version, file size against the header's token count (checked
 * before anything is read or allocated), and every token < vocab_size (vocab_size <= 0 skips that).
 * On success *n_tokens = N. Errors (MT_ERR_INVALID_ARG, MT_ERR_IO for unreadable files) name the file
 * and the problem: "bad magic 123 (expected 20240520): not an llm.c token shard", "version 2, only
 * version 1 is supported", "truncated: header says N tokens = B bytes, file has F", "token 300 at
 * index 17 is >= vocab_size 256". */
mt_status_t mt_shard_check(const char *path, int64_t vocab_size, int64_t *n_tokens);

/* ---- the loader ----------------------------------------------------------------------------- */

typedef enum { MT_DATA_SYNTHETIC = 0, MT_DATA_SHARDS = 1 } mt_data_kind_t;
typedef enum { MT_DATA_RANDOM = 0, MT_DATA_SEQUENTIAL = 1 } mt_data_order_t;

/* Parse "synthetic"/"shards" and "random"/"sequential"; false on anything else. */
bool mt_data_kind_parse(const char *s, mt_data_kind_t *out);
bool mt_data_order_parse(const char *s, mt_data_order_t *out);

typedef struct {
    size_t size; /* sizeof(mt_data_params_t) */
    mt_data_kind_t kind;
    const char *glob;   /* shards: glob of shard files, matched in sorted order */
    const char *what;   /* name for messages, e.g. "data.train" */
    mt_data_order_t order;
    uint64_t seed;
    int split;          /* 0 train, 1 validation: synthetic sequences of the two never coincide */
    int64_t global_batch; /* B: sequences per step over all data-parallel ranks */
    int64_t seq_len;      /* T */
    int64_t vocab_size;   /* tokens must be < vocab_size */
    int dp_rank, dp_size; /* this rank takes rows [dp_rank*B/dp_size, (dp_rank+1)*B/dp_size) */
    bool prefetch;        /* load step+1 in a background thread after each mt_data_get */
} mt_data_params_t;

#define MT_DATA_PARAMS_INIT                                                                                  \
    {                                                                                                        \
        .size = sizeof(mt_data_params_t), .kind = MT_DATA_SYNTHETIC, .glob = NULL, .what = "data",           \
        .order = MT_DATA_RANDOM, .seed = 0, .split = 0, .global_batch = 1, .seq_len = 1, .vocab_size = 2,    \
        .dp_rank = 0, .dp_size = 1, .prefetch = true                                                         \
    }

/* One rank's share of a step: rows sequences of seq_len tokens, targets shifted by one. */
typedef struct {
    int64_t step;
    int64_t rows;     /* global_batch / dp_size */
    int64_t seq_len;  /* T */
    int32_t *inputs;  /* (rows, T): row b is tokens [0, T) of its window */
    int32_t *targets; /* (rows, T): tokens [1, T + 1) of the same window */
} mt_batch_t;

typedef struct mt_data *mt_data_t;

/* Opens a data source: for shards, expands the glob and validates every file (mt_shard_check) before
 * allocating anything; every problem is MT_ERR_INVALID_ARG with a message naming p->what, the file and
 * the fix. Batch buffers are allocated with mt_alloc (MT_MEM_OTHER). Starts the prefetch thread. */
mt_status_t mt_data_open(const mt_data_params_t *p, mt_data_t *out);

/* The batch of step (>= 0). The result is owned by the loader and valid until the next mt_data_get or
 * mt_data_close. Uses the prefetched batch when it is that step's, else loads it now; then starts
 * loading step+1. Any step may be asked for in any order (resuming, evaluation restarts). Not
 * thread-safe: one caller thread per loader. */
mt_status_t mt_data_get(mt_data_t d, int64_t step, const mt_batch_t **batch);

/* Fills rows [row0, row0 + n) of step's GLOBAL batch as windows of T + 1 tokens (n x (T + 1) int32,
 * row-major), synchronously, independent of dp_rank: the definition every rank's slice follows.
 * Thread-safe with respect to the prefetch thread. */
mt_status_t mt_data_global_rows(mt_data_t d, int64_t step, int64_t row0, int64_t n, int32_t *out);

/* Tokens available (sum over shards; 0 for synthetic) and the number of shard files. */
int64_t mt_data_n_tokens(mt_data_t d);
int mt_data_n_files(mt_data_t d);

/* Counts of batches served from the prefetch thread and loaded synchronously (for tests and logs). */
void mt_data_prefetch_stats(mt_data_t d, int64_t *hits, int64_t *misses);

/* Stops the prefetch thread and frees everything. NULL is a no-op. */
void mt_data_close(mt_data_t d);

/* ---- the synthetic source --------------------------------------------------------------------
 * A fixed random sparse first-order Markov chain over the vocabulary: every token s has K =
 * MT_SYNTH_BRANCH (or vocab_size if smaller) distinct successors chosen once from a fixed seed
 * (independent of train.seed, so the task is the same for every run), each taken with probability 1/K.
 * A row starts at a uniformly drawn token and walks the chain; the draws are a counter-based hash of
 * (seed, split, step, row, position), so rows are independent of the layout. Given the previous token
 * every next token has entropy exactly ln K, and no longer context tells more: the cross-entropy a
 * perfect model reaches is ln K nats (ln 4 = 1.3863), against ln(vocab_size) for a model that knows
 * nothing (ln 256 = 5.545). data.order does not apply: every row is drawn afresh. */
#define MT_SYNTH_BRANCH 4

/* ln K for vocab_size: the loss a perfect model reaches on synthetic data. */
double mt_synth_entropy(int64_t vocab_size);

/* The successors of token s (K of them, written to succ) for this vocab_size; returns K. For tests. */
int mt_synth_successors(mt_data_t d, int64_t s, int32_t *succ);

#ifdef __cplusplus
}
#endif
#endif /* MT_DATA_H */
