/* The training loop's own synchronisation on the world communicator, outside the collectives API:
 * agreements on a status, broadcasts of checkpoint verdicts and manifests, gathers of shard lists, the
 * memory maxima of each step. Every call is registered with the hang watchdog (runtime/watchdog.h) as a
 * numbered call of group "job", like the collectives' calls, so a rank that never arrives is named with
 * the op and the call number and the job ends within runtime.watchdog_s instead of hanging.
 * SPDX-License-Identifier: MIT */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/job_impl.h"
#include "runtime/watchdog.h"

/* Test knob: "OP:N" makes rank MESHTRAIN_TEST_FAULT_RANK skip its N-th call named OP on the job group
 * and then idle (as a rank off doing something else would), so the watchdog must name it. */
MT_PARAM_STR(test_skip_sync, "TEST_SKIP_SYNC", NULL)
MT_PARAM(sync_fault_rank, "TEST_FAULT_RANK", 0)

static uint64_t sync_completed(void *arg) {
    return atomic_load(&((job_sync_t *)arg)->done);
}

void mt_job_sync_init(job_sync_t *s, MPI_Comm comm) {
    memset(s, 0, sizeof(*s));
    s->comm = comm;
    int size = 1;
    MPI_Comm_rank(comm, &s->rank);
    MPI_Comm_size(comm, &size);
    if (size > 1) {
        s->wd = mt_watchdog_group_register("job", comm, sync_completed, NULL, s);
    }
    const char *knob = mt_param_test_skip_sync();
    if (knob && knob[0] && size > 1 && s->rank == (int)mt_param_sync_fault_rank()) { /* 1 rank: nobody to notice */
        const char *colon = strchr(knob, ':');
        size_t l = colon ? (size_t)(colon - knob) : strlen(knob);
        snprintf(s->skip_op, sizeof(s->skip_op), "%.*s", (int)MT_MIN(l, sizeof(s->skip_op) - 1), knob);
        s->skip_n = colon ? atoll(colon + 1) : 1;
    }
}

void mt_job_sync_free(job_sync_t *s) {
    mt_watchdog_group_unregister(s->wd);
    s->wd = NULL;
}

uint64_t mt_job_sync_begin(job_sync_t *s, const char *op, size_t bytes) {
    if (s->skip_op[0] && !strcmp(op, s->skip_op) && ++s->skip_seen == s->skip_n) {
        fprintf(stderr, "rank %d: skipping job call %s #%lld (MESHTRAIN_TEST_SKIP_SYNC) and idling\n", s->rank, op,
                (long long)s->skip_n);
        fflush(stderr);
        for (;;) {
            sleep(60); /* the other ranks' watchdog must end the job long before anything here ends */
        }
    }
    uint64_t seq = ++s->issued;
    mt_watchdog_op_begin(s->wd, seq, op, bytes, -1);
    return seq;
}

void mt_job_sync_end(job_sync_t *s, uint64_t seq) {
    atomic_store(&s->done, seq);
}

static mt_status_t mpi_status(int rc, const char *op) {
    if (rc == MPI_SUCCESS) {
        return MT_OK;
    }
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return mt_error(MT_ERR_MPI, "training: %s failed: %s", op, msg);
}

static size_t type_bytes(MPI_Datatype t, int count) {
    int sz = 0;
    MPI_Type_size(t, &sz);
    return (size_t)sz * (size_t)(count > 0 ? count : 0);
}

mt_status_t mt_job_allreduce(job_sync_t *s, const char *op, const void *send, void *recv, int count, MPI_Datatype t,
                             MPI_Op red) {
    uint64_t q = mt_job_sync_begin(s, op, type_bytes(t, count));
    int rc = MPI_Allreduce(send, recv, count, t, red, s->comm);
    mt_job_sync_end(s, q);
    return mpi_status(rc, op);
}

mt_status_t mt_job_bcast(job_sync_t *s, const char *op, void *buf, int count, MPI_Datatype t, int root) {
    uint64_t q = mt_job_sync_begin(s, op, type_bytes(t, count));
    int rc = MPI_Bcast(buf, count, t, root, s->comm);
    mt_job_sync_end(s, q);
    return mpi_status(rc, op);
}

mt_status_t mt_job_gather(job_sync_t *s, const char *op, const void *send, int count, MPI_Datatype t, void *recv,
                          int root) {
    uint64_t q = mt_job_sync_begin(s, op, type_bytes(t, count));
    int rc = MPI_Gather(send, count, t, recv, count, t, root, s->comm);
    mt_job_sync_end(s, q);
    return mpi_status(rc, op);
}

mt_status_t mt_job_gatherv(job_sync_t *s, const char *op, const void *send, int count, MPI_Datatype t, void *recv,
                           const int *counts, const int *displs, int root) {
    uint64_t q = mt_job_sync_begin(s, op, type_bytes(t, count));
    int rc = MPI_Gatherv(send, count, t, recv, counts, displs, t, root, s->comm);
    mt_job_sync_end(s, q);
    return mpi_status(rc, op);
}

mt_status_t mt_job_allgather(job_sync_t *s, const char *op, const void *send, int count, MPI_Datatype t, void *recv) {
    uint64_t q = mt_job_sync_begin(s, op, type_bytes(t, count));
    int rc = MPI_Allgather(send, count, t, recv, count, t, s->comm);
    mt_job_sync_end(s, q);
    return mpi_status(rc, op);
}

mt_status_t mt_job_bcast_sleepy(job_sync_t *s, const char *op, void *buf, int count, MPI_Datatype t, int root) {
    uint64_t q = mt_job_sync_begin(s, op, type_bytes(t, count));
    MPI_Request req;
    int rc = MPI_Ibcast(buf, count, t, root, s->comm, &req);
    for (int done = 0; rc == MPI_SUCCESS && !done;) {
        rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (rc == MPI_SUCCESS && !done) {
            usleep(1000);
        }
    }
    mt_job_sync_end(s, q);
    return mpi_status(rc, op);
}

mt_status_t mt_job_agree(job_sync_t *s, const char *op, mt_status_t st) {
    int mine = (int)st, worst = 0;
    char msg[1024]; /* a failing rank keeps its own message across the reduction */
    snprintf(msg, sizeof(msg), "%s", st != MT_OK ? mt_last_error_msg() : "");
    MT_CHECK(mt_job_allreduce(s, op, &mine, &worst, 1, MPI_INT, MPI_MAX));
    if (st != MT_OK) {
        return mt_error(st, "%s", msg);
    }
    if (worst != MT_OK) {
        return mt_error((mt_status_t)worst, "another rank failed (its message is above)");
    }
    return MT_OK;
}
