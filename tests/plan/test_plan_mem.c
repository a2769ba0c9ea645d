/* The planner's memory against the allocator: for layouts of a small GPT-2 (micro-batch sizes, activation and
 * attention recomputation, an MLP, AdamW and SGD with momentum, bf16/fp16 compute) run real training steps and
 * compare the allocator's peak bytes per category with mt_plan_stage_mem's prediction for that layout. The
 * categories the planner sizes must agree to the byte; the total within 10% (the data loader's buffers, "other", are
 * not planned).
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <string.h>

#include "train/job.h"
#include "plan/plan.h"
#include "runtime/alloc.h"
#include "runtime/rt.h"
#include "testutil.h"

typedef struct {
    const char *name;
    int micro_batch;
    mt_plan_rc_t rc;
    const char *extra[3];
} case_t;

static const char *base[] = {"--model.n_layer=2",    "--model.n_head=4",      "--model.n_embd=64",
                             "--model.seq_len=32",   "--model.vocab_size=96", "--train.global_batch=8",
                             "--train.steps=2",      "--train.eval_every=0",  "--parallel.tp=1",
                             "--train.grad_accum=0", "--optimizer.lr=1e-3"};

static void run_case(const case_t *c) {
    char *ov[32];
    int n = 0;
    char mb[64], rc[64], arc[64];
    for (size_t k = 0; k < MT_ARRAY_LEN(base); k++) {
        ov[n++] = (char *)base[k];
    }
    snprintf(mb, sizeof(mb), "--train.micro_batch=%d", c->micro_batch);
    bool block = c->rc == MT_PLAN_RC_BLOCK || c->rc == MT_PLAN_RC_BLOCK_ATTN;
    bool attn = c->rc == MT_PLAN_RC_ATTN || c->rc == MT_PLAN_RC_BLOCK_ATTN;
    snprintf(rc, sizeof(rc), "--model.recompute=%s", block ? "block" : "none");
    snprintf(arc, sizeof(arc), "--model.attn_recompute=%s", attn ? "true" : "false");
    ov[n++] = mb;
    ov[n++] = rc;
    ov[n++] = arc;
    for (int k = 0; k < 3 && c->extra[k]; k++) {
        ov[n++] = (char *)c->extra[k];
    }
    mt_config_t *cfg = NULL;
    CHECK_OK(mt_config_load(NULL, n, ov, 1, &cfg, stderr));
    if (!cfg) {
        return;
    }
    mt_plan_job_t job;
    CHECK_OK(mt_plan_job_from_config(cfg, &job));
    mt_plan_layout_t l = {.tp = 1,
                          .pp = 1,
                          .dp = 1,
                          .engine = MT_PLAN_DDP,
                          .schedule = MT_PLAN_1F1B,
                          .micro_batch = c->micro_batch,
                          .microbatches = (int)(job.global_batch / c->micro_batch),
                          .sp = false,
                          .recompute = c->rc};
    snprintf(l.order, sizeof(l.order), "tp-dp-pp");
    int64_t plan[MT_MEM_NCAT];
    CHECK_OK(mt_plan_stage_mem(&job, &l, 0, plan));

    mt_mem_stats_t before, after;
    mt_mem_stats(MT_MEM_HOST, &before);
    mt_mem_reset_peak(MT_MEM_HOST);
    mt_job_opts_t opts = MT_JOB_OPTS_INIT;
    opts.prefetch = false;
    CHECK_OK(mt_job_run(cfg, &opts, NULL));
    mt_mem_stats(MT_MEM_HOST, &after);
    int64_t plan_total = 0;
    for (int k = 0; k < MT_MEM_NCAT - 1; k++) {
        int64_t measured = after.peak[k] - before.current[k];
        CHECK(plan[k] == measured, "%s: %s planned %lld bytes, the allocator held at most %lld", c->name,
              mt_mem_cat_name((mt_mem_cat_t)k), (long long)plan[k], (long long)measured);
        plan_total += plan[k];
    }
    int64_t peak = after.total_peak - before.total_current;
    CHECK(plan_total <= peak && (double)(peak - plan_total) <= 0.10 * (double)peak,
          "%s: planned total %lld, measured peak %lld (other at peak %lld)", c->name, (long long)plan_total,
          (long long)peak, (long long)after.at_peak[MT_MEM_OTHER]);
    printf("%-28s planned %9lld B (params %lld grads %lld optimizer %lld activations %lld)  measured peak %9lld B  "
           "(%+.2f%%)\n",
           c->name, (long long)plan_total, (long long)plan[0], (long long)plan[1], (long long)plan[2],
           (long long)plan[3], (long long)peak, 100.0 * (double)(plan_total - peak) / (double)peak);
    mt_config_free(cfg);
}

int main(int argc, char **argv) {
    if (mt_rt_init(&argc, &argv) != MT_OK) {
        return 1;
    }
    static const case_t cases[] = {
        {"gpt2 b1", 1, MT_PLAN_RC_NONE, {NULL}},
        {"gpt2 b2", 2, MT_PLAN_RC_NONE, {NULL}},
        {"gpt2 b4", 4, MT_PLAN_RC_NONE, {NULL}},
        {"gpt2 b8", 8, MT_PLAN_RC_NONE, {NULL}},
        {"gpt2 b1 attn-recompute", 1, MT_PLAN_RC_ATTN, {NULL}},
        {"gpt2 b4 attn-recompute", 4, MT_PLAN_RC_ATTN, {NULL}},
        {"gpt2 b2 block-recompute", 2, MT_PLAN_RC_BLOCK, {NULL}},
        {"gpt2 b8 block-recompute", 8, MT_PLAN_RC_BLOCK, {NULL}},
        {"gpt2 b4 block+attn", 4, MT_PLAN_RC_BLOCK_ATTN, {NULL}},
        {"gpt2 b2 sgd momentum", 2, MT_PLAN_RC_NONE, {"--optimizer.kind=sgd", "--optimizer.momentum=0.9"}},
        {"gpt2 b2 plain sgd", 2, MT_PLAN_RC_NONE, {"--optimizer.kind=sgd"}},
        {"gpt2 b4 padded vocab 256", 4, MT_PLAN_RC_NONE, {"--model.padded_vocab=256"}},
        {"mlp b2", 2, MT_PLAN_RC_NONE, {"--model.kind=mlp"}},
        {"mlp b4 block-recompute", 4, MT_PLAN_RC_BLOCK, {"--model.kind=mlp"}},
        /* the CPU emulation of bf16/fp16: the wrapper's rounded weights (params) and gradient staging (grads) */
        {"gpt2 b2 bf16", 2, MT_PLAN_RC_NONE, {"--precision.compute=bf16"}},
        {"gpt2 b4 fp16 attn-recompute", 4, MT_PLAN_RC_ATTN, {"--precision.compute=fp16"}},
        /* the tied head (wte + ln_f) reads the most: 1024 x 64 > a block's 50k floats */
        {"gpt2 b2 bf16 vocab 1024", 2, MT_PLAN_RC_NONE, {"--precision.compute=bf16", "--model.padded_vocab=1024"}},
        {"mlp b2 fp16", 2, MT_PLAN_RC_NONE, {"--model.kind=mlp", "--precision.compute=fp16"}},
    };
    for (size_t i = 0; i < MT_ARRAY_LEN(cases); i++) {
        run_case(&cases[i]);
    }
    int rc = mt_test_finish("test_plan_mem");
    mt_rt_finalize();
    return rc;
}
