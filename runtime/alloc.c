/* Category-tagged, aligned host allocation with exact current/peak accounting. Each block carries a
 * 64-byte header (size, category, owner) in front of the aligned payload.
 * SPDX-License-Identifier: MIT */
#include "alloc.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>

typedef struct {
    size_t bytes;
    uint32_t magic;
    uint32_t cat;
    const char *owner;
} block_header_t;
_Static_assert(sizeof(block_header_t) <= MT_ALLOC_ALIGN, "header must fit in one alignment unit");

#define BLOCK_MAGIC 0x6d74616cu /* "mtal" */

static pthread_mutex_t mem_mutex = PTHREAD_MUTEX_INITIALIZER;
static mt_mem_stats_t stats[MT_MEM_NDEV];
static mt_mem_hook_t mem_hook;
static void *mem_hook_arg;

const char *mt_mem_cat_name(mt_mem_cat_t cat) {
    static const char *names[MT_MEM_NCAT] = {"params", "grads", "optimizer", "activations", "comm", "other"};
    return (unsigned)cat < MT_MEM_NCAT ? names[cat] : "?";
}

void mt_mem_account(mt_mem_where_t where, mt_mem_cat_t cat, int64_t delta, const void *ptr, const char *owner) {
    MT_ASSERT((unsigned)where < MT_MEM_NDEV && (unsigned)cat < MT_MEM_NCAT);
    pthread_mutex_lock(&mem_mutex);
    mt_mem_stats_t *s = &stats[where];
    s->current[cat] += delta;
    s->total_current += delta;
    MT_ASSERT(s->current[cat] >= 0);
    if (delta > 0) {
        s->n_allocs++;
        if (s->current[cat] > s->peak[cat]) {
            s->peak[cat] = s->current[cat];
        }
        if (s->total_current > s->total_peak) {
            s->total_peak = s->total_current;
            memcpy(s->at_peak, s->current, sizeof(s->at_peak));
        }
    } else if (delta < 0) {
        s->n_frees++;
    }
    mt_mem_hook_t hook = mem_hook;
    void *arg = mem_hook_arg;
    pthread_mutex_unlock(&mem_mutex);
    if (hook) {
        hook(where, cat, delta, ptr, owner, arg);
    }
}

/* RAM plus swap of this machine, read once (0 if unknown): no single host allocation can exceed it. */
static uint64_t machine_bytes(void) {
    static _Atomic uint64_t cached;
    uint64_t v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v == 0) {
        struct sysinfo si;
        if (sysinfo(&si) == 0) {
            v = ((uint64_t)si.totalram + (uint64_t)si.totalswap) * (uint64_t)si.mem_unit;
            atomic_store_explicit(&cached, v, memory_order_relaxed);
        }
    }
    return v;
}

size_t mt_alloc_accounted(size_t bytes) {
    return MT_DIV_UP(bytes, MT_ALLOC_ALIGN) * MT_ALLOC_ALIGN;
}

void *mt_alloc(size_t bytes, mt_mem_cat_t cat, const char *owner) {
    MT_ASSERT((unsigned)cat < MT_MEM_NCAT);
    size_t rounded = mt_alloc_accounted(bytes);
    if (rounded < bytes || rounded > SIZE_MAX - MT_ALLOC_ALIGN) {
        MT_WARN("allocation of %zu bytes for %s (%s) overflows", bytes, owner ? owner : "?", mt_mem_cat_name(cat));
        return NULL;
    }
    uint64_t limit = machine_bytes();
    if (limit > 0 && (uint64_t)rounded > limit) {
        /* A size this large comes from a corrupt file or config, not a real model: say so instead of
         * letting the kernel's overcommit or the OOM killer decide (reliability, issue 10). */
        MT_WARN("allocation of %zu bytes of %s for %s is larger than this machine's memory (%.1f GiB of RAM and "
                "swap): refused", bytes, mt_mem_cat_name(cat), owner ? owner : "?", (double)limit / (1u << 30));
        return NULL;
    }
    void *raw = NULL;
    if (posix_memalign(&raw, MT_ALLOC_ALIGN, rounded + MT_ALLOC_ALIGN) != 0) {
        mt_mem_stats_t s;
        mt_mem_stats(MT_MEM_HOST, &s);
        MT_WARN("out of host memory allocating %zu bytes of %s for %s; now held: params %lld, grads %lld, "
                "optimizer %lld, activations %lld, comm %lld, other %lld bytes",
                bytes, mt_mem_cat_name(cat), owner ? owner : "?", (long long)s.current[0], (long long)s.current[1],
                (long long)s.current[2], (long long)s.current[3], (long long)s.current[4], (long long)s.current[5]);
        return NULL;
    }
    block_header_t *h = raw;
    h->bytes = rounded;
    h->magic = BLOCK_MAGIC;
    h->cat = cat;
    h->owner = owner;
    void *p = (char *)raw + MT_ALLOC_ALIGN;
    mt_mem_account(MT_MEM_HOST, cat, (int64_t)rounded, p, owner);
    return p;
}

void *mt_calloc(size_t bytes, mt_mem_cat_t cat, const char *owner) {
    void *p = mt_alloc(bytes, cat, owner);
    if (p) {
        memset(p, 0, bytes);
    }
    return p;
}

static block_header_t *header_of(const void *p) {
    block_header_t *h = (block_header_t *)((char *)p - MT_ALLOC_ALIGN);
    MT_ASSERT(h->magic == BLOCK_MAGIC);
    return h;
}

void mt_free(void *p) {
    if (!p) {
        return;
    }
    block_header_t *h = header_of(p);
    mt_mem_account(MT_MEM_HOST, (mt_mem_cat_t)h->cat, -(int64_t)h->bytes, p, h->owner);
    h->magic = 0;
    free(h);
}

size_t mt_alloc_size(const void *p) { return header_of(p)->bytes; }

mt_mem_cat_t mt_alloc_cat(const void *p) { return (mt_mem_cat_t)header_of(p)->cat; }

void mt_mem_stats(mt_mem_where_t where, mt_mem_stats_t *out) {
    pthread_mutex_lock(&mem_mutex);
    *out = stats[where];
    pthread_mutex_unlock(&mem_mutex);
}

void mt_mem_reset_peak(mt_mem_where_t where) {
    pthread_mutex_lock(&mem_mutex);
    mt_mem_stats_t *s = &stats[where];
    memcpy(s->peak, s->current, sizeof(s->peak));
    s->total_peak = s->total_current;
    memcpy(s->at_peak, s->current, sizeof(s->at_peak));
    pthread_mutex_unlock(&mem_mutex);
}

void mt_mem_set_hook(mt_mem_hook_t hook, void *arg) {
    pthread_mutex_lock(&mem_mutex);
    mem_hook = hook;
    mem_hook_arg = arg;
    pthread_mutex_unlock(&mem_mutex);
}
