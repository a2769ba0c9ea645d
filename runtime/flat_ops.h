/* The flat-buffer kernels of the CPU: the optimizer updates, the sum of squares and the clipping
 * coefficient, each reproducing torch's fp32 arithmetic. The CPU optimizer (models/optim) runs them per
 * registered tensor and the CPU device table (runtime/device.h) over any range; the CUDA kernels of the
 * same names' operations (models/cuda/adamw.cu, elementwise.cu) follow them operation for operation.
 * SPDX-License-Identifier: MIT */
#ifndef MT_FLAT_OPS_H
#define MT_FLAT_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The per-tensor kernels the optimizer runs, exposed for engines that keep their own state layout.
 * t is the step number after incrementing (>= 1). */
void mt_adamw_update(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                     float eps, float weight_decay, int64_t t, float grad_scale);
/* buf may be NULL when momentum == 0. first: this is the buffer's first step (buf = g, as torch). */
void mt_sgd_update(float *param, const float *grad, float *buf, size_t n, float lr, float momentum, float weight_decay,
                   bool first, float grad_scale);

/* ---- gradient clipping by global norm -------------------------------------------------------- */
/* A global norm over tensors spread across ranks is sqrt of the sum of every rank's partial sum of
 * squares. A single process sums its tensors with mt_clip_sumsq; a sharded engine sums what it owns,
 * all-reduces the double, and hands the total to mt_clip_coef. */

/* Sum of g[i]^2 over n elements, accumulated in double. */
double mt_clip_sumsq(const float *g, size_t n);

/* From the total sum of squares: *norm = sqrt(total) (may be NULL) and the coefficient to multiply
 * every gradient by, as torch.nn.utils.clip_grad_norm_: min(1, max_norm / (norm + 1e-6)). max_norm
 * <= 0 disables clipping (returns 1). A non-finite total returns 1 and a non-finite *norm; the caller
 * decides (train.on_nan). */
float mt_clip_coef(double total_sumsq, float max_norm, double *norm);

#ifdef __cplusplus
}
#endif
#endif /* MT_FLAT_OPS_H */
