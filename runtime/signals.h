/* Graceful stop on SIGTERM / SIGINT / SIGUSR1 (Slurm pre-emption, `scancel`, `srun --signal`, Ctrl-C,
 * `mpirun` forwarding): the handler only records the signal; the training loop asks at each step
 * boundary whether ANY rank got one (an all-reduce, so every rank stops at the same step), writes a
 * checkpoint if checkpoint.on_signal, and exits with 128 + the signal number on every rank.
 * A second signal of the same kind while the first is pending ends the process at once (default action).
 * SPDX-License-Identifier: MIT */
#ifndef MT_SIGNALS_H
#define MT_SIGNALS_H

#include <mpi.h>

#include "mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Installs the handlers (SA_RESTART: interrupted system calls resume). Idempotent. Errors:
 * MT_ERR_SYSTEM if sigaction fails. */
mt_status_t mt_signals_install(void);

/* Puts back the handlers that were there before mt_signals_install and forgets any pending signal. */
void mt_signals_restore(void);

/* The first stop signal this process received since install (0 if none). Async-signal-safe read. */
int mt_signals_pending(void);

/* Collective over comm: the stop signal if ANY rank received one (the highest signal number among the
 * ranks that did), else 0, returned on every rank alike in *signo. Errors: MT_ERR_MPI. */
mt_status_t mt_signals_agree(MPI_Comm comm, int *signo);

/* Exit status of a process stopped by signo after a clean shutdown: 128 + signo (143 for SIGTERM, 130
 * for SIGINT), what a shell reports for a process that signal killed, so schedulers and scripts read it
 * as "terminated by that signal". */
int mt_signals_exit_status(int signo);

#ifdef __cplusplus
}
#endif
#endif /* MT_SIGNALS_H */
