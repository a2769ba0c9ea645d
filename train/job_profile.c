/* The profiler wired into a job: profile.trace records a timeline of the steps in profile.steps (data,
 * forward and backward of every module through the model's hooks, gradient communication, optimizer,
 * validation, checkpoint; the collectives and pipeline messages record their own spans) and rank 0
 * merges every rank's events into one Chrome trace file right after the last profiled step.
 * profile.memory writes each rank's allocator history over the same steps. Nothing is installed when
 * profiling is off.
 * SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train/job_impl.h"
#include "models/model_impl.h" /* the hooks the engine installed, to chain the tracing hooks to them */
#include "runtime/memprof.h"
#include "runtime/trace.h"

struct job_profile {
    int64_t first, last; /* 0-based steps [first, last] */
    const char *trace, *memory;
    char mem_path[1100];
    mt_model_t model;
    mt_model_hooks_t inner; /* the engine's hooks */
    double *t_fwd, *t_bwd;  /* per module: trace clock at its start */
    int n_modules;
    bool hooked, started, done;
};

/* ---- hooks: a span per module and direction, around the engine's own hooks ------------------------ */

static mt_status_t prof_pre_forward(void *arg, int module) {
    job_profile_t *p = arg;
    if (p->inner.pre_forward) {
        MT_CHECK(p->inner.pre_forward(p->inner.arg, module));
    }
    p->t_fwd[module] = mt_trace_on() ? mt_trace_now_us() : 0.0;
    return MT_OK;
}

static mt_status_t prof_post_forward(void *arg, int module) {
    job_profile_t *p = arg;
    if (mt_trace_on() && p->t_fwd[module] > 0.0) {
        mt_trace_span("forward", mt_model_module_name(p->model, module), p->t_fwd[module], mt_trace_now_us(), NULL);
    }
    return p->inner.post_forward ? p->inner.post_forward(p->inner.arg, module) : MT_OK;
}

static mt_status_t prof_pre_backward(void *arg, int module) {
    job_profile_t *p = arg;
    if (p->inner.pre_backward) {
        MT_CHECK(p->inner.pre_backward(p->inner.arg, module));
    }
    p->t_bwd[module] = mt_trace_on() ? mt_trace_now_us() : 0.0;
    return MT_OK;
}

static mt_status_t prof_post_backward(void *arg, int module) {
    job_profile_t *p = arg;
    if (mt_trace_on() && p->t_bwd[module] > 0.0) {
        mt_trace_span("backward", mt_model_module_name(p->model, module), p->t_bwd[module], mt_trace_now_us(), NULL);
    }
    return p->inner.post_backward ? p->inner.post_backward(p->inner.arg, module) : MT_OK;
}

/* ---- set-up -------------------------------------------------------------------------------------- */

/* "A-B" or "A" (1-based, inclusive) into 0-based [first, last]; empty: every step. */
static mt_status_t parse_steps(const char *s, int64_t steps, int64_t *first, int64_t *last) {
    if (!s[0]) {
        *first = 0;
        *last = steps - 1;
        return MT_OK;
    }
    char *end = NULL;
    errno = 0;
    long long a = strtoll(s, &end, 10), b = a;
    if (end && *end == '-') {
        b = strtoll(end + 1, &end, 10);
    }
    if (errno || !end || *end != '\0' || end == s || a < 1 || b < a) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "profile.steps = \"%s\": expected \"A-B\" with 1 <= A <= B (steps counted from 1), or \"A\"",
                        s);
    }
    /* A range past the end (a shorter run of a config that profiles later steps) is cut to the job. */
    *first = a - 1;
    *last = MT_MIN(b, steps) - 1;
    return MT_OK;
}

mt_status_t mt_job_profile_init(job_t *j, job_profile_t **out) {
    *out = NULL;
    const char *trace = mt_config_str(j->cfg, "profile.trace"), *memory = mt_config_str(j->cfg, "profile.memory");
    const char *steps = mt_config_str(j->cfg, "profile.steps");
    if (!trace[0] && !memory[0]) {
        if (steps[0] && j->rank == 0) {
            MT_WARN("profile.steps = \"%s\" but neither profile.trace nor profile.memory is set: nothing is profiled",
                    steps);
        }
        return MT_OK;
    }
    job_profile_t *p = calloc(1, sizeof(*p));
    if (!p) {
        return mt_error(MT_ERR_OOM, "profiler: out of memory");
    }
    *out = p;
    p->trace = trace[0] ? trace : NULL;
    p->memory = memory[0] ? memory : NULL;
    int64_t n_steps = mt_config_int(j->cfg, "train.steps");
    MT_CHECK(parse_steps(steps, n_steps, &p->first, &p->last));
    if (p->first >= n_steps) {
        if (j->rank == 0) {
            MT_WARN("profile.steps = \"%s\" starts after the job's last step (train.steps = %lld): nothing is "
                    "profiled",
                    steps, (long long)n_steps);
        }
        p->trace = p->memory = NULL;
        p->done = true;
        return MT_OK;
    }
    if (p->memory) {
        if (j->world == 1) {
            snprintf(p->mem_path, sizeof(p->mem_path), "%s", p->memory);
        } else { /* one file per rank: mem.json -> mem.rank3.json */
            const char *dot = strrchr(p->memory, '.'), *slash = strrchr(p->memory, '/');
            size_t stem = dot && (!slash || dot > slash) ? (size_t)(dot - p->memory) : strlen(p->memory);
            snprintf(p->mem_path, sizeof(p->mem_path), "%.*s.rank%d%s", (int)stem, p->memory, j->rank,
                     p->memory + stem);
        }
    }
    if (p->trace) {
        uint64_t call = mt_job_sync_begin(&j->sync, "trace_sync_clocks", 0); /* watched (job_sync.c) */
        mt_status_t st = mt_trace_sync_clocks(j->comm);
        mt_job_sync_end(&j->sync, call);
        MT_CHECK(st);
        mt_trace_reset();
        mt_trace_thread_name("main");
    }
    /* the output directories, so a missing one is found now rather than after the profiled steps */
    const char *paths[2] = {p->trace, p->memory ? p->mem_path : NULL};
    for (int k = 0; k < 2; k++) {
        if (!paths[k] || (k == 0 && j->rank != 0)) {
            continue;
        }
        char dir[1100];
        snprintf(dir, sizeof(dir), "%s", paths[k]);
        for (char *c = dir + 1; *c; c++) {
            if (*c == '/') {
                *c = '\0';
                mkdir(dir, 0755);
                *c = '/';
            }
        }
    }
    return MT_OK;
}

void mt_job_profile_hooks(job_profile_t *p, job_t *j) {
    if (!p || !p->trace) {
        return;
    }
    p->model = j->model;
    p->n_modules = mt_model_n_modules(j->model);
    p->t_fwd = calloc((size_t)p->n_modules, sizeof(double));
    p->t_bwd = calloc((size_t)p->n_modules, sizeof(double));
    if (!p->t_fwd || !p->t_bwd) {
        MT_WARN("profiler: out of memory for module spans; the trace has no per-module spans");
        return;
    }
    p->inner = j->model->hooks;
    mt_model_hooks_t h = {.pre_forward = prof_pre_forward,
                          .post_forward = prof_post_forward,
                          .pre_backward = prof_pre_backward,
                          .post_backward = prof_post_backward,
                          .arg = p};
    mt_model_set_hooks(j->model, &h);
    p->hooked = true;
}

void mt_job_profile_step_begin(job_profile_t *p, int64_t s) {
    if (!p || p->started || s < p->first || s > p->last) { /* a resumed job may start inside the range */
        return;
    }
    p->started = true;
    if (p->trace) {
        mt_trace_start();
    }
    if (p->memory) {
        mt_memprof_start();
    }
}

mt_status_t mt_job_profile_step_end(job_profile_t *p, job_t *j, int64_t s) {
    if (!p || s != p->last || p->done || !p->started) {
        return MT_OK;
    }
    p->done = true;
    mt_status_t st = MT_OK;
    if (p->memory) {
        mt_memprof_stop();
        st = mt_memprof_write(p->mem_path, j->rank);
    }
    if (p->trace) {
        mt_trace_stop();
        uint64_t call = mt_job_sync_begin(&j->sync, "trace_write", 0); /* watched (job_sync.c) */
        mt_status_t tst = mt_trace_write(j->comm, p->trace);
        mt_job_sync_end(&j->sync, call);
        mt_trace_reset();
        st = st == MT_OK ? tst : st;
    }
    if (st == MT_OK && j->out) {
        if (p->trace) {
            fprintf(j->out,
                    "trace of steps %lld-%lld written to %s (open in https://ui.perfetto.dev or "
                    "chrome://tracing)\n",
                    (long long)p->first + 1, (long long)p->last + 1, p->trace);
        }
        if (p->memory) {
            char pattern[1100];
            const char *dot = strrchr(p->memory, '.'), *slash = strrchr(p->memory, '/');
            size_t stem = dot && (!slash || dot > slash) ? (size_t)(dot - p->memory) : strlen(p->memory);
            snprintf(pattern, sizeof(pattern), "%.*s.rank*%s (one per rank)", (int)stem, p->memory, p->memory + stem);
            fprintf(j->out, "memory history of steps %lld-%lld written to %s\n", (long long)p->first + 1,
                    (long long)p->last + 1, j->world > 1 ? pattern : p->memory);
        }
    }
    return st;
}

void mt_job_profile_free(job_profile_t *p, job_t *j) {
    if (!p) {
        return;
    }
    if (p->hooked && j->model) {
        mt_model_set_hooks(j->model, &p->inner);
    }
    if (!p->done) {
        if (p->trace) {
            mt_trace_stop();
            mt_trace_reset();
        }
        if (p->memory) {
            mt_memprof_stop();
        }
    }
    free(p->t_fwd);
    free(p->t_bwd);
    free(p);
}
