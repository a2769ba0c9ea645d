/* Checkpoint pieces of parameter storage, shared by the data-parallel adapter (job_parallel.c) and the
 * model-parallel one (job_mp.c): flat ranges of a parameter's local storage (a tensor-parallel shard, or the
 * whole parameter) mapped to boxes of the global tensor, and an engine's storage listed as such pieces.
 * SPDX-License-Identifier: MIT */
#ifndef MT_JOB_PIECES_H
#define MT_JOB_PIECES_H

#include "train/job.h"
#include "parallel/engine.h"

typedef struct {
    mt_ckpt_piece_t *v;
    int n, cap;
} mt_plist_t;

/* Elements [a, b) of parameter p's local storage (row-major in p->shape, this tp rank's shard of the
 * global tensor when tp_size > 1 and p->tp_dim >= 0), stored contiguously at data, appended as boxes of
 * the global tensor (one per row segment and tp_parts block; rank r holds rows/columns
 * [k*pl*tp + r*pl, +pl) of block k, the layout mt_tp_gather_shard assembles). MT_ERR_OOM. */
mt_status_t mt_plist_push_flat(mt_plist_t *l, const char *kind, const mt_param_t *p, int tp_size, int tp_rank,
                               size_t a, size_t b, float *data);

/* An engine's storage as pieces: with save, those this rank writes (replicated units by dp rank 0,
 * sharded units by their owner), else every piece it holds. tp_size / tp_rank map tensor-parallel shards
 * to the global tensor; flags (NULL: every parameter) skip on save the parameters whose MT_ENGINE_PARAM_NORM
 * bit is clear (another tp rank's or stage's copy is the one written). *pieces is malloc'd. */
mt_status_t mt_job_engine_pieces(mt_engine_t e, bool save, int tp_size, int tp_rank, const uint8_t *flags,
                                 mt_ckpt_piece_t **pieces, int *n);

#endif
