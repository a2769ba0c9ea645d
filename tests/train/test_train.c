/* The training loop end to end on one process: synthetic data is learnt (loss below a stated bound),
 * the same seed reproduces every loss bit for bit, gradient accumulation over k micro-batches matches one
 * batch, prefetching changes nothing, bad input is refused with MT_ERR_INVALID_ARG and a message, and an
 * engine's queued evaluation (eval_batch/eval_losses, in chunks) gives the loop's own validation loss.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/job.h"
#include "models/data/data.h"
#include "models/llmc.h"
#include "runtime/alloc.h"
#include "runtime/rt.h"
#include "testutil.h"

/* A small GPT-2 on synthetic data (vocab 32: uniform guess ln 32 = 3.466, perfect model ln 4 = 1.386). */
static const char *base[] = {
    "--model.kind=gpt2",      "--model.n_layer=2",         "--model.n_head=2",         "--model.n_embd=32",
    "--model.seq_len=16",     "--model.vocab_size=32",     "--data.kind=synthetic",    "--train.global_batch=8",
    "--train.log_every=10",   "--optimizer.kind=adamw",    "--optimizer.lr=1e-2",      "--optimizer.warmup_steps=5",
    "--optimizer.min_lr=1e-3", "--optimizer.weight_decay=0.1", "--parallel.tp=1",
};

static mt_config_t *config(int n_extra, const char *const *extra) {
    char *args[64];
    int n = 0;
    for (size_t i = 0; i < MT_ARRAY_LEN(base); i++) {
        args[n++] = (char *)base[i];
    }
    for (int i = 0; i < n_extra; i++) {
        args[n++] = (char *)extra[i];
    }
    mt_config_t *cfg = NULL;
    mt_status_t st = mt_config_load(NULL, n, args, 1, &cfg, stderr);
    CHECK(st == MT_OK, "config: %s", mt_last_error_msg());
    return cfg;
}

static mt_status_t run(int n_extra, const char *const *extra, bool prefetch, FILE *progress, mt_job_result_t *res) {
    mt_config_t *cfg = config(n_extra, extra);
    if (!cfg) {
        memset(res, 0, sizeof(*res));
        return MT_ERR_INVALID_ARG;
    }
    mt_job_opts_t opts = MT_JOB_OPTS_INIT;
    opts.prefetch = prefetch;
    opts.progress = progress;
    mt_status_t st = mt_job_run(cfg, &opts, res);
    mt_config_free(cfg);
    return st;
}

static double tail_mean(const mt_job_result_t *r, int k) {
    double s = 0;
    for (int64_t i = r->n_steps - k; i < r->n_steps; i++) {
        s += r->loss[i];
    }
    return s / k;
}

/* Learns: 80 steps take the loss from ~ln 32 = 3.47 to below 2.0 (perfect: 1.386); validation agrees. */
static void test_learns(void) {
    const char *extra[] = {"--train.steps=80", "--train.eval_every=40", "--train.eval_batches=2"};
    mt_job_result_t r;
    mt_mem_stats_t before, after;
    mt_mem_stats(MT_MEM_HOST, &before);
    CHECK_OK(run(3, extra, true, stdout, &r));
    mt_mem_stats(MT_MEM_HOST, &after);
    for (int c = 0; c < MT_MEM_NCAT; c++) {
        CHECK(after.current[c] == before.current[c], "run returns every %s byte: %lld -> %lld", mt_mem_cat_name(c),
              (long long)before.current[c], (long long)after.current[c]);
    }
    CHECK(after.peak[MT_MEM_OPTIMIZER] >= 2 * 4 * r.n_params, "AdamW state (m, v) was accounted: peak %lld bytes",
          (long long)after.peak[MT_MEM_OPTIMIZER]);
    CHECK(r.n_steps == 80, "steps run: %lld", (long long)r.n_steps);
    if (r.n_steps == 80) {
        CHECK(fabs(r.loss[0] - log(32.0)) < 0.3, "initial loss %.4f near ln 32 = %.4f", r.loss[0], log(32.0));
        double last = tail_mean(&r, 5);
        CHECK(last < 2.0, "loss after 80 steps %.4f, bound 2.0 (perfect model %.4f)", last, mt_synth_entropy(32));
        CHECK(last > mt_synth_entropy(32) - 0.05, "loss %.4f cannot beat the entropy rate %.4f", last,
              mt_synth_entropy(32));
        CHECK(r.n_evals == 2 && r.eval_step[0] == 40 && r.eval_step[1] == 80, "evaluations at 40 and 80: %lld",
              (long long)r.n_evals);
        CHECK(r.n_evals == 2 && r.val_loss[1] < 2.0, "validation loss %.4f below 2.0", r.val_loss[1]);
        CHECK(r.lr[0] < r.lr[4] && fabs(r.lr[4] - 1e-2) < 1e-8 && fabs(r.lr[79] - 1e-3) < 1e-8,
              "warm-up then cosine to min_lr: %g %g %g", r.lr[0], r.lr[4], r.lr[79]);
        CHECK(r.grad_norm[0] > 0 && isfinite(r.grad_norm[0]), "gradient norm reported");
    }
    mt_job_result_free(&r);
}

/* The MLP also learns the chain (it sees only the previous token, which is all the chain needs). */
static void test_mlp(void) {
    const char *extra[] = {"--model.kind=mlp", "--model.n_layer=2", "--model.n_embd=64", "--train.steps=60"};
    mt_job_result_t r;
    CHECK_OK(run(4, extra, true, NULL, &r));
    if (r.n_steps == 60) {
        CHECK(tail_mean(&r, 5) < 2.2, "MLP loss after 60 steps %.4f, bound 2.2", tail_mean(&r, 5));
    }
    mt_job_result_free(&r);
}

/* Same seed: identical losses, bit for bit, with and without prefetching; another seed: different. */
static void test_determinism(void) {
    const char *extra[] = {"--train.steps=12"};
    const char *other[] = {"--train.steps=12", "--train.seed=99"};
    mt_job_result_t a, b, c;
    CHECK_OK(run(1, extra, true, NULL, &a));
    CHECK_OK(run(1, extra, false, NULL, &b));
    CHECK_OK(run(2, other, true, NULL, &c));
    CHECK(a.n_steps == 12 && b.n_steps == 12 && c.n_steps == 12, "all ran");
    if (a.n_steps == 12 && b.n_steps == 12 && c.n_steps == 12) {
        CHECK(memcmp(a.loss, b.loss, 12 * sizeof(double)) == 0, "same seed: bit-identical losses");
        CHECK(memcmp(a.grad_norm, b.grad_norm, 12 * sizeof(double)) == 0, "same seed: bit-identical norms");
        CHECK(a.loss[0] != c.loss[0] && a.loss[11] != c.loss[11], "another seed: other losses");
    }
    mt_job_result_free(&a);
    mt_job_result_free(&b);
    mt_job_result_free(&c);
}

/* Global batch 8 as 1 x 8, 2 x 4 and 8 x 1 micro-batches: the same losses. The summation order of the
 * gradient differs, so agreement is to rounding: SGD 1e-5 relative over 10 steps, AdamW (whose 1/sqrt(v)
 * magnifies rounding in tiny gradients) 1e-4. */
static void test_grad_accum(const char *opt, double tol) {
    char kind[64];
    snprintf(kind, sizeof(kind), "--optimizer.kind=%s", opt);
    /* no clipping: it would hide a wrongly scaled accumulated gradient */
    const char *one[] = {"--train.steps=10", kind, "--optimizer.momentum=0.9", "--optimizer.grad_clip=0",
                         "--train.micro_batch=8"};
    const char *two[] = {"--train.steps=10", kind, "--optimizer.momentum=0.9", "--optimizer.grad_clip=0",
                         "--train.micro_batch=4"};
    const char *eight[] = {"--train.steps=10", kind, "--optimizer.momentum=0.9", "--optimizer.grad_clip=0",
                           "--train.micro_batch=1"};
    mt_job_result_t a, b, c;
    CHECK_OK(run(5, one, true, NULL, &a));
    CHECK_OK(run(5, two, true, NULL, &b));
    CHECK_OK(run(5, eight, true, NULL, &c));
    double worst = 0;
    if (a.n_steps == 10 && b.n_steps == 10 && c.n_steps == 10) {
        for (int i = 0; i < 10; i++) {
            worst = fmax(worst, fabs(b.loss[i] - a.loss[i]) / a.loss[i]);
            worst = fmax(worst, fabs(c.loss[i] - a.loss[i]) / a.loss[i]);
            /* the accumulated gradient itself, through its norm */
            worst = fmax(worst, fabs(b.grad_norm[i] - a.grad_norm[i]) / a.grad_norm[i]);
            worst = fmax(worst, fabs(c.grad_norm[i] - a.grad_norm[i]) / a.grad_norm[i]);
        }
        CHECK(worst <= tol, "%s: grad accumulation vs one batch: max relative loss/norm difference %.3g > %.1g", opt,
              worst, tol);
        CHECK(a.loss[9] < a.loss[0], "%s: it trains", opt);
    } else {
        CHECK(0, "%s: runs incomplete", opt);
    }
    printf("grad accumulation (%s): max relative loss/gradient-norm difference over 10 steps %.3g (tolerance %.1g)\n",
           opt, worst, tol);
    mt_job_result_free(&a);
    mt_job_result_free(&b);
    mt_job_result_free(&c);
}

static void expect_invalid(int n, const char *const *extra, const char *needle) {
    mt_job_result_t r;
    mt_status_t st = run(n, extra, true, NULL, &r);
    CHECK(st == MT_ERR_INVALID_ARG, "%s: expected MT_ERR_INVALID_ARG, got %s", extra[n - 1], mt_status_str(st));
    CHECK(strstr(mt_last_error_msg(), needle) != NULL, "message lacks \"%s\": %s", needle, mt_last_error_msg());
    mt_job_result_free(&r);
}

static void test_bad_input(void) {
    char dir[] = "/tmp/mt_test_train_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    char good[128], bad[128], glob_bad[160], glob_good[160], glob_none[160];
    snprintf(good, sizeof(good), "%s/good_000.bin", dir);
    snprintf(bad, sizeof(bad), "%s/bad_000.bin", dir);
    uint16_t tok[400];
    for (int i = 0; i < 400; i++) {
        tok[i] = (uint16_t)(i % 40); /* 40 > vocab_size 32 */
    }
    CHECK_OK(mt_shard_write(bad, tok, 400));
    for (int i = 0; i < 400; i++) {
        tok[i] = (uint16_t)(i % 32);
    }
    CHECK_OK(mt_shard_write(good, tok, 400));
    snprintf(glob_bad, sizeof(glob_bad), "--data.train=%s/bad_*.bin", dir);
    snprintf(glob_good, sizeof(glob_good), "--data.train=%s/good_*.bin", dir);
    snprintf(glob_none, sizeof(glob_none), "--data.train=%s/none_*.bin", dir);
    const char *a[] = {"--data.kind=shards", glob_bad};
    expect_invalid(2, a, "token 32 at index 32 is >= vocab_size 32");
    const char *b[] = {"--data.kind=shards", glob_none};
    expect_invalid(2, b, "no file matches");
    const char *c[] = {"--data.kind=shards", "--data.train="};
    expect_invalid(2, c, "data.train is empty");
    const char *d[] = {"--model.init=llmc:/nonexistent/gpt2.bin"};
    expect_invalid(1, d, "/nonexistent/gpt2.bin");
    const char *d2[] = {"--model.init=checkpoint.bin"};
    expect_invalid(1, d2, "expected \"random\" or \"llmc:PATH\"");
    const char *e[] = {"--precision.compute=fp16", "--precision.init_scale=1e30"}; /* above the scaler's 2^24 */
    expect_invalid(2, e, "precision.init_scale = 1e+30 is outside");
    /* shards that are fine train (sequential order, validation on the same file) */
    char val[160];
    snprintf(val, sizeof(val), "--data.val=%s", good);
    const char *f[] = {"--data.kind=shards", glob_good, val, "--data.order=sequential", "--train.steps=4",
                       "--train.eval_every=2", "--train.eval_batches=1"};
    mt_job_result_t r;
    CHECK_OK(run(7, f, true, NULL, &r));
    CHECK(r.n_steps == 4 && r.n_evals == 2, "trained on shards: %lld steps, %lld evals", (long long)r.n_steps,
          (long long)r.n_evals);
    mt_job_result_free(&r);
    unlink(good);
    unlink(bad);
    rmdir(dir);
}

/* An engine wrapping the local one, as the parallel engines will: it counts the loop's calls and the
 * model's hooks, and poisons the gradient norm at chosen steps to drive train.on_nan. */
static struct {
    void *inner;
    int poison_from, poison_to; /* 1-based steps whose gradient norm is NaN */
    int steps, zero, finish, pre_fwd, post_bwd, n_modules;
} spy;

static mt_status_t spy_pre_forward(void *arg, int module) {
    spy.pre_fwd++;
    return MT_OK;
}

static mt_status_t spy_post_backward(void *arg, int module) {
    spy.post_bwd++;
    return MT_OK;
}

static mt_status_t spy_init(const mt_job_info_t *info, void **ctx) {
    MT_CHECK(mt_job_engine_local()->init(info, &spy.inner));
    mt_model_hooks_t h = {.pre_forward = spy_pre_forward, .post_backward = spy_post_backward};
    mt_model_set_hooks(info->model, &h);
    spy.n_modules = mt_model_n_modules(info->model);
    *ctx = spy.inner;
    return MT_OK;
}

static mt_status_t spy_zero(void *ctx) {
    spy.zero++;
    return mt_job_engine_local()->zero_grads(ctx);
}

static mt_status_t spy_finish(void *ctx) {
    spy.finish++;
    return mt_job_engine_local()->finish_grads(ctx);
}

static mt_status_t spy_sumsq(void *ctx, double *total) {
    MT_CHECK(mt_job_engine_local()->grad_sumsq(ctx, total));
    int step = spy.finish;
    if (step >= spy.poison_from && step <= spy.poison_to) {
        *total = NAN;
    }
    return MT_OK;
}

static mt_status_t spy_step(void *ctx, float lr, float scale) {
    spy.steps++;
    return mt_job_engine_local()->step(ctx, lr, scale);
}

static mt_status_t spy_loss(void *ctx, double *loss) {
    return mt_job_engine_local()->reduce_loss(ctx, loss);
}

static void spy_free(void *ctx) {
    mt_job_engine_local()->free(ctx);
}

static const mt_job_engine_t spy_engine = {.name = "spy", .init = spy_init, .zero_grads = spy_zero,
                                           .finish_grads = spy_finish, .grad_sumsq = spy_sumsq, .step = spy_step,
                                           .reduce_loss = spy_loss, .free = spy_free};

static mt_status_t run_spy(const char *on_nan, int from, int to, mt_job_result_t *r) {
    char key[64];
    snprintf(key, sizeof(key), "--train.on_nan=%s", on_nan);
    const char *extra[] = {"--train.steps=6", "--train.micro_batch=4", key};
    mt_config_t *cfg = config(3, extra);
    memset(&spy, 0, sizeof(spy));
    spy.poison_from = from;
    spy.poison_to = to;
    mt_job_opts_t opts = MT_JOB_OPTS_INIT;
    opts.engine = &spy_engine;
    mt_status_t st = cfg ? mt_job_run(cfg, &opts, r) : MT_ERR_INVALID_ARG;
    mt_config_free(cfg);
    return st;
}

static void test_engine_and_on_nan(void) {
    mt_job_result_t r;
    CHECK_OK(run_spy("stop", 0, -1, &r));
    CHECK(spy.zero == 6 && spy.finish == 6 && spy.steps == 6, "engine calls per step: zero %d finish %d step %d",
          spy.zero, spy.finish, spy.steps);
    CHECK(spy.pre_fwd == 6 * 2 * spy.n_modules && spy.post_bwd == 6 * 2 * spy.n_modules,
          "hooks around every module of 2 micro-batches x 6 steps: %d pre-forward, %d post-backward, %d modules",
          spy.pre_fwd, spy.post_bwd, spy.n_modules);
    mt_job_result_t plain;
    const char *extra[] = {"--train.steps=6", "--train.micro_batch=4"};
    CHECK_OK(run(2, extra, true, NULL, &plain));
    CHECK(r.n_steps == 6 && plain.n_steps == 6 && memcmp(r.loss, plain.loss, 6 * sizeof(double)) == 0,
          "a wrapping engine computes exactly what the local one does");
    mt_job_result_free(&plain);
    mt_job_result_free(&r);

    mt_status_t st = run_spy("stop", 3, 3, &r);
    CHECK(st == MT_ERR_INTERNAL, "non-finite norm stops the run: %s", mt_status_str(st));
    CHECK(strstr(mt_last_error_msg(), "step 3") && strstr(mt_last_error_msg(), "not finite"), "message: %s",
          mt_last_error_msg());
    CHECK(r.n_steps == 3 && spy.steps == 2, "stopped at step 3 before its update: %lld steps, %d updates",
          (long long)r.n_steps, spy.steps);
    mt_job_result_free(&r);

    CHECK_OK(run_spy("skip", 2, 3, &r));
    CHECK(r.n_steps == 6 && r.n_skipped == 2 && spy.steps == 4, "skip: %lld steps, %lld skipped, %d updates",
          (long long)r.n_steps, (long long)r.n_skipped, spy.steps);
    mt_job_result_free(&r);
}

/* The loop's evaluation through an engine's eval_batch/eval_losses: two evaluations of 300 validation batches
 * (after steps 2 and 3), each queued in two chunks (slots 0..255, read at once, then 0..43), give exactly the
 * validation losses of the loop's own batch-by-batch forward and the same training losses. The engine computes
 * each batch's loss at queueing time with its own activations, as the loop does (the mean of its micro-batch
 * losses), and checks the protocol: slots filled in order from 0 after each read, a read of exactly the slots
 * queued, each read loss reduced (reduce_loss) before the next batch is queued. Its own mean of the losses it
 * handed out must be each evaluation's figure. */
#define EVSPY_BATCHES 300
static struct {
    mt_model_t model;
    mt_acts_t acts;
    int64_t mb, T, ga;
    double slot[MT_JOB_EVAL_CHUNK];
    double seen[2 * EVSPY_BATCHES]; /* every loss handed out, in order */
    int queued, since_read, reads, read_n[4], pending, reduced, bad;
} evspy;

static mt_status_t evspy_init(const mt_job_info_t *info, void **ctx) {
    evspy.model = info->model;
    evspy.mb = info->micro_batch;
    evspy.T = info->seq_len;
    evspy.ga = info->grad_accum;
    MT_CHECK(mt_job_engine_local()->init(info, ctx));
    mt_status_t st = mt_acts_init(info->model, (int)evspy.mb, (int)evspy.T, &evspy.acts);
    if (st != MT_OK) {
        mt_job_engine_local()->free(*ctx);
        *ctx = NULL;
    }
    return st;
}

static mt_status_t evspy_batch(void *ctx, const mt_batch_t *b, int64_t i) {
    if (i != evspy.since_read || i >= MT_JOB_EVAL_CHUNK || evspy.pending != 0) {
        evspy.bad++;
        return mt_error(MT_ERR_INTERNAL, "evaluation slot %lld queued after %d batches, %d losses unreduced",
                        (long long)i, evspy.since_read, evspy.pending);
    }
    int n = mt_model_n_modules(evspy.model);
    double sum = 0.0;
    for (int64_t k = 0; k < evspy.ga; k++) {
        float l = 0.0f;
        const int64_t off = k * evspy.mb * evspy.T;
        MT_CHECK(mt_model_forward(evspy.model, evspy.acts, 0, n, b->inputs + off, b->targets + off, NULL, NULL, &l));
        sum += (double)l;
    }
    evspy.slot[i] = sum / (double)evspy.ga;
    evspy.queued++;
    evspy.since_read++;
    return MT_OK;
}

static mt_status_t evspy_losses(void *ctx, int64_t n, double *losses) {
    if (n < 1 || n != evspy.since_read || evspy.queued > 2 * EVSPY_BATCHES) {
        evspy.bad++;
        return mt_error(MT_ERR_INTERNAL, "a read of %lld losses after %d queued", (long long)n, evspy.since_read);
    }
    if (evspy.reads < (int)MT_ARRAY_LEN(evspy.read_n)) {
        evspy.read_n[evspy.reads] = (int)n;
    }
    evspy.reads++;
    memcpy(losses, evspy.slot, (size_t)n * sizeof(double));
    memcpy(evspy.seen + evspy.queued - n, evspy.slot, (size_t)n * sizeof(double));
    evspy.since_read = 0;
    evspy.pending = (int)n;
    return MT_OK;
}

static mt_status_t evspy_reduce(void *ctx, double *loss) {
    evspy.pending -= evspy.pending > 0;
    evspy.reduced++;
    return mt_job_engine_local()->reduce_loss(ctx, loss);
}

static void evspy_free(void *ctx) {
    mt_acts_free(evspy.acts);
    evspy.acts = NULL;
    mt_job_engine_local()->free(ctx);
}

static mt_status_t local_zero(void *ctx) {
    return mt_job_engine_local()->zero_grads(ctx);
}
static mt_status_t local_finish(void *ctx) {
    return mt_job_engine_local()->finish_grads(ctx);
}
static mt_status_t local_sumsq(void *ctx, double *total) {
    return mt_job_engine_local()->grad_sumsq(ctx, total);
}
static mt_status_t local_step(void *ctx, float lr, float scale) {
    return mt_job_engine_local()->step(ctx, lr, scale);
}

static const mt_job_engine_t evspy_engine = {.name = "evspy", .init = evspy_init, .zero_grads = local_zero,
                                             .finish_grads = local_finish, .grad_sumsq = local_sumsq,
                                             .step = local_step, .reduce_loss = evspy_reduce, .free = evspy_free,
                                             .eval_batch = evspy_batch, .eval_losses = evspy_losses};

static void test_eval_hooks(void) {
    const char *extra[] = {"--train.steps=3", "--train.micro_batch=2", "--train.eval_every=2",
                           "--train.eval_batches=300"};
    mt_job_result_t plain = {0}, q = {0};
    CHECK_OK(run(4, extra, true, NULL, &plain));
    mt_config_t *cfg = config(4, extra);
    memset(&evspy, 0, sizeof(evspy));
    mt_job_opts_t opts = MT_JOB_OPTS_INIT;
    opts.engine = &evspy_engine;
    CHECK_OK(cfg ? mt_job_run(cfg, &opts, &q) : MT_ERR_INVALID_ARG);
    mt_config_free(cfg);
    CHECK(evspy.bad == 0 && evspy.queued == 2 * EVSPY_BATCHES && evspy.reads == 4 &&
              evspy.read_n[0] == MT_JOB_EVAL_CHUNK && evspy.read_n[1] == 44 && evspy.read_n[2] == MT_JOB_EVAL_CHUNK &&
              evspy.read_n[3] == 44 && evspy.pending == 0 && evspy.reduced == 3 + 2 * EVSPY_BATCHES,
          "2 evaluations of 300 batches: %d queued, %d reads (%d, %d, %d, %d), %d reductions (want 603: one per "
          "step and per batch), %d unreduced, %d protocol errors",
          evspy.queued, evspy.reads, evspy.read_n[0], evspy.read_n[1], evspy.read_n[2], evspy.read_n[3],
          evspy.reduced, evspy.pending, evspy.bad);
    CHECK(plain.n_evals == 2 && q.n_evals == 2 && memcmp(plain.val_loss, q.val_loss, 2 * sizeof(double)) == 0 &&
              memcmp(plain.loss, q.loss, 3 * sizeof(double)) == 0,
          "queued evaluation: validation losses %.17g %.17g, the loop's own %.17g %.17g (%lld, %lld evaluations)",
          q.n_evals > 0 ? q.val_loss[0] : NAN, q.n_evals > 1 ? q.val_loss[1] : NAN,
          plain.n_evals > 0 ? plain.val_loss[0] : NAN, plain.n_evals > 1 ? plain.val_loss[1] : NAN,
          (long long)q.n_evals, (long long)plain.n_evals);
    for (int e = 0; e < 2 && e < q.n_evals; e++) {
        double sum = 0.0; /* the loop's figure: the mean of the losses in the order handed out */
        for (int i = 0; i < EVSPY_BATCHES; i++) {
            sum += evspy.seen[e * EVSPY_BATCHES + i];
        }
        CHECK(sum / EVSPY_BATCHES == q.val_loss[e], "evaluation %d: %.17g, the mean of the engine's losses %.17g",
              e + 1, q.val_loss[e], sum / EVSPY_BATCHES);
    }
    mt_job_result_free(&q);
    mt_job_result_free(&plain);
}

/* model.init = "llmc:PATH": a checkpoint of the seed-7 initial weights trains exactly as seed 7's random
 * initialisation does (same data: same train.seed), and one of seed 8's does not; a config value that
 * contradicts the checkpoint is refused naming both. */
static void save_init_checkpoint(uint64_t seed, const char *path) {
    mt_config_t *cfg = config(0, NULL);
    if (!cfg) {
        return;
    }
    mt_model_config_t mc;
    mt_job_model_config(cfg, &mc);
    mc.seed = seed;
    mt_model_t m = NULL;
    CHECK_OK(mt_model_init(&mc, &m));
    CHECK_OK(mt_model_alloc_params(m));
    mt_model_init_weights(m);
    CHECK_OK(mt_llmc_save(m, path));
    mt_model_free(m);
    mt_config_free(cfg);
}

static void test_llmc_init(void) {
    char p7[64], p8[64], i7[96], i8[96];
    snprintf(p7, sizeof(p7), "/tmp/mt_test_train_%d_7.bin", (int)getpid());
    snprintf(p8, sizeof(p8), "/tmp/mt_test_train_%d_8.bin", (int)getpid());
    snprintf(i7, sizeof(i7), "--model.init=llmc:%s", p7);
    snprintf(i8, sizeof(i8), "--model.init=llmc:%s", p8);
    save_init_checkpoint(7, p7);
    save_init_checkpoint(8, p8);
    const char *rnd[] = {"--train.steps=3", "--train.seed=7"};
    const char *from7[] = {"--train.steps=3", "--train.seed=7", i7};
    const char *from8[] = {"--train.steps=3", "--train.seed=7", i8};
    mt_job_result_t a, b, c;
    CHECK_OK(run(2, rnd, true, NULL, &a));
    CHECK_OK(run(3, from7, true, NULL, &b));
    CHECK_OK(run(3, from8, true, NULL, &c));
    if (a.n_steps == 3 && b.n_steps == 3 && c.n_steps == 3) {
        CHECK(memcmp(a.loss, b.loss, 3 * sizeof(double)) == 0, "checkpoint of seed 7 = seed 7: %.9g vs %.9g",
              a.loss[0], b.loss[0]);
        CHECK(a.loss[0] != c.loss[0], "checkpoint of seed 8 differs");
    }
    mt_job_result_free(&a);
    mt_job_result_free(&b);
    mt_job_result_free(&c);
    const char *contra[] = {"--model.n_layer=3", i7};
    expect_invalid(2, contra, "model.n_layer = 3");
    unlink(p7);
    unlink(p8);
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    test_learns();
    test_mlp();
    test_determinism();
    test_grad_accum("sgd", 1e-5);
    test_grad_accum("adamw", 1e-4);
    test_bad_input();
    test_llmc_init();
    test_engine_and_on_nan();
    test_eval_hooks();
    return mt_test_finish_mpi("test_train");
}
