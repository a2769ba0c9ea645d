/* Optimizers (AdamW and SGD with momentum, PyTorch semantics), global-norm gradient clipping with
 * partial sums of squares that sharded engines combine, and learning-rate schedules.
 * An optimizer updates whatever fp32 buffers are registered with it: the whole model in a single
 * process, or only the shard a rank owns under ZeRO. The math per element is in optim.c.
 * SPDX-License-Identifier: MIT */
#ifndef MT_OPTIM_H
#define MT_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/device.h"   /* the device the state lives on and the steps run on */
#include "runtime/flat_ops.h" /* the per-tensor updates, the sum of squares and the clipping coefficient */
#include "runtime/mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- optimizers ------------------------------------------------------------------------------ */

typedef enum { MT_OPTIM_ADAMW = 0, MT_OPTIM_SGD = 1 } mt_optim_kind_t;

typedef struct {
    size_t size; /* sizeof(mt_optim_params_t) */
    mt_optim_kind_t kind;
    float beta1, beta2, eps; /* AdamW */
    float weight_decay;      /* AdamW: decoupled (p -= lr*wd*p); SGD: L2 added to the gradient, as torch.optim.SGD */
    float momentum;          /* SGD; 0 = plain SGD (no momentum buffer is allocated) */
} mt_optim_params_t;

#define MT_OPTIM_PARAMS_INIT                                                                                   \
    {                                                                                                          \
        .size = sizeof(mt_optim_params_t), .kind = MT_OPTIM_ADAMW, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, \
        .weight_decay = 0.0f, .momentum = 0.0f                                                                 \
    }

typedef struct mt_optim *mt_optim_t;

/* Creates an optimizer with no tensors. Fails with MT_ERR_INVALID_ARG on an out-of-range
 * hyper-parameter (betas outside [0,1), negative eps/weight decay/momentum) naming it. */
mt_status_t mt_optim_init(const mt_optim_params_t *params, mt_optim_t *out);

/* The device the optimizer's state lives on and its steps run on: every later mt_optim_add allocates the
 * state there (through the device's allocator, zeroed on stream) and mt_optim_step queues each tensor's
 * update on stream (runtime/device.h's mt_device_step: the same arithmetic element for element). The
 * default is the CPU table with a NULL stream. Fails with MT_ERR_INVALID_ARG once a tensor is registered. */
mt_status_t mt_optim_set_device(mt_optim_t opt, mt_device_table_t dev, void *stream);

/* Registers one fp32 tensor (or the shard of one that this rank owns): n elements at param, its
 * gradient at grad. decay says whether weight decay applies (the caller passes true for 2-D
 * weights, false for biases, LayerNorm parameters and other 1-D tensors). The optimizer keeps the
 * pointers (the caller keeps the buffers alive and in place) and allocates its state for them
 * (AdamW: m and v; SGD with momentum: the momentum buffer) zeroed, under MT_MEM_OPTIMIZER, on the
 * optimizer's device (param and grad are that device's memory).
 * name (copied) is for messages and checkpoints. Returns the tensor's index in *index (may be NULL). */
mt_status_t mt_optim_add(mt_optim_t opt, const char *name, float *param, const float *grad, size_t n, bool decay,
                         int *index);

/* State buffers mt_optim_add allocates per tensor with these parameters (AdamW: 2, SGD with momentum: 1,
 * plain SGD: 0), each of n floats. Pure: planning multiplies it by mt_alloc_accounted(n * 4). */
int mt_optim_state_buffers(const mt_optim_params_t *params);

/* One optimizer step over every registered tensor at learning rate lr. Each gradient element is
 * first multiplied by grad_scale in fp32 (the clipping coefficient from mt_clip_coef, or 1), which
 * is bit-identical to scaling the gradients in place before the step as torch's clip_grad_norm_
 * does. Advances the step counter used for AdamW's bias correction (the first step is t = 1). */
mt_status_t mt_optim_step(mt_optim_t opt, float lr, float grad_scale);

/* Steps taken so far (t of the last step; 0 before the first). set_step is for resuming. */
int64_t mt_optim_get_step(mt_optim_t opt);
void mt_optim_set_step(mt_optim_t opt, int64_t t);

/* Number of registered tensors, and the state of tensor i for checkpoints: m and v for AdamW
 * (v = NULL for SGD), m = momentum buffer for SGD (NULL when momentum = 0). Pointers are the
 * optimizer's device memory, owned by the optimizer and valid until mt_optim_free. Returns
 * MT_ERR_INVALID_ARG for a bad index. */
int mt_optim_count(mt_optim_t opt);
mt_status_t mt_optim_state(mt_optim_t opt, int i, const char **name, size_t *n, float **m, float **v);

/* Frees the optimizer and its state (not the registered buffers). NULL is a no-op. */
void mt_optim_free(mt_optim_t opt);

/* ---- learning-rate schedules ----------------------------------------------------------------- */

typedef enum { MT_LR_CONSTANT = 0, MT_LR_COSINE = 1 } mt_lr_kind_t;

typedef struct {
    mt_lr_kind_t kind;
    float lr;             /* peak learning rate */
    float min_lr;         /* cosine: the rate reached at the last step */
    int64_t warmup_steps; /* both kinds: linear warm-up over these steps */
    int64_t total_steps;  /* cosine: steps of the whole run */
} mt_lr_sched_t;

/* The learning rate of step s (0-based):
 *   s < warmup:            lr * (s + 1) / warmup
 *   constant, s >= warmup: lr
 *   cosine,   s >= warmup: min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi * r)),
 *                          r = (s - warmup) / (total - 1 - warmup), clamped to [0, 1]
 * so the cosine reaches min_lr exactly at the last step s = total - 1 (r = 0 when total - 1 <= warmup). */
float mt_lr_at(const mt_lr_sched_t *sched, int64_t step);

/* Parses "constant" / "cosine"; false on anything else. */
bool mt_lr_kind_parse(const char *s, mt_lr_kind_t *out);

#ifdef __cplusplus
}
#endif
#endif /* MT_OPTIM_H */
