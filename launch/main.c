/* The `meshtrain` command: one binary, subcommands dispatched from a table. Every rank runs it;
 * subcommands that report print from rank 0.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <string.h>

#include "cmd.h"
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
