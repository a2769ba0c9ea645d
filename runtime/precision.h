/* Mixed precision (precision.compute = fp32 | tf32 | bf16 | fp16): the dynamic loss scaler and the
 * master-weight logic shared by the GPU path and a CPU emulation of it. The optimizer always updates f32
 * master weights; the model computes with a copy rounded to the storage dtype (bf16/f16), and in fp16 the
 * gradients pass through f16 scaled by the loss scale, so overflow shows up as inf and is caught here.
 * On CPU the storage rounding is emulated on f32 buffers, so this logic is tested in CI without a GPU.
 * SPDX-License-Identifier: MIT */
#ifndef MT_PRECISION_H
#define MT_PRECISION_H

#include "runtime/mt_core.h"
#include "runtime/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MT_PREC_FP32 = 0, /* f32 storage and arithmetic */
    MT_PREC_TF32 = 1, /* f32 storage; matrix products on tensor cores with 10-bit mantissa inputs (GPU) */
    MT_PREC_BF16 = 2, /* bf16 weights/activations, f32 master weights, optimizer state and accumulation */
    MT_PREC_FP16 = 3, /* as bf16 with f16 storage, plus dynamic loss scaling */
    MT_PREC_COUNT
} mt_prec_t;

/* Parses "fp32", "tf32", "bf16", "fp16"; false on anything else. */
bool mt_prec_parse(const char *s, mt_prec_t *out);
const char *mt_prec_name(mt_prec_t p);
/* The dtype weights and activations are stored in for compute: f32, f32, bf16, f16. */
mt_dtype_t mt_prec_storage(mt_prec_t p);

/* Rounds n floats in place to the nearest value of dt (round to nearest even; f16 overflows to inf beyond
 * 65504 and rounds magnitudes below 2^-25, half its smallest subnormal, to zero; f32 is a no-op) and returns
 * how many of the results are not finite. This is the CPU emulation of storing a tensor in dt. */
size_t mt_prec_round(float *x, size_t n, mt_dtype_t dt);

/* dst[i] = src[i] rounded to dt as mt_prec_round does (a copy for f32), in one pass, threaded over large arrays. */
void mt_prec_round_copy(float *dst, const float *src, size_t n, mt_dtype_t dt);

/* dst[i] += g[i] rounded to dt (in f32), in one pass, threaded over large arrays; g is left unchanged. The same
 * bits as mt_prec_round(g) followed by the sum. */
void mt_prec_round_add(float *dst, const float *g, size_t n, mt_dtype_t dt);

/* Number of non-finite values among n floats. */
size_t mt_prec_count_nonfinite(const float *x, size_t n);

/* ---- dynamic loss scaling (fp16) ------------------------------------------------------------------
 * Per step:  backward with loss_grad_scale = scale;  each rank computes found_inf (its gradients hold an
 * inf/NaN);  the caller all-reduces found_inf with MAX across every rank that shares the step (dp, tp
 * and pp groups) so all ranks agree;  mt_loss_scaler_update(found_inf_all) returns whether to skip the
 * step;  if not skipped, the optimizer runs with grad_scale = clip_coef / scale (the unscale is folded
 * into the optimizer's gradient multiplier; the clip coefficient must be computed from the unscaled
 * norm, i.e. norm_scaled / scale). In modes other than fp16 the scale is 1 and update never skips
 * (non-finite gradients there are train.on_nan's business). */
typedef struct {
    bool dynamic;        /* fp16 */
    float scale;         /* current loss scale (a power of two when init_scale is) */
    float growth;        /* 2: multiply after window clean steps */
    float backoff;       /* 0.5: multiply on an overflow */
    float min_scale;     /* 1: the scale never drops below this (an overflow at the minimum still skips) */
    float max_scale;     /* 2^24: the scale never grows beyond this */
    int64_t window;      /* precision.scale_window */
    int64_t clean_steps; /* consecutive finite steps since the last change */
    int64_t n_steps, n_skipped;
} mt_loss_scaler_t;

/* Initialises for mode: fp16 dynamic with init_scale (precision.init_scale, > 0) and window
 * (precision.scale_window, >= 1); other modes fixed at scale 1. Errors: MT_ERR_INVALID_ARG naming the
 * bad value. */
mt_status_t mt_loss_scaler_init(mt_loss_scaler_t *s, mt_prec_t mode, float init_scale, int64_t window);

/* The factor to start backward with (multiplies the loss gradient), and its inverse for unscaling. */
float mt_loss_scaler_scale(const mt_loss_scaler_t *s);
float mt_loss_scaler_inv_scale(const mt_loss_scaler_t *s);

/* Ends a step given found_inf agreed by all ranks (non-zero: some rank's gradients are not finite).
 * Dynamic: on found_inf halves the scale (not below min_scale), resets the clean count and returns true
 * (skip the optimizer step); otherwise counts a clean step, doubles the scale after window of them (not
 * above max_scale) and returns false. Fixed: returns false. Deterministic, so ranks that pass the same
 * found_inf keep identical scales. */
bool mt_loss_scaler_update(mt_loss_scaler_t *s, int found_inf);

/* ---- master weights ---------------------------------------------------------------------------------
 * bf16/fp16: the f32 master copy (MT_MEM_OPTIMIZER) is what the optimizer updates; the model's f32
 * parameter buffer holds the master rounded to the storage dtype (the CPU emulation of a bf16/f16 weight
 * copy). fp32/tf32: no copy; the master is the parameter buffer itself. */
typedef struct mt_master *mt_master_t;

/* Takes over params (n floats, kept by the caller, not moved): master = params, then params rounded.
 * Errors: MT_ERR_INVALID_ARG (bad mode or NULL params with n > 0), MT_ERR_OOM. */
mt_status_t mt_master_init(mt_prec_t mode, float *params, size_t n, mt_master_t *out);

/* The f32 buffer to register with the optimizer (the master copy, or params in fp32/tf32). */
float *mt_master_weights(mt_master_t m);

/* After the optimizer updated the master: params = round(master) in the storage dtype. No-op in
 * fp32/tf32. */
void mt_master_publish(mt_master_t m);

/* Gradients produced by backward (scaled by the loss scale in fp16) as they would come out of the
 * storage dtype: rounds grads (n floats) in place through the storage dtype and returns this rank's
 * found_inf (1 when any gradient is not finite after rounding, else 0) for the caller to all-reduce. */
int mt_master_prepare_grads(mt_master_t m, float *grads, size_t n);

mt_prec_t mt_master_mode(mt_master_t m);

/* Frees the master copy (not params). NULL is a no-op. */
void mt_master_free(mt_master_t m);

#ifdef __cplusplus
}
#endif
#endif /* MT_PRECISION_H */
