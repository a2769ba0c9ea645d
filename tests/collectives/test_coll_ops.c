/* Every collective x dtype x reduction x in-place/out-of-place x counts (0, 1, odd, larger) against
 * values computed locally, on the world communicator and on sub-groups of every size below it (made
 * from rank lists in a scrambled order, and 1-rank groups), plus point-to-point, groups, barrier,
 * sequence numbers and bad-argument errors. Run with 1-4 ranks.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "coll_testlib.h"
#include "runtime/alloc.h"
#include "runtime/rt.h"
#include "testutil.h"

static const size_t counts[] = {0, 1, 7, 129};

/* Buffers with guard room: a call that writes past its extent is caught by the guard check. */
#define GUARD 64
static unsigned char *buf_a, *buf_b;
static size_t buf_bytes;

static void fill_guard(unsigned char *p, size_t used) {
    memset(p + used, 0xA5, GUARD);
}
static bool guard_ok(const unsigned char *p, size_t used) {
    for (size_t i = 0; i < GUARD; i++) {
        if (p[used + i] != 0xA5) {
            return false;
        }
    }
    return true;
}

static int n_wrong(const void *buf, mt_coll_dtype_t d, size_t off, size_t count, double (*want)(size_t, void *),
                   void *arg, size_t *first) {
    int wrong = 0;
    for (size_t i = 0; i < count; i++) {
        if (mt_coll_elem_get(buf, d, off + i) != want(i, arg)) {
            if (!wrong) {
                *first = i;
            }
            wrong++;
        }
    }
    return wrong;
}

struct want_arg {
    int n, rank, root;
    size_t count;
    mt_coll_dtype_t d;
    mt_redop_t op;
    size_t base;
};

static double want_reduce(size_t i, void *a) {
    struct want_arg *w = a;
    return tl_expect(w->n, w->base + i, w->d, w->op);
}

static void test_all_reduce(mt_comm_t c) {
    int n = mt_comm_size(c), r = mt_comm_rank(c);
    for (int d = 0; d < MT_COLL_DTYPE_COUNT; d++) {
        for (int op = 0; op < MT_REDOP_COUNT; op++) {
            for (size_t k = 0; k < MT_ARRAY_LEN(counts); k++) {
                for (int inplace = 0; inplace < 2; inplace++) {
                    size_t cnt = counts[k], es = mt_coll_dtype_size(d), bytes = cnt * es;
                    void *send = buf_a, *recv = inplace ? buf_a : buf_b;
                    for (size_t i = 0; i < cnt; i++) {
                        mt_coll_elem_set(send, d, i, tl_val(r, i, d, op));
                    }
                    fill_guard(buf_a, bytes);
                    fill_guard(buf_b, bytes);
                    uint64_t s0 = mt_comm_seq_issued(c);
                    CHECK_OK(mt_coll_all_reduce(c, send, recv, cnt, d, op, NULL, NULL));
                    CHECK(mt_comm_seq_issued(c) == s0 + 1 && mt_comm_seq_completed(c) == s0 + 1, "seq %llu -> %llu",
                          (unsigned long long)s0, (unsigned long long)mt_comm_seq_issued(c));
                    struct want_arg w = {n, r, 0, cnt, d, op, 0};
                    size_t first = 0;
                    int bad = n_wrong(recv, d, 0, cnt, want_reduce, &w, &first);
                    CHECK(bad == 0,
                          "all_reduce %s %s count %zu %s on %s (%d ranks): %d wrong, first [%zu] = %g want %g",
                          mt_coll_dtype_name(d), mt_redop_name(op), cnt, inplace ? "in-place" : "out-of-place",
                          mt_comm_name(c), n, bad, first, bad ? mt_coll_elem_get(recv, d, first) : 0.0,
                          bad ? want_reduce(first, &w) : 0.0);
                    CHECK(guard_ok(buf_a, bytes) && guard_ok(buf_b, bytes), "all_reduce wrote past its buffer");
                }
            }
        }
    }
}

static void test_reduce_scatter(mt_comm_t c) {
    int n = mt_comm_size(c), r = mt_comm_rank(c);
    for (int d = 0; d < MT_COLL_DTYPE_COUNT; d++) {
        for (int op = 0; op < MT_REDOP_COUNT; op++) {
            for (size_t k = 0; k < MT_ARRAY_LEN(counts); k++) {
                /* 0: out of place; 1: recv == send + r*count; 2: recv == send */
                for (int mode = 0; mode < 3; mode++) {
                    size_t cnt = counts[k], es = mt_coll_dtype_size(d), bytes = cnt * es;
                    for (size_t i = 0; i < cnt * (size_t)n; i++) {
                        mt_coll_elem_set(buf_a, d, i, tl_val(r, i, d, op));
                    }
                    fill_guard(buf_a, bytes * (size_t)n);
                    fill_guard(buf_b, bytes);
                    void *recv = mode == 0 ? (void *)buf_b : mode == 1 ? (void *)(buf_a + bytes * (size_t)r) : buf_a;
                    CHECK_OK(mt_coll_reduce_scatter(c, buf_a, recv, cnt, d, op, NULL, NULL));
                    struct want_arg w = {n, r, 0, cnt, d, op, cnt * (size_t)r};
                    size_t first = 0;
                    int bad = n_wrong(recv, d, 0, cnt, want_reduce, &w, &first);
                    CHECK(bad == 0, "reduce_scatter %s %s count %zu mode %d on %s (%d ranks): %d wrong, first [%zu]",
                          mt_coll_dtype_name(d), mt_redop_name(op), cnt, mode, mt_comm_name(c), n, bad, first);
                    CHECK(guard_ok(buf_a, bytes * (size_t)n) && guard_ok(buf_b, bytes),
                          "reduce_scatter wrote past its buffer");
                }
            }
        }
    }
}

static double want_gather(size_t i, void *a) {
    struct want_arg *w = a;
    return tl_val((int)(i / w->count), i % w->count, w->d, MT_REDOP_SUM);
}

static void test_all_gather(mt_comm_t c) {
    int n = mt_comm_size(c), r = mt_comm_rank(c);
    for (int d = 0; d < MT_COLL_DTYPE_COUNT; d++) {
        for (size_t k = 0; k < MT_ARRAY_LEN(counts); k++) {
            /* 0: out of place; 1: send == recv + r*count; 2: send == recv */
            for (int mode = 0; mode < 3; mode++) {
                size_t cnt = counts[k], es = mt_coll_dtype_size(d), bytes = cnt * es;
                unsigned char *recv = buf_b;
                unsigned char *send = mode == 0 ? buf_a : mode == 1 ? buf_b + bytes * (size_t)r : buf_b;
                memset(buf_b, 0x5a, bytes * (size_t)n);
                for (size_t i = 0; i < cnt; i++) {
                    mt_coll_elem_set(send, d, i, tl_val(r, i, d, MT_REDOP_SUM));
                }
                fill_guard(buf_b, bytes * (size_t)n);
                CHECK_OK(mt_coll_all_gather(c, send, recv, cnt, d, NULL, NULL));
                struct want_arg w = {n, r, 0, cnt, d, MT_REDOP_SUM, 0};
                size_t first = 0;
                int bad = cnt ? n_wrong(recv, d, 0, cnt * (size_t)n, want_gather, &w, &first) : 0;
                CHECK(bad == 0, "all_gather %s count %zu mode %d on %s (%d ranks): %d wrong, first [%zu]",
                      mt_coll_dtype_name(d), cnt, mode, mt_comm_name(c), n, bad, first);
                CHECK(guard_ok(buf_b, bytes * (size_t)n), "all_gather wrote past its buffer");
            }
        }
    }
}

static double want_bcast(size_t i, void *a) {
    struct want_arg *w = a;
    return tl_val(w->root, i, w->d, MT_REDOP_SUM);
}

static void test_broadcast_reduce(mt_comm_t c) {
    int n = mt_comm_size(c), r = mt_comm_rank(c);
    int roots[2] = {0, n - 1};
    for (int d = 0; d < MT_COLL_DTYPE_COUNT; d++) {
        for (size_t k = 0; k < MT_ARRAY_LEN(counts); k++) {
            for (int ri = 0; ri < 2; ri++) {
                for (int inplace = 0; inplace < 2; inplace++) {
                    size_t cnt = counts[k], bytes = cnt * mt_coll_dtype_size(d);
                    int root = roots[ri];
                    void *send = buf_a, *recv = inplace ? buf_a : buf_b;
                    memset(buf_b, 0, bytes);
                    for (size_t i = 0; i < cnt; i++) {
                        mt_coll_elem_set(send, d, i, r == root ? tl_val(root, i, d, MT_REDOP_SUM) : 99.0);
                    }
                    fill_guard(buf_b, bytes);
                    CHECK_OK(mt_coll_broadcast(c, send, recv, cnt, d, root, NULL, NULL));
                    struct want_arg w = {n, r, root, cnt, d, MT_REDOP_SUM, 0};
                    size_t first = 0;
                    int bad = n_wrong(recv, d, 0, cnt, want_bcast, &w, &first);
                    CHECK(bad == 0, "broadcast %s count %zu root %d %s on %s: %d wrong, first [%zu]",
                          mt_coll_dtype_name(d), cnt, root, inplace ? "in-place" : "out-of-place", mt_comm_name(c), bad,
                          first);
                    CHECK(guard_ok(buf_b, bytes), "broadcast wrote past its buffer");
                }
            }
            for (int op = 0; op < MT_REDOP_COUNT; op++) {
                for (int inplace = 0; inplace < 2; inplace++) {
                    size_t cnt = counts[k], bytes = cnt * mt_coll_dtype_size(d);
                    int root = roots[(op + inplace) % 2];
                    void *send = buf_a, *recv = inplace ? buf_a : buf_b;
                    for (size_t i = 0; i < cnt; i++) {
                        mt_coll_elem_set(send, d, i, tl_val(r, i, d, op));
                    }
                    memset(buf_b, 0x33, bytes);
                    fill_guard(buf_b, bytes);
                    /* non-roots pass recv = NULL out of place: it must not be touched */
                    void *rarg = (r != root && !inplace) ? NULL : recv;
                    CHECK_OK(mt_coll_reduce(c, send, rarg, cnt, d, op, root, NULL, NULL));
                    if (r == root) {
                        struct want_arg w = {n, r, root, cnt, d, op, 0};
                        size_t first = 0;
                        int bad = n_wrong(recv, d, 0, cnt, want_reduce, &w, &first);
                        CHECK(bad == 0, "reduce %s %s count %zu root %d %s on %s: %d wrong, first [%zu]",
                              mt_coll_dtype_name(d), mt_redop_name(op), cnt, root,
                              inplace ? "in-place" : "out-of-place", mt_comm_name(c), bad, first);
                    }
                    CHECK(guard_ok(buf_b, bytes), "reduce wrote past its buffer");
                }
            }
        }
    }
}

/* all-to-all: element j of the block rank s sends to rank t is a2a(s, t, j). */
static double a2a_val(int s, int t, size_t j) {
    return (double)((s * 7 + t * 3 + (int)j) % 13);
}

static void test_all_to_all(mt_comm_t c) {
    int n = mt_comm_size(c), r = mt_comm_rank(c);
    for (int d = 0; d < MT_COLL_DTYPE_COUNT; d++) {
        for (size_t k = 0; k < MT_ARRAY_LEN(counts); k++) {
            for (int inplace = 0; inplace < 2; inplace++) {
                size_t cnt = counts[k], bytes = cnt * mt_coll_dtype_size(d) * (size_t)n;
                void *send = buf_a, *recv = inplace ? buf_a : buf_b;
                for (int t = 0; t < n; t++) {
                    for (size_t j = 0; j < cnt; j++) {
                        mt_coll_elem_set(send, d, (size_t)t * cnt + j, a2a_val(r, t, j));
                    }
                }
                fill_guard(buf_a, bytes);
                fill_guard(buf_b, bytes);
                CHECK_OK(mt_coll_all_to_all(c, send, recv, cnt, d, NULL, NULL));
                int bad = 0;
                for (int s = 0; s < n; s++) {
                    for (size_t j = 0; j < cnt; j++) {
                        bad += mt_coll_elem_get(recv, d, (size_t)s * cnt + j) != a2a_val(s, r, j);
                    }
                }
                CHECK(bad == 0, "all_to_all %s count %zu %s on %s (%d ranks): %d wrong", mt_coll_dtype_name(d), cnt,
                      inplace ? "in-place" : "out-of-place", mt_comm_name(c), n, bad);
                CHECK(guard_ok(buf_a, bytes) && guard_ok(buf_b, bytes), "all_to_all wrote past its buffer");
            }
        }
    }
}

static void test_p2p(mt_comm_t c) {
    int n = mt_comm_size(c), r = mt_comm_rank(c);
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    /* A ring exchange plus a message to self in one group: deadlock-free only because it is batched. */
    for (size_t k = 0; k < MT_ARRAY_LEN(counts); k++) {
        size_t cnt = counts[k];
        int32_t *out = (int32_t *)buf_a, *in = (int32_t *)buf_b, *self_out = out + 256, *self_in = in + 256;
        for (size_t i = 0; i < cnt; i++) {
            out[i] = r * 1000 + (int)i;
            self_out[i] = -r * 1000 - (int)i;
            in[i] = self_in[i] = 0x7fffffff;
        }
        uint64_t s0 = mt_comm_seq_issued(c);
        CHECK_OK(mt_coll_group_start(c));
        CHECK_OK(mt_coll_send(c, out, cnt, MT_COLL_I32, next, NULL, NULL));
        CHECK_OK(mt_coll_recv(c, in, cnt, MT_COLL_I32, prev, NULL, NULL));
        CHECK_OK(mt_coll_send(c, self_out, cnt, MT_COLL_I32, r, NULL, NULL));
        CHECK_OK(mt_coll_recv(c, self_in, cnt, MT_COLL_I32, r, NULL, NULL));
        CHECK_OK(mt_coll_group_end(c, NULL, NULL));
        CHECK(mt_comm_seq_issued(c) == s0 + 1, "a group is one call");
        int bad = 0;
        for (size_t i = 0; i < cnt; i++) {
            bad += in[i] != prev * 1000 + (int)i;
            bad += self_in[i] != -r * 1000 - (int)i;
        }
        CHECK(bad == 0, "group ring exchange count %zu on %s: %d wrong", cnt, mt_comm_name(c), bad);
    }
    /* Outside a group: rank 0 sends, rank 1 receives, two messages that must arrive in order. */
    if (n >= 2 && r < 2) {
        double a[3] = {1.5, 2.5, 3.5}, b[3] = {0, 0, 0}, b2[3] = {0, 0, 0};
        if (r == 0) {
            CHECK_OK(mt_coll_send(c, a, 3, MT_COLL_F64, 1, NULL, NULL));
            a[0] = 9.5;
            CHECK_OK(mt_coll_send(c, a, 1, MT_COLL_F64, 1, NULL, NULL));
        } else {
            CHECK_OK(mt_coll_recv(c, b, 3, MT_COLL_F64, 0, NULL, NULL));
            CHECK_OK(mt_coll_recv(c, b2, 1, MT_COLL_F64, 0, NULL, NULL));
            CHECK(b[0] == 1.5 && b[1] == 2.5 && b[2] == 3.5 && b2[0] == 9.5, "p2p got %g %g %g then %g", b[0], b[1],
                  b[2], b2[0]);
        }
    }
    CHECK(mt_coll_send(c, buf_a, 1, MT_COLL_F32, r, NULL, NULL) == MT_ERR_INVALID_USAGE,
          "send to self outside a group is refused (it could never complete)");
    CHECK_OK(mt_coll_barrier(c, NULL, NULL));
}

static void test_bad_args(mt_comm_t c) {
    int n = mt_comm_size(c);
    CHECK(mt_coll_all_reduce(c, buf_a, buf_b, 4, (mt_coll_dtype_t)99, MT_REDOP_SUM, NULL, NULL) == MT_ERR_INVALID_ARG,
          "bad dtype");
    CHECK(strstr(mt_last_error_msg(), "dtype") != NULL, "message names the dtype: %s", mt_last_error_msg());
    CHECK(mt_coll_all_reduce(c, buf_a, buf_b, 4, MT_COLL_F32, (mt_redop_t)9, NULL, NULL) == MT_ERR_INVALID_ARG,
          "bad op");
    CHECK(mt_coll_all_reduce(c, NULL, buf_b, 4, MT_COLL_F32, MT_REDOP_SUM, NULL, NULL) == MT_ERR_INVALID_ARG,
          "NULL send");
    CHECK(mt_coll_all_reduce(c, buf_a, buf_a + 4, 4, MT_COLL_F32, MT_REDOP_SUM, NULL, NULL) == MT_ERR_INVALID_ARG,
          "overlapping buffers");
    CHECK(mt_coll_broadcast(c, buf_a, buf_b, 4, MT_COLL_F32, n, NULL, NULL) == MT_ERR_INVALID_ARG, "root == size");
    CHECK(mt_coll_recv(c, buf_b, 4, MT_COLL_F32, -1, NULL, NULL) == MT_ERR_INVALID_ARG, "peer -1");
    CHECK_OK(mt_coll_group_start(c));
    CHECK(mt_coll_group_start(c) == MT_ERR_INVALID_USAGE, "nested group");
    CHECK(mt_coll_all_reduce(c, buf_a, buf_b, 4, MT_COLL_F32, MT_REDOP_SUM, NULL, NULL) == MT_ERR_INVALID_USAGE,
          "collective inside a group");
    mt_work_t w = NULL;
    CHECK(mt_coll_send(c, buf_a, 1, MT_COLL_F32, 0, NULL, &w) == MT_ERR_INVALID_USAGE, "work inside a group");
    CHECK_OK(mt_coll_group_end(c, NULL, NULL)); /* empty group: a valid no-op call */
    CHECK(mt_coll_group_end(c, NULL, NULL) == MT_ERR_INVALID_USAGE, "group_end without start");
}

static void run_all(mt_comm_t c) {
    test_all_reduce(c);
    test_reduce_scatter(c);
    test_all_gather(c);
    test_broadcast_reduce(c);
    test_all_to_all(c);
    test_p2p(c);
    test_bad_args(c);
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    const mt_world_t *w = mt_rt_world();
    buf_bytes = 4 * 129 * 8 * 4 + GUARD;
    buf_a = mt_alloc(buf_bytes + GUARD, MT_MEM_COMM, "test");
    buf_b = mt_alloc(buf_bytes + GUARD, MT_MEM_COMM, "test");

    /* The world: a group of w->size ranks, backend by priority (self for 1 rank, shm otherwise). */
    mt_comm_params_t p = MT_COMM_PARAMS_INIT;
    p.name = "world";
    mt_comm_t world = NULL;
    CHECK_OK(mt_comm_init(w->comm, &p, &world));
    CHECK(mt_comm_size(world) == w->size && mt_comm_rank(world) == w->rank, "world comm %d/%d", mt_comm_rank(world),
          mt_comm_size(world));
    /* MESHTRAIN_COLL_BACKEND (set by the *_forced tests) overrides the choice by priority */
    const char *forced = getenv("MESHTRAIN_COLL_BACKEND");
    const char *want_backend = forced && *forced ? forced : (w->size == 1 ? "self" : "shm");
    CHECK(!strcmp(mt_comm_backend_name(world), want_backend), "backend %s, want %s", mt_comm_backend_name(world),
          want_backend);
    run_all(world);

    /* The MPI backend forced on the world too (1 rank: its own local path). */
    if (w->size == 1) {
        p.backend = "mpi";
        p.name = "world-mpi";
        mt_comm_t wm = NULL;
        CHECK_OK(mt_comm_init(w->comm, &p, &wm));
        CHECK(wm && !strcmp(mt_comm_backend_name(wm), "mpi"), "forced mpi");
        if (wm) {
            run_all(wm);
        }
        CHECK_OK(mt_comm_free(wm));
        p.backend = NULL;
    }

    /* Sub-groups of every smaller size, ranks listed in reverse so group rank != world rank:
     * group k = the last k world ranks, reversed; only members call. */
    for (int k = 1; k < w->size; k++) {
        int ranks[8];
        for (int i = 0; i < k; i++) {
            ranks[i] = w->size - 1 - i;
        }
        if (w->rank < w->size - k) {
            continue;
        }
        char name[32];
        snprintf(name, sizeof(name), "last%d", k);
        p.name = name;
        mt_comm_t g = NULL;
        CHECK_OK(mt_comm_init_ranks(w->comm, ranks, k, &p, &g));
        if (!g) {
            continue;
        }
        CHECK(mt_comm_size(g) == k && mt_comm_rank(g) == w->size - 1 - w->rank, "group %s: rank %d of %d", name,
              mt_comm_rank(g), mt_comm_size(g));
        CHECK(mt_comm_parent_rank(g, mt_comm_rank(g)) == w->rank, "parent rank");
        run_all(g);
        CHECK_OK(mt_comm_free(g));
    }

    /* Creation errors: not a member, duplicates, out of range, unknown forced backend. */
    int bad_ranks[2] = {0, 0};
    mt_comm_t g = NULL;
    CHECK(mt_comm_init_ranks(w->comm, bad_ranks, 2, NULL, &g) == MT_ERR_INVALID_ARG && !g, "duplicate ranks");
    int outside[1] = {w->size};
    CHECK(mt_comm_init_ranks(w->comm, outside, 1, NULL, &g) == MT_ERR_INVALID_ARG, "rank out of range");
    if (w->size > 1) {
        int other[1] = {(w->rank + 1) % w->size};
        CHECK(mt_comm_init_ranks(w->comm, other, 1, NULL, &g) == MT_ERR_INVALID_ARG, "non-member");
    }
    mt_comm_params_t bad = MT_COMM_PARAMS_INIT;
    bad.backend = "carrier-pigeon";
    CHECK(mt_comm_init(w->comm, &bad, &g) == MT_ERR_INVALID_ARG && !g, "unknown backend");
    CHECK(strstr(mt_last_error_msg(), "carrier-pigeon") != NULL, "message names it: %s", mt_last_error_msg());
    bad.backend = "self";
    if (w->size > 1) {
        CHECK(mt_comm_init(w->comm, &bad, &g) == MT_ERR_INVALID_USAGE, "self forced on %d ranks", w->size);
    }
    bad.backend = NULL;
    bad.memory = MT_COMM_MEM_DEVICE;
    bad.name = "dev";
#if !MT_HAVE_NCCL
    CHECK(mt_comm_init(w->comm, &bad, &g) == MT_ERR_INVALID_USAGE, "device memory without NCCL");
#endif

    CHECK_OK(mt_comm_free(world));
    mt_free(buf_a);
    mt_free(buf_b);
    return mt_test_finish_mpi("test_coll_ops");
}
