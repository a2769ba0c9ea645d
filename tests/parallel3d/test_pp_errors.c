/* Pipeline failures end in an error naming what went wrong, on time, never a hang (2 ranks):
 *  - stages built with different micro-batch counts: every stage refuses at init;
 *  - a message tagged with the wrong micro-batch: MT_ERR_INTERNAL naming both, and the next step runs;
 *  - a neighbour that never answers: MT_ERR_TIMEOUT within the pipeline's timeout, naming the stage, the
 *    peer and the micro-batch.
 * Rank 1 plays the misbehaving neighbour with raw sends/receives, and afterwards completes what rank 0
 * left outstanding so both shut down cleanly.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "eqref.h"
#include "parallel/pipeline.h"
#include "runtime/rt.h"
#include "testutil.h"

static mt_pipeline_params_t params(int m) {
    mt_pipeline_params_t p = MT_PIPELINE_PARAMS_INIT;
    p.schedule = MT_PP_1F1B;
    p.microbatches = m;
    p.micro_batch = 1;
    p.seq_len = 4;
    p.timeout_s = 1.0;
    return p;
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    const mt_world_t *w = mt_rt_world();
    if (w->size != 2) {
        printf("skipped: test_pp_errors needs exactly 2 ranks, has %d\n", w->size);
        MPI_Finalize();
        return MT_TEST_SKIP;
    }
    mt_comm_params_t cp = MT_COMM_PARAMS_INIT;
    cp.name = "pp";
    cp.timeout_s = 30.0;
    mt_comm_t pp = NULL, emb = NULL;
    CHECK_OK(mt_comm_init(w->comm, &cp, &pp));
    cp.name = "emb";
    CHECK_OK(mt_comm_init(w->comm, &cp, &emb));
    eq_setup_t s;
    eq_setup_default(&s, false);
    mt_model_t m = NULL;
    CHECK_OK(mt_model_init(&s.model, &m));
    int T = 4;
    size_t msg = mt_model_act_floats(m, 1, T) + 1;
    int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tgt[8] = {2, 3, 4, 5, 6, 7, 8, 9};

    /* 1. Disagreeing stages: both refuse, naming the problem. */
    mt_pipeline_params_t p = params(w->rank == 0 ? 2 : 4);
    mt_pipeline_t pl = NULL;
    mt_status_t st = mt_pipeline_init(m, pp, emb, &p, &pl);
    CHECK(st == MT_ERR_INVALID_ARG && pl == NULL, "disagreeing stages: %s", mt_status_str(st));
    CHECK(strstr(mt_last_error_msg(), "stages disagree") != NULL, "message: %s", mt_last_error_msg());

    float *buf = malloc(msg * sizeof(float));
    /* 2. Wrong tag: stage 1 answers the activation of micro-batch 0 with a message tagged as the
     * activation of micro-batch 3. Only rank 0 runs the pipeline (its init is collective: rank 1 joins). */
    p = params(1);
    CHECK_OK(mt_pipeline_init(m, pp, emb, &p, &pl));
    if (w->rank == 0) {
        CHECK_OK(mt_pipeline_alloc_params(pl));
        st = mt_pipeline_step(pl, tok, NULL, NULL);
        CHECK(st == MT_ERR_INTERNAL, "wrong tag gave %s", mt_status_str(st));
        CHECK(strstr(mt_last_error_msg(), "expected the gradient of micro-batch 0 from stage 1 but the message is "
                                          "tagged activation of micro-batch 3") != NULL,
              "message: %s", mt_last_error_msg());
    } else {
        CHECK_OK(mt_coll_recv(pp, buf, msg, MT_COLL_F32, 0, NULL, NULL));
        CHECK(buf[msg - 1] == 1.0f, "activation of micro-batch 0 tagged %g", buf[msg - 1]);
        buf[msg - 1] = 4.0f;
        CHECK_OK(mt_coll_send(pp, buf, msg, MT_COLL_F32, 0, NULL, NULL));
        CHECK_OK(mt_pipeline_alloc_params(pl));
    }
    /* A failed step leaves nothing behind: the next one runs normally on both stages. */
    float loss = -1.0f;
    CHECK_OK(mt_pipeline_step(pl, w->rank == 0 ? tok : NULL, w->rank == 1 ? tgt : NULL, &loss));
    CHECK(loss > 0.0f && loss < 10.0f, "loss after recovery %g", loss);
    mt_pipeline_free(pl);
    pl = NULL;

    /* 3. Silent neighbour: 1F1B on stage 0 with m = 2 sends activation 0, then waits for gradient 0
     * together with sending activation 1; nobody answers within 1 s. */
    p = params(2);
    CHECK_OK(mt_pipeline_init(m, pp, emb, &p, &pl));
    if (w->rank == 0) {
        CHECK_OK(mt_pipeline_alloc_params(pl));
        double t0 = mt_now();
        st = mt_pipeline_step(pl, tok, NULL, NULL);
        double dt = mt_now() - t0;
        CHECK(st == MT_ERR_TIMEOUT, "silent neighbour gave %s", mt_status_str(st));
        CHECK(strstr(mt_last_error_msg(), "pipeline stage 0") &&
                  strstr(mt_last_error_msg(), "receiving the gradient of micro-batch 0 from stage 1"),
              "message: %s", mt_last_error_msg());
        CHECK(dt < 20.0, "the timeout took %.1f s", dt);
        printf("timeout after %.2f s: %s\n", dt, mt_last_error_msg());
    }
    MPI_Barrier(w->comm);
    if (w->rank == 1) {
        /* Complete rank 0's outstanding calls: both activations, then a gradient for its receive. */
        CHECK_OK(mt_coll_recv(pp, buf, msg, MT_COLL_F32, 0, NULL, NULL));
        CHECK_OK(mt_coll_recv(pp, buf, msg, MT_COLL_F32, 0, NULL, NULL));
        buf[msg - 1] = -1.0f;
        CHECK_OK(mt_coll_send(pp, buf, msg, MT_COLL_F32, 0, NULL, NULL));
    }
    MPI_Barrier(w->comm);
    mt_pipeline_free(pl);
    free(buf);
    mt_model_free(m);
    CHECK_OK(mt_comm_free(emb));
    CHECK_OK(mt_comm_free(pp));
    return mt_test_finish_mpi("test_pp_errors");
}
