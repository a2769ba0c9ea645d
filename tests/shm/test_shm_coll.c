/* The shared-memory collectives against the MPI path: every op x dtype x reduction x in-place form x
 * size (0 to a few MiB, plus a few tens-of-MiB cases) on the world and on groups that are not the whole
 * node (scrambled rank lists: the odd ranks + 0, and 2 ranks of a 4-rank job), each call run on a comm
 * forced to the mpi backend and on one forced to shm, both compared with a scalar reference. Which
 * results are bit-identical:
 *   - to the reference, always (the shm path reduces in rank order 0..n-1, independent of chunking);
 *   - to MPI: data movement (all_gather, broadcast), integers (but u8 sum/avg, see below), max/min
 *     always; every reduction of every type with 2 ranks. Otherwise within the rounding of a different
 *     summation order (f16/bf16: MPI rounds after every pairwise combine).
 * Also: asynchronous calls and sequence numbers, and (MESHTRAIN_SHM_FAKE_NODE_SIZE, argument
 * --expect-nodes N) the hierarchical multi-node path.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/shm.h"
#include "runtime/alloc.h"
#include "runtime/rt.h"
#include "shm_testlib.h"
#include "testutil.h"

enum { OP_AR, OP_RS, OP_AG, OP_BC, OP_RED, OP_N };
static const char *op_names[OP_N] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"};

#define GUARD 64
struct bufs {
    unsigned char *send, *recv_mpi, *recv_shm, *ref, *inputs;
    size_t cap;
};

static bool guard_ok(const unsigned char *p, size_t used) {
    for (size_t i = 0; i < GUARD; i++) {
        if (p[used + i] != 0xA5) {
            return false;
        }
    }
    return true;
}

static double eps_of(mt_coll_dtype_t d) {
    switch (d) {
    case MT_COLL_F16: return 1.0 / 1024;
    case MT_COLL_BF16: return 1.0 / 128;
    case MT_COLL_F32: return 1.2e-7;
    default: return 2.3e-16;
    }
}

static double getd(const void *b, mt_coll_dtype_t d, size_t i) {
    switch (d) {
    case MT_COLL_F32: return ((const float *)b)[i];
    case MT_COLL_F64: return ((const double *)b)[i];
    case MT_COLL_F16: return mt_f16_to_f32(((const uint16_t *)b)[i]);
    default: return mt_bf16_to_f32(((const uint16_t *)b)[i]);
    }
}

static bool is_float(mt_coll_dtype_t d) {
    return d == MT_COLL_F32 || d == MT_COLL_F64 || d == MT_COLL_F16 || d == MT_COLL_BF16;
}

/* Whether shm and MPI must agree bit for bit (see the file comment). u8 sum/avg: Open MPI 4.1's AVX
 * reduction saturates unsigned char sums for vector-length counts while its scalar loop wraps
 * (open-mpi/ompi#8045, "wontfix"); the shm path wraps everywhere, as C and the reference do, so those
 * are checked against the reference only. */
static bool mpi_comparable(mt_coll_dtype_t d, mt_redop_t op) {
    return !(d == MT_COLL_U8 && (op == MT_REDOP_SUM || op == MT_REDOP_AVG));
}

static bool mpi_bitwise(int kind, mt_coll_dtype_t d, mt_redop_t op, int n) {
    if (kind == OP_AG || kind == OP_BC || !is_float(d) || n == 1) {
        return true;
    }
    if (op == MT_REDOP_MAX || op == MT_REDOP_MIN) {
        return true;
    }
    return n <= 2;
}

/* Runs one call with in-place form ip (0: out of place; 1, 2: the op's in-place forms) into recv. */
static mt_status_t run(mt_comm_t c, int kind, int ip, struct bufs *b, unsigned char *recv, size_t count,
                       mt_coll_dtype_t d, mt_redop_t op, int root, mt_work_t *work) {
    int n = mt_comm_size(c), r = mt_comm_rank(c);
    size_t es = mt_coll_dtype_size(d), bytes = count * es;
    switch (kind) {
    case OP_AR:
        if (ip) {
            memcpy(recv, b->send, bytes);
            return mt_coll_all_reduce(c, recv, recv, count, d, op, NULL, work);
        }
        return mt_coll_all_reduce(c, b->send, recv, count, d, op, NULL, work);
    case OP_RS:
        if (ip) {
            memcpy(recv, b->send, bytes * (size_t)n);
            return mt_coll_reduce_scatter(c, recv, ip == 1 ? recv + (size_t)r * bytes : recv, count, d, op, NULL, work);
        }
        return mt_coll_reduce_scatter(c, b->send, recv, count, d, op, NULL, work);
    case OP_AG:
        if (ip) {
            unsigned char *at = ip == 1 ? recv + (size_t)r * bytes : recv;
            memcpy(at, b->send, bytes);
            return mt_coll_all_gather(c, at, recv, count, d, NULL, work);
        }
        return mt_coll_all_gather(c, b->send, recv, count, d, NULL, work);
    case OP_BC:
        if (ip) {
            memcpy(recv, b->send, bytes);
            return mt_coll_broadcast(c, recv, recv, count, d, root, NULL, work);
        }
        return mt_coll_broadcast(c, b->send, recv, count, d, root, NULL, work);
    default:
        if (ip && r == root) {
            memcpy(recv, b->send, bytes);
            return mt_coll_reduce(c, recv, recv, count, d, op, root, NULL, work);
        }
        return mt_coll_reduce(c, b->send, recv, count, d, op, root, NULL, work);
    }
}

/* Expected result on this rank into b->ref (bytes returned), from every rank's input made locally. */
static size_t expected(int kind, struct bufs *b, size_t count, mt_coll_dtype_t d, mt_redop_t op, int n, int r, int root,
                       uint64_t seed) {
    size_t es = mt_coll_dtype_size(d), in_count = kind == OP_RS ? count * (size_t)n : count;
    const void *in[8];
    for (int p = 0; p < n; p++) {
        unsigned char *x = b->inputs + (size_t)p * in_count * es;
        tl_fill(x, d, op, p, seed, in_count);
        in[p] = x;
    }
    switch (kind) {
    case OP_AR: tl_reference(b->ref, in, n, count, d, op); return count * es;
    case OP_RED:
        if (r == root) {
            tl_reference(b->ref, in, n, count, d, op);
            return count * es;
        }
        return 0;
    case OP_RS: {
        const void *blk[8];
        for (int p = 0; p < n; p++) {
            blk[p] = (const unsigned char *)in[p] + (size_t)r * count * es;
        }
        tl_reference(b->ref, blk, n, count, d, op);
        return count * es;
    }
    case OP_AG:
        for (int p = 0; p < n; p++) {
            memcpy(b->ref + (size_t)p * count * es, in[p], count * es);
        }
        return (size_t)n * count * es;
    default: memcpy(b->ref, in[root], count * es); return count * es;
    }
}

static int n_cases, n_bitwise_mpi;
static bool g_single_node = true; /* the shm comm under test lies on one node (else: hierarchical / MPI) */

/* Elements of two float results further apart than the rounding of n terms of magnitude <= 4 (a
 * different summation order; f16/bf16 also rounded at every pairwise combine on the MPI side). */
static int n_far(const void *x, const void *y, mt_coll_dtype_t d, mt_redop_t op, int n, size_t count) {
    double tol = eps_of(d) * (op == MT_REDOP_PROD ? 4.0 : 8.0 * n) * (d == MT_COLL_F16 || d == MT_COLL_BF16 ? 2 : 1);
    int bad = 0;
    for (size_t i = 0; i < count; i++) {
        bad += !(fabs(getd(x, d, i) - getd(y, d, i)) <= tol);
    }
    return bad;
}

static void one_case(mt_comm_t cm, mt_comm_t cs, struct bufs *b, int kind, int ip, size_t count, mt_coll_dtype_t d,
                     mt_redop_t op, uint64_t seed) {
    int n = mt_comm_size(cs), r = mt_comm_rank(cs), root = (int)(seed % (uint64_t)n);
    size_t es = mt_coll_dtype_size(d);
    size_t recv_bytes = (kind == OP_AG || (kind == OP_RS && ip)) ? count * es * (size_t)n : count * es;
    tl_fill(b->send, d, op, r, seed, kind == OP_RS ? count * (size_t)n : count);
    memset(b->recv_mpi, 0x5a, recv_bytes);
    memset(b->recv_shm, 0x5a, recv_bytes);
    memset(b->recv_mpi + recv_bytes, 0xA5, GUARD);
    memset(b->recv_shm + recv_bytes, 0xA5, GUARD);
    mt_status_t sm = run(cm, kind, ip, b, b->recv_mpi, count, d, op, root, NULL);
    mt_status_t ss = run(cs, kind, ip, b, b->recv_shm, count, d, op, root, NULL);
    CHECK(sm == MT_OK && ss == MT_OK, "%s %s %s count %zu ip %d: mpi %s, shm %s (%s)", op_names[kind],
          mt_coll_dtype_name(d), mt_redop_name(op), count, ip, mt_status_str(sm), mt_status_str(ss),
          mt_last_error_msg());
    size_t want = expected(kind, b, count, d, op, n, r, root, seed);
    /* in-place reduce_scatter (form 1) leaves the result at block r */
    size_t at = (kind == OP_RS && ip == 1) ? (size_t)r * count * es : 0;
    n_cases++;
    CHECK(guard_ok(b->recv_shm, recv_bytes), "%s count %zu: shm wrote past recv", op_names[kind], count);
    bool movement = kind == OP_AG || kind == OP_BC;
    bool exact = movement || !is_float(d) || op == MT_REDOP_MAX || op == MT_REDOP_MIN;
    if (g_single_node) {
        CHECK(memcmp(b->recv_shm + at, b->ref, want) == 0, "%s %s %s n=%d count %zu ip %d: shm differs from the "
              "rank-order reference", op_names[kind], mt_coll_dtype_name(d), mt_redop_name(op), n, count, ip);
    } else if (movement || mpi_comparable(d, op)) {
        /* several nodes: MPI between node leaders (or for the whole op) sets the order */
        if (exact) {
            CHECK(memcmp(b->recv_shm + at, b->ref, want) == 0, "%s %s %s n=%d count %zu ip %d (multi-node): shm "
                  "differs from the reference", op_names[kind], mt_coll_dtype_name(d), mt_redop_name(op), n, count, ip);
        } else {
            int bad = n_far(b->recv_shm + at, b->ref, d, op, n, want / es);
            CHECK(bad == 0, "%s %s %s n=%d count %zu (multi-node): %d elements differ from the reference beyond "
                  "rounding", op_names[kind], mt_coll_dtype_name(d), mt_redop_name(op), n, count, bad);
        }
    }
    if (!movement && !mpi_comparable(d, op)) {
        return;
    }
    if (mpi_bitwise(kind, d, op, n) || (exact && !g_single_node)) {
        n_bitwise_mpi++;
        CHECK(memcmp(b->recv_shm + at, b->recv_mpi + at, want) == 0, "%s %s %s n=%d count %zu ip %d: shm and mpi "
              "differ where they must be bit-identical", op_names[kind], mt_coll_dtype_name(d), mt_redop_name(op), n,
              count,
              ip);
    } else {
        int bad = n_far(b->recv_shm + at, b->recv_mpi + at, d, op, n, want / es);
        CHECK(bad == 0, "%s %s %s n=%d count %zu: %d elements of shm and mpi differ beyond rounding", op_names[kind],
              mt_coll_dtype_name(d), mt_redop_name(op), n, count, bad);
    }
}

/* full: the whole matrix plus large messages (the world); else up to 9001 elements (sub-groups). */
static void test_all(mt_comm_t cm, mt_comm_t cs, struct bufs *b, bool full) {
    /* 0, tiny, odd, above the one-round size (32 KiB), several pipeline rounds of 256 KiB */
    const size_t counts[] = {0, 1, 7, 1000, 9001, 150001};
    uint64_t seed = 1;
    for (int kind = 0; kind < OP_N; kind++) {
        for (int d = 0; d < MT_COLL_DTYPE_COUNT; d++) {
            int n_ops = (kind == OP_AG || kind == OP_BC) ? 1 : MT_REDOP_COUNT;
            for (int op = 0; op < n_ops; op++) {
                for (size_t k = 0; k < MT_ARRAY_LEN(counts); k++) {
                    int n_ip = kind == OP_RS || kind == OP_AG ? 3 : 2;
                    /* keep the large counts to one in-place form and the common dtypes */
                    bool big_ok = d == MT_COLL_F32 || d == MT_COLL_BF16 || d == MT_COLL_I32;
                    if (counts[k] > 10000 && (!full || !big_ok)) {
                        continue;
                    }
                    for (int ip = 0; ip < n_ip; ip++) {
                        one_case(cm, cs, b, kind, ip, counts[k], (mt_coll_dtype_t)d, (mt_redop_t)op, seed++);
                    }
                }
            }
        }
    }
    if (!full) {
        return;
    }
    /* a few large messages: 24 MiB all-reduce, 8 MiB per rank reduce-scatter and all-gather, 16 MiB bcast */
    one_case(cm, cs, b, OP_AR, 1, 6u << 20, MT_COLL_F32, MT_REDOP_SUM, seed++);
    one_case(cm, cs, b, OP_AR, 0, 6u << 20, MT_COLL_BF16, MT_REDOP_AVG, seed++);
    one_case(cm, cs, b, OP_RS, 0, 2u << 20, MT_COLL_F32, MT_REDOP_SUM, seed++);
    one_case(cm, cs, b, OP_AG, 0, 2u << 20, MT_COLL_F32, MT_REDOP_SUM, seed++);
    one_case(cm, cs, b, OP_BC, 0, 4u << 20, MT_COLL_F32, MT_REDOP_SUM, seed++);
}

/* Asynchronous calls: queued in order, the same sequence numbers as on the mpi comm, same results. */
static void test_async(mt_comm_t cm, mt_comm_t cs, struct bufs *b) {
    size_t count = 70000;
    float *x[3];
    mt_work_t w[3];
    uint64_t s0 = mt_comm_seq_issued(cs), m0 = mt_comm_seq_issued(cm);
    for (int i = 0; i < 3; i++) {
        x[i] = mt_alloc(count * 4, MT_MEM_COMM, "test");
        for (size_t j = 0; j < count; j++) {
            x[i][j] = (float)((j + (size_t)i) % 13) * (float)(mt_comm_rank(cs) + 1);
        }
        CHECK_OK(mt_coll_all_reduce(cs, x[i], x[i], count, MT_COLL_F32, MT_REDOP_SUM, NULL, &w[i]));
        CHECK(mt_work_seq(w[i]) == s0 + 1 + (uint64_t)i, "async call %d has seq %llu, want %llu", i,
              (unsigned long long)mt_work_seq(w[i]), (unsigned long long)(s0 + 1 + (uint64_t)i));
    }
    for (int i = 2; i >= 0; i--) {
        CHECK_OK(mt_work_wait(w[i], -1));
        mt_work_free(w[i]);
    }
    CHECK(mt_comm_seq_completed(cs) == s0 + 3, "completed %llu after 3 async calls from %llu",
          (unsigned long long)mt_comm_seq_completed(cs), (unsigned long long)s0);
    int n = mt_comm_size(cs);
    for (int i = 0; i < 3; i++) {
        int bad = 0;
        for (size_t j = 0; j < count; j++) {
            bad += x[i][j] != (float)((j + (size_t)i) % 13) * (float)(n * (n + 1) / 2);
        }
        CHECK(bad == 0, "async all_reduce %d: %d wrong elements", i, bad);
        mt_free(x[i]);
    }
    /* the mpi comm numbers its calls the same way */
    CHECK_OK(mt_coll_barrier(cm, NULL, NULL));
    CHECK(mt_comm_seq_issued(cm) == m0 + 1, "mpi comm seq %llu", (unsigned long long)mt_comm_seq_issued(cm));
    (void)b;
}

static void test_group(MPI_Comm world, const int *ranks, int n, struct bufs *b, int expect_nodes, bool full) {
    mt_comm_params_t pm = MT_COMM_PARAMS_INIT, ps = MT_COMM_PARAMS_INIT;
    pm.name = "t-mpi";
    pm.backend = "mpi";
    ps.name = "t-shm";
    ps.backend = n > 1 ? "shm" : NULL;
    mt_comm_t cm = NULL, cs = NULL;
    CHECK_OK(n == 0 ? MT_OK : mt_comm_init_ranks(world, ranks, n, &pm, &cm));
    CHECK_OK(mt_comm_init_ranks(world, ranks, n, &ps, &cs));
    if (!cm || !cs) {
        return;
    }
    if (n > 1) {
        bool active = false;
        int nodes = 0, local = 0;
        CHECK_OK(mt_coll_shm_info(cs, &active, &nodes, &local));
        int max_local = 0;
        MPI_Allreduce(&local, &max_local, 1, MPI_INT, MPI_MAX, mt_comm_mpi(cs));
        CHECK(active == (max_local > 1), "shm backend %s on a %d-rank group with at most %d ranks on a node",
              active ? "active" : "inactive", n, max_local);
        g_single_node = nodes == 1;
        if (expect_nodes > 0 && n == mt_rt_world()->size) {
            CHECK(nodes == expect_nodes, "comm spans %d nodes, want %d", nodes, expect_nodes);
        }
    }
    test_all(cm, cs, b, full);
    g_single_node = true;
    if (n > 1) {
        test_async(cm, cs, b);
    }
    CHECK_OK(mt_comm_free(cs));
    CHECK_OK(mt_comm_free(cm));
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    const mt_world_t *w = mt_rt_world();
    int expect_nodes = 0;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--expect-nodes")) {
            expect_nodes = atoi(argv[i + 1]);
        }
    }
    struct bufs b;
    b.cap = (size_t)(24u << 20) * 1 + (size_t)w->size * (8u << 20) + 4096;
    b.send = mt_alloc(b.cap + GUARD, MT_MEM_COMM, "test");
    b.recv_mpi = mt_alloc(b.cap + GUARD, MT_MEM_COMM, "test");
    b.recv_shm = mt_alloc(b.cap + GUARD, MT_MEM_COMM, "test");
    b.ref = mt_alloc(b.cap + GUARD, MT_MEM_COMM, "test");
    b.inputs = mt_alloc(b.cap * (size_t)w->size + GUARD, MT_MEM_COMM, "test");

    /* the world, in order */
    int ranks[8];
    for (int i = 0; i < w->size; i++) {
        ranks[i] = i;
    }
    test_group(w->comm, ranks, w->size, &b, expect_nodes, true);
    /* a group that is not the whole node, in scrambled order: the odd ranks, reversed, plus rank 0 */
    if (w->size >= 3) {
        int g[8], n = 0;
        for (int i = w->size - 1; i >= 1; i -= 2) {
            g[n++] = i;
        }
        g[n++] = 0;
        bool member = false;
        for (int i = 0; i < n; i++) {
            member |= g[i] == w->rank;
        }
        if (member) {
            test_group(w->comm, g, n, &b, 0, false);
        }
    }
    /* 2 ranks of a 4+-rank job (ranks 1 and 2, in reverse order) */
    if (w->size >= 4 && (w->rank == 1 || w->rank == 2)) {
        int g[2] = {2, 1};
        test_group(w->comm, g, 2, &b, 0, false);
    }
    if (w->rank == 0) {
        printf("%d cases, %d of them bit-identical to mpi\n", n_cases, n_bitwise_mpi);
    }
    mt_free(b.send);
    mt_free(b.recv_mpi);
    mt_free(b.recv_shm);
    mt_free(b.ref);
    mt_free(b.inputs);
    return mt_test_finish_mpi("test_shm_coll");
}
