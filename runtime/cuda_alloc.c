/* Caching device allocator (see cuda_alloc.h): segments from a backend, carved into blocks that live in
 * an address-ordered list per segment; free blocks sit in a per-pool list sorted by (stream, size,
 * address) for best fit; live blocks in a hash table by address. Plain C, so the bookkeeping is tested
 * without a GPU; the CUDA backend at the end is the only device-specific part.
 * SPDX-License-Identifier: MIT */
#include "cuda_alloc.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if MT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

typedef struct block {
    char *ptr;
    size_t size;      /* rounded bytes this block spans */
    size_t requested; /* what the caller asked for (live blocks) */
    void *stream;
    int pool; /* 0 small, 1 large */
    bool allocated;
    mt_mem_cat_t cat;
    const char *owner;
    struct block *prev, *next; /* neighbours in the segment, address order; NULL at the segment ends */
    struct block *hnext;       /* hash chain (live blocks) */
} block_t;

typedef struct {
    block_t **v; /* sorted by (stream, size, ptr) */
    size_t n, cap;
} free_list_t;

struct mt_cuda_alloc {
    mt_cuda_alloc_backend_t be;
    bool caching;
    pthread_mutex_t mu;
    free_list_t pools[2];
    block_t **htab;
    size_t hcap, hcount;
    mt_cuda_alloc_stats_t st;
};

/* ---- free lists ---- */

static int block_cmp(const block_t *a, const block_t *b) {
    if (a->stream != b->stream) {
        return (uintptr_t)a->stream < (uintptr_t)b->stream ? -1 : 1;
    }
    if (a->size != b->size) {
        return a->size < b->size ? -1 : 1;
    }
    if (a->ptr != b->ptr) {
        return (uintptr_t)a->ptr < (uintptr_t)b->ptr ? -1 : 1;
    }
    return 0;
}

/* First index whose element is >= key. */
static size_t fl_lower_bound(const free_list_t *fl, const block_t *key) {
    size_t lo = 0, hi = fl->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (block_cmp(fl->v[mid], key) < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

static bool fl_insert(free_list_t *fl, block_t *b) {
    if (fl->n == fl->cap) {
        size_t cap = fl->cap ? 2 * fl->cap : 64;
        block_t **v = realloc(fl->v, cap * sizeof(*v));
        if (!v) {
            return false;
        }
        fl->v = v;
        fl->cap = cap;
    }
    size_t i = fl_lower_bound(fl, b);
    memmove(fl->v + i + 1, fl->v + i, (fl->n - i) * sizeof(*fl->v));
    fl->v[i] = b;
    fl->n++;
    return true;
}

static void fl_remove(free_list_t *fl, block_t *b) {
    size_t i = fl_lower_bound(fl, b);
    MT_ASSERT(i < fl->n && fl->v[i] == b);
    memmove(fl->v + i, fl->v + i + 1, (fl->n - i - 1) * sizeof(*fl->v));
    fl->n--;
}

/* Smallest free block of the stream with size >= bytes, or NULL. */
static block_t *fl_best_fit(free_list_t *fl, void *stream, size_t bytes) {
    block_t key = {.ptr = NULL, .size = bytes, .stream = stream};
    size_t i = fl_lower_bound(fl, &key);
    if (i < fl->n && fl->v[i]->stream == stream) {
        return fl->v[i];
    }
    return NULL;
}

/* Merges b->next (of the same segment, not allocated, no longer in any free list) into b and frees its
 * record. */
static void absorb_next(block_t *b) {
    block_t *n = b->next;
    b->size += n->size;
    b->next = n->next;
    if (n->next) {
        n->next->prev = b;
    }
    free(n);
}

/* Appends b to the growing array *v of *n blocks (*cap allocated). */
static void push_block(block_t ***v, size_t *n, size_t *cap, block_t *b) {
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *v = realloc(*v, *cap * sizeof(**v));
        MT_ASSERT(*v);
    }
    (*v)[(*n)++] = b;
}

/* ---- live-block hash table ---- */

static size_t hash_ptr(const void *p, size_t cap) {
    uint64_t x = (uint64_t)(uintptr_t)p >> 9; /* blocks are 512-byte aligned */
    x *= 0x9e3779b97f4a7c15ull;
    return (size_t)(x >> 17) & (cap - 1);
}

static bool htab_grow(struct mt_cuda_alloc *a) {
    size_t cap = a->hcap ? 2 * a->hcap : 1024;
    block_t **t = calloc(cap, sizeof(*t));
    if (!t) {
        return false;
    }
    for (size_t i = 0; i < a->hcap; i++) {
        for (block_t *b = a->htab[i], *nx; b; b = nx) {
            nx = b->hnext;
            size_t h = hash_ptr(b->ptr, cap);
            b->hnext = t[h];
            t[h] = b;
        }
    }
    free(a->htab);
    a->htab = t;
    a->hcap = cap;
    return true;
}

static bool htab_insert(struct mt_cuda_alloc *a, block_t *b) {
    if (a->hcount + 1 > a->hcap && !htab_grow(a)) {
        return false;
    }
    size_t h = hash_ptr(b->ptr, a->hcap);
    b->hnext = a->htab[h];
    a->htab[h] = b;
    a->hcount++;
    return true;
}

static block_t *htab_find(struct mt_cuda_alloc *a, const void *p, bool remove) {
    if (!a->hcap) {
        return NULL;
    }
    block_t **pp = &a->htab[hash_ptr(p, a->hcap)];
    for (; *pp; pp = &(*pp)->hnext) {
        if ((*pp)->ptr == p) {
            block_t *b = *pp;
            if (remove) {
                *pp = b->hnext;
                b->hnext = NULL;
                a->hcount--;
            }
            return b;
        }
    }
    return NULL;
}

/* ---- sizes ---- */

static size_t round_size(size_t bytes) {
    if (bytes < MT_CUDA_ALLOC_ROUND) {
        return MT_CUDA_ALLOC_ROUND;
    }
    return MT_DIV_UP(bytes, MT_CUDA_ALLOC_ROUND) * MT_CUDA_ALLOC_ROUND;
}

static size_t segment_size(size_t rounded) {
    if (rounded <= MT_CUDA_ALLOC_SMALL) {
        return MT_CUDA_ALLOC_SMALL_SEGMENT;
    }
    if (rounded < MT_CUDA_ALLOC_MID_LIMIT) {
        return MT_CUDA_ALLOC_MID_SEGMENT;
    }
    return MT_DIV_UP(rounded, MT_CUDA_ALLOC_LARGE_ROUND) * MT_CUDA_ALLOC_LARGE_ROUND;
}

static bool should_split(const block_t *b, size_t rounded) {
    size_t rest = b->size - rounded;
    return b->pool == 0 ? rest >= MT_CUDA_ALLOC_ROUND : rest > MT_CUDA_ALLOC_SMALL;
}

/* ---- create / destroy ---- */

mt_status_t mt_cuda_alloc_create(const mt_cuda_alloc_backend_t *backend, bool caching, mt_cuda_alloc_t *out) {
    *out = NULL;
    if (!backend || !backend->raw_alloc || !backend->raw_free) {
        return mt_error(MT_ERR_INVALID_ARG, "cuda_alloc: the backend needs raw_alloc and raw_free");
    }
    struct mt_cuda_alloc *a = calloc(1, sizeof(*a));
    if (!a) {
        return mt_error(MT_ERR_OOM, "cuda_alloc: no host memory for the allocator");
    }
    a->be = *backend;
    a->caching = caching;
    pthread_mutex_init(&a->mu, NULL);
    *out = a;
    return MT_OK;
}

/* A backend of virtual addresses for mt_cuda_alloc_replay: segments at increasing, 2 MiB-aligned addresses
 * that nothing reads or writes. */
static mt_status_t virt_alloc(void *ctx, void **ptr, size_t bytes) {
    uintptr_t *next = ctx;
    *ptr = (void *)*next;
    *next += MT_DIV_UP(bytes, MT_CUDA_ALLOC_LARGE_ROUND) * MT_CUDA_ALLOC_LARGE_ROUND;
    return MT_OK;
}

static void virt_free(void *ctx, void *ptr, size_t bytes) {
    (void)ctx;
    (void)ptr;
    (void)bytes;
}

mt_status_t mt_cuda_alloc_replay(const size_t *bytes, const mt_mem_cat_t *cats, int n, int64_t by_cat[MT_MEM_NCAT],
                                 int64_t *reserved) {
    uintptr_t next = (uintptr_t)1 << 44;
    mt_cuda_alloc_backend_t be = {.name = "replay", .raw_alloc = virt_alloc, .raw_free = virt_free, .ctx = &next,
                                  .unaccounted = true};
    mt_cuda_alloc_t a = NULL;
    MT_CHECK(mt_cuda_alloc_create(&be, true, &a));
    mt_status_t st = MT_OK;
    void **ptrs = calloc((size_t)MT_MAX(n, 1), sizeof(void *));
    if (!ptrs) {
        st = mt_error(MT_ERR_OOM, "cuda_alloc: no host memory for a replay of %d requests", n);
    }
    for (int i = 0; st == MT_OK && i < n; i++) {
        st = mt_cuda_alloc_malloc(a, &ptrs[i], bytes[i], cats[i], "replay", NULL);
    }
    mt_cuda_alloc_stats_t s;
    mt_cuda_alloc_get_stats(a, &s);
    for (int c = 0; c < MT_MEM_NCAT; c++) {
        by_cat[c] = s.allocated_by_cat[c];
    }
    if (reserved) {
        *reserved = s.reserved_bytes;
    }
    for (int i = 0; ptrs && i < n; i++) {
        mt_cuda_alloc_free(a, ptrs[i]);
    }
    free(ptrs);
    mt_cuda_alloc_destroy(a);
    return st;
}

/* Releases one whole free segment (b spans it) to the backend. Lock held. */
static void release_segment(struct mt_cuda_alloc *a, block_t *b) {
    MT_ASSERT(!b->allocated && !b->prev && !b->next);
    fl_remove(&a->pools[b->pool], b);
    a->be.raw_free(a->be.ctx, b->ptr, b->size);
    a->st.reserved_bytes -= (int64_t)b->size;
    a->st.n_segments--;
    a->st.n_raw_frees++;
    free(b);
}

static size_t empty_cache_locked(struct mt_cuda_alloc *a) {
    size_t released = 0;
    for (int p = 0; p < 2; p++) {
        free_list_t *fl = &a->pools[p];
        for (size_t i = fl->n; i-- > 0;) {
            block_t *b = fl->v[i];
            if (!b->prev && !b->next) {
                released += b->size;
                release_segment(a, b);
            }
        }
    }
    return released;
}

void mt_cuda_alloc_destroy(mt_cuda_alloc_t a) {
    if (!a) {
        return;
    }
    pthread_mutex_lock(&a->mu);
    if (a->hcount > 0) {
        const char *first = "?";
        for (size_t i = 0; i < a->hcap && !strcmp(first, "?"); i++) {
            if (a->htab[i] && a->htab[i]->owner) {
                first = a->htab[i]->owner;
            }
        }
        MT_WARN("cuda_alloc: destroyed with %zu live blocks (%" PRId64 " bytes, e.g. owner %s); releasing them",
                a->hcount, a->st.allocated_bytes, first);
        for (size_t i = 0; i < a->hcap; i++) {
            for (block_t *b = a->htab[i]; b; b = b->hnext) {
                if (!a->be.unaccounted) {
                    mt_mem_account(MT_MEM_DEVICE, b->cat, -(int64_t)b->size, b->ptr, b->owner);
                }
            }
        }
    }
    /* Walk every segment from its first block: free blocks are in the pools, live ones in the table. */
    block_t **heads = NULL;
    size_t n_heads = 0, cap_heads = 0;
    for (int p = 0; p < 2; p++) {
        for (size_t i = 0; i < a->pools[p].n; i++) {
            block_t *b = a->pools[p].v[i];
            if (!b->prev) {
                push_block(&heads, &n_heads, &cap_heads, b);
            }
        }
    }
    for (size_t i = 0; i < a->hcap; i++) {
        for (block_t *b = a->htab[i]; b; b = b->hnext) {
            if (!b->prev) {
                push_block(&heads, &n_heads, &cap_heads, b);
            }
        }
    }
    for (size_t i = 0; i < n_heads; i++) {
        size_t seg = 0;
        char *base = heads[i]->ptr;
        for (block_t *b = heads[i], *nx; b; b = nx) {
            nx = b->next;
            seg += b->size;
            free(b);
        }
        a->be.raw_free(a->be.ctx, base, seg);
    }
    free(heads);
    free(a->pools[0].v);
    free(a->pools[1].v);
    free(a->htab);
    pthread_mutex_unlock(&a->mu);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

/* ---- malloc / free ---- */

static mt_status_t oom_report(struct mt_cuda_alloc *a, size_t bytes, size_t rounded, mt_mem_cat_t cat,
                              const char *owner, mt_status_t st) {
    char cats[512];
    size_t off = 0;
    for (int c = 0; c < MT_MEM_NCAT; c++) {
        off += (size_t)snprintf(cats + off, sizeof(cats) - off, "%s%s %" PRId64, c ? ", " : "",
                                mt_mem_cat_name((mt_mem_cat_t)c), a->st.allocated_by_cat[c]);
        if (off >= sizeof(cats)) {
            break;
        }
    }
    int64_t cached = a->st.reserved_bytes - a->st.allocated_bytes;
    char dev[128] = "";
    size_t fr = 0, tot = 0;
    if (a->be.mem_info && a->be.mem_info(a->be.ctx, &fr, &tot) == MT_OK) {
        snprintf(dev, sizeof(dev), "; the device has %zu of %zu bytes free", fr, tot);
    }
    a->st.n_ooms++;
    MT_WARN("out of device memory (%s): request of %zu bytes (%zu rounded) of %s for %s; allocated by category: %s "
            "bytes; reserved %" PRId64 " bytes in %" PRId64 " segments, %" PRId64 " of them cached free%s",
            a->be.name ? a->be.name : "?", bytes, rounded, mt_mem_cat_name(cat), owner ? owner : "?", cats,
            a->st.reserved_bytes, a->st.n_segments, cached, dev);
    return mt_error(st == MT_ERR_OOM ? MT_ERR_OOM : st,
                    "out of device memory: request of %zu bytes of %s for %s failed; allocated by category: %s "
                    "bytes; reserved %" PRId64 " (cached free %" PRId64 ")%s. Lower the micro-batch size, "
                    "use model.recompute or a ZeRO stage",
                    bytes, mt_mem_cat_name(cat), owner ? owner : "?", cats, a->st.reserved_bytes, cached, dev);
}

/* Gets a new segment able to hold rounded bytes and returns it as one free block (not in any list). */
static mt_status_t new_segment(struct mt_cuda_alloc *a, size_t rounded, void *stream, block_t **out) {
    size_t seg = segment_size(rounded);
    block_t *b = calloc(1, sizeof(*b));
    if (!b) {
        return mt_error(MT_ERR_OOM, "cuda_alloc: no host memory for a block descriptor");
    }
    void *p = NULL;
    mt_status_t st = a->be.raw_alloc(a->be.ctx, &p, seg);
    if (st == MT_ERR_OOM && a->caching) {
        a->st.n_cache_flushes++;
        size_t released = empty_cache_locked(a);
        MT_INFO(MT_LOG_MEM, "cuda_alloc: segment of %zu bytes failed; released %zu cached bytes and retrying", seg,
                released);
        st = a->be.raw_alloc(a->be.ctx, &p, seg);
    }
    if (st != MT_OK) {
        free(b);
        return st;
    }
    a->st.n_raw_allocs++;
    a->st.n_segments++;
    a->st.reserved_bytes += (int64_t)seg;
    if (a->st.reserved_bytes > a->st.peak_reserved_bytes) {
        a->st.peak_reserved_bytes = a->st.reserved_bytes;
    }
    b->ptr = p;
    b->size = seg;
    b->stream = stream;
    b->pool = rounded <= MT_CUDA_ALLOC_SMALL ? 0 : 1;
    *out = b;
    return MT_OK;
}

mt_status_t mt_cuda_alloc_malloc(mt_cuda_alloc_t a, void **ptr, size_t bytes, mt_mem_cat_t cat, const char *owner,
                                 void *stream) {
    *ptr = NULL;
    if ((unsigned)cat >= MT_MEM_NCAT) {
        return mt_error(MT_ERR_INVALID_ARG, "cuda_alloc: unknown memory category %d", (int)cat);
    }
    if (bytes > SIZE_MAX / 2) {
        return mt_error(MT_ERR_INVALID_ARG, "cuda_alloc: request of %zu bytes for %s is out of range", bytes,
                        owner ? owner : "?");
    }
    size_t rounded = round_size(bytes);
    int pool = rounded <= MT_CUDA_ALLOC_SMALL ? 0 : 1;
    pthread_mutex_lock(&a->mu);
    mt_status_t st = MT_OK;
    block_t *b = fl_best_fit(&a->pools[pool], stream, rounded);
    if (b) {
        fl_remove(&a->pools[pool], b);
    } else {
        st = new_segment(a, rounded, stream, &b);
        if (st != MT_OK && st != MT_ERR_OOM) { /* not memory: no device, a driver error (the backend's message) */
            st = mt_error(st, "cuda_alloc: %zu bytes of %s for %s: %s", bytes, mt_mem_cat_name(cat),
                          owner ? owner : "?", mt_last_error_msg());
            pthread_mutex_unlock(&a->mu);
            return st;
        }
        if (st != MT_OK) {
            st = oom_report(a, bytes, rounded, cat, owner, st);
            pthread_mutex_unlock(&a->mu);
            return st;
        }
    }
    if (should_split(b, rounded)) {
        block_t *rest = calloc(1, sizeof(*rest));
        if (rest) {
            rest->ptr = b->ptr + rounded;
            rest->size = b->size - rounded;
            rest->stream = b->stream;
            rest->pool = b->pool;
            rest->prev = b;
            rest->next = b->next;
            if (b->next) {
                b->next->prev = rest;
            }
            b->next = rest;
            b->size = rounded;
            if (!fl_insert(&a->pools[pool], rest)) {
                absorb_next(b); /* cannot index the remainder: merge it back and hand out the whole block */
            }
        }
    }
    b->allocated = true;
    b->requested = bytes;
    b->cat = cat;
    b->owner = owner;
    if (!htab_insert(a, b)) {
        b->allocated = false;
        fl_insert(&a->pools[pool], b);
        pthread_mutex_unlock(&a->mu);
        return mt_error(MT_ERR_OOM, "cuda_alloc: no host memory to index a block");
    }
    a->st.allocated_bytes += (int64_t)b->size;
    a->st.requested_bytes += (int64_t)bytes;
    a->st.allocated_by_cat[cat] += (int64_t)b->size;
    if (a->st.allocated_bytes > a->st.peak_allocated_bytes) {
        a->st.peak_allocated_bytes = a->st.allocated_bytes;
    }
    a->st.n_allocs++;
    *ptr = b->ptr;
    size_t sz = b->size;
    pthread_mutex_unlock(&a->mu);
    if (!a->be.unaccounted) {
        mt_mem_account(MT_MEM_DEVICE, cat, (int64_t)sz, *ptr, owner);
    }
    return MT_OK;
}

void mt_cuda_alloc_free(mt_cuda_alloc_t a, void *ptr) {
    if (!ptr) {
        return;
    }
    pthread_mutex_lock(&a->mu);
    block_t *b = htab_find(a, ptr, true);
    if (!b) {
        pthread_mutex_unlock(&a->mu);
        MT_ABORT("cuda_alloc: free of %p, which this allocator did not hand out or which was already freed", ptr);
    }
    mt_mem_cat_t cat = b->cat;
    const char *owner = b->owner;
    int64_t sz = (int64_t)b->size;
    a->st.allocated_bytes -= sz;
    a->st.requested_bytes -= (int64_t)b->requested;
    a->st.allocated_by_cat[cat] -= sz;
    a->st.n_frees++;
    b->allocated = false;
    b->owner = NULL;
    free_list_t *fl = &a->pools[b->pool];
    /* coalesce with free neighbours (always of the same segment, hence the same stream and pool) */
    if (b->prev && !b->prev->allocated) {
        block_t *p = b->prev;
        fl_remove(fl, p);
        absorb_next(p);
        b = p;
    }
    if (b->next && !b->next->allocated) {
        fl_remove(fl, b->next);
        absorb_next(b);
    }
    if (!fl_insert(fl, b)) {
        MT_ABORT("cuda_alloc: no host memory to index a free block");
    }
    if (!a->caching && !b->prev && !b->next) {
        release_segment(a, b);
    }
    pthread_mutex_unlock(&a->mu);
    if (!a->be.unaccounted) {
        mt_mem_account(MT_MEM_DEVICE, cat, -sz, ptr, owner);
    }
}

size_t mt_cuda_alloc_block_size(mt_cuda_alloc_t a, const void *ptr) {
    pthread_mutex_lock(&a->mu);
    block_t *b = htab_find(a, ptr, false);
    size_t s = b ? b->size : 0;
    pthread_mutex_unlock(&a->mu);
    return s;
}

size_t mt_cuda_alloc_empty_cache(mt_cuda_alloc_t a) {
    pthread_mutex_lock(&a->mu);
    size_t r = empty_cache_locked(a);
    pthread_mutex_unlock(&a->mu);
    return r;
}

void mt_cuda_alloc_get_stats(mt_cuda_alloc_t a, mt_cuda_alloc_stats_t *out) {
    pthread_mutex_lock(&a->mu);
    *out = a->st;
    pthread_mutex_unlock(&a->mu);
}

void mt_cuda_alloc_reset_peak(mt_cuda_alloc_t a) {
    pthread_mutex_lock(&a->mu);
    a->st.peak_allocated_bytes = a->st.allocated_bytes;
    a->st.peak_reserved_bytes = a->st.reserved_bytes;
    pthread_mutex_unlock(&a->mu);
}

/* ---- invariants ---- */

static mt_status_t validate_segment(struct mt_cuda_alloc *a, block_t *head, int64_t *seg_bytes, int64_t *live_bytes,
                                    size_t *n_free, size_t *n_live) {
    char *expect = head->ptr;
    for (block_t *b = head; b; b = b->next) {
        if (b->ptr != expect) {
            return mt_error(MT_ERR_INTERNAL, "cuda_alloc: block %p does not follow its neighbour (expected %p)",
                            (void *)b->ptr, (void *)expect);
        }
        if (b->size == 0 || b->size % MT_CUDA_ALLOC_ROUND) {
            return mt_error(MT_ERR_INTERNAL, "cuda_alloc: block %p has size %zu", (void *)b->ptr, b->size);
        }
        if (b->next && b->next->prev != b) {
            return mt_error(MT_ERR_INTERNAL, "cuda_alloc: broken back link after %p", (void *)b->ptr);
        }
        if (b->next && !b->allocated && !b->next->allocated) {
            return mt_error(MT_ERR_INTERNAL, "cuda_alloc: adjacent free blocks %p and %p were not coalesced",
                            (void *)b->ptr, (void *)b->next->ptr);
        }
        if (b->stream != head->stream || b->pool != head->pool) {
            return mt_error(MT_ERR_INTERNAL, "cuda_alloc: block %p differs from its segment's stream or pool",
                            (void *)b->ptr);
        }
        if (b->allocated) {
            if (htab_find(a, b->ptr, false) != b) {
                return mt_error(MT_ERR_INTERNAL, "cuda_alloc: live block %p missing from the table", (void *)b->ptr);
            }
            *live_bytes += (int64_t)b->size;
            (*n_live)++;
        } else {
            free_list_t *fl = &a->pools[b->pool];
            size_t i = fl_lower_bound(fl, b);
            if (i >= fl->n || fl->v[i] != b) {
                return mt_error(MT_ERR_INTERNAL, "cuda_alloc: free block %p missing from its free list",
                                (void *)b->ptr);
            }
            (*n_free)++;
        }
        *seg_bytes += (int64_t)b->size;
        expect = b->ptr + b->size;
    }
    return MT_OK;
}

mt_status_t mt_cuda_alloc_validate(mt_cuda_alloc_t a) {
    pthread_mutex_lock(&a->mu);
    mt_status_t st = MT_OK;
    int64_t reserved = 0, live = 0, n_seg = 0;
    size_t n_free = 0, n_live = 0;
    for (int p = 0; p < 2 && st == MT_OK; p++) {
        free_list_t *fl = &a->pools[p];
        for (size_t i = 0; i < fl->n && st == MT_OK; i++) {
            if (i > 0 && block_cmp(fl->v[i - 1], fl->v[i]) >= 0) {
                st = mt_error(MT_ERR_INTERNAL, "cuda_alloc: free list %d out of order at %zu", p, i);
            } else if (fl->v[i]->allocated || fl->v[i]->pool != p) {
                st = mt_error(MT_ERR_INTERNAL, "cuda_alloc: free list %d holds a live or foreign block", p);
            } else if (!fl->v[i]->prev) {
                n_seg++;
                st = validate_segment(a, fl->v[i], &reserved, &live, &n_free, &n_live);
            }
        }
    }
    for (size_t i = 0; i < a->hcap && st == MT_OK; i++) {
        for (block_t *b = a->htab[i]; b && st == MT_OK; b = b->hnext) {
            if (!b->allocated) {
                st = mt_error(MT_ERR_INTERNAL, "cuda_alloc: table holds free block %p", (void *)b->ptr);
            } else if (!b->prev) {
                n_seg++;
                st = validate_segment(a, b, &reserved, &live, &n_free, &n_live);
            }
        }
    }
    if (st == MT_OK) {
        int64_t by_cat = 0;
        for (int c = 0; c < MT_MEM_NCAT; c++) {
            by_cat += a->st.allocated_by_cat[c];
        }
        if (reserved != a->st.reserved_bytes || n_seg != a->st.n_segments) {
            st = mt_error(MT_ERR_INTERNAL,
                          "cuda_alloc: segments sum to %" PRId64 " bytes in %" PRId64 ", counters say %" PRId64
                          " in %" PRId64,
                          reserved, n_seg, a->st.reserved_bytes, a->st.n_segments);
        } else if (live != a->st.allocated_bytes || by_cat != live) {
            st = mt_error(MT_ERR_INTERNAL,
                          "cuda_alloc: live blocks sum to %" PRId64 ", counters say %" PRId64 " (by category %" PRId64
                          ")",
                          live, a->st.allocated_bytes, by_cat);
        } else if (n_live != a->hcount || n_free != a->pools[0].n + a->pools[1].n) {
            st = mt_error(MT_ERR_INTERNAL, "cuda_alloc: %zu live / %zu free blocks reachable, lists hold %zu / %zu",
                          n_live, n_free, a->hcount, a->pools[0].n + a->pools[1].n);
        }
    }
    pthread_mutex_unlock(&a->mu);
    return st;
}

/* ---- the CUDA backend and the process's allocator ---- */

MT_PARAM(cuda_cache, "CUDA_CACHE", 1)

#if MT_HAVE_CUDA
static mt_status_t cuda_raw_alloc(void *ctx, void **ptr, size_t bytes) {
    cudaError_t e = cudaMalloc(ptr, bytes);
    if (e == cudaSuccess) {
        return MT_OK;
    }
    (void)cudaGetLastError(); /* clear the sticky-free error so later calls do not see it */
    if (e == cudaErrorMemoryAllocation) {
        return MT_ERR_OOM;
    }
    return mt_error(MT_ERR_CUDA, "cudaMalloc of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
}

static void cuda_raw_free(void *ctx, void *ptr, size_t bytes) {
    cudaError_t e = cudaFree(ptr);
    if (e != cudaSuccess) {
        MT_WARN("cudaFree of a %zu-byte segment failed: %s", bytes, cudaGetErrorString(e));
    }
}

static mt_status_t cuda_mem_info(void *ctx, size_t *fr, size_t *tot) {
    return cudaMemGetInfo(fr, tot) == cudaSuccess ? MT_OK : MT_ERR_CUDA;
}
#endif

static pthread_mutex_t default_mu = PTHREAD_MUTEX_INITIALIZER;
static mt_cuda_alloc_t default_alloc;

mt_status_t mt_cuda_alloc_default(mt_cuda_alloc_t *out) {
#if MT_HAVE_CUDA
    pthread_mutex_lock(&default_mu);
    mt_status_t st = MT_OK;
    if (!default_alloc) {
        mt_cuda_alloc_backend_t be = {.name = "cuda",
                                      .raw_alloc = cuda_raw_alloc,
                                      .raw_free = cuda_raw_free,
                                      .mem_info = cuda_mem_info,
                                      .ctx = NULL};
        st = mt_cuda_alloc_create(&be, mt_param_cuda_cache() != 0, &default_alloc);
    }
    *out = default_alloc;
    pthread_mutex_unlock(&default_mu);
    return st;
#else
    (void)default_mu;
    (void)default_alloc;
    (void)mt_param_cuda_cache;
    *out = NULL;
    return mt_error(MT_ERR_INVALID_USAGE, "cuda_alloc: device memory requested but meshtrain was built without CUDA");
#endif
}

mt_status_t mt_dev_malloc(void **ptr, size_t bytes, mt_mem_cat_t cat, const char *owner, void *stream) {
    mt_cuda_alloc_t a;
    *ptr = NULL;
    MT_CHECK(mt_cuda_alloc_default(&a));
    return mt_cuda_alloc_malloc(a, ptr, bytes, cat, owner, stream);
}

void mt_dev_free(void *ptr) {
    if (!ptr) {
        return;
    }
    mt_cuda_alloc_t a;
    MT_ASSERT(mt_cuda_alloc_default(&a) == MT_OK);
    mt_cuda_alloc_free(a, ptr);
}

size_t mt_dev_empty_cache(void) {
    mt_cuda_alloc_t a = NULL;
    pthread_mutex_lock(&default_mu);
    a = default_alloc;
    pthread_mutex_unlock(&default_mu);
    return a ? mt_cuda_alloc_empty_cache(a) : 0;
}
