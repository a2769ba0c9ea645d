/* Inside the shared-memory core: the segment's layout (a header with one control line per local rank,
 * then one slot per rank) and the step synchronisation shared by shm_seg.c and shm_algo.c.
 * SPDX-License-Identifier: MIT */
#ifndef MT_SHM_IMPL_H
#define MT_SHM_IMPL_H

#include <stdatomic.h>

#include "collectives/shm.h"

#define MT_SHM_MAGIC 0x6d7473686d763031ull /* "mtshmv01" */
#define MT_SHM_LINE 128                    /* control lines are two cache lines apart (adjacent-line prefetch) */

/* What a rank is doing, published so the peers can check they run the same call. */
struct shm_desc {
    uint64_t call; /* calls issued on the segment, this one included */
    uint64_t count;
    uint32_t kind, dtype, op;
    int32_t root;
};

/* One per local rank, written only by that rank (except waiters). step is the futex word. */
struct shm_ctrl {
    _Alignas(MT_SHM_LINE) _Atomic uint32_t step; /* the last sync step this rank has arrived at */
    _Atomic uint32_t waiters;                    /* ranks sleeping in futex(step) */
    _Atomic uint32_t failed;                     /* != 0: this rank hit an error; peers stop waiting */
    int32_t pid;
    struct shm_desc desc[2]; /* by call parity: a peer may still read the previous call's */
};

struct shm_header {
    _Alignas(MT_SHM_LINE) uint64_t magic;
    uint32_t n;
    uint32_t reserved;
    uint64_t chunk, slot_bytes;
    struct shm_ctrl ctrl[MT_SHM_MAX_RANKS];
};

/* Slot of rank r: two pipeline buffers (by round parity), each an input area and an output area of
 * chunk bytes:  | b0.in | b0.out | b1.in | b1.out |. */
enum { SHM_IN = 0, SHM_OUT = 1 };

struct mt_shm {
    char name[64];
    int rank, n;
    int group_ranks[MT_SHM_MAX_RANKS]; /* local rank -> comm rank, for messages */
    struct shm_header *hdr;
    char *slots;
    size_t bytes, chunk, accounted;
    mt_shm_method_t method;
    double timeout_s, yield_s;
    /* spin budget in polls (a poll is one pause + one load; calibrated at init, clock reads cost ~250 ns
     * on these VMs): adaptive, halves when the spin did not see the peer arrive, doubles when it did */
    uint32_t spin_max, spin_cur;
    uint64_t stats[4]; /* waits satisfied at once, while spinning, while yielding, after sleeping */
    const _Atomic uint64_t *seq_completed;

    uint32_t step;  /* sync steps taken (the same on every rank) */
    uint64_t round; /* pipeline rounds taken: buffer = round & 1 */
    uint64_t call;  /* calls issued */
    bool failed;
    /* the running call, for messages */
    const char *op_name;
    size_t op_count;
    mt_coll_dtype_t op_dtype;
};

static inline char *shm_area(const mt_shm_t *s, int r, uint64_t round, int area) {
    return s->slots + (size_t)r * s->hdr->slot_bytes + (size_t)(round & 1) * 2 * s->chunk + (size_t)area * s->chunk;
}

/* Starts a call: fails at once if the segment failed earlier, publishes the descriptor. */
mt_status_t mt_shm_begin(mt_shm_t *s, const char *op_name, int kind, size_t count, mt_coll_dtype_t dtype, int op,
                         int root);
/* Publishes arrival at the next step (release) and wakes sleepers. */
void mt_shm_arrive(mt_shm_t *s);
/* Waits (acquire) until local rank p has arrived at the current step: spin, yield, then futex sleep,
 * watching the deadline, the peer's failed flag and whether its process still exists. */
mt_status_t mt_shm_wait(mt_shm_t *s, int p);
/* arrive + wait for every peer; check: also compare the peers' call descriptors with ours. */
mt_status_t mt_shm_sync(mt_shm_t *s, bool check);
/* Marks the segment failed (ours and, for the peers, our control line) and returns st. */
mt_status_t mt_shm_fail(mt_shm_t *s, mt_status_t st);

#endif /* MT_SHM_IMPL_H */
