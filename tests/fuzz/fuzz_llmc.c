/* libFuzzer harness for the llm.c checkpoint reader: the header checks, then (when they pass) the model
 * the header describes is built and the weights loaded, as model.init = "llmc:PATH" does.
 * SPDX-License-Identifier: MIT */
#include "fuzz_util.h"
#include "models/llmc.h"
#include "models/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_as_file(data, size, path, sizeof(path));
    if (fd < 0) {
        return 0;
    }
    mt_llmc_header_t h;
    if (mt_llmc_read_header(path, &h) == MT_OK) {
        mt_model_config_t c = MT_MODEL_CONFIG_INIT;
        c.kind = MT_MODEL_GPT2;
        mt_model_t m = NULL;
        if (mt_llmc_apply_header(&h, path, 0, &c) == MT_OK && mt_model_init(&c, &m) == MT_OK) {
            if (mt_model_alloc_params(m) == MT_OK) {
                mt_llmc_load(m, path);
            }
            mt_model_free(m);
        }
    }
    close(fd);
    return 0;
}
