/* The rule of ../../shared/DESIGN.md for the data-parallel engines: DP, DDP and ZeRO-1/2/3 on this many
 * ranks compute the same training run as one process on the same global batch. For a tiny GPT-2 (tied
 * embedding) and an MLP whose 3923 parameters divide by none of 2, 3, 4, with SGD (momentum, L2) and
 * AdamW (decoupled decay), 2 micro-batches per step and clipping active, every step's loss and
 * gradient norm and the final parameters gathered to rank 0 match the serial run:
 *   SGD    |a - b| <= 1e-5 |b| (loss, norm); ||a - b|| <= 1e-5 ||b|| over all parameters, and per parameter
 *          |a - b| <= 1e-5 (|b| + rms(b))
 *   AdamW  the same with 1e-4 (its division by sqrt(v) magnifies rounding in near-zero gradients), and the
 *          per-parameter bound widened by 1e-3 * lr * steps: an element whose gradient is at rounding level
 *          moves by up to lr per step in a direction set by that rounding. Measured: one element of the
 *          tiny GPT-2 (a near-zero-gradient weight) differs by 2.5e-5 = 0.5e-3 * lr * steps at 3-4 ranks, while
 *          the relative L2 difference of all parameters is 1.5e-6.
 * Every rank's own copy of the parameters must be bit-identical (replicas, DP's broadcast, ZeRO gathers).
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <string.h>

#include "driver.h"
#include "runtime/rt.h"
#include "testutil.h"

typedef struct {
    const char *name;
    mt_engine_kind_t kind;
    int stage;
    double bucket_mb, first_mb; /* small: several buckets even for these tiny models */
    int64_t persist;
    int grad_accum; /* 0: the config's (2) */
    int split_at;   /* > 0: forward/backward as two module ranges (pipeline-stage style) */
} variant_t;

static const variant_t variants[] = {
    {"dp", MT_ENGINE_DP, 0, 25, 1, 0, 0, 0},
    {"ddp", MT_ENGINE_DDP, 0, 0.01, 0.002, 0, 0, 0},
    {"ddp-one-bucket", MT_ENGINE_DDP, 0, 25, 1, 0, 0, 0},
    {"zero-1", MT_ENGINE_ZERO, 1, 0.01, 0.002, 0, 0, 0},
    {"zero-2", MT_ENGINE_ZERO, 2, 0.01, 0.002, 0, 0, 0},
    {"zero-3", MT_ENGINE_ZERO, 3, 25, 1, 0, 0, 0},
    {"zero-3-persist", MT_ENGINE_ZERO, 3, 25, 1, 200, 0, 0},
    {"ddp-ga1", MT_ENGINE_DDP, 0, 0.01, 0.002, 0, 1, 0},
    {"zero-2-ga1", MT_ENGINE_ZERO, 2, 0.01, 0.002, 0, 1, 0},
    {"zero-3-ga1", MT_ENGINE_ZERO, 3, 25, 1, 0, 1, 0},
    {"ddp-two-ranges", MT_ENGINE_DDP, 0, 0.01, 0.002, 0, 0, 2},
    {"zero-2-two-ranges", MT_ENGINE_ZERO, 2, 0.01, 0.002, 0, 0, 2},
    {"zero-3-two-ranges", MT_ENGINE_ZERO, 3, 25, 1, 0, 0, 2},
};

static bool close_rel(double a, double b, double tol) {
    return fabs(a - b) <= tol * fabs(b);
}

static void compare(const char *what, const drv_result_t *ref, const drv_result_t *got, double tol, double slack,
                    int rank) {
    if (rank != 0) {
        return;
    }
    for (int s = 0; s < ref->steps; s++) {
        CHECK(close_rel(got->loss[s], ref->loss[s], tol), "%s step %d: loss %.9g vs serial %.9g (tol %g)", what, s + 1,
              got->loss[s], ref->loss[s], tol);
        CHECK(close_rel(got->norm[s], ref->norm[s], tol), "%s step %d: norm %.9g vs serial %.9g (tol %g)", what, s + 1,
              got->norm[s], ref->norm[s], tol);
    }
    double ss = 0.0;
    for (size_t i = 0; i < ref->numel; i++) {
        ss += (double)ref->params[i] * ref->params[i];
    }
    double rms = sqrt(ss / (double)ref->numel), worst = 0.0;
    size_t bad = 0, worst_i = 0;
    for (size_t i = 0; i < ref->numel; i++) {
        double d = fabs((double)got->params[i] - ref->params[i]), lim = tol * (fabs(ref->params[i]) + rms) + slack;
        if (d > lim) {
            bad++;
        }
        if (d / lim > worst) {
            worst = d / lim;
            worst_i = i;
        }
    }
    double dd = 0.0;
    for (size_t i = 0; i < ref->numel; i++) {
        dd += ((double)got->params[i] - ref->params[i]) * ((double)got->params[i] - ref->params[i]);
    }
    CHECK(sqrt(dd / ss) <= tol, "%s: final parameters differ from serial by %.3g relative (L2), tol %g", what,
          sqrt(dd / ss), tol);
    CHECK(bad == 0, "%s: %zu of %zu final parameters differ from serial beyond tol %g (worst #%zu: %.9g vs %.9g)", what,
          bad, ref->numel, tol, worst_i, got->params[worst_i], ref->params[worst_i]);
}

static void run_model(mt_comm_t dp, bool gpt2, bool adamw) {
    int rank = mt_comm_rank(dp), N = mt_comm_size(dp);
    drv_cfg_t c;
    if (gpt2) {
        drv_cfg_gpt2_tiny(&c);
    } else {
        drv_cfg_mlp_tiny(&c);
    }
    if (adamw) {
        c.optim.kind = MT_OPTIM_ADAMW;
        c.optim.weight_decay = 0.1f;
        c.lr = 1e-2f;
    } else {
        c.optim.kind = MT_OPTIM_SGD;
        c.optim.momentum = 0.9f;
        c.optim.weight_decay = 0.01f;
        c.lr = 0.05f;
    }
    c.clip = 0.25f;
    double tol = adamw ? 1e-4 : 1e-5;
    char what[128];
    for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
        const variant_t *var = &variants[v];
        drv_cfg_t cv = c;
        cv.grad_accum = var->grad_accum ? var->grad_accum : c.grad_accum;
        cv.replica_sums = true;
        cv.split_at = var->split_at;
        drv_result_t ref, got;
        memset(&ref, 0, sizeof(ref));
        if (rank == 0) {
            CHECK_OK(drv_run_serial(&cv, &ref));
            int clipped = 0;
            for (int s = 0; s < ref.steps; s++) {
                clipped += ref.norm[s] > cv.clip;
            }
            CHECK(clipped >= 2, "%s: clipping must be active (norms above %g in %d of %d steps)", what, cv.clip,
                  clipped, ref.steps);
            CHECK(N == 1 || ref.numel % (size_t)N != 0 || gpt2, "mlp parameter count %zu must not divide by %d",
                  ref.numel, N);
        }
        mt_engine_params_t ep = MT_ENGINE_PARAMS_INIT;
        ep.kind = var->kind;
        ep.zero_stage = var->stage ? var->stage : 1;
        ep.bucket_mb = var->bucket_mb;
        ep.first_bucket_mb = var->first_mb;
        ep.persist_threshold = var->persist;
        snprintf(what, sizeof(what), "%s %s %s np%d", gpt2 ? "gpt2" : "mlp", adamw ? "adamw" : "sgd", var->name, N);
        mt_status_t st = drv_run_engine(&cv, dp, &ep, &got);
        CHECK(st == MT_OK, "%s: %s (%s)", what, mt_status_str(st), mt_last_error_msg());
        if (st == MT_OK) {
            compare(what, &ref, &got, tol, adamw ? 1e-3 * cv.lr * cv.steps : 0.0, rank);
            if (cv.replica_sums) {
                double lo = 0.0, hi = 0.0;
                MPI_Allreduce(&got.replica_sum, &lo, 1, MPI_DOUBLE, MPI_MIN, mt_comm_mpi(dp));
                MPI_Allreduce(&got.replica_sum, &hi, 1, MPI_DOUBLE, MPI_MAX, mt_comm_mpi(dp));
                CHECK(lo == hi, "%s: replicas differ across ranks (checksums %.17g .. %.17g)", what, lo, hi);
            }
            if (rank == 0 && v == 1) {
                printf("%s: step losses %.6f %.6f %.6f %.6f %.6f (serial %.6f .. %.6f), %d units\n", what, got.loss[0],
                       got.loss[1], got.loss[2], got.loss[3], got.loss[4], ref.loss[0], ref.loss[4], got.mem.n_units);
            }
        }
        drv_result_free(&got);
        drv_result_free(&ref);
    }
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    mt_comm_t dp = NULL;
    mt_comm_params_t cp = MT_COMM_PARAMS_INIT;
    cp.name = "dp";
    CHECK_OK(mt_comm_init(mt_rt_world()->comm, &cp, &dp));
    for (int m = 0; dp && m < 2; m++) {
        run_model(dp, m == 0, false);
        run_model(dp, m == 0, true);
    }
    CHECK_OK(mt_comm_free(dp));
    return mt_test_finish_mpi("test_parallel_equiv");
}
