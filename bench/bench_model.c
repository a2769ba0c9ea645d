/* GPT-2 training-step benchmark (forward + backward, 1 rank, CPU): model FLOP/s by the PaLM appendix-B
 * formula against this machine's sgemm rate measured in the same run, and the time per operation.
 *   model FLOPs per step = (6 N + 12 L H Q T) * B * T
 *   N = parameters that take part in matmuls (all but wpe and the padded vocabulary rows of wte; the tied
 *   wte counted once, as the output projection), L layers, H heads, Q head dim, T sequence length.
 * Usage: bench_model [-L 4] [-C 256] [-H 4] [-T 256] [-B 8] [-V 50257] [-n 5] [-s 2048] [-r none|block] [-a]
 *                    [-k head_chunks] [-p fp32|bf16] [-m auto|openblas|onednn] [-i base|auto]
 * -p bf16 computes as precision.compute = "bf16" (mt_model_set_compute) and the rate it is compared with is an
 * n^3 product in bf16 by the same library (-m: runtime.matmul); fp32 compares with sgemm. -i base runs the
 * baseline build of the kernels even where the AVX-512 one would (layers/kernel_isa.h).
 * SPDX-License-Identifier: MIT */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/layers/layers.h"
#include "models/model.h"
#include "runtime/alloc.h"
#include "runtime/matmul.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median GFLOP/s of n x n x n products in dt (runtime/matmul.h: f32 = OpenBLAS sgemm unless -m onednn; bf16 =
 * the library that computes the model's bf16 products) over reps runs (after one warm-up). */
static double sgemm_gflops(int n, int reps, mt_dtype_t dt) {
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
    double r[16];
    reps = reps > 16 ? 16 : reps;
    for (int k = -1; k < reps; k++) {
        double t0 = mt_now();
        mt_gemm(false, false, n, n, n, a, n, b, n, 0.0f, c, n, dt);
        double el = mt_now() - t0;
        if (k >= 0) {
            r[k] = 2.0 * n * (double)n * n / el / 1e9;
        }
    }
    qsort(r, (size_t)reps, sizeof(double), cmp_d);
    free(a), free(b), free(c);
    return r[reps / 2];
}

int main(int argc, char **argv) {
    mt_model_config_t cfg = MT_MODEL_CONFIG_INIT;
    cfg.n_layer = 4;
    cfg.n_embd = 256;
    cfg.n_head = 4;
    cfg.seq_len = 256;
    cfg.vocab_size = 50257;
    int B = 8, steps = 5, sg = 2048;
    mt_dtype_t compute = MT_F32;
    mt_matmul_lib_t matmul = MT_MATMUL_AUTO;
    int opt;
    while ((opt = getopt(argc, argv, "L:C:H:T:B:V:n:s:r:ak:p:m:i:")) != -1) {
        switch (opt) {
        case 'L':
            cfg.n_layer = atoi(optarg);
            break;
        case 'C':
            cfg.n_embd = atoi(optarg);
            break;
        case 'H':
            cfg.n_head = atoi(optarg);
            break;
        case 'T':
            cfg.seq_len = atoi(optarg);
            break;
        case 'B':
            B = atoi(optarg);
            break;
        case 'V':
            cfg.vocab_size = atoi(optarg);
            break;
        case 'n':
            steps = atoi(optarg);
            break;
        case 's':
            sg = atoi(optarg);
            break;
        case 'r':
            cfg.recompute = strcmp(optarg, "block") == 0 ? MT_RECOMPUTE_BLOCK : MT_RECOMPUTE_NONE;
            break;
        case 'a':
            cfg.attn_recompute = true;
            break;
        case 'k':
            cfg.head_chunks = atoi(optarg);
            break;
        case 'p':
            if (strcmp(optarg, "bf16") && strcmp(optarg, "fp32")) {
                fprintf(stderr, "-p must be fp32 or bf16\n");
                return 2;
            }
            compute = strcmp(optarg, "bf16") == 0 ? MT_BF16 : MT_F32;
            break;
        case 'i':
            if (strcmp(optarg, "base") && strcmp(optarg, "auto")) {
                fprintf(stderr, "-i must be base or auto\n");
                return 2;
            }
            mt_layers_set_isa(strcmp(optarg, "auto") == 0);
            break;
        case 'm':
            if (!mt_matmul_parse(optarg, &matmul)) {
                fprintf(stderr, "-m must be auto, openblas or onednn\n");
                return 2;
            }
            break;
        default:
            fprintf(stderr,
                    "usage: %s [-L layers] [-C channels] [-H heads] [-T seq] [-B batch] [-V vocab] "
                    "[-n steps] [-s sgemm_n] [-r none|block] [-a] [-k head_chunks] [-p fp32|bf16] [-m auto|openblas|onednn] [-i base|auto]\n",
                    argv[0]);
            return 2;
        }
    }
    if (steps < 1 || steps > 64) {
        fprintf(stderr, "-n must be in [1, 64]\n");
        return 2;
    }
    int T = cfg.seq_len;
    if (mt_matmul_init(matmul) != MT_OK) {
        fprintf(stderr, "%s\n", mt_last_error_msg());
        return 2;
    }
    double sgemm_before = sgemm_gflops(sg, 5, compute);
    mt_model_t m;
    if (mt_model_init(&cfg, &m) != MT_OK || mt_model_alloc_params(m) != MT_OK || mt_model_alloc_grads(m) != MT_OK) {
        fprintf(stderr, "model: %s\n", mt_last_error_msg());
        return 1;
    }
    mt_model_init_weights(m);
    if (mt_model_set_compute(m, (int)compute) != MT_OK) {
        fprintf(stderr, "%s\n", mt_last_error_msg());
        return 2;
    }
    printf("precision %s; matrix products: %s; kernels %s\n", compute == MT_BF16 ? "bf16" : "fp32",
           mt_matmul_describe(), mt_layers_isa());
    mt_acts_t a;
    if (mt_acts_init(m, B, T, &a) != MT_OK) {
        fprintf(stderr, "acts: %s\n", mt_last_error_msg());
        return 1;
    }
    int32_t *tok = malloc(sizeof(int32_t) * B * T), *tgt = malloc(sizeof(int32_t) * B * T);
    unsigned s = 1;
    for (int i = 0; i < B * T; i++) {
        s = s * 1103515245u + 12345u;
        tok[i] = (int32_t)((s >> 8) % (unsigned)cfg.vocab_size);
        s = s * 1103515245u + 12345u;
        tgt[i] = (int32_t)((s >> 8) % (unsigned)cfg.vocab_size);
    }
    float loss;
    if (mt_model_step(m, a, tok, tgt, true, &loss) != MT_OK) { /* warm-up: allocates activations */
        fprintf(stderr, "step: %s\n", mt_last_error_msg());
        return 1;
    }
    double times[64];
    mt_layers_prof_enable(true);
    mt_layers_prof_reset();
    for (int k = 0; k < steps; k++) {
        mt_model_zero_grads(m);
        double t0 = mt_now();
        mt_model_step(m, a, tok, tgt, true, &loss);
        times[k] = mt_now() - t0;
    }
    mt_layers_prof_enable(false);
    double total = 0;
    for (int k = 0; k < steps; k++) {
        total += times[k];
    }
    qsort(times, (size_t)steps, sizeof(double), cmp_d);
    double med = times[steps / 2];
    double sgemm_after = sgemm_gflops(sg, 5, compute);
    double sgemm = (sgemm_before + sgemm_after) / 2;
    double flops = mt_model_flops_per_token(m, T) * B * T;
    mt_mem_stats_t ms;
    mt_mem_stats(MT_MEM_HOST, &ms);
    printf("bench_model: GPT-2 L=%d C=%d H=%d T=%d B=%d V=%d (Vp=%d) recompute=%s attn_recompute=%d head_chunks=%d, "
           "%zu params, OMP/BLAS threads as set by the environment\n",
           cfg.n_layer, cfg.n_embd, cfg.n_head, T, B, cfg.vocab_size, mt_model_config(m)->padded_vocab,
           cfg.recompute == MT_RECOMPUTE_BLOCK ? "block" : "none", cfg.attn_recompute, cfg.head_chunks,
           mt_model_numel(m));
    printf("%s %dx%dx%d: %.1f GFLOP/s before, %.1f after (mean %.1f)\n", compute == MT_BF16 ? "bf16 product" : "sgemm",
           sg, sg, sg, sgemm_before, sgemm_after, sgemm);
    printf("step (fwd+bwd): median %.1f ms, min %.1f ms over %d steps; loss %.4f\n", med * 1e3, times[0] * 1e3, steps,
           loss);
    printf("model FLOPs/step %.3g (6N + 12LHQT per token) -> %.1f GFLOP/s = %.1f%% of %s\n", flops,
           flops / med / 1e9, 100.0 * flops / med / 1e9 / sgemm, compute == MT_BF16 ? "the bf16 product" : "sgemm");
    printf("activations peak %.1f MiB, params %.1f MiB, grads %.1f MiB\n", ms.peak[MT_MEM_ACTIVATIONS] / 1048576.0,
           ms.current[MT_MEM_PARAMS] / 1048576.0, ms.current[MT_MEM_GRADS] / 1048576.0);
    printf("%-16s %10s %8s %7s\n", "op", "ms/step", "calls", "share");
    double sum = 0;
    for (int op = 0; op < MT_OP_COUNT; op++) {
        long calls;
        double sec = mt_layers_prof_seconds((mt_op_t)op, &calls) / steps;
        sum += sec;
        printf("%-16s %10.2f %8ld %6.1f%%\n", mt_layers_op_name((mt_op_t)op), sec * 1e3, calls / steps,
               100 * sec / (total / steps));
    }
    printf("%-16s %10.2f %8s %6.1f%%\n", "other (copies)", (total / steps - sum) * 1e3, "",
           100 * (total / steps - sum) / (total / steps));
    mt_acts_free(a);
    mt_model_free(m);
    free(tok), free(tgt);
    return 0;
}
