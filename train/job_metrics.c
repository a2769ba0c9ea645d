/* What a training job reports: the progress line of each logged step (loss, lr, gradient norm, step
 * time, tokens/s, MFU, peak memory, exposed communication, ETA), metrics.jsonl (one JSON object per
 * step from rank 0, and one file per rank with metrics.per_rank), and the closing summary. MFU divides
 * the model's FLOPs (mt_model_flops_per_token) by the job's peak: on CPUs the f32 vector peak of the cores
 * (FMA chains timed at start-up, runtime/cpu.h), with the ratio to a measured sgemm (cached per machine,
 * thread count and OpenBLAS kernel) beside it (docs/metrics.md).
 * SPDX-License-Identifier: MIT */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/job_impl.h"
#include "runtime/blas.h"
#include "runtime/matmul.h"
#include "runtime/cpu.h"
#include "runtime/rt.h"

/* Directory of the sgemm cache ("" = $XDG_CACHE_HOME/meshtrain or $HOME/.cache/meshtrain; "off" =
 * measure at every start-up, write nothing). */
MT_PARAM_STR(sgemm_cache, "SGEMM_CACHE", "")
/* Peak GFLOP/s per core to use instead of measuring the vector peak and sgemm (0 = measure). */
MT_PARAM(peak_gflops_core, "PEAK_GFLOPS_PER_CORE", 0)

struct job_metrics {
    FILE *jsonl;     /* rank 0: metrics.jsonl */
    FILE *rank_file; /* metrics.per_rank: this rank's own figures */
    char path[1024], rank_path[1040];
    double peak_flops;  /* the job's peak FLOP/s, 0 = unknown */
    double sgemm_flops; /* CPUs: the job's cores at the measured sgemm rate, 0 = not measured */
    bool bf16_products; /* CPUs: the products run in bf16 (oneDNN): peak and ratio are a bf16 product's */
    char peak_src[512];
    char sgemm_src[320]; /* CPUs: where the sgemm rate came from ("" = not measured) */
    char cache_path[1024]; /* rank 0: the sgemm cache file the peak came from or went to ("" = none) */
    int64_t log_every, steps, first_step;
    double tokens; /* global tokens per step */
    double sum_s;  /* step time of steps run so far (for the ETA), excluding the first */
    int64_t n_timed;
    double steady_s; /* steady-state steps: time and count */
    int64_t n_steady, steady_from;
    double last_loss, last_val;
    bool have_val;
};

/* ---- the CPU's peak: sgemm rate ----------------------------------------------------------------- */

static double sgemm_measure(int n) {
    float *a = malloc((size_t)n * n * sizeof(float)), *b = malloc((size_t)n * n * sizeof(float));
    float *c = malloc((size_t)n * n * sizeof(float));
    double best = 0.0;
    if (a && b && c) {
        for (size_t i = 0; i < (size_t)n * n; i++) {
            a[i] = (float)(i % 7) * 0.25f;
            b[i] = (float)(i % 5) * 0.5f;
        }
        double start = mt_now();
        for (int rep = 0; rep < 12 && (rep < 3 || mt_now() - start < 0.3); rep++) {
            double t0 = mt_now();
            mt_gemm(false, false, n, n, n, a, n, b, n, 0.0f, c, n, MT_F32); /* the library the job's products use */
            double dt = mt_now() - t0;
            if (rep > 0 && dt > 0) { /* the first call warms the thread pool and caches */
                best = MT_MAX(best, 2.0 * n * (double)n * n / dt);
            }
        }
    }
    free(a);
    free(b);
    free(c);
    return best;
}

/* Per-core sgemm FLOP/s on rank 0 with its thread count: the override, the cache, or a measurement
 * (then cached). src says which. */
static double sgemm_per_core(int threads, char *src, size_t src_len, char *cache_out, size_t cache_len) {
    char host[128] = "host", dir[768] = "", path[1024] = "";
    gethostname(host, sizeof(host) - 1);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    const char *cache = mt_param_sgemm_cache();
    bool use_cache = strcmp(cache, "off") != 0;
    if (use_cache) {
        if (cache[0]) {
            snprintf(dir, sizeof(dir), "%s", cache);
        } else if (getenv("XDG_CACHE_HOME") && getenv("XDG_CACHE_HOME")[0]) {
            snprintf(dir, sizeof(dir), "%s/meshtrain", getenv("XDG_CACHE_HOME"));
        } else if (getenv("HOME") && getenv("HOME")[0]) {
            snprintf(dir, sizeof(dir), "%s/.cache/meshtrain", getenv("HOME"));
        } else {
            use_cache = false;
        }
        /* the kernel is part of the key: a rate measured with another kernel says nothing about this one */
        snprintf(path, sizeof(path), "%s/sgemm-%s-%ldcpu-%dt-%s.txt", dir, host, ncpu, threads,
                 mt_matmul_lib(MT_F32) == MT_MATMUL_ONEDNN ? "oneDNN" : openblas_get_corename());
        snprintf(cache_out, cache_len, "%s", path);
    }
    if (use_cache) {
        FILE *f = fopen(path, "r");
        double g = 0.0;
        if (f) {
            bool ok = fscanf(f, "%lf", &g) == 1 && g > 0 && isfinite(g);
            fclose(f);
            if (ok) {
                snprintf(src, src_len, "%.1f GFLOP/s per core (sgemm, cached in %s)", g, path);
                return g * 1e9;
            }
        }
    }
    double rate = sgemm_measure(1024) / threads;
    if (rate <= 0) {
        snprintf(src, src_len, "sgemm measurement failed");
        return 0.0;
    }
    if (use_cache) {
        char tmp[1100];
        snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid());
        /* mkdir -p of the cache directory (two levels at most are missing in practice) */
        for (char *c = dir + 1; *c; c++) {
            if (*c == '/') {
                *c = '\0';
                mkdir(dir, 0755);
                *c = '/';
            }
        }
        mkdir(dir, 0755);
        FILE *f = fopen(tmp, "w");
        if (f &&
            fprintf(f, "%.3f\n# sgemm 1024^3 GFLOP/s per core with %d threads (%s) on %s\n", rate / 1e9, threads,
                    mt_matmul_lib(MT_F32) == MT_MATMUL_ONEDNN ? "oneDNN" : mt_blas_short(), host) > 0 &&
            fclose(f) == 0 && rename(tmp, path) == 0) {
            snprintf(src, src_len, "%.1f GFLOP/s per core (sgemm measured now, cached in %s)", rate / 1e9, path);
        } else {
            if (f) {
                unlink(tmp);
            }
            snprintf(src, src_len, "%.1f GFLOP/s per core (sgemm measured now; cache %s not writable)", rate / 1e9,
                     path);
        }
    } else {
        snprintf(src, src_len, "%.1f GFLOP/s per core (sgemm measured now, cache off)", rate / 1e9);
    }
    return rate;
}

/* The job's peak: rank 0's per-core rate times the cores the job occupies, counted per node as the
 * smaller of the ranks' threads and the node's CPUs (4 ranks of 1 thread on 2 cores occupy 2). */
static mt_status_t job_peak(job_t *j, job_metrics_t *m) {
    const mt_world_t *w = mt_rt_world();
    if (j->engine->peak_flops) { /* a device engine knows its own (or that it does not know it) */
        double mine = j->engine->peak_flops(j->ectx, m->peak_src, sizeof(m->peak_src));
        double in[2] = {mine > 0 ? mine : 0.0, mine > 0 ? 0.0 : 1.0}, out[2] = {0.0, 0.0};
        MT_CHECK(mt_job_allreduce(&j->sync, "peak_flops", in, out, 2, MPI_DOUBLE, MPI_SUM));
        m->peak_flops = out[0];
        if (out[1] > 0) { /* a partial sum would overstate MFU: without every rank's peak there is none */
            m->peak_flops = 0.0;
            snprintf(m->peak_src, sizeof(m->peak_src), "unknown on %.0f of %d ranks (MFU n/a)", out[1], w->size);
        }
        if (m->peak_flops > 0 && w->size > 1) { /* rank 0's source, then the job's sum */
            size_t l = strlen(m->peak_src);
            snprintf(m->peak_src + l, sizeof(m->peak_src) - l, "; summed over %d ranks: %.1f TFLOP/s", w->size,
                     m->peak_flops / 1e12);
        }
        return MT_OK;
    }
    int threads = openblas_get_num_threads();
    threads = threads > 0 ? threads : 1;
    m->bf16_products = j->prec == MT_PREC_BF16 && mt_matmul_lib(MT_BF16) == MT_MATMUL_ONEDNN;
    /* rank 0 measures: [0] the vector peak of one core, [1] the sgemm rate per core (0: not measured) */
    double per_core[2] = {0.0, 0.0};
    if (j->rank == 0) {
        char *sg = m->sgemm_src;
        if (mt_param_peak_gflops_core() > 0) {
            per_core[0] = (double)mt_param_peak_gflops_core() * 1e9;
            snprintf(m->peak_src, sizeof(m->peak_src), "%lld GFLOP/s per core from MESHTRAIN_PEAK_GFLOPS_PER_CORE",
                     (long long)mt_param_peak_gflops_core());
        } else {
            mt_cpu_t cpu;
            mt_cpu_detect(&cpu);
            per_core[0] = mt_cpu_f32_peak_core(&cpu);
            snprintf(m->peak_src, sizeof(m->peak_src), "f32 %s %.1f GFLOP/s per core (FMA chains, measured now)",
                     mt_cpu_vector_isa(&cpu), per_core[0] / 1e9);
            per_core[1] = sgemm_per_core(threads, sg, sizeof(m->sgemm_src), m->cache_path, sizeof(m->cache_path));
            if (m->bf16_products) {
                /* The products run in bf16 on the matrix units, beyond the f32 vector peak: the peak of such a
                 * job is the rate of a large bf16 product, as on GPUs (a measured product in the job's
                 * precision), and the ratio beside MFU is to that same product. */
                double f32 = per_core[0], rate = mt_matmul_bf16_rate(2048) / threads;
                per_core[0] = per_core[1] = MT_MAX(rate, f32);
                snprintf(m->peak_src, sizeof(m->peak_src),
                         "bf16 products (%s): 2048^3 bf16 product %.1f GFLOP/s per core (measured now; the f32 "
                         "%s vector peak is %.1f)",
                         mt_matmul_describe(), rate / 1e9, mt_cpu_vector_isa(&cpu), f32 / 1e9);
                snprintf(sg, sizeof(m->sgemm_src), "%.1f GFLOP/s per core (bf16 product, measured now)",
                         per_core[1] / 1e9);
                m->cache_path[0] = '\0';
            }
        }
        if (per_core[0] <= 0) {
            snprintf(m->peak_src, sizeof(m->peak_src), "vector peak measurement failed");
        }
    }
    /* The other ranks sleep while rank 0 measures: spinning (or yielding) in a broadcast would take cores
     * from the measurement when ranks share them. */
    MT_CHECK(mt_job_bcast_sleepy(&j->sync, "peak_flops", per_core, 2, MPI_DOUBLE, 0));
    MT_CHECK(mt_job_bcast(&j->sync, "peak_source", m->peak_src, (int)sizeof(m->peak_src), MPI_CHAR, 0));
    MT_CHECK(mt_job_bcast(&j->sync, "sgemm_source", m->sgemm_src, (int)sizeof(m->sgemm_src), MPI_CHAR, 0));
    /* threads of the ranks on this node: every rank's (node, threads), summed over this node's */
    int mine_nt[2] = {w->node_id, threads}, *all_nt = malloc(2 * sizeof(int) * (size_t)j->world);
    if (!all_nt) {
        return mt_error(MT_ERR_OOM, "metrics: out of memory");
    }
    mt_status_t st = mt_job_allgather(&j->sync, "node_threads", mine_nt, 2, MPI_INT, all_nt);
    int local_threads = 0;
    for (int r = 0; r < j->world; r++) {
        local_threads += all_nt[2 * r] == w->node_id ? all_nt[2 * r + 1] : 0;
    }
    free(all_nt);
    MT_CHECK(st);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double node_cores = (double)MT_MIN((long)local_threads, ncpu > 0 ? ncpu : local_threads);
    double mine = (double)threads * node_cores / (double)local_threads, cores = 0.0;
    MT_CHECK(mt_job_allreduce(&j->sync, "peak_cores", &mine, &cores, 1, MPI_DOUBLE, MPI_SUM));
    m->peak_flops = per_core[0] * cores;
    m->sgemm_flops = per_core[1] * cores;
    char more[420];
    snprintf(more, sizeof(more), " x %.0f core%s = %.1f GFLOP/s", cores, cores == 1 ? "" : "s", m->peak_flops / 1e9);
    if (m->sgemm_flops > 0) { /* the ratio to a large product is printed next to MFU */
        size_t l = strlen(more);
        snprintf(more + l, sizeof(more) - l, "; %s %.1f GFLOP/s = %s", m->bf16_products ? "bf16 product" : "sgemm",
                 m->sgemm_flops / 1e9, m->sgemm_src);
    }
    size_t l = strlen(m->peak_src);
    snprintf(m->peak_src + l, sizeof(m->peak_src) - l, "%s", more);
    return MT_OK;
}

double mt_job_metrics_peak(const job_metrics_t *m, const char **source) {
    *source = m ? m->peak_src : "";
    return m ? m->peak_flops : 0.0;
}

/* ---- set-up ------------------------------------------------------------------------------------ */

/* A resumed job continues its metrics file: the lines of steps up to the checkpoint are kept (a stopped
 * run may have logged steps after it, which the resumed run repeats), the rest is dropped. */
static void keep_until(const char *path, int64_t last_step) {
    FILE *f = fopen(path, "r");
    if (!f) {
        return;
    }
    char tmp[1100];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *o = fopen(tmp, "w");
    char *line = NULL;
    size_t cap = 0;
    while (o && getline(&line, &cap, f) > 0) {
        long long step = 0;
        if (sscanf(line, "{\"step\": %lld", &step) == 1 && step <= last_step) {
            fputs(line, o);
        }
    }
    free(line);
    fclose(f);
    if (o && fclose(o) == 0) {
        rename(tmp, path);
    }
}

static mt_status_t open_out(const char *path, int64_t resume_step, FILE **out) {
    /* create the parent directory if missing (one level: "out/demo/metrics.jsonl" needs out/ and out/demo) */
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s", path);
    for (char *c = dir + 1; *c; c++) {
        if (*c == '/') {
            *c = '\0';
            mkdir(dir, 0755);
            *c = '/';
        }
    }
    if (resume_step > 0) {
        keep_until(path, resume_step);
    }
    *out = fopen(path, resume_step > 0 ? "a" : "w");
    if (!*out) {
        return mt_error(MT_ERR_INVALID_ARG, "metrics.jsonl: cannot create %s: %s (choose a writable path)", path,
                        strerror(errno));
    }
    return MT_OK;
}

mt_status_t mt_job_metrics_init(job_t *j, job_metrics_t **out) {
    job_metrics_t *m = calloc(1, sizeof(*m));
    *out = m;
    if (!m) {
        return mt_error(MT_ERR_OOM, "metrics: out of memory");
    }
    const mt_config_t *cfg = j->cfg;
    m->log_every = mt_config_int(cfg, "train.log_every");
    m->steps = mt_config_int(cfg, "train.steps");
    m->first_step = j->start_step;
    m->tokens = (double)(j->info.global_batch * j->info.seq_len);
    int64_t run = m->steps - m->first_step;
    m->steady_from = m->first_step + (run > 1 ? MT_MAX((int64_t)1, run / 10) : 0);
    mt_status_t st = job_peak(j, m);
    const char *path = mt_config_str(cfg, "metrics.jsonl");
    if (st == MT_OK && path[0]) {
        snprintf(m->path, sizeof(m->path), "%s", path);
        if (j->rank == 0) {
            st = open_out(path, j->start_step, &m->jsonl);
        }
        if (st == MT_OK && mt_config_bool(cfg, "metrics.per_rank")) {
            const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
            size_t stem = dot && (!slash || dot > slash) ? (size_t)(dot - path) : strlen(path);
            snprintf(m->rank_path, sizeof(m->rank_path), "%.*s.rank%d%s", (int)stem, path, j->rank, path + stem);
            st = open_out(m->rank_path, j->start_step, &m->rank_file);
        }
    } else if (st == MT_OK && mt_config_bool(cfg, "metrics.per_rank") && j->rank == 0) {
        MT_WARN("metrics.per_rank = true but metrics.jsonl is empty: no metrics files are written");
    }
    return st;
}

void mt_job_metrics_free(job_metrics_t *m) {
    if (!m) {
        return;
    }
    if (m->jsonl) {
        fclose(m->jsonl);
    }
    if (m->rank_file) {
        fclose(m->rank_file);
    }
    free(m);
}

/* ---- per step ------------------------------------------------------------------------------------ */

static void fmt_bytes(char *buf, size_t len, double b) {
    if (b >= 1024.0 * 1024 * 1024) {
        snprintf(buf, len, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    } else {
        snprintf(buf, len, "%.1f MiB", b / (1024.0 * 1024));
    }
}

static void fmt_eta(char *buf, size_t len, double s) {
    if (s >= 3600) {
        snprintf(buf, len, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    } else if (s >= 60) {
        snprintf(buf, len, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    } else {
        snprintf(buf, len, "%.0fs", s);
    }
}

static double mfu_of(const job_metrics_t *m, const job_t *j, double tokens_per_s) {
    return m->peak_flops > 0 ? j->flops_per_token * tokens_per_s / m->peak_flops : 0.0;
}

static void json_num(char *buf, size_t len, double v) {
    if (isfinite(v)) {
        snprintf(buf, len, "%.17g", v);
    } else {
        snprintf(buf, len, "null");
    }
}

/* energy_j < 0: unknown, the energy fields are left out (not written as zero); tokens_e: the tokens that
 * energy processed. */
/* The job's memory for the reports: this rank's device memory when the engine reports it (device_mem), the
 * host allocator's otherwise. mine[0..NCAT) bytes now (now) or the peaks (!now), mine[NCAT] the highest
 * total, mine[NCAT+1] reserved device bytes, mine[NCAT+2] the host's highest total (device only). */
enum { MEM_N = MT_MEM_NCAT + 3 };
static bool job_mem(const job_t *j, bool now, int64_t *mine) {
    mt_mem_stats_t host, dev;
    mt_mem_stats(MT_MEM_HOST, &host);
    const mt_mem_stats_t *ms = &host;
    int64_t reserved = 0;
    bool device = j->engine->device_mem != NULL;
    if (device) {
        j->engine->device_mem(j->ectx, &dev, &reserved);
        ms = &dev;
    }
    for (int c = 0; c < MT_MEM_NCAT; c++) {
        mine[c] = now ? ms->current[c] : ms->peak[c];
    }
    mine[MT_MEM_NCAT] = ms->total_peak;
    mine[MT_MEM_NCAT + 1] = reserved;
    mine[MT_MEM_NCAT + 2] = device ? host.total_peak : 0;
    return device;
}

static void write_json(FILE *f, const job_metrics_t *m, const job_t *j, const mt_step_rec_t *r, const int64_t *mem,
                       int64_t peak, const int64_t *dev, double energy_j, double tokens_e) {
    double tps = r->step_s > 0 ? m->tokens / r->step_s : 0.0;
    char loss[32], norm[32]; /* JSON has no inf or NaN: a non-finite value is written as null */
    json_num(loss, sizeof(loss), r->loss);
    json_num(norm, sizeof(norm), r->grad_norm);
    fprintf(f,
            "{\"step\": %lld, \"loss\": %s, \"lr\": %.9g, \"grad_norm\": %s, \"loss_scale\": %.9g, "
            "\"skipped\": %s, \"tokens\": %.0f, "
            "\"step_ms\": %.4f, \"tokens_per_s\": %.2f, \"mfu\": %.6g, "
            "\"time_ms\": {\"data\": %.4f, \"forward\": %.4f, \"backward\": %.4f, \"comm_exposed\": %.4f, "
            "\"optimizer\": %.4f}, "
            "\"mem_bytes\": {\"params\": %lld, \"grads\": %lld, \"optimizer\": %lld, \"activations\": %lld, "
            "\"comm\": %lld, \"other\": %lld, \"peak\": %lld}",
            (long long)r->step, loss, (double)r->lr, norm, (double)r->loss_scale, r->skipped ? "true" : "false",
            m->tokens, r->step_s * 1e3, tps, mfu_of(m, j, tps), r->data_s * 1e3, r->fwd_s * 1e3, r->bwd_s * 1e3,
            r->comm_s * 1e3, r->opt_s * 1e3,
            (long long)mem[MT_MEM_PARAMS], (long long)mem[MT_MEM_GRADS], (long long)mem[MT_MEM_OPTIMIZER],
            (long long)mem[MT_MEM_ACTIVATIONS], (long long)mem[MT_MEM_COMM], (long long)mem[MT_MEM_OTHER],
            (long long)peak);
    if (dev) { /* mem_bytes above are device memory: the allocator's reserve and the host's peak next to them */
        fprintf(f, ", \"mem_space\": \"device\", \"mem_reserved\": %lld, \"host_mem_peak\": %lld",
                (long long)dev[0], (long long)dev[1]);
    }
    if (r->has_val) {
        fprintf(f, ", \"val_loss\": %.17g", r->val_loss);
    }
    fprintf(f, ", \"data_rows\": %lld", (long long)r->data_rows); /* this rank's; rank 0's in metrics.jsonl */
    if (!j->engine->peak_flops) { /* the CPU engine: the matrix library and kernel its products ran on */
        fprintf(f, ", \"blas\": \"%s\"", mt_blas_short());
    }
    if (r->has_bytes) {
        fprintf(f, ", \"comm_bytes\": {\"model\": %.0f, \"other\": %.0f", r->bytes_model, r->bytes_other);
        if (r->has_groups) {
            fprintf(f, ", \"tp\": %.0f, \"pp\": %.0f, \"dp\": %.0f", r->bytes_tp, r->bytes_pp, r->bytes_dp);
        }
        fputc('}', f);
    }
    if (energy_j >= 0) {
        fprintf(f, ", \"energy_j\": %.6g, \"tokens_per_j\": %.6g", energy_j, energy_j > 0 ? tokens_e / energy_j : 0.0);
    }
    fprintf(f, "}\n");
    fflush(f);
}

mt_status_t mt_job_metrics_step(job_metrics_t *m, job_t *j, mt_step_rec_t *r, bool last) {
    int64_t mine[MEM_N], maxed[MEM_N];
    r->mem_device = job_mem(j, true, mine);
    MT_CHECK(mt_job_allreduce(&j->sync, "mem_max", mine, maxed, MEM_N, MPI_INT64_T, MPI_MAX));
    memcpy(r->mem, maxed, sizeof(r->mem));
    r->mem_peak = maxed[MT_MEM_NCAT];
    r->mem_reserved = maxed[MT_MEM_NCAT + 1];
    r->host_peak = maxed[MT_MEM_NCAT + 2];
    double own_energy = r->has_energy ? r->energy_j : -1.0;
    if (j->engine->step_energy) { /* the job's energy: the sum over ranks, known only if every rank knows its own */
        double in[2] = {r->has_energy ? r->energy_j : 0.0, r->has_energy ? 0.0 : 1.0}, out[2];
        MT_CHECK(mt_job_allreduce(&j->sync, "energy", in, out, 2, MPI_DOUBLE, MPI_SUM));
        r->has_energy = out[1] == 0.0;
        r->energy_j = out[0];
    }
    int64_t s = r->step - 1;
    if (s > m->first_step) {
        m->sum_s += r->step_s;
        m->n_timed++;
    }
    if (s >= m->steady_from) {
        m->steady_s += r->step_s;
        m->n_steady++;
    }
    m->last_loss = r->loss;
    if (r->has_val) {
        m->last_val = r->val_loss;
        m->have_val = true;
    }
    if (m->rank_file) {
        write_json(m->rank_file, m, j, r, mine, mine[MT_MEM_NCAT], r->mem_device ? mine + MT_MEM_NCAT + 1 : NULL,
                   own_energy,
                   m->tokens / (double)MT_MAX(1, j->info.dp_size));
    }
    if (j->rank != 0) {
        return MT_OK;
    }
    if (m->jsonl) {
        int64_t dev[2] = {r->mem_reserved, r->host_peak};
        write_json(m->jsonl, m, j, r, r->mem, r->mem_peak, r->mem_device ? dev : NULL,
                   r->has_energy ? r->energy_j : -1.0, m->tokens);
    }
    if (j->out && (r->step % m->log_every == 0 || s == m->first_step || last)) {
        double tps = r->step_s > 0 ? m->tokens / r->step_s : 0.0;
        double per = m->n_timed > 0 ? m->sum_s / (double)m->n_timed : r->step_s;
        char mem[96], eta[32], mfu[32];
        fmt_bytes(mem, sizeof(mem), (double)r->mem_peak);
        if (r->mem_device) { /* the device's peak, then the host's */
            char host[32];
            fmt_bytes(host, sizeof(host), (double)r->host_peak);
            size_t l = strlen(mem);
            snprintf(mem + l, sizeof(mem) - l, " device, %s host", host);
        }
        fmt_eta(eta, sizeof(eta), per * (double)(m->steps - r->step));
        if (m->peak_flops > 0) {
            snprintf(mfu, sizeof(mfu), "%.2f%%", 100.0 * mfu_of(m, j, tps));
        } else {
            snprintf(mfu, sizeof(mfu), "n/a");
        }
        fprintf(j->out,
                "step %5lld/%lld | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | MFU %s | peak mem %s | "
                "comm %.0f%% | ETA %s\n",
                (long long)r->step, (long long)m->steps, r->loss, (double)r->lr, r->grad_norm, r->step_s * 1e3, tps,
                mfu, mem, r->step_s > 0 ? 100.0 * r->comm_s / r->step_s : 0.0, eta);
        if (r->has_energy) {
            fprintf(j->out, "step %5lld/%lld | energy %.1f J | %.1f tok/J\n", (long long)r->step, (long long)m->steps,
                    r->energy_j, r->energy_j > 0 ? m->tokens / r->energy_j : 0.0);
        }
        if (mt_job_scaler(j)->dynamic || r->skipped) { /* fp16: the loss scale; any mode: a step without an update */
            fprintf(j->out, "step %5lld/%lld | loss scale %g%s\n", (long long)r->step, (long long)m->steps,
                    (double)r->loss_scale, r->skipped ? " | update skipped" : "");
        }
    }
    if (j->out && r->has_val) {
        fprintf(j->out, "step %5lld/%lld | val loss %.6f (%lld batches)\n", (long long)r->step, (long long)m->steps,
                r->val_loss, (long long)mt_config_int(j->cfg, "train.eval_batches"));
    }
    if (j->out) {
        fflush(j->out);
    }
    return MT_OK;
}

/* ---- the summary ----------------------------------------------------------------------------------- */

mt_status_t mt_job_metrics_finish(job_metrics_t *m, job_t *j, mt_job_result_t *res) {
    int64_t mine[MEM_N], maxed[MEM_N];
    bool device = job_mem(j, false, mine);
    MT_CHECK(mt_job_allreduce(&j->sync, "mem_peak_max", mine, maxed, MEM_N, MPI_INT64_T, MPI_MAX));
    memcpy(res->mem_peak, maxed, sizeof(res->mem_peak));
    res->mem_peak_total = maxed[MT_MEM_NCAT];
    res->steady_tokens_per_s = m->steady_s > 0 ? m->tokens * (double)m->n_steady / m->steady_s : 0.0;
    res->mfu = mfu_of(m, j, res->steady_tokens_per_s);
    double of_sgemm = m->sgemm_flops > 0 ? j->flops_per_token * res->steady_tokens_per_s / m->sgemm_flops : 0.0;
    if (res->mfu > 1.0 && j->rank == 0) {
        /* Faster than the cores' vector peak: the probe ran while other work shared the cores. */
        MT_WARN("the job reached %.0f%% of the peak it measures MFU against (%s): that peak is too low, measured "
                "while the cores were busy",
                100.0 * res->mfu, m->peak_src);
    }
    if (of_sgemm > 1.0 && j->rank == 0 && m->cache_path[0]) {
        /* Faster than sgemm: the cached rate was measured while other work shared the cores. */
        MT_WARN("the job ran at %.0f%% of the sgemm rate it compares against (%s): that rate is too low, measured "
                "while the cores were busy; removing the cache so the next job measures again: %s",
                100.0 * of_sgemm, m->sgemm_src, m->cache_path);
        unlink(m->cache_path);
    }
    if (!j->out) {
        return MT_OK;
    }
    FILE *o = j->out;
    int64_t ran = res->n_steps - m->first_step;
    fprintf(o, "summary: %lld step%s in %.2f s", (long long)ran, ran == 1 ? "" : "s", res->seconds);
    if (m->n_steady > 0) {
        fprintf(o, " | steady state (steps %lld-%lld): %.0f tok/s", (long long)m->steady_from + 1,
                (long long)res->n_steps, res->steady_tokens_per_s);
        if (m->peak_flops > 0) {
            fprintf(o, ", MFU %.2f%%", 100.0 * res->mfu);
        }
        if (of_sgemm > 0) {
            fprintf(o, " (%.1f%% of %s)", 100.0 * of_sgemm, m->bf16_products ? "the bf16 product" : "sgemm");
        }
    }
    if (ran > 0) {
        fprintf(o, " | final train loss %.6f", m->last_loss);
    }
    if (m->have_val) {
        fprintf(o, " | final val loss %.6f", m->last_val);
    }
    if (mt_job_scaler(j)->dynamic) {
        fprintf(o, " | fp16: %lld step%s skipped on overflow, loss scale now %g", (long long)res->n_overflow,
                res->n_overflow == 1 ? "" : "s", (double)res->loss_scale);
    }
    if (res->n_skipped > 0) {
        fprintf(o, " | %lld non-finite step%s skipped (train.on_nan = skip)", (long long)res->n_skipped,
                res->n_skipped == 1 ? "" : "s");
    }
    fprintf(o, "\npeak %smemory per rank (max over ranks):", device ? "device " : "");
    for (int c = 0; c < MT_MEM_NCAT; c++) {
        char b[32];
        fmt_bytes(b, sizeof(b), (double)maxed[c]);
        fprintf(o, " %s %s%s", mt_mem_cat_name((mt_mem_cat_t)c), b, c + 1 < MT_MEM_NCAT ? "," : "");
    }
    char b[32];
    fmt_bytes(b, sizeof(b), (double)maxed[MT_MEM_NCAT]);
    fprintf(o, " | total %s", b);
    if (device) {
        char rsv[32];
        fmt_bytes(rsv, sizeof(rsv), (double)maxed[MT_MEM_NCAT + 1]);
        fmt_bytes(b, sizeof(b), (double)maxed[MT_MEM_NCAT + 2]);
        fprintf(o, " | reserved %s | host peak %s", rsv, b);
    }
    fprintf(o, "\n");
    if (m->path[0]) {
        fprintf(o, "metrics: %s%s (plot: launch/plot-metrics %s OUT.png)\n", m->path,
                m->rank_path[0] ? " and one file per rank (metrics.per_rank)" : "", m->path);
    }
    fflush(o);
    return MT_OK;
}
