/* The caching device allocator: device memory is taken from the driver in segments (cudaMalloc) and
 * handed out as blocks that are split, reused and coalesced here, so a training loop in its steady state
 * never calls cudaMalloc/cudaFree (each of which synchronises the device). Every block is accounted under
 * a memory category through mt_mem_account(MT_MEM_DEVICE, ...), the same categories as host memory.
 * The bookkeeping is plain C over a backend table, so it is tested on machines without a GPU.
 * SPDX-License-Identifier: MIT */
#ifndef MT_CUDA_ALLOC_H
#define MT_CUDA_ALLOC_H

#include "runtime/alloc.h"
#include "runtime/mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where segments come from. The CUDA backend (mt_cuda_alloc_default) uses cudaMalloc/cudaFree/
 * cudaMemGetInfo; tests plug in a host-memory backend with a capacity limit. */
typedef struct {
    const char *name;
    /* Obtains one segment of exactly bytes. Returns MT_OK, MT_ERR_OOM when the device is out of memory
     * (the allocator then frees its cache and retries once), or another status for other failures. */
    mt_status_t (*raw_alloc)(void *ctx, void **ptr, size_t bytes);
    /* Returns a segment obtained from raw_alloc. Must wait for work using it (cudaFree synchronises). */
    void (*raw_free)(void *ctx, void *ptr, size_t bytes);
    /* Optional (NULL): free and total device bytes, for out-of-memory reports. */
    mt_status_t (*mem_info)(void *ctx, size_t *free_bytes, size_t *total_bytes);
    void *ctx;
    bool unaccounted; /* blocks are not reported to mt_mem_account (planning replays: no memory is involved) */
} mt_cuda_alloc_backend_t;

typedef struct mt_cuda_alloc *mt_cuda_alloc_t;

/* Size classes. A request is rounded up to a multiple of MT_CUDA_ALLOC_ROUND. Requests up to
 * MT_CUDA_ALLOC_SMALL come from the small pool, carved out of MT_CUDA_ALLOC_SMALL_SEGMENT segments;
 * larger ones from the large pool: segments of MT_CUDA_ALLOC_MID_SEGMENT for requests below
 * MT_CUDA_ALLOC_MID_LIMIT, otherwise the request rounded up to MT_CUDA_ALLOC_LARGE_ROUND. A free block is
 * split when the remainder is at least MT_CUDA_ALLOC_ROUND (small pool) or above MT_CUDA_ALLOC_SMALL
 * (large pool), so large segments are not shredded into pieces only small requests could use. */
#define MT_CUDA_ALLOC_ROUND ((size_t)512)
#define MT_CUDA_ALLOC_SMALL ((size_t)1 << 20)
#define MT_CUDA_ALLOC_SMALL_SEGMENT ((size_t)2 << 20)
#define MT_CUDA_ALLOC_MID_LIMIT ((size_t)10 << 20)
#define MT_CUDA_ALLOC_MID_SEGMENT ((size_t)20 << 20)
#define MT_CUDA_ALLOC_LARGE_ROUND ((size_t)2 << 20)

typedef struct {
    int64_t allocated_bytes; /* sum of the (rounded) sizes of live blocks */
    int64_t requested_bytes; /* sum of the sizes callers asked for */
    int64_t reserved_bytes;  /* sum of segment sizes held from the backend */
    int64_t peak_allocated_bytes, peak_reserved_bytes;
    int64_t allocated_by_cat[MT_MEM_NCAT]; /* live block bytes per category */
    int64_t n_segments;                    /* segments held now */
    int64_t n_raw_allocs, n_raw_frees;     /* backend calls (cudaMalloc / cudaFree) since creation */
    int64_t n_allocs, n_frees;             /* blocks handed out / returned */
    int64_t n_cache_flushes;               /* times an allocation freed the cache and retried */
    int64_t n_ooms;                        /* requests that failed even after freeing the cache */
} mt_cuda_alloc_stats_t;

/* Creates an allocator over backend (copied). caching = false returns each segment to the backend as soon
 * as all its blocks are free (for memory checkers, which cannot see overruns inside a cached segment).
 * Errors: MT_ERR_INVALID_ARG (backend without raw_alloc/raw_free), MT_ERR_OOM. */
mt_status_t mt_cuda_alloc_create(const mt_cuda_alloc_backend_t *backend, bool caching, mt_cuda_alloc_t *out);

/* Returns every segment to the backend and frees the allocator. Live blocks are a caller bug: they are
 * reported (WARN with the count, bytes and first owner) and their accounting is released. NULL is a no-op. */
void mt_cuda_alloc_destroy(mt_cuda_alloc_t a);

/* Allocates bytes (0 gives a valid unique block of MT_CUDA_ALLOC_ROUND bytes) for use on stream (a
 * cudaStream_t; NULL = the legacy default stream), accounted under cat with owner (a static string kept
 * for reports). The block is 512-byte aligned. A freed block is reused only by allocations on the same
 * stream, whose order makes the reuse safe without synchronisation; a caller that uses a block on another
 * stream must order that stream's work before the free. On backend OOM the allocator releases every
 * fully free cached segment and retries once; if that fails it returns MT_ERR_OOM with a message (also
 * WARNed) naming the request (bytes, category, owner) and what is allocated by category, reserved and
 * cached. Thread-safe. */
mt_status_t mt_cuda_alloc_malloc(mt_cuda_alloc_t a, void **ptr, size_t bytes, mt_mem_cat_t cat, const char *owner,
                                 void *stream);

/* Returns a block to the cache (no backend call unless caching is off). NULL is a no-op. A pointer this
 * allocator did not hand out aborts (a double free or a foreign pointer is a broken invariant). */
void mt_cuda_alloc_free(mt_cuda_alloc_t a, void *ptr);

/* Size accounted for a live block (its rounded size); 0 for an unknown pointer. */
size_t mt_cuda_alloc_block_size(mt_cuda_alloc_t a, const void *ptr);

/* Returns every fully free cached segment to the backend (the user's empty_cache). Returns the bytes
 * released. Blocks in use are untouched. */
size_t mt_cuda_alloc_empty_cache(mt_cuda_alloc_t a);

/* Copies the statistics. */
void mt_cuda_alloc_get_stats(mt_cuda_alloc_t a, mt_cuda_alloc_stats_t *out);

/* Restarts the peak figures from the current ones. */
void mt_cuda_alloc_reset_peak(mt_cuda_alloc_t a);

/* Checks the internal invariants (blocks tile every segment exactly, no two adjacent free blocks, free
 * lists sorted and complete, byte counters equal the sums over blocks). MT_ERR_INTERNAL naming the first
 * violation. For tests. */
mt_status_t mt_cuda_alloc_validate(mt_cuda_alloc_t a);

/* The blocks n requests (bytes[i] under cats[i], in this order, on one stream, none freed) would take from a
 * fresh allocator: by_cat[c] the bytes accounted under category c (each block's size: the request rounded,
 * or a whole segment remainder not worth splitting), *reserved the segments' bytes (may be NULL). Runs the
 * allocator itself over a backend of addresses that are never touched: nothing is allocated or accounted.
 * For planning (plan/plan_mem_gpu.c). Errors: MT_ERR_OOM (host memory for the bookkeeping). */
mt_status_t mt_cuda_alloc_replay(const size_t *bytes, const mt_mem_cat_t *cats, int n, int64_t by_cat[MT_MEM_NCAT],
                                 int64_t *reserved);

/* ---- the process's device allocator (one device per process) ---- */

/* The allocator of the current CUDA device, created on first use over cudaMalloc/cudaFree (caching unless
 * MESHTRAIN_CUDA_CACHE=0). MT_ERR_INVALID_USAGE in a build without CUDA. */
mt_status_t mt_cuda_alloc_default(mt_cuda_alloc_t *out);

/* Shorthands on the default allocator. mt_dev_free(NULL) is a no-op. */
mt_status_t mt_dev_malloc(void **ptr, size_t bytes, mt_mem_cat_t cat, const char *owner, void *stream);
void mt_dev_free(void *ptr);
size_t mt_dev_empty_cache(void);

#ifdef __cplusplus
}
#endif
#endif /* MT_CUDA_ALLOC_H */
