/* Stop-signal handlers that only record the signal, and the collective agreement on it (signals.h).
 * SPDX-License-Identifier: MIT */
#include "runtime/signals.h"

#include <errno.h>
#include <signal.h>
#include <string.h>

static const int stop_signals[] = {SIGTERM, SIGINT, SIGUSR1};
static struct sigaction saved[MT_ARRAY_LEN(stop_signals)];
static bool installed;
static volatile sig_atomic_t pending_sig;

static void on_signal(int sig) {
    if (pending_sig == sig) {
        /* The same signal twice: the user (or the scheduler) insists. Default action, now. */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof(dfl));
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(sig, &dfl, NULL); /* sigaction and raise are async-signal-safe */
        raise(sig);
        return;
    }
    if (pending_sig == 0) {
        pending_sig = sig;
    }
}

mt_status_t mt_signals_install(void) {
    if (installed) {
        return MT_OK;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < MT_ARRAY_LEN(stop_signals); i++) {
        if (sigaction(stop_signals[i], &sa, &saved[i]) != 0) {
            int e = errno;
            for (size_t j = 0; j < i; j++) {
                sigaction(stop_signals[j], &saved[j], NULL);
            }
            return mt_error(MT_ERR_SYSTEM, "cannot install the handler of signal %d: %s", stop_signals[i], strerror(e));
        }
    }
    pending_sig = 0;
    installed = true;
    return MT_OK;
}

void mt_signals_restore(void) {
    if (!installed) {
        return;
    }
    for (size_t i = 0; i < MT_ARRAY_LEN(stop_signals); i++) {
        sigaction(stop_signals[i], &saved[i], NULL);
    }
    pending_sig = 0;
    installed = false;
}

int mt_signals_pending(void) {
    return (int)pending_sig;
}

mt_status_t mt_signals_agree(MPI_Comm comm, int *signo) {
    int mine = (int)pending_sig, any = 0;
    int rc = MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm);
    if (rc != MPI_SUCCESS) {
        *signo = mine;
        return mt_error(MT_ERR_MPI, "agreeing on a stop signal: MPI_Allreduce failed (code %d)", rc);
    }
    *signo = any;
    return MT_OK;
}

int mt_signals_exit_status(int signo) {
    return signo > 0 ? 128 + signo : 0;
}
