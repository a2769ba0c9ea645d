/* Stop signals. Modes (argv[1]):
 *   unit       one process: the flag, the agreement, the exit status, restore, and a second signal ending
 *              the process at once (in a forked child).
 *   loop DIR   a mock training loop under mpiexec: per step some compute and an all-reduce; at every step
 *              boundary the ranks agree on a stop signal; on one, rank 0 writes DIR/ckpt ("step N") as
 *              checkpoint.on_signal would, every rank prints the step it stopped at and exits 128+signal.
 *              DIR/pid.R and DIR/ready.R tell signal_test.sh whom to signal and when.
 * SPDX-License-Identifier: MIT */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/rt.h"
#include "runtime/signals.h"
#include "testutil.h"

static int unit(void) {
    CHECK_OK(mt_signals_install());
    CHECK_OK(mt_signals_install()); /* idempotent */
    CHECK(mt_signals_pending() == 0, "nothing pending");
    int s = -1;
    CHECK_OK(mt_signals_agree(MPI_COMM_SELF, &s));
    CHECK(s == 0, "agree without a signal: %d", s);
    raise(SIGTERM);
    CHECK(mt_signals_pending() == SIGTERM, "pending %d", mt_signals_pending());
    raise(SIGINT); /* another kind while one is pending: the first is kept, the process lives */
    CHECK(mt_signals_pending() == SIGTERM, "first kept: %d", mt_signals_pending());
    CHECK_OK(mt_signals_agree(MPI_COMM_SELF, &s));
    CHECK(s == SIGTERM, "agreed %d", s);
    CHECK(mt_signals_exit_status(SIGTERM) == 143 && mt_signals_exit_status(SIGINT) == 130, "exit statuses");
    CHECK(mt_signals_exit_status(0) == 0, "no signal: 0");
    mt_signals_restore();
    CHECK(mt_signals_pending() == 0, "restore forgets");
    /* The same signal twice ends the process with the default action. */
    pid_t pid = fork();
    if (pid == 0) {
        mt_signals_install();
        raise(SIGINT);
        raise(SIGINT);
        _exit(0);
    }
    int wst = 0;
    waitpid(pid, &wst, 0);
    CHECK(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGINT, "second SIGINT kills: status %#x", wst);
    /* One signal alone does not. */
    pid = fork();
    if (pid == 0) {
        mt_signals_install();
        raise(SIGUSR1);
        _exit(mt_signals_pending() == SIGUSR1 ? 7 : 1);
    }
    waitpid(pid, &wst, 0);
    CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 7, "one SIGUSR1 recorded: status %#x", wst);
    return mt_test_finish("signals unit");
}

static void touch(const char *dir, const char *what, int rank, long value) {
    char path[4096], tmp[4200];
    snprintf(path, sizeof(path), "%s/%s.%d", dir, what, rank);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fprintf(f, "%ld\n", value);
        fclose(f);
        rename(tmp, path);
    }
}

static int loop(const char *dir) {
    const mt_world_t *w = mt_rt_world();
    if (mt_signals_install() != MT_OK) {
        fprintf(stderr, "%s\n", mt_last_error_msg());
        return 1;
    }
    touch(dir, "pid", w->rank, (long)getpid());
    static double buf[4096];
    for (int step = 1; step <= 1000; step++) {
        int sig = 0;
        if (mt_signals_agree(w->comm, &sig) != MT_OK) {
            fprintf(stderr, "rank %d: %s\n", w->rank, mt_last_error_msg());
            return 1;
        }
        if (sig) {
            if (w->rank == 0) {
                char path[4096], tmp[4200];
                snprintf(path, sizeof(path), "%s/ckpt", dir);
                snprintf(tmp, sizeof(tmp), "%s.tmp", path);
                FILE *f = fopen(tmp, "w");
                if (f) {
                    fprintf(f, "step %d\n", step - 1);
                    fclose(f);
                    rename(tmp, path);
                }
            }
            MPI_Barrier(w->comm); /* the checkpoint is complete before anyone exits */
            int code = mt_signals_exit_status(sig);
            printf("rank %d: signal %d: stopping after step %d (checkpoint written), exit status %d\n", w->rank, sig,
                   step - 1, code);
            fflush(stdout);
            mt_rt_finalize();
            return code;
        }
        for (int i = 0; i < 4096; i++) {
            buf[i] = step + i * 1e-3;
        }
        usleep(20 * 1000); /* "compute" */
        MPI_Allreduce(MPI_IN_PLACE, buf, 4096, MPI_DOUBLE, MPI_SUM, w->comm);
        if (step == 5) {
            touch(dir, "ready", w->rank, step);
        }
    }
    fprintf(stderr, "rank %d: no stop signal arrived\n", w->rank);
    return 1;
}

int main(int argc, char **argv) {
    if (mt_rt_init(&argc, &argv) != MT_OK) {
        return 1;
    }
    if (argc > 2 && !strcmp(argv[1], "loop")) {
        return loop(argv[2]);
    }
    int rc = unit();
    mt_rt_finalize();
    return rc;
}
