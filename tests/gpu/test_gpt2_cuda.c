/* The GPU GPT-2 against the CPU model (the reference) on a small configuration: loss and every parameter's
 * gradient after one forward/backward, then a short AdamW training run, per precision mode. Tolerances
 * (loss: |gpu - cpu| / cpu; gradients: max |gpu - cpu| / max |cpu| per tensor):
 *   fp32 1e-4 / 1e-3,  tf32 1e-2 / 5e-2,  bf16 3e-2 / 2e-1,  fp16 1e-2 / 1e-1
 * Training (10 AdamW steps, 6 under the CPU emulator, lr 1e-3): fp32 losses within 1e-3 of the CPU's at every
 * step; every mode's loss falls. fp16 from an initial scale of 2^24 skips its first steps and still trains.
 * model.recompute = "block" (fp32, bf16): the same tolerances against the CPU model with recomputation, the
 * same loss and gradients as the GPU without it, and the activation bytes down by one block's internals.
 * Sharding (ZeRO, one process standing for one rank of three): bad shard parameters are refused; the slice
 * [lo, hi) has a 64-multiple length covering the layout in three; in bf16 get_state returns the uploaded
 * weights of the slice exactly and set_state round-trips them, get_params and the device-clipping step are
 * refused; under ZeRO-2 backward without a hook is refused, and the runs the hook sees (read on its consumer
 * stream) tile the layout from the end and hold the unsharded model's gradients (exactly under the emulator,
 * to 1e-5 of the largest on a device), in a second backward too (the pool is cleared per pass); ZeRO-3 is
 * refused without ZeRO-2's pool or a weight hook, and with weights "gathered" from the unsharded model's
 * copy gives its loss and gradients, gathering each block once.
 * Pipeline stages (fp32, bf16, fp32 with recompute = block): a 3-block model run as three stages with the
 * activations and their gradients handed over gives the whole model's loss and gradients (exactly under the
 * emulator but for wte's summation order, 1e-5 of the largest on a device); bad stage bounds are refused;
 * ZeRO-2 and ZeRO-3 on the stages hand over each pass's gradients but for the tied wte's, which accumulate over
 * the passes (the pipeline's end stages sum their copies once per step). Activation sets (with and without
 * recompute): two micro-batches forwarded before their backwards accumulate what forward + backward of each in
 * turn does.
 * Exits 77 printing "skipped: no CUDA device" without a device.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/cuda/gpt2_cuda.h"
#include "models/cuda/mt_cuda.h"
#include "testutil.h"

#ifndef MT_CUDA_EMULATED
#define MT_CUDA_EMULATED 0
#endif

#if MT_CUDA_EMULATED
enum { B = 2, T = 32, STEPS = 6 }; /* the CPU emulator runs every block thread in turn: fewer steps */
#else
enum { B = 2, T = 32, STEPS = 10 };
#endif

/* A host model of kind (GPT-2: 2 heads; the MLP of models/mlp/mlp.c) with n_layer blocks or hidden layers of
 * width n_embd and a vocabulary of 100 (the head's width not a multiple of 16), initialised. */
static mt_model_t build_kind_chunks(mt_model_kind_t kind, mt_recompute_t rc, int n_layer, int n_embd, int chunks) {
    mt_model_config_t c = MT_MODEL_CONFIG_INIT;
    c.head_chunks = chunks;
    c.recompute = rc;
    c.kind = kind;
    c.n_layer = n_layer;
    c.n_head = 2;
    c.n_embd = n_embd;
    c.seq_len = T;
    c.vocab_size = 100;
    c.seed = kind == MT_MODEL_MLP ? 11 : 7;
    mt_model_t m = NULL;
    CHECK_OK(mt_model_init(&c, &m));
    CHECK_OK(mt_model_alloc_params(m));
    CHECK_OK(mt_model_alloc_grads(m));
    mt_model_init_weights(m);
    return m;
}

static mt_model_t build_kind_width(mt_model_kind_t kind, mt_recompute_t rc, int n_layer, int n_embd) {
    return build_kind_chunks(kind, rc, n_layer, n_embd, 1);
}

static mt_model_t build_kind(mt_model_kind_t kind, mt_recompute_t rc, int n_layer) {
    return build_kind_width(kind, rc, n_layer, 64);
}

static mt_model_t build_layers(mt_recompute_t rc, int n_layer) {
    return build_kind(MT_MODEL_GPT2, rc, n_layer);
}

static mt_model_t build_mlp(mt_recompute_t rc) {
    return build_kind(MT_MODEL_MLP, rc, 3);
}

static mt_model_t build_rc(mt_recompute_t rc) {
    return build_layers(rc, 2);
}

static mt_model_t build(void) {
    return build_rc(MT_RECOMPUTE_NONE);
}

/* The trainer's parameters for a B x T micro-batch in prec (fp16 from loss scale init_scale). */
static mt_gpt2_cuda_params_t params_for(mt_prec_t prec, float init_scale) {
    mt_gpt2_cuda_params_t p = MT_GPT2_CUDA_PARAMS_INIT;
    p.prec = prec;
    p.B = B;
    p.T = T;
    p.init_scale = init_scale;
    return p;
}

static void data(int32_t *tok, int32_t *tgt) {
    unsigned s = 99;
    for (int i = 0; i < B * T; i++) {
        s = s * 1103515245u + 12345u;
        tok[i] = (int32_t)((s >> 16) % 100);
        tgt[i] = (tok[i] * 3 + 1) % 100;
    }
    tgt[5] = -1;
}

/* One micro-batch's loss and every parameter's gradient from the trainer against the CPU model's, m's (built by the
 * caller, freed here), in prec, with the fc layers' (the MLP's hidden layers') GELU in the product's epilogue or
 * not (fused); each parameter's largest error relative to its largest gradient element. */
static void compare_grads_of(mt_model_t m, mt_prec_t prec, bool fused) {
    static const double loss_tol[] = {1e-4, 1e-2, 3e-2, 1e-2}, grad_tol[] = {1e-3, 5e-2, 2e-1, 1e-1};
    int32_t tok[B * T], tgt[B * T];
    data(tok, tgt);
    mt_acts_t a;
    CHECK_OK(mt_acts_init(m, B, T, &a));
    float cpu_loss = 0, gpu_loss = 0;
    mt_model_zero_grads(m);
    CHECK_OK(mt_model_step(m, a, tok, tgt, true, &cpu_loss));
    mt_gpt2_cuda_params_t p = params_for(prec, 1024.0f);
    p.fused_gelu = fused;
    mt_gpt2_cuda_t g;
    CHECK_OK(mt_gpt2_cuda_init(m, &p, &g));
    CHECK_OK(mt_gpt2_cuda_zero_grads(g));
    CHECK_OK(mt_gpt2_cuda_forward(g, tok, tgt));
    CHECK_OK(mt_gpt2_cuda_backward(g, 1.0f));
    CHECK_OK(mt_gpt2_cuda_loss(g, &gpu_loss));
    size_t n = mt_model_numel(m);
    float *gg = malloc(n * 4);
    CHECK_OK(mt_gpt2_cuda_get_grads(g, gg));
    float unscale = prec == MT_PREC_FP16 ? 1.0f / 1024.0f : 1.0f;
    char pn[48];
    snprintf(pn, sizeof(pn), "%s %s%s", mt_model_config(m)->kind == MT_MODEL_MLP ? "mlp" : "gpt2", mt_prec_name(prec),
             fused ? "" : " unfused");
    CHECK(fabs(gpu_loss - cpu_loss) <= loss_tol[prec] * cpu_loss, "%s loss %.7g vs cpu %.7g", pn, gpu_loss, cpu_loss);
    for (int i = 0; i < mt_model_n_params(m); i++) {
        const mt_param_t *pp = mt_model_param(m, i);
        double num = 0, den = 0;
        for (size_t k = 0; k < pp->numel; k++) {
            double x = gg[pp->offset + k] * unscale, y = pp->grad[k];
            num = fmax(num, fabs(x - y));
            den = fmax(den, fabs(y));
            if (!isfinite(x)) {
                num = INFINITY;
            }
        }
        double e = den > 0 ? num / den : num;
        CHECK(e <= grad_tol[prec], "%s grad %s: relative error %.3e", pn, pp->name, e);
        if (getenv("MT_TEST_VERBOSE")) {
            printf("  %s %-28s %.3e\n", pn, pp->name, e);
        }
    }
    free(gg);
    mt_gpt2_cuda_free(g);
    mt_acts_free(a);
    mt_model_free(m);
}

static void compare_grads(mt_prec_t prec) {
    compare_grads_of(build(), prec, true);
    compare_grads_of(build_mlp(MT_RECOMPUTE_NONE), prec, true);
    compare_grads_of(build_mlp(MT_RECOMPUTE_BLOCK), prec, true);
    /* width 60: in bf16/f16 the second hidden layer's weight and bias sit at 8-byte offsets of the flat buffer (the
     * bias then reaches the product after it, matmul.cu's epilogue_bias), and the products' widths are not
     * multiples of 8 (no fused GELU) */
    compare_grads_of(build_kind_width(MT_MODEL_MLP, MT_RECOMPUTE_NONE, 3, 60), prec, true);
    /* model.head_chunks: the logits (64 rows) in 3 chunks of 21-22 rows, recomputed in backward (the host model
     * chunks too) */
    compare_grads_of(build_kind_chunks(MT_MODEL_GPT2, MT_RECOMPUTE_NONE, 2, 64, 3), prec, true);
    compare_grads_of(build_kind_chunks(MT_MODEL_MLP, MT_RECOMPUTE_NONE, 3, 64, 3), prec, true);
    /* GPT-2 at width 60 in 7 chunks of 9-10 rows: in bf16/f16 a chunk's first row of ln_f's output starts 8 bytes
     * off a 16-byte boundary (9 x 60 x 2 = 1080), the product's A pointer less aligned than the whole head's */
    compare_grads_of(build_kind_chunks(MT_MODEL_GPT2, MT_RECOMPUTE_NONE, 2, 60, 7), prec, true);
    if (prec == MT_PREC_FP32 || prec == MT_PREC_BF16) { /* the GELU kernel after the product (params.fused_gelu) */
        compare_grads_of(build(), prec, false);
        compare_grads_of(build_mlp(MT_RECOMPUTE_BLOCK), prec, false);
    }
}

/* STEPS AdamW steps on the GPU; the CPU reference for fp32. Returns the first and last losses. */
static void train(mt_prec_t prec, float init_scale, const float *cpu_losses, int *skipped) {
    mt_model_t m = build();
    int32_t tok[B * T], tgt[B * T];
    data(tok, tgt);
    mt_gpt2_cuda_params_t p = params_for(prec, init_scale);
    mt_gpt2_cuda_t g;
    CHECK_OK(mt_gpt2_cuda_init(m, &p, &g));
    mt_optim_params_t op = MT_OPTIM_PARAMS_INIT;
    op.weight_decay = 0.1f;
    CHECK_OK(mt_gpt2_cuda_set_profile(g, true));
    float first = 0, last = 0;
    *skipped = 0;
    for (int s = 0; s < STEPS; s++) {
        CHECK_OK(mt_gpt2_cuda_zero_grads(g));
        CHECK_OK(mt_gpt2_cuda_forward(g, tok, tgt));
        CHECK_OK(mt_gpt2_cuda_backward(g, 1.0f));
        CHECK_OK(mt_gpt2_cuda_step(g, &op, 1e-3f, 1.0f));
        mt_gpt2_cuda_result_t r;
        CHECK_OK(mt_gpt2_cuda_step_result(g, &r));
        *skipped += r.skipped;
        if (s == 0) {
            first = r.loss;
        }
        last = r.loss;
        if (cpu_losses) {
            CHECK(fabsf(r.loss - cpu_losses[s]) <= 1e-3f * cpu_losses[s], "fp32 step %d: gpu %.7g cpu %.7g", s, r.loss,
                  cpu_losses[s]);
        }
    }
    CHECK(last < first, "%s trains: %g -> %g", mt_prec_name(prec), first, last);
    double ms[MT_GPT2_PROF_COUNT];
    int64_t psteps = 0;
    mt_gpt2_cuda_profile(g, ms, &psteps);
    bool nonneg = true;
    for (int c = 0; c < MT_GPT2_PROF_COUNT; c++) {
        nonneg &= ms[c] >= 0;
    }
    CHECK(psteps == STEPS && nonneg, "profile: %lld steps collected", (long long)psteps);
    mt_gpt2_cuda_free(g);
    mt_model_free(m);
}

static void cpu_train(float *losses) {
    mt_model_t m = build();
    int32_t tok[B * T], tgt[B * T];
    data(tok, tgt);
    mt_acts_t a;
    CHECK_OK(mt_acts_init(m, B, T, &a));
    mt_optim_params_t op = MT_OPTIM_PARAMS_INIT;
    op.weight_decay = 0.1f;
    mt_optim_t opt;
    CHECK_OK(mt_optim_init(&op, &opt));
    for (int i = 0; i < mt_model_n_params(m); i++) {
        mt_param_t *pp = mt_model_param(m, i);
        CHECK_OK(mt_optim_add(opt, pp->name, pp->data, pp->grad, pp->numel, pp->is_weight2d, NULL));
    }
    for (int s = 0; s < STEPS; s++) {
        mt_model_zero_grads(m);
        CHECK_OK(mt_model_step(m, a, tok, tgt, true, &losses[s]));
        double sumsq = 0;
        for (int i = 0; i < mt_model_n_params(m); i++) {
            sumsq += mt_clip_sumsq(mt_model_param(m, i)->grad, mt_model_param(m, i)->numel);
        }
        CHECK_OK(mt_optim_step(opt, 1e-3f, mt_clip_coef(sumsq, 1.0f, NULL)));
    }
    mt_optim_free(opt);
    mt_acts_free(a);
    mt_model_free(m);
}

/* Device bytes of activations now (the caching allocator accounts every block under its category). */
static int64_t dev_act_bytes(void) {
    mt_mem_stats_t ms;
    mt_mem_stats(MT_MEM_DEVICE, &ms);
    return ms.current[MT_MEM_ACTIVATIONS];
}

/* One forward/backward on the GPU with model.recompute = rc: loss, gradients (unscaled), activation bytes
 * (the trainer's figure and the allocator's ACTIVATIONS category while it lives). */
static void gpu_grads(mt_model_t m, mt_prec_t prec, const int32_t *tok, const int32_t *tgt, float *loss, float *grads,
                      size_t *act, int64_t *act_dev) {
    mt_gpt2_cuda_params_t p = params_for(prec, 1024.0f);
    int64_t before = dev_act_bytes();
    mt_gpt2_cuda_t g;
    CHECK_OK(mt_gpt2_cuda_init(m, &p, &g));
    *act = mt_gpt2_cuda_activation_bytes(g);
    *act_dev = dev_act_bytes() - before;
    CHECK_OK(mt_gpt2_cuda_zero_grads(g));
    CHECK_OK(mt_gpt2_cuda_forward(g, tok, tgt));
    CHECK_OK(mt_gpt2_cuda_backward(g, 1.0f));
    CHECK_OK(mt_gpt2_cuda_loss(g, loss));
    CHECK_OK(mt_gpt2_cuda_get_grads(g, grads));
    if (prec == MT_PREC_FP16) {
        for (size_t i = 0; i < mt_model_numel(m); i++) {
            grads[i] /= 1024.0f;
        }
    }
    mt_gpt2_cuda_free(g);
}

/* model.recompute = "block" on the GPU: the loss and every gradient against the CPU model with the same setting (the
 * per-mode tolerances of compare_grads), the same figures as the GPU without recomputation (the same kernels on the
 * same inputs: the loss bit for bit, the gradients to 1e-5 of the largest in fp32), and the activation bytes down by
 * the internals of n_layer - 1 blocks, in the ACTIVATIONS category of the device allocator. */
static void compare_recompute(mt_prec_t prec) {
    static const double loss_tol[] = {1e-4, 1e-2, 3e-2, 1e-2}, grad_tol[] = {1e-3, 5e-2, 2e-1, 1e-1};
    /* against the GPU without recomputation: only dwte's atomics, and on a device cuBLASLt's algorithm choice
     * (cached per pointer alignment), may change the order of additions */
    static const double same_tol[] = {1e-5, 1e-3, 1e-2, 1e-2};
    const char *pn = mt_prec_name(prec);
    mt_model_t mr = build_rc(MT_RECOMPUTE_BLOCK), mn = build_rc(MT_RECOMPUTE_NONE);
    int32_t tok[B * T], tgt[B * T];
    data(tok, tgt);
    mt_acts_t a;
    CHECK_OK(mt_acts_init(mr, B, T, &a));
    float cpu_loss = 0;
    mt_model_zero_grads(mr);
    CHECK_OK(mt_model_step(mr, a, tok, tgt, true, &cpu_loss));
    size_t n = mt_model_numel(mr), act_r = 0, act_n = 0;
    int64_t dev_r = 0, dev_n = 0;
    float *gr = malloc(n * 4), *gn = malloc(n * 4), loss_r = 0, loss_n = 0;
    gpu_grads(mr, prec, tok, tgt, &loss_r, gr, &act_r, &dev_r);
    gpu_grads(mn, prec, tok, tgt, &loss_n, gn, &act_n, &dev_n);
    CHECK(fabs(loss_r - cpu_loss) <= loss_tol[prec] * cpu_loss, "%s recompute: loss %.7g vs cpu %.7g", pn, loss_r,
          cpu_loss);
    CHECK(loss_r == loss_n, "%s recompute: loss %.9g, without %.9g (same forward)", pn, loss_r, loss_n);
    for (int i = 0; i < mt_model_n_params(mr); i++) {
        const mt_param_t *pp = mt_model_param(mr, i);
        double num = 0, den = 0, same = 0, zmax = 0;
        for (size_t k = 0; k < pp->numel; k++) {
            double x = gr[pp->offset + k], y = pp->grad[k], z = gn[pp->offset + k];
            num = fmax(num, fabs(x - y));
            den = fmax(den, fabs(y));
            same = fmax(same, fabs(x - z));
            zmax = fmax(zmax, fabs(z));
            if (!isfinite(x)) {
                num = INFINITY;
            }
        }
        double e = den > 0 ? num / den : num;
        CHECK(e <= grad_tol[prec], "%s recompute grad %s: relative error %.3e against the cpu", pn, pp->name, e);
        same = zmax > 0 ? same / zmax : same;
        CHECK(same <= same_tol[prec], "%s recompute grad %s: %.3e from the gradient without recomputation", pn,
              pp->name, same);
    }
    /* recomputation keeps one block's internals instead of n_layer's */
    const mt_model_config_t *c = mt_model_config(mr);
    CHECK(c->n_layer == 2 && act_r < act_n, "%s activations: %zu bytes with recompute, %zu without", pn, act_r, act_n);
    CHECK(dev_r >= (int64_t)act_r && dev_r < (int64_t)act_r + 4096 && dev_n >= (int64_t)act_n &&
              dev_n < (int64_t)act_n + 4096,
          "%s device ACTIVATIONS %lld / %lld bytes for %zu / %zu", pn, (long long)dev_r, (long long)dev_n, act_r,
          act_n);
    size_t N = (size_t)B * T, C = (size_t)c->n_embd, es = mt_dtype_size((mt_dtype_t)mt_prec_storage(prec));
    size_t block_internals = (1 + 3 + 1 + 1 + 1 + 4 + 4) * N * C * es + 4 * N * 4 + (size_t)B * c->n_head * T * 4;
    CHECK(act_n - act_r >= block_internals && act_n - act_r < block_internals + 12 * 256,
          "%s activations drop by %zu bytes, one block's internals are %zu", pn, act_n - act_r, block_internals);
    printf("%s recompute = block: activations %zu -> %zu bytes, loss %.6f (cpu %.6f)\n", pn, act_n, act_r, loss_r,
           cpu_loss);
    free(gr);
    free(gn);
    mt_acts_free(a);
    mt_model_free(mr);
    mt_model_free(mn);
}

/* max |got - want| over [lo, hi), and (top may be NULL) max |want| there. */
static double max_diff(const float *got, const float *want, size_t lo, size_t hi, double *top) {
    double err = 0.0, t = 0.0;
    for (size_t i = lo; i < hi; i++) {
        err = fmax(err, fabs((double)got[i] - (double)want[i]));
        t = fmax(t, fabs((double)want[i]));
    }
    if (top) {
        *top = t;
    }
    return err;
}

/* The unsharded whole model of m with parameters p: one forward/backward of tok/tgt, its gradients into grads
 * and its loss; the trainer is returned in *out (the caller frees it). */
static void whole_model(mt_model_t m, const mt_gpt2_cuda_params_t *p, const int32_t *tok, const int32_t *tgt,
                        float *grads, float *loss, mt_gpt2_cuda_t *out) {
    CHECK_OK(mt_gpt2_cuda_init(m, p, out));
    CHECK_OK(mt_gpt2_cuda_zero_grads(*out));
    CHECK_OK(mt_gpt2_cuda_forward(*out, tok, tgt));
    CHECK_OK(mt_gpt2_cuda_backward(*out, 1.0f));
    CHECK_OK(mt_gpt2_cuda_get_grads(*out, grads));
    CHECK_OK(mt_gpt2_cuda_loss(*out, loss));
}

typedef struct {
    float *got;    /* numel floats: each run's gradients copied to their flat place */
    size_t next;   /* the next run's expected hi */
    int runs, bad; /* runs seen; runs that did not tile the layout from the end */
    void *stream;
} runs_t;

static mt_status_t take_run(void *arg, size_t lo, size_t hi, float *grads) {
    runs_t *r = arg;
    r->bad += hi != r->next || lo >= hi;
    r->next = lo;
    r->runs++;
    CHECK(cudaStreamSynchronize((cudaStream_t)r->stream) == cudaSuccess, "sync the consumer stream");
    CHECK(cudaMemcpy(r->got + lo, grads, (hi - lo) * 4, cudaMemcpyDeviceToHost) == cudaSuccess, "copy a run");
    return MT_OK;
}

typedef struct {
    const char *src; /* the unsharded model's whole compute copy */
    size_t es;
    void *stream;
    int calls;
} gather_t;

/* A weight hook for one process: "gathers" from the unsharded model's copy, on the comm stream. */
static mt_status_t copy_weights(void *arg, size_t lo, size_t hi, void *dst) {
    gather_t *c = arg;
    c->calls++;
    return cudaMemcpyAsync(dst, c->src + lo * c->es, (hi - lo) * c->es, cudaMemcpyDeviceToDevice,
                           (cudaStream_t)c->stream) == cudaSuccess
               ? MT_OK
               : mt_error(MT_ERR_CUDA, "weight gather copy failed");
}

/* ZeRO-3 (shard 1 of 3): refused without ZeRO-2's pool or without a weight hook; with a hook that copies from
 * the unsharded model g0, one forward/backward gives g0's loss and gradients (the runs), gathering each of the
 * L <= 3 blocks once (the slots still hold them for backward) and nothing else (wte/wpe/ln_f were uploaded). */
static void zero3_contract(mt_model_t m, const mt_gpt2_cuda_params_t *base, mt_gpt2_cuda_t g0, const int32_t *tok,
                           const int32_t *tgt, const float *want, float loss0) {
    mt_gpt2_cuda_params_t p = *base;
    const char *pn = mt_prec_name(p.prec);
    size_t n = mt_model_numel(m);
    int L = mt_model_config(m)->n_layer;
    mt_gpt2_cuda_t g = NULL;
    p.shard_count = 3;
    p.shard_index = 1;
    p.shard_weights = true;
    p.shard_grads = false;
    CHECK(mt_gpt2_cuda_init(m, &p, &g) == MT_ERR_INVALID_ARG, "%s: ZeRO-3 without ZeRO-2's pool accepted", pn);
    p.shard_grads = true;
    CHECK_OK(mt_gpt2_cuda_init(m, &p, &g));
    if (!g) {
        return;
    }
    CHECK(mt_gpt2_cuda_weights(g) == NULL && mt_gpt2_cuda_weight_slice(g) != NULL, "%s: ZeRO-3 weight buffers", pn);
    CHECK(mt_gpt2_cuda_forward(g, tok, tgt) == MT_ERR_INVALID_USAGE, "%s: ZeRO-3 forward without a hook accepted", pn);
    gather_t c = {.src = mt_gpt2_cuda_weights(g0),
                  .es = mt_dtype_size(mt_prec_storage(p.prec)),
                  .stream = mt_gpt2_cuda_stream(g)};
    runs_t r = {.got = calloc(n, 4), .next = n, .stream = c.stream};
    mt_gpt2_cuda_set_weight_hook(g, copy_weights, &c);
    mt_gpt2_cuda_set_comm_stream(g, c.stream);
    mt_gpt2_cuda_set_grad_hook(g, take_run, &r);
    float loss = 0;
    CHECK_OK(mt_gpt2_cuda_forward(g, tok, tgt));
    CHECK_OK(mt_gpt2_cuda_backward(g, 1.0f));
    CHECK_OK(mt_gpt2_cuda_loss(g, &loss));
    double top = 0, err = max_diff(r.got, want, 0, n, &top);
    double ltol = MT_CUDA_EMULATED ? 0.0 : 1e-6 * loss0, gtol = MT_CUDA_EMULATED ? 0.0 : 1e-5 * top;
    CHECK(fabs(loss - loss0) <= ltol && r.bad == 0 && r.next == 0 && err <= gtol && L <= 3 && c.calls == L,
          "%s ZeRO-3: loss %.9g (unsharded %.9g), gradients off by %g (largest %g), %d weight gathers for %d blocks",
          pn, loss, loss0, err, top, c.calls, L);
    mt_gpt2_cuda_free(g);
    free(r.got);
}

static void shard_contract(mt_prec_t prec) {
    mt_model_t m = build();
    size_t n = mt_model_numel(m);
    int32_t tok[B * T], tgt[B * T];
    data(tok, tgt);
    mt_gpt2_cuda_params_t p = params_for(prec, 1024.0f);
    mt_gpt2_cuda_t g = NULL;
    const char *pn = mt_prec_name(prec);
    /* the unsharded gradients of one backward */
    float *want = malloc(n * 4), *params = malloc(n * 4), *mv = calloc(n, 4), loss0 = 0;
    mt_gpt2_cuda_t g0 = NULL;
    whole_model(m, &p, tok, tgt, want, &loss0, &g0);
    p.shard_count = 3;
    p.shard_index = 3;
    CHECK(mt_gpt2_cuda_init(m, &p, &g) == MT_ERR_INVALID_ARG, "%s: shard 3 of 3 accepted", pn);
    if (mt_model_config(m)->kind == MT_MODEL_GPT2) { /* a grid's z (one layer per sequence) is at most 65535 */
        int B0 = p.B, T0 = p.T;
        p.shard_count = 1;
        p.shard_index = 0;
        p.B = 65536;
        p.T = 1;
        mt_status_t st = mt_gpt2_cuda_init(m, &p, &g);
        CHECK(st == MT_ERR_INVALID_ARG && strstr(mt_last_error_msg(), "at most 65535"), "%s: B = 65536: %s: %s", pn,
              mt_status_str(st), mt_last_error_msg());
        p.B = B0;
        p.T = T0;
    }
    p.shard_count = 1;
    p.shard_index = 0;
    p.shard_grads = true;
    CHECK(mt_gpt2_cuda_init(m, &p, &g) == MT_ERR_INVALID_ARG, "%s: ZeRO-2 over one shard accepted", pn);
    p.shard_count = 3;
    p.shard_index = 1;
    CHECK_OK(mt_gpt2_cuda_init(m, &p, &g));
    size_t lo = 0, hi = 0, len = 0;
    mt_gpt2_cuda_shard(g, &lo, &hi, &len);
    CHECK(len % 64 == 0 && 3 * len >= n && 2 * len < n + 3 * 64 && lo == len && hi == MT_MIN(2 * len, n),
          "%s: slice [%zu, %zu) of length %zu over %zu elements", pn, lo, hi, len, n);
    CHECK(mt_gpt2_cuda_get_grads(g, want + n / 2) == MT_ERR_INVALID_USAGE, "%s: ZeRO-2 get_grads accepted", pn);
    CHECK(mt_gpt2_cuda_forward(g, tok, tgt) == MT_OK && mt_gpt2_cuda_backward(g, 1.0f) == MT_ERR_INVALID_USAGE,
          "%s: ZeRO-2 backward without a hook accepted", pn);
    runs_t r = {.got = calloc(n, 4), .next = n, .stream = mt_gpt2_cuda_stream(g)};
    mt_gpt2_cuda_set_grad_hook(g, take_run, &r);
    mt_gpt2_cuda_set_comm_stream(g, r.stream);
    for (int pass = 0; pass < 2; pass++) { /* the second pass must not see the first's gradients */
        r.next = n;
        r.runs = r.bad = 0;
        CHECK_OK(mt_gpt2_cuda_forward(g, tok, tgt));
        CHECK_OK(mt_gpt2_cuda_backward(g, 1.0f));
        CHECK(r.bad == 0 && r.next == 0 && r.runs == 2 + 2, "%s pass %d: %d runs, %d out of order, ending at %zu", pn,
              pass, r.runs, r.bad, r.next);
        double top = 0, err = max_diff(r.got, want, 0, n, &top);
        /* the same kernels on the same inputs: equal, except that on a device dwte's float atomics add in a
         * run-dependent order */
        CHECK(err <= (MT_CUDA_EMULATED ? 0.0 : 1e-5 * top),
              "%s pass %d: the pooled runs differ from the whole "
              "gradients by %g (largest %g)",
              pn, pass, err, top);
    }
    /* the master weights of the slice: uploaded, read back, set and read back */
    CHECK_OK(mt_gpt2_cuda_get_state(g, params, mv, NULL));
    float *host = mt_model_params_flat(m);
    int diff = 0;
    for (size_t i = lo; i < hi; i++) {
        diff += params[i] != host[i] || mv[i - lo] != 0.0f;
    }
    CHECK(diff == 0, "%s: %d elements of the slice's master weights / moments differ from the upload", pn, diff);
    for (size_t i = 0; i < n; i++) {
        params[i] = host[i] * 0.5f;
    }
    CHECK_OK(mt_gpt2_cuda_set_state(g, params, NULL, NULL));
    float *back = calloc(n, 4);
    CHECK_OK(mt_gpt2_cuda_get_state(g, back, NULL, NULL));
    diff = 0;
    for (size_t i = lo; i < hi; i++) {
        diff += back[i] != params[i];
    }
    CHECK(diff == 0, "%s: %d elements of the slice did not round-trip through set_state", pn, diff);
    if (prec != MT_PREC_FP32 && prec != MT_PREC_TF32) {
        CHECK(mt_gpt2_cuda_get_params(g, back) == MT_ERR_INVALID_USAGE, "%s: sharded get_params accepted", pn);
    }
    mt_optim_params_t op = MT_OPTIM_PARAMS_INIT;
    op.kind = MT_OPTIM_ADAMW;
    CHECK(mt_gpt2_cuda_step(g, &op, 1e-3f, 1.0f) == MT_ERR_INVALID_USAGE, "%s: sharded device-clip step accepted", pn);
    mt_gpt2_cuda_free(g);
    zero3_contract(m, &p, g0, tok, tgt, want, loss0);
    mt_gpt2_cuda_free(g0);
    free(back);
    free(r.got);
    free(want);
    free(params);
    free(mv);
    mt_model_free(m);
}

/* Copies n bytes between two trainers' device buffers, after src's stream and before dst's (waits). */
static void hand_over(mt_gpt2_cuda_t from, const void *src, mt_gpt2_cuda_t to, void *dst, size_t n) {
    CHECK(cudaStreamSynchronize((cudaStream_t)mt_gpt2_cuda_stream(from)) == cudaSuccess &&
              cudaStreamSynchronize((cudaStream_t)mt_gpt2_cuda_stream(to)) == cudaSuccess &&
              cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice) == cudaSuccess,
          "hand over %zu bytes", n);
}

/* One forward and backward of tok/tgt through the three stages st (blocks [k, k + 1) each), the activations and
 * their gradients handed from stage to stage; *loss: the last stage's. */
static void run_stages(mt_model_t m, mt_prec_t prec, mt_gpt2_cuda_t *st, const int32_t *tok, const int32_t *tgt,
                       float *loss) {
    size_t act = (size_t)B * T * mt_model_config(m)->n_embd * mt_dtype_size(mt_prec_storage(prec));
    CHECK_OK(mt_gpt2_cuda_forward(st[0], tok, NULL));
    hand_over(st[0], mt_gpt2_cuda_stage_output(st[0]), st[1], mt_gpt2_cuda_stage_input(st[1]), act);
    CHECK_OK(mt_gpt2_cuda_forward(st[1], NULL, NULL));
    hand_over(st[1], mt_gpt2_cuda_stage_output(st[1]), st[2], mt_gpt2_cuda_stage_input(st[2]), act);
    CHECK_OK(mt_gpt2_cuda_forward(st[2], NULL, tgt));
    CHECK_OK(mt_gpt2_cuda_loss(st[2], loss));
    CHECK_OK(mt_gpt2_cuda_backward(st[2], 1.0f));
    hand_over(st[2], mt_gpt2_cuda_stage_grad(st[2]), st[1], mt_gpt2_cuda_stage_grad(st[1]), act);
    CHECK_OK(mt_gpt2_cuda_backward(st[1], 1.0f));
    hand_over(st[1], mt_gpt2_cuda_stage_grad(st[1]), st[0], mt_gpt2_cuda_stage_grad(st[0]), act);
    CHECK_OK(mt_gpt2_cuda_backward(st[0], 1.0f));
}

/* ZeRO-2 (zero3: ZeRO-3) on pipeline stages (shard 0 of 2 of each stage's layout), against the unsharded stages
 * u after one pass (their gradients from zero): over two passes each stage's hook runs tile its layout from the
 * end and hold u's gradients but for the tied wte (first and last stage), whose run holds the sum of the passes
 * so far, as mt_gpt2_cuda_wte_grad does (NULL on the middle stage) until zero_grads clears it; the loss is u's;
 * under ZeRO-3 (weights "gathered" from u's copies) each stage gathers its one block once and nothing of
 * another stage. Exactly under the emulator but for wte (summed again: 1e-6 of the largest), 1e-5 of the
 * largest on a device. */
static void sharded_stages(mt_model_t m, const mt_gpt2_cuda_params_t *base, mt_gpt2_cuda_t *u, const int32_t *tok,
                           const int32_t *tgt, float loss0, bool zero3) {
    const char *pn = mt_prec_name(base->prec);
    size_t wte = mt_model_param(m, 0)->numel;
    mt_gpt2_cuda_t st[3] = {NULL, NULL, NULL};
    runs_t r[3];
    gather_t c[3];
    float *want[3] = {NULL, NULL, NULL};
    memset(r, 0, sizeof(r));
    for (int k = 0; k < 3; k++) {
        mt_gpt2_cuda_params_t p = *base;
        p.stage_lo = k;
        p.stage_hi = k + 1;
        p.shard_count = 2;
        p.shard_index = 0;
        p.shard_grads = true;
        p.shard_weights = zero3;
        CHECK_OK(mt_gpt2_cuda_init(m, &p, &st[k]));
        if (!st[k]) {
            goto done;
        }
        size_t n = mt_gpt2_cuda_numel(u[k]);
        CHECK(mt_gpt2_cuda_numel(st[k]) == n, "stage %d: %zu parameters sharded, %zu not", k,
              mt_gpt2_cuda_numel(st[k]), n);
        want[k] = malloc(n * 4);
        CHECK_OK(mt_gpt2_cuda_get_grads(u[k], want[k]));
        r[k] = (runs_t){.got = calloc(n, 4), .next = n, .stream = mt_gpt2_cuda_stream(st[k])};
        c[k] = (gather_t){.src = mt_gpt2_cuda_weights(u[k]),
                          .es = mt_dtype_size(mt_prec_storage(p.prec)),
                          .stream = r[k].stream};
        mt_gpt2_cuda_set_grad_hook(st[k], take_run, &r[k]);
        mt_gpt2_cuda_set_comm_stream(st[k], r[k].stream);
        mt_gpt2_cuda_set_weight_hook(st[k], copy_weights, &c[k]);
        CHECK_OK(mt_gpt2_cuda_zero_grads(st[k]));
        CHECK((mt_gpt2_cuda_wte_grad(st[k]) != NULL) == (k != 1), "%s stage %d: wte gradient %p", pn, k,
              (void *)mt_gpt2_cuda_wte_grad(st[k]));
    }
    float *wg = malloc(wte * 4);
    for (int pass = 0; pass < 2; pass++) {
        float loss = 0;
        for (int k = 0; k < 3; k++) {
            r[k].next = mt_gpt2_cuda_numel(st[k]);
            r[k].runs = r[k].bad = 0;
        }
        run_stages(m, base->prec, st, tok, tgt, &loss);
        CHECK(MT_CUDA_EMULATED ? loss == loss0 : fabs(loss - loss0) <= 1e-6 * loss0, "%s zero-%d stages pass %d: "
              "loss %.9g, unsharded %.9g", pn, zero3 ? 3 : 2, pass, loss, loss0);
        for (int k = 0; k < 3; k++) {
            size_t n = mt_gpt2_cuda_numel(st[k]), w = k == 1 ? 0 : wte;
            double top = 0, err = max_diff(r[k].got, want[k], w, n, &top), wtop = 0, werr = 0;
            for (size_t i = 0; i < w; i++) { /* the tied wte: pass + 1 passes' sum */
                werr = fmax(werr, fabs((double)r[k].got[i] - (pass + 1.0) * want[k][i]));
                wtop = fmax(wtop, fabs((pass + 1.0) * want[k][i]));
            }
            float *acc = mt_gpt2_cuda_wte_grad(st[k]);
            int off = 0;
            if (acc) {
                CHECK(cudaStreamSynchronize((cudaStream_t)r[k].stream) == cudaSuccess &&
                          cudaMemcpy(wg, acc, wte * 4, cudaMemcpyDeviceToHost) == cudaSuccess,
                      "copy wte's gradient");
                for (size_t i = 0; i < wte; i++) {
                    off += wg[i] != r[k].got[i];
                }
            }
            CHECK(r[k].bad == 0 && r[k].next == 0 && err <= (MT_CUDA_EMULATED ? 0.0 : 1e-5 * top) &&
                      werr <= 1e-6 * wtop + (MT_CUDA_EMULATED ? 0.0 : 1e-5 * wtop) && off == 0,
                  "%s zero-%d stage %d pass %d: %d runs (%d out of order, ending at %zu), gradients off by %g "
                  "(largest %g), wte by %g (largest %g), %d of wte's accumulator unlike its run",
                  pn, zero3 ? 3 : 2, k, pass, r[k].runs, r[k].bad, r[k].next, err, top, werr, wtop, off);
        }
    }
    for (int k = 0; k < 3; k++) {
        CHECK(!zero3 || c[k].calls == 1, "%s zero-3 stage %d: %d weight gathers for its one block", pn, k,
              c[k].calls);
        float *acc = mt_gpt2_cuda_wte_grad(st[k]);
        if (acc) { /* zero_grads clears the accumulator */
            CHECK_OK(mt_gpt2_cuda_zero_grads(st[k]));
            CHECK(cudaStreamSynchronize((cudaStream_t)r[k].stream) == cudaSuccess &&
                      cudaMemcpy(wg, acc, wte * 4, cudaMemcpyDeviceToHost) == cudaSuccess,
                  "copy wte's gradient");
            int nz = 0;
            for (size_t i = 0; i < wte; i++) {
                nz += wg[i] != 0.0f;
            }
            CHECK(nz == 0, "%s zero-%d stage %d: %d of wte's gradient left after zero_grads", pn, zero3 ? 3 : 2, k,
                  nz);
        }
    }
    free(wg);
done:
    for (int k = 0; k < 3; k++) {
        mt_gpt2_cuda_free(st[k]);
        free(r[k].got);
        free(want[k]);
    }
}

/* A ZeRO-2 hook that reads as an engine does: each run copied on its own consumer stream (not the trainer's), behind
 * an event on the trainer's stream, into pass `pass`'s device buffer, and nothing waited for until the caller
 * synchronises the consumer. */
typedef struct {
    cudaStream_t consumer, compute;
    cudaEvent_t ready;
    float *dev[2]; /* a pass's runs at their place in the stage layout */
    int pass;
} lazy_runs_t;

static mt_status_t lazy_run(void *arg, size_t lo, size_t hi, float *grads) {
    lazy_runs_t *r = arg;
    CHECK(cudaEventRecord(r->ready, r->compute) == cudaSuccess &&
              cudaStreamWaitEvent(r->consumer, r->ready, 0) == cudaSuccess &&
              cudaMemcpyAsync(r->dev[r->pass] + lo, grads, (hi - lo) * 4, cudaMemcpyDeviceToDevice, r->consumer) ==
                  cudaSuccess,
          "queue a run's copy");
    return MT_OK;
}

/* The MLP as two pipeline stages under ZeRO-2 (shard 0 of 2; layer 0 with the embedding, layers 1-2 with the
 * head, which owns no wte), its runs read on a consumer stream of their own: two passes of different targets
 * give, run by run, the unsharded model's gradients of each pass; the head's pool (gouter on the last stage) must
 * not be cleared for the second pass before the consumer has read the first (outer_free). */
static void mlp_zero2_stages(void) {
    mt_model_t m = build_mlp(MT_RECOMPUTE_NONE);
    int32_t tok[B * T], tgt[2][B * T];
    data(tok, tgt[0]);
    for (int i = 0; i < B * T; i++) {
        tgt[1][i] = tgt[0][i] < 0 ? -1 : (tgt[0][i] * 7 + 3) % 100;
    }
    size_t n = mt_model_numel(m), act = (size_t)B * T * mt_model_config(m)->n_embd * 4;
    mt_gpt2_cuda_params_t p = params_for(MT_PREC_FP32, 1.0f);
    float *want[2] = {malloc(n * 4), malloc(n * 4)}, loss = 0;
    for (int k = 0; k < 2; k++) {
        mt_gpt2_cuda_t w = NULL;
        whole_model(m, &p, tok, tgt[k], want[k], &loss, &w);
        mt_gpt2_cuda_free(w);
    }
    mt_gpt2_cuda_t st[2] = {NULL, NULL};
    lazy_runs_t r[2];
    memset(r, 0, sizeof(r));
    for (int k = 0; k < 2; k++) {
        mt_gpt2_cuda_params_t q = p;
        q.stage_lo = k == 0 ? 0 : 1;
        q.stage_hi = k == 0 ? 1 : 3;
        q.stage_ends = k == 0 ? 1 : 2;
        q.shard_count = 2;
        q.shard_grads = true;
        CHECK_OK(mt_gpt2_cuda_init(m, &q, &st[k]));
        if (!st[k]) {
            goto done;
        }
        size_t sn = mt_gpt2_cuda_numel(st[k]);
        r[k].compute = (cudaStream_t)mt_gpt2_cuda_stream(st[k]);
        CHECK(cudaStreamCreateWithFlags(&r[k].consumer, cudaStreamNonBlocking) == cudaSuccess &&
                  cudaEventCreateWithFlags(&r[k].ready, cudaEventDisableTiming) == cudaSuccess &&
                  cudaMalloc((void **)&r[k].dev[0], sn * 4) == cudaSuccess &&
                  cudaMalloc((void **)&r[k].dev[1], sn * 4) == cudaSuccess,
              "consumer stream and buffers");
        mt_gpt2_cuda_set_grad_hook(st[k], lazy_run, &r[k]);
        mt_gpt2_cuda_set_comm_stream(st[k], r[k].consumer);
        CHECK_OK(mt_gpt2_cuda_zero_grads(st[k]));
    }
    for (int pass = 0; pass < 2; pass++) {
        r[0].pass = r[1].pass = pass;
        CHECK_OK(mt_gpt2_cuda_forward(st[0], tok, NULL));
        hand_over(st[0], mt_gpt2_cuda_stage_output(st[0]), st[1], mt_gpt2_cuda_stage_input(st[1]), act);
        CHECK_OK(mt_gpt2_cuda_forward(st[1], NULL, tgt[pass]));
        CHECK_OK(mt_gpt2_cuda_backward(st[1], 1.0f));
        hand_over(st[1], mt_gpt2_cuda_stage_grad(st[1]), st[0], mt_gpt2_cuda_stage_grad(st[0]), act);
        CHECK_OK(mt_gpt2_cuda_backward(st[0], 1.0f));
    }
    for (int k = 0; k < 2; k++) {
        size_t sn = mt_gpt2_cuda_numel(st[k]);
        float *got = malloc(sn * 4);
        CHECK(cudaStreamSynchronize(r[k].consumer) == cudaSuccess, "sync the consumer");
        for (int pass = 0; pass < 2; pass++) {
            CHECK(cudaMemcpy(got, r[k].dev[pass], sn * 4, cudaMemcpyDeviceToHost) == cudaSuccess, "read a pass");
            double err = 0, top = 0;
            for (int i = 0; i < mt_model_n_params(m); i++) { /* each parameter of the stage at its stage offset */
                const mt_param_t *pp = mt_model_param(m, i);
                size_t off = mt_gpt2_cuda_param_offset(st[k], i);
                for (size_t e = 0; off != SIZE_MAX && e < pp->numel; e++) {
                    err = fmax(err, fabs((double)got[off + e] - want[pass][pp->offset + e]));
                    top = fmax(top, fabs((double)want[pass][pp->offset + e]));
                }
            }
            CHECK(top > 0 && err <= (MT_CUDA_EMULATED ? 0.0 : 1e-5 * top), "mlp zero-2 stage %d pass %d: the runs "
                  "read on the consumer off by %g (largest %g)", k, pass, err, top);
        }
        free(got);
    }
done:
    for (int k = 0; k < 2; k++) {
        mt_gpt2_cuda_free(st[k]);
        if (r[k].consumer) {
            cudaStreamSynchronize(r[k].consumer);
            cudaStreamDestroy(r[k].consumer);
            cudaEventDestroy(r[k].ready);
            cudaFree(r[k].dev[0]);
            cudaFree(r[k].dev[1]);
        }
    }
    free(want[0]);
    free(want[1]);
    mt_model_free(m);
}

/* Pipeline stages: a 3-block model as three stages (first [0, 1), middle [1, 2), last [2, 3)), activations
 * and their gradients handed from stage to stage, against the whole model on the device: the same loss and
 * the same gradient of every parameter — exactly under the emulator (the same kernels on the same stored
 * values), to 1e-5 of the largest on a device; wte's, the first stage's plus the last's, to 1e-6 of the
 * largest (the head's and the embedding's parts summed in another order); each stage holds only its
 * parameters; bad stage bounds and a missing tokens/targets array are refused; ZeRO-2 and ZeRO-3 on the stages
 * (sharded_stages). */
static void stage_contract(mt_prec_t prec, mt_recompute_t rc) {
    mt_model_t m = build_layers(rc, 3);
    size_t n = mt_model_numel(m);
    int np = mt_model_n_params(m);
    int32_t tok[B * T], tgt[B * T];
    data(tok, tgt);
    mt_gpt2_cuda_params_t p = params_for(prec, 1024.0f);
    const char *pn = mt_prec_name(prec);
    mt_gpt2_cuda_t whole = NULL, st[3] = {NULL, NULL, NULL}, bad = NULL;
    float *want = malloc(n * 4), *got = calloc(n, 4), *sg = malloc(n * 4), loss0 = 0, loss = 0;
    whole_model(m, &p, tok, tgt, want, &loss0, &whole);
    p.stage_lo = 2;
    p.stage_hi = 2;
    CHECK(mt_gpt2_cuda_init(m, &p, &bad) == MT_ERR_INVALID_ARG, "%s: an empty stage accepted", pn);
    p.stage_hi = 4;
    CHECK(mt_gpt2_cuda_init(m, &p, &bad) == MT_ERR_INVALID_ARG, "%s: a stage past the last block accepted", pn);
    for (int k = 0; k < 3; k++) {
        p.stage_lo = k;
        p.stage_hi = k + 1;
        CHECK_OK(mt_gpt2_cuda_init(m, &p, &st[k]));
        if (!st[k]) {
            goto done;
        }
        CHECK_OK(mt_gpt2_cuda_zero_grads(st[k]));
    }
    CHECK(mt_gpt2_cuda_forward(st[0], NULL, tgt) == MT_ERR_INVALID_USAGE &&
              mt_gpt2_cuda_forward(st[2], tok, NULL) == MT_ERR_INVALID_USAGE,
          "%s: a stage without its tokens / targets accepted", pn);
    run_stages(m, prec, st, tok, tgt, &loss);
    /* every parameter's gradient from the stages holding it, summed (only wte is on two) */
    size_t held_total = 0;
    for (int k = 0; k < 3; k++) {
        CHECK_OK(mt_gpt2_cuda_get_grads(st[k], sg));
        for (int i = 0; i < np; i++) {
            const mt_param_t *pp = mt_model_param(m, i);
            size_t o = mt_gpt2_cuda_param_offset(st[k], i);
            for (size_t e = 0; o != SIZE_MAX && e < pp->numel; e++) {
                got[pp->offset + e] += sg[o + e];
            }
            held_total += o != SIZE_MAX ? pp->numel : 0;
        }
    }
    /* wte (at offset 0) sums the head's and the embedding's parts in another order than the whole model */
    size_t wte = mt_model_param(m, 0)->numel;
    double top = 0, err_wte = max_diff(got, want, 0, wte, NULL), err = max_diff(got, want, wte, n, NULL);
    max_diff(got, want, 0, n, &top);
    double ltol = MT_CUDA_EMULATED ? 0.0 : 1e-6 * loss0, gtol = MT_CUDA_EMULATED ? 0.0 : 1e-5 * top;
    CHECK(fabs(loss - loss0) <= ltol && err <= gtol && err_wte <= MT_MAX(gtol, 1e-6 * top) && held_total == n + wte,
          "%s%s stages: loss %.9g (whole %.9g), gradients off by %g, wte by %g (largest %g), %zu parameters held "
          "(model %zu + wte %zu)",
          pn, rc == MT_RECOMPUTE_BLOCK ? " recompute" : "", loss, loss0, err, err_wte, top, held_total, n, wte);
    sharded_stages(m, &p, st, tok, tgt, loss, false);
    sharded_stages(m, &p, st, tok, tgt, loss, true);
done:
    for (int k = 0; k < 3; k++) {
        mt_gpt2_cuda_free(st[k]);
    }
    mt_gpt2_cuda_free(whole);
    free(want);
    free(got);
    free(sg);
    mt_model_free(m);
}

/* Activation sets: two micro-batches forwarded into sets 0 and 1, then both backwards (the pipeline's order),
 * accumulate the gradients and losses of forward + backward of each in turn with one set — exactly under the
 * emulator, 1e-5 of the largest on a device; with recompute = block the sets share the internals, so set 0's
 * backward must refill its last block. A set out of range is refused. */
static void sets_contract(mt_recompute_t rc) {
    mt_model_t m = build_rc(rc);
    size_t n = mt_model_numel(m);
    int32_t tok[2][B * T], tgt[2][B * T];
    data(tok[0], tgt[0]);
    for (int i = 0; i < B * T; i++) { /* a second micro-batch */
        tok[1][i] = (tok[0][i] * 7 + 3) % 100;
        tgt[1][i] = tgt[0][i] < 0 ? -1 : (tgt[0][i] * 5 + 1) % 100;
    }
    mt_gpt2_cuda_params_t p = params_for(MT_PREC_FP32, 1.0f);
    mt_gpt2_cuda_t one = NULL, two = NULL;
    float *want = malloc(n * 4), *got = malloc(n * 4), lw[2] = {0}, lg[2] = {0};
    CHECK_OK(mt_gpt2_cuda_init(m, &p, &one));
    p.act_sets = 2;
    CHECK_OK(mt_gpt2_cuda_init(m, &p, &two));
    CHECK(mt_gpt2_cuda_use_acts(two, 2) == MT_ERR_INVALID_ARG, "activation set 2 of 2 accepted");
    CHECK_OK(mt_gpt2_cuda_zero_grads(one));
    CHECK_OK(mt_gpt2_cuda_zero_grads(two));
    for (int k = 0; k < 2; k++) {
        CHECK_OK(mt_gpt2_cuda_forward(one, tok[k], tgt[k]));
        CHECK_OK(mt_gpt2_cuda_loss(one, &lw[k]));
        CHECK_OK(mt_gpt2_cuda_backward(one, 0.5f));
        CHECK_OK(mt_gpt2_cuda_use_acts(two, k));
        CHECK_OK(mt_gpt2_cuda_forward(two, tok[k], tgt[k]));
        CHECK_OK(mt_gpt2_cuda_loss(two, &lg[k]));
    }
    for (int k = 0; k < 2; k++) {
        CHECK_OK(mt_gpt2_cuda_use_acts(two, k));
        CHECK_OK(mt_gpt2_cuda_backward(two, 0.5f));
    }
    CHECK_OK(mt_gpt2_cuda_get_grads(one, want));
    CHECK_OK(mt_gpt2_cuda_get_grads(two, got));
    double top = 0, err = max_diff(got, want, 0, n, &top);
    CHECK(lw[0] == lg[0] && lw[1] == lg[1] && err <= (MT_CUDA_EMULATED ? 0.0 : 1e-5 * top),
          "%s activation sets: losses %.9g %.9g (one set %.9g %.9g), gradients off by %g (largest %g)",
          rc == MT_RECOMPUTE_BLOCK ? "recompute" : "plain", lg[0], lg[1], lw[0], lw[1], err, top);
    mt_gpt2_cuda_free(one);
    mt_gpt2_cuda_free(two);
    free(want);
    free(got);
    mt_model_free(m);
}

int main(void) {
    if (mt_cuda_device_count() == 0) {
        printf("skipped: no CUDA device\n");
        return MT_TEST_SKIP;
    }
    for (int p = 0; p < MT_PREC_COUNT; p++) {
        compare_grads((mt_prec_t)p);
    }
    compare_recompute(MT_PREC_FP32);
    compare_recompute(MT_PREC_BF16);
    shard_contract(MT_PREC_FP32);
    shard_contract(MT_PREC_BF16);
    stage_contract(MT_PREC_FP32, MT_RECOMPUTE_NONE);
    stage_contract(MT_PREC_BF16, MT_RECOMPUTE_NONE);
    stage_contract(MT_PREC_FP32, MT_RECOMPUTE_BLOCK);
    mlp_zero2_stages();
    sets_contract(MT_RECOMPUTE_NONE);
    sets_contract(MT_RECOMPUTE_BLOCK);
    float cpu_losses[STEPS];
    cpu_train(cpu_losses);
    int skipped = 0;
    train(MT_PREC_FP32, 1, cpu_losses, &skipped);
    train(MT_PREC_BF16, 1, NULL, &skipped);
    train(MT_PREC_FP16, 1024.0f, NULL, &skipped);
    CHECK(skipped == 0, "fp16 at scale 1024 does not overflow (%d skipped)", skipped);
    train(MT_PREC_FP16, 16777216.0f, NULL, &skipped);
    CHECK(skipped >= 1, "fp16 from 2^24 overflows and skips (%d skipped)", skipped);
    return mt_test_finish("test_gpt2_cuda");
}
