/* Recursive-descent JSON parser (RFC 8259 grammar; depth limited to 64) for the planner's inputs.
 * SPDX-License-Identifier: MIT */
#include "plan/plan_json.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *s;
    size_t i;
    char *err;
    size_t errlen;
    int depth;
} pj_ctx_t;

static void ws(pj_ctx_t *c) {
    while (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\n' || c->s[c->i] == '\r') {
        c->i++;
    }
}

static pj_t *fail(pj_ctx_t *c, const char *msg) {
    if (c->err && c->err[0] == '\0') {
        snprintf(c->err, c->errlen, "offset %zu: %s", c->i, msg);
    }
    return NULL;
}

static pj_t *node(pj_kind_t k) {
    pj_t *v = calloc(1, sizeof(*v));
    if (v) {
        v->kind = k;
    }
    return v;
}

static pj_t *value(pj_ctx_t *c);

static char *string(pj_ctx_t *c) {
    c->i++; /* opening quote */
    size_t cap = 16, n = 0;
    char *out = malloc(cap);
    while (out && c->s[c->i] != '"') {
        char ch = c->s[c->i];
        if (ch == '\0' || (unsigned char)ch < 0x20) {
            free(out);
            fail(c, "unterminated string");
            return NULL;
        }
        if (ch == '\\') {
            c->i++;
            char e = c->s[c->i];
            const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
            const char *p = e ? strchr(from, e) : NULL;
            if (p) {
                ch = to[p - from];
            } else if (e == 'u') {
                for (int k = 1; k <= 4; k++) {
                    if (!strchr("0123456789abcdefABCDEF", c->s[c->i + k]) || c->s[c->i + k] == '\0') {
                        free(out);
                        fail(c, "bad \\u escape");
                        return NULL;
                    }
                }
                c->i += 4;
                ch = '?';
            } else {
                free(out);
                fail(c, "bad escape");
                return NULL;
            }
        }
        if (n + 2 > cap) {
            cap *= 2;
            char *t = realloc(out, cap);
            if (!t) {
                free(out);
                return NULL;
            }
            out = t;
        }
        out[n++] = ch;
        c->i++;
    }
    if (!out) {
        return NULL;
    }
    out[n] = '\0';
    c->i++; /* closing quote */
    return out;
}

static bool push(pj_t *v, pj_t *item, char *key) {
    pj_t **items = realloc(v->items, (size_t)(v->n + 1) * sizeof(*items));
    if (!items) {
        return false;
    }
    v->items = items;
    if (v->kind == PJ_OBJ) {
        char **keys = realloc(v->keys, (size_t)(v->n + 1) * sizeof(*keys));
        if (!keys) {
            return false;
        }
        v->keys = keys;
        v->keys[v->n] = key;
    }
    v->items[v->n++] = item;
    return true;
}

static pj_t *container(pj_ctx_t *c, bool obj) {
    if (++c->depth > 64) {
        return fail(c, "nested too deeply");
    }
    c->i++;
    pj_t *v = node(obj ? PJ_OBJ : PJ_ARR);
    if (!v) {
        return NULL;
    }
    ws(c);
    char close = obj ? '}' : ']';
    if (c->s[c->i] == close) {
        c->i++;
        c->depth--;
        return v;
    }
    for (;;) {
        char *key = NULL;
        ws(c);
        if (obj) {
            if (c->s[c->i] != '"' || !(key = string(c))) {
                pj_free(v);
                return fail(c, "expected a member name");
            }
            ws(c);
            if (c->s[c->i] != ':') {
                free(key);
                pj_free(v);
                return fail(c, "expected ':'");
            }
            c->i++;
        }
        pj_t *item = value(c);
        if (!item || !push(v, item, key)) {
            free(key);
            pj_free(item);
            pj_free(v);
            return fail(c, "bad value");
        }
        ws(c);
        if (c->s[c->i] == ',') {
            c->i++;
            continue;
        }
        if (c->s[c->i] == close) {
            c->i++;
            c->depth--;
            return v;
        }
        pj_free(v);
        return fail(c, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static pj_t *value(pj_ctx_t *c) {
    ws(c);
    char ch = c->s[c->i];
    if (ch == '{' || ch == '[') {
        return container(c, ch == '{');
    }
    if (ch == '"') {
        char *s = string(c);
        pj_t *v = s ? node(PJ_STR) : NULL;
        if (!v) {
            free(s);
            return fail(c, "bad string");
        }
        v->str = s;
        return v;
    }
    static const struct {
        const char *word;
        pj_kind_t kind;
        double num;
    } words[] = {{"true", PJ_BOOL, 1}, {"false", PJ_BOOL, 0}, {"null", PJ_NULL, 0}};
    for (size_t k = 0; k < 3; k++) {
        size_t len = strlen(words[k].word);
        if (!strncmp(c->s + c->i, words[k].word, len)) {
            c->i += len;
            pj_t *v = node(words[k].kind);
            if (v) {
                v->num = words[k].num;
            }
            return v;
        }
    }
    if (ch == '-' || (ch >= '0' && ch <= '9')) {
        char *end = NULL;
        double d = strtod(c->s + c->i, &end);
        if (end == c->s + c->i) {
            return fail(c, "bad number");
        }
        c->i = (size_t)(end - c->s);
        pj_t *v = node(PJ_NUM);
        if (v) {
            v->num = d;
        }
        return v;
    }
    return fail(c, "unexpected character");
}

pj_t *pj_parse(const char *text, char *err, size_t errlen) {
    pj_ctx_t c = {.s = text, .i = 0, .err = err, .errlen = errlen, .depth = 0};
    if (err && errlen) {
        err[0] = '\0';
    }
    pj_t *v = value(&c);
    if (v) {
        ws(&c);
        if (c.s[c.i] != '\0') {
            pj_free(v);
            return fail(&c, "trailing characters after the value");
        }
    }
    return v;
}

void pj_free(pj_t *v) {
    if (!v) {
        return;
    }
    for (int k = 0; k < v->n; k++) {
        pj_free(v->items[k]);
        if (v->keys) {
            free(v->keys[k]);
        }
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    free(v);
}

const pj_t *pj_get(const pj_t *v, const char *key) {
    if (!v || v->kind != PJ_OBJ) {
        return NULL;
    }
    for (int k = 0; k < v->n; k++) {
        if (!strcmp(v->keys[k], key)) {
            return v->items[k];
        }
    }
    return NULL;
}

double pj_num(const pj_t *v, const char *key, double dflt) {
    const pj_t *x = pj_get(v, key);
    return x && x->kind == PJ_NUM ? x->num : dflt;
}
