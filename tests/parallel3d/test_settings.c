/* The job's settings read once (parallel/settings.h): every parallel.*, precision.* and optimizer.* key of a
 * loaded config lands in its typed field (defaults, the file, overrides, values the load derives for a
 * world), the helpers agree with the training path's rules, and the planner's layout follows them.
 * SPDX-License-Identifier: MIT */
#include <string.h>

#include "parallel/settings.h"
#include "plan/plan.h"
#include "testutil.h"

/* The embedded default job with overrides, loaded for a world of `world` ranks. */
static mt_config_t *load(int world, int n, char **over) {
    mt_config_t *cfg = NULL;
    CHECK_OK(mt_config_load(MT_CONFIG_EMBEDDED, n, over, world, &cfg, stderr));
    return cfg;
}

static void defaults(void) {
    mt_config_t *cfg = load(0, 0, NULL);
    mt_settings_t s;
    CHECK_OK(mt_settings_read(cfg, &s));
    CHECK(s.par.tp == (int)mt_config_int(cfg, "parallel.tp") && s.par.pp == (int)mt_config_int(cfg, "parallel.pp"),
          "tp %d pp %d", s.par.tp, s.par.pp);
    CHECK(!strcmp(s.par.order, mt_config_str(cfg, "parallel.order")), "order %s", s.par.order);
    CHECK(!s.par.bucket_mb_set && !s.par.persist_threshold_set && !s.par.tp_comm_chunks_set, "defaults marked set");
    CHECK(s.par.dp_reduce == MT_DP_REDUCE_AUTO, "dp_reduce %d", (int)s.par.dp_reduce);
    CHECK(s.prec.compute == MT_PREC_FP32, "compute %d", (int)s.prec.compute);
    CHECK(s.lr.total_steps == mt_config_int(cfg, "train.steps"), "lr over train.steps");
    CHECK(s.grad_clip == (float)mt_config_float(cfg, "optimizer.grad_clip"), "grad_clip %g", (double)s.grad_clip);
    mt_config_free(cfg);
    /* Evaluation's chunk: none without it, else train.eval_batches capped at the engines' loss slots. */
    char *none[] = {"--train.eval_every=0", "--train.eval_batches=7"};
    cfg = load(0, 2, none);
    CHECK_OK(mt_settings_read(cfg, &s));
    CHECK(s.eval_chunk == 0, "eval_chunk %lld without evaluation", (long long)s.eval_chunk);
    mt_config_free(cfg);
    char *few[] = {"--train.eval_every=2", "--train.eval_batches=7"};
    char *many[] = {"--train.eval_every=2", "--train.eval_batches=100000"};
    cfg = load(0, 2, few);
    CHECK_OK(mt_settings_read(cfg, &s));
    CHECK(s.eval_chunk == 7, "eval_chunk %lld for 7 batches", (long long)s.eval_chunk);
    mt_config_free(cfg);
    cfg = load(0, 2, many);
    CHECK_OK(mt_settings_read(cfg, &s));
    CHECK(s.eval_chunk == MT_SETTINGS_EVAL_CHUNK, "eval_chunk %lld for 100000 batches", (long long)s.eval_chunk);
    mt_config_free(cfg);
}

static void overrides(void) {
    char *over[] = {"--parallel.tp=2",
                    "--parallel.pp=2",
                    "--parallel.order=pp-tp-dp",
                    "--parallel.engine=zero",
                    "--parallel.zero_stage=3",
                    "--parallel.bucket_mb=0.5",
                    "--parallel.zero_persist_threshold=64",
                    "--parallel.schedule=gpipe",
                    "--parallel.sequence_parallel=true",
                    "--parallel.tp_comm_chunks=4",
                    "--parallel.dp_reduce=allreduce",
                    "--parallel.stage_layers=1,1",
                    "--model.n_layer=2",
                    "--precision.compute=bf16",
                    "--precision.init_scale=1024",
                    "--precision.scale_window=7",
                    "--optimizer.kind=sgd",
                    "--optimizer.momentum=0.5",
                    "--optimizer.schedule=constant",
                    "--optimizer.lr=0.25",
                    "--optimizer.warmup_steps=3",
                    "--optimizer.grad_clip=0",
                    "--train.global_batch=8",
                    "--train.micro_batch=0",
                    "--train.grad_accum=2"};
    mt_config_t *cfg = load(8, (int)MT_ARRAY_LEN(over), over);
    mt_settings_t s;
    CHECK_OK(mt_settings_read(cfg, &s));
    const mt_parallel_settings_t *p = &s.par;
    CHECK(p->tp == 2 && p->pp == 2 && p->dp == 2, "tp %d pp %d dp %d (dp derived from 8 ranks)", p->tp, p->pp, p->dp);
    CHECK(!strcmp(p->order, "pp-tp-dp"), "order %s", p->order);
    CHECK(p->engine == MT_ENGINE_ZERO && p->zero_stage == 3 && mt_settings_zero(p) == 3, "zero-3");
    CHECK(p->bucket_mb == 0.5 && p->bucket_mb_set, "bucket_mb %g", p->bucket_mb);
    CHECK(p->persist_threshold == 64 && p->persist_threshold_set, "persist_threshold");
    CHECK(p->schedule == MT_PP_GPIPE && !strcmp(p->stage_layers, "1,1"), "schedule, stage_layers");
    CHECK(p->sequence_parallel && p->tp_comm_chunks == 4 && p->tp_comm_chunks_set, "sp, tp_comm_chunks");
    CHECK(p->dp_reduce == MT_DP_REDUCE_ALLREDUCE && !mt_settings_dp_engine(p, 2), "allreduce");
    CHECK(s.prec.compute == MT_PREC_BF16 && s.prec.init_scale == 1024.0f && s.prec.scale_window == 7, "precision");
    CHECK(s.optim.kind == MT_OPTIM_SGD && s.optim.momentum == 0.5f, "sgd with momentum");
    CHECK(s.lr.kind == MT_LR_CONSTANT && s.lr.lr == 0.25f && s.lr.warmup_steps == 3, "lr schedule");
    CHECK(s.grad_clip == 0.0f, "grad_clip off");
    mt_plan_layout_t l;
    mt_plan_layout_from_settings(p, &l);
    CHECK(l.tp == 2 && l.pp == 2 && l.dp == 2 && l.sp && l.schedule == MT_PLAN_GPIPE, "plan layout shape");
    CHECK(l.engine == MT_PLAN_ALLREDUCE && !strcmp(l.order, "pp-tp-dp"), "plan engine %d order %s", (int)l.engine,
          l.order);
    mt_config_free(cfg);
}

/* parallel.dp_reduce and the ZeRO stage as the training path reads them. */
static void rules(void) {
    mt_parallel_settings_t p = {.tp = 2,
                                .pp = 1,
                                .dp = 2,
                                .order = "tp-dp-pp",
                                .engine = MT_ENGINE_DDP,
                                .zero_stage = 2,
                                .dp_reduce = MT_DP_REDUCE_AUTO};
    CHECK(mt_settings_zero(&p) == 0, "ddp has no ZeRO stage");
    CHECK(mt_settings_dp_engine(&p, 2) && !mt_settings_dp_engine(&p, 1), "auto: the engine only with dp > 1");
    mt_plan_layout_t l;
    mt_plan_layout_from_settings(&p, &l);
    CHECK(l.engine == MT_PLAN_DDP && l.schedule == MT_PLAN_1F1B, "ddp over dp 2");
    p.dp = 1;
    mt_plan_layout_from_settings(&p, &l);
    CHECK(l.engine == MT_PLAN_ALLREDUCE, "tp 2 x dp 1: the built-in path");
    p.engine = MT_ENGINE_ZERO;
    p.dp = 4;
    p.tp = 1;
    p.dp_reduce = MT_DP_REDUCE_ENGINE;
    CHECK(mt_settings_zero(&p) == 2 && mt_settings_dp_engine(&p, 1), "zero-2, dp_reduce = engine");
    mt_plan_layout_from_settings(&p, &l);
    CHECK(l.engine == MT_PLAN_ZERO2, "plan zero-2");
}

int main(void) {
    defaults();
    overrides();
    rules();
    return mt_test_finish("test_settings");
}
