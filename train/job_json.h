/* A small JSON reader for checkpoint manifests: parses a whole document into a tree of values with
 * lookups by key and index, and reports the first syntax error with its byte offset. Writing JSON is
 * plain fprintf plus mt_json_write_string for escaping.
 * SPDX-License-Identifier: MIT */
#ifndef MT_JOB_JSON_H
#define MT_JOB_JSON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/mt_core.h"

typedef enum {
    MT_JSON_NULL = 0,
    MT_JSON_BOOL,
    MT_JSON_NUMBER,
    MT_JSON_STRING,
    MT_JSON_ARRAY,
    MT_JSON_OBJECT
} mt_json_kind_t;

typedef struct mt_json {
    mt_json_kind_t kind;
    bool b;
    double num;
    char *str;              /* STRING: the decoded text (NUL-terminated) */
    char *key;              /* member name when this value sits in an object */
    struct mt_json **items; /* ARRAY / OBJECT: children in document order */
    int n;
} mt_json_t;

/* Parses text (len bytes, need not be NUL-terminated). Nesting deeper than 64 is refused. On error
 * returns MT_ERR_INVALID_ARG with "what: JSON syntax error at byte N: ..." and *out = NULL. */
mt_status_t mt_json_parse(const char *text, size_t len, const char *what, mt_json_t **out);
void mt_json_free(mt_json_t *v);

/* Member of an object by name (NULL when v is not an object or has no such member), item of an array. */
const mt_json_t *mt_json_get(const mt_json_t *v, const char *key);
const mt_json_t *mt_json_at(const mt_json_t *v, int i);

/* Typed member access: false when missing or of another kind. An integer must be a number with no
 * fractional part within +-2^53. */
bool mt_json_get_int(const mt_json_t *v, const char *key, int64_t *out);
bool mt_json_get_num(const mt_json_t *v, const char *key, double *out);
const char *mt_json_get_str(const mt_json_t *v, const char *key);

/* Writes s as a JSON string literal (quotes and escapes included). */
void mt_json_write_string(FILE *f, const char *s);

#endif
