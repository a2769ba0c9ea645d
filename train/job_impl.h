/* Private parts of the training loop shared by job.c (the loop), job_metrics.c (progress lines, the
 * metrics file, MFU, the summary), job_profile.c (trace and memory profile of chosen steps) and
 * job_ckpt.c (checkpoints).
 * SPDX-License-Identifier: MIT */
#ifndef MT_JOB_IMPL_H
#define MT_JOB_IMPL_H

#include "train/job.h"
#include "models/data/data.h"
#include "runtime/alloc.h"
#include "runtime/precision.h"

#include <stdatomic.h>

/* Figures of one step, as rank 0 reports them (times are this rank's; memory the maximum over ranks). */
typedef struct {
    int64_t step; /* 1-based */
    double loss, grad_norm;
    float lr;
    double step_s, data_s, fwd_s, bwd_s, comm_s, opt_s;
    int64_t mem[MT_MEM_NCAT]; /* bytes now by category, max over ranks */
    int64_t mem_peak;         /* highest total so far, max over ranks */
    bool mem_device;          /* mem and mem_peak are device memory (the engine's device_mem) */
    int64_t mem_reserved;     /* device: bytes the allocator holds from the driver, max over ranks */
    int64_t host_peak;        /* device: the host allocator's highest total so far, max over ranks */
    bool has_val;
    double val_loss;
    int64_t data_rows;                   /* rows of the training batch this rank's loader read (0: none) */
    bool has_bytes;                      /* the engine reports its communication (comm_bytes) */
    double bytes_model, bytes_other;     /* bytes this rank sent this step (mt_job_engine_t.comm_bytes) */
    bool has_groups;                     /* and by group (comm_bytes_groups) */
    double bytes_tp, bytes_pp, bytes_dp;
    bool has_energy;  /* this rank's device energy is known (engine step_energy) */
    double energy_j;  /* this rank's; mt_job_metrics_step makes it the sum over ranks */
    float loss_scale; /* the loss scale this step's backward used (1 unless precision.compute = fp16) */
    bool skipped;     /* no optimizer update: an fp16 overflow, or a non-finite step with train.on_nan = skip */
} mt_step_rec_t;

/* The loop's own MPI calls on the world communicator, each registered with the hang watchdog as a
 * numbered call of group "job" (job_sync.c). */
typedef struct job_sync {
    MPI_Comm comm;
    int rank;
    struct mt_wd_group *wd;   /* NULL for a world of one rank (nothing can wait on a peer) */
    _Atomic uint64_t done;    /* calls 1..done are complete (read by the watchdog thread) */
    uint64_t issued;          /* calls issued (the loop's thread only) */
    char skip_op[32];         /* MESHTRAIN_TEST_SKIP_SYNC, parsed on the fault rank */
    int64_t skip_n, skip_seen;
} job_sync_t;

typedef struct job_metrics job_metrics_t;
typedef struct job_profile job_profile_t;
typedef struct job_ckpt job_ckpt_t;

typedef struct {
    const mt_config_t *cfg;
    mt_settings_t set; /* read once from cfg (parallel/settings.h); info.set points here */
    const mt_job_opts_t *opts;
    const mt_job_engine_t *engine;
    void *ectx;
    mt_job_info_t info;
    mt_lr_sched_t sched;
    mt_model_t model;
    mt_acts_t acts;
    mt_data_t train, val;
    int rank, world;
    int stop_signal; /* the signal every rank agreed to stop on at a step boundary (0: none) */
    MPI_Comm comm;
    FILE *out;              /* progress on rank 0, else NULL */
    int64_t start_step;     /* first step to run (0, or the step a checkpoint was written after) */
    double flops_per_token; /* of the whole (unsharded) model, for MFU */
    int64_t n_params;       /* of the whole model */
    job_metrics_t *metrics;
    job_profile_t *profile;
    job_ckpt_t *ckpt;
    job_sync_t sync;  /* the loop's watched MPI calls over comm (mt_job_sync_init) */
    bool scatter;    /* the engine's root loads the dp group's batch and scatters micro-batches to it */
    int32_t *mb_buf; /* scatter: this rank's micro-batch, inputs then targets (2 x micro_batch x seq_len) */
    mt_prec_t prec;           /* precision.compute */
    mt_loss_scaler_t scaler;  /* fp16: dynamic loss scale (saved in checkpoints); else fixed at 1 */
} job_t;

/* The loss scaler in effect for reports and checkpoints: the engine's own (a device engine scales on its
 * device; mt_job_engine_t.loss_scaler) or the loop's j->scaler. */
static inline mt_loss_scaler_t *mt_job_scaler(job_t *j) {
    mt_loss_scaler_t *s = j->engine->loss_scaler ? j->engine->loss_scaler(j->ectx) : NULL;
    return s ? s : &j->scaler;
}

/* ---- the loop's synchronisation (job_sync.c) ----------------------------------------------------
 * Every blocking MPI call the loop makes outside collectives/ goes through these: each is call #n (1, 2,
 * ... in issue order) of the watchdog group "job" over comm, named by op (a static string, at most 23
 * characters, shown in the desync report: "agree_setup", "mem_max", ...), so a rank that never arrives
 * is reported by rank, op and call number, and the job ends within runtime.watchdog_s. Same arguments
 * and errors as the MPI call they make (MT_ERR_MPI with op and MPI's message). Test knob
 * MESHTRAIN_TEST_SKIP_SYNC = "OP:N": rank MESHTRAIN_TEST_FAULT_RANK skips its N-th call named OP and idles. */

/* Registers the group over comm (nothing to register for a world of one rank; should registering run
 * out of memory, the calls are made unwatched). Local. */
void mt_job_sync_init(job_sync_t *s, MPI_Comm comm);
void mt_job_sync_free(job_sync_t *s);
/* A blocking call on comm made by another module (mt_nan_agree): bracket it with begin (returns the call
 * number; bytes: this rank's payload) and end. */
uint64_t mt_job_sync_begin(job_sync_t *s, const char *op, size_t bytes);
void mt_job_sync_end(job_sync_t *s, uint64_t seq);
mt_status_t mt_job_allreduce(job_sync_t *s, const char *op, const void *send, void *recv, int count, MPI_Datatype t,
                             MPI_Op red);
mt_status_t mt_job_bcast(job_sync_t *s, const char *op, void *buf, int count, MPI_Datatype t, int root);
/* As mt_job_bcast, but the waiting ranks sleep in 1 ms steps instead of spinning (while the root measures). */
mt_status_t mt_job_bcast_sleepy(job_sync_t *s, const char *op, void *buf, int count, MPI_Datatype t, int root);
mt_status_t mt_job_allgather(job_sync_t *s, const char *op, const void *send, int count, MPI_Datatype t, void *recv);
mt_status_t mt_job_gather(job_sync_t *s, const char *op, const void *send, int count, MPI_Datatype t, void *recv,
                          int root);
mt_status_t mt_job_gatherv(job_sync_t *s, const char *op, const void *send, int count, MPI_Datatype t, void *recv,
                           const int *counts, const int *displs, int root);
/* Every rank returns the same verdict: st where st failed (its message kept), else the numerically
 * largest status of all ranks with "another rank failed (its message is above)". */
mt_status_t mt_job_agree(job_sync_t *s, const char *op, mt_status_t st);

/* ---- metrics (job_metrics.c) ------------------------------------------------------------------ */

/* Opens metrics.jsonl (rank 0) and the per-rank files, measures or reads the CPU's sgemm peak for MFU.
 * Collective over j->comm. MT_ERR_INVALID_ARG naming the key when a file cannot be created. */
mt_status_t mt_job_metrics_init(job_t *j, job_metrics_t **out);
/* Completes rec (memory maxima over ranks: collective), prints the progress line (every log_every
 * steps, the first and the last) and the validation line, appends the JSON line(s). */
mt_status_t mt_job_metrics_step(job_metrics_t *m, job_t *j, mt_step_rec_t *rec, bool last);
/* Prints the summary (collective: peak memory per category, max over ranks); fills res's summary fields. */
mt_status_t mt_job_metrics_finish(job_metrics_t *m, job_t *j, mt_job_result_t *res);
void mt_job_metrics_free(job_metrics_t *m);
/* The job's peak FLOP/s (0 when unknown) and where it came from, for the header. */
double mt_job_metrics_peak(const job_metrics_t *m, const char **source);

/* ---- profiler (job_profile.c) ------------------------------------------------------------------ */

/* Parses profile.*; syncs the trace clocks (collective) when profile.trace is set. *out NULL when no
 * profiling is configured. MT_ERR_INVALID_ARG for a bad profile.steps. */
mt_status_t mt_job_profile_init(job_t *j, job_profile_t **out);
/* Installs the tracing hooks around the engine's (after the engine's init). */
void mt_job_profile_hooks(job_profile_t *p, job_t *j);
/* Around every step s (0-based): starts recording at the first profiled step; after the last one,
 * stops and writes the trace (collective) and this rank's memory history. */
void mt_job_profile_step_begin(job_profile_t *p, int64_t s);
mt_status_t mt_job_profile_step_end(job_profile_t *p, job_t *j, int64_t s);
void mt_job_profile_free(job_profile_t *p, job_t *j);

/* ---- checkpoints (job_ckpt.c) ------------------------------------------------------------------- */

/* Parses checkpoint.*; finds the checkpoint to resume from (checkpoint.resume) and validates its
 * manifest against the model. Collective. *out NULL when checkpoints are off and nothing is resumed. */
mt_status_t mt_job_ckpt_init(job_t *j, job_ckpt_t **out);
/* Loads the resume checkpoint (if any) into the engine's storage and sets j->start_step. Collective. */
mt_status_t mt_job_ckpt_resume(job_ckpt_t *c, job_t *j);
/* The step directory the job resumed from, or NULL. */
const char *mt_job_ckpt_resumed_from(const job_ckpt_t *c);
/* Writes a checkpoint after step s (0-based) when checkpoint.every says so or s is the last. Collective. */
mt_status_t mt_job_ckpt_after_step(job_ckpt_t *c, job_t *j, int64_t s, bool last);
void mt_job_ckpt_free(job_ckpt_t *c);
/* The step directory of the last complete checkpoint this run wrote or resumed from ("" if none). */
const char *mt_job_ckpt_last(const job_ckpt_t *c);
/* model.init = "llmc:PATH" for engines that store the weights in their own layout (everything but the
 * single-process engine, which loads the file itself): every rank reads the file into a whole model
 * and copies the boxes its engine holds (ckpt_pieces). Local. */
mt_status_t mt_job_init_llmc(job_t *j);

#endif
