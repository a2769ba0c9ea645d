/* A parser for the subset of TOML meshtrain's configs use: [tables], dotted and quoted keys, and
 * scalar values (basic and literal strings with escapes, integers in every TOML base, floats, inf
 * and nan, booleans), comments. Arrays, inline tables, multi-line strings and dates are refused with
 * a message saying so. Private to runtime/config.c and its tests.
 * SPDX-License-Identifier: MIT */
#ifndef MT_CONFIG_TOML_H
#define MT_CONFIG_TOML_H

#include <stdbool.h>
#include <stdint.h>

typedef enum { MT_TOML_BOOL, MT_TOML_INT, MT_TOML_FLOAT, MT_TOML_STRING } mt_toml_kind_t;

typedef struct {
    mt_toml_kind_t kind;
    bool b;
    int64_t i;
    double f;
    char *s; /* malloc'd, for MT_TOML_STRING */
} mt_toml_value_t;

/* Called for each key = value with the full dotted key ("parallel.tp") and its line. The callee owns
 * value->s. Returns false to record nothing more (the parser goes on to report later syntax errors). */
typedef void (*mt_toml_on_kv_t)(void *arg, const char *key, int line, mt_toml_value_t *value);
/* Called for each syntax error (line, message). */
typedef void (*mt_toml_on_error_t)(void *arg, int line, const char *msg);

/* Parses text (NUL-terminated). Duplicate keys and duplicate tables are errors. Returns the number of
 * errors reported. */
int mt_toml_parse(const char *text, mt_toml_on_kv_t on_kv, mt_toml_on_error_t on_error, void *arg);

/* Parses one TOML value from the whole of s (trailing spaces allowed). Returns false if s is not a
 * single valid scalar value; *msg (may be NULL) says why. */
bool mt_toml_parse_value(const char *s, mt_toml_value_t *out, const char **msg);

#endif
