/* Tensor parallelism, communication side: the mt_tp_ops_t seam the sharded GPT-2 (models/gpt2/gpt2_tp.c)
 * calls for Megatron's f and g (all-reduce, or all-gather / reduce-scatter with sequence parallelism) over
 * the tp group's communicator, with per-kind counts, bytes and time so tests can hold the layers to the
 * design's collective counts and benches can report the tp share of a step. Also the gradient sync of
 * replicated parameters under sequence parallelism and gathers of sharded parameters.
 * SPDX-License-Identifier: MIT */
#ifndef MT_TP_H
#define MT_TP_H

#include <stdbool.h>
#include <stdint.h>

#include "collectives/coll.h"
#include "models/model.h"
#include "runtime/device.h"
#include "runtime/mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_tp *mt_tp_t;

/* Collectives issued through the seam since the last reset. */
typedef struct {
    int64_t all_reduce;     /* sum all-reduces (f backward / g forward without sequence parallelism, CE sums) */
    int64_t all_reduce_max; /* the cross-entropy's row maxima */
    int64_t all_gather;     /* sequence parallelism: f forward, g backward */
    int64_t reduce_scatter; /* sequence parallelism: g forward, f backward */
    int64_t grad_sync;      /* all-reduces of replicated gradients (mt_tp_finish_grads) */
    int64_t bytes;          /* bytes each rank sends, bus convention (tp.c): all-reduce 2b(n-1)/n, others b(n-1)/n */
    double seconds;         /* wall time inside those calls */
} mt_tp_counts_t;

/* Wraps the tp group's communicator (borrowed; must outlive the handle; NULL = a group of one). Every
 * call the seam makes is synchronous and waits at most the comm's timeout, failing with MT_ERR_TIMEOUT
 * naming the operation. Errors: MT_ERR_OOM. */
mt_status_t mt_tp_init(mt_comm_t tp_comm, mt_tp_t *out);
void mt_tp_free(mt_tp_t tp);

/* The device table (and stream) the gradient sync's packed buffer and the gathers' receive buffer live on,
 * and their copies run on (runtime/device.h); the CPU table until set. The seam itself works on the model's
 * activations in host memory (mt_tp_ops_t). Only devices whose memory the host reads are accepted today
 * (MT_ERR_INVALID_ARG naming the device otherwise). */
mt_status_t mt_tp_set_device(mt_tp_t tp, mt_device_table_t dev, void *stream);

int mt_tp_rank(mt_tp_t tp);
int mt_tp_size(mt_tp_t tp);

/* The seam for mt_model_config_t.tp_ops (valid while tp lives). */
const mt_tp_ops_t *mt_tp_ops(mt_tp_t tp);

/* Fills the tensor-parallel fields of a model configuration: tp_rank, tp_size, tp_ops, sequence_parallel. */
void mt_tp_model_config(mt_tp_t tp, bool sequence_parallel, mt_model_config_t *mc);

void mt_tp_counts(mt_tp_t tp, mt_tp_counts_t *out);
void mt_tp_reset_counts(mt_tp_t tp);

/* After the last backward of a step, with sequence parallelism: every tp rank computed the gradients
 * of the replicated parameters (tp_dim = -1: LayerNorms, row-parallel biases, wpe) over its own rows
 * only, so they are summed over the tp group (one all-reduce over a packed buffer). Without sequence
 * parallelism every rank already holds the whole gradient and nothing is sent. Collective over tp. */
mt_status_t mt_tp_finish_grads(mt_tp_t tp, mt_model_t m, bool sequence_parallel);

/* The same for the replicated parameters of one module only (one all-reduce; nothing without sequence
 * parallelism or when the module has none): for a hook on the step's last backward pass, so the sum is
 * complete before a data-parallel engine communicates that module's gradients. Collective over tp. */
mt_status_t mt_tp_sync_module_grads(mt_tp_t tp, mt_model_t m, int module, bool sequence_parallel);

/* The whole parameter i (global_shape, row-major) assembled from every tp rank's shard into out on
 * every rank (an all-gather, then each shard put at its global rows/columns, honouring tp_parts).
 * Replicated parameters are copied. Collective over tp. */
mt_status_t mt_tp_gather_param(mt_tp_t tp, mt_model_t m, int i, float *out);
/* The same from an explicit local shard of p (numel floats), e.g. an engine's copy. Collective over tp. */
mt_status_t mt_tp_gather_shard(mt_tp_t tp, const mt_param_t *p, const float *local, float *out);

#ifdef __cplusplus
}
#endif
#endif /* MT_TP_H */
