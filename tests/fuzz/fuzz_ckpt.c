/* libFuzzer harness for the meshtrain checkpoint reader (train/job_ckpt.c): the input is a step
 * directory in one blob, [u32 manifest length][manifest.json][shard.bin]; the harness writes both files
 * into a private directory and runs the JSON parser on the manifest and mt_job_ckpt_read_model on the
 * directory (manifest format and version, the recorded config, the model it builds, every shard's
 * boxes, offsets and CRC32C). Seeds name their shard file "shard.bin".
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "train/job.h"
#include "train/job_json.h"

static char dir[64];
static char manifest[128], config[128], shard[128];

static void cleanup(void) {
    unlink(manifest);
    unlink(config);
    unlink(shard);
    rmdir(dir);
}

static void put(const char *path, const uint8_t *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) {
        if (n > 0) {
            fwrite(data, 1, n, f);
        }
        fclose(f);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        snprintf(dir, sizeof(dir), "/tmp/mt-fuzz-ckpt-XXXXXX");
        if (!mkdtemp(dir)) {
            abort();
        }
        snprintf(manifest, sizeof(manifest), "%s/manifest.json", dir);
        snprintf(config, sizeof(config), "%s/config.toml", dir);
        snprintf(shard, sizeof(shard), "%s/shard.bin", dir);
        atexit(cleanup);
    }
    uint32_t len[2] = {0, 0};
    if (size >= 8) {
        memcpy(len, data, 8);
        data += 8;
        size -= 8;
    }
    size_t mlen = len[0] > size ? size : len[0];
    size_t clen = len[1] > size - mlen ? size - mlen : len[1];
    mt_json_t *js = NULL;
    if (mt_json_parse((const char *)data, mlen, "fuzz", &js) == MT_OK) {
        mt_json_free(js);
    }
    put(manifest, data, mlen);
    put(config, data + mlen, clen);
    put(shard, data + mlen + clen, size - mlen - clen);
    mt_model_t m = NULL;
    mt_config_t *cfg = NULL;
    if (mt_job_ckpt_read_model(dir, &m, &cfg, NULL, 0) == MT_OK) {
        mt_model_free(m);
        mt_config_free(cfg);
    }
    return 0;
}
