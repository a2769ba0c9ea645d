/* Bad input to the engines gets a clear error on every rank, and a rank that never joins a collective
 * makes the waiting rank fail with a timeout naming the operation instead of hanging.
 * SPDX-License-Identifier: MIT */
#include <string.h>
#include <unistd.h>

#include "driver.h"
#include "runtime/rt.h"
#include "testutil.h"

static void expect_init_error(mt_comm_t dp, const mt_engine_params_t *ep, bool bind_first, const char *needle) {
    drv_cfg_t c;
    drv_cfg_mlp_tiny(&c);
    mt_model_t m = NULL;
    CHECK_OK(mt_model_init(&c.model, &m));
    if (bind_first) {
        CHECK_OK(mt_model_alloc_params(m));
    }
    mt_engine_t e = NULL;
    mt_status_t st = mt_engine_init(m, dp, ep, &e);
    CHECK(st == MT_ERR_INVALID_ARG, "expected MT_ERR_INVALID_ARG for '%s', got %s", needle, mt_status_str(st));
    CHECK(e == NULL, "no engine on error");
    CHECK(strstr(mt_last_error_msg(), needle) != NULL, "message '%s' should name '%s'", mt_last_error_msg(), needle);
    mt_model_free(m);
}

static void bad_params(mt_comm_t dp) {
    mt_engine_params_t ep = MT_ENGINE_PARAMS_INIT;
    ep.kind = MT_ENGINE_ZERO;
    ep.zero_stage = 4;
    expect_init_error(dp, &ep, false, "zero_stage");
    ep = (mt_engine_params_t)MT_ENGINE_PARAMS_INIT;
    ep.grad_accum = 0;
    expect_init_error(dp, &ep, false, "grad_accum");
    ep = (mt_engine_params_t)MT_ENGINE_PARAMS_INIT;
    ep.bucket_mb = 0.0;
    expect_init_error(dp, &ep, false, "bucket_mb");
    ep = (mt_engine_params_t)MT_ENGINE_PARAMS_INIT;
    ep.size = 8;
    expect_init_error(dp, &ep, false, "MT_ENGINE_PARAMS_INIT");
    ep = (mt_engine_params_t)MT_ENGINE_PARAMS_INIT;
    expect_init_error(dp, &ep, true, "already has storage");
    ep.optim.beta1 = 1.5f;
    expect_init_error(dp, &ep, false, "beta1");
    mt_engine_kind_t k;
    CHECK(mt_engine_kind_parse("ZeRo", &k) && k == MT_ENGINE_ZERO, "kind parse");
    CHECK(!mt_engine_kind_parse("fsdp", &k), "fsdp is not an engine name");
}

/* More backward passes than grad_accum in one step is a usage error, raised from the hook on every
 * rank (so no rank is left waiting); the engine can be freed afterwards. */
static void too_many_passes(mt_comm_t dp) {
    drv_cfg_t c;
    drv_cfg_mlp_tiny(&c);
    mt_model_t m = NULL;
    mt_engine_t e = NULL;
    mt_acts_t a = NULL;
    CHECK_OK(mt_model_init(&c.model, &m));
    mt_engine_params_t ep = MT_ENGINE_PARAMS_INIT;
    CHECK_OK(mt_engine_init(m, dp, &ep, &e));
    CHECK_OK(mt_acts_init(m, 2, c.seq_len, &a));
    int32_t tok[16] = {0}, tgt[16] = {0};
    int n = mt_model_n_modules(m);
    float loss = 0.0f;
    CHECK_OK(mt_engine_zero_grads(e));
    CHECK_OK(mt_model_forward(m, a, 0, n, tok, tgt, NULL, NULL, &loss));
    CHECK_OK(mt_model_backward(m, a, 0, n, NULL, NULL, 1.0f));
    CHECK_OK(mt_model_forward(m, a, 0, n, tok, tgt, NULL, NULL, &loss));
    mt_status_t st = mt_model_backward(m, a, 0, n, NULL, NULL, 1.0f);
    CHECK(st == MT_ERR_INVALID_USAGE && strstr(mt_last_error_msg(), "grad_accum"), "second pass: %s (%s)",
          mt_status_str(st), mt_last_error_msg());
    int32_t buf[4];
    st = mt_engine_scatter_batch(e, buf, buf, 4);
    CHECK(st == MT_ERR_INVALID_USAGE, "scatter_batch is DP's data path: got %s", mt_status_str(st));
    mt_acts_free(a);
    mt_engine_free(e);
    mt_model_free(m);
}

/* ZeRO-1's step all-gathers the updated shards; rank 1 arrives 3 s late, rank 0 waits at most 1 s. */
static void late_rank(void) {
    mt_comm_params_t cp = MT_COMM_PARAMS_INIT;
    cp.name = "dp-timeout";
    cp.timeout_s = 1.0;
    mt_comm_t dp = NULL;
    CHECK_OK(mt_comm_init(mt_rt_world()->comm, &cp, &dp));
    int rank = mt_comm_rank(dp);
    drv_cfg_t c;
    drv_cfg_mlp_tiny(&c);
    mt_model_t m = NULL;
    mt_engine_t e = NULL;
    CHECK_OK(mt_model_init(&c.model, &m));
    mt_engine_params_t ep = MT_ENGINE_PARAMS_INIT;
    ep.kind = MT_ENGINE_ZERO;
    ep.zero_stage = 1;
    CHECK_OK(mt_engine_init(m, dp, &ep, &e));
    CHECK_OK(mt_engine_zero_grads(e));
    CHECK_OK(mt_engine_finish_grads(e));
    if (rank == 1) {
        sleep(3);
    }
    double t0 = mt_now();
    mt_status_t st = mt_engine_step(e, 0.1f, 1.0f);
    if (rank == 0) {
        CHECK(st == MT_ERR_TIMEOUT, "rank 0 should time out waiting for rank 1, got %s", mt_status_str(st));
        CHECK(strstr(mt_last_error_msg(), "all_gather") != NULL && strstr(mt_last_error_msg(), "dp-timeout") != NULL,
              "the timeout names the operation and the communicator: %s", mt_last_error_msg());
        CHECK(mt_now() - t0 < 2.9, "rank 0 gave up after %.1f s", mt_now() - t0);
        printf("rank 0 after %.1f s: %s\n", mt_now() - t0, mt_last_error_msg());
    }
    MPI_Barrier(mt_rt_world()->comm); /* both ranks have issued the same calls: everything completes */
    /* A formerly synchronous path (the loss all-reduce) times out the same way. */
    if (rank == 1) {
        sleep(3);
    }
    double loss = 1.0;
    t0 = mt_now();
    st = mt_engine_reduce_loss(e, &loss);
    if (rank == 0) {
        CHECK(st == MT_ERR_TIMEOUT && strstr(mt_last_error_msg(), "all_reduce") != NULL,
              "reduce_loss with a late peer: %s (%s)", mt_status_str(st), mt_last_error_msg());
        CHECK(mt_now() - t0 < 2.9, "rank 0 gave up after %.1f s", mt_now() - t0);
    }
    MPI_Barrier(mt_rt_world()->comm);
    mt_engine_free(e);
    mt_model_free(m);
    mt_comm_free(dp);
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    mt_comm_t dp = NULL;
    CHECK_OK(mt_comm_init(mt_rt_world()->comm, NULL, &dp));
    bad_params(dp);
    too_many_passes(dp);
    CHECK_OK(mt_comm_free(dp));
    if (mt_rt_world()->size == 2) {
        late_rank();
    }
    return mt_test_finish_mpi("test_parallel_errors");
}
