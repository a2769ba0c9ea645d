/* The CPU's matrix products, shape by shape: each product shape the GPT-2 step runs (N rows, C channels, V
 * vocabulary) and a square n^3, in GFLOP/s through mt_gemm (runtime/matmul.h) with every library: OpenBLAS
 * sgemm, oneDNN f32, oneDNN bf16 (the inputs rounded to bf16 in mt_gemm, as the model's products are) on
 * inputs of real values in [1, 2) and on zero-filled inputs (AMX's rate depends on the data), the median of
 * -r runs after a warm-up. The libraries run one after the other, never interleaved (their thread pools
 * would share the cores). Also the raw bf16 rate of mt_matmul_bf16_rate (bf16 inputs, no rounding pass),
 * the figure a bf16 job's MFU is measured against.
 * Usage: bench_gemm [-N 2048] [-C 256] [-V 4096] [-n 2048] [-r 10]
 * SPDX-License-Identifier: MIT */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/matmul.h"
#include "runtime/mt_core.h"

typedef struct {
    const char *name;
    bool ta, tb;
    int M, N, K;
} shape_t;

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double rate(const shape_t *s, mt_dtype_t dt, bool zeros, int reps) {
    size_t na = (size_t)s->M * s->K, nb = (size_t)s->K * s->N, nc = (size_t)s->M * s->N;
    float *a = malloc(na * 4), *b = malloc(nb * 4), *c = calloc(nc, 4);
    for (size_t i = 0; i < na; i++) {
        a[i] = zeros ? 0.0f : 1.0f + (float)(i % 7) * 0.125f;
    }
    for (size_t i = 0; i < nb; i++) {
        b[i] = zeros ? 0.0f : 1.0f + (float)(i % 5) * 0.25f;
    }
    int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    double r[64];
    for (int k = -1; k < reps; k++) {
        double t0 = mt_now();
        mt_gemm(s->ta, s->tb, s->M, s->N, s->K, a, lda, b, ldb, 0.0f, c, s->N, dt);
        double el = mt_now() - t0;
        if (k >= 0) {
            r[k] = 2.0 * s->M * (double)s->N * s->K / el / 1e9;
        }
    }
    qsort(r, (size_t)reps, sizeof(double), cmp_d);
    free(a), free(b), free(c);
    return r[reps / 2];
}

int main(int argc, char **argv) {
    int N = 2048, C = 256, V = 4096, n = 2048, reps = 10, opt;
    while ((opt = getopt(argc, argv, "N:C:V:n:r:")) != -1) {
        int *dst = opt == 'N' ? &N : opt == 'C' ? &C : opt == 'V' ? &V : opt == 'n' ? &n : opt == 'r' ? &reps : NULL;
        if (!dst) {
            fprintf(stderr, "usage: %s [-N rows] [-C channels] [-V vocab] [-n square] [-r reps]\n", argv[0]);
            return 2;
        }
        *dst = atoi(optarg);
    }
    if (N < 1 || C < 1 || V < 1 || n < 1 || reps < 1 || reps > 64) {
        fprintf(stderr, "sizes must be positive and -r in [1, 64]\n");
        return 2;
    }
    shape_t shapes[] = {
        {"square n^3", false, false, n, n, n},        {"qkv forward (B^T)", false, true, N, 3 * C, C},
        {"head forward (B^T)", false, true, N, V, C}, {"mlp dinp", false, false, N, C, 4 * C},
        {"qkv dw (A^T)", true, false, 3 * C, C, N},   {"head dw (A^T)", true, false, V, C, N},
    };
    enum { NS = sizeof(shapes) / sizeof(shapes[0]) };
    double res[NS][4] = {{0}};
    if (mt_matmul_init(MT_MATMUL_OPENBLAS) != MT_OK) {
        fprintf(stderr, "%s\n", mt_last_error_msg());
        return 2;
    }
    for (int i = 0; i < NS; i++) {
        res[i][0] = rate(&shapes[i], MT_F32, false, reps);
    }
    bool have = mt_matmul_init(MT_MATMUL_ONEDNN) == MT_OK;
    bool bf16 = have && mt_matmul_lib(MT_BF16) == MT_MATMUL_ONEDNN;
    if (have) {
        printf("oneDNN: %s\n", mt_matmul_describe());
        for (int i = 0; i < NS; i++) {
            res[i][1] = rate(&shapes[i], MT_F32, false, reps);
            res[i][2] = bf16 ? rate(&shapes[i], MT_BF16, false, reps) : 0.0;
            res[i][3] = bf16 ? rate(&shapes[i], MT_BF16, true, reps) : 0.0;
        }
    } else {
        printf("oneDNN: not available (%s)\n", mt_last_error_msg());
    }
    printf("GFLOP/s, median of %d, N %d C %d V %d\n", reps, N, C, V);
    printf("%-22s %16s %8s %8s %10s %14s\n", "product", "M x N x K", "OpenBLAS", "oneDNN", "bf16 real", "bf16 zeros");
    for (int i = 0; i < NS; i++) {
        char dims[48];
        snprintf(dims, sizeof(dims), "%dx%dx%d", shapes[i].M, shapes[i].N, shapes[i].K);
        printf("%-22s %16s %8.1f %8.1f %10.1f %14.1f\n", shapes[i].name, dims, res[i][0], res[i][1], res[i][2],
               res[i][3]);
    }
    if (bf16) {
        printf("raw bf16 product %d^3 (bf16 inputs, mt_matmul_bf16_rate): %.1f GFLOP/s\n", n,
               mt_matmul_bf16_rate(n) / 1e9);
    }
    return 0;
}
