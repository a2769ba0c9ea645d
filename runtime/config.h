/* Job configuration: a TOML file (tables and scalar keys) plus `--section.key=value` overrides,
 * checked against one schema that declares every key with its type, range, default and meaning.
 * Rank 0 reads and validates, then broadcasts, so every rank sees the same config and the same
 * verdict even when the file exists only on rank 0's node.
 * SPDX-License-Identifier: MIT */
#ifndef MT_CONFIG_H
#define MT_CONFIG_H

#include <mpi.h>
#include <stdio.h>

#include "mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MT_CFG_BOOL = 0, MT_CFG_INT, MT_CFG_FLOAT, MT_CFG_STRING } mt_cfg_type_t;
typedef enum { MT_CFG_SRC_DEFAULT = 0, MT_CFG_SRC_FILE, MT_CFG_SRC_OVERRIDE, MT_CFG_SRC_DERIVED } mt_cfg_source_t;

/* One schema entry (runtime/config_schema.c holds the table). For strings, `choices` is a
 * '|'-separated list of allowed values or NULL for free text. */
typedef struct {
    const char *key; /* "section.name" */
    mt_cfg_type_t type;
    const char *dflt; /* default, as TOML text ("4", "3e-4", "true", "adamw") */
    double min, max;  /* inclusive range for int/float */
    const char *choices;
    const char *help; /* one line */
} mt_cfg_schema_t;

/* The schema: every key meshtrain knows, in display order; n set to the count. */
const mt_cfg_schema_t *mt_config_schema(size_t *n);

typedef struct mt_config mt_config_t;

/* The command line of a config-taking command split in three: the config file (an argument ending in
 * ".toml", or given with --config PATH / --config=PATH; NULL if none; two is an error), the
 * `--section.key=value` overrides (any `--x.y=...`), and the rest (argv[0] first, for the command's own
 * getopt_long). Pointers borrow from argv. */
typedef struct {
    const char *path;
    int n_overrides;
    char **overrides; /* "--parallel.tp=2" as given */
    int rest_argc;
    char **rest_argv;
} mt_config_cli_t;
mt_status_t mt_config_split_args(int argc, char **argv, mt_config_cli_t *out);
void mt_config_cli_free(mt_config_cli_t *cli);

/* Parses path (NULL: the schema defaults alone) and the overrides, then validates every key and the
 * cross-key rules (batch arithmetic, tp x pp x dp = world_size with dp = 0 derived). Local: no MPI.
 * Every problem found is appended to errors (one line each, naming file:line, key and the valid
 * range, with a did-you-mean for misspelt keys); returns MT_ERR_INVALID_ARG if there was any, and
 * *out = NULL. path == MT_CONFIG_EMBEDDED loads the embedded default job. world_size <= 0 skips the
 * world-size rules. */
mt_status_t mt_config_load(const char *path, int n_overrides, char *const *overrides, int world_size,
                           mt_config_t **out, FILE *errors);

/* Collective over comm: rank 0 loads and validates (errors printed to stderr by rank 0 alone,
 * prefixed "meshtrain: config error: "), broadcasts the verdict and the config. Every rank returns
 * the same status. */
mt_status_t mt_config_load_world(MPI_Comm comm, const char *path, int n_overrides, char *const *overrides,
                                 mt_config_t **out);

/* One string key as mt_config_load would set it (the last override, else the file, else the default),
 * into out, without validating anything else: local, for decisions taken before MPI starts. A file that
 * cannot be read or parsed, or a value outside the key's choices, gives the default; the real load reports
 * it. */
void mt_config_peek_str(const char *path, int n_overrides, char *const *overrides, const char *key, char *out,
                        size_t len);

void mt_config_free(mt_config_t *cfg);

/* Typed getters. The key must be in the schema with that type: asking for anything else is a
 * programming error and aborts. Strings live as long as cfg. */
bool mt_config_bool(const mt_config_t *cfg, const char *key);
int64_t mt_config_int(const mt_config_t *cfg, const char *key);
double mt_config_float(const mt_config_t *cfg, const char *key);
const char *mt_config_str(const mt_config_t *cfg, const char *key);
mt_cfg_source_t mt_config_source(const mt_config_t *cfg, const char *key);

/* Writes every key as `key = value  # source` grouped by section (the effective config). */
void mt_config_print(const mt_config_t *cfg, FILE *out);

/* Prints the schema: key, type, default, range/choices and help, by section. */
void mt_config_print_schema(FILE *out);

/* Pass as path to load the embedded default job instead of a file. */
#define MT_CONFIG_EMBEDDED "<embedded default>"

/* The embedded default job (launch/configs/demo.toml compiled in), used by `meshtrain train` with no
 * config file. */
extern const char mt_config_default_toml[];

#ifdef __cplusplus
}
#endif
#endif /* MT_CONFIG_H */
