/* metrics.jsonl against the run that wrote it: one object per step, every required key with the right
 * type, losses, learning rates, gradient norms and validation losses equal to what mt_job_run returned
 * (bit for bit), times and memory consistent, MFU from the configured peak; the per-rank file too.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <unistd.h>

#include "jobtest.h"
#include "train/job_json.h"
#include "runtime/rt.h"

static const mt_json_t *need(const mt_json_t *o, const char *key, mt_json_kind_t kind, int64_t step) {
    const mt_json_t *v = mt_json_get(o, key);
    CHECK(v && v->kind == kind, "step %lld: key %s present with kind %d", (long long)step, key, (int)kind);
    return v && v->kind == kind ? v : NULL;
}

static void test_metrics_file(void) {
    char dir[] = "/tmp/mt_metrics_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[256], arg[300], rank_path[300];
    snprintf(path, sizeof(path), "%s/sub/m.jsonl", dir); /* the sub-directory does not exist yet */
    snprintf(arg, sizeof(arg), "--metrics.jsonl=%s", path);
    snprintf(rank_path, sizeof(rank_path), "%s/sub/m.rank0.jsonl", dir);
    const char *extra[] = {
        "--train.steps=6", "--train.eval_every=3", "--train.eval_batches=1", arg, "--metrics.per_rank=true", NULL};
    mt_job_result_t r;
    CHECK_OK(jt_run(1, extra, 0, NULL, &r));
    CHECK(r.n_steps == 6, "6 steps ran: %lld", (long long)r.n_steps);
    size_t len = 0;
    char *text = jt_slurp(path, &len);
    CHECK(text != NULL, "%s was written", path);
    int lines = 0;
    double mfu_per_tps = -1;
    for (char *line = text; text && *line;) {
        char *nl = strchr(line, '\n');
        CHECK(nl != NULL, "every line ends with a newline");
        if (!nl) {
            break;
        }
        mt_json_t *o = NULL;
        CHECK_OK(mt_json_parse(line, (size_t)(nl - line), "metrics line", &o));
        int64_t step = 0;
        CHECK(mt_json_get_int(o, "step", &step) && step == lines + 1, "line %d has step %lld", lines, (long long)step);
        int64_t s = step - 1;
        const mt_json_t *loss = need(o, "loss", MT_JSON_NUMBER, step), *lr = need(o, "lr", MT_JSON_NUMBER, step);
        const mt_json_t *gn = need(o, "grad_norm", MT_JSON_NUMBER, step);
        const mt_json_t *tok = need(o, "tokens", MT_JSON_NUMBER, step);
        const mt_json_t *ms = need(o, "step_ms", MT_JSON_NUMBER, step);
        const mt_json_t *tps = need(o, "tokens_per_s", MT_JSON_NUMBER, step);
        const mt_json_t *mfu = need(o, "mfu", MT_JSON_NUMBER, step);
        const mt_json_t *tm = need(o, "time_ms", MT_JSON_OBJECT, step),
                        *mem = need(o, "mem_bytes", MT_JSON_OBJECT, step);
        if (s >= 0 && s < r.n_steps && loss && lr && gn) {
            CHECK(loss->num == r.loss[s], "step %lld: loss %.17g in the file, %.17g returned", (long long)step,
                  loss->num, r.loss[s]);
            CHECK((float)lr->num == r.lr[s], "step %lld: lr %.9g vs %.9g", (long long)step, lr->num, (double)r.lr[s]);
            CHECK(gn->num == r.grad_norm[s], "step %lld: grad_norm %.17g vs %.17g", (long long)step, gn->num,
                  r.grad_norm[s]);
        }
        if (tok && ms && tps && mfu) {
            CHECK(tok->num == 8 * 16, "tokens per step %g = global_batch x seq_len = 128", tok->num);
            CHECK(ms->num > 0 && fabs(tps->num - tok->num / (ms->num / 1e3)) <= 0.01 * tps->num,
                  "tokens_per_s %g = tokens / step time (%g ms)", tps->num, ms->num);
            CHECK(mfu->num > 0 && mfu->num < 1, "0 < mfu %g < 1 with a configured peak", mfu->num);
            if (mfu_per_tps < 0) {
                mfu_per_tps = mfu->num / tps->num;
            }
            CHECK_CLOSE(mfu->num / tps->num, mfu_per_tps, 1e-3, 0);
        }
        if (tm && ms) {
            const char *keys[] = {"data", "forward", "backward", "comm_exposed", "optimizer"};
            double sum = 0;
            for (int k = 0; k < 5; k++) {
                const mt_json_t *v = need(tm, keys[k], MT_JSON_NUMBER, step);
                CHECK(v && v->num >= 0, "time_ms.%s >= 0", keys[k]);
                sum += v ? v->num : 0;
            }
            CHECK(sum <= ms->num * 1.001 + 0.01, "the parts of the step (%g ms) fit in step_ms %g", sum, ms->num);
            const mt_json_t *fw = mt_json_get(tm, "forward"), *bw = mt_json_get(tm, "backward");
            CHECK(fw && bw && fw->num > 0 && bw->num > 0, "forward and backward took time");
        }
        if (mem) {
            const char *keys[] = {"params", "grads", "optimizer", "activations", "comm", "peak"};
            int64_t v[6] = {0};
            for (int k = 0; k < 6; k++) {
                CHECK(mt_json_get_int(mem, keys[k], &v[k]) && v[k] >= 0, "mem_bytes.%s an integer >= 0", keys[k]);
            }
            CHECK(v[0] >= 4 * r.n_params && v[0] < 4 * r.n_params + 64 * 64, "params %lld bytes for %lld parameters",
                  (long long)v[0], (long long)r.n_params);
            CHECK(v[1] == v[0], "grads %lld = params %lld", (long long)v[1], (long long)v[0]);
            CHECK(v[2] >= 2 * 4 * r.n_params, "AdamW state %lld >= 2 x 4 x params", (long long)v[2]);
            CHECK(v[3] > 0, "activations counted");
            CHECK(v[5] >= v[0] + v[1] + v[2] + v[3] + v[4], "peak %lld >= the categories' sum", (long long)v[5]);
        }
        const mt_json_t *vl = mt_json_get(o, "val_loss");
        bool eval_step = step == 3 || step == 6;
        CHECK((vl != NULL) == eval_step, "val_loss present exactly on eval steps (step %lld)", (long long)step);
        if (vl && eval_step) {
            int k = step == 3 ? 0 : 1;
            CHECK(vl->kind == MT_JSON_NUMBER && r.n_evals == 2 && vl->num == r.val_loss[k],
                  "val_loss %.17g equals the returned %.17g", vl->num, r.val_loss[k]);
        }
        mt_json_free(o);
        lines++;
        line = nl + 1;
    }
    CHECK(lines == 6, "6 lines, one per step: %d", lines);
    free(text);
    char *rt = jt_slurp(rank_path, NULL);
    int rl = 0;
    for (char *c = rt; c && *c; c++) {
        rl += *c == '\n';
    }
    CHECK(rt && rl == 6, "per-rank file %s has 6 lines (%d)", rank_path, rl);
    free(rt);
    CHECK(r.steady_tokens_per_s > 0 && r.mfu > 0, "summary: steady tokens/s %g, MFU %g", r.steady_tokens_per_s, r.mfu);
    CHECK(r.mem_peak[MT_MEM_OPTIMIZER] >= 8 * r.n_params && r.mem_peak_total >= r.mem_peak[MT_MEM_ACTIVATIONS],
          "summary peaks: optimizer %lld, total %lld", (long long)r.mem_peak[MT_MEM_OPTIMIZER],
          (long long)r.mem_peak_total);
    mt_job_result_free(&r);
    unlink(rank_path);
    unlink(path);
    char sub[300];
    snprintf(sub, sizeof(sub), "%s/sub", dir);
    rmdir(sub);
    rmdir(dir);
}

/* A metrics path that cannot be created is bad input naming the key. */
static void test_metrics_bad_path(void) {
    const char *extra[] = {"--train.steps=2", "--metrics.jsonl=/proc/nope/m.jsonl", NULL};
    mt_job_result_t r;
    mt_status_t st = jt_run(1, extra, 0, NULL, &r);
    CHECK(st == MT_ERR_INVALID_ARG && strstr(mt_last_error_msg(), "metrics.jsonl: cannot create /proc/nope/m.jsonl"),
          "bad metrics path refused: %s (%s)", mt_status_str(st), mt_last_error_msg());
    mt_job_result_free(&r);
}

int main(int argc, char **argv) {
    setenv("MESHTRAIN_PEAK_GFLOPS_PER_CORE", "50", 1); /* no sgemm measurement in tests */
    if (mt_rt_init(&argc, &argv) != MT_OK) {
        return 1;
    }
    test_metrics_file();
    test_metrics_bad_path();
    int rc = mt_test_finish("test_metrics");
    mt_rt_finalize();
    return rc;
}
