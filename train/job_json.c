/* Recursive-descent JSON reader (RFC 8259 values; \u escapes decoded to UTF-8) for checkpoint manifests.
 * SPDX-License-Identifier: MIT */
#include "train/job_json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *s;
    size_t n, i;
    const char *what;
    char err[160];
    int depth;
} jp_t;

static bool fail(jp_t *p, const char *msg) {
    if (!p->err[0]) {
        snprintf(p->err, sizeof(p->err), "%s", msg);
    }
    return false;
}

static void skip_ws(jp_t *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) {
        p->i++;
    }
}

static bool lit(jp_t *p, const char *w) {
    size_t l = strlen(w);
    if (p->n - p->i < l || memcmp(p->s + p->i, w, l) != 0) {
        return fail(p, "unexpected character");
    }
    p->i += l;
    return true;
}

static void put_utf8(char *out, size_t *o, unsigned cp) {
    if (cp < 0x80) {
        out[(*o)++] = (char)cp;
    } else if (cp < 0x800) {
        out[(*o)++] = (char)(0xC0 | (cp >> 6));
        out[(*o)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out[(*o)++] = (char)(0xE0 | (cp >> 12));
        out[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*o)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        out[(*o)++] = (char)(0xF0 | (cp >> 18));
        out[(*o)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[(*o)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*o)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static bool hex4(jp_t *p, unsigned *out) {
    if (p->n - p->i < 4) {
        return fail(p, "short \\u escape");
    }
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->i++];
        v <<= 4;
        if (c >= '0' && c <= '9') {
            v |= (unsigned)(c - '0');
        } else if (c >= 'a' && c <= 'f') {
            v |= (unsigned)(c - 'a' + 10);
        } else if (c >= 'A' && c <= 'F') {
            v |= (unsigned)(c - 'A' + 10);
        } else {
            return fail(p, "bad hex digit in \\u escape");
        }
    }
    *out = v;
    return true;
}

static bool parse_string(jp_t *p, char **out) {
    p->i++; /* opening quote */
    size_t start = p->i, cap = 0;
    while (p->i < p->n && p->s[p->i] != '"') { /* upper bound of the decoded length */
        p->i += p->s[p->i] == '\\' ? 2 : 1;
    }
    if (p->i >= p->n) {
        return fail(p, "unterminated string");
    }
    cap = p->i - start + 1;
    p->i = start;
    char *s = malloc(cap + 4);
    if (!s) {
        return fail(p, "out of memory");
    }
    size_t o = 0;
    while (p->s[p->i] != '"') {
        unsigned char c = (unsigned char)p->s[p->i++];
        if (c < 0x20) {
            free(s);
            return fail(p, "control character in string");
        }
        if (c != '\\') {
            s[o++] = (char)c;
            continue;
        }
        char e = p->s[p->i++];
        unsigned cp = 0;
        switch (e) {
        case '"':
            s[o++] = '"';
            break;
        case '\\':
            s[o++] = '\\';
            break;
        case '/':
            s[o++] = '/';
            break;
        case 'b':
            s[o++] = '\b';
            break;
        case 'f':
            s[o++] = '\f';
            break;
        case 'n':
            s[o++] = '\n';
            break;
        case 'r':
            s[o++] = '\r';
            break;
        case 't':
            s[o++] = '\t';
            break;
        case 'u':
            if (!hex4(p, &cp)) {
                free(s);
                return false;
            }
            put_utf8(s, &o, cp); /* 6 escape bytes -> at most 3 (a lone surrogate is kept as is) */
            break;
        default:
            free(s);
            return fail(p, "bad escape in string");
        }
    }
    p->i++;
    s[o] = '\0';
    *out = s;
    return true;
}

static bool parse_value(jp_t *p, mt_json_t **out);

static bool add_item(jp_t *p, mt_json_t *v, mt_json_t *item) {
    if ((v->n & (v->n - 1)) == 0) { /* grow at powers of two */
        mt_json_t **ni = realloc(v->items, (size_t)(v->n ? 2 * v->n : 1) * sizeof(*ni));
        if (!ni) {
            mt_json_free(item);
            return fail(p, "out of memory");
        }
        v->items = ni;
    }
    v->items[v->n++] = item;
    return true;
}

static bool parse_container(jp_t *p, mt_json_t *v, bool object) {
    char close = object ? '}' : ']';
    p->i++;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
        return true;
    }
    for (;;) {
        skip_ws(p);
        char *key = NULL;
        if (object) {
            if (p->i >= p->n || p->s[p->i] != '"') {
                return fail(p, "expected a member name");
            }
            if (!parse_string(p, &key)) {
                return false;
            }
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') {
                free(key);
                return fail(p, "expected ':'");
            }
            p->i++;
        }
        mt_json_t *item = NULL;
        if (!parse_value(p, &item)) {
            free(key);
            return false;
        }
        item->key = key;
        if (!add_item(p, v, item)) {
            return false;
        }
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == close) {
            p->i++;
            return true;
        }
        return fail(p, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static bool parse_value(jp_t *p, mt_json_t **out) {
    skip_ws(p);
    if (p->i >= p->n) {
        return fail(p, "unexpected end of input");
    }
    if (++p->depth > 64) {
        return fail(p, "nested deeper than 64");
    }
    mt_json_t *v = calloc(1, sizeof(*v));
    if (!v) {
        return fail(p, "out of memory");
    }
    *out = v;
    bool ok = true;
    char c = p->s[p->i];
    if (c == '{' || c == '[') {
        v->kind = c == '{' ? MT_JSON_OBJECT : MT_JSON_ARRAY;
        ok = parse_container(p, v, c == '{');
    } else if (c == '"') {
        v->kind = MT_JSON_STRING;
        ok = parse_string(p, &v->str);
    } else if (c == 't') {
        v->kind = MT_JSON_BOOL;
        v->b = true;
        ok = lit(p, "true");
    } else if (c == 'f') {
        v->kind = MT_JSON_BOOL;
        ok = lit(p, "false");
    } else if (c == 'n') {
        ok = lit(p, "null");
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        char buf[64];
        size_t k = 0;
        while (p->i < p->n && k < sizeof(buf) - 1 && strchr("+-0123456789.eE", p->s[p->i])) {
            buf[k++] = p->s[p->i++];
        }
        buf[k] = '\0';
        char *end = NULL;
        v->kind = MT_JSON_NUMBER;
        v->num = strtod(buf, &end);
        ok = end && *end == '\0' && k > 0 ? true : fail(p, "malformed number");
    } else {
        ok = fail(p, "unexpected character");
    }
    p->depth--;
    if (!ok) {
        mt_json_free(v);
        *out = NULL;
    }
    return ok;
}

mt_status_t mt_json_parse(const char *text, size_t len, const char *what, mt_json_t **out) {
    jp_t p = {.s = text, .n = len, .what = what};
    mt_json_t *v = NULL;
    *out = NULL;
    if (parse_value(&p, &v)) {
        skip_ws(&p);
        if (p.i == p.n) {
            *out = v;
            return MT_OK;
        }
        fail(&p, "trailing characters after the document");
        mt_json_free(v);
    }
    return mt_error(MT_ERR_INVALID_ARG, "%s: JSON syntax error at byte %zu: %s", what, p.i, p.err);
}

void mt_json_free(mt_json_t *v) {
    if (!v) {
        return;
    }
    for (int i = 0; i < v->n; i++) {
        mt_json_free(v->items[i]);
    }
    free(v->items);
    free(v->str);
    free(v->key);
    free(v);
}

const mt_json_t *mt_json_get(const mt_json_t *v, const char *key) {
    if (!v || v->kind != MT_JSON_OBJECT) {
        return NULL;
    }
    for (int i = 0; i < v->n; i++) {
        if (!strcmp(v->items[i]->key, key)) {
            return v->items[i];
        }
    }
    return NULL;
}

const mt_json_t *mt_json_at(const mt_json_t *v, int i) {
    if (!v || (v->kind != MT_JSON_ARRAY && v->kind != MT_JSON_OBJECT) || i < 0 || i >= v->n) {
        return NULL;
    }
    return v->items[i];
}

bool mt_json_get_num(const mt_json_t *v, const char *key, double *out) {
    const mt_json_t *m = mt_json_get(v, key);
    if (!m || m->kind != MT_JSON_NUMBER) {
        return false;
    }
    *out = m->num;
    return true;
}

bool mt_json_get_int(const mt_json_t *v, const char *key, int64_t *out) {
    double d = 0;
    if (!mt_json_get_num(v, key, &d) || !isfinite(d) || d != floor(d) || fabs(d) > 9007199254740992.0) {
        return false;
    }
    *out = (int64_t)d;
    return true;
}

const char *mt_json_get_str(const mt_json_t *v, const char *key) {
    const mt_json_t *m = mt_json_get(v, key);
    return m && m->kind == MT_JSON_STRING ? m->str : NULL;
}

void mt_json_write_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            fprintf(f, "\\%c", *c);
        } else if (*c == '\n') {
            fputs("\\n", f);
        } else if (*c == '\t') {
            fputs("\\t", f);
        } else if (*c < 0x20) {
            fprintf(f, "\\u%04x", *c);
        } else {
            fputc(*c, f);
        }
    }
    fputc('"', f);
}
