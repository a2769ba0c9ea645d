/* The subcommands of the `meshtrain` command. Each returns the process exit code: 0 success,
 * 1 runtime failure, 2 bad input (config, command line, files). They are called after MPI is up.
 * SPDX-License-Identifier: MIT */
#ifndef MT_CMD_H
#define MT_CMD_H

int mt_cmd_config(int argc, char **argv);
int mt_cmd_export(int argc, char **argv);
int mt_cmd_topo(int argc, char **argv);
int mt_cmd_train(int argc, char **argv);
int mt_cmd_version(int argc, char **argv);
int mt_cmd_bench(int argc, char **argv);
int mt_cmd_plan(int argc, char **argv);

#endif
