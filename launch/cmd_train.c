/* `meshtrain train [CONFIG.toml] [--section.key=value ...]`: trains the model the config describes
 * (the embedded default job without CONFIG), printing a progress line per step on rank 0.
 * Exit status: 0 trained, 2 bad input (config, data files, layout), 1 failure while running, 3 the watchdog
 * ended a hung job, 128 + N stopped cleanly on signal N (143: SIGTERM) after writing a checkpoint.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <string.h>

#include "cmd.h"
#include "job.h"
#include "runtime/config.h"
#include "runtime/rt.h"
#include "runtime/signals.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: meshtrain train [CONFIG.toml] [--section.key=value ...]\n"
            "Trains the model the config describes: forward, backward over train.grad_accum micro-batches,\n"
            "clipping to optimizer.grad_clip, an optimizer step, validation every train.eval_every steps, and a\n"
            "progress line per train.log_every steps (step, loss, lr, gradient norm, ms, tokens/s).\n"
            "Without CONFIG it runs the embedded default job (launch/configs/demo.toml).\n"
            "`meshtrain config --help` lists every key. Exit status: 0 done, 2 bad input, 1 failure,\n"
            "3 hang (watchdog), 128+N stopped on signal N (143 = SIGTERM, checkpoint written).\n");
}

int mt_cmd_train(int argc, char **argv) {
    const mt_world_t *w = mt_rt_world();
    mt_config_cli_t cli;
    if (mt_config_split_args(argc, argv, &cli) != MT_OK) {
        if (w->rank == 0) {
            fprintf(stderr, "meshtrain train: %s\n", mt_last_error_msg());
        }
        return 2;
    }
    for (int i = 1; i < cli.rest_argc; i++) {
        const char *a = cli.rest_argv[i];
        bool help = !strcmp(a, "--help") || !strcmp(a, "-h");
        if (w->rank == 0) {
            if (help) {
                usage(stdout);
            } else {
                fprintf(stderr, "meshtrain train: unexpected argument '%s' (keys are --section.key=value; see "
                                "--help)\n", a);
            }
        }
        mt_config_cli_free(&cli);
        return help ? 0 : 2;
    }
    mt_config_t *cfg = NULL;
    mt_status_t st = mt_config_load_world(w->comm, cli.path ? cli.path : MT_CONFIG_EMBEDDED, cli.n_overrides,
                                          cli.overrides, &cfg);
    mt_config_cli_free(&cli);
    if (st != MT_OK) {
        return 2;
    }
    mt_job_opts_t opts = MT_JOB_OPTS_INIT;
    opts.progress = stdout;
    mt_job_result_t res;
    st = mt_job_run(cfg, &opts, &res);
    mt_config_free(cfg);
    if (st != MT_OK) {
        const char *msg = mt_last_error_msg();
        bool remote = strstr(msg, "another rank failed") != NULL;
        if (!remote || w->rank == 0) {
            if (w->size > 1) {
                fprintf(stderr, "meshtrain train: rank %d: %s\n", w->rank, msg);
            } else {
                fprintf(stderr, "meshtrain train: %s\n", msg);
            }
        }
        int sig = res.stop_signal;
        mt_job_result_free(&res);
        if (sig) {
            return mt_signals_exit_status(sig); /* 143 for SIGTERM: stopped cleanly, checkpoint written */
        }
        return st == MT_ERR_INVALID_ARG ? 2 : 1;
    }
    if (w->rank == 0 && res.n_steps > 0) {
        printf("done: %lld steps, final loss %.6f", (long long)res.n_steps, res.loss[res.n_steps - 1]);
        if (res.n_evals > 0) {
            printf(", val loss %.6f", res.val_loss[res.n_evals - 1]);
        }
        printf(", %.1f s, %.0f tok/s\n", res.seconds, res.tokens_per_s);
    }
    mt_job_result_free(&res);
    return 0;
}
