/* `meshtrain plan JOB.toml --cluster CLUSTER.toml [--top K] [--json] [--world N] [--micro-batch B]
 * [--check METRICS.jsonl]`: predicts per-rank memory and step time of every layout the job can run on the
 * cluster and prints the best ones with a ready override line; --check compares a run's metrics.jsonl with
 * the prediction for the layout the job file describes. Every rank computes the same answer; rank 0 prints.
 * SPDX-License-Identifier: MIT */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "train/job_json.h"
#include "plan/plan.h"
#include "plan/plan_json.h"
#include "runtime/rt.h"

typedef struct {
    const char *cluster;
    const char *check;
    int top;
    int world;
    int micro_batch;
    bool json;
} plan_opts_t;

static void usage(FILE *out) {
    fprintf(out,
            "usage: meshtrain plan JOB.toml --cluster CLUSTER.toml [--top K] [--json] [--world N] [--micro-batch B]\n"
            "                      [--check METRICS.jsonl] [--section.key=value ...]\n"
            "  Predicts per-rank memory (by allocator category) and step time of every layout (tp, pp, dp, engine,\n"
            "  schedule, micro-batch, sequence parallelism, recomputation, mesh order) of JOB on CLUSTER and prints\n"
            "  the best K (default 10) with their breakdown and the best one as config overrides.\n"
            "  --world N     plan for N ranks (default: every device of the cluster)\n"
            "  --micro-batch B  only layouts with this train.micro_batch\n"
            "  --json        machine-readable output\n"
            "  --check F     compare the run whose metrics.jsonl is F (run with JOB and its overrides on --world\n"
            "                ranks) with the prediction for its layout\n"
            "  Cluster files: launch/clusters/*.toml; keys and the time model: docs/planning.md.\n");
}

/* Appends to best (len bytes) the command line's own overrides that best does not set itself (precision, model
 * shape, data, ...: the planned job is the one they describe), in order, each single-quoted for the shell when it
 * holds anything but [A-Za-z0-9_./:=,+@%-]. The line then trains the job that was planned. */
static void append_job_overrides(const mt_config_cli_t *cli, char *best, size_t len) {
    for (int i = 0; i < cli->n_overrides; i++) {
        const char *ov = cli->overrides[i], *eq = strchr(ov, '=');
        size_t klen = eq ? (size_t)(eq - ov) + 1 : strlen(ov); /* "--key=" */
        char key[160];
        snprintf(key, sizeof(key), "%.*s", (int)MT_MIN(klen, sizeof(key) - 1), ov);
        if (strstr(best, key)) { /* the plan's own choice of it */
            continue;
        }
        bool plain = strspn(ov, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./:=,+@%-") ==
                     strlen(ov);
        size_t at = strlen(best);
        if (plain) {
            snprintf(best + at, len - at, " %s", ov);
            continue;
        }
        snprintf(best + at, len - at, " '");
        for (const char *c = ov; *c; c++) { /* ' becomes '\'' */
            at = strlen(best);
            snprintf(best + at, len - at, *c == '\'' ? "'\\''" : "%c", *c);
        }
        at = strlen(best);
        snprintf(best + at, len - at, "'");
    }
}

static double mib(int64_t b) {
    return (double)b / 1048576.0;
}

static void fmt_bytes(int64_t b, char *buf, size_t len) {
    double x = (double)b;
    if (x >= 1073741824.0) {
        snprintf(buf, len, "%.2fG", x / 1073741824.0);
    } else if (x >= 1048576.0) {
        snprintf(buf, len, "%.2fM", x / 1048576.0);
    } else {
        snprintf(buf, len, "%.1fK", x / 1024.0);
    }
}

static const char *cat_key[MT_MEM_NCAT] = {"params", "grads", "optimizer", "activations", "comm", "other"};

static void print_json_pred(FILE *out, const mt_plan_pred_t *p, const mt_plan_job_t *job, int rank) {
    char ov[768];
    mt_plan_layout_overrides(&p->l, ov, sizeof(ov));
    const mt_plan_layout_t *l = &p->l;
    fprintf(out,
            "    {\"rank\": %d, \"tp\": %d, \"pp\": %d, \"dp\": %d, \"engine\": \"%s\", \"schedule\": \"%s\", "
            "\"micro_batch\": %d, \"microbatches\": %d, \"sequence_parallel\": %s, \"recompute\": \"%s\", "
            "\"order\": \"%s\", \"fits\": %s, \"over_bytes\": %lld, \"nccl_bytes\": %lld, \"mem_stage\": %d, "
            "\"mem_bytes\": {",
            rank, l->tp, l->pp, l->dp, mt_plan_engine_name(l->engine), l->schedule == MT_PLAN_GPIPE ? "gpipe" : "1f1b",
            l->micro_batch, l->microbatches, l->sp ? "true" : "false", mt_plan_rc_name(l->recompute), l->order,
            p->fits ? "true" : "false", (long long)p->over, (long long)p->nccl, p->mem_stage);
    for (int k = 0; k < MT_MEM_NCAT - 1; k++) {
        fprintf(out, "\"%s\": %lld, ", cat_key[k], (long long)p->mem[k]);
    }
    double tok = (double)job->global_batch * job->seq_len;
    fprintf(out,
            "\"total\": %lld}, \"time_ms\": {\"compute\": %.4f, \"tp\": %.4f, \"pp\": %.4f, \"dp\": %.4f, "
            "\"bubble\": %.4f, \"optimizer\": %.4f, \"step\": %.4f}, \"tokens_per_s\": %.1f, "
            "\"cross_node\": {\"tp\": %s, \"dp\": %s, \"pp\": %s}, \"overrides\": \"%s\"}",
            (long long)p->mem_total, p->t_compute * 1e3, p->t_tp * 1e3, p->t_pp * 1e3, p->t_dp * 1e3, p->t_bubble * 1e3,
            p->t_optim * 1e3, p->t_step * 1e3, tok / p->t_step, p->tp_cross_node ? "true" : "false",
            p->dp_cross_node ? "true" : "false", p->pp_cross_node ? "true" : "false", ov);
}

static void print_table(FILE *out, const mt_plan_pred_t *v, int n, int top, const mt_plan_job_t *job) {
    fprintf(out, "%3s  %-50s %9s %8s %8s %8s %8s %8s | %9s %8s %7s %7s %7s %7s %7s %10s\n", "#", "layout", "mem/rank",
            "params", "grads", "optim", "acts", "comm", "step ms", "compute", "tp", "pp", "dp", "bubble", "update",
            "tokens/s");
    double tok = (double)job->global_batch * job->seq_len;
    for (int i = 0; i < n && i < top; i++) {
        const mt_plan_pred_t *p = &v[i];
        char name[96], b[MT_MEM_NCAT + 1][16], over[32] = "";
        mt_plan_layout_str(&p->l, name, sizeof(name));
        fmt_bytes(p->mem_total, b[MT_MEM_NCAT], sizeof(b[0]));
        for (int k = 0; k < MT_MEM_NCAT - 1; k++) {
            fmt_bytes(p->mem[k], b[k], sizeof(b[0]));
        }
        if (!p->fits) {
            char o[16];
            fmt_bytes(p->over, o, sizeof(o));
            snprintf(over, sizeof(over), "  DOES NOT FIT: over by %s", o);
        }
        fprintf(out, "%3d  %-50s %9s %8s %8s %8s %8s %8s | %9.2f %8.2f %7.2f %7.2f %7.2f %7.2f %7.2f %10.0f%s\n", i + 1,
                name, b[MT_MEM_NCAT], b[0], b[1], b[2], b[3], b[4], p->t_step * 1e3, p->t_compute * 1e3, p->t_tp * 1e3,
                p->t_pp * 1e3, p->t_dp * 1e3, p->t_bubble * 1e3, p->t_optim * 1e3, tok / p->t_step, over);
    }
}

/* The layout the job file (with its overrides) describes for `world` ranks. */
static mt_status_t layout_of_config(const mt_config_t *cfg, mt_plan_layout_t *l) {
    mt_settings_t set;
    MT_CHECK(mt_settings_read(cfg, &set));
    mt_plan_layout_from_settings(&set.par, l);
    l->micro_batch = (int)mt_config_int(cfg, "train.micro_batch");
    l->microbatches = (int)mt_config_int(cfg, "train.grad_accum");
    bool block = !strcmp(mt_config_str(cfg, "model.recompute"), "block");
    bool attn = mt_config_bool(cfg, "model.attn_recompute");
    l->recompute =
        block ? (attn ? MT_PLAN_RC_BLOCK_ATTN : MT_PLAN_RC_BLOCK) : (attn ? MT_PLAN_RC_ATTN : MT_PLAN_RC_NONE);
    if (l->dp < 1 || l->micro_batch < 1 || l->microbatches < 1) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "the job's layout is not complete for this world (dp %d, micro_batch %d, "
                        "grad_accum %d): pass --world with the run's rank count",
                        l->dp, l->micro_batch, l->microbatches);
    }
    return MT_OK;
}

/* Reads metrics.jsonl: median step_ms over the steady state (the first tenth of the steps, at least one,
 * left out) and the last line's mem_bytes. */
static int read_metrics(const char *path, double *step_ms, int64_t mem[MT_MEM_NCAT], int64_t *peak, int *n_steps) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "meshtrain plan: --check %s: cannot open: %s\n", path, strerror(errno));
        return 2;
    }
    size_t cap = 0, n = 0;
    double *ms = NULL;
    char *line = NULL;
    size_t lcap = 0;
    int lineno = 0, rc = 0;
    memset(mem, 0, sizeof(int64_t) * MT_MEM_NCAT);
    *peak = 0;
    while (getline(&line, &lcap, f) > 0) {
        lineno++;
        if (line[strspn(line, " \t\r\n")] == '\0') {
            continue;
        }
        char err[160];
        pj_t *o = pj_parse(line, err, sizeof(err));
        const pj_t *mb = pj_get(o, "mem_bytes");
        double s = pj_num(o, "step_ms", -1);
        if (!o || s < 0 || !mb) {
            fprintf(stderr,
                    "meshtrain plan: --check %s:%d: not a metrics line (%s): expected an object with step_ms "
                    "and mem_bytes (metrics.jsonl of meshtrain train)\n",
                    path, lineno, o ? "no step_ms or mem_bytes" : err);
            pj_free(o);
            rc = 2;
            break;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            double *t = realloc(ms, cap * sizeof(double));
            if (!t) {
                pj_free(o);
                rc = 1;
                break;
            }
            ms = t;
        }
        ms[n++] = s;
        for (int k = 0; k < MT_MEM_NCAT; k++) {
            mem[k] = (int64_t)pj_num(mb, cat_key[k], 0);
        }
        *peak = (int64_t)pj_num(mb, "peak", 0);
        pj_free(o);
    }
    free(line);
    fclose(f);
    if (rc == 0 && n == 0) {
        fprintf(stderr, "meshtrain plan: --check %s: no steps in the file\n", path);
        rc = 2;
    }
    if (rc == 0) {
        size_t skip = MT_MAX((size_t)1, n / 10);
        if (skip >= n) {
            skip = 0;
        }
        *step_ms = mt_median(ms + skip, n - skip);
        *n_steps = (int)n;
    }
    free(ms);
    return rc;
}

static int run_check(const plan_opts_t *o, const mt_config_t *cfg, const mt_plan_job_t *job,
                     const mt_plan_cluster_t *cl, int me) {
    mt_plan_layout_t l;
    if (layout_of_config(cfg, &l) != MT_OK) {
        if (me == 0) {
            fprintf(stderr, "meshtrain plan: --check: %s\n", mt_last_error_msg());
        }
        return 2;
    }
    mt_plan_resolve_order(cl, o->world, &l);
    mt_plan_pred_t p;
    if (mt_plan_predict(job, cl, o->world, &l, &p) != MT_OK) {
        if (me == 0) {
            fprintf(stderr, "meshtrain plan: --check: the job's layout cannot be predicted: %s\n", mt_last_error_msg());
        }
        return 2;
    }
    double step_ms = 0;
    int64_t mem[MT_MEM_NCAT], peak = 0;
    int n_steps = 0;
    int rc = read_metrics(o->check, &step_ms, mem, &peak, &n_steps);
    if (rc != 0 || me != 0) {
        return rc;
    }
    double mem_err = peak > 0 ? ((double)p.mem_total - (double)peak) / (double)peak : NAN;
    double t_err = (p.t_step * 1e3 - step_ms) / step_ms;
    char name[96];
    mt_plan_layout_str(&l, name, sizeof(name));
    if (o->json) {
        printf("{\"layout\": \"%s\", \"steps\": %d, \"predicted\": {\"step_ms\": %.4f, \"mem_total\": %lld", name,
               n_steps, p.t_step * 1e3, (long long)p.mem_total);
        for (int k = 0; k < MT_MEM_NCAT - 1; k++) {
            printf(", \"%s\": %lld", cat_key[k], (long long)p.mem[k]);
        }
        printf("}, \"measured\": {\"step_ms\": %.4f, \"mem_peak\": %lld", step_ms, (long long)peak);
        for (int k = 0; k < MT_MEM_NCAT - 1; k++) {
            printf(", \"%s\": %lld", cat_key[k], (long long)mem[k]);
        }
        printf("}, \"mem_error\": %.5f, \"step_error\": %.5f}\n", mem_err, t_err);
        return 0;
    }
    printf("meshtrain plan --check: %s (%d steps in %s)\n", name, n_steps, o->check);
    printf("%-12s %14s %14s %9s\n", "", "predicted", "measured", "error");
    for (int k = 0; k < MT_MEM_NCAT - 1; k++) {
        double e = mem[k] > 0 ? 100.0 * ((double)p.mem[k] - (double)mem[k]) / (double)mem[k] : 0.0;
        printf("%-12s %12.3f M %12.3f M %8.1f%%\n", cat_key[k], mib(p.mem[k]), mib(mem[k]), e);
    }
    printf("%-12s %12.3f M %12.3f M %8.1f%%   (measured: the allocator's peak total, max over ranks)\n", "peak",
           mib(p.mem_total), mib(peak), 100 * mem_err);
    printf("%-12s %12.3f ms %11.3f ms %8.1f%%   (measured: median step after the first tenth)\n", "step",
           p.t_step * 1e3, step_ms, 100 * t_err);
    printf("verdict: memory %s 10%%, step time %s 25%%\n", fabs(mem_err) <= 0.10 ? "within" : "NOT within",
           fabs(t_err) <= 0.25 ? "within" : "NOT within");
    return 0;
}

int mt_cmd_plan(int argc, char **argv) {
    int me = mt_rt_world()->rank;
    /* --cluster FILE.toml is taken out first: the config splitter treats every *.toml argument as the job */
    const char *cluster = NULL;
    char **args = calloc((size_t)argc + 1, sizeof(char *));
    int nargs = 0;
    if (!args) {
        return 1;
    }
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--cluster") && i + 1 < argc) {
            cluster = argv[++i];
        } else if (!strncmp(argv[i], "--cluster=", 10)) {
            cluster = argv[i] + 10;
        } else {
            args[nargs++] = argv[i];
        }
    }
    mt_config_cli_t cli;
    mt_status_t split = mt_config_split_args(nargs, args, &cli);
    if (split != MT_OK) {
        free(args);
        if (me == 0) {
            fprintf(stderr, "meshtrain plan: %s\n", mt_last_error_msg());
        }
        return 2;
    }
    plan_opts_t o = {.top = 10, .cluster = cluster};
    static const struct option longopts[] = {{"top", required_argument, NULL, 'k'},
                                             {"json", no_argument, NULL, 'j'},
                                             {"world", required_argument, NULL, 'w'},
                                             {"check", required_argument, NULL, 'x'},
                                             {"micro-batch", required_argument, NULL, 'b'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    optind = 1;
    opterr = 0;
#if MT_HAVE_CUDA
    mt_plan_set_gpu_requests(mt_gpt2_cuda_requests); /* GPU clusters: the device trainer sizes its memory */
#endif
    int ch, rc = 0;
    while (rc == 0 && (ch = getopt_long(cli.rest_argc, cli.rest_argv, "k:jw:x:b:h", longopts, NULL)) != -1) {
        char *end = NULL;
        switch (ch) {
        case 'x':
            o.check = optarg;
            break;
        case 'j':
            o.json = true;
            break;
        case 'k':
        case 'w':
        case 'b': {
            long v = strtol(optarg, &end, 10);
            if (!end || *end || v < 1 || v > 1 << 30) {
                if (me == 0) {
                    fprintf(stderr, "meshtrain plan: --%s = '%s': expected a positive integer\n",
                            ch == 'k'   ? "top"
                            : ch == 'w' ? "world"
                                        : "micro-batch",
                            optarg);
                }
                rc = 2;
            }
            *(ch == 'k' ? &o.top : ch == 'w' ? &o.world : &o.micro_batch) = (int)v;
            break;
        }
        case 'h':
            if (me == 0) {
                usage(stdout);
            }
            mt_config_cli_free(&cli);
            free(args);
            return 0;
        default:
            if (me == 0) {
                fprintf(stderr, "meshtrain plan: unknown or incomplete option '%s'\n", cli.rest_argv[optind - 1]);
                usage(stderr);
            }
            rc = 2;
        }
    }
    if (rc == 0 && optind < cli.rest_argc) {
        if (me == 0) {
            fprintf(stderr, "meshtrain plan: unexpected argument '%s' (the job file ends in .toml)\n",
                    cli.rest_argv[optind]);
        }
        rc = 2;
    }
    if (rc == 0 && (!cli.path || !o.cluster)) {
        if (me == 0) {
            fprintf(stderr, "meshtrain plan: %s is required\n", !cli.path ? "a job file (JOB.toml)" : "--cluster FILE");
            usage(stderr);
        }
        rc = 2;
    }
    if (rc != 0) {
        mt_config_cli_free(&cli);
        free(args);
        return rc;
    }
    mt_plan_cluster_t cl;
    if (mt_plan_cluster_load(o.cluster, &cl, me == 0 ? stderr : NULL) != MT_OK) {
        if (me == 0) {
            fprintf(stderr, "meshtrain plan: cluster file: %s\n", mt_last_error_msg());
        }
        mt_config_cli_free(&cli);
        free(args);
        return 2;
    }
    int capacity = cl.nodes * cl.devices_per_node;
    if (o.world == 0) {
        o.world = capacity;
    }
    if (o.world > capacity) {
        if (me == 0) {
            fprintf(stderr, "meshtrain plan: --world %d is more than the cluster's %d x %d = %d devices\n", o.world,
                    cl.nodes, cl.devices_per_node, capacity);
        }
        mt_plan_cluster_free(&cl);
        mt_config_cli_free(&cli);
        free(args);
        return 2;
    }
    mt_config_t *cfg = NULL;
    if (mt_config_load(cli.path, cli.n_overrides, cli.overrides, o.check ? o.world : 0, &cfg,
                       me == 0 ? stderr : NULL) != MT_OK) {
        if (me == 0) {
            fprintf(stderr, "meshtrain plan: job file: %s\n", mt_last_error_msg());
        }
        mt_plan_cluster_free(&cl);
        mt_config_cli_free(&cli);
        free(args);
        return 2;
    }
    mt_plan_job_t job;
    if (mt_plan_job_from_config(cfg, &job) != MT_OK) {
        if (me == 0) {
            fprintf(stderr, "meshtrain plan: job file %s: %s\n", cli.path, mt_last_error_msg());
        }
        rc = 2;
    } else if (o.check) {
        rc = run_check(&o, cfg, &job, &cl, me);
    } else {
        mt_plan_opts_t po = {.world = o.world, .micro_batch = o.micro_batch};
        mt_plan_pred_t *v = NULL;
        int n = 0;
        mt_status_t st = mt_plan_enumerate(&job, &cl, &po, &v, &n);
        if (st != MT_OK) {
            if (me == 0) {
                fprintf(stderr, "meshtrain plan: %s\n", mt_last_error_msg());
            }
            rc = st == MT_ERR_INVALID_ARG ? 2 : 1;
        } else if (n == 0) {
            if (me == 0) {
                fprintf(stderr,
                        "meshtrain plan: no layout of %d ranks can run this job (global batch %lld must divide over "
                        "dp; n_head %d over tp): change --world or train.global_batch\n",
                        o.world, (long long)job.global_batch, job.model.n_head);
            }
            rc = 2;
        } else if (me == 0) {
            int n_fit = 0;
            for (int i = 0; i < n; i++) {
                n_fit += v[i].fits;
            }
            char best[4096];
            mt_plan_layout_overrides(&v[0].l, best, sizeof(best));
            if (cl.gpu && !job.cpu_only) { /* the plan is the GPU engine's: "auto" could fall back to the CPU */
                size_t at = strlen(best);
                snprintf(best + at, sizeof(best) - at, " --runtime.device=cuda");
            }
            append_job_overrides(&cli, best, sizeof(best));
            mt_model_t m = NULL;
            double params = 0;
            if (mt_model_init(&job.model, &m) == MT_OK) {
                params = (double)mt_model_numel(m);
            }
            mt_model_free(m);
            if (o.json) {
                printf("{\"job\": ");
                mt_json_write_string(stdout, cli.path ? cli.path : "");
                printf(", \"cluster\": ");
                mt_json_write_string(stdout, cl.name);
                printf(", \"world\": %d, \"params\": %.0f, \"n_layouts\": %d, \"n_fit\": %d, \"best_overrides\": ",
                       o.world, params, n, n_fit);
                mt_json_write_string(stdout, v[0].fits ? best : "");
                printf(", \"layouts\": [\n");
                for (int i = 0; i < n && i < o.top; i++) {
                    print_json_pred(stdout, &v[i], &job, i + 1);
                    printf("%s\n", i + 1 < n && i + 1 < o.top ? "," : "");
                }
                printf("]}\n");
            } else {
                printf("meshtrain plan: %s (%.*f%s parameters, %lld x %d tokens per step) on %s: %d nodes x %d "
                       "devices, %d ranks planned\n",
                       cli.path, params >= 1e9 ? 1 : 3, params >= 1e9 ? params / 1e9 : params / 1e6,
                       params >= 1e9 ? "B" : "M", (long long)job.global_batch, job.seq_len, cl.name, cl.nodes,
                       cl.devices_per_node, o.world);
                char nccl[96] = "";
                if (cl.gpu && !job.cpu_only && !job.gpu_staged && cl.nccl_comm_bytes > 0) {
                    snprintf(nccl, sizeof(nccl), ", less NCCL's %.2f GiB per communicator",
                             cl.nccl_comm_bytes / 1073741824.0);
                }
                printf("%d valid layouts, %d fit in memory (%.2f GiB per rank%s%s; %s). Best %d:\n", n, n_fit,
                       (cl.shared_node ? cl.mem_bytes / MT_MIN(o.world, cl.devices_per_node) : cl.mem_bytes) /
                           1073741824.0,
                       cl.reserve_bytes > 0 ? ", less the reserve" : "", nccl,
                       cl.gpu && !job.cpu_only ? "the GPU engine's device memory" : "the host engines' memory",
                       MT_MIN(o.top, n));
                print_table(stdout, v, n, o.top, &job);
                if (v[0].fits) {
                    printf("\nbest: meshtrain train %s %s\n", cli.path, best);
                } else {
                    char ob[16];
                    fmt_bytes(v[0].over, ob, sizeof(ob));
                    printf("\nno layout fits: the closest is over by %s per rank (more devices, or a smaller "
                           "micro-batch / model)\n",
                           ob);
                }
            }
        }
        free(v);
    }
    mt_config_free(cfg);
    mt_plan_cluster_free(&cl);
    mt_config_cli_free(&cli);
    free(args);
    return rc;
}
