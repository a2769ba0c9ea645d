/* libFuzzer harness for the llm.c token-shard reader: the validator with several vocabulary sizes, then
 * (when the shard is valid) the data loader over it, reading a few batches in both orders.
 * SPDX-License-Identifier: MIT */
#include "fuzz_util.h"
#include "models/data/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_as_file(data, size, path, sizeof(path));
    if (fd < 0) {
        return 0;
    }
    int64_t n = 0;
    mt_shard_check(path, 7, &n);
    mt_shard_check(path, 50257, &n);
    if (mt_shard_check(path, 0, &n) == MT_OK) {
        for (int order = 0; order < 2; order++) {
            mt_data_params_t p = MT_DATA_PARAMS_INIT;
            p.kind = MT_DATA_SHARDS;
            p.order = order ? MT_DATA_SEQUENTIAL : MT_DATA_RANDOM;
            p.glob = path;
            p.what = "fuzz";
            p.global_batch = 2;
            p.seq_len = 3;
            p.vocab_size = 65536;
            p.dp_rank = 0;
            p.dp_size = 1;
            p.prefetch = false;
            mt_data_t d = NULL;
            if (mt_data_open(&p, &d) == MT_OK) {
                const mt_batch_t *b = NULL;
                for (int64_t s = 0; s < 3; s++) {
                    mt_data_get(d, s, &b);
                }
                mt_data_close(d);
            }
        }
    }
    close(fd);
    return 0;
}
