/* libFuzzer harness for the meshtrain checkpoint reader (launch/job_ckpt.c): the input is a step
 * directory in one blob, [u32 manifest length][manifest.json][shard.bin]; the harness writes both files
 * into a private directory and runs the JSON parser on the manifest and mt_job_ckpt_read_model on the
 * directory (manifest format and version, the recorded config, the model it builds, every shard's
 * boxes, offsets and CRC32C). Seeds name their shard file "shard.bin".
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "launch/job.h"
#include "launch/job_json.h"

static char dir[64];
static char manifest[128], shard[128];

static void cleanup(void) {
    unlink(manifest);
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
        snprintf(shard, sizeof(shard), "%s/shard.bin", dir);
        atexit(cleanup);
    }
    uint32_t mlen = 0;
    if (size >= 4) {
        memcpy(&mlen, data, 4);
        data += 4;
        size -= 4;
    }
    if (mlen > size) {
        mlen = (uint32_t)size;
    }
    mt_json_t *js = NULL;
    if (mt_json_parse((const char *)data, mlen, "fuzz", &js) == MT_OK) {
        mt_json_free(js);
    }
    put(manifest, data, mlen);
    put(shard, data + mlen, size - mlen);
    mt_model_t m = NULL;
    mt_config_t *cfg = NULL;
    if (mt_job_ckpt_read_model(dir, &m, &cfg, NULL, 0) == MT_OK) {
        mt_model_free(m);
        mt_config_free(cfg);
    }
    return 0;
}
