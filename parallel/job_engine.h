/* The data-parallel engines behind the training loop's engine table (launch/job.h): pass
 * mt_parallel_job_engine() as mt_job_opts_t.engine and the config's parallel.engine, zero_stage,
 * bucket_mb and zero_persist_threshold choose and shape the engine.
 * SPDX-License-Identifier: MIT */
#ifndef MT_PARALLEL_JOB_ENGINE_H
#define MT_PARALLEL_JOB_ENGINE_H

#include "launch/job.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The engine table. init creates the data-parallel communicator over the job's ranks (tp = pp = 1:
 * all of them) and an mt_engine_t from the parallel.* keys; the rest map one to one onto
 * mt_engine_zero_grads / finish_grads / grad_sumsq / step / reduce_loss. Under this loop every rank
 * loads its own rows, so DP's root-scatter data path (mt_engine_scatter_batch) is not used here.
 * init fails with MT_ERR_INVALID_ARG when dp is not the whole world (a mesh with tp or pp > 1) or
 * model.init loads a checkpoint (not supported by the data-parallel engines yet). */
const mt_job_engine_t *mt_parallel_job_engine(void);

#ifdef __cplusplus
}
#endif
#endif /* MT_PARALLEL_JOB_ENGINE_H */
