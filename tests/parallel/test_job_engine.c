/* The engines driven by the training loop (mt_job_run through mt_job_engine_parallel, the adapter meshtrain
 * train uses): every engine and ZeRO stage gives the same per-step loss and gradient norm as DDP on the same
 * config (SGD, 1e-5 relative; DDP itself is checked against the serial run in test_equiv), and the loss goes
 * down.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "train/job.h"
#include "runtime/config.h"
#include "runtime/rt.h"
#include "testutil.h"

static mt_status_t run(const char *engine, int stage, mt_job_result_t *res) {
    char eng[64], stg[64];
    snprintf(eng, sizeof(eng), "--parallel.engine=%s", engine);
    snprintf(stg, sizeof(stg), "--parallel.zero_stage=%d", stage);
    char *ov[] = {"--model.kind=gpt2",
                  "--model.n_layer=2",
                  "--model.n_head=2",
                  "--model.n_embd=32",
                  "--model.seq_len=16",
                  "--model.vocab_size=96",
                  "--train.steps=5",
                  "--train.global_batch=8",
                  "--train.micro_batch=2",
                  "--train.grad_accum=2",
                  "--train.eval_every=0",
                  "--optimizer.kind=sgd",
                  "--optimizer.lr=0.05",
                  "--optimizer.schedule=constant",
                  "--optimizer.grad_clip=0.25",
                  "--parallel.tp=1",
                  "--parallel.bucket_mb=0.01",
                  eng,
                  stg};
    mt_config_t *cfg = NULL;
    MT_CHECK(mt_config_load_world(mt_rt_world()->comm, NULL, (int)(sizeof(ov) / sizeof(ov[0])), ov, &cfg));
    mt_job_opts_t opts = MT_JOB_OPTS_INIT;
    opts.engine = mt_job_engine_parallel();
    opts.prefetch = false;
    mt_status_t st = mt_job_run(cfg, &opts, res);
    mt_config_free(cfg);
    return st;
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    int rank = mt_rt_world()->rank;
    mt_job_result_t ref;
    memset(&ref, 0, sizeof(ref));
    CHECK_OK(run("ddp", 1, &ref));
    CHECK(ref.n_steps == 5 && ref.loss[4] < ref.loss[0], "ddp through the loop: %lld steps, loss %g -> %g",
          (long long)ref.n_steps, ref.n_steps ? ref.loss[0] : 0.0, ref.n_steps ? ref.loss[ref.n_steps - 1] : 0.0);
    const char *kinds[] = {"dp", "zero", "zero", "zero"};
    int stages[] = {1, 1, 2, 3};
    for (int v = 0; v < 4; v++) {
        mt_job_result_t r;
        memset(&r, 0, sizeof(r));
        mt_status_t st = run(kinds[v], stages[v], &r);
        CHECK(st == MT_OK, "%s stage %d: %s (%s)", kinds[v], stages[v], mt_status_str(st), mt_last_error_msg());
        for (int64_t s = 0; st == MT_OK && rank == 0 && s < ref.n_steps && s < r.n_steps; s++) {
            CHECK(fabs(r.loss[s] - ref.loss[s]) <= 1e-5 * fabs(ref.loss[s]), "%s-%d step %lld: loss %.9g vs ddp %.9g",
                  kinds[v], stages[v], (long long)s + 1, r.loss[s], ref.loss[s]);
            CHECK(fabs(r.grad_norm[s] - ref.grad_norm[s]) <= 1e-5 * fabs(ref.grad_norm[s]),
                  "%s-%d step %lld: norm %.9g vs ddp %.9g", kinds[v], stages[v], (long long)s + 1, r.grad_norm[s],
                  ref.grad_norm[s]);
        }
        mt_job_result_free(&r);
    }
    if (rank == 0) {
        printf("through the training loop: ddp losses %.6f -> %.6f, norm %.4f at step 1\n", ref.loss[0], ref.loss[4],
               ref.grad_norm[0]);
    }
    mt_job_result_free(&ref);
    return mt_test_finish_mpi("test_parallel_job_engine");
}
