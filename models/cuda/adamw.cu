/* Fused AdamW and SGD (with or without momentum) over a flat f32 buffer on the device: one pass reads the
 * parameter, its gradient and the optimizer's state and writes them back (and, in bf16/fp16, the rounded
 * compute copy), with the gradient multiplier (clip coefficient x 1/loss scale) and the fp16 skip decision
 * read from device memory so the host never waits on the device inside a step. The arithmetic is
 * mt_adamw_update's and mt_sgd_update's (optim.c), operation for operation, so the CPU and GPU optimizers
 * agree to f32 rounding (nvcc may fuse a multiply-add).
 * SPDX-License-Identifier: MIT */
#include "models/cuda/cuda_impl.h"

/* ======================================== kernels ======================================== */

/* The optimizers' one pass: unless *skip, every element's gradient times the multiplier (grad_scale, times
 * *grad_scale_dev when given), the rule's new parameter from (i, g, p), written to param and, when lowp is
 * set, rounded into the compute copy. */
template <typename L, typename Rule>
static __global__ void update_kernel(float *param, const float *grad, size_t n, float grad_scale,
                                     const float *grad_scale_dev, const int *skip, L *lowp, Rule rule) {
    if (skip && *skip) {
        return;
    }
    float gs = grad_scale_dev ? grad_scale * *grad_scale_dev : grad_scale;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float p = rule(i, grad[i] * gs, param[i]);
        param[i] = p;
        if (lowp) {
            lowp[i] = from_f32<L>(p);
        }
    }
}

/* AdamW: p *= 1 - lr wd;  m += (g - m)(1 - b1);  v = v b2 + (1 - b2) g^2;
 * p -= step_size m / (sqrt(v)/sqrt(bc2) + eps), step_size = lr / bc1. */
struct adamw_rule {
    float *m, *v;
    float step_size, bc2_sqrt, decay;
    bool use_decay;
    float one_minus_b1, beta2, one_minus_b2, eps;
    __device__ float operator()(size_t i, float g, float p) const {
        if (use_decay) {
            p *= decay;
        }
        float mi = m[i] + (g - m[i]) * one_minus_b1;
        float vi = v[i] * beta2 + one_minus_b2 * g * g;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        return p - step_size * (mi / denom);
    }
};

/* SGD: g += wd p;  buf = first ? g : buf mu + g (with momentum);  p -= lr buf (or lr g). */
struct sgd_rule {
    float *buf;
    float lr, momentum, weight_decay;
    bool first;
    __device__ float operator()(size_t i, float g, float p) const {
        if (weight_decay != 0.0f) {
            g = g + weight_decay * p;
        }
        if (momentum != 0.0f && buf) {
            g = first ? g : buf[i] * momentum + g;
            buf[i] = g;
        }
        return p - lr * g;
    }
};

/* ======================================== launchers ======================================== */

extern "C" cudaError_t mt_cuda_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                                     float beta1, float beta2, float eps, float weight_decay, int64_t t,
                                     float grad_scale, const float *grad_scale_dev, const int *skip, void *lowp,
                                     int lowp_dt, void *stream) {
    MT_CU_CHECK_SHAPE(param && grad && m && v && t >= 1);
    if (n == 0) {
        return cudaSuccess;
    }
    /* the same host-side constants as mt_adamw_update */
    double bc1 = 1.0 - pow((double)beta1, (double)t);
    double bc2 = 1.0 - pow((double)beta2, (double)t);
    float step_size = (float)((double)lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float decay = (float)(1.0 - (double)lr * (double)weight_decay);
    float one_minus_b1 = (float)(1.0 - (double)beta1), one_minus_b2 = (float)(1.0 - (double)beta2);
    cudaStream_t s = (cudaStream_t)stream;
    unsigned g = mt_cu_blocks(n, 256, 132 * 16);
    adamw_rule rule = {m,     v,     step_size,    bc2_sqrt, decay, weight_decay != 0.0f, one_minus_b1,
                       beta2, one_minus_b2, eps};
    MT_CU_DISPATCH(lowp_dt, L,
                   update_kernel<L, adamw_rule><<<g, 256, 0, s>>>(param, grad, n, grad_scale, grad_scale_dev, skip,
                                                          (L *)lowp, rule));
    return cudaGetLastError();
}

extern "C" cudaError_t mt_cuda_sgd(float *param, const float *grad, float *buf, size_t n, float lr, float momentum,
                                   float weight_decay, bool first, float grad_scale, const float *grad_scale_dev,
                                   const int *skip, void *lowp, int lowp_dt, void *stream) {
    MT_CU_CHECK_SHAPE(param && grad && (buf || momentum == 0.0f));
    if (n == 0) {
        return cudaSuccess;
    }
    cudaStream_t s = (cudaStream_t)stream;
    unsigned g = mt_cu_blocks(n, 256, 132 * 16);
    sgd_rule rule = {buf, lr, momentum, weight_decay, first};
    MT_CU_DISPATCH(lowp_dt, L,
                   update_kernel<L, sgd_rule><<<g, 256, 0, s>>>(param, grad, n, grad_scale, grad_scale_dev, skip,
                                                          (L *)lowp, rule));
    return cudaGetLastError();
}
