/* The hang watchdog: every collective and point-to-point call is registered (communicator, op, bytes,
 * sequence number, start time); a thread notices a call pending longer than runtime.watchdog_s, asks
 * every member of that group over a side channel which call it has reached, prints ONE desync report
 * naming the ranks that never arrived and the call they were expected to join, and aborts the job.
 * The side channel is a private duplicate of MPI_COMM_WORLD used only by watchdog threads (it needs
 * MPI_THREAD_MULTIPLE; see docs/reliability.md for the choice and its limits).
 * SPDX-License-Identifier: MIT */
#ifndef MT_WATCHDOG_H
#define MT_WATCHDOG_H

#include <mpi.h>

#include "mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exit status of a job the watchdog ended (a hang, a desync or a lost rank). */
#define MT_EXIT_WATCHDOG 3

typedef struct mt_wd_group *mt_wd_group_t;

/* The highest sequence number n such that calls 1..n of the group are complete. Called from the
 * watchdog thread: must be thread-safe and must not block for long. */
typedef uint64_t (*mt_wd_completed_fn)(void *arg);
/* Cancels what the group's backend can cancel (ncclCommAbort) just before the job is ended; NULL: none. */
typedef void (*mt_wd_abort_fn)(void *arg);

typedef struct {
    size_t size;             /* = sizeof(mt_watchdog_params_t) */
    double timeout_s;        /* a call pending longer is a hang; <= 0: MESHTRAIN_WATCHDOG_S (default 600) */
    double poll_s;           /* how often pending calls are checked; <= 0: timeout/8 within [0.05, 1] s */
    double answer_s;         /* how long peers get to answer the desync query; <= 0: MESHTRAIN_WATCHDOG_ANSWER_S
                              * (default 5) */
    int exit_code;           /* status the job ends with after a report (MT_EXIT_WATCHDOG) */
    const char *report_path; /* the reporting rank also writes the report here (copied); a name ending in
                              * ".json" gets a Chrome trace-event file with the report as an instant event
                              * (the job's own trace is never written by an aborted job); NULL: stderr only */
} mt_watchdog_params_t;

#define MT_WATCHDOG_PARAMS_INIT                                                                                        \
    { sizeof(mt_watchdog_params_t), 0.0, 0.0, 0.0, MT_EXIT_WATCHDOG, NULL }

/* Starts the watchdog thread of this process. Collective over MPI_COMM_WORLD (duplicates it as the side
 * channel). Without MPI_THREAD_MULTIPLE the thread still detects hangs but reports only this rank's
 * view (a WARN says so at start). Calling it again while running is MT_ERR_INVALID_USAGE.
 * Errors: MT_ERR_INVALID_ARG (params), MT_ERR_MPI, MT_ERR_SYSTEM (thread). */
mt_status_t mt_watchdog_start(const mt_watchdog_params_t *params);

/* Stops the thread. Collective over MPI_COMM_WORLD: the thread keeps answering peers until every rank
 * has called stop (an MPI_Ibarrier on the side channel), so a rank that finishes early never leaves a
 * peer's query unanswered; gives up after the timeout with a WARN. No-op when not running. */
mt_status_t mt_watchdog_stop(void);

bool mt_watchdog_running(void);

/* Registers a group (a communicator) so its calls are watched. name is shown in reports (copied);
 * comm gives the members (translated to MPI_COMM_WORLD ranks; the same name and members in the same
 * order of registration identify the group across ranks); completed reports progress; abort_fn may be
 * NULL. Works whether or not the watchdog runs. Returns NULL on allocation failure (then nothing is
 * watched for that group; op_begin and unregister accept NULL). */
mt_wd_group_t mt_watchdog_group_register(const char *name, MPI_Comm comm, mt_wd_completed_fn completed,
                                         mt_wd_abort_fn abort_fn, void *arg);

/* Stops watching a group; after it returns the callbacks are never called again. NULL: no-op. */
void mt_watchdog_group_unregister(mt_wd_group_t g);

/* Call seq (1, 2, ... in issue order) of the group starts now: op is a static string ("all_reduce"),
 * bytes the payload of this rank, peer the group rank of a send/recv partner (-1 for collectives).
 * Cheap (a mutex and a few stores); thread-safe. g NULL: no-op. */
void mt_watchdog_op_begin(mt_wd_group_t g, uint64_t seq, const char *op, size_t bytes, int peer);

/* Test knob for the fault tests, called by the training loop once per step (1-based) before the step's
 * work: on rank MESHTRAIN_TEST_FAULT_RANK (default 0), at step MESHTRAIN_TEST_HANG_STEP the process stops
 * doing anything (sleeps forever, outside any collective: the others hang in the next one), and at step
 * MESHTRAIN_TEST_KILL_STEP it dies by SIGKILL (a kill -9 mid-step). Both 0 (default): nothing. */
void mt_watchdog_test_fault(int64_t step, int rank);

/* A report of this rank's view: every registered group with pending calls (used in the no-side-channel
 * case and by tests). Writes at most n bytes (NUL-terminated); returns the number of groups with a
 * pending call. */
int mt_watchdog_local_view(char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* MT_WATCHDOG_H */
