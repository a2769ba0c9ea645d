/* The shared-memory segment of a node-local group: created once per communicator, shared without a
 * lasting name (memfd passed through /proc/<pid>/fd, or shm_open unlinked as soon as all have mapped
 * it) so a killed job leaves nothing in /dev/shm; and the step synchronisation the algorithms use:
 * per-rank counters in the segment, spin briefly, then yield, then futex-sleep, every wait bounded by
 * the comm's timeout and watching for dead or failed peers.
 * SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "collectives/shm_impl.h"
#include "runtime/alloc.h"

#define PAGE 4096u

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Polls (pause + load) per microsecond, measured once per process (best of 3 short runs). */
static double polls_per_us(void) {
    static double rate;
    if (rate == 0) {
        _Atomic uint32_t x = 0;
        double best = 0;
        for (int k = 0; k < 3; k++) {
            double t0 = mt_now();
            for (int i = 0; i < 4096; i++) {
                cpu_relax();
                (void)atomic_load_explicit(&x, memory_order_acquire);
            }
            double r = 4096 / ((mt_now() - t0) * 1e6);
            best = r > best ? r : best;
        }
        rate = best > 0 ? best : 10;
    }
    return rate;
}

/* ---- sizing (pure: the planner calls these too) ----------------------------------------------------- */

static size_t header_bytes(void) { return round_up(sizeof(struct shm_header), PAGE); }

size_t mt_shm_chunk_bytes(size_t chunk_param, bool oversubscribed) {
    size_t chunk = chunk_param ? chunk_param : oversubscribed ? (2u << 20) : (512u << 10);
    return round_up(chunk < PAGE ? PAGE : chunk, PAGE);
}

size_t mt_shm_rank_bytes(int n, int rank, size_t chunk) {
    if (n < 2) {
        return 0;
    }
    return 4 * chunk + (rank == 0 ? header_bytes() : 0); /* each rank its slot; rank 0 the header too */
}

size_t mt_shm_ctx_bytes(void) { return mt_alloc_accounted(sizeof(struct mt_shm)); }

/* ---- creation -------------------------------------------------------------------------------------- */

struct seg_offer {
    int ok, err, pid, fd;
    char name[96];
};

/* Maps fd (bytes) or returns NULL with errno. */
static void *map_fd(int fd, size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* All ranks agree whether every one succeeded; on failure *first_err is the lowest rank's errno. */
static bool all_ok(MPI_Comm local, bool ok, int err, int *first_err) {
    int mine = ok ? INT_MAX : err ? err : EIO, worst = 0;
    MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MIN, local);
    *first_err = worst == INT_MAX ? 0 : worst;
    return worst == INT_MAX;
}

/* memfd_create on local rank 0; the peers open it through /proc/<pid>/fd/<fd> (same user, same node). */
static bool create_memfd(MPI_Comm local, int rank, const char *tag, size_t bytes, void **base, int *err) {
    struct seg_offer o = {0, 0, (int)getpid(), -1, ""};
    int fd = -1;
    if (rank == 0) {
        fd = (int)syscall(SYS_memfd_create, tag, 1u /* MFD_CLOEXEC */);
        if (fd >= 0 && ftruncate(fd, (off_t)bytes) != 0) {
            o.err = errno;
            close(fd);
            fd = -1;
        } else if (fd < 0) {
            o.err = errno;
        }
        o.ok = fd >= 0;
        o.fd = fd;
    }
    MPI_Bcast(&o, (int)sizeof(o), MPI_BYTE, 0, local);
    int my_err = o.err;
    void *p = NULL;
    if (o.ok) {
        if (rank != 0) {
            char path[64];
            snprintf(path, sizeof(path), "/proc/%d/fd/%d", o.pid, o.fd);
            fd = open(path, O_RDWR | O_CLOEXEC);
            my_err = fd < 0 ? errno : 0;
        }
        if (fd >= 0) {
            p = map_fd(fd, bytes);
            my_err = p ? 0 : errno;
        }
    }
    bool ok = all_ok(local, p != NULL, my_err, err); /* rank 0 keeps fd open until every peer has opened it */
    if (fd >= 0) {
        close(fd); /* the mappings keep the memory; the last munmap (or exit) frees it */
    }
    if (!ok && p) {
        munmap(p, bytes);
        p = NULL;
    }
    *base = p;
    return ok;
}

/* shm_open on local rank 0 with a unique name, unlinked once every rank has mapped it (or failed). */
static bool create_posix(MPI_Comm local, int rank, const char *tag, size_t bytes, void **base, int *err) {
    static _Atomic unsigned counter;
    struct seg_offer o = {0, 0, (int)getpid(), -1, ""};
    int fd = -1;
    if (rank == 0) {
        snprintf(o.name, sizeof(o.name), "/mt-shm-%d-%u-%.40s", o.pid, atomic_fetch_add(&counter, 1), tag);
        fd = shm_open(o.name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (fd >= 0 && ftruncate(fd, (off_t)bytes) != 0) {
            o.err = errno;
            close(fd);
            shm_unlink(o.name);
            fd = -1;
        } else if (fd < 0) {
            o.err = errno;
        }
        o.ok = fd >= 0;
    }
    MPI_Bcast(&o, (int)sizeof(o), MPI_BYTE, 0, local);
    int my_err = o.err;
    void *p = NULL;
    if (o.ok) {
        if (rank != 0) {
            fd = shm_open(o.name, O_RDWR | O_CLOEXEC, 0600);
            my_err = fd < 0 ? errno : 0;
        }
        if (fd >= 0) {
            p = map_fd(fd, bytes);
            my_err = p ? 0 : errno;
            close(fd);
        }
    }
    bool ok = all_ok(local, p != NULL, my_err, err);
    if (rank == 0 && o.ok) {
        shm_unlink(o.name); /* every rank has it mapped (or gave up): the name is no longer needed */
    }
    if (!ok && p) {
        munmap(p, bytes);
        p = NULL;
    }
    *base = p;
    return ok;
}

mt_status_t mt_shm_init(MPI_Comm local, const mt_shm_params_t *prm, mt_shm_t **out) {
    *out = NULL;
    int rank, n;
    MPI_Comm_rank(local, &rank);
    MPI_Comm_size(local, &n);
    const char *name = prm->name ? prm->name : "comm";
    if (n > MT_SHM_MAX_RANKS) {
        return mt_error(MT_ERR_INVALID_USAGE, "comm %s: %d ranks on one node exceed the %d a shared-memory segment "
                        "serves", name, n, MT_SHM_MAX_RANKS);
    }
    mt_shm_t *s = mt_calloc(sizeof(*s), MT_MEM_COMM, "coll_shm");
    int ok_alloc = s != NULL, all_alloc = 0;
    MPI_Allreduce(&ok_alloc, &all_alloc, 1, MPI_INT, MPI_MIN, local);
    if (!all_alloc) {
        mt_free(s);
        return mt_error(MT_ERR_OOM, "comm %s: out of memory for the shared-memory context", name);
    }
    snprintf(s->name, sizeof(s->name), "%s", name);
    s->rank = rank;
    s->n = n;
    for (int r = 0; r < n; r++) {
        s->group_ranks[r] = prm->group_ranks ? prm->group_ranks[r] : r;
    }
    /* More ranks than CPUs to run them (on any rank of the node): a spinning waiter would steal the time
     * of the rank it waits for, and every sync costs a trip through the scheduler, so sync less often. */
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
    int over = n > cpus, any_over = 0;
    MPI_Allreduce(&over, &any_over, 1, MPI_INT, MPI_MAX, local);
    unsigned long long chunk = mt_shm_chunk_bytes(prm->chunk_bytes, any_over);
    MPI_Bcast(&chunk, 1, MPI_UNSIGNED_LONG_LONG, 0, local); /* the layout is local rank 0's */
    s->chunk = (size_t)chunk;
    s->timeout_s = prm->timeout_s > 0 ? prm->timeout_s : 300.0;
    double spin_us = prm->spin_us < 0 ? (any_over ? 0.0 : 20.0) : prm->spin_us;
    s->spin_cur = s->spin_max = (uint32_t)MT_MIN(spin_us * polls_per_us(), 1e8);
    /* Yield rather than sleep: a woken sleeper waits for the scheduler, a yielding poller is always
     * runnable and gets its share (measured with an asynchronous all-reduce overlapping computation:
     * sleeping after 0 s made it finish after the computation most of the time, 2 ms rarely, 20 ms
     * never with 4 ranks on 2 CPUs) */
    s->yield_s = (prm->yield_us < 0 ? (any_over ? 20000.0 : 2000.0) : prm->yield_us) * 1e-6;
    s->seq_completed = prm->seq_completed;
    size_t hdr = header_bytes();
    size_t slot = 4 * s->chunk;
    s->bytes = hdr + (size_t)n * slot;

    char tag[64];
    snprintf(tag, sizeof(tag), "mt-shm-%s", name);
    for (char *c = tag; *c; c++) {
        if (*c == '/' || *c == ' ') {
            *c = '_';
        }
    }
    void *base = NULL;
    int err = 0;
    bool ok = false;
    if (prm->method != MT_SHM_METHOD_POSIX) {
        ok = create_memfd(local, rank, tag, s->bytes, &base, &err);
        s->method = MT_SHM_METHOD_MEMFD;
        if (!ok) {
            MT_INFO(MT_LOG_COLL, "comm %s: memfd shared through /proc failed (%s)%s", name, strerror(err),
                    prm->method == MT_SHM_METHOD_AUTO ? "; trying shm_open" : "");
        }
    }
    if (!ok && prm->method != MT_SHM_METHOD_MEMFD) {
        ok = create_posix(local, rank, tag, s->bytes, &base, &err);
        s->method = MT_SHM_METHOD_POSIX;
    }
    if (!ok) {
        mt_free(s);
        return mt_error(MT_ERR_SYSTEM, "comm %s: cannot create a %zu-byte shared-memory segment for %d local ranks: "
                        "%s (check /dev/shm space and limits, or set MESHTRAIN_COLL_ALGO=mpi)", name,
                        (size_t)0 + s->bytes, n, strerror(err));
    }
    s->hdr = base;
    s->slots = (char *)base + hdr;
    if (rank == 0) {
        s->hdr->n = (uint32_t)n;
        s->hdr->chunk = s->chunk;
        s->hdr->slot_bytes = slot;
        s->hdr->magic = MT_SHM_MAGIC;
    }
    s->hdr->ctrl[rank].pid = (int32_t)getpid();
    memset(s->slots + (size_t)rank * slot, 0, slot); /* fault our slot in now, not in the first call */
    MPI_Barrier(local);
    MT_ASSERT(s->hdr->magic == MT_SHM_MAGIC && s->hdr->slot_bytes == slot);
    s->accounted = mt_shm_rank_bytes(n, rank, s->chunk);
    mt_mem_account(MT_MEM_HOST, MT_MEM_COMM, (int64_t)s->accounted, s->hdr, "coll_shm");
    *out = s;
    return MT_OK;
}

void mt_shm_free(mt_shm_t *s) {
    if (!s) {
        return;
    }
    MT_TRACE(MT_LOG_COLL, "comm %s: shm local rank %d: waits satisfied at once %llu, spinning %llu, yielding %llu, "
             "after a futex sleep %llu; spin budget %u of %u polls", s->name, s->rank,
             (unsigned long long)s->stats[0], (unsigned long long)s->stats[1], (unsigned long long)s->stats[2],
             (unsigned long long)s->stats[3], s->spin_cur, s->spin_max);
    if (s->hdr) {
        mt_mem_account(MT_MEM_HOST, MT_MEM_COMM, -(int64_t)s->accounted, s->hdr, "coll_shm");
        munmap(s->hdr, s->bytes);
    }
    mt_free(s);
}

int mt_shm_rank(const mt_shm_t *s) { return s->rank; }
int mt_shm_size(const mt_shm_t *s) { return s->n; }
size_t mt_shm_bytes(const mt_shm_t *s) { return s->bytes; }
const char *mt_shm_method_name(const mt_shm_t *s) { return s->method == MT_SHM_METHOD_POSIX ? "posix" : "memfd"; }

/* ---- synchronisation ----------------------------------------------------------------------------- */

/* step counters wrap: a is at or past b when the signed distance is >= 0 */
static inline bool reached(uint32_t a, uint32_t b) { return (int32_t)(a - b) >= 0; }

static void futex_wake_all(_Atomic uint32_t *w) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static uint64_t call_seq(const mt_shm_t *s) {
    return s->seq_completed ? atomic_load_explicit(s->seq_completed, memory_order_relaxed) + 1 : s->call;
}

/* "comm tp: shm all_reduce (call 12, 4096 x f32) on local rank 0 (comm rank 2)" */
static void where(const mt_shm_t *s, char *buf, size_t len) {
    snprintf(buf, len, "comm %s: shm %s (call %llu, %zu x %s) on local rank %d (comm rank %d)", s->name,
             s->op_name ? s->op_name : "?", (unsigned long long)call_seq(s), s->op_count,
             mt_coll_dtype_name(s->op_dtype),
             s->rank, s->group_ranks[s->rank]);
}

mt_status_t mt_shm_fail(mt_shm_t *s, mt_status_t st) {
    if (!s->failed) {
        s->failed = true;
        atomic_store(&s->hdr->ctrl[s->rank].failed, 1u);
        futex_wake_all(&s->hdr->ctrl[s->rank].step);
    }
    return st;
}

static mt_status_t peer_error(mt_shm_t *s, int p, mt_status_t st, const char *what, double waited);

mt_status_t mt_shm_begin(mt_shm_t *s, const char *op_name, int kind, size_t count, mt_coll_dtype_t dtype, int op,
                         int root) {
    s->op_name = op_name;
    s->op_count = count;
    s->op_dtype = dtype;
    if (s->failed) {
        char w[256];
        where(s, w, sizeof(w));
        return mt_error(MT_ERR_REMOTE, "%s: the node's shared-memory group failed in an earlier call", w);
    }
    for (int p = 0; p < s->n; p++) {
        if (atomic_load_explicit(&s->hdr->ctrl[p].failed, memory_order_acquire)) {
            return peer_error(s, p, MT_ERR_REMOTE, "failed in an earlier call (see its own error)", 0.0);
        }
    }
    s->call++;
    struct shm_desc *d = &s->hdr->ctrl[s->rank].desc[s->call & 1];
    *d = (struct shm_desc){s->call, count, (uint32_t)kind, (uint32_t)dtype, (uint32_t)op, root};
    return MT_OK;
}

void mt_shm_arrive(mt_shm_t *s) {
    struct shm_ctrl *c = &s->hdr->ctrl[s->rank];
    s->step++;
    atomic_store_explicit(&c->step, s->step, memory_order_seq_cst);
    if (atomic_load_explicit(&c->waiters, memory_order_seq_cst) != 0) {
        futex_wake_all(&c->step);
    }
}

static mt_status_t peer_error(mt_shm_t *s, int p, mt_status_t st, const char *what, double waited) {
    char w[256];
    where(s, w, sizeof(w));
    mt_error(st, "%s: local rank %d (comm rank %d, pid %d) %s; waited %.3f s at sync step %u", w, p,
             s->group_ranks[p], (int)s->hdr->ctrl[p].pid, what, waited, s->step);
    return mt_shm_fail(s, st);
}

mt_status_t mt_shm_wait(mt_shm_t *s, int p) {
    struct shm_ctrl *c = &s->hdr->ctrl[p];
    const uint32_t want = s->step;
    if (reached(atomic_load_explicit(&c->step, memory_order_acquire), want)) {
        s->stats[0]++;
        return MT_OK;
    }
    /* 1. spin (only when every rank can have its own CPU). Adaptive: when the peer shares our CPU (other
     *    jobs' load can put both there) it cannot arrive while we spin, so the budget halves on every
     *    miss and doubles back on every hit. */
    for (uint32_t k = 0; k < s->spin_cur; k++) {
        cpu_relax();
        if (reached(atomic_load_explicit(&c->step, memory_order_acquire), want)) {
            s->spin_cur = MT_MIN(s->spin_max, 2 * s->spin_cur + 16);
            s->stats[1]++;
            return MT_OK;
        }
    }
    s->spin_cur /= 2;
    double t0 = mt_now(), now = t0;
    /* 2. yield: lets a peer sharing our CPU run, and keeps us on the run queue so we see its step
     *    within a time slice (a futex sleep costs a wake-up syscall, and the woken thread must then wait
     *    for the scheduler) */
    do {
        sched_yield();
        if (reached(atomic_load_explicit(&c->step, memory_order_acquire), want)) {
            s->stats[2]++;
            return MT_OK;
        }
        now = mt_now();
    } while (now - t0 < s->yield_s);
    /* 3. sleep on the peer's step word, waking every 2 ms to check the deadline and the peer */
    double last_check = mt_now();
    for (;;) {
        atomic_fetch_add_explicit(&c->waiters, 1, memory_order_seq_cst);
        uint32_t v = atomic_load_explicit(&c->step, memory_order_seq_cst);
        if (!reached(v, want)) {
            struct timespec ts = {0, 2000000};
            syscall(SYS_futex, (uint32_t *)&c->step, FUTEX_WAIT, v, &ts, NULL, 0);
        }
        atomic_fetch_sub_explicit(&c->waiters, 1, memory_order_relaxed);
        if (reached(atomic_load_explicit(&c->step, memory_order_acquire), want)) {
            s->stats[3]++;
            return MT_OK;
        }
        now = mt_now();
        if (atomic_load_explicit(&c->failed, memory_order_acquire)) {
            return peer_error(s, p, MT_ERR_REMOTE, "failed (see its own error)", now - t0);
        }
        if (now - last_check > 0.05) {
            last_check = now;
            if (kill((pid_t)c->pid, 0) != 0 && errno == ESRCH) {
                return peer_error(s, p, MT_ERR_REMOTE, "has died (its process is gone)", now - t0);
            }
        }
        if (now - t0 > s->timeout_s) {
            return peer_error(s, p, MT_ERR_TIMEOUT, "did not arrive within the timeout (MESHTRAIN_SHM_TIMEOUT)",
                              now - t0);
        }
    }
}

static bool desc_equal(const struct shm_desc *a, const struct shm_desc *b) {
    return a->call == b->call && a->count == b->count && a->kind == b->kind && a->dtype == b->dtype &&
           a->op == b->op && a->root == b->root;
}

mt_status_t mt_shm_sync(mt_shm_t *s, bool check) {
    mt_shm_arrive(s);
    for (int i = 1; i < s->n; i++) {
        int p = (s->rank + i) % s->n;
        MT_CHECK(mt_shm_wait(s, p));
        if (check) {
            const struct shm_desc *mine = &s->hdr->ctrl[s->rank].desc[s->call & 1];
            const struct shm_desc *theirs = &s->hdr->ctrl[p].desc[s->call & 1];
            if (!desc_equal(mine, theirs)) {
                char w[256];
                where(s, w, sizeof(w));
                mt_error(MT_ERR_INVALID_USAGE, "%s: local rank %d (comm rank %d) issued a different call (#%llu: "
                         "kind %u, count %llu, dtype %s, op %u, root %d): every rank must issue the same "
                         "collectives in the same order", w, p, s->group_ranks[p], (unsigned long long)theirs->call,
                         theirs->kind, (unsigned long long)theirs->count,
                         mt_coll_dtype_name((mt_coll_dtype_t)theirs->dtype),
                         theirs->op, theirs->root);
                return mt_shm_fail(s, MT_ERR_INVALID_USAGE);
            }
        }
    }
    return MT_OK;
}
