/* The allocator's accounting is exact: current and peak bytes per category and in total, alignment,
 * the breakdown at the peak, and the hook seeing every event.
 * SPDX-License-Identifier: MIT */
#include <stdint.h>
#include <string.h>

#include "runtime/alloc.h"
#include "testutil.h"

static int64_t hook_sum;
static int hook_events;
static void hook(mt_mem_where_t where, mt_mem_cat_t cat, int64_t bytes, const void *ptr, const char *owner,
                 void *arg) {
    hook_sum += bytes;
    hook_events++;
}

int main(void) {
    mt_mem_stats_t s;
    mt_mem_set_hook(hook, NULL);
    float *a = mt_alloc(1000 * sizeof(float), MT_MEM_PARAMS, "a");
    CHECK(a != NULL, "alloc");
    CHECK(((uintptr_t)a % MT_ALLOC_ALIGN) == 0, "aligned");
    CHECK(mt_alloc_size(a) == 4032, "rounded to 64: %zu", mt_alloc_size(a));
    CHECK(mt_alloc_cat(a) == MT_MEM_PARAMS, "category");
    char *g = mt_calloc(100, MT_MEM_GRADS, "g");
    int zeros = 1;
    for (int i = 0; i < 100; i++) {
        zeros &= g[i] == 0;
    }
    CHECK(zeros, "calloc zeroes");
    mt_mem_stats(MT_MEM_HOST, &s);
    CHECK(s.current[MT_MEM_PARAMS] == 4032, "params %lld", (long long)s.current[MT_MEM_PARAMS]);
    CHECK(s.current[MT_MEM_GRADS] == 128, "grads %lld", (long long)s.current[MT_MEM_GRADS]);
    CHECK(s.total_current == 4160, "total %lld", (long long)s.total_current);
    void *act = mt_alloc(1 << 20, MT_MEM_ACTIVATIONS, "act");
    mt_free(act);
    mt_mem_stats(MT_MEM_HOST, &s);
    CHECK(s.current[MT_MEM_ACTIVATIONS] == 0, "freed");
    CHECK(s.peak[MT_MEM_ACTIVATIONS] == (1 << 20), "peak activations");
    CHECK(s.total_peak == 4160 + (1 << 20), "total peak %lld", (long long)s.total_peak);
    CHECK(s.at_peak[MT_MEM_ACTIVATIONS] == (1 << 20) && s.at_peak[MT_MEM_PARAMS] == 4032, "breakdown at peak");
    mt_mem_reset_peak(MT_MEM_HOST);
    mt_mem_stats(MT_MEM_HOST, &s);
    CHECK(s.total_peak == 4160 && s.peak[MT_MEM_ACTIVATIONS] == 0, "reset peak");
    void *z = mt_alloc(0, MT_MEM_OTHER, "zero");
    CHECK(z != NULL, "zero-byte allocation gives a pointer");
    mt_free(z);
    mt_free(NULL);
    mt_free(a);
    mt_free(g);
    mt_mem_stats(MT_MEM_HOST, &s);
    CHECK(s.total_current == 0, "all freed: %lld", (long long)s.total_current);
    CHECK(hook_sum == 0 && hook_events == 8, "hook saw every event: sum %lld, %d events", (long long)hook_sum,
          hook_events);
    mt_mem_account(MT_MEM_DEVICE, MT_MEM_COMM, 4096, NULL, "dev");
    mt_mem_stats(MT_MEM_DEVICE, &s);
    CHECK(s.current[MT_MEM_COMM] == 4096, "device accounting is separate");
    mt_mem_account(MT_MEM_DEVICE, MT_MEM_COMM, -4096, NULL, "dev");
    CHECK(!strcmp(mt_mem_cat_name(MT_MEM_OPTIMIZER), "optimizer"), "names");
    return mt_test_finish("test_alloc");
}
