/* libFuzzer harness for the config reader: the TOML-subset parser on the raw bytes, the whole loader
 * (parse, schema, validation, cross-key rules) on them as a file, and the first line as a
 * `--section.key=value` override.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "runtime/config.h"
#include "runtime/config_toml.h"

static void on_kv(void *arg, const char *key, int line, mt_toml_value_t *v) {
    (void)arg;
    (void)key;
    (void)line;
    if (v->kind == MT_TOML_STRING) {
        free(v->s);
    }
}

static void on_error(void *arg, int line, const char *msg) {
    (void)arg;
    (void)line;
    (void)msg;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static FILE *sink;
    if (!sink) {
        sink = fopen("/dev/null", "w");
    }
    if (size > (1u << 16)) {
        return 0;
    }
    char *text = malloc(size + 1);
    if (!text) {
        return 0;
    }
    memcpy(text, data, size);
    text[size] = '\0';
    mt_toml_parse(text, on_kv, on_error, NULL);
    mt_toml_value_t v;
    if (mt_toml_parse_value(text, &v, NULL) && v.kind == MT_TOML_STRING) {
        free(v.s);
    }

    char path[64];
    int fd = fuzz_as_file(data, size, path, sizeof(path));
    if (fd >= 0) {
        mt_config_t *cfg = NULL;
        if (mt_config_load(path, 0, NULL, 4, &cfg, sink) == MT_OK) {
            mt_config_print(cfg, sink);
            mt_config_free(cfg);
        }
        close(fd);
    }

    /* The first line as an override. */
    char *nl = strchr(text, '\n');
    if (nl) {
        *nl = '\0';
    }
    char *ov[1] = {text};
    mt_config_t *cfg = NULL;
    if (mt_config_load(NULL, 1, ov, 1, &cfg, sink) == MT_OK) {
        mt_config_free(cfg);
    }
    free(text);
    return 0;
}
