/* A small JSON reader for the planner's inputs: `meshtrain bench coll --json` results and metrics.jsonl
 * lines. Parses a whole document into a tree; numbers as doubles, strings unescaped (\uXXXX kept as '?').
 * SPDX-License-Identifier: MIT */
#ifndef MT_PLAN_JSON_H
#define MT_PLAN_JSON_H

#include <stddef.h>

typedef enum { PJ_NULL = 0, PJ_BOOL, PJ_NUM, PJ_STR, PJ_ARR, PJ_OBJ } pj_kind_t;

typedef struct pj {
    pj_kind_t kind;
    double num; /* PJ_NUM, PJ_BOOL (0/1) */
    char *str;  /* PJ_STR */
    int n;      /* PJ_ARR / PJ_OBJ: entries */
    struct pj **items;
    char **keys; /* PJ_OBJ */
} pj_t;

/* Parses text (NUL-terminated); NULL on a syntax error, with a message ("offset N: ...") in err. */
pj_t *pj_parse(const char *text, char *err, size_t errlen);
void pj_free(pj_t *v);
/* The member key of an object (NULL when absent or v is not an object). */
const pj_t *pj_get(const pj_t *v, const char *key);
/* The number at key, or dflt when absent or not a number. */
double pj_num(const pj_t *v, const char *key, double dflt);

#endif
