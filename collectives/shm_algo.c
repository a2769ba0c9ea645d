/* The shared-memory collectives over a node's segment (shm_seg.c). Large messages go in rounds of one
 * chunk per rank, alternating between two buffers so a fast rank fills round k+1 while a slow one still
 * reads round k; reductions split each round into n slices, one reduced by each rank:
 *
 *   all-reduce, round k (n = 3, chunk split in slices s0 s1 s2; "in" and "out" areas of each slot):
 *
 *     rank 0 slot.in  [ -- | s1 | s2 ]    1. copy-in: each rank copies the slices the OTHERS reduce
 *     rank 1 slot.in  [ s0 | -- | s2 ]       (its own slice is read straight from its send buffer)
 *     rank 2 slot.in  [ s0 | s1 | -- ]
 *              ---- sync A: every rank's inputs of round k are published ----
 *     rank r: slot_r.out[s_r] = op(in_0[s_r], in_1[s_r], in_2[s_r])   2. reduce own slice, ranks in
 *             recv[s_r] = slot_r.out[s_r]                                order 0..n-1 (deterministic)
 *              ---- sync B: every slice of round k is reduced ----
 *     rank r: recv[s_p] = slot_p.out[s_p] for p != r                  3. gather the other slices
 *
 *   Buffer reuse: round k+2 writes buffer k&1 again only after sync A of round k+1, which no rank
 *   passes before every rank has finished reading round k. The same argument holds for every op here:
 *   each round has a sync after its writes and reads only before the next round's first sync.
 *
 * Small all-reduces (<= SMALL_BYTES) take one sync: everyone copies in, then every rank reduces all of
 * it itself, in the same rank order (so results stay identical across ranks). Tried for large 2-rank
 * all-reduces too (one sync per round instead of two, 3 reads + 2 writes per element instead of
 * 2.5 + 2): measured side by side it was slower (time/raw 0.55-0.73 against 0.45-0.60 at 1-4 MiB).
 * SPDX-License-Identifier: MIT */
#include <string.h>

#include "collectives/shm_impl.h"

#define SMALL_BYTES (32u * 1024u)
#define SLICE_ALIGN 64u /* slice boundaries on cache lines */

enum { K_ALL_REDUCE = 1, K_REDUCE, K_REDUCE_SCATTER, K_ALL_GATHER, K_BROADCAST, K_BARRIER };

/* [lo, hi) in bytes of slice r of a round of len bytes split in n, boundaries on whole elements and
 * (when the round is big enough) cache lines. */
static void slice(size_t len, size_t es, int n, int r, size_t *lo, size_t *hi) {
    size_t unit = es * (SLICE_ALIGN / es ? SLICE_ALIGN / es : 1);
    size_t units = len / unit;
    size_t a = units * (size_t)r / (size_t)n * unit, b = units * (size_t)(r + 1) / (size_t)n * unit;
    if (r == n - 1) {
        b = len; /* the tail that is not a whole unit goes to the last slice */
    }
    *lo = a;
    *hi = b;
}

static bool overlaps(const void *a, size_t alen, const void *b, size_t blen) {
    const char *x = a, *y = b;
    return alen && blen && x < y + blen && y < x + alen;
}

static void copy(void *dst, const void *src, size_t len) {
    if (len && dst != src) {
        memcpy(dst, src, len);
    }
}

/* Rounds of a reduction in which each rank reduces one slice (all-reduce, reduce to root). */
static mt_status_t reduce_rounds(mt_shm_t *s, const char *send, char *recv, size_t count, mt_coll_dtype_t dtype,
                                 mt_redop_t op, int root) {
    const size_t es = mt_coll_dtype_size(dtype), total = count * es;
    const size_t per_round = s->chunk / es * es;
    const int me = s->rank, n = s->n;
    const bool all = root < 0;
    const void *in[MT_SHM_MAX_RANKS];
    for (size_t off = 0; off < total; off += per_round) {
        size_t len = total - off < per_round ? total - off : per_round;
        size_t lo, hi;
        slice(len, es, n, me, &lo, &hi);
        char *my_in = shm_area(s, me, s->round, SHM_IN);
        copy(my_in, send + off, lo);
        copy(my_in + hi, send + off + hi, len - hi);
        MT_CHECK(mt_shm_sync(s, off == 0));
        for (int r = 0; r < n; r++) {
            in[r] = r == me ? (const void *)(send + off + lo) : (const void *)(shm_area(s, r, s->round, SHM_IN) + lo);
        }
        char *my_out = shm_area(s, me, s->round, SHM_OUT) + lo;
        mt_shm_reduce_kernel(my_out, in, n, (hi - lo) / es, dtype, op, n);
        if (all || me == root) {
            copy(recv + off + lo, my_out, hi - lo);
        }
        if (all) {
            MT_CHECK(mt_shm_sync(s, false));
        } else {
            mt_shm_arrive(s); /* only root waits for the slices */
            for (int p = 0; p < n && me == root; p++) {
                if (p != me) {
                    MT_CHECK(mt_shm_wait(s, p));
                }
            }
        }
        for (int p = 0; p < n && (all || me == root); p++) {
            if (p != me) {
                size_t plo, phi;
                slice(len, es, n, p, &plo, &phi);
                copy(recv + off + plo, shm_area(s, p, s->round, SHM_OUT) + plo, phi - plo);
            }
        }
        s->round++;
    }
    return MT_OK;
}

/* One sync per round: every rank (or root only) reduces the whole round from all inputs, its own read
 * straight from its send buffer unless that overlaps recv (in place). */
static mt_status_t reduce_full(mt_shm_t *s, const char *send, char *recv, size_t count, mt_coll_dtype_t dtype,
                               mt_redop_t op, int root) {
    const size_t es = mt_coll_dtype_size(dtype), total = count * es, per_round = s->chunk / es * es;
    const bool mine = root < 0 || root == s->rank;
    const void *in[MT_SHM_MAX_RANKS];
    for (size_t off = 0; off < total; off += per_round) {
        size_t len = total - off < per_round ? total - off : per_round;
        char *my_in = shm_area(s, s->rank, s->round, SHM_IN);
        bool own_direct = mine && !overlaps(send + off, len, recv + off, len);
        copy(my_in, send + off, len);
        MT_CHECK(mt_shm_sync(s, off == 0));
        if (mine) {
            for (int r = 0; r < s->n; r++) {
                in[r] = (r == s->rank && own_direct) ? (const void *)(send + off) : shm_area(s, r, s->round, SHM_IN);
            }
            mt_shm_reduce_kernel(recv + off, in, s->n, len / es, dtype, op, s->n);
        }
        s->round++;
    }
    return MT_OK;
}

static mt_status_t reduce_any(mt_shm_t *s, const char *name, int kind, const void *send, void *recv, size_t count,
                              mt_coll_dtype_t dtype, mt_redop_t op, int root) {
    if (count == 0) {
        return MT_OK;
    }
    MT_CHECK(mt_shm_begin(s, name, kind, count, dtype, (int)op, root));
    size_t total = count * mt_coll_dtype_size(dtype);
    if (total <= SMALL_BYTES) {
        return reduce_full(s, send, recv, count, dtype, op, root);
    }
    return reduce_rounds(s, send, recv, count, dtype, op, root);
}

mt_status_t mt_shm_all_reduce(mt_shm_t *s, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                              mt_redop_t op) {
    return reduce_any(s, "all_reduce", K_ALL_REDUCE, send, recv, count, dtype, op, -1);
}

mt_status_t mt_shm_reduce(mt_shm_t *s, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype, mt_redop_t op,
                          int root) {
    return reduce_any(s, "reduce", K_REDUCE, send, recv, count, dtype, op, root);
}

/* Round k carries elements [off, off+m) of every block: rank r copies in the blocks of the others,
 * syncs, and reduces block r from every slot (its own from its send buffer) straight into recv. */
mt_status_t mt_shm_reduce_scatter(mt_shm_t *s, const void *send_, void *recv_, size_t count, mt_coll_dtype_t dtype,
                                  mt_redop_t op) {
    if (count == 0) {
        return MT_OK;
    }
    MT_CHECK(mt_shm_begin(s, "reduce_scatter", K_REDUCE_SCATTER, count, dtype, (int)op, -1));
    const char *send = send_;
    char *recv = recv_;
    const size_t es = mt_coll_dtype_size(dtype), bytes = count * es;
    const int me = s->rank, n = s->n;
    const size_t per_block = s->chunk / (size_t)n / es * es; /* >= es: chunk >= 4 KiB, n <= 64, es <= 8 */
    const void *in[MT_SHM_MAX_RANKS];
    for (size_t off = 0; off < bytes; off += per_block) {
        size_t len = bytes - off < per_block ? bytes - off : per_block;
        char *my_in = shm_area(s, me, s->round, SHM_IN);
        const char *own = send + (size_t)me * bytes + off;
        bool own_aliases = overlaps(own, len, recv + off, len);
        for (int p = 0; p < n; p++) {
            if (p != me || own_aliases) {
                copy(my_in + (size_t)p * per_block, send + (size_t)p * bytes + off, len);
            }
        }
        MT_CHECK(mt_shm_sync(s, off == 0));
        for (int r = 0; r < n; r++) {
            const char *slot = shm_area(s, r, s->round, SHM_IN) + (size_t)me * per_block;
            in[r] = (r == me && !own_aliases) ? (const void *)own : (const void *)slot;
        }
        mt_shm_reduce_kernel(recv + off, in, n, len / es, dtype, op, n);
        s->round++;
    }
    return MT_OK;
}

/* Round k: each rank publishes elements [off, off+m) of its input, syncs, copies every rank's into recv. */
mt_status_t mt_shm_all_gather(mt_shm_t *s, const void *send_, void *recv_, size_t count, mt_coll_dtype_t dtype) {
    if (count == 0) {
        return MT_OK;
    }
    MT_CHECK(mt_shm_begin(s, "all_gather", K_ALL_GATHER, count, dtype, 0, -1));
    const char *send = send_;
    char *recv = recv_;
    const size_t es = mt_coll_dtype_size(dtype), bytes = count * es, per_round = s->chunk / es * es;
    for (size_t off = 0; off < bytes; off += per_round) {
        size_t len = bytes - off < per_round ? bytes - off : per_round;
        copy(shm_area(s, s->rank, s->round, SHM_IN), send + off, len);
        MT_CHECK(mt_shm_sync(s, off == 0));
        for (int p = 0; p < s->n; p++) {
            /* in place with send == recv + rank*count: our own block is already there */
            copy(recv + (size_t)p * bytes + off, shm_area(s, p, s->round, SHM_IN), len);
        }
        s->round++;
    }
    return MT_OK;
}

/* Round k: root publishes elements [off, off+m), syncs, the others copy them out. */
mt_status_t mt_shm_broadcast(mt_shm_t *s, const void *send_, void *recv_, size_t count, mt_coll_dtype_t dtype,
                             int root) {
    if (count == 0) {
        return MT_OK;
    }
    MT_CHECK(mt_shm_begin(s, "broadcast", K_BROADCAST, count, dtype, 0, root));
    const char *send = send_;
    char *recv = recv_;
    const size_t es = mt_coll_dtype_size(dtype), bytes = count * es, per_round = s->chunk / es * es;
    for (size_t off = 0; off < bytes; off += per_round) {
        size_t len = bytes - off < per_round ? bytes - off : per_round;
        if (s->rank == root) {
            copy(shm_area(s, root, s->round, SHM_IN), send + off, len);
        }
        MT_CHECK(mt_shm_sync(s, off == 0));
        if (s->rank != root) {
            copy(recv + off, shm_area(s, root, s->round, SHM_IN), len);
        }
        s->round++;
    }
    if (s->rank == root && send != recv) {
        memmove(recv, send, bytes);
    }
    return MT_OK;
}

mt_status_t mt_shm_barrier(mt_shm_t *s) {
    MT_CHECK(mt_shm_begin(s, "barrier", K_BARRIER, 0, MT_COLL_U8, 0, -1));
    return mt_shm_sync(s, true);
}
