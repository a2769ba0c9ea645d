/* The caching device allocator's bookkeeping over a host-memory backend with a capacity limit: size
 * classes, splitting and coalescing, per-stream reuse, no backend calls in a steady state, accounting by
 * category through mt_mem_account, empty_cache, the out-of-memory retry and report, and a random stress
 * run that checks no two live blocks overlap and the invariants hold after every step.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda_alloc.h"
#include "testutil.h"

typedef struct {
    size_t capacity, used;
    int64_t n_alloc, n_free;
} fake_dev_t;

static mt_status_t fake_alloc(void *ctx, void **ptr, size_t bytes) {
    fake_dev_t *d = ctx;
    if (d->used + bytes > d->capacity) {
        return MT_ERR_OOM;
    }
    if (posix_memalign(ptr, 4096, bytes) != 0) {
        return MT_ERR_OOM;
    }
    d->used += bytes;
    d->n_alloc++;
    return MT_OK;
}

static void fake_free(void *ctx, void *ptr, size_t bytes) {
    fake_dev_t *d = ctx;
    d->used -= bytes;
    d->n_free++;
    free(ptr);
}

static mt_status_t fake_info(void *ctx, size_t *fr, size_t *tot) {
    fake_dev_t *d = ctx;
    *fr = d->capacity - d->used;
    *tot = d->capacity;
    return MT_OK;
}

static mt_cuda_alloc_t make(fake_dev_t *d, size_t capacity, bool caching) {
    memset(d, 0, sizeof(*d));
    d->capacity = capacity;
    mt_cuda_alloc_backend_t be = {
        .name = "fake", .raw_alloc = fake_alloc, .raw_free = fake_free, .mem_info = fake_info, .ctx = d};
    mt_cuda_alloc_t a = NULL;
    CHECK_OK(mt_cuda_alloc_create(&be, caching, &a));
    return a;
}

#define MiB ((size_t)1 << 20)

static void test_size_classes(void) {
    fake_dev_t d;
    mt_cuda_alloc_t a = make(&d, 1024 * MiB, true);
    void *p0, *p1, *p2, *p3;
    CHECK_OK(mt_cuda_alloc_malloc(a, &p0, 0, MT_MEM_OTHER, "zero", NULL));
    CHECK_OK(mt_cuda_alloc_malloc(a, &p1, 1, MT_MEM_PARAMS, "one", NULL));
    CHECK(p0 != p1 && p0 && p1, "zero-byte and one-byte requests get distinct blocks");
    CHECK(mt_cuda_alloc_block_size(a, p0) == 512 && mt_cuda_alloc_block_size(a, p1) == 512, "rounded to 512");
    CHECK(((uintptr_t)p0 % 512) == 0 && ((uintptr_t)p1 % 512) == 0, "512-byte aligned");
    CHECK(d.n_alloc == 1, "small requests share one 2 MiB segment (got %lld segments)", (long long)d.n_alloc);
    CHECK_OK(mt_cuda_alloc_malloc(a, &p2, 3 * MiB, MT_MEM_ACTIVATIONS, "mid", NULL));
    CHECK(d.n_alloc == 2 && d.used == 2 * MiB + 20 * MiB, "a mid-size request gets a 20 MiB segment (used %zu)",
          d.used);
    CHECK_OK(mt_cuda_alloc_malloc(a, &p3, 33 * MiB + 1, MT_MEM_GRADS, "large", NULL));
    CHECK(d.used == 2 * MiB + 20 * MiB + 34 * MiB, "a large request's segment is rounded to 2 MiB (used %zu)", d.used);
    /* the 1 MiB - 512 left in the 34 MiB segment is not split off (large pool: remainders up to 1 MiB stay) */
    CHECK(mt_cuda_alloc_block_size(a, p3) == 34 * MiB, "large block keeps its small remainder");
    mt_cuda_alloc_stats_t s;
    mt_cuda_alloc_get_stats(a, &s);
    CHECK(s.allocated_by_cat[MT_MEM_PARAMS] == 512 && s.allocated_by_cat[MT_MEM_GRADS] == (int64_t)(34 * MiB),
          "allocated by category");
    CHECK(s.requested_bytes == (int64_t)(1 + 3 * MiB + 33 * MiB + 1), "requested bytes %lld",
          (long long)s.requested_bytes);
    CHECK_OK(mt_cuda_alloc_validate(a));
    mt_cuda_alloc_free(a, p0);
    mt_cuda_alloc_free(a, p1);
    mt_cuda_alloc_free(a, p2);
    mt_cuda_alloc_free(a, p3);
    CHECK_OK(mt_cuda_alloc_validate(a));
    mt_cuda_alloc_get_stats(a, &s);
    CHECK(s.allocated_bytes == 0 && s.reserved_bytes == (int64_t)(56 * MiB), "all cached after free");
    mt_cuda_alloc_destroy(a);
    CHECK(d.used == 0 && d.n_free == d.n_alloc, "destroy returns every segment");
}

static void test_split_coalesce_empty_cache(void) {
    fake_dev_t d;
    mt_cuda_alloc_t a = make(&d, 1024 * MiB, true);
    void *p[4];
    for (int i = 0; i < 4; i++) {
        CHECK_OK(mt_cuda_alloc_malloc(a, &p[i], 4096, MT_MEM_ACTIVATIONS, "blk", NULL));
    }
    CHECK((char *)p[1] == (char *)p[0] + 4096 && (char *)p[3] == (char *)p[2] + 4096, "blocks split from one segment");
    mt_cuda_alloc_free(a, p[1]);
    mt_cuda_alloc_free(a, p[2]);
    CHECK_OK(mt_cuda_alloc_validate(a)); /* p1 and p2 coalesced (validate refuses adjacent free blocks) */
    void *q;
    CHECK_OK(mt_cuda_alloc_malloc(a, &q, 8192, MT_MEM_ACTIVATIONS, "merged", NULL));
    CHECK(q == p[1], "the coalesced hole is reused best-fit for a request of its size");
    CHECK(mt_cuda_alloc_empty_cache(a) == 0, "a segment with live blocks is not released");
    mt_cuda_alloc_free(a, q);
    mt_cuda_alloc_free(a, p[0]);
    mt_cuda_alloc_free(a, p[3]);
    CHECK_OK(mt_cuda_alloc_validate(a));
    CHECK(mt_cuda_alloc_empty_cache(a) == 2 * MiB, "empty_cache releases the fully free segment");
    mt_cuda_alloc_stats_t s;
    mt_cuda_alloc_get_stats(a, &s);
    CHECK(s.reserved_bytes == 0 && s.n_segments == 0 && s.n_raw_frees == 1 && d.used == 0, "nothing reserved");
    mt_cuda_alloc_destroy(a);
}

static void test_steady_state_and_streams(void) {
    fake_dev_t d;
    mt_cuda_alloc_t a = make(&d, 4096 * MiB, true);
    static const size_t sizes[] = {768 * 4, 1 << 20, 3 << 20, 50 << 20, 12345, 64 << 20, 100, 7 << 20};
    enum { NS = sizeof(sizes) / sizeof(sizes[0]) };
    void *p[NS];
    int64_t raw_after_first = 0;
    for (int step = 0; step < 5; step++) {
        for (int i = 0; i < NS; i++) {
            CHECK_OK(mt_cuda_alloc_malloc(a, &p[i], sizes[i], (mt_mem_cat_t)(i % MT_MEM_NCAT), "step", NULL));
        }
        for (int i = NS - 1; i >= 0; i--) {
            mt_cuda_alloc_free(a, p[i]);
        }
        if (step == 0) {
            raw_after_first = d.n_alloc;
        }
    }
    CHECK(d.n_alloc == raw_after_first && d.n_free == 0, "steps after the first call the backend %lld times",
          (long long)(d.n_alloc - raw_after_first + d.n_free));
    /* another stream does not reuse blocks freed on the first */
    void *s1 = (void *)0x1, *x, *y;
    CHECK_OK(mt_cuda_alloc_malloc(a, &x, 4096, MT_MEM_COMM, "other-stream", s1));
    CHECK(d.n_alloc == raw_after_first + 1, "a new stream gets its own segment");
    mt_cuda_alloc_free(a, x);
    CHECK_OK(mt_cuda_alloc_malloc(a, &y, 4096, MT_MEM_COMM, "other-stream", s1));
    CHECK(y == x, "and reuses it on that stream");
    mt_cuda_alloc_free(a, y);
    CHECK_OK(mt_cuda_alloc_validate(a));
    mt_cuda_alloc_destroy(a);
}

static void test_accounting(void) {
    mt_mem_stats_t before, during, after;
    mt_mem_stats(MT_MEM_DEVICE, &before);
    fake_dev_t d;
    mt_cuda_alloc_t a = make(&d, 1024 * MiB, true);
    void *w, *g;
    CHECK_OK(mt_cuda_alloc_malloc(a, &w, 1000, MT_MEM_PARAMS, "w", NULL));
    CHECK_OK(mt_cuda_alloc_malloc(a, &g, 5 * MiB, MT_MEM_GRADS, "g", NULL));
    mt_mem_stats(MT_MEM_DEVICE, &during);
    CHECK(during.current[MT_MEM_PARAMS] - before.current[MT_MEM_PARAMS] == 1024, "params +1024 (rounded)");
    CHECK(during.current[MT_MEM_GRADS] - before.current[MT_MEM_GRADS] == (int64_t)(5 * MiB), "grads +5 MiB");
    mt_cuda_alloc_free(a, w);
    mt_cuda_alloc_free(a, g);
    mt_mem_stats(MT_MEM_DEVICE, &after);
    CHECK(after.total_current == before.total_current, "released in the device accounting");
    CHECK(after.total_peak >= before.total_current + (int64_t)(5 * MiB + 1024), "peak seen by mt_mem_stats");
    mt_cuda_alloc_destroy(a);
}

static void test_oom(void) {
    fake_dev_t d;
    mt_cuda_alloc_t a = make(&d, 64 * MiB, true);
    void *big, *small, *p;
    CHECK_OK(mt_cuda_alloc_malloc(a, &big, 40 * MiB, MT_MEM_OPTIMIZER, "opt", NULL));
    CHECK_OK(mt_cuda_alloc_malloc(a, &small, 1000, MT_MEM_PARAMS, "w", NULL));
    mt_cuda_alloc_free(a, big); /* 40 MiB cached, not returned */
    CHECK(d.used == 42 * MiB, "freed segment stays cached");
    /* 50 MiB does not fit next to the cache: the allocator must flush the cache and retry */
    CHECK_OK(mt_cuda_alloc_malloc(a, &p, 50 * MiB, MT_MEM_ACTIVATIONS, "acts", NULL));
    mt_cuda_alloc_stats_t s;
    mt_cuda_alloc_get_stats(a, &s);
    CHECK(s.n_cache_flushes == 1 && s.n_ooms == 0, "flushed once and succeeded");
    void *q;
    mt_status_t st = mt_cuda_alloc_malloc(a, &q, 30 * MiB, MT_MEM_GRADS, "grad-bucket", NULL);
    CHECK(st == MT_ERR_OOM && q == NULL, "a request that cannot fit fails with MT_ERR_OOM (%s)", mt_status_str(st));
    const char *msg = mt_last_error_msg();
    CHECK(strstr(msg, "31457280 bytes") && strstr(msg, "grads") && strstr(msg, "grad-bucket"),
          "message names the request: %s", msg);
    CHECK(strstr(msg, "activations 52428800") && strstr(msg, "params 1024"), "message breaks down by category: %s",
          msg);
    mt_cuda_alloc_get_stats(a, &s);
    CHECK(s.n_ooms == 1, "counted");
    mt_cuda_alloc_free(a, p);
    mt_cuda_alloc_free(a, small);
    CHECK_OK(mt_cuda_alloc_validate(a));
    mt_cuda_alloc_destroy(a);
    CHECK(d.used == 0, "all returned");
}

static void test_no_caching(void) {
    fake_dev_t d;
    mt_cuda_alloc_t a = make(&d, 1024 * MiB, false);
    void *p, *q;
    CHECK_OK(mt_cuda_alloc_malloc(a, &p, 4096, MT_MEM_OTHER, "x", NULL));
    CHECK_OK(mt_cuda_alloc_malloc(a, &q, 4096, MT_MEM_OTHER, "y", NULL));
    mt_cuda_alloc_free(a, p);
    CHECK(d.n_free == 0, "segment with a live block kept");
    mt_cuda_alloc_free(a, q);
    CHECK(d.n_free == 1 && d.used == 0, "caching off: a fully free segment goes back at once");
    mt_cuda_alloc_destroy(a);
}

/* Random allocations and frees; each live block is filled with its own byte and checked at free. */
static void test_stress(void) {
    fake_dev_t d;
    mt_cuda_alloc_t a = make(&d, 2048 * MiB, true);
    enum { SLOTS = 64, STEPS = 3000 };
    void *p[SLOTS] = {0};
    size_t n[SLOTS] = {0};
    unsigned rng = 12345;
    int bad = 0, invalid = 0;
    for (int s = 0; s < STEPS; s++) {
        rng = rng * 1103515245u + 12345u;
        int i = (int)((rng >> 8) % SLOTS);
        if (p[i]) {
            const unsigned char *c = p[i];
            for (size_t k = 0; k < n[i]; k += 97) {
                bad += c[k] != (unsigned char)i;
            }
            mt_cuda_alloc_free(a, p[i]);
            p[i] = NULL;
        } else {
            rng = rng * 1103515245u + 12345u;
            unsigned r = rng >> 4;
            size_t sz = (r & 3) == 0 ? (r % (24 << 20)) : (r % 70000);
            void *stream = (void *)(uintptr_t)((r >> 20) & 1);
            CHECK_OK(mt_cuda_alloc_malloc(a, &p[i], sz, (mt_mem_cat_t)(i % MT_MEM_NCAT), "stress", stream));
            n[i] = sz;
            memset(p[i], i, sz);
        }
        if (s % 50 == 0) {
            invalid += mt_cuda_alloc_validate(a) != MT_OK;
        }
    }
    CHECK(bad == 0, "%d bytes of live blocks were overwritten by other blocks", bad);
    CHECK(invalid == 0, "invariants broken %d times (%s)", invalid, mt_last_error_msg());
    for (int i = 0; i < SLOTS; i++) {
        mt_cuda_alloc_free(a, p[i]);
    }
    CHECK_OK(mt_cuda_alloc_validate(a));
    mt_cuda_alloc_stats_t s;
    mt_cuda_alloc_get_stats(a, &s);
    CHECK(s.allocated_bytes == 0 && s.n_allocs == s.n_frees, "balanced");
    mt_cuda_alloc_destroy(a);
    CHECK(d.used == 0, "destroy returns all");
}

int main(void) {
    test_size_classes();
    test_split_coalesce_empty_cache();
    test_steady_state_and_streams();
    test_accounting();
    test_oom();
    test_no_caching();
    test_stress();
    return mt_test_finish("test_cuda_alloc");
}
