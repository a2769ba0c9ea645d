/* Checkpoints through mt_job_run on one process: a job stopped after step 5 with checkpoints every 2
 * steps resumes (checkpoint.resume = auto) from step 4 and continues bit for bit like the uninterrupted
 * run (AdamW and SGD with momentum); keep prunes old ones only after the new one is complete; corrupt,
 * truncated, malformed and mismatched checkpoints are refused with a clear message; the weights read
 * back for export equal an llm.c round trip.
 * SPDX-License-Identifier: MIT */
#include <fcntl.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jobtest.h"
#include "models/llmc.h"
#include "runtime/rt.h"

static char root[64];

static bool exists(const char *fmt, const char *a) {
    char p[512];
    snprintf(p, sizeof(p), fmt, root, a);
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void resume_case(const char *opt_kind, const char *momentum) {
    char dirarg[200], ck[160];
    snprintf(ck, sizeof(ck), "%s/%s", root, opt_kind);
    snprintf(dirarg, sizeof(dirarg), "--checkpoint.dir=%s", ck);
    char kind[64];
    snprintf(kind, sizeof(kind), "--optimizer.kind=%s", opt_kind);
    const char *plain[] = {"--train.steps=8", "--train.eval_every=4", "--train.eval_batches=1", kind, momentum, NULL};
    char metrics[220];
    snprintf(metrics, sizeof(metrics), "--metrics.jsonl=%s/%s.jsonl", root, opt_kind);
    const char *with_ck[] = {"--train.steps=8",
                             "--train.eval_every=4",
                             "--train.eval_batches=1",
                             kind,
                             momentum,
                             dirarg,
                             "--checkpoint.every=2",
                             "--checkpoint.keep=2",
                             metrics,
                             NULL};
    mt_job_result_t a, b, c;
    CHECK_OK(jt_run(1, plain, 0, NULL, &a));
    CHECK_OK(jt_run(1, with_ck, 5, NULL, &b)); /* interrupted after step 5: checkpoints at 2 and 4 */
    CHECK(b.n_steps == 5, "stopped after 5 steps: %lld", (long long)b.n_steps);
    for (int s = 0; s < 5 && s < b.n_steps; s++) {
        CHECK(b.loss[s] == a.loss[s], "%s: checkpointing does not change step %d: %.17g vs %.17g", opt_kind, s + 1,
              b.loss[s], a.loss[s]);
    }
    char latest[256];
    snprintf(latest, sizeof(latest), "%s/latest", ck);
    char *lt = jt_slurp(latest, NULL);
    CHECK(lt && !strcmp(lt, "step-00000004\n"), "latest names step 4: %s", lt ? lt : "(none)");
    free(lt);
    CHECK(exists("%s/%s/step-00000002/manifest.json", opt_kind) &&
              exists("%s/%s/step-00000004/rank-00000.bin", opt_kind),
          "steps 2 and 4 kept");
    CHECK_OK(jt_run(1, with_ck, 0, NULL, &c)); /* resume = auto */
    CHECK(c.first_step == 4 && c.n_steps == 8, "resumed after step 4 and ran to 8: first %lld, n %lld",
          (long long)c.first_step, (long long)c.n_steps);
    for (int s = 4; s < 8 && s < c.n_steps; s++) {
        CHECK(c.loss[s] == a.loss[s], "%s resume: step %d loss %.17g, uninterrupted %.17g", opt_kind, s + 1, c.loss[s],
              a.loss[s]);
        CHECK(c.grad_norm[s] == a.grad_norm[s], "%s resume: step %d norm equal", opt_kind, s + 1);
    }
    CHECK(isnan(c.loss[0]), "steps before the checkpoint were not run");
    /* the metrics file continues: steps 1-4 of the stopped run, 5-8 of the resumed one, each once */
    char *text = jt_slurp(metrics + strlen("--metrics.jsonl="), NULL);
    int lines = 0;
    for (char *line = text; text && *line; lines++) {
        long long step = 0;
        double loss = 0;
        CHECK(sscanf(line, "{\"step\": %lld, \"loss\": %lf", &step, &loss) == 2 && step == lines + 1 &&
                  loss == a.loss[lines],
              "metrics line %d is step %lld with the uninterrupted run's loss", lines + 1, step);
        char *nl = strchr(line, '\n');
        line = nl ? nl + 1 : line + strlen(line);
    }
    CHECK(lines == 8, "the resumed metrics file has 8 lines: %d", lines);
    free(text);
    CHECK(c.n_evals == 1 && a.n_evals == 2 && c.val_loss[0] == a.val_loss[1], "validation after step 8 equal");
    CHECK(!exists("%s/%s/step-00000002", opt_kind) && !exists("%s/%s/step-00000004", opt_kind) &&
              exists("%s/%s/step-00000006/manifest.json", opt_kind) &&
              exists("%s/%s/step-00000008/manifest.json", opt_kind),
          "keep = 2: steps 6 and 8 remain, 2 and 4 pruned");
    /* a fresh run over the same directory replaces steps 6 and 8 in place (swapped atomically) */
    const char *again[] = {"--train.steps=8", kind, momentum, dirarg, "--checkpoint.every=2", "--checkpoint.keep=2",
                           "--checkpoint.resume=none", NULL};
    mt_job_result_t d;
    CHECK_OK(jt_run(1, again, 0, NULL, &d));
    CHECK(d.first_step == 0 && d.n_steps == 8, "resume = none starts afresh");
    CHECK(exists("%s/%s/step-00000008/manifest.json", opt_kind) &&
              exists("%s/%s/step-00000006/manifest.json", opt_kind) && !exists("%s/%s/.tmp-step-00000008", opt_kind) &&
              !exists("%s/%s/.old-step-00000008", opt_kind),
          "replaced checkpoints complete, nothing left behind");
    mt_job_result_free(&d);
    mt_job_result_free(&a);
    mt_job_result_free(&b);
    mt_job_result_free(&c);
}

static void flip_byte(const char *path, off_t off) {
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0, "open %s", path);
    unsigned char b = 0;
    CHECK(pread(fd, &b, 1, off) == 1, "read");
    b ^= 0x5a;
    CHECK(pwrite(fd, &b, 1, off) == 1, "write");
    close(fd);
}

/* A resume that must fail with MT_ERR_INVALID_ARG and a message containing want. */
static void expect_refused(const char *resume, const char *want, const char *extra1) {
    char arg[300];
    snprintf(arg, sizeof(arg), "--checkpoint.resume=%s", resume);
    const char *extra[] = {"--train.steps=10", "--optimizer.kind=adamw", arg, extra1, NULL};
    mt_job_result_t r;
    mt_status_t st = jt_run(1, extra, 0, NULL, &r);
    CHECK(st == MT_ERR_INVALID_ARG && strstr(mt_last_error_msg(), want), "refused with \"%s\": %s: %s", want,
          mt_status_str(st), mt_last_error_msg());
    mt_job_result_free(&r);
}

static void test_bad_checkpoints(void) {
    char step8[256], step6[256], path[300];
    snprintf(step8, sizeof(step8), "%s/adamw/step-00000008", root);
    snprintf(step6, sizeof(step6), "%s/adamw/step-00000006", root);
    /* a flipped byte in the middle of the shard file */
    snprintf(path, sizeof(path), "%s/rank-00000.bin", step8);
    flip_byte(path, 4096 + 3);
    expect_refused(step8, "CRC32C mismatch in", NULL);
    mt_model_t m = NULL;
    CHECK(mt_job_ckpt_read_model(step8, &m, NULL, NULL, 0) == MT_ERR_INVALID_ARG &&
              strstr(mt_last_error_msg(), "CRC32C"),
          "export refuses the corrupt checkpoint: %s", mt_last_error_msg());
    flip_byte(path, 4096 + 3); /* repaired */
    /* a truncated shard file */
    snprintf(path, sizeof(path), "%s/rank-00000.bin", step6);
    CHECK(truncate(path, 1000) == 0, "truncate");
    expect_refused(step6, "is truncated", NULL);
    /* a manifest that is not JSON, and one with absurd sizes */
    snprintf(path, sizeof(path), "%s/manifest.json", step6);
    FILE *f = fopen(path, "w");
    fputs("{\"format\": \"meshtrain-checkpoint\", \"version\": 1, \"step\": ", f);
    fclose(f);
    expect_refused(step6, "JSON syntax error at byte", NULL);
    f = fopen(path, "w");
    fputs("{\"format\": \"meshtrain-checkpoint\", \"version\": 1, \"step\": 6, \"optimizer_step\": 6, \"tensors\": "
          "[{\"name\": \"param/wte\", \"dtype\": \"f32\", \"shape\": [1e15, 32], \"shards\": []}]}",
          f);
    fclose(f);
    expect_refused(step6, "has another shape than", NULL);
    f = fopen(path, "w");
    fputs("{\"format\": \"meshtrain-checkpoint\", \"version\": 7, \"step\": 6}", f);
    fclose(f);
    expect_refused(step6, "has format version 7", NULL);
    /* the model does not match */
    expect_refused(step8, "has another shape than [128, 64]", "--model.n_embd=64");
    /* SGD state asked of an AdamW checkpoint */
    char arg[300];
    snprintf(arg, sizeof(arg), "--checkpoint.resume=%s", step8);
    const char *sgd[] = {"--train.steps=10", "--optimizer.kind=sgd", "--optimizer.momentum=0.9", arg, NULL};
    mt_job_result_t r;
    mt_status_t st = jt_run(1, sgd, 0, NULL, &r);
    CHECK(st == MT_ERR_INVALID_ARG && strstr(mt_last_error_msg(), "has no tensor sgd.momentum/"),
          "optimizer mismatch named: %s", mt_last_error_msg());
    mt_job_result_free(&r);
    expect_refused("/nonexistent/ck", "neither a checkpoint", NULL);
    /* the repaired step 8 still resumes */
    const char *ok[] = {"--train.steps=10", arg, NULL};
    CHECK_OK(jt_run(1, ok, 0, NULL, &r));
    CHECK(r.first_step == 8 && r.n_steps == 10, "repaired checkpoint resumes: first %lld", (long long)r.first_step);
    mt_job_result_free(&r);
}

/* The weights read for export equal themselves after an llm.c round trip, and the model reads the same
 * loss both ways. */
static void test_read_model(void) {
    char dir[256], out[300];
    snprintf(dir, sizeof(dir), "%s/adamw", root); /* a checkpoint.dir: its latest is used */
    snprintf(out, sizeof(out), "%s/export.bin", root);
    mt_model_t m = NULL, l = NULL;
    mt_config_t *cfg = NULL;
    CHECK_OK(mt_job_ckpt_read_model(dir, &m, &cfg, NULL, 0));
    if (!m) {
        return;
    }
    CHECK(cfg && mt_config_int(cfg, "model.n_embd") == 32, "the checkpoint's config is returned");
    CHECK_OK(mt_llmc_save(m, out));
    mt_model_config_t mc = *mt_model_config(m);
    CHECK_OK(mt_model_init(&mc, &l));
    CHECK_OK(mt_model_alloc_params(l));
    CHECK_OK(mt_llmc_load(l, out));
    size_t n = mt_model_numel(m), diff = 0;
    const float *a = mt_model_params_flat(m), *b = mt_model_params_flat(l);
    for (size_t i = 0; i < n; i++) {
        diff += a[i] != b[i];
    }
    CHECK(diff == 0, "%zu of %zu parameters differ after export", diff, n);
    double norm = 0;
    for (size_t i = 0; i < n; i++) {
        norm += (double)a[i] * a[i];
    }
    CHECK(norm > 0, "weights were read (norm^2 %g)", norm);
    mt_model_free(m);
    mt_model_free(l);
    mt_config_free(cfg);
    unlink(out);
}

int main(int argc, char **argv) {
    setenv("MESHTRAIN_PEAK_GFLOPS_PER_CORE", "50", 1);
    if (mt_rt_init(&argc, &argv) != MT_OK) {
        return 1;
    }
    snprintf(root, sizeof(root), "/tmp/mt_ckpt_XXXXXX");
    CHECK(mkdtemp(root) != NULL, "mkdtemp");
    resume_case("adamw", "--optimizer.momentum=0");
    resume_case("sgd", "--optimizer.momentum=0.9");
    test_bad_checkpoints();
    test_read_model();
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    if (system(cmd) != 0) {
        fprintf(stderr, "could not remove %s\n", root);
    }
    int rc = mt_test_finish("test_ckpt");
    mt_rt_finalize();
    return rc;
}
