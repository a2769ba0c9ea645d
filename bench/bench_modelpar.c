/* Model-parallel benchmarks on GPT-2:
 *   --mode pipeline (world = p stages): per stage, the measured idle fraction of the step (1 - time in
 *     forward/backward / step time) against the bubble (p-1)/(m+p-1) for GPipe and 1F1B over a list of
 *     micro-batch counts m, and the peak activation bytes of each schedule;
 *   --mode tp (world = tp ranks): time in tensor-parallel collectives as a share of the training step,
 *     with and without sequence parallelism.
 * Medians over --steps timed steps after --warmup. Run under mpiexec; rank 0 prints a table.
 * SPDX-License-Identifier: MIT */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/pipeline.h"
#include "parallel/tp.h"
#include "runtime/alloc.h"
#include "runtime/rt.h"

typedef struct {
    const char *mode;
    int layers, embd, heads, seq, vocab, micro_batch, steps, warmup;
    char ms[64];
} opts_t;

static void fill_batch(int32_t *tok, int32_t *tgt, size_t n, int vocab, int step) {
    uint32_t s = 2654435761u * (uint32_t)(step + 1);
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        tok[i] = (int32_t)((s >> 8) % (uint32_t)vocab);
        tgt[i] = (int32_t)((s >> 16) % (uint32_t)vocab);
    }
}

static mt_model_config_t model_config(const opts_t *o) {
    mt_model_config_t mc = MT_MODEL_CONFIG_INIT;
    mc.n_layer = o->layers;
    mc.n_embd = o->embd;
    mc.n_head = o->heads;
    mc.seq_len = o->seq;
    mc.vocab_size = o->vocab;
    return mc;
}

static int bench_pipeline(const opts_t *o, const mt_world_t *w) {
    mt_comm_params_t cp = MT_COMM_PARAMS_INIT;
    cp.name = "pp";
    mt_comm_t pp = NULL, emb = NULL;
    if (mt_comm_init(w->comm, &cp, &pp) != MT_OK) {
        fprintf(stderr, "bench: %s\n", mt_last_error_msg());
        return 1;
    }
    if (w->size > 1 && (w->rank == 0 || w->rank == w->size - 1)) {
        int er[2] = {0, w->size - 1};
        cp.name = "emb";
        if (mt_comm_init_ranks(w->comm, er, 2, &cp, &emb) != MT_OK) {
            fprintf(stderr, "bench: %s\n", mt_last_error_msg());
            return 1;
        }
    }
    if (w->rank == 0) {
        printf("# pipeline: GPT-2 L=%d C=%d T=%d V=%d, micro-batch %d, p=%d stages, median of %d steps\n", o->layers,
               o->embd, o->seq, o->vocab, o->micro_batch, w->size, o->steps);
        printf("%-6s %4s %4s %10s %10s %10s %10s %12s %12s\n", "sched", "m", "p", "bubble", "idle_mean", "idle_min",
               "idle_max", "step_ms", "act_peak_MiB");
    }
    char list[64];
    snprintf(list, sizeof(list), "%s", o->ms);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int m = atoi(tok);
        for (int s = 0; s < 2; s++) {
            mt_pp_schedule_t sched = s == 0 ? MT_PP_GPIPE : MT_PP_1F1B;
            mt_model_config_t mc = model_config(o);
            mt_model_t model = NULL;
            mt_pipeline_t pl = NULL;
            mt_pipeline_params_t pp_params = MT_PIPELINE_PARAMS_INIT;
            pp_params.schedule = sched;
            pp_params.microbatches = m;
            pp_params.micro_batch = o->micro_batch;
            pp_params.seq_len = o->seq;
            mt_mem_stats_t ms;
            mt_mem_stats(MT_MEM_HOST, &ms);
            int64_t base = ms.current[MT_MEM_ACTIVATIONS];
            mt_mem_reset_peak(MT_MEM_HOST);
            if (mt_model_init(&mc, &model) != MT_OK || mt_pipeline_init(model, pp, emb, &pp_params, &pl) != MT_OK ||
                mt_pipeline_alloc_params(pl) != MT_OK) {
                fprintf(stderr, "bench: %s\n", mt_last_error_msg());
                return 1;
            }
            size_t n = (size_t)m * o->micro_batch * o->seq;
            int32_t *tok_buf = malloc(n * sizeof(int32_t)), *tgt_buf = malloc(n * sizeof(int32_t));
            double *idle = malloc((size_t)o->steps * sizeof(double)), *step = malloc((size_t)o->steps * sizeof(double));
            for (int it = 0; it < o->warmup + o->steps; it++) {
                fill_batch(tok_buf, tgt_buf, n, o->vocab, it);
                mt_model_zero_grads(model);
                MPI_Barrier(w->comm); /* every step starts together, so idle time is the schedule's */
                if (mt_pipeline_step(pl, tok_buf, tgt_buf, NULL) != MT_OK) {
                    fprintf(stderr, "bench: %s\n", mt_last_error_msg());
                    return 1;
                }
                mt_pipeline_stats_t st;
                mt_pipeline_stats(pl, &st);
                if (it >= o->warmup) {
                    idle[it - o->warmup] = 1.0 - st.compute_s / st.step_s;
                    step[it - o->warmup] = st.step_s;
                }
            }
            mt_mem_stats(MT_MEM_HOST, &ms);
            double my_idle = mt_median(idle, o->steps), my_step = mt_median(step, o->steps);
            double act_mib = (double)(ms.peak[MT_MEM_ACTIVATIONS] - base) / (1 << 20);
            double all_idle[64] = {0}, all_step[64] = {0}, all_act[64] = {0};
            MPI_Gather(&my_idle, 1, MPI_DOUBLE, all_idle, 1, MPI_DOUBLE, 0, w->comm);
            MPI_Gather(&my_step, 1, MPI_DOUBLE, all_step, 1, MPI_DOUBLE, 0, w->comm);
            MPI_Gather(&act_mib, 1, MPI_DOUBLE, all_act, 1, MPI_DOUBLE, 0, w->comm);
            if (w->rank == 0) {
                double mean = 0, mn = 1, mx = 0, smax = 0, amax = 0;
                for (int r = 0; r < w->size; r++) {
                    mean += all_idle[r] / w->size;
                    mn = all_idle[r] < mn ? all_idle[r] : mn;
                    mx = all_idle[r] > mx ? all_idle[r] : mx;
                    smax = all_step[r] > smax ? all_step[r] : smax;
                    amax = all_act[r] > amax ? all_act[r] : amax;
                }
                double bubble = (double)(w->size - 1) / (m + w->size - 1);
                printf("%-6s %4d %4d %10.3f %10.3f %10.3f %10.3f %12.2f %12.2f   per stage:",
                       mt_pp_schedule_name(sched), m, w->size, bubble, mean, mn, mx, smax * 1e3, amax);
                for (int r = 0; r < w->size; r++) {
                    printf(" s%d idle %.3f act %.2f", r, all_idle[r], all_act[r]);
                }
                printf("\n");
                fflush(stdout);
            }
            free(tok_buf);
            free(tgt_buf);
            free(idle);
            free(step);
            mt_pipeline_free(pl);
            mt_model_free(model);
        }
    }
    mt_comm_free(emb);
    mt_comm_free(pp);
    return 0;
}

static int bench_tp(const opts_t *o, const mt_world_t *w) {
    mt_comm_params_t cp = MT_COMM_PARAMS_INIT;
    cp.name = "tp";
    mt_comm_t comm = NULL;
    mt_tp_t tp = NULL;
    if (mt_comm_init(w->comm, &cp, &comm) != MT_OK || mt_tp_init(comm, &tp) != MT_OK) {
        fprintf(stderr, "bench: %s\n", mt_last_error_msg());
        return 1;
    }
    if (w->rank == 0) {
        printf("# tp: GPT-2 L=%d C=%d T=%d V=%d, batch %d, tp=%d, median of %d steps\n", o->layers, o->embd, o->seq,
               o->vocab, o->micro_batch, w->size, o->steps);
        printf("%-4s %10s %12s %10s %10s %10s %14s\n", "sp", "step_ms", "tp_coll_ms", "share", "coll/step", "MiB/step",
               "act_peak_MiB");
    }
    for (int sp = 0; sp < 2; sp++) {
        mt_model_config_t mc = model_config(o);
        mt_tp_model_config(tp, sp, &mc);
        mt_model_t m = NULL;
        mt_acts_t a = NULL;
        mt_mem_stats_t ms;
        mt_mem_stats(MT_MEM_HOST, &ms);
        int64_t base = ms.current[MT_MEM_ACTIVATIONS];
        mt_mem_reset_peak(MT_MEM_HOST);
        if (mt_model_init(&mc, &m) != MT_OK || mt_model_alloc_params(m) != MT_OK || mt_model_alloc_grads(m) != MT_OK ||
            mt_acts_init(m, o->micro_batch, o->seq, &a) != MT_OK) {
            fprintf(stderr, "bench: %s\n", mt_last_error_msg());
            return 1;
        }
        mt_model_init_weights(m);
        size_t n = (size_t)o->micro_batch * o->seq;
        int32_t *tok_buf = malloc(n * sizeof(int32_t)), *tgt_buf = malloc(n * sizeof(int32_t));
        double *step = malloc((size_t)o->steps * sizeof(double)), *coll = malloc((size_t)o->steps * sizeof(double));
        mt_tp_counts_t c = {0};
        for (int it = 0; it < o->warmup + o->steps; it++) {
            fill_batch(tok_buf, tgt_buf, n, o->vocab, it);
            mt_model_zero_grads(m);
            mt_tp_reset_counts(tp);
            MPI_Barrier(w->comm);
            double t0 = mt_now();
            float loss = 0;
            if (mt_model_step(m, a, tok_buf, tgt_buf, true, &loss) != MT_OK || mt_tp_finish_grads(tp, m, sp) != MT_OK) {
                fprintf(stderr, "bench: %s\n", mt_last_error_msg());
                return 1;
            }
            double t = mt_now() - t0;
            mt_tp_counts(tp, &c);
            if (it >= o->warmup) {
                step[it - o->warmup] = t;
                coll[it - o->warmup] = c.seconds;
            }
        }
        mt_mem_stats(MT_MEM_HOST, &ms);
        double s = mt_median(step, o->steps), cs = mt_median(coll, o->steps);
        int64_t ncoll = c.all_reduce + c.all_reduce_max + c.all_gather + c.reduce_scatter + c.grad_sync;
        if (w->rank == 0) {
            printf("%-4d %10.2f %12.2f %10.3f %10lld %10.2f %14.2f\n", sp, s * 1e3, cs * 1e3, cs / s, (long long)ncoll,
                   (double)c.bytes / (1 << 20), (double)(ms.peak[MT_MEM_ACTIVATIONS] - base) / (1 << 20));
            fflush(stdout);
        }
        free(tok_buf);
        free(tgt_buf);
        free(step);
        free(coll);
        mt_acts_free(a);
        mt_model_free(m);
    }
    mt_tp_free(tp);
    mt_comm_free(comm);
    return 0;
}

int main(int argc, char **argv) {
    opts_t o = {"pipeline", 8, 128, 4, 64, 512, 2, 10, 2, "4,8,16"};
    static const struct option lo[] = {{"mode", 1, 0, 'M'},         {"layers", 1, 0, 'L'}, {"embd", 1, 0, 'C'},
                                       {"heads", 1, 0, 'H'},        {"seq", 1, 0, 'T'},    {"vocab", 1, 0, 'V'},
                                       {"micro-batch", 1, 0, 'B'},  {"steps", 1, 0, 'n'},  {"warmup", 1, 0, 'w'},
                                       {"microbatches", 1, 0, 'm'}, {0, 0, 0, 0}};
    if (mt_rt_init(&argc, &argv) != MT_OK) {
        fprintf(stderr, "bench: %s\n", mt_last_error_msg());
        return 1;
    }
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'M':
            o.mode = optarg;
            break;
        case 'L':
            o.layers = atoi(optarg);
            break;
        case 'C':
            o.embd = atoi(optarg);
            break;
        case 'H':
            o.heads = atoi(optarg);
            break;
        case 'T':
            o.seq = atoi(optarg);
            break;
        case 'V':
            o.vocab = atoi(optarg);
            break;
        case 'B':
            o.micro_batch = atoi(optarg);
            break;
        case 'n':
            o.steps = atoi(optarg);
            break;
        case 'w':
            o.warmup = atoi(optarg);
            break;
        case 'm':
            snprintf(o.ms, sizeof(o.ms), "%s", optarg);
            break;
        default:
            fprintf(stderr, "usage: bench_modelpar [--mode pipeline|tp] [--layers L] [--embd C] [--heads H] [--seq T] "
                            "[--vocab V] [--micro-batch B] [--microbatches 4,8,16] [--steps N] [--warmup W]\n");
            mt_rt_finalize();
            return 2;
        }
    }
    if (o.steps < 1 || o.warmup < 0) {
        fprintf(stderr, "bench_modelpar: --steps must be >= 1 and --warmup >= 0\n");
        mt_rt_finalize();
        return 2;
    }
    const mt_world_t *w = mt_rt_world();
    int rc = !strcmp(o.mode, "tp") ? bench_tp(&o, w) : !strcmp(o.mode, "pipeline") ? bench_pipeline(&o, w) : 2;
    if (rc == 2 && w->rank == 0) {
        fprintf(stderr, "bench_modelpar: --mode must be pipeline or tp, not \"%s\"\n", o.mode);
    }
    mt_rt_finalize();
    return rc;
}
