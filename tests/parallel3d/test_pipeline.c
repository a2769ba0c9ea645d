/* Pipeline equivalence: on pp = world ranks, GPipe and 1F1B with 1, 2, 4 and 8 micro-batches train the
 * tiny GPT-2 for 5 steps; every step's loss and the final parameters (gathered to rank 0) must match
 * the single-process run (SGD: 1e-5 relative, AdamW: 1e-4; parameters by ||a-b||/||b|| per tensor),
 * the two copies of the tied embedding must stay bit-identical, each stage must hold exactly the
 * schedule's number of micro-batches (m for GPipe, min(pp - stage, m) for 1F1B), and 1F1B's activation
 * peak must be below GPipe's wherever it holds fewer micro-batches.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "eqref.h"
#include "parallel/pipeline.h"
#include "runtime/alloc.h"
#include "runtime/mesh.h"
#include "runtime/rt.h"
#include "testutil.h"

typedef struct {
    mt_comm_t pp, emb;
    int rank, size;
} comms_t;

/* Runs the pipeline for s->steps steps; rank 0 compares with the reference. Returns the activation
 * peak (bytes above what was allocated before) of this rank. */
static int64_t run_case(const comms_t *c, const eq_setup_t *s, mt_pp_schedule_t sched, int m, const double *ref_loss,
                        mt_model_t ref, double tol, const char *stage_layers) {
    mt_model_t model = NULL;
    mt_pipeline_t pl = NULL;
    mt_optim_t opt = NULL;
    int B = s->global_batch / m, T = s->seq_len, N = s->global_batch * T;
    int32_t *tok = malloc((size_t)N * sizeof(int32_t)), *tgt = malloc((size_t)N * sizeof(int32_t));
    mt_mem_stats_t ms;
    mt_mem_stats(MT_MEM_HOST, &ms);
    int64_t base = ms.current[MT_MEM_ACTIVATIONS];
    mt_mem_reset_peak(MT_MEM_HOST);
    CHECK_OK(mt_model_init(&s->model, &model));
    mt_pipeline_params_t pp = MT_PIPELINE_PARAMS_INIT;
    pp.schedule = sched;
    pp.microbatches = m;
    pp.micro_batch = B;
    pp.seq_len = T;
    pp.timeout_s = 60.0;
    pp.stage_layers = stage_layers;
    CHECK_OK(mt_pipeline_init(model, c->pp, c->emb, &pp, &pl));
    CHECK_OK(mt_pipeline_alloc_params(pl));
    CHECK_OK(mt_optim_init(&s->optim, &opt));
    CHECK_OK(eq_optim_add_bound(opt, model, NULL));
    const char *name = mt_pp_schedule_name(sched);
    for (int step = 0; step < s->steps; step++) {
        eq_batch(s, step, 0, s->global_batch, tok, tgt);
        mt_model_zero_grads(model);
        float loss = -1.0f;
        CHECK_OK(mt_pipeline_step(pl, tok, tgt, &loss));
        CHECK_OK(mt_optim_step(opt, s->lr, 1.0f));
        if (c->rank == 0) {
            CHECK_CLOSE(loss, ref_loss[step], tol, 0.0);
            if (step == 0 || step == s->steps - 1) {
                printf("pp=%d %s m=%d step %d: loss %.7f (serial %.7f)\n", c->size, name, m, step, loss,
                       ref_loss[step]);
            }
        }
    }
    mt_pipeline_stats_t st;
    mt_pipeline_stats(pl, &st);
    int stage = mt_pipeline_stage(pl);
    int want = mt_pipeline_max_in_flight(sched, c->size, stage, m);
    CHECK(st.max_in_flight == want, "pp=%d %s m=%d stage %d held %d micro-batches, schedule bound %d", c->size, name, m,
          stage, st.max_in_flight, want);
    CHECK(st.n_acts == want, "stage %d allocated %d activation objects, expected %d", stage, st.n_acts, want);
    int64_t msgs = (stage > 0) + (stage < c->size - 1);
    CHECK(st.n_sends == msgs * m && st.n_recvs == msgs * m, "stage %d: %lld sends %lld recvs, expected %lld each",
          stage, (long long)st.n_sends, (long long)st.n_recvs, (long long)(msgs * m));
    mt_mem_stats(MT_MEM_HOST, &ms);
    int64_t peak = ms.peak[MT_MEM_ACTIVATIONS] - base;

    /* Final parameters, gathered to rank 0, against the serial run. */
    for (int i = 0; i < mt_model_n_params(model); i++) {
        mt_param_t *p = mt_model_param(model, i);
        float *buf = c->rank == 0 ? malloc(p->numel * sizeof(float)) : NULL;
        CHECK_OK(mt_pipeline_gather_param(pl, i, 0, buf));
        if (c->rank == 0) {
            const mt_param_t *r = mt_model_param(ref, i);
            double e = 0.0;
            bool ok = eq_param_close(p->name, buf, r->data, r->numel, s->model.n_embd, tol, eq_key_bound(s), &e);
            CHECK(strcmp(r->name, p->name) == 0 && ok, "pp=%d %s m=%d: parameter %s differs by %.3g (tol %.0e)",
                  c->size, name, m, p->name, e, tol);
        }
        free(buf);
    }
    /* The tied embedding's copies on the first and the last stage are identical. */
    int wte = mt_model_find_param(model, "wte");
    if (c->size > 1 && wte >= 0 && (stage == 0 || stage == c->size - 1)) {
        mt_param_t *p = mt_model_param(model, wte);
        CHECK(p->data != NULL, "stage %d has no wte copy", stage);
        if (stage == c->size - 1) {
            CHECK_OK(mt_coll_send(c->pp, p->data, p->numel, MT_COLL_F32, 0, NULL, NULL));
        } else {
            float *other = malloc(p->numel * sizeof(float));
            CHECK_OK(mt_coll_recv(c->pp, other, p->numel, MT_COLL_F32, c->size - 1, NULL, NULL));
            CHECK(memcmp(other, p->data, p->numel * sizeof(float)) == 0,
                  "pp=%d %s m=%d: the last stage's wte differs from the first stage's", c->size, name, m);
            free(other);
        }
    } else if (c->size > 1 && stage != 0 && stage != c->size - 1) {
        CHECK(mt_model_param(model, wte)->data == NULL, "middle stage %d holds wte", stage);
    }
    mt_optim_free(opt);
    mt_pipeline_free(pl);
    mt_model_free(model);
    free(tok);
    free(tgt);
    return peak;
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    const mt_world_t *w = mt_rt_world();
    comms_t c = {NULL, NULL, w->rank, w->size};
    mt_mesh_t *mesh = NULL;
    CHECK_OK(mt_mesh_create(w->size, 1, w->size, 1, "tp-dp-pp", &mesh));
    mt_comm_params_t cp = MT_COMM_PARAMS_INIT;
    cp.timeout_s = 60.0;
    CHECK_OK(mt_comm_init_mesh(w->comm, mesh, MT_AXIS_BIT(MT_AXIS_PP), &cp, &c.pp));
    int er[2];
    int ne = mt_mesh_embedding_group(mesh, w->rank, er);
    if (ne == 2 && (w->rank == er[0] || w->rank == er[1])) {
        cp.name = "emb";
        CHECK_OK(mt_comm_init_ranks(w->comm, er, 2, &cp, &c.emb));
    }

    const int ms[4] = {1, 2, 4, 8};
    for (int adamw = 0; adamw < 2; adamw++) {
        eq_setup_t s;
        eq_setup_default(&s, adamw);
        double tol = adamw ? 1e-4 : 1e-5;
        double ref_loss[16];
        mt_model_t ref = NULL;
        if (w->rank == 0) {
            CHECK_OK(eq_serial_run(&s, ref_loss, &ref));
        }
        int64_t peak[2][4];
        for (int sched = 0; sched < 2; sched++) {
            for (int k = 0; k < 4; k++) {
                peak[sched][k] =
                    run_case(&c, &s, sched == 0 ? MT_PP_GPIPE : MT_PP_1F1B, ms[k], ref_loss, ref, tol, NULL);
            }
        }
        /* 1F1B holds min(pp - stage, m) micro-batches, GPipe m: less memory wherever pp - stage < m. */
        for (int k = 0; k < 4; k++) {
            int stage = mt_comm_rank(c.pp);
            if (w->size - stage < ms[k]) {
                CHECK(peak[1][k] < peak[0][k], "stage %d m=%d: 1F1B activation peak %lld >= GPipe's %lld", stage, ms[k],
                      (long long)peak[1][k], (long long)peak[0][k]);
            }
            if (adamw == 0 && k == 3) {
                printf("rank %d (stage %d) m=8: activation peak GPipe %lld B, 1F1B %lld B\n", w->rank, stage,
                       (long long)peak[0][k], (long long)peak[1][k]);
            }
        }
        /* A split by hand (parallel.stage_layers): the first stage holds only the embedding. */
        run_case(&c, &s, MT_PP_1F1B, 4, ref_loss, ref, tol, w->size == 2 ? "0,4" : "0,1,2,1");
        mt_model_free(ref);
    }
    CHECK_OK(mt_comm_free(c.emb));
    CHECK_OK(mt_comm_free(c.pp));
    mt_mesh_free(mesh);
    return mt_test_finish_mpi("test_pipeline");
}
