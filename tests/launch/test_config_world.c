/* Rank 0 reads and validates; every rank gets the same config and verdict, even when the file exists
 * only where rank 0 runs (the other ranks are given a path that does not exist).
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/config.h"
#include "runtime/rt.h"
#include "testutil.h"

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    const mt_world_t *w = mt_rt_world();
    char path[256] = "/nonexistent/only-on-rank-0.toml";
    if (w->rank == 0) {
        snprintf(path, sizeof(path), "/tmp/mt_cfg_world_%d.toml", (int)getpid());
        FILE *f = fopen(path, "w");
        fputs("[model]\nn_layer = 3\ninit = \"llmc:/x \\u00e9\"\n[optimizer]\nlr = 2.5e-4\n[parallel]\ntp = 2\n", f);
        fclose(f);
    }
    char *over[] = {"--train.steps=11", "--checkpoint.on_signal=false"};
    mt_config_t *cfg = NULL;
    CHECK_OK(mt_config_load_world(w->comm, path, 2, over, &cfg));
    if (cfg) {
        CHECK(mt_config_int(cfg, "model.n_layer") == 3, "int from file");
        CHECK(mt_config_int(cfg, "train.steps") == 11, "override");
        CHECK(mt_config_float(cfg, "optimizer.lr") == 2.5e-4, "float");
        CHECK(!strcmp(mt_config_str(cfg, "model.init"), "llmc:/x \xc3\xa9"), "string");
        CHECK(!mt_config_bool(cfg, "checkpoint.on_signal"), "bool");
        CHECK(mt_config_int(cfg, "parallel.dp") == w->size / 2, "dp derived from the world");
        CHECK(mt_config_source(cfg, "parallel.dp") == MT_CFG_SRC_DERIVED, "source travels too");
        mt_config_free(cfg);
    }
    /* A bad config gives every rank the same failure, with no hang. */
    char *bad[] = {"--parallel.tp=3"};
    mt_status_t st = mt_config_load_world(w->comm, path, 1, bad, &cfg);
    CHECK(st == MT_ERR_INVALID_ARG && cfg == NULL, "every rank sees the verdict: %s", mt_status_str(st));
    if (w->rank == 0) {
        unlink(path);
    }
    return mt_test_finish_mpi("test_config_world");
}
