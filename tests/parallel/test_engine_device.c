/* The data-parallel engines run over the device table they are given (runtime/device.h), not over the
 * host allocator and the flat kernels directly: a recording table (the CPU table's entries, each counted,
 * every live block tracked) is passed as mt_engine_params_t.device and every engine (dp, ddp, ZeRO-1/2/3)
 * trains a tiny GPT-2 for three steps under it and under the default. Asserted:
 * - the two runs are bit-identical (losses, norms, final parameters): the table is the engines' arithmetic;
 * - the parameter, gradient and optimizer bytes the engine reports (mt_engine_mem) are exactly the bytes
 *   allocated through the table under those categories, and the bucket/gather pools' peak came from it too;
 * - the gradient zeroing, the norm's sums of squares and the optimizer step went through the table
 *   (each rank that owns optimizer state steps through it on every step; DP's non-root ranks never do);
 * - every block allocated through the table is freed through it when the engine is freed;
 * - a device whose memory the host cannot read is refused with MT_ERR_INVALID_ARG naming it.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <string.h>

#include "driver.h"
#include "rec_device.h"
#include "runtime/rt.h"
#include "testutil.h"

/* ---- the runs -------------------------------------------------------------------------------------------- */

static void one(const drv_cfg_t *c, mt_comm_t dp, mt_engine_kind_t kind, int stage, const char *what) {
    int rank = mt_comm_rank(dp);
    mt_engine_params_t ep = MT_ENGINE_PARAMS_INIT;
    ep.kind = kind;
    ep.zero_stage = stage ? stage : 1;
    ep.bucket_mb = 0.01; /* several buckets, so the pools hold more than one buffer */
    ep.first_bucket_mb = 0.002;
    drv_result_t ref, got;
    memset(&ref, 0, sizeof(ref));
    memset(&got, 0, sizeof(got));
    CHECK_OK(drv_run_engine(c, dp, &ep, &ref));
    rec_reset();
    ep.device = &rec_table;
    CHECK_OK(drv_run_engine(c, dp, &ep, &got));

    for (int s = 0; s < c->steps; s++) {
        CHECK(memcmp(&ref.loss[s], &got.loss[s], sizeof(double)) == 0 &&
                  memcmp(&ref.norm[s], &got.norm[s], sizeof(double)) == 0,
              "%s step %d: loss %.17g / norm %.17g on the recording table, %.17g / %.17g on the CPU table", what, s + 1,
              got.loss[s], got.norm[s], ref.loss[s], ref.norm[s]);
    }
    CHECK(rank != 0 || (ref.params && got.params && memcmp(ref.params, got.params, ref.numel * sizeof(float)) == 0),
          "%s: final parameters differ between the recording table and the CPU table", what);

    /* Everything the engine holds came from the table (the peak is the engine's storage: it is allocated at
     * init and kept; only MT_MEM_COMM blocks come and go). */
    CHECK(rec.peak[MT_MEM_PARAMS] == got.mem.params,
          "%s: engine reports %lld parameter bytes, the table allocated %lld", what, (long long)got.mem.params,
          (long long)rec.peak[MT_MEM_PARAMS]);
    CHECK(rec.peak[MT_MEM_GRADS] == got.mem.grads, "%s: engine reports %lld gradient bytes, the table allocated %lld",
          what, (long long)got.mem.grads, (long long)rec.peak[MT_MEM_GRADS]);
    CHECK(rec.peak[MT_MEM_OPTIMIZER] == got.mem.optimizer,
          "%s: engine reports %lld optimizer bytes, the table allocated %lld", what, (long long)got.mem.optimizer,
          (long long)rec.peak[MT_MEM_OPTIMIZER]);
    CHECK(got.mem.params > 0 && got.mem.grads > 0, "%s: the engine holds no parameters or gradients", what);
    CHECK(rec.peak[MT_MEM_COMM] >= got.mem.comm_peak, "%s: pools peaked at %lld bytes, the table saw only %lld", what,
          (long long)got.mem.comm_peak, (long long)rec.peak[MT_MEM_COMM]);
    CHECK(stage < 2 || got.mem.comm_peak > 0, "%s: ZeRO-%d kept no bucket buffers", what, stage);

    /* The step's device work went through the table. */
    CHECK(rec.zeros >= c->steps, "%s: %lld zeroings through the table in %d steps", what, (long long)rec.zeros,
          c->steps);
    CHECK(rec.sumsqs >= (kind == MT_ENGINE_DP && rank != 0 ? 0 : c->steps),
          "%s: %lld sums of squares through the table in %d steps", what, (long long)rec.sumsqs, c->steps);
    bool owns = !(kind == MT_ENGINE_DP && rank != 0);
    CHECK(owns ? rec.steps > 0 && rec.steps % c->steps == 0 : rec.steps == 0,
          "%s: %lld optimizer updates through the table in %d steps (rank %d %s optimizer state)", what,
          (long long)rec.steps, c->steps, rank, owns ? "owns" : "owns no");
    /* Gathering the parameters: the root copies replicated units out, every rank copies its shards in. */
    CHECK(rank != 0 && kind != MT_ENGINE_ZERO ? rec.copies == 0 : rec.copies > 0,
          "%s: rank %d copied %lld times through the table gathering the parameters", what, rank,
          (long long)rec.copies);

    /* And went back to it. */
    CHECK(rec.n_live == 0 && rec.unknown_frees == 0,
          "%s: %d blocks (%lld parameter, %lld gradient, %lld optimizer, %lld comm bytes) still live after "
          "mt_engine_free, %lld frees of blocks the table never allocated",
          what, rec.n_live, (long long)rec.live[MT_MEM_PARAMS], (long long)rec.live[MT_MEM_GRADS],
          (long long)rec.live[MT_MEM_OPTIMIZER], (long long)rec.live[MT_MEM_COMM], (long long)rec.unknown_frees);
    if (rank == 0) {
        printf("%s: bit-identical on the recording table; %lld allocations (%lld B params, %lld B grads, %lld B "
               "optimizer, %lld B comm peak), %lld zeroings, %lld sums of squares, %lld updates, all freed\n",
               what, (long long)rec.allocs, (long long)rec.peak[MT_MEM_PARAMS], (long long)rec.peak[MT_MEM_GRADS],
               (long long)rec.peak[MT_MEM_OPTIMIZER], (long long)rec.peak[MT_MEM_COMM], (long long)rec.zeros,
               (long long)rec.sumsqs, (long long)rec.steps);
    }
    drv_result_free(&ref);
    drv_result_free(&got);
}

/* A device whose memory the host cannot read: refused at init, before anything is allocated on it. */
static void not_host(const drv_cfg_t *c, mt_comm_t dp) {
    struct mt_device far = rec_table;
    far.name = "far-device";
    far.host = false;
    mt_engine_params_t ep = MT_ENGINE_PARAMS_INIT;
    ep.device = &far;
    mt_model_t model = NULL;
    mt_engine_t e = NULL;
    CHECK_OK(mt_model_init(&c->model, &model));
    rec_reset();
    mt_status_t st = mt_engine_init(model, dp, &ep, &e);
    CHECK(st == MT_ERR_INVALID_ARG && e == NULL && strstr(mt_last_error_msg(), "far-device"),
          "a non-host device: %s (%s)", mt_status_str(st), mt_last_error_msg());
    CHECK(rec.allocs == 0, "a refused device still got %lld allocations", (long long)rec.allocs);
    mt_model_free(model);
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    mt_comm_t dp = NULL;
    CHECK_OK(mt_comm_init(mt_rt_world()->comm, NULL, &dp));
    rec_install();
    drv_cfg_t c;
    drv_cfg_gpt2_tiny(&c);
    c.optim.kind = MT_OPTIM_ADAMW;
    c.optim.weight_decay = 0.1f;
    c.clip = 0.25f;
    c.steps = 3;
    if (dp) {
        one(&c, dp, MT_ENGINE_DP, 0, "dp");
        one(&c, dp, MT_ENGINE_DDP, 0, "ddp");
        one(&c, dp, MT_ENGINE_ZERO, 1, "zero-1");
        one(&c, dp, MT_ENGINE_ZERO, 2, "zero-2");
        one(&c, dp, MT_ENGINE_ZERO, 3, "zero-3");
        drv_cfg_t s = c; /* SGD with momentum: one state buffer, the other update */
        s.optim.kind = MT_OPTIM_SGD;
        s.optim.momentum = 0.9f;
        one(&s, dp, MT_ENGINE_ZERO, 2, "zero-2 sgd");
        not_host(&c, dp);
    }
    CHECK_OK(mt_comm_free(dp));
    return mt_test_finish_mpi("test_parallel_engine_device");
}
