/* Data-parallel engine benchmark: GPT-2 training steps under DP, DDP or ZeRO-1/2/3 with a fixed batch
 * per rank (weak scaling), reporting the median step time, backward time, and how much of the gradient
 * communication was hidden behind backward (the union of the last micro-batch's collectives' [launch,
 * done] intervals, and the part of it before backward ended; completion is polled at every module hook).
 *   mpirun -np 2 build/bench/bench_ddp --engine ddp --layers 4 --embd 256 --batch 4 --seq 64 --steps 10
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/data/data.h"
#include "parallel/engine.h"
#include "runtime/alloc.h"
#include "runtime/rt.h"

typedef struct {
    const char *engine;
    int stage, layers, embd, heads, vocab, batch, seq, steps, warmup, accum;
    double bucket_mb, first_mb;
} opts_t;

static void usage(void) {
    fprintf(stderr, "usage: bench_ddp [--engine dp|ddp|zero] [--stage 1|2|3] [--layers L] [--embd C] [--heads H]\n"
                    "                 [--vocab V] [--batch rows per rank] [--seq T] [--steps S] [--warmup W]\n"
                    "                 [--accum micro-batches] [--bucket-mb MB] [--first-bucket-mb MB]\n");
}

static int parse(int argc, char **argv, opts_t *o) {
    *o = (opts_t){"ddp", 1, 4, 256, 4, 512, 4, 64, 10, 2, 1, 25.0, 1.0};
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) {
            usage();
            return 1;
        }
        const char *k = argv[i], *v = argv[++i];
        if (!strcmp(k, "--engine")) {
            o->engine = v;
        } else if (!strcmp(k, "--stage")) {
            o->stage = atoi(v);
        } else if (!strcmp(k, "--layers")) {
            o->layers = atoi(v);
        } else if (!strcmp(k, "--embd")) {
            o->embd = atoi(v);
        } else if (!strcmp(k, "--heads")) {
            o->heads = atoi(v);
        } else if (!strcmp(k, "--vocab")) {
            o->vocab = atoi(v);
        } else if (!strcmp(k, "--batch")) {
            o->batch = atoi(v);
        } else if (!strcmp(k, "--seq")) {
            o->seq = atoi(v);
        } else if (!strcmp(k, "--steps")) {
            o->steps = atoi(v);
        } else if (!strcmp(k, "--warmup")) {
            o->warmup = atoi(v);
        } else if (!strcmp(k, "--accum")) {
            o->accum = atoi(v);
        } else if (!strcmp(k, "--bucket-mb")) {
            o->bucket_mb = atof(v);
        } else if (!strcmp(k, "--first-bucket-mb")) {
            o->first_mb = atof(v);
        } else {
            fprintf(stderr, "bench_ddp: unknown option %s\n", k);
            usage();
            return 1;
        }
    }
    if (o->steps < 1 || o->batch < 1 || o->accum < 1 || o->batch % o->accum) {
        fprintf(stderr, "bench_ddp: --steps, --batch, --accum must be >= 1 and accum must divide batch\n");
        return 1;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static mt_status_t run(const opts_t *o, mt_comm_t dp) {
    int N = mt_comm_size(dp), rank = mt_comm_rank(dp), T = o->seq, mb = o->batch / o->accum;
    mt_model_config_t mc = MT_MODEL_CONFIG_INIT;
    mc.n_layer = o->layers;
    mc.n_embd = o->embd;
    mc.n_head = o->heads;
    mc.vocab_size = o->vocab;
    mc.seq_len = T;
    mt_engine_params_t ep = MT_ENGINE_PARAMS_INIT;
    if (!mt_engine_kind_parse(o->engine, &ep.kind)) {
        return mt_error(MT_ERR_INVALID_ARG, "--engine %s: expected dp, ddp or zero", o->engine);
    }
    ep.zero_stage = o->stage;
    ep.grad_accum = o->accum;
    ep.bucket_mb = o->bucket_mb;
    ep.first_bucket_mb = o->first_mb;
    mt_data_params_t dpar = MT_DATA_PARAMS_INIT;
    dpar.global_batch = (int64_t)o->batch * N;
    dpar.seq_len = T;
    dpar.vocab_size = o->vocab;
    dpar.prefetch = false;
    mt_model_t model = NULL;
    mt_engine_t e = NULL;
    mt_acts_t acts = NULL;
    mt_data_t data = NULL;
    mt_status_t st = MT_OK;
    size_t rows_loaded = (size_t)(ep.kind == MT_ENGINE_DP ? N : 1) * (size_t)mb;
    int32_t *win = mt_alloc(rows_loaded * (size_t)(T + 1) * 4, MT_MEM_OTHER, "bench");
    int32_t *gtok = mt_alloc(rows_loaded * (size_t)T * 4, MT_MEM_OTHER, "bench");
    int32_t *gtgt = mt_alloc(rows_loaded * (size_t)T * 4, MT_MEM_OTHER, "bench");
    int32_t *tok = mt_alloc((size_t)mb * T * 4, MT_MEM_OTHER, "bench");
    int32_t *tgt = mt_alloc((size_t)mb * T * 4, MT_MEM_OTHER, "bench");
    double *step_s = calloc((size_t)o->steps, sizeof(double)), *bwd_s = calloc((size_t)o->steps, sizeof(double));
    double *hid = calloc((size_t)o->steps, sizeof(double)), *busy = calloc((size_t)o->steps, sizeof(double));
    double *exposed = calloc((size_t)o->steps, sizeof(double));
    if (!win || !gtok || !gtgt || !tok || !tgt || !step_s || !bwd_s || !hid || !busy || !exposed) {
        st = mt_error(MT_ERR_OOM, "bench_ddp: out of memory");
        goto out;
    }
    MT_CHECK_GOTO(mt_model_init(&mc, &model), st, out);
    int n = mt_model_n_modules(model);
    MT_CHECK_GOTO(mt_engine_init(model, dp, &ep, &e), st, out);
    MT_CHECK_GOTO(mt_acts_init(model, mb, T, &acts), st, out);
    MT_CHECK_GOTO(mt_data_open(&dpar, &data), st, out);
    for (int s = -o->warmup; s < o->steps; s++) {
        MPI_Barrier(mt_comm_mpi(dp));
        double t0 = mt_now(), tb = 0.0;
        int step = s + o->warmup;
        MT_CHECK_GOTO(mt_engine_zero_grads(e), st, out);
        for (int k = 0; k < o->accum; k++) {
            if (mt_engine_root_loads_batch(e)) {
                for (int q = 0; rank == 0 && q < N; q++) {
                    MT_CHECK_GOTO(mt_data_global_rows(data, step, (int64_t)q * o->batch + k * mb, mb, win), st, out);
                    for (int i = 0; i < mb; i++) {
                        memcpy(gtok + ((size_t)q * mb + i) * T, win + (size_t)i * (T + 1), (size_t)T * 4);
                        memcpy(gtgt + ((size_t)q * mb + i) * T, win + (size_t)i * (T + 1) + 1, (size_t)T * 4);
                    }
                }
                MT_CHECK_GOTO(mt_engine_scatter_batch(e, rank == 0 ? gtok : NULL, tok, (size_t)mb * T), st, out);
                MT_CHECK_GOTO(mt_engine_scatter_batch(e, rank == 0 ? gtgt : NULL, tgt, (size_t)mb * T), st, out);
            } else {
                MT_CHECK_GOTO(mt_data_global_rows(data, step, (int64_t)rank * o->batch + k * mb, mb, win), st, out);
                for (int i = 0; i < mb; i++) {
                    memcpy(tok + (size_t)i * T, win + (size_t)i * (T + 1), (size_t)T * 4);
                    memcpy(tgt + (size_t)i * T, win + (size_t)i * (T + 1) + 1, (size_t)T * 4);
                }
            }
            float loss = 0.0f;
            MT_CHECK_GOTO(mt_model_forward(model, acts, 0, n, tok, tgt, NULL, NULL, &loss), st, out);
            tb = mt_now();
            MT_CHECK_GOTO(mt_model_backward(model, acts, 0, n, NULL, NULL, 1.0f / (float)o->accum), st, out);
        }
        double tbe = mt_now();
        MT_CHECK_GOTO(mt_engine_finish_grads(e), st, out);
        double sumsq = 0.0, lossd = 0.0;
        MT_CHECK_GOTO(mt_engine_grad_sumsq(e, &sumsq), st, out);
        MT_CHECK_GOTO(mt_engine_reduce_loss(e, &lossd), st, out);
        MT_CHECK_GOTO(mt_engine_step(e, 1e-3f, mt_clip_coef(sumsq, 1.0f, NULL)), st, out);
        double t1 = mt_now();
        if (s >= 0) {
            mt_engine_comm_stats_t cs;
            mt_engine_comm_stats(e, &cs);
            step_s[s] = t1 - t0;
            bwd_s[s] = tbe - tb;
            busy[s] = cs.comm_busy_s;
            hid[s] = cs.comm_hidden_s;
            exposed[s] = cs.t_comm_done > cs.t_backward_end ? cs.t_comm_done - cs.t_backward_end : 0.0;
        }
    }
    if (rank == 0) {
        mt_engine_comm_stats_t cs;
        mt_engine_comm_stats(e, &cs);
        mt_engine_mem_t mem;
        mt_engine_mem(e, &mem);
        double sum_hid = 0.0, sum_busy = 0.0;
        for (int s = 0; s < o->steps; s++) {
            sum_hid += hid[s];
            sum_busy += busy[s];
        }
        double tok_s = (double)o->batch * T * N;
        double ms = median(step_s, o->steps) * 1e3;
        printf("engine %-7s ranks %d | %.2fM params, %d units | batch %d x %d per rank, accum %d | step %.1f ms (median "
               "of %d) | backward %.1f ms | comm %.1f ms, hidden %.1f%% | exposed %.1f ms | %.3f MB sent/rank | %.0f "
               "tok/s\n",
               mt_engine_name(e), N, (double)mem.numel / 1e6, mem.n_units, o->batch, T, o->accum, ms, o->steps,
               median(bwd_s, o->steps) * 1e3, median(busy, o->steps) * 1e3,
               sum_busy > 0 ? 100.0 * sum_hid / sum_busy : 0.0, median(exposed, o->steps) * 1e3,
               cs.bytes_model / 1e6, tok_s / (ms / 1e3));
    }
out:
    mt_data_close(data);
    mt_acts_free(acts);
    mt_engine_free(e);
    mt_model_free(model);
    mt_free(win);
    mt_free(gtok);
    mt_free(gtgt);
    mt_free(tok);
    mt_free(tgt);
    free(step_s);
    free(bwd_s);
    free(hid);
    free(busy);
    free(exposed);
    return st;
}

int main(int argc, char **argv) {
    if (mt_rt_init(&argc, &argv) != MT_OK) {
        fprintf(stderr, "bench_ddp: %s\n", mt_last_error_msg());
        return 1;
    }
    opts_t o;
    int rc = parse(argc, argv, &o);
    mt_comm_t dp = NULL;
    if (!rc && mt_comm_init(mt_rt_world()->comm, NULL, &dp) != MT_OK) {
        rc = 1;
    }
    if (!rc && run(&o, dp) != MT_OK) {
        fprintf(stderr, "bench_ddp (rank %d): %s\n", mt_rt_world()->rank, mt_last_error_msg());
        rc = 1;
    }
    mt_comm_free(dp);
    mt_rt_finalize();
    return rc;
}
