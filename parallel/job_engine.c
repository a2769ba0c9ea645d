/* Adapter from the training loop's engine table (launch/job.h) to the data-parallel engines.
 * SPDX-License-Identifier: MIT */
#include "parallel/job_engine.h"

#include <stdlib.h>
#include <string.h>

#include "parallel/engine.h"
#include "runtime/alloc.h"

typedef struct {
    mt_comm_t comm;
    mt_engine_t e;
} job_ctx_t;

static void pj_free(void *ctx) {
    job_ctx_t *c = ctx;
    if (c) {
        mt_engine_free(c->e);
        mt_comm_free(c->comm);
        free(c);
    }
}

static mt_status_t pj_init(const mt_job_info_t *info, void **ctx) {
    *ctx = NULL;
    const mt_config_t *cfg = info->cfg;
    mt_engine_params_t ep = MT_ENGINE_PARAMS_INIT;
    const char *kind = mt_config_str(cfg, "parallel.engine");
    if (!mt_engine_kind_parse(kind, &ep.kind)) {
        return mt_error(MT_ERR_INVALID_ARG, "parallel.engine = \"%s\": expected \"dp\", \"ddp\" or \"zero\"", kind);
    }
    ep.zero_stage = (int)mt_config_int(cfg, "parallel.zero_stage");
    ep.bucket_mb = mt_config_float(cfg, "parallel.bucket_mb");
    ep.persist_threshold = mt_config_int(cfg, "parallel.zero_persist_threshold");
    ep.grad_accum = (int)info->grad_accum;
    ep.optim = info->optim;
    int world = 0;
    MPI_Comm_size(info->comm, &world);
    if (info->dp_size != world) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "parallel.engine = \"%s\" over dp = %d of %d ranks: the data-parallel engines here run over "
                        "the whole world (set parallel.tp = parallel.pp = 1)",
                        kind, info->dp_size, world);
    }
    if (info->init_llmc) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "model.init = \"llmc:%s\": loading a checkpoint into a data-parallel engine is not supported "
                        "yet (use model.init = \"random\")",
                        info->init_llmc);
    }
    job_ctx_t *c = calloc(1, sizeof(*c));
    if (!c) {
        return mt_error(MT_ERR_OOM, "parallel engine: out of memory");
    }
    mt_comm_params_t cp = MT_COMM_PARAMS_INIT;
    cp.name = "dp";
    mt_status_t st = MT_OK;
    MT_CHECK_GOTO(mt_comm_init(info->comm, &cp, &c->comm), st, fail);
    MT_CHECK_GOTO(mt_engine_init(info->model, c->comm, &ep, &c->e), st, fail);
    *ctx = c;
    return MT_OK;
fail:
    pj_free(c);
    return st;
}

static mt_status_t pj_zero_grads(void *ctx) {
    return mt_engine_zero_grads(((job_ctx_t *)ctx)->e);
}

static mt_status_t pj_finish_grads(void *ctx) {
    return mt_engine_finish_grads(((job_ctx_t *)ctx)->e);
}

static mt_status_t pj_grad_sumsq(void *ctx, double *total) {
    return mt_engine_grad_sumsq(((job_ctx_t *)ctx)->e, total);
}

static mt_status_t pj_step(void *ctx, float lr, float grad_scale) {
    return mt_engine_step(((job_ctx_t *)ctx)->e, lr, grad_scale);
}

static mt_status_t pj_reduce_loss(void *ctx, double *loss) {
    return mt_engine_reduce_loss(((job_ctx_t *)ctx)->e, loss);
}

static const mt_job_engine_t parallel_engine = {
    .name = "parallel",
    .init = pj_init,
    .zero_grads = pj_zero_grads,
    .finish_grads = pj_finish_grads,
    .grad_sumsq = pj_grad_sumsq,
    .step = pj_step,
    .reduce_loss = pj_reduce_loss,
    .free = pj_free,
};

const mt_job_engine_t *mt_parallel_job_engine(void) {
    return &parallel_engine;
}
