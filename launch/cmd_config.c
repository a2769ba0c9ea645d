/* `meshtrain config [CONFIG] [--section.key=value ...]`: prints the effective configuration (every
 * key, its value and where it came from) and exits 0, or prints every error and exits 2 on every rank.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <string.h>

#include "cmd.h"
#include "runtime/config.h"
#include "runtime/rt.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: meshtrain config [CONFIG.toml] [--section.key=value ...] [--default]\n"
            "Prints the effective configuration: every key, its value, and where it came from (default, file,\n"
            "override on the command line, or derived from other keys and the world size). Bad input is\n"
            "reported all at once and every rank exits with status 2. Run under mpirun/srun to check the\n"
            "parallel layout against the real world size. --default uses the embedded default job.\n\n"
            "Keys:\n");
    mt_config_print_schema(out);
}

int mt_cmd_config(int argc, char **argv) {
    mt_config_cli_t cli;
    if (mt_config_split_args(argc, argv, &cli) != MT_OK) {
        if (mt_rt_world()->rank == 0) {
            fprintf(stderr, "meshtrain config: %s\n", mt_last_error_msg());
        }
        return 2;
    }
    const char *path = cli.path;
    for (int i = 1; i < cli.rest_argc; i++) {
        const char *a = cli.rest_argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            if (mt_rt_world()->rank == 0) {
                usage(stdout);
            }
            mt_config_cli_free(&cli);
            return 0;
        } else if (!strcmp(a, "--default")) {
            path = MT_CONFIG_EMBEDDED;
        } else {
            if (mt_rt_world()->rank == 0) {
                fprintf(stderr, "meshtrain config: unexpected argument '%s' (config files end in .toml or come "
                                "with --config PATH; keys are --section.key=value; see --help)\n", a);
            }
            mt_config_cli_free(&cli);
            return 2;
        }
    }
    mt_config_t *cfg = NULL;
    mt_status_t st = mt_config_load_world(mt_rt_world()->comm, path, cli.n_overrides, cli.overrides, &cfg);
    mt_config_cli_free(&cli);
    if (st != MT_OK) {
        return 2;
    }
    if (mt_rt_world()->rank == 0) {
        mt_config_print(cfg, stdout);
    }
    mt_config_free(cfg);
    return 0;
}
