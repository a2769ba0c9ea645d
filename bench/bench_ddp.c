/* Data-parallel engine benchmark: GPT-2 training steps under DP, DDP or ZeRO-1/2/3 with a fixed batch
 * per rank (weak scaling), reporting the median step time, backward time, and how much of the gradient
 * communication was hidden behind backward (the union of the last micro-batch's collectives' [launch,
 * done] intervals, and the part of it before backward ended; completion is polled at every module hook).
 * --engine takes a list (ddp,zero3): the engines alternate step by step, so their ratio is paired.
 *   mpirun -np 2 build/bench/bench_ddp --engine ddp,zero3 --layers 4 --embd 256 --batch 4 --seq 64 --steps 10
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
    fprintf(stderr, "usage: bench_ddp [--engine dp|ddp|zero|zero1|zero2|zero3[,...]] [--stage 1|2|3] [--layers L] "
                    "[--embd C] [--heads H]\n"
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

/* One engine under test: its own model copy, activations and per-step figures. */
typedef struct {
    char spec[32];
    mt_model_t model;
    mt_engine_t e;
    mt_acts_t acts;
    double *step_s, *bwd_s, *hid, *busy, *exposed;
} run_t;

static void run_free(run_t *r) {
    mt_acts_free(r->acts);
    mt_engine_free(r->e);
    mt_model_free(r->model);
    free(r->step_s);
    free(r->bwd_s);
    free(r->hid);
    free(r->busy);
    free(r->exposed);
}

/* spec: "dp", "ddp", "zero1", "zero2", "zero3" (or "zero" with --stage). */
static mt_status_t run_init(const opts_t *o, mt_comm_t dp, const char *spec, run_t *r) {
    memset(r, 0, sizeof(*r));
    snprintf(r->spec, sizeof(r->spec), "%s", spec);
    mt_engine_params_t ep = MT_ENGINE_PARAMS_INIT;
    char kind[16];
    snprintf(kind, sizeof(kind), "%s", spec);
    size_t len = strlen(kind);
    ep.zero_stage = o->stage;
    if (len > 4 && !strncmp(kind, "zero", 4)) {
        ep.zero_stage = atoi(kind + 4);
        kind[4] = '\0';
    }
    if (!mt_engine_kind_parse(kind, &ep.kind)) {
        return mt_error(MT_ERR_INVALID_ARG, "--engine %s: expected dp, ddp, zero, zero1, zero2 or zero3", spec);
    }
    ep.grad_accum = o->accum;
    ep.bucket_mb = o->bucket_mb;
    ep.first_bucket_mb = o->first_mb;
    mt_model_config_t mc = MT_MODEL_CONFIG_INIT;
    mc.n_layer = o->layers;
    mc.n_embd = o->embd;
    mc.n_head = o->heads;
    mc.vocab_size = o->vocab;
    mc.seq_len = o->seq;
    size_t n = (size_t)o->steps;
    r->step_s = calloc(n, sizeof(double));
    r->bwd_s = calloc(n, sizeof(double));
    r->hid = calloc(n, sizeof(double));
    r->busy = calloc(n, sizeof(double));
    r->exposed = calloc(n, sizeof(double));
    if (!r->step_s || !r->bwd_s || !r->hid || !r->busy || !r->exposed) {
        return mt_error(MT_ERR_OOM, "bench_ddp: out of memory");
    }
    MT_CHECK(mt_model_init(&mc, &r->model));
    MT_CHECK(mt_engine_init(r->model, dp, &ep, &r->e));
    MT_CHECK(mt_acts_init(r->model, o->batch / o->accum, o->seq, &r->acts));
    return MT_OK;
}

typedef struct {
    mt_data_t data;
    int32_t *win, *gtok, *gtgt, *tok, *tgt;
} batch_t;

/* One training step of r on step's data; figures recorded at index s when s >= 0. */
static mt_status_t run_step(const opts_t *o, mt_comm_t dp, run_t *r, batch_t *b, int step, int s) {
    int N = mt_comm_size(dp), rank = mt_comm_rank(dp), T = o->seq, mb = o->batch / o->accum;
    int n = mt_model_n_modules(r->model);
    mt_engine_t e = r->e;
    MPI_Barrier(mt_comm_mpi(dp));
    double t0 = mt_now(), tb = 0.0;
    MT_CHECK(mt_engine_zero_grads(e));
    for (int k = 0; k < o->accum; k++) {
        if (mt_engine_root_loads_batch(e)) {
            for (int q = 0; rank == 0 && q < N; q++) {
                MT_CHECK(mt_data_global_rows(b->data, step, (int64_t)q * o->batch + k * mb, mb, b->win));
                for (int i = 0; i < mb; i++) {
                    memcpy(b->gtok + ((size_t)q * mb + i) * T, b->win + (size_t)i * (T + 1), (size_t)T * 4);
                    memcpy(b->gtgt + ((size_t)q * mb + i) * T, b->win + (size_t)i * (T + 1) + 1, (size_t)T * 4);
                }
            }
            MT_CHECK(mt_engine_scatter_batch(e, rank == 0 ? b->gtok : NULL, b->tok, (size_t)mb * T));
            MT_CHECK(mt_engine_scatter_batch(e, rank == 0 ? b->gtgt : NULL, b->tgt, (size_t)mb * T));
        } else {
            MT_CHECK(mt_data_global_rows(b->data, step, (int64_t)rank * o->batch + k * mb, mb, b->win));
            for (int i = 0; i < mb; i++) {
                memcpy(b->tok + (size_t)i * T, b->win + (size_t)i * (T + 1), (size_t)T * 4);
                memcpy(b->tgt + (size_t)i * T, b->win + (size_t)i * (T + 1) + 1, (size_t)T * 4);
            }
        }
        float loss = 0.0f;
        MT_CHECK(mt_model_forward(r->model, r->acts, 0, n, b->tok, b->tgt, NULL, NULL, &loss));
        tb = mt_now();
        MT_CHECK(mt_model_backward(r->model, r->acts, 0, n, NULL, NULL, 1.0f / (float)o->accum));
    }
    double tbe = mt_now();
    MT_CHECK(mt_engine_finish_grads(e));
    double sumsq = 0.0, lossd = 0.0;
    MT_CHECK(mt_engine_grad_sumsq(e, &sumsq));
    MT_CHECK(mt_engine_reduce_loss(e, &lossd));
    MT_CHECK(mt_engine_step(e, 1e-3f, mt_clip_coef(sumsq, 1.0f, NULL)));
    double t1 = mt_now();
    if (s >= 0) {
        mt_engine_comm_stats_t cs;
        mt_engine_comm_stats(e, &cs);
        r->step_s[s] = t1 - t0;
        r->bwd_s[s] = tbe - tb;
        r->busy[s] = cs.comm_busy_s;
        r->hid[s] = cs.comm_hidden_s;
        r->exposed[s] = cs.t_comm_done > cs.t_backward_end ? cs.t_comm_done - cs.t_backward_end : 0.0;
    }
    return MT_OK;
}

static void report(const opts_t *o, mt_comm_t dp, run_t *r, const run_t *first) {
    int N = mt_comm_size(dp), T = o->seq;
    mt_engine_comm_stats_t cs;
    mt_engine_comm_stats(r->e, &cs);
    mt_engine_mem_t mem;
    mt_engine_mem(r->e, &mem);
    double sum_hid = 0.0, sum_busy = 0.0, *ratio = calloc((size_t)o->steps, sizeof(double));
    for (int s = 0; s < o->steps; s++) {
        sum_hid += r->hid[s];
        sum_busy += r->busy[s];
        if (ratio) {
            ratio[s] = r->step_s[s] / first->step_s[s];
        }
    }
    char hidden[32] = "n/a", rel[48] = "";
    if (N > 1 && sum_busy > 0) {
        snprintf(hidden, sizeof(hidden), "%.1f%%", 100.0 * sum_hid / sum_busy);
    }
    if (r != first && ratio) {
        snprintf(rel, sizeof(rel), " | %.2f x %s (paired median)", mt_median(ratio, o->steps), first->spec);
    }
    free(ratio);
    double best = r->step_s[0];
    for (int s = 1; s < o->steps; s++) {
        best = MT_MIN(best, r->step_s[s]);
    }
    double ms = mt_median(r->step_s, o->steps) * 1e3;
    printf("engine %-7s ranks %d | %.2fM params, %d units | batch %d x %d per rank, accum %d | step %.1f ms (median of "
           "%d, min %.1f) | backward %.1f ms | comm %.1f ms, hidden %s | exposed %.1f ms | %.3f MB sent/rank | %.0f "
           "tok/s%s\n",
           mt_engine_name(r->e), N, (double)mem.numel / 1e6, mem.n_units, o->batch, T, o->accum, ms, o->steps,
           best * 1e3, mt_median(r->bwd_s, o->steps) * 1e3, mt_median(r->busy, o->steps) * 1e3, hidden,
           mt_median(r->exposed, o->steps) * 1e3, cs.bytes_model / 1e6, (double)o->batch * T * N / (ms / 1e3),
           rel);
}

/* --engine takes a comma-separated list: the engines run alternately, step by step, on the same data,
 * so a loaded machine slows them alike and the paired ratio to the first is meaningful. */
static mt_status_t run(const opts_t *o, mt_comm_t dp) {
    int N = mt_comm_size(dp), T = o->seq, mb = o->batch / o->accum;
    run_t runs[8];
    int nr = 0;
    batch_t b;
    memset(&b, 0, sizeof(b));
    mt_status_t st = MT_OK;
    char list[256];
    snprintf(list, sizeof(list), "%s", o->engine);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok && nr < 8; tok = strtok_r(NULL, ",", &save)) {
        st = run_init(o, dp, tok, &runs[nr]);
        nr++;
        if (st != MT_OK) {
            goto out;
        }
    }
    mt_data_params_t dpar = MT_DATA_PARAMS_INIT;
    dpar.global_batch = (int64_t)o->batch * N;
    dpar.seq_len = T;
    dpar.vocab_size = o->vocab;
    dpar.prefetch = false;
    MT_CHECK_GOTO(mt_data_open(&dpar, &b.data), st, out);
    size_t rows = (size_t)N * (size_t)mb;
    b.win = mt_alloc(rows * (size_t)(T + 1) * 4, MT_MEM_OTHER, "bench");
    b.gtok = mt_alloc(rows * (size_t)T * 4, MT_MEM_OTHER, "bench");
    b.gtgt = mt_alloc(rows * (size_t)T * 4, MT_MEM_OTHER, "bench");
    b.tok = mt_alloc((size_t)mb * T * 4, MT_MEM_OTHER, "bench");
    b.tgt = mt_alloc((size_t)mb * T * 4, MT_MEM_OTHER, "bench");
    if (!b.win || !b.gtok || !b.gtgt || !b.tok || !b.tgt) {
        st = mt_error(MT_ERR_OOM, "bench_ddp: out of memory");
        goto out;
    }
    for (int s = -o->warmup; s < o->steps; s++) {
        for (int i = 0; i < nr; i++) {
            MT_CHECK_GOTO(run_step(o, dp, &runs[i], &b, s + o->warmup, s), st, out);
        }
    }
    for (int i = 0; mt_comm_rank(dp) == 0 && i < nr; i++) {
        report(o, dp, &runs[i], &runs[0]);
    }
out:
    for (int i = 0; i < nr; i++) {
        run_free(&runs[i]);
    }
    mt_data_close(b.data);
    mt_free(b.win);
    mt_free(b.gtok);
    mt_free(b.gtgt);
    mt_free(b.tok);
    mt_free(b.tgt);
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
