/* The engine record of the GPU engine under the CPU emulator (issue 38: "record the before first"; the CPU
 * layouts are tests/engine/before.py's). Each layout below trains test_job_cuda's small GPT-2 (2 blocks, width 32,
 * 5 AdamW steps of 2 micro-batches, an evaluation after steps 2, 4 and 5) with runtime.device = "cuda" on the
 * world's ranks, and gives:
 *   - every step's loss and gradient norm and every validation loss (%.17g: the double exactly);
 *   - what one steady step costs: the kernel launches, cuBLASLt products, bytes copied by direction and host
 *     waits by kind of step 5 (the emulator's counters over the whole run minus those of the same run stopped
 *     after step 4).
 *   record FILE: appends the layouts of this world size to FILE (the header first when FILE is empty);
 *   check FILE: runs them again and compares: the host waits equal, the launches, products and bytes copied no
 *     more than recorded (fewer is printed: re-record to keep the gain); the numbers bit-identical on
 *     the CPU model FILE was recorded on, else within 1e-6 relative (the emulator's "same function" tolerance,
 *     docs/gpu.md), bf16 and fp16 within 1e-4 (ZeRO's f32 rounding of a bf16 weight: test_job_cuda's
 *     ZERO2_BF16_TOL); it prints how many values were bit-identical.
 * Re-record (a change meant to change the numbers or the costs, said in its commit):
 *   rm tests/engine/before_gpu_emu.tsv; for n in 1 2 4; do mpiexec -np $n build/tests/engine/record_gpu_emu
 *   record tests/engine/before_gpu_emu.tsv; done
 * SPDX-License-Identifier: MIT */
#include "mt_build_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/job.h"
#include "models/cuda/mt_cuda.h"
#include "plan/plan.h"
#include "runtime/cuda_alloc.h"
#include "runtime/mesh.h"
#include "runtime/rt.h"
#include "tests/gpu/job_cuda_base.h"
#include "testutil.h"

enum { STEPS = 5, MAX_ARGS = 6, MAX_STEPS = 8, MAX_EVALS = 4 };

typedef struct {
    const char *name;
    int np, tp, pp;
    const char *args[MAX_ARGS];
} layout_t;

/* ZeRO at the default parallel.bucket_mb: the GPU engine ignores it today (one slice per rank), and after the
 * rewrite one bucket holds this model, so the costs stay comparable */
#define ZERO(s) "--parallel.engine=zero", "--parallel.zero_stage=" #s
static const layout_t layouts[] = {
    {"single", 1, 1, 1, {NULL}},
    {"single_bf16", 1, 1, 1, {"--precision.compute=bf16"}},
    {"single_fp16", 1, 1, 1, {"--precision.compute=fp16", "--precision.init_scale=1024"}},
    {"single_fp16_overflow", 1, 1, 1, {"--precision.compute=fp16", "--precision.init_scale=16777216"}},
    {"single_recompute", 1, 1, 1, {"--model.recompute=block"}},
    {"single_head_chunks", 1, 1, 1, {"--model.head_chunks=3"}},
    {"ddp_np2", 2, 1, 1, {"--parallel.engine=ddp", "--parallel.bucket_mb=0.001"}},
    {"dp_np2", 2, 1, 1, {"--parallel.engine=dp"}},
    {"zero1_np2", 2, 1, 1, {ZERO(1)}},
    {"zero2_np2", 2, 1, 1, {ZERO(2)}},
    {"zero2_bf16_np2", 2, 1, 1, {ZERO(2), "--precision.compute=bf16"}},
    {"zero3_np2", 2, 1, 1, {ZERO(3)}},
    {"gpipe_pp2", 2, 1, 2, {"--parallel.schedule=gpipe"}},
    {"1f1b_pp2_bf16", 2, 1, 2, {"--parallel.schedule=1f1b", "--precision.compute=bf16"}},
    {"tp2", 2, 2, 1, {NULL}},
    {"tp2_sp", 2, 2, 1, {"--parallel.sequence_parallel=true"}},
    {"zero3_np4", 4, 1, 1, {ZERO(3)}},
    {"1f1b_pp4", 4, 1, 4, {"--model.n_layer=4"}},
    {"tp2_dp2_zero2", 4, 2, 1, {ZERO(2)}},
    {"tp2_pp2", 4, 2, 2, {NULL}},
};

/* test_job_cuda's job, with an evaluation after steps 2 and 4 (and the last), the learning rate's floor above 0 so
 * the last step moves the weights, on the GPU engine, no metrics file */
static const char *const base[] = {MT_JOB_CUDA_BASE_ARGS,    "--optimizer.min_lr=1e-3", "--train.eval_every=2",
                                   "--train.eval_batches=1", "--runtime.device=cuda",   "--metrics.jsonl="};

/* One steady step's work, from the emulator's counters. */
enum { C_LAUNCH, C_MATMUL, C_H2D, C_D2H, C_D2D, C_WAIT0, C_N = C_WAIT0 + MT_EMU_WAIT_KINDS };
static const char *const cost_names[C_N] = {"launches",    "matmuls",    "h2d_bytes",   "d2h_bytes", "d2d_bytes",
                                            "wait_stream", "wait_event", "wait_device", "wait_copy", "wait_free"};

static void counters(size_t *c) {
    c[C_LAUNCH] = mt_emu_kernel_launches();
    c[C_MATMUL] = mt_emu_matmuls();
    c[C_H2D] = mt_emu_copy_bytes(cudaMemcpyHostToDevice);
    c[C_D2H] = mt_emu_copy_bytes(cudaMemcpyDeviceToHost);
    c[C_D2D] = mt_emu_copy_bytes(cudaMemcpyDeviceToDevice) + mt_emu_copy_bytes(cudaMemcpyDefault);
    for (int k = 0; k < MT_EMU_WAIT_KINDS; k++) {
        c[C_WAIT0 + k] = mt_emu_host_waits(k);
    }
}

/* The layout's job, stopped after stop_after steps when > 0; c[] the counters' growth over it. */
static mt_status_t run(const layout_t *l, int64_t stop_after, mt_job_result_t *res, size_t *c) {
    const mt_world_t *w = mt_rt_world();
    const char *args[64];
    int n = 0, dp = w->size / (l->tp * l->pp);
    for (size_t i = 0; i < MT_ARRAY_LEN(base); i++) {
        args[n++] = base[i];
    }
    char gb[64], tpa[64], ppa[64];
    snprintf(gb, sizeof(gb), "--train.global_batch=%d", 4 * dp);
    snprintf(tpa, sizeof(tpa), "--parallel.tp=%d", l->tp);
    snprintf(ppa, sizeof(ppa), "--parallel.pp=%d", l->pp);
    args[n++] = gb;
    args[n++] = tpa;
    args[n++] = ppa;
    for (int i = 0; i < MAX_ARGS && l->args[i]; i++) {
        args[n++] = l->args[i];
    }
    mt_config_t *cfg = NULL;
    mt_status_t st = mt_config_load(NULL, n, (char **)args, w->size, &cfg, stderr);
    if (st != MT_OK) {
        return st;
    }
    mt_job_opts_t opts = MT_JOB_OPTS_INIT;
    opts.prefetch = false;
    opts.engine = mt_job_engine_cuda();
    opts.stop_after = stop_after;
    mt_mesh_t *mesh = NULL;
    if (l->tp > 1 || l->pp > 1) {
        CHECK_OK(mt_mesh_create(w->size, l->tp, l->pp, dp, "tp-dp-pp", &mesh));
        int coords[MT_AXIS_N];
        mt_mesh_coords(mesh, w->rank, coords);
        opts.mesh = mesh;
        opts.dp_rank = coords[MT_AXIS_DP];
        opts.dp_size = dp;
    }
    mt_dev_empty_cache(); /* a job starts from an empty allocator, as in a fresh process */
    size_t c0[C_N], c1[C_N];
    counters(c0);
    st = mt_job_run(cfg, &opts, res);
    counters(c1);
    for (int k = 0; k < C_N; k++) {
        c[k] = c1[k] - c0[k];
    }
    mt_config_free(cfg);
    mt_mesh_free(mesh);
    return st;
}

typedef struct {
    int n_steps, n_evals;
    char loss[MAX_STEPS][32], norm[MAX_STEPS][32], val[MAX_EVALS][32];
    long long eval_step[MAX_EVALS];
    unsigned long long cost[C_N];
} rec_t;

/* The layout's record: the full run's numbers, step 5's costs (summed over the ranks: each rank's own). */
static bool measure(const layout_t *l, rec_t *r) {
    const mt_world_t *w = mt_rt_world();
    mt_job_result_t full, part;
    size_t cf[C_N], cp[C_N];
    memset(r, 0, sizeof(*r));
    mt_status_t st = run(l, 0, &full, cf);
    CHECK(st == MT_OK, "%s: %s", l->name, mt_last_error_msg());
    if (st != MT_OK) {
        return false;
    }
    st = run(l, STEPS - 1, &part, cp);
    CHECK(st == MT_OK, "%s, stopped after step %d: %s", l->name, STEPS - 1, mt_last_error_msg());
    bool ok = st == MT_OK && full.n_steps == STEPS && full.n_evals <= MAX_EVALS;
    CHECK(ok, "%s: %lld steps, %lld evaluations", l->name, (long long)full.n_steps, (long long)full.n_evals);
    if (ok) {
        r->n_steps = (int)full.n_steps;
        r->n_evals = (int)full.n_evals;
        for (int s = 0; s < r->n_steps; s++) {
            snprintf(r->loss[s], sizeof(r->loss[s]), "%.17g", full.loss[s]);
            snprintf(r->norm[s], sizeof(r->norm[s]), "%.17g", full.grad_norm[s]);
        }
        for (int v = 0; v < r->n_evals; v++) {
            snprintf(r->val[v], sizeof(r->val[v]), "%.17g", full.val_loss[v]);
            r->eval_step[v] = (long long)full.eval_step[v];
        }
        unsigned long long mine[C_N];
        for (int k = 0; k < C_N; k++) {
            mine[k] = (unsigned long long)(cf[k] - cp[k]);
        }
        MPI_Allreduce(mine, r->cost, C_N, MPI_UNSIGNED_LONG_LONG, MPI_SUM, w->comm);
        mt_job_result_free(&part);
    }
    mt_job_result_free(&full);
    return ok;
}

static void cpu_model(char *buf, size_t len) {
    snprintf(buf, len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof(line), f)) {
        char *colon = strchr(line, ':');
        if (!strncmp(line, "model name", 10) && colon) {
            snprintf(buf, len, "%s", colon + 2);
            buf[strcspn(buf, "\n")] = '\0';
            break;
        }
    }
    if (f) {
        fclose(f);
    }
}

static void write_rec(FILE *f, const layout_t *l, const rec_t *r) {
    for (int s = 0; s < r->n_steps; s++) {
        fprintf(f, "%s\tstep\t%d\t%s\t%s\n", l->name, s + 1, r->loss[s], r->norm[s]);
    }
    for (int v = 0; v < r->n_evals; v++) {
        fprintf(f, "%s\tval\t%lld\t%s\n", l->name, r->eval_step[v], r->val[v]);
    }
    for (int k = 0; k < C_N; k++) {
        fprintf(f, "%s\tcost\t%s\t%llu\n", l->name, cost_names[k], r->cost[k]);
    }
}

static void record(const char *path) {
    const mt_world_t *w = mt_rt_world();
    FILE *f = NULL;
    if (w->rank == 0) {
        f = fopen(path, "a");
        CHECK(f != NULL, "cannot append to %s", path);
        if (f && ftell(f) == 0) {
            char cpu[256];
            cpu_model(cpu, sizeof(cpu));
            fprintf(f,
                    "# meshtrain engine record of the GPU engine under the CPU emulator (tests/engine/record_gpu.c)\n"
                    "# cpu\t%s\n# layout\tstep\tN\tloss\tgrad_norm | layout\tval\tafter step\tval_loss | layout\tcost"
                    "\twhat\tstep 5's count (all ranks)\n",
                    cpu);
        }
    }
    for (size_t i = 0; i < MT_ARRAY_LEN(layouts); i++) {
        rec_t r;
        if (layouts[i].np == w->size && measure(&layouts[i], &r) && f) {
            write_rec(f, &layouts[i], &r);
            printf("%s: recorded\n", layouts[i].name);
        }
    }
    if (f) {
        fclose(f);
    }
}

/* The value v against the recorded a: bit-identical (the same decimal string of the double) or within tol. */
static void compare_num(const char *what, const char *a, const char *v, double tol, bool exact_only, int *n, int *same,
                        double *worst) {
    (*n)++;
    if (!strcmp(a, v)) {
        (*same)++;
        return;
    }
    double d = fabs(strtod(a, NULL) - strtod(v, NULL)) / fmax(fabs(strtod(a, NULL)), 1e-30);
    *worst = fmax(*worst, d);
    CHECK(!exact_only && d <= tol, "%s: recorded %s, now %s (relative %.2e; %s)", what, a, v, d,
          exact_only ? "bit-identical required on the recording CPU" : "over the tolerance");
}

static void check(const char *path) {
    const mt_world_t *w = mt_rt_world();
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot read %s", path);
    if (!f) {
        return;
    }
    char line[512], rec_cpu[256] = "", cpu[256];
    cpu_model(cpu, sizeof(cpu));
    while (fgets(line, sizeof(line), f)) {
        if (!strncmp(line, "# cpu\t", 6)) {
            snprintf(rec_cpu, sizeof(rec_cpu), "%s", line + 6);
            rec_cpu[strcspn(rec_cpu, "\n")] = '\0';
        }
    }
    bool same_cpu = !strcmp(rec_cpu, cpu);
    for (size_t i = 0; i < MT_ARRAY_LEN(layouts); i++) {
        const layout_t *l = &layouts[i];
        rec_t r;
        if (l->np != w->size || !measure(l, &r)) {
            continue;
        }
        bool low = false;
        for (int a = 0; a < MAX_ARGS && l->args[a]; a++) {
            low |= strstr(l->args[a], "bf16") || strstr(l->args[a], "fp16");
        }
        double tol = low ? 1e-4 : 1e-6, worst = 0.0;
        int n = 0, same = 0, found = 0, failed0 = mt_test_failures;
        rewind(f);
        while (fgets(line, sizeof(line), f)) {
            char name[64], kind[16], key[32], a[40], b[40];
            int got = sscanf(line, "%63s %15s %31s %39s %39s", name, kind, key, a, b);
            if (line[0] == '#' || got < 4 || strcmp(name, l->name)) {
                continue;
            }
            found++;
            char what[160];
            if (!strcmp(kind, "step") && got == 5) {
                int s = atoi(key) - 1;
                bool in = s >= 0 && s < r.n_steps;
                CHECK(in, "%s: step %s recorded, %d steps run", l->name, key, r.n_steps);
                if (in) {
                    snprintf(what, sizeof(what), "%s step %d loss", l->name, s + 1);
                    compare_num(what, a, r.loss[s], tol, same_cpu, &n, &same, &worst);
                    snprintf(what, sizeof(what), "%s step %d gradient norm", l->name, s + 1);
                    compare_num(what, b, r.norm[s], tol, same_cpu, &n, &same, &worst);
                }
            } else if (!strcmp(kind, "val")) {
                int v = 0;
                while (v < r.n_evals && r.eval_step[v] != atoll(key)) {
                    v++;
                }
                CHECK(v < r.n_evals, "%s: an evaluation after step %s recorded, none now", l->name, key);
                if (v < r.n_evals) {
                    snprintf(what, sizeof(what), "%s validation loss after step %s", l->name, key);
                    compare_num(what, a, r.val[v], tol, same_cpu, &n, &same, &worst);
                }
            } else if (!strcmp(kind, "cost")) {
                int k = 0;
                while (k < C_N && strcmp(cost_names[k], key)) {
                    k++;
                }
                unsigned long long was = strtoull(a, NULL, 10), now = k < C_N ? r.cost[k] : 0ULL;
                bool wait = k >= C_WAIT0;
                CHECK(k < C_N && (wait ? now == was : now <= was), "%s: step 5's %s: %llu recorded, %llu now (%s)",
                      l->name, key, was, now, wait ? "host waits stay what they are" : "must not grow");
                if (k < C_N && !wait && now < was && w->rank == 0) {
                    printf("%s: step 5's %s down from %llu to %llu\n", l->name, key, was, now);
                }
            }
        }
        CHECK(found == r.n_steps + r.n_evals + C_N, "%s: %d lines in %s, %d expected (re-record: see record_gpu.c)",
              l->name, found, path, r.n_steps + r.n_evals + C_N);
        if (w->rank == 0) {
            printf("%s: %s: %d values, %d bit-identical%s (largest difference %.2e)\n", l->name,
                   mt_test_failures == failed0 ? "as recorded" : "FAILED", n, same,
                   same_cpu ? ", all required (the recording CPU)" : "; recorded on another CPU", worst);
        }
    }
    fclose(f);
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    mt_plan_set_gpu_requests(mt_gpt2_cuda_requests);
    setenv("MESHTRAIN_PEAK_GFLOPS_PER_GPU", "1000", 1); /* the engine measures nothing under the emulator */
    if (argc == 3 && !strcmp(argv[1], "record")) {
        record(argv[2]);
    } else if (argc == 3 && !strcmp(argv[1], "check")) {
        check(argv[2]);
    } else {
        CHECK(false, "usage: record_gpu_emu record|check FILE");
    }
    return mt_test_finish_mpi("record_gpu_emu");
}
