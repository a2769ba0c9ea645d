/* The config parser and validator: valid TOML of the supported subset parses to the right values,
 * every class of bad input is reported (all at once, with file:line, key, range and did-you-mean),
 * overrides win over the file, derived values are computed, and the printed effective config parses
 * back to the same values.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/config.h"
#include "runtime/config_toml.h"
#include "testutil.h"

static char tmpdir[] = "/tmp/mt_test_config_XXXXXX";

static const char *write_tmp(const char *name, const char *text) {
    static char path[512];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

/* Loads text (world size given) and returns the status; the error text goes to errbuf. */
static mt_status_t load_text(const char *text, int n_over, char **over, int world, mt_config_t **cfg, char *errbuf,
                             size_t cap) {
    const char *path = write_tmp("job.toml", text);
    FILE *mem = fmemopen(errbuf, cap, "w");
    mt_status_t st = mt_config_load(path, n_over, over, world, cfg, mem);
    fputc('\0', mem);
    fclose(mem);
    errbuf[cap - 1] = '\0';
    return st;
}

/* Expects text to fail with a message containing every needle. */
static void expect_error(const char *text, const char *const *needles, int world) {
    char err[4096];
    mt_config_t *cfg = NULL;
    mt_status_t st = load_text(text, 0, NULL, world, &cfg, err, sizeof(err));
    CHECK(st == MT_ERR_INVALID_ARG && cfg == NULL, "expected failure for <<%s>>", text);
    for (int i = 0; needles[i]; i++) {
        CHECK(strstr(err, needles[i]) != NULL, "message lacks '%s': %s", needles[i], err);
    }
}
#define EXPECT_ERROR(text, world, ...)                      \
    do {                                                    \
        const char *needles_[] = {__VA_ARGS__, NULL};      \
        expect_error((text), needles_, (world));            \
    } while (0)

static void test_values(void) {
    char err[4096];
    mt_config_t *cfg = NULL;
    const char *text = "# a comment\n"
                       "[model]\n"
                       "kind = \"gpt2\"   # trailing comment\n"
                       "n_layer = 1_2\n"
                       "n_embd = 0x60\n"
                       "n_head = +4\n"
                       "init = 'llmc:C:\\dir\\model.bin'\n"
                       "[optimizer]\n"
                       "lr = 6e-4\n"
                       "beta2 = 0.999_9\n"
                       "weight_decay = 1\n"
                       "[checkpoint]\n"
                       "dir = \"ck\\tpt \\\"q\\\" \\u00e9\\U0001F600\"\n"
                       "on_signal = false\n"
                       "[\"metrics\"]\n"
                       "\"jsonl\" = \"m # not a comment.jsonl\"\n"
                       "[train]\n"
                       "steps = 0o17\n"
                       "seed = 0b101\n"
                       "\n"
                       "[parallel]\n"
                       "\t order = \"dp-tp-pp\"\n";
    mt_status_t st = load_text(text, 0, NULL, 0, &cfg, err, sizeof(err));
    CHECK(st == MT_OK, "valid config rejected: %s", err);
    if (!cfg) {
        return;
    }
    CHECK(mt_config_int(cfg, "model.n_layer") == 12, "underscore int");
    CHECK(mt_config_int(cfg, "model.n_embd") == 96, "hex int");
    CHECK(mt_config_int(cfg, "model.n_head") == 4, "signed int");
    CHECK(!strcmp(mt_config_str(cfg, "model.init"), "llmc:C:\\dir\\model.bin"), "literal string keeps backslashes");
    CHECK_CLOSE(mt_config_float(cfg, "optimizer.lr"), 6e-4, 0, 0);
    CHECK_CLOSE(mt_config_float(cfg, "optimizer.beta2"), 0.9999, 0, 0);
    CHECK_CLOSE(mt_config_float(cfg, "optimizer.weight_decay"), 1.0, 0, 0);
    CHECK(!strcmp(mt_config_str(cfg, "checkpoint.dir"), "ck\tpt \"q\" \xc3\xa9\xf0\x9f\x98\x80"), "escapes: %s",
          mt_config_str(cfg, "checkpoint.dir"));
    CHECK(mt_config_bool(cfg, "checkpoint.on_signal") == false, "bool");
    CHECK(!strcmp(mt_config_str(cfg, "metrics.jsonl"), "m # not a comment.jsonl"), "quoted keys and # in strings");
    CHECK(mt_config_int(cfg, "train.steps") == 15 && mt_config_int(cfg, "train.seed") == 5, "octal / binary");
    CHECK(!strcmp(mt_config_str(cfg, "parallel.order"), "dp-tp-pp"), "order");
    CHECK(mt_config_source(cfg, "model.n_layer") == MT_CFG_SRC_FILE, "source file");
    CHECK(mt_config_source(cfg, "model.seq_len") == MT_CFG_SRC_DEFAULT, "source default");
    CHECK(mt_config_source(cfg, "model.padded_vocab") == MT_CFG_SRC_DERIVED, "source derived");
    CHECK(mt_config_int(cfg, "model.padded_vocab") == 256, "padded vocab derived: %lld",
          (long long)mt_config_int(cfg, "model.padded_vocab"));

    /* The printed effective config is TOML that loads back to identical values. */
    char *printed = NULL;
    size_t plen = 0;
    FILE *m = open_memstream(&printed, &plen);
    mt_config_print(cfg, m);
    fclose(m);
    mt_config_t *again = NULL;
    st = load_text(printed, 0, NULL, 0, &again, err, sizeof(err));
    CHECK(st == MT_OK, "printed config does not load back: %s\n%s", err, printed);
    if (again) {
        size_t n;
        const mt_cfg_schema_t *sc = mt_config_schema(&n);
        for (size_t i = 0; i < n; i++) {
            const char *k = sc[i].key;
            switch (sc[i].type) {
            case MT_CFG_BOOL: CHECK(mt_config_bool(cfg, k) == mt_config_bool(again, k), "%s", k); break;
            case MT_CFG_INT: CHECK(mt_config_int(cfg, k) == mt_config_int(again, k), "%s", k); break;
            case MT_CFG_FLOAT: CHECK(mt_config_float(cfg, k) == mt_config_float(again, k), "%s", k); break;
            case MT_CFG_STRING: CHECK(!strcmp(mt_config_str(cfg, k), mt_config_str(again, k)), "%s", k); break;
            }
        }
        mt_config_free(again);
    }
    free(printed);
    mt_config_free(cfg);

    /* Dotted keys at the top level are the same as tables. */
    st = load_text("parallel.tp = 2\nmodel.n_head = 4\n", 0, NULL, 4, &cfg, err, sizeof(err));
    CHECK(st == MT_OK && cfg && mt_config_int(cfg, "parallel.tp") == 2, "dotted keys: %s", err);
    mt_config_free(cfg);
}

static void test_overrides(void) {
    char err[4096];
    mt_config_t *cfg = NULL;
    char *over[] = {"--train.steps=7", "--optimizer.kind=sgd", "--parallel.order=\"pp-dp-tp\"",
                    "--model.recompute=block"};
    mt_status_t st = load_text("[train]\nsteps = 3\n", 4, over, 0, &cfg, err, sizeof(err));
    CHECK(st == MT_OK, "overrides: %s", err);
    if (cfg) {
        CHECK(mt_config_int(cfg, "train.steps") == 7, "override wins over file");
        CHECK(mt_config_source(cfg, "train.steps") == MT_CFG_SRC_OVERRIDE, "override source");
        CHECK(!strcmp(mt_config_str(cfg, "optimizer.kind"), "sgd"), "bare word string override");
        CHECK(!strcmp(mt_config_str(cfg, "parallel.order"), "pp-dp-tp"), "quoted string override");
        mt_config_free(cfg);
    }
    char *bad[] = {"--parallel.tpp=2", "--train.steps=many", "--train.steps"};
    st = load_text("", 3, bad, 0, &cfg, err, sizeof(err));
    CHECK(st == MT_ERR_INVALID_ARG, "bad overrides rejected");
    CHECK(strstr(err, "unknown key parallel.tpp; did you mean parallel.tp?"), "did you mean: %s", err);
    CHECK(strstr(err, "train.steps=many: train.steps must be an integer"), "typed override: %s", err);
    CHECK(strstr(err, "needs a value"), "override without value: %s", err);
}

static void test_errors(void) {
    /* Syntax. */
    EXPECT_ERROR("[model]\nkind = \"gpt2\n", 0, "job.toml:2:", "unterminated string");
    EXPECT_ERROR("[model]\nkind = \"a\\qb\"\n", 0, ":2:", "unknown escape");
    EXPECT_ERROR("[model]\nkind = \"\\u12\"\n", 0, ":2:", "unicode escape");
    EXPECT_ERROR("[model]\nkind = \"\"\"x\"\"\"\n", 0, "multi-line strings");
    EXPECT_ERROR("[parallel]\nstage_layers = [1, 2]\n", 0, ":2:", "arrays are not supported");
    EXPECT_ERROR("model = { kind = \"mlp\" }\n", 0, ":1:", "inline tables");
    EXPECT_ERROR("[[model]]\n", 0, "arrays of tables");
    EXPECT_ERROR("[model\nkind = \"mlp\"\n", 0, ":1:", "expected ']'");
    EXPECT_ERROR("[model]\nkind \"mlp\"\n", 0, ":2:", "expected '='");
    EXPECT_ERROR("[model]\nkind = mlp\n", 0, ":2:", "strings need quotes");
    EXPECT_ERROR("[model]\nn_layer = 4 5\n", 0, ":2:", "unexpected text after the value");
    EXPECT_ERROR("[model]\nn_layer = 012\n", 0, "leading zeros");
    EXPECT_ERROR("[model]\nn_layer = 1__2\n", 0, "underscores");
    EXPECT_ERROR("[model]\nn_layer = 99999999999999999999\n", 0, "out of range");
    EXPECT_ERROR("[optimizer]\nlr = .5\n", 0, "digits on both sides");
    EXPECT_ERROR("[model]\nn_layer =\n", 0, "missing value");
    /* Duplicates. */
    EXPECT_ERROR("[model]\nn_layer = 2\nn_layer = 3\n", 0, ":3:", "duplicate key model.n_layer");
    EXPECT_ERROR("[model]\nn_layer = 2\n[model]\nn_head = 2\n", 0, ":3:", "table [model] defined twice");
    EXPECT_ERROR("model.n_layer = 2\n[model]\nn_layer = 3\n", 0, "duplicate key model.n_layer");
    /* Unknown keys with suggestions. */
    EXPECT_ERROR("[parallel]\ntpp = 2\n", 0, ":2:", "unknown key parallel.tpp; did you mean parallel.tp?");
    EXPECT_ERROR("[train]\ntp = 2\n", 0, "unknown key train.tp; did you mean parallel.tp?");
    EXPECT_ERROR("[optimiser]\nlr = 0.1\n", 0, "did you mean optimizer.lr?");
    EXPECT_ERROR("[foo]\nzzzzzzzz = 1\n", 0, "unknown key foo.zzzzzzzz (`meshtrain config --help`");
    /* Types, ranges, choices. */
    EXPECT_ERROR("[train]\nsteps = \"10\"\n", 0, "train.steps must be an integer");
    EXPECT_ERROR("[train]\nsteps = 1.0\n", 0, "no decimal point");
    EXPECT_ERROR("[train]\nsteps = -1\n", 0, "train.steps = -1 is out of range: valid is [0, inf)");
    EXPECT_ERROR("[parallel]\nzero_stage = 4\n", 0, "parallel.zero_stage = 4 is out of range: valid is [1, 3]");
    EXPECT_ERROR("[optimizer]\nbeta1 = 1.5\n", 0, "optimizer.beta1 = 1.5 is out of range");
    EXPECT_ERROR("[optimizer]\nlr = nan\n", 0, "optimizer.lr = nan is out of range");
    EXPECT_ERROR("[optimizer]\nlr = true\n", 0, "optimizer.lr must be a number");
    EXPECT_ERROR("[checkpoint]\non_signal = 1\n", 0, "checkpoint.on_signal must be a boolean");
    EXPECT_ERROR("[optimizer]\nkind = \"adam\"\n", 0,
                 "optimizer.kind = \"adam\" is not valid: choose one of adamw|sgd");
    /* Cross-key rules. */
    EXPECT_ERROR("[parallel]\ntp = 2\npp = 2\ndp = 2\n", 4, "2 x 2 x 2 = 8, but the job has 4 ranks");
    EXPECT_ERROR("[parallel]\ntp = 3\nmodel.n_head = 3\n", 4,
                 "world size 4 is not divisible by parallel.tp x parallel.pp = 3 x 1");
    EXPECT_ERROR("[train]\nglobal_batch = 10\n", 4,
                 "train.global_batch = 10 is not divisible by train.grad_accum x dp = 1 x 4");
    EXPECT_ERROR("[train]\nglobal_batch = 16\nmicro_batch = 3\n", 2, "not divisible by train.micro_batch x dp = 3 x 2");
    EXPECT_ERROR("[train]\nglobal_batch = 16\nmicro_batch = 2\ngrad_accum = 2\n", 2,
                 "= 2 x 2 x 2 = 8: make them agree");
    EXPECT_ERROR("[train]\nglobal_batch = 16\nmicro_batch = 2\n[parallel]\nmicrobatches = 3\n", 2,
                 "parallel.microbatches = 3 but the step has 4 micro-batches");
    EXPECT_ERROR("[model]\nn_embd = 100\nn_head = 3\n", 0, "model.n_embd = 100 is not divisible by model.n_head = 3");
    EXPECT_ERROR("[model]\nn_head = 6\nn_embd = 96\n[parallel]\ntp = 4\n", 4,
                 "model.n_head = 6 is not divisible by parallel.tp = 4");
    EXPECT_ERROR("[model]\nvocab_size = 300\npadded_vocab = 256\n", 0, "model.padded_vocab = 256 is smaller");
    EXPECT_ERROR("[parallel]\norder = \"tp-dp-dp\"\n", 0, "parallel.order = \"tp-dp-dp\" is not valid");
    EXPECT_ERROR("[parallel]\npp = 2\nstage_layers = \"1,2\"\n[model]\nn_layer = 4\n", 2,
                 "adding up to model.n_layer = 4");
    EXPECT_ERROR("[profile]\nsteps = \"5-2\"\n", 0, "profile.steps = \"5-2\"");
    /* Everything at once: three independent problems, three lines. */
    char err[4096];
    mt_config_t *cfg = NULL;
    load_text("[parallel]\ntpp = 2\n[train]\nsteps = -3\n[optimizer]\nkind = \"x\"\n", 0, NULL, 0, &cfg, err,
              sizeof(err));
    int lines = 0;
    for (char *p = err; *p; p++) {
        lines += *p == '\n';
    }
    CHECK(lines == 3, "all problems reported at once (%d lines): %s", lines, err);
    /* Files that cannot be read. */
    FILE *mem = fmemopen(err, sizeof(err), "w");
    mt_status_t st = mt_config_load("/nonexistent/job.toml", 0, NULL, 0, &cfg, mem);
    fputc('\0', mem);
    fclose(mem);
    CHECK(st == MT_ERR_INVALID_ARG && strstr(err, "/nonexistent/job.toml") && strstr(err, "No such file"),
          "missing file: %s", err);
}

static void test_derivations(void) {
    char err[4096];
    mt_config_t *cfg = NULL;
    mt_status_t st = load_text("[train]\nglobal_batch = 16\nmicro_batch = 2\n[parallel]\ntp = 2\n", 0, NULL, 8, &cfg,
                               err, sizeof(err));
    CHECK(st == MT_OK, "derivation: %s", err);
    if (cfg) {
        CHECK(mt_config_int(cfg, "parallel.dp") == 4, "dp derived");
        CHECK(mt_config_int(cfg, "train.grad_accum") == 2, "grad_accum derived: %lld",
              (long long)mt_config_int(cfg, "train.grad_accum"));
        CHECK(mt_config_int(cfg, "model.padded_vocab") == 256, "padded vocab multiple of 128*tp");
        mt_config_free(cfg);
    }
    st = load_text("[train]\nglobal_batch = 12\n", 0, NULL, 3, &cfg, err, sizeof(err));
    CHECK(st == MT_OK && cfg && mt_config_int(cfg, "train.micro_batch") == 4, "micro batch derived (dp=3)");
    mt_config_free(cfg);
    st = mt_config_load(MT_CONFIG_EMBEDDED, 0, NULL, 4, &cfg, stderr);
    CHECK(st == MT_OK, "embedded default loads on 4 ranks");
    mt_config_free(cfg);
}

static void test_split_args(void) {
    char *argv[] = {"train", "--dry-run", "job.toml", "--parallel.tp=2", "--world", "8", "--json", NULL};
    mt_config_cli_t cli;
    CHECK_OK(mt_config_split_args(7, argv, &cli));
    CHECK(cli.path && !strcmp(cli.path, "job.toml"), "path");
    CHECK(cli.n_overrides == 1 && !strcmp(cli.overrides[0], "--parallel.tp=2"), "overrides");
    CHECK(cli.rest_argc == 5 && !strcmp(cli.rest_argv[1], "--dry-run") && !strcmp(cli.rest_argv[3], "8"), "rest");
    mt_config_cli_free(&cli);
    char *argv2[] = {"train", "--config", "a.cfg", "b.toml", NULL};
    CHECK(mt_config_split_args(4, argv2, &cli) == MT_ERR_INVALID_ARG, "two config files rejected");
    CHECK(strstr(mt_last_error_msg(), "two config files"), "message");
}

/* mt_config_peek_str (read before MPI): the default, the file's value, the last override, a bare word; a
 * file with errors elsewhere still gives the key, a missing file the default. */
static void test_peek(void) {
    char v[64];
    mt_config_peek_str(NULL, 0, NULL, "runtime.blas_core", v, sizeof(v));
    CHECK(!strcmp(v, "auto"), "default: %s", v);
    mt_config_peek_str(MT_CONFIG_EMBEDDED, 0, NULL, "runtime.blas_core", v, sizeof(v));
    CHECK(!strcmp(v, "auto"), "embedded default job: %s", v);
    const char *path = write_tmp("peek.toml", "[parallel]\ntp = \"not a number\"\n[runtime]\nblas_core = \"Haswell\"\n");
    mt_config_peek_str(path, 0, NULL, "runtime.blas_core", v, sizeof(v));
    CHECK(!strcmp(v, "Haswell"), "from the file despite an error elsewhere: %s", v);
    char *ov[] = {"--runtime.blas_core=\"Zen\"", "--parallel.tp=2", "--runtime.blas_core=keep"};
    mt_config_peek_str(path, 2, ov, "runtime.blas_core", v, sizeof(v));
    CHECK(!strcmp(v, "Zen"), "a quoted override wins over the file: %s", v);
    mt_config_peek_str(path, 3, ov, "runtime.blas_core", v, sizeof(v));
    CHECK(!strcmp(v, "keep"), "the last override (a bare word) wins: %s", v);
    mt_config_peek_str("/nonexistent/x.toml", 0, NULL, "runtime.blas_core", v, sizeof(v));
    CHECK(!strcmp(v, "auto"), "a missing file gives the default: %s", v);
    char *bad[] = {"--runtime.blas_core=SkylakeY"};
    mt_config_peek_str(NULL, 1, bad, "runtime.blas_core", v, sizeof(v));
    CHECK(!strcmp(v, "auto"), "a value outside the choices gives the default: %s", v);
}

int main(void) {
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_values();
    test_overrides();
    test_errors();
    test_derivations();
    test_split_args();
    test_peek();
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd) != 0) {
        fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    return mt_test_finish("test_config");
}
