/* GPU benchmarks for bench/gpu_check.sh, each printing human lines and one machine line starting "RESULT":
 *   gpu_bench peak  [-n 8192] [-r 10]               dense matrix rate of cuBLASLt per dtype (f32, tf32, bf16,
 *                                                  f16): the ceiling MFU is measured against, in the same run
 *   gpu_bench train [-p bf16] [-B 16] [-T 1024] [-L 12] [-C 768] [-H 12] [-V 50257] [-n 10] [--peak TFLOPS]
 *                   [--profile] [--head-chunks K]  (--profile: time per step by kernel category; --head-chunks:
 *                                                  model.head_chunks, the logits in K chunks recomputed)
 *                                                  GPT-2 training steps (forward, backward, AdamW) on the GPU:
 *                                                  tokens/s, model FLOP utilisation (PaLM appendix-B FLOPs,
 *                                                  as bench_model), the forward/backward/step split, peak
 *                                                  device memory, and energy per step where NVML is present
 *   gpu_bench attn  [-p bf16] [-B 8] [-T 1024] [-C 768] [-H 12] [-r 10]
 *                                                  the attention kernels against the plain version that
 *                                                  stores the T x T probabilities, and the flash kernels
 *                                                  on the path selected (tensor cores for bf16/f16)
 *                                                  against the same forced onto CUDA cores
 *   gpu_bench ops   [-p bf16] [-B 16] [-T 1024] [-L 12] [-C 768] [-H 12] [-V 50257] [-r 10]
 *                                                  every kernel of a training step on its own at the model's
 *                                                  shapes: time, rate against the ceilings measured in the
 *                                                  same run (dense product, device copy), time per step
 * Times are medians over the timed repetitions, measured with CUDA events on the compute stream.
 * SPDX-License-Identifier: MIT */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "models/cuda/cuda_backend.h"
#include "models/cuda/gemm_peak.h"
#include "models/cuda/gpt2_cuda.h"
#include "runtime/cuda_alloc.h"
#include "runtime/nvml.h"

#define DIE(...)                                                                                                       \
    do {                                                                                                               \
        fprintf(stderr, "gpu_bench: ");                                                                                \
        fprintf(stderr, __VA_ARGS__);                                                                                  \
        fprintf(stderr, "\n");                                                                                         \
        exit(1);                                                                                                       \
    } while (0)
#define OK(call)                                                                                                       \
    do {                                                                                                               \
        mt_status_t st_ = (call);                                                                                      \
        if (st_ != MT_OK) {                                                                                            \
            DIE("%s: %s (%s)", #call, mt_status_str(st_), mt_last_error_msg());                                        \
        }                                                                                                              \
    } while (0)
#define CU(call) OK(mt_cuda_status((call), #call))

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static float median(float *v, int n) {
    qsort(v, (size_t)n, sizeof(float), cmp_f);
    return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct {
    int n, reps, B, T, L, C, H, V, steps;
    mt_prec_t prec;
    double peak;
    bool profile; /* train: per-kernel breakdown of the timed steps (their times then include the events) */
    int head_chunks; /* train: model.head_chunks */
} opts_t;

/* ---- peak ---- */

/* The product and its timing are models/cuda/gemm_peak.h, which the GPU engine of `meshtrain train` also
 * measures its MFU denominator with. */
static int cmd_peak(const opts_t *o) {
    static const mt_prec_t modes[] = {MT_PREC_FP32, MT_PREC_TF32, MT_PREC_BF16, MT_PREC_FP16};
    double tf[4];
    for (int i = 0; i < 4; i++) {
        double f = 0.0;
        OK(mt_cuda_gemm_peak(modes[i], o->n, o->reps, NULL, &f));
        tf[i] = f / 1e12;
        printf("gemm %d^3 %-5s %8.1f TFLOP/s (median of %d)\n", o->n, mt_prec_name(modes[i]), tf[i], o->reps);
    }
    printf("RESULT peak n=%d fp32=%.2f tf32=%.2f bf16=%.2f fp16=%.2f\n", o->n, tf[0], tf[1], tf[2], tf[3]);
    return 0;
}

/* ---- train ---- */

static int cmd_train(const opts_t *o) {
    mt_model_config_t c = MT_MODEL_CONFIG_INIT;
    c.kind = MT_MODEL_GPT2;
    c.n_layer = o->L;
    c.n_head = o->H;
    c.n_embd = o->C;
    c.seq_len = o->T;
    c.vocab_size = o->V;
    c.head_chunks = o->head_chunks;
    c.seed = 1;
    mt_model_t m;
    OK(mt_model_init(&c, &m));
    OK(mt_model_alloc_params(m));
    mt_model_init_weights(m);
    mt_gpt2_cuda_params_t p = MT_GPT2_CUDA_PARAMS_INIT;
    p.prec = o->prec;
    p.B = o->B;
    p.T = o->T;
    mt_mem_reset_peak(MT_MEM_DEVICE);
    mt_gpt2_cuda_t g;
    OK(mt_gpt2_cuda_init(m, &p, &g));
    cudaStream_t s = mt_gpt2_cuda_stream(g);
    int N = o->B * o->T;
    int32_t *tok = malloc((size_t)N * 4), *tgt = malloc((size_t)N * 4);
    unsigned r = 7;
    for (int i = 0; i < N; i++) {
        r = r * 1103515245u + 12345u;
        tok[i] = (int32_t)((r >> 8) % (unsigned)o->V);
        tgt[i] = (int32_t)((r >> 4) % (unsigned)o->V);
    }
    mt_optim_params_t op = MT_OPTIM_PARAMS_INIT;
    op.weight_decay = 0.1f;
    cudaEvent_t ev[4];
    for (int i = 0; i < 4; i++) {
        CU(cudaEventCreate(&ev[i]));
    }
    mt_nvml_t nv = NULL;
    char bus[32] = "";
    int dev = 0;
    CU(cudaGetDevice(&dev));
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), dev) != cudaSuccess || mt_nvml_open(bus, dev, &nv) != MT_OK) {
        printf("energy: not measured (%s)\n", mt_last_error_msg());
        nv = NULL;
    }
    int warm = 2, n = o->steps;
    float *t_step = malloc(sizeof(float) * (size_t)n), *t_f = malloc(sizeof(float) * (size_t)n);
    float *t_b = malloc(sizeof(float) * (size_t)n), *t_o = malloc(sizeof(float) * (size_t)n);
    double joules = 0, wall = 0;
    mt_gpt2_cuda_result_t res = {0};
    for (int k = -warm; k < n; k++) {
        if (k == 0 && o->profile) {
            OK(mt_gpt2_cuda_set_profile(g, true));
        }
        mt_nvml_meter_t meter;
        bool metered = nv && k >= 0 && mt_nvml_meter_begin(&meter, nv) == MT_OK;
        double w0 = mt_now();
        OK(mt_gpt2_cuda_zero_grads(g));
        CU(cudaEventRecord(ev[0], s));
        OK(mt_gpt2_cuda_forward(g, tok, tgt));
        CU(cudaEventRecord(ev[1], s));
        OK(mt_gpt2_cuda_backward(g, 1.0f));
        CU(cudaEventRecord(ev[2], s));
        OK(mt_gpt2_cuda_step(g, &op, 1e-4f, 1.0f));
        CU(cudaEventRecord(ev[3], s));
        OK(mt_gpt2_cuda_step_result(g, &res));
        double w = mt_now() - w0;
        if (k >= 0) {
            CU(cudaEventElapsedTime(&t_f[k], ev[0], ev[1]));
            CU(cudaEventElapsedTime(&t_b[k], ev[1], ev[2]));
            CU(cudaEventElapsedTime(&t_o[k], ev[2], ev[3]));
            CU(cudaEventElapsedTime(&t_step[k], ev[0], ev[3]));
            wall += w;
            double j = 0;
            if (metered && mt_nvml_meter_end(&meter, &j, NULL) == MT_OK) {
                joules += j;
            }
        }
    }
    double step_s = median(t_step, n) * 1e-3;
    double tps = (double)N / step_s;
    double flops = mt_model_flops_per_token(m, o->T) * tps;
    double mfu = o->peak > 0 ? flops / (o->peak * 1e12) : 0;
    mt_mem_stats_t ms;
    mt_mem_stats(MT_MEM_DEVICE, &ms);
    mt_cuda_alloc_t a;
    OK(mt_cuda_alloc_default(&a));
    mt_cuda_alloc_stats_t as;
    mt_cuda_alloc_get_stats(a, &as);
    printf("GPT-2 L=%d C=%d H=%d V=%d, B=%d T=%d, %s: %.1f ms/step (fwd %.1f, bwd %.1f, step %.1f), %.0f tokens/s, "
           "%.1f TFLOP/s, MFU %.1f%% of %.1f TFLOP/s; last loss %.4f, loss scale %g\n",
           o->L, o->C, o->H, o->V, o->B, o->T, mt_prec_name(o->prec), step_s * 1e3, median(t_f, n), median(t_b, n),
           median(t_o, n), tps, flops / 1e12, mfu * 100, o->peak, res.loss, res.loss_scale);
    printf("device memory: peak allocated %.2f GiB (params %.2f, grads %.2f, optimizer %.2f, activations %.2f, "
           "other %.2f at the peak), peak reserved %.2f GiB, %lld cudaMalloc calls\n",
           ms.total_peak / 1073741824.0, ms.at_peak[MT_MEM_PARAMS] / 1073741824.0,
           ms.at_peak[MT_MEM_GRADS] / 1073741824.0, ms.at_peak[MT_MEM_OPTIMIZER] / 1073741824.0,
           ms.at_peak[MT_MEM_ACTIVATIONS] / 1073741824.0, ms.at_peak[MT_MEM_OTHER] / 1073741824.0,
           as.peak_reserved_bytes / 1073741824.0, (long long)as.n_raw_allocs);
    if (o->profile) {
        double pms[MT_GPT2_PROF_COUNT], tot = 0;
        int64_t ps = 0;
        mt_gpt2_cuda_profile(g, pms, &ps);
        for (int c = 0; c < MT_GPT2_PROF_COUNT; c++) {
            tot += pms[c];
        }
        printf("time per step by kernel (%lld profiled steps, event after every launch):\n", (long long)ps);
        for (int c = 0; c < MT_GPT2_PROF_COUNT; c++) {
            printf("  %-14s %9.3f ms  %5.1f%%\n", mt_gpt2_prof_name((mt_gpt2_prof_t)c),
                   ps > 0 ? pms[c] / (double)ps : 0, tot > 0 ? 100.0 * pms[c] / tot : 0.0);
        }
        printf("RESULT prof prec=%s", mt_prec_name(o->prec));
        for (int c = 0; c < MT_GPT2_PROF_COUNT; c++) {
            printf(" %d=%.3f", c, ps > 0 ? pms[c] / (double)ps : 0);
        }
        printf("\n");
    }
    double jps = nv && n > 0 ? joules / n : 0;
    if (nv) {
        printf("energy: %.1f J/step, %.1f W mean, %.0f tokens/J\n", jps, joules / wall, jps > 0 ? N / jps : 0);
    }
    printf("RESULT train prec=%s B=%d T=%d ms_step=%.3f tok_s=%.0f tflops=%.2f mfu=%.4f peak_gib=%.3f "
           "energy_j=%.2f tokens_per_j=%.1f loss=%.4f\n",
           mt_prec_name(o->prec), o->B, o->T, step_s * 1e3, tps, flops / 1e12, mfu, ms.total_peak / 1073741824.0, jps,
           jps > 0 ? N / jps : 0, res.loss);
    mt_nvml_close(nv);
    for (int i = 0; i < 4; i++) {
        cudaEventDestroy(ev[i]);
    }
    mt_gpt2_cuda_free(g);
    mt_model_free(m);
    free(tok), free(tgt), free(t_step), free(t_f), free(t_b), free(t_o);
    return 0;
}

/* ---- attention ---- */

static int cmd_attn(const opts_t *o) {
    int dt = (int)mt_prec_storage(o->prec);
    size_t es = dt == MT_CU_F32 ? 4 : 2;
    size_t nqkv = (size_t)o->B * o->T * 3 * o->C, nout = (size_t)o->B * o->T * o->C;
    size_t nl = (size_t)o->B * o->H * o->T;
    cudaStream_t s;
    CU(cudaStreamCreate(&s));
    void *qkv, *out, *dqkv, *dout, *h;
    float *lse, *att, *scr;
    OK(mt_dev_malloc(&qkv, nqkv * es, MT_MEM_ACTIVATIONS, "qkv", s));
    OK(mt_dev_malloc(&dqkv, nqkv * es, MT_MEM_ACTIVATIONS, "dqkv", s));
    OK(mt_dev_malloc(&out, nout * es, MT_MEM_ACTIVATIONS, "out", s));
    OK(mt_dev_malloc(&dout, nout * es, MT_MEM_ACTIVATIONS, "dout", s));
    OK(mt_dev_malloc((void **)&lse, nl * 4, MT_MEM_ACTIVATIONS, "lse", s));
    OK(mt_dev_malloc((void **)&att, nl * o->T * 4, MT_MEM_ACTIVATIONS, "att (plain)", s));
    OK(mt_dev_malloc((void **)&scr, mt_cuda_attention_scratch_floats(o->B, o->T, o->H) * 4, MT_MEM_OTHER, "s", s));
    OK(mt_dev_malloc(&h, nqkv * 4, MT_MEM_OTHER, "host-init", s));
    float *hh = malloc(nqkv * 4);
    unsigned r = 3;
    for (size_t i = 0; i < nqkv; i++) {
        r = r * 1664525u + 1013904223u;
        hh[i] = (float)(r >> 9) / 8388608.0f - 0.5f;
    }
    CU(cudaMemcpy(h, hh, nqkv * 4, cudaMemcpyHostToDevice));
    CU(mt_cuda_convert(qkv, dt, h, MT_CU_F32, nqkv, 2.0f, s));
    CU(mt_cuda_convert(dout, dt, h, MT_CU_F32, nout, 1.0f, s));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    /* 0 flash forward, 1 plain forward, 2 flash backward, each on the path the library selects (tensor cores
     * for bf16/f16 unless MESHTRAIN_ATTN_TC=0); 3, 4 the flash forward and backward forced onto CUDA cores */
    int hs = o->C / o->H, tc_f = mt_cuda_attention_tc_path(dt, hs, 0), tc_b = mt_cuda_attention_tc_path(dt, hs, 1);
    float *ms = malloc(sizeof(float) * (size_t)o->reps), t[7];
    unsigned long mf = mt_cuda_attention_mma_launches(0), mb = mt_cuda_attention_mma_launches(1);
    for (int which = 0; which < 7; which++) {
        /* 5, 6: the WMMA tensor-core kernels (mode 2), where the selected path runs the mma.sync ones */
        mt_cuda_attention_set_tc(which >= 5 ? 2 : which >= 3 ? 0 : -1);
        for (int k = -1; k < o->reps; k++) {
            CU(cudaEventRecord(e0, s));
            if (which == 0 || which == 3 || which == 5) {
                CU(mt_cuda_attention_forward(out, lse, qkv, o->B, o->T, o->C, o->H, dt, s));
            } else if (which == 1) {
                CU(mt_cuda_attention_plain_forward(out, att, lse, qkv, o->B, o->T, o->C, o->H, dt, s));
            } else {
                CU(mt_cuda_attention_backward(dqkv, dout, qkv, out, lse, o->B, o->T, o->C, o->H, dt, scr, s));
            }
            CU(cudaEventRecord(e1, s));
            CU(cudaEventSynchronize(e1));
            if (k >= 0) {
                CU(cudaEventElapsedTime(&ms[k], e0, e1));
            }
        }
        t[which] = median(ms, o->reps);
        if (which == 2) { /* did the selected path run the mma.sync kernels? */
            mf = mt_cuda_attention_mma_launches(0) - mf;
            mb = mt_cuda_attention_mma_launches(1) - mb;
        }
    }
    mt_cuda_attention_set_tc(-1);
    /* causal attention FLOPs: forward 2 products over the causal half, 2 * 2 * B*H*T*T/2 * hs; backward 5 */
    double f_fwd = 2.0 * o->B * o->H * (double)o->T * o->T * hs, f_bwd = 2.5 * f_fwd;
    printf("attention B=%d T=%d C=%d H=%d %s: flash forward (%s) %.3f ms (%.1f TFLOP/s), plain forward (stores %.0f "
           "MiB of probabilities) %.3f ms, flash backward (%s) %.3f ms (%.1f TFLOP/s); plain/flash %.1fx\n",
           o->B, o->T, o->C, o->H, mt_prec_name(o->prec), tc_f ? "tensor cores" : "CUDA cores", t[0],
           f_fwd / (t[0] * 1e-3) / 1e12, nl * o->T * 4 / 1048576.0, t[1], tc_b ? "tensor cores" : "CUDA cores", t[2],
           f_bwd / (t[2] * 1e-3) / 1e12, t[1] / t[0]);
    printf("attention on CUDA cores (MESHTRAIN_ATTN_TC=0): forward %.3f ms (%.1f TFLOP/s), backward %.3f ms (%.1f "
           "TFLOP/s)\n",
           t[3], f_fwd / (t[3] * 1e-3) / 1e12, t[4], f_bwd / (t[4] * 1e-3) / 1e12);
    printf("attention on the WMMA tensor-core kernels (MESHTRAIN_ATTN_TC=2): forward %.3f ms (%.1f TFLOP/s), backward "
           "%.3f ms (%.1f TFLOP/s)\n",
           t[5], f_fwd / (t[5] * 1e-3) / 1e12, t[6], f_bwd / (t[6] * 1e-3) / 1e12);
    printf(
        "RESULT attn prec=%s B=%d T=%d tc_fwd=%d tc_bwd=%d mma_fwd=%d mma_bwd=%d flash_fwd_ms=%.4f plain_fwd_ms=%.4f "
        "flash_bwd_ms=%.4f simt_fwd_ms=%.4f simt_bwd_ms=%.4f wmma_fwd_ms=%.4f wmma_bwd_ms=%.4f\n",
        mt_prec_name(o->prec), o->B, o->T, tc_f, tc_b, mf > 0, mb > 0, t[0], t[1], t[2], t[3], t[4], t[5], t[6]);
    void *bufs[] = {qkv, out, dqkv, dout, lse, att, scr, h};
    for (size_t i = 0; i < MT_ARRAY_LEN(bufs); i++) {
        mt_dev_free(bufs[i]);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaStreamDestroy(s);
    free(hh), free(ms);
    return 0;
}

/* ---- ops ---- */

/* Each kernel of a GPT-2 training step on its own, at the model's shapes (-B -T -C -H -V), in the storage
 * dtype of -p: median time, the rate it reached (TFLOP/s for products and attention, GB/s of the fewest bytes
 * it must move for the rest) against the ceilings measured first in the same run (cuBLASLt's 8192^3 product
 * in that dtype, a device-to-device copy), and its time per training step (times the number of calls a step
 * makes). The gap between the two columns says where a step's time goes beyond its floor. */
typedef struct {
    cudaStream_t s;
    cudaEvent_t e0, e1;
    int reps;
    float *ms;
    double peak, bw; /* FLOP/s and bytes/s ceilings */
    double step_ms;
} ops_ctx_t;

static void ops_report(ops_ctx_t *x, const char *name, float ms, double flops, double bytes, int per_step) {
    double rate = flops > 0 ? flops / (ms * 1e-3) : bytes / (ms * 1e-3);
    double ceil = flops > 0 ? x->peak : x->bw;
    x->step_ms += ms * per_step;
    printf("  %-28s %9.4f ms %9.1f %-7s %5.1f%% of ceiling  x%-3d %8.3f ms/step\n", name, ms,
           flops > 0 ? rate / 1e12 : rate / 1e9, flops > 0 ? "TFLOP/s" : "GB/s", 100.0 * rate / ceil, per_step,
           ms * per_step);
    printf("RESULT op name=%s ms=%.5f rate=%.2f unit=%s frac=%.4f per_step=%d\n", name, ms,
           flops > 0 ? rate / 1e12 : rate / 1e9, flops > 0 ? "TFLOPs" : "GBs", rate / ceil, per_step);
}

/* times CALL (one or more launches on x->s) with events: 2 warm-ups, then the median of x->reps */
#define OPS_TIME(x, out_ms, CALL)                                                                                      \
    do {                                                                                                               \
        for (int k_ = -2; k_ < (x)->reps; k_++) {                                                                      \
            CU(cudaEventRecord((x)->e0, (x)->s));                                                                      \
            CALL;                                                                                                      \
            CU(cudaEventRecord((x)->e1, (x)->s));                                                                      \
            CU(cudaEventSynchronize((x)->e1));                                                                         \
            if (k_ >= 0) {                                                                                             \
                CU(cudaEventElapsedTime(&(x)->ms[k_], (x)->e0, (x)->e1));                                              \
            }                                                                                                          \
        }                                                                                                              \
        (out_ms) = median((x)->ms, (x)->reps);                                                                         \
    } while (0)

/* dst (n elements of dt) = uniform(-scale/2, scale/2), from a host pattern converted in chunks */
static void ops_fill(void *dst, int dt, size_t n, float scale, const float *src_d, size_t chunk, cudaStream_t s) {
    size_t es = dt == MT_CU_F32 ? 4 : 2;
    for (size_t off = 0; off < n; off += chunk) {
        size_t k = n - off < chunk ? n - off : chunk;
        CU(mt_cuda_convert((char *)dst + off * es, dt, src_d, MT_CU_F32, k, scale, s));
    }
}

static int cmd_ops(const opts_t *o) {
    int dt = (int)mt_prec_storage(o->prec);
    size_t es = dt == MT_CU_F32 ? 4 : 2;
    int B = o->B, T = o->T, C = o->C, H = o->H, V = o->V, L = o->L, N = B * T, Vp = (V + 127) / 128 * 128;
    size_t NC = (size_t)N * C;
    ops_ctx_t x = {.reps = o->reps};
    CU(cudaStreamCreate(&x.s));
    CU(cudaEventCreate(&x.e0));
    CU(cudaEventCreate(&x.e1));
    x.ms = malloc(sizeof(float) * (size_t)o->reps);
    /* ceilings: the dense product in this dtype, and a 2 GiB device-to-device copy (bytes read + written) */
    OK(mt_cuda_gemm_peak(o->prec, 8192, o->reps, x.s, &x.peak));
    void *cpa, *cpb;
    size_t cpn = (size_t)2 << 30;
    OK(mt_dev_malloc(&cpa, cpn, MT_MEM_OTHER, "copy a", x.s));
    OK(mt_dev_malloc(&cpb, cpn, MT_MEM_OTHER, "copy b", x.s));
    CU(cudaMemsetAsync(cpa, 1, cpn, x.s));
    float cms;
    OPS_TIME(&x, cms, CU(cudaMemcpyAsync(cpb, cpa, cpn, cudaMemcpyDeviceToDevice, x.s)));
    x.bw = 2.0 * (double)cpn / (cms * 1e-3);
    mt_dev_free(cpa), mt_dev_free(cpb);
    printf("ceilings: %s product %.1f TFLOP/s (cuBLASLt 8192^3), device copy %.1f GB/s (read + write)\n",
           mt_prec_name(o->prec), x.peak / 1e12, x.bw / 1e9);
    printf("GPT-2 kernels at B=%d T=%d C=%d H=%d V=%d (Vp %d) L=%d, %s, median of %d:\n", B, T, C, H, V, Vp, L,
           mt_prec_name(o->prec), o->reps);

    /* buffers: the largest of each role over the ops below */
    size_t n_in = (size_t)N * 4 * C, n_w = (size_t)Vp * C, n_out = (size_t)N * Vp;
    void *in, *w, *bias, *out, *pre, *dout, *h;
    float *dw, *db, *scr, *mean, *rstd, *lse, *losses, *mloss;
    int32_t *tgt;
    int *nvalid;
    size_t scr_f = mt_cuda_colsum_scratch_floats(Vp);
    size_t ln_f = mt_cuda_layernorm_scratch_floats(C), at_f = mt_cuda_attention_scratch_floats(B, T, H);
    scr_f = scr_f > ln_f ? scr_f : ln_f;
    scr_f = scr_f > at_f ? scr_f : at_f;
    OK(mt_dev_malloc(&in, n_in * es, MT_MEM_ACTIVATIONS, "in", x.s));
    OK(mt_dev_malloc(&w, n_w * es, MT_MEM_PARAMS, "w", x.s));
    OK(mt_dev_malloc(&bias, (size_t)Vp * es, MT_MEM_PARAMS, "bias", x.s));
    OK(mt_dev_malloc(&out, n_out * es, MT_MEM_ACTIVATIONS, "out", x.s));
    OK(mt_dev_malloc(&pre, n_in * es, MT_MEM_ACTIVATIONS, "pre", x.s));
    OK(mt_dev_malloc(&dout, n_out * es, MT_MEM_ACTIVATIONS, "dout", x.s));
    OK(mt_dev_malloc((void **)&dw, n_w * 4, MT_MEM_GRADS, "dw", x.s));
    OK(mt_dev_malloc((void **)&db, (size_t)Vp * 4, MT_MEM_GRADS, "db", x.s));
    OK(mt_dev_malloc((void **)&scr, scr_f * 4, MT_MEM_OTHER, "scratch", x.s));
    OK(mt_dev_malloc((void **)&mean, (size_t)N * 4, MT_MEM_ACTIVATIONS, "mean", x.s));
    OK(mt_dev_malloc((void **)&rstd, (size_t)N * 4, MT_MEM_ACTIVATIONS, "rstd", x.s));
    OK(mt_dev_malloc((void **)&lse, (size_t)N * H * 4, MT_MEM_ACTIVATIONS, "lse", x.s));
    OK(mt_dev_malloc((void **)&losses, (size_t)N * 4, MT_MEM_ACTIVATIONS, "losses", x.s));
    OK(mt_dev_malloc((void **)&mloss, 4, MT_MEM_OTHER, "mean loss", x.s));
    OK(mt_dev_malloc((void **)&nvalid, 4, MT_MEM_OTHER, "n valid", x.s));
    OK(mt_dev_malloc((void **)&tgt, (size_t)N * 4, MT_MEM_ACTIVATIONS, "targets", x.s));
    size_t chunk = (size_t)1 << 24;
    OK(mt_dev_malloc(&h, chunk * 4, MT_MEM_OTHER, "pattern", x.s));
    float *hp = malloc(chunk * 4);
    int32_t *ht = malloc((size_t)N * 4);
    unsigned r = 11;
    for (size_t i = 0; i < chunk; i++) {
        r = r * 1664525u + 1013904223u;
        hp[i] = (float)(r >> 9) / 8388608.0f - 0.5f;
    }
    for (int i = 0; i < N; i++) {
        r = r * 1664525u + 1013904223u;
        ht[i] = (int32_t)((r >> 8) % (unsigned)V);
    }
    CU(cudaMemcpy(h, hp, chunk * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(tgt, ht, (size_t)N * 4, cudaMemcpyHostToDevice));
    ops_fill(in, dt, n_in, 2.0f, h, chunk, x.s);
    ops_fill(w, dt, n_w, 0.04f, h, chunk, x.s);
    ops_fill(bias, dt, (size_t)Vp, 0.1f, h, chunk, x.s);
    ops_fill(dout, dt, n_out, 0.02f, h, chunk, x.s);
    ops_fill(out, dt, n_out, 4.0f, h, chunk, x.s);
    CU(cudaMemsetAsync(dw, 0, n_w * 4, x.s));
    CU(cudaMemsetAsync(db, 0, (size_t)Vp * 4, x.s));
    /* the products' context as the trainer makes it (32 MiB cuBLASLt workspace, tf32 in tf32 mode) */
    void *ws;
    OK(mt_dev_malloc(&ws, (size_t)32 << 20, MT_MEM_OTHER, "cuBLASLt workspace", x.s));
    mt_cuda_ctx_t lt;
    CU(mt_cuda_ctx_create(&lt, ws, (size_t)32 << 20, o->prec == MT_PREC_TF32));

    /* the products of one step: name, OC, input width, calls per step, ldo */
    struct {
        const char *name;
        int oc, ic, per_step, ldo, gelu;
    } mm[] = {{"qkv", 3 * C, C, L, 3 * C, 0},        {"attn proj", C, C, L, C, 0},
              {"fc (+gelu)", 4 * C, C, L, 4 * C, 1}, {"fc proj", C, 4 * C, L, C, 0},
              {"lm head (V)", V, C, 1, Vp, 0},       {"lm head (Vp, padded)", Vp, C, 0, Vp, 0}};
    char nm[64];
    float t;
    for (size_t i = 0; i < MT_ARRAY_LEN(mm); i++) {
        int OC = mm[i].oc, IC = mm[i].ic, ps = mm[i].per_step;
        double f = 2.0 * N * (double)IC * OC;
        const void *bi = i < 4 ? bias : NULL;
        snprintf(nm, sizeof(nm), "%s fwd", mm[i].name);
        OPS_TIME(
            &x, t,
            CU(mt_cuda_matmul_forward(lt, out, mm[i].ldo, mm[i].gelu ? pre : NULL, in, w, bi, N, IC, OC, dt, x.s)));
        ops_report(&x, nm, t, f, 0, ps);
        snprintf(nm, sizeof(nm), "%s bwd dinp", mm[i].name);
        OPS_TIME(&x, t,
                 CU(mt_cuda_matmul_backward(lt, pre, NULL, NULL, dout, mm[i].ldo, in, w, N, IC, OC, dt, NULL, x.s)));
        ops_report(&x, nm, t, f, 0, ps);
        snprintf(nm, sizeof(nm), "%s bwd dw", mm[i].name);
        OPS_TIME(&x, t,
                 CU(mt_cuda_matmul_backward(lt, NULL, dw, NULL, dout, mm[i].ldo, in, w, N, IC, OC, dt, NULL, x.s)));
        ops_report(&x, nm, t, f, 0, ps);
        if (bi) {
            snprintf(nm, sizeof(nm), "%s bwd dbias", mm[i].name);
            OPS_TIME(&x, t, CU(mt_cuda_colsum(db, dout, mm[i].ldo, N, OC, dt, scr, x.s)));
            ops_report(&x, nm, t, 0, (double)N * OC * es, ps);
        }
    }
    /* LayerNorm: two per block and ln_f */
    int nln = 2 * L + 1;
    OPS_TIME(&x, t, CU(mt_cuda_layernorm_forward(out, mean, rstd, in, w, bias, N, C, dt, x.s)));
    ops_report(&x, "layernorm fwd", t, 0, 2.0 * NC * es, 1);
    OPS_TIME(&x, t, CU(mt_cuda_residual_layernorm_forward(pre, out, mean, rstd, in, dout, w, bias, N, C, dt, x.s)));
    ops_report(&x, "residual+layernorm fwd", t, 0, 4.0 * NC * es, nln - 1);
    /* as the trainer calls it: dx, dw and db together (one pass where layernorm.cu's fused kernel applies) */
    OPS_TIME(&x, t, CU(mt_cuda_layernorm_backward(pre, dw, db, dout, in, w, mean, rstd, N, C, dt, scr, x.s)));
    ops_report(&x, "layernorm bwd (dx dw db)", t, 0, 4.0 * NC * es, nln);
    /* GELU (unfused forward only when the epilogue is unavailable) and its backward */
    OPS_TIME(&x, t, CU(mt_cuda_gelu_backward(pre, in, dout, 4 * NC, dt, x.s)));
    ops_report(&x, "gelu bwd", t, 0, 4.0 * 4 * NC * es, L);
    OPS_TIME(&x, t, CU(mt_cuda_residual_forward(pre, in, dout, NC, dt, x.s)));
    ops_report(&x, "residual fwd", t, 0, 3.0 * NC * es, L);
    /* attention: qkv (B,T,3C) from in, out (B,T,C) */
    int hs = C / H;
    double fa = 2.0 * B * H * (double)T * T * hs;
    OPS_TIME(&x, t, CU(mt_cuda_attention_forward(out, lse, in, B, T, C, H, dt, x.s)));
    ops_report(&x, "attention fwd", t, fa, 0, L);
    OPS_TIME(&x, t, CU(mt_cuda_attention_backward(pre, dout, in, out, lse, B, T, C, H, dt, scr, x.s)));
    ops_report(&x, "attention bwd", t, 2.5 * fa, 0, L);
    /* fused softmax + cross-entropy over the logits (N, Vp) */
    OPS_TIME(&x, t, CU(mt_cuda_softmax_ce_forward(losses, lse, mloss, nvalid, out, tgt, N, V, Vp, dt, x.s)));
    ops_report(&x, "softmax+ce fwd", t, 0, (double)N * V * es, 1);
    OPS_TIME(&x, t, CU(mt_cuda_softmax_ce_backward(dout, out, lse, tgt, nvalid, N, V, Vp, 1.0f, dt, x.s)));
    ops_report(&x, "softmax+ce bwd", t, 0, 2.0 * N * V * es, 1);
    /* embedding */
    OPS_TIME(&x, t, CU(mt_cuda_embedding_forward(out, tgt, w, in, B, T, C, dt, x.s)));
    ops_report(&x, "embedding fwd", t, 0, 2.0 * NC * es, 1);
    OPS_TIME(&x, t, CU(mt_cuda_embedding_backward(dw, scr, dout, tgt, B, T, C, dt, x.s)));
    ops_report(&x, "embedding bwd", t, 0, (double)NC * es + 2.0 * NC * 4, 1);
    /* AdamW over the model's parameters (f32 master, moments, gradient; the compute copy written) */
    size_t np = (size_t)V * C + (size_t)T * C + (size_t)L * (12 * (size_t)C * C + 13 * (size_t)C) + 2 * (size_t)C;
    float *ap, *ag, *am, *av;
    void *alow;
    OK(mt_dev_malloc((void **)&ap, np * 4, MT_MEM_PARAMS, "adam p", x.s));
    OK(mt_dev_malloc((void **)&ag, np * 4, MT_MEM_GRADS, "adam g", x.s));
    OK(mt_dev_malloc((void **)&am, np * 4, MT_MEM_OPTIMIZER, "adam m", x.s));
    OK(mt_dev_malloc((void **)&av, np * 4, MT_MEM_OPTIMIZER, "adam v", x.s));
    OK(mt_dev_malloc(&alow, np * es, MT_MEM_PARAMS, "adam low", x.s));
    ops_fill(ap, MT_CU_F32, np, 0.1f, h, chunk, x.s);
    ops_fill(ag, MT_CU_F32, np, 0.01f, h, chunk, x.s);
    CU(cudaMemsetAsync(am, 0, np * 4, x.s));
    CU(cudaMemsetAsync(av, 0, np * 4, x.s));
    bool lowp = dt != MT_CU_F32;
    OPS_TIME(&x, t,
             CU(mt_cuda_adamw(ap, ag, am, av, np, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f, NULL, NULL,
                              lowp ? alow : NULL, dt, x.s)));
    ops_report(&x, "adamw", t, 0, (double)np * (28 + (lowp ? es : 0)), 1);
    printf("sum of the ops per step: %.2f ms (the training step adds memsets, copies and launch gaps)\n", x.step_ms);
    printf("RESULT ops prec=%s B=%d T=%d peak_tflops=%.2f copy_gbs=%.1f step_ms=%.3f\n", mt_prec_name(o->prec), B, T,
           x.peak / 1e12, x.bw / 1e9, x.step_ms);
    mt_cuda_ctx_destroy(lt);
    void *bufs[] = {in,     w,     bias,   out, pre, dout, dw, db, scr, mean, rstd, lse,
                    losses, mloss, nvalid, tgt, h,   ap,   ag, am, av,  alow, ws};
    for (size_t i = 0; i < MT_ARRAY_LEN(bufs); i++) {
        mt_dev_free(bufs[i]);
    }
    free(hp), free(ht), free(x.ms);
    cudaEventDestroy(x.e0), cudaEventDestroy(x.e1);
    cudaStreamDestroy(x.s);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 ||
        (strcmp(argv[1], "peak") && strcmp(argv[1], "train") && strcmp(argv[1], "attn") && strcmp(argv[1], "ops"))) {
        fprintf(stderr, "usage: gpu_bench peak|train|attn|ops [options] (see the top of bench/gpu_bench.c)\n");
        return 2;
    }
    if (mt_cuda_device_count() == 0) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    opts_t o = {.n = 8192,
                .reps = 10,
                .B = 16,
                .T = 1024,
                .L = 12,
                .C = 768,
                .H = 12,
                .V = 50257,
                .steps = 10,
                .prec = MT_PREC_BF16,
                .peak = 0,
                .head_chunks = 1};
    if (!strcmp(argv[1], "attn")) {
        o.B = 8;
    }
    static const struct option lo[] = {
        {"peak", required_argument, NULL, 'P'},
        {"profile", no_argument, NULL, 'K'},
        {"head-chunks", required_argument, NULL, 'k'},
        {NULL, 0, NULL, 0}};
    int ch;
    optind = 2;
    while ((ch = getopt_long(argc, argv, "n:r:B:T:L:C:H:V:p:", lo, NULL)) != -1) {
        switch (ch) {
        case 'n':
            o.n = o.steps = atoi(optarg);
            break;
        case 'r':
            o.reps = atoi(optarg);
            break;
        case 'B':
            o.B = atoi(optarg);
            break;
        case 'T':
            o.T = atoi(optarg);
            break;
        case 'L':
            o.L = atoi(optarg);
            break;
        case 'C':
            o.C = atoi(optarg);
            break;
        case 'H':
            o.H = atoi(optarg);
            break;
        case 'V':
            o.V = atoi(optarg);
            break;
        case 'p':
            if (!mt_prec_parse(optarg, &o.prec)) {
                DIE("-p %s: use fp32, tf32, bf16 or fp16", optarg);
            }
            break;
        case 'P':
            o.peak = atof(optarg);
            break;
        case 'K':
            o.profile = true;
            break;
        case 'k':
            o.head_chunks = atoi(optarg);
            break;
        default:
            return 2;
        }
    }
    if (o.n < 1 || o.reps < 1 || o.B < 1 || o.T < 1 || o.C < 1 || o.H < 1 || o.C % o.H || o.V < 1 || o.L < 0 ||
        o.head_chunks < 1) {
        DIE("bad sizes (need positive values, --head-chunks too, and C a multiple of H)");
    }
    if (!strcmp(argv[1], "peak")) {
        return cmd_peak(&o);
    }
    if (!strcmp(argv[1], "ops")) {
        return cmd_ops(&o);
    }
    return !strcmp(argv[1], "train") ? cmd_train(&o) : cmd_attn(&o);
}
