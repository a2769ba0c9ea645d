/* The TOML-subset parser behind runtime/config.c: a hand-written scanner over lines, strict about
 * what TOML 1.0 says for the constructs it accepts, explicit about the ones it does not.
 * SPDX-License-Identifier: MIT */
#include "config_toml.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *p;
    int line;
    const char *err;
} scan_t;

static void skip_ws(scan_t *s) {
    while (*s->p == ' ' || *s->p == '\t') {
        s->p++;
    }
}

static bool is_bare(char c) { return isalnum((unsigned char)c) || c == '_' || c == '-'; }

/* Appends the UTF-8 encoding of code point cp. */
static bool put_utf8(char **o, uint32_t cp) {
    char *q = *o;
    if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
        return false;
    }
    if (cp < 0x80) {
        *q++ = (char)cp;
    } else if (cp < 0x800) {
        *q++ = (char)(0xC0 | (cp >> 6));
        *q++ = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *q++ = (char)(0xE0 | (cp >> 12));
        *q++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *q++ = (char)(0x80 | (cp & 0x3F));
    } else {
        *q++ = (char)(0xF0 | (cp >> 18));
        *q++ = (char)(0x80 | ((cp >> 12) & 0x3F));
        *q++ = (char)(0x80 | ((cp >> 6) & 0x3F));
        *q++ = (char)(0x80 | (cp & 0x3F));
    }
    *o = q;
    return true;
}

/* Scans a basic ("...") or literal ('...') single-line string at s->p. */
static char *scan_string(scan_t *s) {
    char quote = *s->p;
    if (s->p[1] == quote && s->p[2] == quote) {
        s->err = "multi-line strings are not supported in meshtrain configs; write the value on one line";
        return NULL;
    }
    s->p++;
    size_t cap = strlen(s->p) * 4 + 1;
    char *out = malloc(cap), *o = out;
    if (!out) {
        s->err = "out of memory";
        return NULL;
    }
    for (;;) {
        char c = *s->p;
        if (c == '\0' || c == '\n' || c == '\r') {
            s->err = "unterminated string: add the closing quote on the same line";
            free(out);
            return NULL;
        }
        s->p++;
        if (c == quote) {
            break;
        }
        if ((unsigned char)c < 0x20 && c != '\t') {
            s->err = "control character in a string: escape it (\\n, \\t, \\uXXXX)";
            free(out);
            return NULL;
        }
        if (c == '\\' && quote == '"') {
            char e = *s->p;
            if (e != '\0') {
                s->p++; /* never step past the terminator: the caller goes on scanning after an error */
            }
            switch (e) {
            case 'b': *o++ = '\b'; break;
            case 't': *o++ = '\t'; break;
            case 'n': *o++ = '\n'; break;
            case 'f': *o++ = '\f'; break;
            case 'r': *o++ = '\r'; break;
            case '"': *o++ = '"'; break;
            case '\\': *o++ = '\\'; break;
            case 'u':
            case 'U': {
                int n = e == 'u' ? 4 : 8;
                uint32_t cp = 0;
                for (int i = 0; i < n; i++) {
                    char h = *s->p;
                    if (h != '\0') {
                        s->p++;
                    }
                    if (!isxdigit((unsigned char)h)) {
                        s->err = "bad unicode escape: \\u takes 4 hex digits, \\U takes 8";
                        free(out);
                        return NULL;
                    }
                    int digit = isdigit((unsigned char)h) ? h - '0' : tolower((unsigned char)h) - 'a' + 10;
                    cp = cp * 16 + (uint32_t)digit;
                }
                if (!put_utf8(&o, cp)) {
                    s->err = "unicode escape is not a valid code point";
                    free(out);
                    return NULL;
                }
                break;
            }
            default:
                s->err = "unknown escape in a string (valid: \\b \\t \\n \\f \\r \\\" \\\\ \\uXXXX \\UXXXXXXXX); "
                         "use a literal string '...' for backslashes";
                free(out);
                return NULL;
            }
        } else {
            *o++ = c;
        }
    }
    *o = '\0';
    return out;
}

/* Copies a number token, checking TOML's underscore rule (each '_' between two digits). */
static bool number_token(const char *start, size_t n, char *buf, size_t cap) {
    if (n == 0 || n >= cap) {
        return false;
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (start[i] == '_') {
            if (i == 0 || i + 1 == n || !isxdigit((unsigned char)start[i - 1]) ||
                !isxdigit((unsigned char)start[i + 1])) {
                return false;
            }
            continue;
        }
        buf[o++] = start[i];
    }
    buf[o] = '\0';
    return true;
}

static bool scan_value(scan_t *s, mt_toml_value_t *v) {
    memset(v, 0, sizeof(*v));
    char c = *s->p;
    if (c == '"' || c == '\'') {
        v->kind = MT_TOML_STRING;
        v->s = scan_string(s);
        return v->s != NULL;
    }
    if (c == '[') {
        s->err = "arrays are not supported in meshtrain configs (scalar keys only); e.g. write "
                 "stage_layers = \"3,3,2,2\"";
        return false;
    }
    if (c == '{') {
        s->err = "inline tables are not supported in meshtrain configs; use a [section] with one key per line";
        return false;
    }
    const char *start = s->p;
    while (*s->p && !isspace((unsigned char)*s->p) && *s->p != '#' && *s->p != ',') {
        s->p++;
    }
    size_t n = (size_t)(s->p - start);
    if (n == 0) {
        s->err = "missing value after '='";
        return false;
    }
    if ((n == 4 && !strncmp(start, "true", 4)) || (n == 5 && !strncmp(start, "false", 5))) {
        v->kind = MT_TOML_BOOL;
        v->b = n == 4;
        return true;
    }
    char buf[128];
    const char *sign = (start[0] == '+' || start[0] == '-') ? start : NULL;
    const char *body = sign ? start + 1 : start;
    size_t bn = sign ? n - 1 : n;
    if (bn == 3 && (!strncmp(body, "inf", 3) || !strncmp(body, "nan", 3))) {
        v->kind = MT_TOML_FLOAT;
        v->f = body[0] == 'i' ? INFINITY : NAN;
        if (sign && *sign == '-') {
            v->f = -v->f;
        }
        return true;
    }
    if (body[0] == '.' && isdigit((unsigned char)body[1])) {
        s->err = "a float needs digits on both sides of '.' (e.g. 0.5, not .5 or 5.)";
        return false;
    }
    if (!isdigit((unsigned char)body[0])) {
        s->err = "not a value: strings need quotes (\"...\"), booleans are true/false";
        return false;
    }
    if (bn > 2 && body[0] == '0' && (body[1] == 'x' || body[1] == 'o' || body[1] == 'b')) {
        if (sign) {
            s->err = "hex, octal and binary integers take no sign";
            return false;
        }
        int base = body[1] == 'x' ? 16 : body[1] == 'o' ? 8 : 2;
        if (!number_token(body + 2, bn - 2, buf, sizeof(buf))) {
            s->err = "malformed integer";
            return false;
        }
        errno = 0;
        char *end = NULL;
        unsigned long long u = strtoull(buf, &end, base);
        if (errno || *end || u > INT64_MAX) {
            s->err = errno ? "integer out of range (64-bit)" : "malformed integer";
            return false;
        }
        v->kind = MT_TOML_INT;
        v->i = (int64_t)u;
        return true;
    }
    if (!number_token(start, n, buf, sizeof(buf))) {
        s->err = "malformed number (underscores must sit between digits)";
        return false;
    }
    bool is_float = strpbrk(buf, ".eE") != NULL;
    const char *digits = buf + (sign ? 1 : 0);
    if (digits[0] == '0' && isdigit((unsigned char)digits[1])) {
        s->err = "leading zeros are not allowed in TOML numbers";
        return false;
    }
    errno = 0;
    char *end = NULL;
    if (is_float) {
        const char *dot = strchr(buf, '.');
        if (dot && (!isdigit((unsigned char)dot[-1]) || !isdigit((unsigned char)dot[1]))) {
            s->err = "a float needs digits on both sides of '.' (e.g. 0.5, not .5 or 5.)";
            return false;
        }
        double d = strtod(buf, &end);
        if (*end || errno == ERANGE) {
            s->err = *end ? "malformed float" : "float out of range";
            return false;
        }
        v->kind = MT_TOML_FLOAT;
        v->f = d;
        return true;
    }
    long long ll = strtoll(buf, &end, 10);
    if (*end || errno == ERANGE) {
        s->err = *end ? "malformed value: strings need quotes (\"...\")" : "integer out of range (64-bit)";
        return false;
    }
    v->kind = MT_TOML_INT;
    v->i = ll;
    return true;
}

/* Scans a dotted key (bare or quoted parts) into out ("a.b.c"). */
static bool scan_key(scan_t *s, char *out, size_t cap) {
    size_t o = 0;
    for (;;) {
        skip_ws(s);
        const char *part;
        char *owned = NULL;
        size_t n;
        if (*s->p == '"' || *s->p == '\'') {
            owned = scan_string(s);
            if (!owned) {
                return false;
            }
            part = owned;
            n = strlen(owned);
        } else {
            part = s->p;
            while (is_bare(*s->p)) {
                s->p++;
            }
            n = (size_t)(s->p - part);
            if (n == 0) {
                s->err = "expected a key (letters, digits, '_' and '-', or a quoted string)";
                return false;
            }
        }
        if (o + n + 2 >= cap) {
            free(owned);
            s->err = "key too long";
            return false;
        }
        memcpy(out + o, part, n);
        o += n;
        out[o] = '\0';
        free(owned);
        skip_ws(s);
        if (*s->p != '.') {
            return true;
        }
        s->p++;
        out[o++] = '.';
    }
}

/* Keys and tables seen so far, to refuse duplicates. */
typedef struct {
    char **items;
    size_t n, cap;
} strset_t;

static bool strset_add(strset_t *set, const char *k) {
    for (size_t i = 0; i < set->n; i++) {
        if (!strcmp(set->items[i], k)) {
            return false;
        }
    }
    if (set->n == set->cap) {
        set->cap = set->cap ? set->cap * 2 : 32;
        set->items = realloc(set->items, set->cap * sizeof(char *));
    }
    set->items[set->n++] = strdup(k);
    return true;
}

static void strset_free(strset_t *set) {
    for (size_t i = 0; i < set->n; i++) {
        free(set->items[i]);
    }
    free(set->items);
}

static bool at_line_end(scan_t *s) {
    skip_ws(s);
    return *s->p == '\0' || *s->p == '\n' || *s->p == '#' || (*s->p == '\r' && s->p[1] == '\n');
}

int mt_toml_parse(const char *text, mt_toml_on_kv_t on_kv, mt_toml_on_error_t on_error, void *arg) {
    scan_t s = {.p = text, .line = 1};
    char table[256] = "", key[256], full[512], msg[640];
    strset_t keys = {0}, tables = {0};
    int errors = 0;
    while (*s.p) {
        skip_ws(&s);
        s.err = NULL;
        if (*s.p == '[') {
            s.p++;
            if (*s.p == '[') {
                s.err = "arrays of tables ([[...]]) are not supported in meshtrain configs";
            } else if (scan_key(&s, table, sizeof(table))) {
                skip_ws(&s);
                if (*s.p != ']') {
                    s.err = "expected ']' to close the table header";
                } else {
                    s.p++;
                    if (!at_line_end(&s)) {
                        s.err = "unexpected text after the table header";
                    } else if (!strset_add(&tables, table)) {
                        snprintf(msg, sizeof(msg), "table [%s] defined twice: merge its keys into one section", table);
                        on_error(arg, s.line, msg);
                        errors++;
                    }
                }
            }
        } else if (!at_line_end(&s)) {
            if (scan_key(&s, key, sizeof(key))) {
                skip_ws(&s);
                if (*s.p != '=') {
                    s.err = "expected '=' after the key";
                } else {
                    s.p++;
                    skip_ws(&s);
                    mt_toml_value_t v;
                    if (scan_value(&s, &v)) {
                        if (!at_line_end(&s)) {
                            s.err = "unexpected text after the value (one key = value per line; strings need quotes)";
                            free(v.s);
                        } else {
                            snprintf(full, sizeof(full), "%s%s%s", table, table[0] ? "." : "", key);
                            if (!strset_add(&keys, full)) {
                                snprintf(msg, sizeof(msg), "duplicate key %s: remove one of the two", full);
                                on_error(arg, s.line, msg);
                                errors++;
                                free(v.s);
                            } else {
                                on_kv(arg, full, s.line, &v);
                            }
                        }
                    }
                }
            }
        }
        if (s.err) {
            on_error(arg, s.line, s.err);
            errors++;
        } else if (*s.p == '#') {
            for (const char *c = s.p + 1; *c && *c != '\n'; c++) {
                if ((unsigned char)*c < 0x20 && *c != '\t' && !(*c == '\r' && c[1] == '\n')) {
                    on_error(arg, s.line, "control character in a comment");
                    errors++;
                    break;
                }
            }
        }
        while (*s.p && *s.p != '\n') {
            s.p++;
        }
        if (*s.p == '\n') {
            s.p++;
            s.line++;
        }
    }
    strset_free(&keys);
    strset_free(&tables);
    return errors;
}

bool mt_toml_parse_value(const char *str, mt_toml_value_t *out, const char **msg) {
    scan_t s = {.p = str, .line = 1};
    skip_ws(&s);
    if (!scan_value(&s, out)) {
        if (msg) {
            *msg = s.err;
        }
        return false;
    }
    skip_ws(&s);
    if (*s.p) {
        free(out->s);
        out->s = NULL;
        if (msg) {
            *msg = "unexpected text after the value";
        }
        return false;
    }
    return true;
}
