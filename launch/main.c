/* The `meshtrain` command: one binary, subcommands dispatched from a table. Every rank runs it;
 * subcommands that report print from rank 0.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <string.h>

#include "cmd.h"
#include "runtime/blas.h"
#include "runtime/config.h"
#include "runtime/rt.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} subcommand_t;

static const subcommand_t subcommands[] = {
    {"config", mt_cmd_config, "print the effective configuration, or every error in it"},
    {"export", mt_cmd_export, "write the configured GPT-2 weights as an llm.c checkpoint (--llmc OUT.bin)"},
    {"topo", mt_cmd_topo, "show where every rank runs (cores, NUMA, device, NIC, mesh groups), or plan a world"},
    {"train", mt_cmd_train, "train the model a config describes, any tp x pp x dp layout (default job without CONFIG)"},
    {"train3d", mt_cmd_train, "the same as `train` (kept for scripts written for it)"},
    {"version", mt_cmd_version, "print version, git commit and the components this build has"},
    {"plan", mt_cmd_plan, "predict memory and step time of every layout of a job on a cluster and pick one"},
    {"bench", mt_cmd_bench, "collective microbenchmarks (`meshtrain bench coll`, nccl-tests style)"},
};

/* runtime.blas_core of the job a `train` command line describes, read before MPI (the kernel must be chosen
 * before anything else runs). Only that key is read here (a config with errors elsewhere still gives it; the
 * command reports every error itself). The returned string is static. */
static const char *blas_request(int argc, char **argv) {
    static char req[32] = "auto";
    mt_config_cli_t cli;
    if (mt_config_split_args(argc, argv, &cli) != MT_OK) {
        return req;
    }
    /* a value outside the choices gives "auto" here: the config load names it with the valid ones */
    mt_config_peek_str(cli.path ? cli.path : MT_CONFIG_EMBEDDED, cli.n_overrides, cli.overrides, "runtime.blas_core",
                       req, sizeof(req));
    mt_config_cli_free(&cli);
    return req;
}

static void usage(FILE *out) {
    fprintf(out, "usage: meshtrain <command> [options]\n"
                 "       mpirun -np N meshtrain <command> ...   |   srun -n N meshtrain <command> ...\n\n"
                 "commands:\n");
    for (size_t i = 0; i < MT_ARRAY_LEN(subcommands); i++) {
        fprintf(out, "  %-10s %s\n", subcommands[i].name, subcommands[i].summary);
    }
    fprintf(out, "\n`meshtrain <command> --help` describes each. --version is the same as `meshtrain version`.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--version")) {
        name = "version";
    }
    const subcommand_t *cmd = NULL;
    for (size_t i = 0; i < MT_ARRAY_LEN(subcommands); i++) {
        if (!strcmp(subcommands[i].name, name)) {
            cmd = &subcommands[i];
        }
    }
    if (!cmd) {
        fprintf(stderr, "meshtrain: unknown command '%s'\n\n", name);
        usage(stderr);
        return 2;
    }
    /* The matrix library's kernel (runtime/blas.h): for the commands that multiply matrices, and `version`,
     * which reports what `train` would run. This may restart the process before MPI starts. */
    bool train = !strcmp(cmd->name, "train") || !strcmp(cmd->name, "train3d");
    if (train || !strcmp(cmd->name, "version")) {
        int brc = mt_blas_startup(argv, train ? blas_request(argc - 1, argv + 1) : "auto");
        if (brc != 0) {
            return brc;
        }
    }
    if (mt_rt_init(&argc, &argv) != MT_OK) {
        fprintf(stderr, "meshtrain: MPI start-up failed: %s\n", mt_last_error_msg());
        return 1;
    }
    int rc = cmd->run(argc - 1, argv + 1);
    if (rc != 0) {
        /* Every rank computed the same verdict for bad input; make sure stdio is out before leaving. */
        fflush(stdout);
        fflush(stderr);
    }
    mt_rt_finalize();
    return rc;
}
