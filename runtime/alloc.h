/* The runtime allocator: every host allocation of model state, activations and communication
 * buffers goes through here, tagged with a category, so current and peak bytes per category are
 * exact. These figures are how ZeRO's memory savings are proven, so nothing is estimated.
 * SPDX-License-Identifier: MIT */
#ifndef MT_ALLOC_H
#define MT_ALLOC_H

#include "mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MT_MEM_PARAMS = 0,
    MT_MEM_GRADS,
    MT_MEM_OPTIMIZER,
    MT_MEM_ACTIVATIONS,
    MT_MEM_COMM,
    MT_MEM_OTHER,
    MT_MEM_NCAT
} mt_mem_cat_t;

/* Where bytes live; the CUDA allocator accounts device memory through mt_mem_account. */
typedef enum { MT_MEM_HOST = 0, MT_MEM_DEVICE = 1, MT_MEM_NDEV } mt_mem_where_t;

#define MT_ALLOC_ALIGN 64 /* host memory is aligned for AVX-512 loads */

/* The bytes mt_alloc accounts for a request of `bytes`: rounded up to a multiple of MT_ALLOC_ALIGN. Pure;
 * the planner (plan/) sizes memory with it so its figures are the allocator's. */
size_t mt_alloc_accounted(size_t bytes);

/* Allocates bytes (rounded up to a multiple of MT_ALLOC_ALIGN, which is what is accounted) of host
 * memory aligned to MT_ALLOC_ALIGN, counted under cat. owner (may be NULL) is a short static name
 * kept for the memory history. Returns NULL on out-of-memory (after a WARN naming the request and
 * the current bytes by category). bytes == 0 returns a valid unique pointer. */
void *mt_alloc(size_t bytes, mt_mem_cat_t cat, const char *owner);

/* As mt_alloc, zero-filled. */
void *mt_calloc(size_t bytes, mt_mem_cat_t cat, const char *owner);

/* Frees memory from mt_alloc/mt_calloc; NULL is a no-op. */
void mt_free(void *p);

/* Bytes accounted for p (the rounded size), its category. */
size_t mt_alloc_size(const void *p);
mt_mem_cat_t mt_alloc_cat(const void *p);

/* Adds delta bytes (negative to release) to a category's count for memory the runtime allocates
 * elsewhere (device memory from the CUDA caching allocator). */
void mt_mem_account(mt_mem_where_t where, mt_mem_cat_t cat, int64_t delta, const void *ptr, const char *owner);

typedef struct {
    int64_t current[MT_MEM_NCAT]; /* bytes now, by category */
    int64_t peak[MT_MEM_NCAT];    /* highest bytes of each category since the last reset */
    int64_t total_current;
    int64_t total_peak; /* highest sum over categories (not the sum of the per-category peaks) */
    int64_t at_peak[MT_MEM_NCAT]; /* the breakdown at the moment total_peak was reached */
    int64_t n_allocs, n_frees;
} mt_mem_stats_t;

/* Copies the counters for host or device memory. Thread-safe. */
void mt_mem_stats(mt_mem_where_t where, mt_mem_stats_t *out);

/* Restarts peak tracking from the current figures. */
void mt_mem_reset_peak(mt_mem_where_t where);

/* "params", "grads", "optimizer", "activations", "comm", "other". */
const char *mt_mem_cat_name(mt_mem_cat_t cat);

/* Observer of every allocation and free (for profile.memory); bytes negative on free. NULL removes. */
typedef void (*mt_mem_hook_t)(mt_mem_where_t where, mt_mem_cat_t cat, int64_t bytes, const void *ptr,
                              const char *owner, void *arg);
void mt_mem_set_hook(mt_mem_hook_t hook, void *arg);

#ifdef __cplusplus
}
#endif
#endif /* MT_ALLOC_H */
