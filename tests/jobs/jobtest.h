/* Shared helpers of the job tests: a small GPT-2 config with overrides, a run through mt_job_run, and
 * file helpers.
 * SPDX-License-Identifier: MIT */
#ifndef MT_JOBTEST_H
#define MT_JOBTEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/job.h"
#include "testutil.h"

/* A small GPT-2 on synthetic data; extra overrides are appended ("--key=value", NULL-terminated list). */
static inline mt_config_t *jt_config(int world, const char *const *extra) {
    static const char *base[] = {
        "--model.kind=gpt2",       "--model.n_layer=2",
        "--model.n_head=2",        "--model.n_embd=32",
        "--model.seq_len=16",      "--model.vocab_size=32",
        "--data.kind=synthetic",   "--train.global_batch=8",
        "--train.log_every=2",     "--optimizer.kind=adamw",
        "--optimizer.lr=1e-2",     "--optimizer.warmup_steps=2",
        "--optimizer.min_lr=1e-3", "--optimizer.weight_decay=0.1",
        "--parallel.tp=1",
    };
    char *args[64];
    int n = 0;
    for (size_t i = 0; i < MT_ARRAY_LEN(base); i++) {
        args[n++] = (char *)base[i];
    }
    for (int i = 0; extra && extra[i] && n < 64; i++) {
        args[n++] = (char *)extra[i];
    }
    mt_config_t *cfg = NULL;
    mt_status_t st = mt_config_load(NULL, n, args, world, &cfg, stderr);
    CHECK(st == MT_OK, "config: %s", mt_last_error_msg());
    return cfg;
}

/* Runs the job with the overrides; progress to stdout on rank 0. */
static inline mt_status_t jt_run(int world, const char *const *extra, int64_t stop_after, const mt_job_engine_t *engine,
                                 mt_job_result_t *res) {
    mt_config_t *cfg = jt_config(world, extra);
    if (!cfg) {
        memset(res, 0, sizeof(*res));
        return MT_ERR_INVALID_ARG;
    }
    mt_job_opts_t opts = MT_JOB_OPTS_INIT;
    opts.progress = stdout;
    opts.stop_after = stop_after;
    opts.engine = engine;
    mt_status_t st = mt_job_run(cfg, &opts, res);
    mt_config_free(cfg);
    return st;
}

/* Reads a whole file (NUL-terminated, malloc'd) or NULL. */
static inline char *jt_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) {
        b[n] = '\0';
        if (len) {
            *len = (size_t)n;
        }
    }
    return b;
}

#endif
