/* Absurd sizes: a host allocation larger than the machine's RAM + swap (a size from a corrupt file or
 * config) is refused with NULL at once, not handed to the kernel's overcommit; an overflowing size too;
 * ordinary sizes still work and the accounting stays exact.
 * SPDX-License-Identifier: MIT */
#include <stdint.h>

#include "runtime/alloc.h"
#include "testutil.h"

int main(void) {
    mt_mem_stats_t before, after;
    mt_mem_stats(MT_MEM_HOST, &before);
    double t0 = mt_now();
    CHECK(mt_alloc((size_t)1 << 50, MT_MEM_PARAMS, "absurd") == NULL, "1 PiB refused");
    CHECK(mt_alloc(SIZE_MAX - 3, MT_MEM_PARAMS, "overflow") == NULL, "SIZE_MAX refused");
    CHECK(mt_calloc((size_t)211109733203968ull, MT_MEM_PARAMS, "llm.c header") == NULL, "211 TB refused");
    CHECK(mt_now() - t0 < 1.0, "refused at once (%.3f s)", mt_now() - t0);
    void *p = mt_alloc(1 << 20, MT_MEM_PARAMS, "normal");
    CHECK(p != NULL, "1 MiB works");
    mt_free(p);
    mt_mem_stats(MT_MEM_HOST, &after);
    CHECK(after.current[MT_MEM_PARAMS] == before.current[MT_MEM_PARAMS], "accounting unchanged");
    return mt_test_finish("alloc limit");
}
