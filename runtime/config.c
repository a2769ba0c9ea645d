/* Loading, validating, broadcasting and printing the job configuration. The schema table
 * (config_schema.c) is the single source of truth for keys; this file enforces types, ranges,
 * choices and the cross-key rules, and reports every problem at once.
 * SPDX-License-Identifier: MIT */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config_toml.h"

typedef struct {
    mt_toml_kind_t kind; /* matches the schema type once validated */
    bool b;
    int64_t i;
    double f;
    char *s;
    mt_cfg_source_t source;
    int line; /* in the file, 0 otherwise */
} cfg_value_t;

struct mt_config {
    size_t n;
    const mt_cfg_schema_t *schema;
    cfg_value_t *v;
};

typedef struct {
    mt_config_t *cfg;
    const char *origin; /* file name for messages */
    FILE *errors;
    int n_errors;
    mt_cfg_source_t source;
} load_ctx_t;

static const char *type_name(mt_cfg_type_t t) {
    switch (t) {
    case MT_CFG_BOOL: return "a boolean (true or false)";
    case MT_CFG_INT: return "an integer";
    case MT_CFG_FLOAT: return "a number";
    default: return "a string in quotes";
    }
}

static const char *source_name(mt_cfg_source_t s) {
    switch (s) {
    case MT_CFG_SRC_FILE: return "file";
    case MT_CFG_SRC_OVERRIDE: return "override";
    case MT_CFG_SRC_DERIVED: return "derived";
    default: return "default";
    }
}

/* "[0, 8]" or "[1, inf)" for the schema's open-ended ranges. */
static const char *range_str(const mt_cfg_schema_t *sc, char *buf, size_t cap) {
    const char *fmt_open = sc->type == MT_CFG_INT ? "[%.0f, inf)" : "[%g, inf)";
    const char *fmt_closed = sc->type == MT_CFG_INT ? "[%.0f, %.0f]" : "[%g, %g]";
    if (sc->max >= 9.0e15) {
        snprintf(buf, cap, fmt_open, sc->min);
    } else {
        snprintf(buf, cap, fmt_closed, sc->min, sc->max);
    }
    return buf;
}

static void report(load_ctx_t *ctx, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void report(load_ctx_t *ctx, int line, const char *fmt, ...) {
    ctx->n_errors++;
    if (!ctx->errors) {
        return;
    }
    if (line > 0) {
        fprintf(ctx->errors, "%s:%d: ", ctx->origin, line);
    } else if (ctx->source == MT_CFG_SRC_DERIVED) {
        /* about a combination of keys: no single place to point at */
    } else if (ctx->source == MT_CFG_SRC_OVERRIDE) {
        fprintf(ctx->errors, "command line: ");
    } else {
        fprintf(ctx->errors, "%s: ", ctx->origin);
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(ctx->errors, fmt, ap);
    va_end(ap);
    fputc('\n', ctx->errors);
}

static int schema_index(const mt_config_t *cfg, const char *key) {
    for (size_t i = 0; i < cfg->n; i++) {
        if (!strcmp(cfg->schema[i].key, key)) {
            return (int)i;
        }
    }
    return -1;
}

/* Levenshtein distance, for did-you-mean. */
static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 128 || lb > 128) {
        return 1000;
    }
    size_t prev[130], cur[130];
    for (size_t j = 0; j <= lb; j++) {
        prev[j] = j;
    }
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = MT_MIN(sub, MT_MIN(del, ins));
        }
        memcpy(prev, cur, (lb + 1) * sizeof(size_t));
    }
    return prev[lb];
}

/* The nearest schema key to an unknown one, or NULL if nothing is close. */
static const char *nearest_key(const mt_config_t *cfg, const char *key) {
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    const char *dot = strchr(key, '.');
    for (size_t i = 0; i < cfg->n; i++) {
        const char *k = cfg->schema[i].key;
        size_t d = edit_distance(key, k);
        /* Same name in another section ("train.tp" -> "parallel.tp") counts as close too. */
        const char *kd = strchr(k, '.');
        if (dot && kd && !strcmp(dot, kd)) {
            d = MT_MIN(d, 2);
        }
        if (d < best_d) {
            best_d = d;
            best = k;
        }
    }
    size_t limit = MT_MAX((size_t)2, strlen(key) / 3);
    return best_d <= limit ? best : NULL;
}

static void value_clear(cfg_value_t *v) {
    free(v->s);
    v->s = NULL;
}

/* Checks a parsed value against schema entry idx and stores it; reports type/range/choice errors. */
/* Whether s is one of the '|'-separated choices. */
static bool in_choices(const char *choices, const char *s) {
    size_t len = strlen(s);
    for (const char *c = choices; c && *c;) {
        const char *bar = strchr(c, '|');
        size_t n = bar ? (size_t)(bar - c) : strlen(c);
        if (n == len && !strncmp(c, s, n)) {
            return true;
        }
        c = bar ? bar + 1 : NULL;
    }
    return false;
}

static void store(load_ctx_t *ctx, int idx, int line, mt_toml_value_t *tv) {
    const mt_cfg_schema_t *sc = &ctx->cfg->schema[idx];
    cfg_value_t nv = {.source = ctx->source, .line = line};
    char rb[64];
    switch (sc->type) {
    case MT_CFG_BOOL:
        if (tv->kind != MT_TOML_BOOL) {
            report(ctx, line, "%s must be %s", sc->key, type_name(sc->type));
            goto bad;
        }
        nv.kind = MT_TOML_BOOL;
        nv.b = tv->b;
        break;
    case MT_CFG_INT:
        if (tv->kind != MT_TOML_INT) {
            report(ctx, line, "%s must be %s in %s%s", sc->key, type_name(sc->type), range_str(sc, rb, sizeof(rb)),
                   tv->kind == MT_TOML_FLOAT ? " (no decimal point)" : "");
            goto bad;
        }
        if ((double)tv->i < sc->min || (double)tv->i > sc->max) {
            report(ctx, line, "%s = %lld is out of range: valid is %s", sc->key, (long long)tv->i,
                   range_str(sc, rb, sizeof(rb)));
            goto bad;
        }
        nv.kind = MT_TOML_INT;
        nv.i = tv->i;
        break;
    case MT_CFG_FLOAT: {
        double d;
        if (tv->kind == MT_TOML_INT) {
            d = (double)tv->i;
        } else if (tv->kind == MT_TOML_FLOAT) {
            d = tv->f;
        } else {
            report(ctx, line, "%s must be %s in %s", sc->key, type_name(sc->type), range_str(sc, rb, sizeof(rb)));
            goto bad;
        }
        if (!isfinite(d) || d < sc->min || d > sc->max) {
            report(ctx, line, "%s = %g is out of range: valid is %s", sc->key, d, range_str(sc, rb, sizeof(rb)));
            goto bad;
        }
        nv.kind = MT_TOML_FLOAT;
        nv.f = d;
        break;
    }
    case MT_CFG_STRING:
        if (tv->kind != MT_TOML_STRING) {
            report(ctx, line, "%s must be %s%s%s", sc->key, type_name(sc->type), sc->choices ? ", one of " : "",
                   sc->choices ? sc->choices : "");
            goto bad;
        }
        if (sc->choices) {
            if (!in_choices(sc->choices, tv->s)) {
                report(ctx, line, "%s = \"%s\" is not valid: choose one of %s", sc->key, tv->s, sc->choices);
                goto bad;
            }
        }
        nv.kind = MT_TOML_STRING;
        nv.s = tv->s;
        tv->s = NULL;
        break;
    }
    value_clear(&ctx->cfg->v[idx]);
    ctx->cfg->v[idx] = nv;
    return;
bad:
    free(tv->s);
    tv->s = NULL;
}

static void unknown_key(load_ctx_t *ctx, int line, const char *key) {
    const char *near = nearest_key(ctx->cfg, key);
    if (near) {
        report(ctx, line, "unknown key %s; did you mean %s?", key, near);
    } else {
        report(ctx, line, "unknown key %s (`meshtrain config --help` lists every key)", key);
    }
}

static void on_kv(void *arg, const char *key, int line, mt_toml_value_t *v) {
    load_ctx_t *ctx = arg;
    int idx = schema_index(ctx->cfg, key);
    if (idx < 0) {
        unknown_key(ctx, line, key);
        free(v->s);
        return;
    }
    store(ctx, idx, line, v);
}

static void on_error(void *arg, int line, const char *msg) {
    report(arg, line, "%s", msg);
}

static mt_config_t *config_defaults(void) {
    mt_config_t *cfg = calloc(1, sizeof(*cfg));
    cfg->schema = mt_config_schema(&cfg->n);
    cfg->v = calloc(cfg->n, sizeof(cfg_value_t));
    load_ctx_t ctx = {.cfg = cfg, .origin = "schema", .errors = stderr, .source = MT_CFG_SRC_DEFAULT};
    for (size_t i = 0; i < cfg->n; i++) {
        mt_toml_value_t tv;
        const char *msg = NULL;
        if (cfg->schema[i].type == MT_CFG_STRING) {
            tv = (mt_toml_value_t){.kind = MT_TOML_STRING, .s = strdup(cfg->schema[i].dflt)};
        } else if (!mt_toml_parse_value(cfg->schema[i].dflt, &tv, &msg)) {
            MT_ABORT("schema default of %s (%s) does not parse: %s", cfg->schema[i].key, cfg->schema[i].dflt, msg);
        }
        store(&ctx, (int)i, 0, &tv);
        MT_ASSERT(ctx.n_errors == 0); /* a default outside its own range is a schema bug */
    }
    return cfg;
}

static char *read_file(const char *path, const char **why) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *why = strerror(errno);
        return NULL;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        *why = "it is a directory, not a config file";
        fclose(f);
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0) {
        *why = "cannot seek";
        fclose(f);
        return NULL;
    }
    long len = ftell(f);
    if (len < 0 || len > (16L << 20)) {
        *why = len < 0 ? "cannot tell its size" : "larger than 16 MiB: not a config file";
        fclose(f);
        return NULL;
    }
    rewind(f);
    char *buf = malloc((size_t)len + 1);
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) {
        *why = "read failed";
        free(buf);
        fclose(f);
        return NULL;
    }
    buf[len] = '\0';
    fclose(f);
    if (memchr(buf, '\0', (size_t)len)) {
        *why = "contains NUL bytes: not a text config file";
        free(buf);
        return NULL;
    }
    return buf;
}

/* ---- getters ------------------------------------------------------------------------------ */

static const cfg_value_t *get(const mt_config_t *cfg, const char *key, mt_cfg_type_t type) {
    int idx = schema_index(cfg, key);
    if (idx < 0) {
        MT_ABORT("config key %s is not in the schema (runtime/config_schema.c)", key);
    }
    if (cfg->schema[idx].type != type) {
        MT_ABORT("config key %s read as the wrong type", key);
    }
    return &cfg->v[idx];
}

bool mt_config_bool(const mt_config_t *cfg, const char *key) { return get(cfg, key, MT_CFG_BOOL)->b; }
int64_t mt_config_int(const mt_config_t *cfg, const char *key) { return get(cfg, key, MT_CFG_INT)->i; }
double mt_config_float(const mt_config_t *cfg, const char *key) { return get(cfg, key, MT_CFG_FLOAT)->f; }
const char *mt_config_str(const mt_config_t *cfg, const char *key) { return get(cfg, key, MT_CFG_STRING)->s; }

mt_cfg_source_t mt_config_source(const mt_config_t *cfg, const char *key) {
    int idx = schema_index(cfg, key);
    MT_ASSERT(idx >= 0);
    return cfg->v[idx].source;
}

static void set_int(mt_config_t *cfg, const char *key, int64_t v, mt_cfg_source_t src) {
    int idx = schema_index(cfg, key);
    MT_ASSERT(idx >= 0 && cfg->schema[idx].type == MT_CFG_INT);
    cfg->v[idx].i = v;
    cfg->v[idx].source = src;
}

/* ---- cross-key rules ------------------------------------------------------------------------ */

static int line_of(const mt_config_t *cfg, const char *key) {
    int idx = schema_index(cfg, key);
    return idx >= 0 ? cfg->v[idx].line : 0;
}

static void validate(load_ctx_t *ctx, int world) {
    mt_config_t *cfg = ctx->cfg;
    ctx->source = MT_CFG_SRC_DERIVED; /* messages below are about the combination, not one input */
    int64_t tp = mt_config_int(cfg, "parallel.tp"), pp = mt_config_int(cfg, "parallel.pp");
    int64_t dp = mt_config_int(cfg, "parallel.dp");
    /* Mesh order. */
    const char *order = mt_config_str(cfg, "parallel.order");
    if (strcmp(order, "auto") != 0) {
        char buf[64];
        snprintf(buf, sizeof(buf), "%s", order);
        int seen[3] = {0, 0, 0}, n = 0;
        bool ok = true;
        for (char *save = NULL, *t = strtok_r(buf, "-", &save); t; t = strtok_r(NULL, "-", &save), n++) {
            int a = !strcmp(t, "tp") ? 0 : !strcmp(t, "dp") ? 1 : !strcmp(t, "pp") ? 2 : -1;
            if (a < 0 || seen[a]++) {
                ok = false;
            }
        }
        if (!ok || n != 3) {
            report(ctx, line_of(cfg, "parallel.order"),
                   "parallel.order = \"%s\" is not valid: write the axes tp, dp, pp once each, fastest-varying first "
                   "(e.g. \"tp-dp-pp\"), or \"auto\"", order);
        }
    }
    if (world > 0) {
        if (dp == 0) {
            if (world % (tp * pp) != 0) {
                report(ctx, 0, "world size %d is not divisible by parallel.tp x parallel.pp = %lld x %lld: "
                       "launch a multiple of %lld ranks or change tp/pp", world, (long long)tp, (long long)pp,
                       (long long)(tp * pp));
            } else {
                dp = world / (tp * pp);
                set_int(cfg, "parallel.dp", dp, MT_CFG_SRC_DERIVED);
            }
        } else if (tp * pp * dp != world) {
            report(ctx, 0, "parallel.tp x parallel.pp x parallel.dp = %lld x %lld x %lld = %lld, but the job has %d "
                   "ranks: make the product equal the world size (or set parallel.dp = 0 to derive it)",
                   (long long)tp, (long long)pp, (long long)dp, (long long)(tp * pp * dp), world);
            dp = 0;
        }
    }
    /* Batch arithmetic: global_batch = micro_batch x grad_accum x dp. */
    int64_t gb = mt_config_int(cfg, "train.global_batch"), mb = mt_config_int(cfg, "train.micro_batch");
    int64_t ga = mt_config_int(cfg, "train.grad_accum");
    if (dp > 0) {
        if (mb == 0 && ga == 0) {
            ga = 1;
            set_int(cfg, "train.grad_accum", 1, MT_CFG_SRC_DERIVED);
        }
        if (mb == 0) {
            if (gb % (ga * dp) != 0) {
                report(ctx, line_of(cfg, "train.global_batch"), "train.global_batch = %lld is not divisible by "
                       "train.grad_accum x dp = %lld x %lld: choose a global batch that is a multiple of %lld",
                       (long long)gb, (long long)ga, (long long)dp, (long long)(ga * dp));
            } else {
                set_int(cfg, "train.micro_batch", gb / (ga * dp), MT_CFG_SRC_DERIVED);
            }
        } else if (ga == 0) {
            if (gb % (mb * dp) != 0) {
                report(ctx, line_of(cfg, "train.global_batch"), "train.global_batch = %lld is not divisible by "
                       "train.micro_batch x dp = %lld x %lld: choose a global batch that is a multiple of %lld",
                       (long long)gb, (long long)mb, (long long)dp, (long long)(mb * dp));
            } else {
                ga = gb / (mb * dp);
                set_int(cfg, "train.grad_accum", ga, MT_CFG_SRC_DERIVED);
            }
        } else if (mb * ga * dp != gb) {
            report(ctx, line_of(cfg, "train.global_batch"), "train.global_batch = %lld but train.micro_batch x "
                   "train.grad_accum x dp = %lld x %lld x %lld = %lld: make them agree (or set micro_batch or "
                   "grad_accum to 0 to derive it)", (long long)gb, (long long)mb, (long long)ga, (long long)dp,
                   (long long)(mb * ga * dp));
        }
        int64_t m = mt_config_int(cfg, "parallel.microbatches");
        ga = mt_config_int(cfg, "train.grad_accum");
        if (m != 0 && ga != 0 && m != ga) {
            report(ctx, line_of(cfg, "parallel.microbatches"), "parallel.microbatches = %lld but the step has %lld "
                   "micro-batches (train.global_batch / (dp x train.micro_batch)): set it to %lld or 0",
                   (long long)m, (long long)ga, (long long)ga);
        }
    }
    /* Model shape. */
    const char *kind = mt_config_str(cfg, "model.kind");
    int64_t n_head = mt_config_int(cfg, "model.n_head"), n_embd = mt_config_int(cfg, "model.n_embd");
    int64_t vocab = mt_config_int(cfg, "model.vocab_size"), pv = mt_config_int(cfg, "model.padded_vocab");
    if (!strcmp(kind, "gpt2")) {
        if (n_embd % n_head != 0) {
            report(ctx, line_of(cfg, "model.n_embd"), "model.n_embd = %lld is not divisible by model.n_head = %lld",
                   (long long)n_embd, (long long)n_head);
        }
        if (n_head % tp != 0) {
            report(ctx, line_of(cfg, "model.n_head"), "model.n_head = %lld is not divisible by parallel.tp = %lld: "
                   "tensor parallelism gives each rank whole heads", (long long)n_head, (long long)tp);
        }
    }
    if (pv == 0) {
        int64_t mult = 128 * tp;
        pv = MT_DIV_UP(vocab, mult) * mult;
        set_int(cfg, "model.padded_vocab", pv, MT_CFG_SRC_DERIVED);
    } else if (pv < vocab) {
        report(ctx, line_of(cfg, "model.padded_vocab"), "model.padded_vocab = %lld is smaller than "
               "model.vocab_size = %lld", (long long)pv, (long long)vocab);
    } else if (pv % tp != 0) {
        report(ctx, line_of(cfg, "model.padded_vocab"), "model.padded_vocab = %lld is not divisible by "
               "parallel.tp = %lld (each tp rank holds an equal slice of the vocabulary)", (long long)pv,
               (long long)tp);
    }
    /* Pipeline stage split. */
    const char *sl = mt_config_str(cfg, "parallel.stage_layers");
    if (*sl) {
        int64_t n = 0, sum = 0;
        bool ok = true;
        const char *p = sl;
        while (*p) {
            char *end = NULL;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0) {
                ok = false;
                break;
            }
            n++;
            sum += v;
            p = end;
            if (*p == ',') {
                p++;
            } else if (*p) {
                ok = false;
                break;
            }
        }
        int64_t nl = mt_config_int(cfg, "model.n_layer");
        if (!ok || n != pp || sum != nl) {
            report(ctx, line_of(cfg, "parallel.stage_layers"), "parallel.stage_layers = \"%s\" must list %lld "
                   "comma-separated block counts (one per pipeline stage) adding up to model.n_layer = %lld", sl,
                   (long long)pp, (long long)nl);
        }
    }
    const char *steps = mt_config_str(cfg, "profile.steps");
    if (*steps) {
        long a = -1, b = -1;
        char extra;
        if (sscanf(steps, "%ld-%ld%c", &a, &b, &extra) != 2 || a < 0 || b < a) {
            report(ctx, line_of(cfg, "profile.steps"), "profile.steps = \"%s\" must be \"A-B\" with 0 <= A <= B",
                   steps);
        }
    }
}

/* ---- loading ------------------------------------------------------------------------------ */

mt_status_t mt_config_load(const char *path, int n_overrides, char *const *overrides, int world_size,
                           mt_config_t **out, FILE *errors) {
    *out = NULL;
    mt_config_t *cfg = config_defaults();
    load_ctx_t ctx = {.cfg = cfg, .errors = errors, .source = MT_CFG_SRC_FILE};
    if (path) {
        bool embedded = !strcmp(path, MT_CONFIG_EMBEDDED);
        const char *why = NULL;
        char *text = embedded ? strdup(mt_config_default_toml) : read_file(path, &why);
        ctx.origin = embedded ? "embedded default config" : path;
        if (!text) {
            report(&ctx, 0, "cannot read the config file: %s (check the path)", why);
        } else {
            mt_toml_parse(text, on_kv, on_error, &ctx);
            free(text);
        }
    }
    ctx.source = MT_CFG_SRC_OVERRIDE;
    ctx.origin = "command line";
    for (int i = 0; i < n_overrides; i++) {
        const char *arg = overrides[i];
        const char *kstart = arg + (strncmp(arg, "--", 2) == 0 ? 2 : 0);
        const char *eq = strchr(kstart, '=');
        if (!eq) {
            report(&ctx, 0, "override %s needs a value: write --section.key=value", arg);
            continue;
        }
        char key[256];
        snprintf(key, sizeof(key), "%.*s", (int)(eq - kstart), kstart);
        int idx = schema_index(cfg, key);
        if (idx < 0) {
            unknown_key(&ctx, 0, key);
            continue;
        }
        mt_toml_value_t tv;
        const char *msg = NULL;
        if (!mt_toml_parse_value(eq + 1, &tv, &msg)) {
            if (cfg->schema[idx].type == MT_CFG_STRING) {
                /* Shells eat quotes: a bare word is a string for string keys. */
                tv = (mt_toml_value_t){.kind = MT_TOML_STRING, .s = strdup(eq + 1)};
            } else {
                report(&ctx, 0, "%s=%s: %s must be %s", key, eq + 1, key, type_name(cfg->schema[idx].type));
                continue;
            }
        }
        store(&ctx, idx, 0, &tv);
    }
    ctx.origin = path ? (strcmp(path, MT_CONFIG_EMBEDDED) ? path : "embedded default config") : "config";
    validate(&ctx, world_size); /* also after errors: report every problem at once */
    if (ctx.n_errors) {
        mt_config_free(cfg);
        return mt_error(MT_ERR_INVALID_ARG, "%d config error%s", ctx.n_errors, ctx.n_errors > 1 ? "s" : "");
    }
    *out = cfg;
    return MT_OK;
}

typedef struct {
    const char *key;
    char *out;
    size_t len;
} peek_ctx_t;

static void peek_kv(void *arg, const char *key, int line, mt_toml_value_t *v) {
    (void)line;
    peek_ctx_t *p = arg;
    if (!strcmp(key, p->key) && v->kind == MT_TOML_STRING) {
        snprintf(p->out, p->len, "%s", v->s);
    }
    free(v->kind == MT_TOML_STRING ? v->s : NULL);
}

static void peek_error(void *arg, int line, const char *msg) {
    (void)arg;
    (void)line;
    (void)msg;
}

void mt_config_peek_str(const char *path, int n_overrides, char *const *overrides, const char *key, char *out,
                        size_t len) {
    size_t n = 0;
    const mt_cfg_schema_t *schema = mt_config_schema(&n), *sc = NULL;
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(schema[i].key, key)) {
            sc = &schema[i];
            snprintf(out, len, "%s", sc->dflt);
        }
    }
    peek_ctx_t p = {key, out, len};
    if (path && !strcmp(path, MT_CONFIG_EMBEDDED)) {
        mt_toml_parse(mt_config_default_toml, peek_kv, peek_error, &p);
    } else if (path) {
        const char *why = NULL;
        char *text = read_file(path, &why);
        if (text) {
            mt_toml_parse(text, peek_kv, peek_error, &p);
            free(text);
        }
    }
    size_t klen = strlen(key);
    for (int i = 0; i < n_overrides; i++) {
        const char *a = overrides[i] + (strncmp(overrides[i], "--", 2) == 0 ? 2 : 0);
        if (!strncmp(a, key, klen) && a[klen] == '=') {
            mt_toml_value_t tv;
            if (mt_toml_parse_value(a + klen + 1, &tv, NULL)) {
                if (tv.kind == MT_TOML_STRING) {
                    snprintf(out, len, "%s", tv.s);
                    free(tv.s);
                }
            } else {
                snprintf(out, len, "%s", a + klen + 1); /* a bare word, as mt_config_load takes it */
            }
        }
    }
    if (sc && sc->choices && !in_choices(sc->choices, out)) {
        snprintf(out, len, "%s", sc->dflt); /* the load reports it, naming the valid values */
    }
}

void mt_config_free(mt_config_t *cfg) {
    if (!cfg) {
        return;
    }
    for (size_t i = 0; i < cfg->n; i++) {
        value_clear(&cfg->v[i]);
    }
    free(cfg->v);
    free(cfg);
}

/* ---- broadcast ---------------------------------------------------------------------------- */

/* Wire format: per key, in schema order: u8 source, then int64 / double / u8 / (u32 length + bytes). */
static size_t serialize(const mt_config_t *cfg, char *buf) {
    size_t o = 0;
#define PUT(ptr, n)                       \
    do {                                  \
        if (buf) {                        \
            memcpy(buf + o, (ptr), (n));  \
        }                                 \
        o += (n);                         \
    } while (0)
    for (size_t i = 0; i < cfg->n; i++) {
        const cfg_value_t *v = &cfg->v[i];
        uint8_t src = (uint8_t)v->source;
        PUT(&src, 1);
        switch (cfg->schema[i].type) {
        case MT_CFG_BOOL: {
            uint8_t b = v->b;
            PUT(&b, 1);
            break;
        }
        case MT_CFG_INT: PUT(&v->i, sizeof(int64_t)); break;
        case MT_CFG_FLOAT: PUT(&v->f, sizeof(double)); break;
        case MT_CFG_STRING: {
            uint32_t len = (uint32_t)strlen(v->s);
            PUT(&len, sizeof(len));
            PUT(v->s, len);
            break;
        }
        }
    }
#undef PUT
    return o;
}

static mt_config_t *deserialize(const char *buf) {
    mt_config_t *cfg = config_defaults();
    size_t o = 0;
    for (size_t i = 0; i < cfg->n; i++) {
        cfg_value_t *v = &cfg->v[i];
        v->source = (mt_cfg_source_t)(uint8_t)buf[o++];
        switch (cfg->schema[i].type) {
        case MT_CFG_BOOL: v->b = buf[o++] != 0; break;
        case MT_CFG_INT: memcpy(&v->i, buf + o, sizeof(int64_t)); o += sizeof(int64_t); break;
        case MT_CFG_FLOAT: memcpy(&v->f, buf + o, sizeof(double)); o += sizeof(double); break;
        case MT_CFG_STRING: {
            uint32_t len;
            memcpy(&len, buf + o, sizeof(len));
            o += sizeof(len);
            free(v->s);
            v->s = strndup(buf + o, len);
            o += len;
            break;
        }
        }
    }
    return cfg;
}

/* The configuration is broadcast before the job's watchdog exists (runtime.watchdog_s is in it), so the
 * broadcast bounds its own wait: MESHTRAIN_WATCHDOG_S, the watchdog's own default. A rank that waits longer
 * (rank 0 stuck reading the file, or never started its part) says so and aborts the job. */
MT_PARAM(config_wait_s, "WATCHDOG_S", 600)
MT_PARAM(test_config_stall_s, "TEST_CONFIG_STALL_S", 0)

static mt_status_t bcast_bounded(void *buf, int count, MPI_Datatype type, MPI_Comm comm, int rank, const char *what) {
    MPI_Request req;
    MT_MPI_CHECK(MPI_Ibcast(buf, count, type, 0, comm, &req));
    double limit = (double)mt_param_config_wait_s(), start = mt_now();
    long nap_ns = 1000;
    for (;;) {
        int done = 0;
        MT_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
        if (done) {
            return MT_OK;
        }
        if (limit > 0 && mt_now() - start > limit) {
            fprintf(stderr,
                    "meshtrain: rank %d: waited %.0f s for rank 0 to broadcast the %s (MPI_Ibcast on the world "
                    "communicator): rank 0 is stuck loading the configuration or did not start; aborting the job "
                    "(MESHTRAIN_WATCHDOG_S sets this limit)\n",
                    rank, limit, what);
            fflush(stderr);
            MPI_Abort(comm, 3);
            return mt_error(MT_ERR_TIMEOUT, "configuration broadcast timed out");
        }
        struct timespec ts = {0, nap_ns};
        nanosleep(&ts, NULL);
        nap_ns = nap_ns < 1000000 ? nap_ns * 2 : nap_ns; /* up to 1 ms between polls */
    }
}

mt_status_t mt_config_load_world(MPI_Comm comm, const char *path, int n_overrides, char *const *overrides,
                                 mt_config_t **out) {
    int rank, size;
    MT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    MT_MPI_CHECK(MPI_Comm_size(comm, &size));
    *out = NULL;
    /* header[0]: verdict (0 ok), header[1]: payload bytes */
    long long header[2] = {0, 0};
    mt_config_t *cfg = NULL;
    char *buf = NULL;
    if (rank == 0 && size > 1 && mt_param_test_config_stall_s() > 0) { /* test knob: rank 0 stuck in the load */
        sleep((unsigned)mt_param_test_config_stall_s());
    }
    if (rank == 0) {
        char *msgs = NULL;
        size_t msgs_len = 0;
        FILE *mem = open_memstream(&msgs, &msgs_len);
        mt_status_t st = mt_config_load(path, n_overrides, overrides, size, &cfg, mem ? mem : stderr);
        if (mem) {
            fclose(mem);
        }
        if (st != MT_OK) {
            /* One line per problem, all at once, then the verdict goes to every rank. */
            for (char *save = NULL, *l = strtok_r(msgs, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
                fprintf(stderr, "meshtrain: config error: %s\n", l);
            }
            fflush(stderr);
            header[0] = 1;
        } else {
            header[1] = (long long)serialize(cfg, NULL);
            buf = malloc((size_t)header[1]);
            if (!buf) {
                fprintf(stderr, "meshtrain: config error: out of memory serialising the configuration (%lld bytes)\n",
                        header[1]);
                header[0] = 1;
            } else {
                serialize(cfg, buf);
            }
        }
        free(msgs);
    }
    MT_CHECK(bcast_bounded(header, 2, MPI_LONG_LONG, comm, rank, "configuration's verdict"));
    if (header[0] != 0) {
        mt_config_free(cfg);
        return mt_error(MT_ERR_INVALID_ARG, "invalid configuration (errors printed by rank 0)");
    }
    if (rank != 0) {
        buf = malloc((size_t)header[1]);
    }
    /* A rank that cannot allocate still takes part in the broadcast (into a sink), then fails. */
    char *sink = NULL;
    if (!buf) {
        sink = malloc((size_t)header[1]);
        if (!sink) {
            fprintf(stderr, "meshtrain: rank %d: out of memory receiving the configuration (%lld bytes); aborting\n",
                    rank, header[1]);
            MPI_Abort(comm, 1);
        }
    }
    if (bcast_bounded(buf ? buf : sink, (int)header[1], MPI_BYTE, comm, rank, "configuration") != MT_OK) {
        free(buf);
        free(sink);
        mt_config_free(cfg);
        return mt_error(MT_ERR_MPI, "broadcast of the configuration failed");
    }
    free(sink);
    if (rank != 0 && buf) {
        cfg = deserialize(buf);
    }
    free(buf);
    if (!cfg) {
        return mt_error(MT_ERR_OOM, "out of memory receiving the configuration (%lld bytes)", header[1]);
    }
    *out = cfg;
    return MT_OK;
}

/* ---- command line ----------------------------------------------------------------------- */

mt_status_t mt_config_split_args(int argc, char **argv, mt_config_cli_t *out) {
    memset(out, 0, sizeof(*out));
    out->overrides = calloc((size_t)argc + 1, sizeof(char *));
    out->rest_argv = calloc((size_t)argc + 1, sizeof(char *));
    if (!out->overrides || !out->rest_argv) {
        mt_config_cli_free(out);
        return mt_error(MT_ERR_OOM, "out of memory splitting the command line");
    }
    out->rest_argv[out->rest_argc++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *eq = strchr(a, '=');
        const char *dot = strchr(a, '.');
        size_t len = strlen(a);
        const char *cfg_path = NULL;
        if (!strcmp(a, "--config") && i + 1 < argc) {
            cfg_path = argv[++i];
        } else if (!strncmp(a, "--config=", 9)) {
            cfg_path = a + 9;
        } else if (!strncmp(a, "--", 2) && dot && (!eq || dot < eq)) {
            out->overrides[out->n_overrides++] = argv[i];
            continue;
        } else if (a[0] != '-' && len > 5 && !strcmp(a + len - 5, ".toml")) {
            cfg_path = a;
        }
        if (!cfg_path) {
            out->rest_argv[out->rest_argc++] = argv[i];
            continue;
        }
        if (out->path) {
            mt_status_t st = mt_error(MT_ERR_INVALID_ARG, "two config files given (%s and %s): pass one, and "
                                      "change single keys with --section.key=value", out->path, cfg_path);
            mt_config_cli_free(out);
            return st;
        }
        out->path = cfg_path;
    }
    return MT_OK;
}

void mt_config_cli_free(mt_config_cli_t *cli) {
    free(cli->overrides);
    free(cli->rest_argv);
    memset(cli, 0, sizeof(*cli));
}

/* ---- printing ------------------------------------------------------------------------------ */

static void print_toml_string(FILE *out, const char *s) {
    fputc('"', out);
    for (; *s; s++) {
        switch (*s) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\t': fputs("\\t", out); break;
        default:
            if ((unsigned char)*s < 0x20) {
                fprintf(out, "\\u%04x", (unsigned char)*s);
            } else {
                fputc(*s, out);
            }
        }
    }
    fputc('"', out);
}

static void print_section_header(FILE *out, const char *key, char *section, size_t cap) {
    const char *dot = strchr(key, '.');
    size_t n = (size_t)(dot - key);
    if (strlen(section) != n || strncmp(section, key, n) != 0) {
        snprintf(section, cap, "%.*s", (int)n, key);
        fprintf(out, "\n[%s]\n", section);
    }
}

void mt_config_print(const mt_config_t *cfg, FILE *out) {
    char section[64] = "";
    fprintf(out, "# effective meshtrain configuration: each key with its value and where it came from");
    for (size_t i = 0; i < cfg->n; i++) {
        const mt_cfg_schema_t *sc = &cfg->schema[i];
        const cfg_value_t *v = &cfg->v[i];
        print_section_header(out, sc->key, section, sizeof(section));
        char line[512];
        FILE *m = fmemopen(line, sizeof(line), "w");
        fprintf(m, "%s = ", strchr(sc->key, '.') + 1);
        switch (sc->type) {
        case MT_CFG_BOOL: fputs(v->b ? "true" : "false", m); break;
        case MT_CFG_INT: fprintf(m, "%lld", (long long)v->i); break;
        case MT_CFG_FLOAT: {
            char num[64];
            snprintf(num, sizeof(num), "%.17g", v->f);
            /* Shortest text that round-trips, always with a '.' or exponent so it stays a float. */
            for (int prec = 1; prec <= 17; prec++) {
                snprintf(num, sizeof(num), "%.*g", prec, v->f);
                if (strtod(num, NULL) == v->f) {
                    break;
                }
            }
            if (!strpbrk(num, ".eEn")) {
                strcat(num, ".0");
            }
            fputs(num, m);
            break;
        }
        case MT_CFG_STRING: print_toml_string(m, v->s); break;
        }
        fputc('\0', m);
        fclose(m);
        line[sizeof(line) - 1] = '\0';
        fprintf(out, "%-36s # %s", line, source_name(v->source));
        if (v->line > 0) {
            fprintf(out, " (line %d)", v->line);
        }
        fputc('\n', out);
    }
}

void mt_config_print_schema(FILE *out) {
    size_t n;
    const mt_cfg_schema_t *s = mt_config_schema(&n);
    char section[64] = "";
    for (size_t i = 0; i < n; i++) {
        print_section_header(out, s[i].key, section, sizeof(section));
        char range[160] = "";
        switch (s[i].type) {
        case MT_CFG_INT:
        case MT_CFG_FLOAT: {
            char rb[64];
            snprintf(range, sizeof(range), "%s in %s", s[i].type == MT_CFG_INT ? "int" : "float",
                     range_str(&s[i], rb, sizeof(rb)));
            break;
        }
        case MT_CFG_BOOL: snprintf(range, sizeof(range), "bool"); break;
        case MT_CFG_STRING:
            snprintf(range, sizeof(range), "%s%s", s[i].choices ? "one of " : "string",
                     s[i].choices ? s[i].choices : "");
            break;
        }
        fprintf(out, "  %-32s %-30s default %-12s %s\n", s[i].key, range, s[i].dflt, s[i].help);
    }
}
