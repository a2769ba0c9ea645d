/* `meshtrain bench coll`: a collective microbenchmark in the manner of nccl-tests (same columns, same
 * bus-bandwidth factors, the closing average line), with correctness checking (-c 1), JSON output and,
 * for the MPI backend, the plain MPI call timed on the same buffers in the same run (--compare-raw) so
 * the runtime's overhead is visible. Options are parsed identically on every rank: bad input exits 2
 * everywhere, with the message printed once.
 * SPDX-License-Identifier: MIT */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "collectives/coll.h"
#include "runtime/alloc.h"
#include "runtime/mesh.h"
#include "runtime/rt.h"

#if MT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

typedef enum {
    OP_ALLREDUCE = 0,
    OP_REDUCE_SCATTER,
    OP_ALLGATHER,
    OP_BROADCAST,
    OP_REDUCE,
    OP_ALLTOALL,
    OP_SENDRECV,
    OP_N
} bench_op_t;
static const char *op_names[OP_N] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                     "reduce",    "alltoall",       "sendrecv"};

typedef struct {
    bool ops[OP_N];
    int64_t min_bytes, max_bytes, factor;
    mt_coll_dtype_t dtype;
    mt_redop_t redop;
    int iters, warmup, check, root, rounds;
    bool device, compare_raw;
    const char *be; /* the device backend forced (nccl, staged); NULL: host memory, by priority */
    const char *group, *json, *order;
    int tp, pp, dp;
} bench_opts_t;

/* ---- argument parsing ------------------------------------------------------------------------- */

static void usage(FILE *out) {
    fprintf(out,
            "usage: meshtrain bench coll [options]      (under mpirun/srun: one process per rank)\n"
            "  --op OP          allreduce|reduce_scatter|allgather|broadcast|reduce|alltoall|sendrecv|all (allreduce)\n"
            "  -b, --minbytes N smallest size in bytes, K/M/G suffixes (8)\n"
            "  -e, --maxbytes N largest size (8M)\n"
            "  -f, --stepfactor F  multiply the size by F each step (2)\n"
            "  -d, --datatype T f32|f64|f16|bf16|i32|i64|u8 (f32)\n"
            "  -o, --op_type R  sum|avg|max|min|prod (sum)\n"
            "  -n, --iters N    timed iterations per measurement (20)\n"
            "  -w, --warmup_iters N  untimed iterations first (5)\n"
            "  --rounds N       timing rounds; the median is reported (3)\n"
            "  -c, --check 0|1  fill buffers with rank- and index-dependent values, count wrong results (1)\n"
            "  -r, --root R     root of broadcast/reduce (0)\n"
            "  --backend B      mpi (host memory) | nccl | staged (device memory; staged: MPI through pinned\n"
            "                   host buffers, ranks may share a GPU) (mpi)\n"
            "  --group G        world|tp|dp|pp: benchmark this rank's group on the mesh (world)\n"
            "  --tp N --pp N [--dp N]  mesh sizes for --group (also --parallel.tp=N --parallel.pp=N --parallel.dp=N)\n"
            "  --order O        mesh order, fastest first (also --parallel.order=O) (tp-dp-pp); groups are the\n"
            "                   runtime's own (runtime/mesh.h), as `meshtrain topo --dry-run` prints them\n"
            "  --compare-raw    also time the plain MPI call on the same buffers; print ours/raw (mpi backend)\n"
            "  --json FILE      also write the results as JSON\n"
            "Sizes are total bytes as in nccl-tests: per-rank count = count / ranks for reduce_scatter, allgather,\n"
            "alltoall. Times are the median of --rounds rounds of -n iterations, each round the slowest rank's mean;\n"
            "with --compare-raw ours and raw alternate within each round (who goes first alternates too).\n");
}

static int bad(int rank, const char *fmt, const char *arg) {
    if (rank == 0) {
        fprintf(stderr, "meshtrain bench coll: ");
        fprintf(stderr, fmt, arg);
        fprintf(stderr, "\n(see `meshtrain bench coll --help`)\n");
    }
    return 2;
}

static bool parse_int(const char *s, int lo, int hi, int *out) {
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (!s[0] || *end || v < lo || v > hi) {
        return false;
    }
    *out = (int)v;
    return true;
}

/* Returns -1 to go on, else the exit code (0 for --help, 2 for bad input). */
static int parse(int argc, char **argv, int rank, bench_opts_t *o) {
    memset(o, 0, sizeof(*o));
    o->ops[OP_ALLREDUCE] = true;
    o->min_bytes = 8;
    o->max_bytes = 8 << 20;
    o->factor = 2;
    o->dtype = MT_COLL_F32;
    o->redop = MT_REDOP_SUM;
    o->iters = 20;
    o->rounds = 3;
    o->warmup = 5;
    o->check = 1;
    o->group = "world";
    o->order = "tp-dp-pp";
    o->tp = o->pp = 1;
    enum { O_OP = 256, O_ROUNDS, O_BACKEND, O_GROUP, O_TP, O_PP, O_DP, O_ORDER, O_RAW, O_JSON, O_HELP };
    static const struct option longs[] = {
        {"op", required_argument, NULL, O_OP},
        {"minbytes", required_argument, NULL, 'b'},
        {"maxbytes", required_argument, NULL, 'e'},
        {"stepfactor", required_argument, NULL, 'f'},
        {"datatype", required_argument, NULL, 'd'},
        {"op_type", required_argument, NULL, 'o'},
        {"iters", required_argument, NULL, 'n'},
        {"warmup_iters", required_argument, NULL, 'w'},
        {"check", required_argument, NULL, 'c'},
        {"root", required_argument, NULL, 'r'},
        {"rounds", required_argument, NULL, O_ROUNDS},
        {"backend", required_argument, NULL, O_BACKEND},
        {"group", required_argument, NULL, O_GROUP},
        {"tp", required_argument, NULL, O_TP},
        {"pp", required_argument, NULL, O_PP},
        {"dp", required_argument, NULL, O_DP},
        {"order", required_argument, NULL, O_ORDER},
        {"parallel.tp", required_argument, NULL, O_TP},
        {"parallel.pp", required_argument, NULL, O_PP},
        {"parallel.dp", required_argument, NULL, O_DP},
        {"parallel.order", required_argument, NULL, O_ORDER},
        {"compare-raw", no_argument, NULL, O_RAW},
        {"json", required_argument, NULL, O_JSON},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    opterr = 0;
    optind = 1;
    const char *sub = argc > 1 ? argv[1] : NULL;
    if (!sub || (strcmp(sub, "coll") && strcmp(sub, "--help") && strcmp(sub, "-h"))) {
        return bad(rank, "expected a benchmark name: `meshtrain bench coll [options]` (got '%s')", sub ? sub : "");
    }
    if (strcmp(sub, "coll")) {
        if (rank == 0) {
            usage(stdout);
        }
        return 0;
    }
    argc--;
    argv++;
    int c;
    while ((c = getopt_long(argc, argv, ":b:e:f:d:o:n:w:c:r:h", longs, NULL)) != -1) {
        switch (c) {
        case O_OP: {
            bool found = false;
            memset(o->ops, 0, sizeof(o->ops));
            for (int i = 0; i < OP_N; i++) {
                if (!strcmp(optarg, op_names[i]) || !strcmp(optarg, "all")) {
                    o->ops[i] = found = true;
                }
            }
            if (!found) {
                return bad(rank,
                           "--op %s: expected allreduce|reduce_scatter|allgather|broadcast|reduce|alltoall|"
                           "sendrecv|all",
                           optarg);
            }
            break;
        }
        case 'b':
            if (!mt_parse_size(optarg, &o->min_bytes) || o->min_bytes < 0) {
                return bad(rank, "-b %s: expected a size in bytes such as 8, 64K, 1M", optarg);
            }
            break;
        case 'e':
            if (!mt_parse_size(optarg, &o->max_bytes) || o->max_bytes < 0) {
                return bad(rank, "-e %s: expected a size in bytes such as 8, 64K, 1M", optarg);
            }
            break;
        case 'f': {
            int f;
            if (!parse_int(optarg, 2, 1 << 20, &f)) {
                return bad(rank, "-f %s: expected an integer factor >= 2", optarg);
            }
            o->factor = f;
            break;
        }
        case 'd':
            if (!mt_coll_dtype_parse(optarg, &o->dtype)) {
                return bad(rank, "-d %s: expected f32|f64|f16|bf16|i32|i64|u8", optarg);
            }
            break;
        case 'o':
            if (!mt_redop_parse(optarg, &o->redop)) {
                return bad(rank, "-o %s: expected sum|avg|max|min|prod", optarg);
            }
            break;
        case 'n':
            if (!parse_int(optarg, 1, 1 << 30, &o->iters)) {
                return bad(rank, "-n %s: expected a number of iterations >= 1", optarg);
            }
            break;
        case 'w':
            if (!parse_int(optarg, 0, 1 << 30, &o->warmup)) {
                return bad(rank, "-w %s: expected a number of warm-up iterations >= 0", optarg);
            }
            break;
        case O_ROUNDS:
            if (!parse_int(optarg, 1, 1000, &o->rounds)) {
                return bad(rank, "--rounds %s: expected a number of timing rounds >= 1", optarg);
            }
            break;
        case 'c':
            if (!parse_int(optarg, 0, 1, &o->check)) {
                return bad(rank, "-c %s: expected 0 or 1", optarg);
            }
            break;
        case 'r':
            if (!parse_int(optarg, 0, 1 << 30, &o->root)) {
                return bad(rank, "-r %s: expected a root rank >= 0", optarg);
            }
            break;
        case O_BACKEND:
            if (!strcmp(optarg, "mpi")) {
                o->device = false;
                o->be = NULL;
            } else if (!strcmp(optarg, "nccl") || !strcmp(optarg, "staged")) {
                bool nccl = !strcmp(optarg, "nccl");
                if (!MT_HAVE_CUDA) {
                    return bad(rank, "--backend %s: this build has no device backends (built without CUDA); use mpi",
                               optarg);
                }
                if (nccl && !MT_HAVE_NCCL) {
                    return bad(rank, "--backend %s: this build has no NCCL (built without it); use staged or mpi",
                               optarg);
                }
                o->device = true;
                o->be = nccl ? "nccl" : "staged";
            } else {
                return bad(rank, "--backend %s: expected mpi, nccl or staged", optarg);
            }
            break;
        case O_GROUP:
            if (strcmp(optarg, "world") && strcmp(optarg, "tp") && strcmp(optarg, "dp") && strcmp(optarg, "pp")) {
                return bad(rank, "--group %s: expected world|tp|dp|pp", optarg);
            }
            o->group = optarg;
            break;
        case O_TP:
            if (!parse_int(optarg, 1, 1 << 20, &o->tp)) {
                return bad(rank, "--tp %s: expected an integer >= 1", optarg);
            }
            break;
        case O_PP:
            if (!parse_int(optarg, 1, 1 << 20, &o->pp)) {
                return bad(rank, "--pp %s: expected an integer >= 1", optarg);
            }
            break;
        case O_DP:
            if (!parse_int(optarg, 0, 1 << 30, &o->dp)) {
                return bad(rank, "--dp %s: expected an integer >= 0 (0 = world / (tp x pp))", optarg);
            }
            break;
        case O_ORDER:
            o->order = optarg;
            break;
        case O_RAW:
            o->compare_raw = true;
            break;
        case O_JSON:
            o->json = optarg;
            break;
        case 'h':
            if (rank == 0) {
                usage(stdout);
            }
            return 0;
        case ':':
            return bad(rank, "option %s needs a value", argv[optind - 1]);
        default:
            return bad(rank, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) {
        return bad(rank, "unexpected argument '%s'", argv[optind]);
    }
    if (o->min_bytes > o->max_bytes) {
        return bad(rank, "-b is larger than -e%s", "");
    }
    if (o->compare_raw && o->device) {
        return bad(rank, "--compare-raw times plain MPI on host buffers: it goes with --backend mpi only%s", "");
    }
    return -1;
}

/* ---- buffers: host (mt_alloc) or device (cudaMalloc) ------------------------------------------------ */

typedef struct {
    bool device;
    size_t bytes;
    void *p;
} buf_t;

static int buf_init(buf_t *b, bool device, size_t bytes) {
    b->device = device;
    b->bytes = bytes;
#if MT_HAVE_CUDA
    if (device) {
        return cudaMalloc(&b->p, bytes ? bytes : 1) == cudaSuccess ? 0 : -1;
    }
#endif
    b->p = mt_alloc(bytes, MT_MEM_COMM, "bench");
    return b->p ? 0 : -1;
}

static void buf_free(buf_t *b) {
#if MT_HAVE_CUDA
    if (b->device) {
        cudaFree(b->p);
        return;
    }
#endif
    mt_free(b->p);
}

static void buf_put(buf_t *b, size_t off, const void *src, size_t bytes) {
#if MT_HAVE_CUDA
    if (b->device) {
        cudaMemcpy((char *)b->p + off, src, bytes, cudaMemcpyHostToDevice);
        return;
    }
#endif
    memcpy((char *)b->p + off, src, bytes);
}

static void buf_get(const buf_t *b, size_t off, void *dst, size_t bytes) {
#if MT_HAVE_CUDA
    if (b->device) {
        cudaMemcpy(dst, (const char *)b->p + off, bytes, cudaMemcpyDeviceToHost);
        return;
    }
#endif
    memcpy(dst, (const char *)b->p + off, bytes);
}

static void stream_sync(mt_stream_t s, bool device) {
#if MT_HAVE_CUDA
    if (device) {
        cudaStreamSynchronize((cudaStream_t)s);
    }
#endif
    (void)s;
    (void)device;
}

/* ---- values for -c 1: never zero, exact in every dtype ---------------------------------------------- */

static double val(int r, size_t i, mt_redop_t op, int n) {
    if (op == MT_REDOP_PROD) {
        return (int)(i % (size_t)n) == r ? 2.0 : 1.0; /* the product is exactly 2 everywhere */
    }
    return 1.0 + (double)(((size_t)r * 3 + i) % 4);
}

static double reduced(int n, size_t i, mt_coll_dtype_t d, mt_redop_t op) {
    double acc = val(0, i, op, n);
    for (int r = 1; r < n; r++) {
        acc = mt_redop_apply(op, acc, val(r, i, op, n));
    }
    if (op == MT_REDOP_AVG) {
        bool integral = d == MT_COLL_I32 || d == MT_COLL_I64 || d == MT_COLL_U8;
        acc = integral ? floor(acc / n) : acc / n;
    }
    return acc;
}

/* Relative tolerance: exact for integers and for sums of small integers in f32/f64; 16-bit floats may
 * round the final value (large groups) and avg rounds a division. */
static bool close_enough(double got, double want, mt_coll_dtype_t d, int n) {
    double eps = d == MT_COLL_BF16  ? 1.0 / 128
                 : d == MT_COLL_F16 ? 1.0 / 1024
                 : d == MT_COLL_F32 ? 1.2e-7
                 : d == MT_COLL_F64 ? 2.3e-16
                                    : 0.0;
    return fabs(got - want) <= eps * fabs(want) * (2.0 + log2((double)n));
}

/* ---- one op at one size ------------------------------------------------------------------------------ */

typedef struct {
    mt_comm_t comm;
    MPI_Comm bench_comm; /* the world, for timing reductions */
    int n, rank;
    mt_stream_t stream;
    MPI_Datatype mtype;
    MPI_Op mop;
} ctx_t;

typedef struct {
    double time_us, raw_us;
    int64_t wrong;
} result_t;

static size_t per_rank_count(bench_op_t op, size_t count, int n) {
    return (op == OP_REDUCE_SCATTER || op == OP_ALLGATHER || op == OP_ALLTOALL) ? count / (size_t)n : count;
}

/* Runs ours once (raw = false) or the plain MPI call (raw = true). in_place picks the in-place form:
 * all-reduce/broadcast/reduce/alltoall send == recv; reduce-scatter recv == send (result first);
 * all-gather send == recv + rank*count. sendrecv has no in-place form (the same call runs). */
static mt_status_t run_once(const ctx_t *x, bench_op_t op, const bench_opts_t *o, buf_t *sb, buf_t *rb, size_t pc,
                            bool in_place, bool raw) {
    size_t es = mt_coll_dtype_size(o->dtype);
    void *s = sb->p, *r = rb->p;
    int root = o->root, next = (x->rank + 1) % x->n, prev = (x->rank + x->n - 1) % x->n;
    MPI_Comm mc = mt_comm_mpi(x->comm);
    if (raw) {
        int rc = MPI_SUCCESS, ic = (int)pc;
        switch (op) {
        case OP_ALLREDUCE:
            rc = MPI_Allreduce(in_place ? MPI_IN_PLACE : s, in_place ? s : r, ic, x->mtype, x->mop, mc);
            break;
        case OP_REDUCE_SCATTER:
            rc = MPI_Reduce_scatter_block(in_place ? MPI_IN_PLACE : s, in_place ? s : r, ic, x->mtype, x->mop, mc);
            break;
        case OP_ALLGATHER:
            rc = in_place ? MPI_Allgather(MPI_IN_PLACE, ic, x->mtype, r, ic, x->mtype, mc)
                          : MPI_Allgather(s, ic, x->mtype, r, ic, x->mtype, mc);
            break;
        case OP_BROADCAST:
            rc = MPI_Bcast(in_place ? s : r, ic, x->mtype, root, mc);
            break;
        case OP_REDUCE:
            rc = MPI_Reduce(in_place && x->rank == root ? MPI_IN_PLACE : s, in_place ? s : r, ic, x->mtype, x->mop,
                            root, mc);
            break;
        case OP_ALLTOALL:
            rc = MPI_Alltoall(in_place ? MPI_IN_PLACE : s, ic, x->mtype, in_place ? s : r, ic, x->mtype, mc);
            break;
        case OP_SENDRECV:
            rc = MPI_Sendrecv(s, ic, x->mtype, next, 0x6d74, r, ic, x->mtype, prev, 0x6d74, mc, MPI_STATUS_IGNORE);
            break;
        default:
            break;
        }
        return rc == MPI_SUCCESS ? MT_OK : mt_error(MT_ERR_MPI, "raw MPI call failed (%d)", rc);
    }
    switch (op) {
    case OP_ALLREDUCE:
        return mt_coll_all_reduce(x->comm, s, in_place ? s : r, pc, o->dtype, o->redop, x->stream, NULL);
    case OP_REDUCE_SCATTER:
        return mt_coll_reduce_scatter(x->comm, s, in_place ? s : r, pc, o->dtype, o->redop, x->stream, NULL);
    case OP_ALLGATHER:
        return mt_coll_all_gather(x->comm, in_place ? (char *)r + pc * es * (size_t)x->rank : s, r, pc, o->dtype,
                                  x->stream, NULL);
    case OP_BROADCAST:
        return mt_coll_broadcast(x->comm, s, in_place ? s : r, pc, o->dtype, root, x->stream, NULL);
    case OP_REDUCE:
        return mt_coll_reduce(x->comm, s, in_place ? s : r, pc, o->dtype, o->redop, root, x->stream, NULL);
    case OP_ALLTOALL:
        return mt_coll_all_to_all(x->comm, s, in_place ? s : r, pc, o->dtype, x->stream, NULL);
    case OP_SENDRECV: {
        MT_CHECK(mt_coll_group_start(x->comm));
        MT_CHECK(mt_coll_send(x->comm, s, pc, o->dtype, next, x->stream, NULL));
        MT_CHECK(mt_coll_recv(x->comm, r, pc, o->dtype, prev, x->stream, NULL));
        return mt_coll_group_end(x->comm, x->stream, NULL);
    }
    default:
        return MT_ERR_INTERNAL;
    }
}

/* Fills the inputs for -c 1 and counts wrong outputs on this rank after one call. */
static mt_status_t check_once(const ctx_t *x, bench_op_t op, const bench_opts_t *o, buf_t *sb, buf_t *rb, size_t pc,
                              bool in_place, int64_t *wrong) {
    size_t es = mt_coll_dtype_size(o->dtype);
    int n = x->n, me = x->rank, root = o->root;
    size_t send_n = (op == OP_REDUCE_SCATTER || op == OP_ALLTOALL) ? pc * (size_t)n : pc;
    size_t recv_n = (op == OP_ALLGATHER || op == OP_ALLTOALL) ? pc * (size_t)n : pc;
    size_t host_n = send_n > recv_n ? send_n : recv_n;
    void *h = mt_alloc(host_n * es + 64, MT_MEM_OTHER, "bench check");
    if (!h) {
        return mt_error(MT_ERR_OOM, "bench: no memory for the check buffer");
    }
    /* inputs */
    for (size_t i = 0; i < send_n; i++) {
        double v = op == OP_ALLTOALL
                       ? 1.0 + (double)(((size_t)me * 5 + (i / (pc ? pc : 1)) * 3 + i % (pc ? pc : 1)) % 7)
                       : val(me, i, o->redop, n);
        mt_coll_elem_set(h, o->dtype, i, v);
    }
    /* poison the output with zeros: a call that writes nothing is caught (no expected value is zero) */
    void *zero = mt_calloc(recv_n * es + 64, MT_MEM_OTHER, "bench check");
    buf_put(rb, 0, zero, recv_n * es);
    void *src_buf = sb->p;
    if (in_place) {
        if (op == OP_ALLGATHER) {
            buf_put(rb, pc * es * (size_t)me, h, pc * es);
        } else if (op != OP_SENDRECV) {
            buf_put(sb, 0, h, send_n * es);
        } else {
            buf_put(sb, 0, h, send_n * es);
        }
    } else {
        buf_put(sb, 0, h, send_n * es);
    }
    (void)src_buf;
    MT_CHECK(run_once(x, op, o, sb, rb, pc, in_place, false));
    stream_sync(x->stream, o->device);
    buf_t *out = (in_place && op != OP_ALLGATHER && op != OP_SENDRECV) ? sb : rb;
    buf_get(out, 0, h, recv_n * es);
    int64_t bad = 0;
    bool has_result = !((op == OP_REDUCE) && me != root);
    for (size_t i = 0; has_result && i < recv_n; i++) {
        double want;
        switch (op) {
        case OP_ALLREDUCE:
        case OP_REDUCE:
            want = reduced(n, i, o->dtype, o->redop);
            break;
        case OP_REDUCE_SCATTER:
            want = reduced(n, (size_t)me * pc + i, o->dtype, o->redop);
            break;
        case OP_ALLGATHER:
            want = val((int)(i / pc), i % pc, o->redop, n);
            break;
        case OP_BROADCAST:
            want = val(root, i, o->redop, n);
            break;
        case OP_ALLTOALL:
            want = 1.0 + (double)(((i / pc) * 5 + (size_t)me * 3 + i % pc) % 7);
            break;
        default:
            want = val((me + n - 1) % n, i, o->redop, n);
            break;
        }
        bad += !close_enough(mt_coll_elem_get(h, o->dtype, i), want, o->dtype, n);
    }
    mt_free(zero);
    mt_free(h);
    *wrong = bad;
    return MT_OK;
}

/* Median over the rounds of the slowest rank's mean time per call, ours and (alternating) raw. */
static mt_status_t time_op(const ctx_t *x, bench_op_t op, const bench_opts_t *o, buf_t *sb, buf_t *rb, size_t pc,
                           bool in_place, result_t *res) {
    double t_ours[1000], t_raw[1000];
    for (int w = 0; w < o->warmup; w++) {
        MT_CHECK(run_once(x, op, o, sb, rb, pc, in_place, false));
        if (o->compare_raw) {
            MT_CHECK(run_once(x, op, o, sb, rb, pc, in_place, true));
        }
    }
    stream_sync(x->stream, o->device);
    for (int round = 0; round < o->rounds; round++) {
        t_raw[round] = 0;
        for (int which = 0; which < (o->compare_raw ? 2 : 1); which++) {
            bool raw = (which + round) % 2 == 1 && o->compare_raw; /* alternate who goes first */
            if (!o->compare_raw) {
                raw = false;
            }
            MPI_Barrier(x->bench_comm);
            double t0 = mt_now();
            for (int i = 0; i < o->iters; i++) {
                MT_CHECK(run_once(x, op, o, sb, rb, pc, in_place, raw));
            }
            stream_sync(x->stream, o->device);
            double dt = (mt_now() - t0) / o->iters, worst = 0;
            MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, x->bench_comm);
            (raw ? t_raw : t_ours)[round] = worst;
        }
    }
    res->time_us = 1e6 * mt_median(t_ours, o->rounds);
    res->raw_us = 1e6 * mt_median(t_raw, o->rounds);
    return MT_OK;
}

static double bus_factor(bench_op_t op, int n) {
    switch (op) {
    case OP_ALLREDUCE:
        return 2.0 * (n - 1) / n;
    case OP_REDUCE_SCATTER:
    case OP_ALLGATHER:
    case OP_ALLTOALL:
        return (double)(n - 1) / n;
    default:
        return 1.0;
    }
}

/* ---- the table ------------------------------------------------------------------------------------ */

static const char *nccl_type_name(mt_coll_dtype_t d) {
    static const char *names[MT_COLL_DTYPE_COUNT] = {
        [MT_COLL_F32] = "float", [MT_COLL_F64] = "double", [MT_COLL_F16] = "half", [MT_COLL_BF16] = "bfloat16",
        [MT_COLL_I32] = "int32", [MT_COLL_I64] = "int64",  [MT_COLL_U8] = "uint8",
    };
    return names[d];
}

static int run_bench(const ctx_t *x, bench_op_t op, const bench_opts_t *o, FILE *json, bool first_json,
                     double *avg_busbw_out) {
    size_t es = mt_coll_dtype_size(o->dtype);
    bool rooted = op == OP_BROADCAST || op == OP_REDUCE;
    bool reduces = op == OP_ALLREDUCE || op == OP_REDUCE_SCATTER || op == OP_REDUCE;
    int me = mt_rt_world()->rank;
    if (me == 0) {
        printf("#\n# %s: %d ranks in group '%s' (backend %s), dtype %s%s%s\n", op_names[op], x->n, o->group,
               mt_comm_backend_name(x->comm), mt_coll_dtype_name(o->dtype), reduces ? ", redop " : "",
               reduces ? mt_redop_name(o->redop) : "");
        printf("#%61s%-32s%s\n", "", "out-of-place", o->compare_raw ? "            in-place" : "in-place");
        printf("#%11s %13s %9s %7s %7s %9s %7s %7s %6s", "size", "count", "type", "redop", "root", "time", "algbw",
               "busbw", "#wrong");
        if (o->compare_raw) {
            printf(" %9s %7s", "raw", "ours/raw");
        }
        printf(" %9s %7s %7s %6s", "time", "algbw", "busbw", "#wrong");
        if (o->compare_raw) {
            printf(" %9s %7s", "raw", "ours/raw");
        }
        printf("\n#%11s %13s %9s %7s %7s %9s %7s %7s %6s", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)",
               "");
        if (o->compare_raw) {
            printf(" %9s %7s", "(us)", "");
        }
        printf(" %9s %7s %7s %6s", "(us)", "(GB/s)", "(GB/s)", "");
        if (o->compare_raw) {
            printf(" %9s %7s", "(us)", "");
        }
        printf("\n");
        if (json) {
            fprintf(json,
                    "%s\n  {\"op\": \"%s\", \"ranks\": %d, \"group\": \"%s\", \"backend\": \"%s\", "
                    "\"dtype\": \"%s\", \"redop\": \"%s\", \"iters\": %d, \"rounds\": %d, \"rows\": [",
                    first_json ? "" : ",", op_names[op], x->n, o->group, mt_comm_backend_name(x->comm),
                    mt_coll_dtype_name(o->dtype), reduces ? mt_redop_name(o->redop) : "none", o->iters, o->rounds);
        }
    }
    double bw_sum = 0;
    int bw_count = 0, rc = 0;
    bool first_row = true;
    /* size 0 is followed by one element, then the factor (every rank walks the same sizes) */
    for (int64_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes = bytes ? bytes * o->factor : (int64_t)es) {
        size_t count = (size_t)bytes / es;
        size_t pc = per_rank_count(op, count, x->n);
        count = (op == OP_REDUCE_SCATTER || op == OP_ALLGATHER || op == OP_ALLTOALL) ? pc * (size_t)x->n : count;
        size_t size = count * es;
        size_t send_n = (op == OP_REDUCE_SCATTER || op == OP_ALLTOALL) ? pc * (size_t)x->n : pc;
        size_t recv_n = (op == OP_ALLGATHER || op == OP_ALLTOALL) ? pc * (size_t)x->n : pc;
        buf_t sb, rb;
        if (buf_init(&sb, o->device, send_n * es + 64) || buf_init(&rb, o->device, recv_n * es + 64)) {
            if (me == 0) {
                fprintf(stderr, "meshtrain bench coll: out of memory for %zu-byte buffers\n", size);
            }
            return 1;
        }
        result_t res[2];
        for (int ip = 0; ip < 2; ip++) {
            res[ip].wrong = -1;
            if (o->check) {
                int64_t w = 0, total = 0;
                mt_status_t st = check_once(x, op, o, &sb, &rb, pc, ip == 1, &w);
                if (st != MT_OK) {
                    fprintf(stderr, "meshtrain bench coll: rank %d: %s failed: %s\n", me, op_names[op],
                            mt_last_error_msg());
                    rc = 1;
                    w = 1;
                }
                MPI_Allreduce(&w, &total, 1, MPI_INT64_T, MPI_SUM, x->bench_comm);
                res[ip].wrong = total;
            }
            mt_status_t st = time_op(x, op, o, &sb, &rb, pc, ip == 1, &res[ip]);
            if (st != MT_OK) {
                fprintf(stderr, "meshtrain bench coll: rank %d: %s of %zu bytes failed: %s\n", me, op_names[op], size,
                        mt_last_error_msg());
                buf_free(&sb);
                buf_free(&rb);
                return 1;
            }
        }
        buf_free(&sb);
        buf_free(&rb);
        if (me != 0) {
            for (int ip = 0; ip < 2; ip++) {
                if (res[ip].wrong > 0) {
                    rc = 1;
                }
            }
            continue;
        }
        printf("%12zu %13zu %9s %7s %7d", size, count, nccl_type_name(o->dtype),
               reduces ? mt_redop_name(o->redop) : "none", rooted ? o->root : -1);
        if (json) {
            fprintf(json, "%s\n    {\"size\": %zu, \"count\": %zu", first_row ? "" : ",", size, count);
        }
        first_row = false;
        for (int ip = 0; ip < 2; ip++) {
            double algbw = res[ip].time_us > 0 ? (double)size / (res[ip].time_us * 1e3) : 0;
            double busbw = algbw * bus_factor(op, x->n);
            bw_sum += busbw;
            bw_count++;
            if (res[ip].wrong > 0) {
                rc = 1;
            }
            printf(" %9.2f %7.3f %7.3f", res[ip].time_us, algbw, busbw);
            if (res[ip].wrong < 0) {
                printf(" %6s", "N/A");
            } else {
                printf(" %6lld", (long long)res[ip].wrong);
            }
            if (o->compare_raw) {
                printf(" %9.2f %7.3f", res[ip].raw_us, res[ip].raw_us > 0 ? res[ip].time_us / res[ip].raw_us : 0);
            }
            if (json) {
                fprintf(json, ", \"%s\": {\"time_us\": %.3f, \"algbw_gbs\": %.5f, \"busbw_gbs\": %.5f, \"wrong\": %lld",
                        ip ? "in_place" : "out_of_place", res[ip].time_us, algbw, busbw, (long long)res[ip].wrong);
                if (o->compare_raw) {
                    fprintf(json, ", \"raw_time_us\": %.3f, \"ours_over_raw\": %.4f", res[ip].raw_us,
                            res[ip].raw_us > 0 ? res[ip].time_us / res[ip].raw_us : 0);
                }
                fprintf(json, "}");
            }
        }
        printf("\n");
        fflush(stdout);
        if (json) {
            fprintf(json, "}");
        }
    }
    double avg = bw_count ? bw_sum / bw_count : 0;
    *avg_busbw_out = avg;
    if (me == 0) {
        printf("# Out of bounds values : %s\n", o->check ? "checked (see #wrong)" : "not checked (-c 0)");
        printf("# Avg bus bandwidth    : %g \n#\n", avg);
        if (json) {
            fprintf(json, "\n  ], \"avg_busbw_gbs\": %.5f}", avg);
        }
    }
    return rc;
}

int mt_cmd_bench(int argc, char **argv) {
    const mt_world_t *w = mt_rt_world();
    bench_opts_t o;
    int rc = parse(argc, argv, w->rank, &o);
    if (rc >= 0) {
        return rc;
    }
    /* the group: the world, or this rank's group along one axis of the runtime's mesh (runtime/mesh.h) */
    mt_mesh_t *mesh = NULL;
    if (mt_mesh_create(w->size, o.tp, o.pp, o.dp, o.order, &mesh) != MT_OK) {
        char msg[512];
        snprintf(msg, sizeof(msg), "--tp %d --pp %d --dp %d --order %s: %s", o.tp, o.pp, o.dp, o.order,
                 mt_last_error_msg());
        return bad(w->rank, "%s", msg);
    }
    if (!strcmp(o.group, "world") && (o.tp > 1 || o.pp > 1) && w->rank == 0) {
        fprintf(stderr, "meshtrain bench coll: note: --tp/--pp only matter with --group tp|dp|pp\n");
    }
    int n = w->size;
    unsigned axis_bit = 0;
    if (strcmp(o.group, "world")) {
        mt_axis_t axis = !strcmp(o.group, "tp") ? MT_AXIS_TP : !strcmp(o.group, "dp") ? MT_AXIS_DP : MT_AXIS_PP;
        axis_bit = MT_AXIS_BIT(axis);
        n = mt_mesh_axis_size(mesh, axis);
    }
    if (o.root >= n) {
        mt_mesh_free(mesh);
        char msg[64];
        snprintf(msg, sizeof(msg), "-r %d", o.root);
        return bad(w->rank, "%s: the root must be a rank of the group (< its size)", msg);
    }
#if MT_HAVE_CUDA
    if (o.device) {
        int ndev = 0;
        if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
            mt_mesh_free(mesh);
            if (w->rank == 0) {
                fprintf(stderr, "meshtrain bench coll: --backend %s needs a CUDA device and this node has none\n",
                        o.be);
            }
            return 1;
        }
        cudaSetDevice(w->local_rank % ndev);
    }
#endif
    mt_comm_params_t p = MT_COMM_PARAMS_INIT;
    p.name = o.group;
    p.memory = o.device ? MT_COMM_MEM_DEVICE : MT_COMM_MEM_HOST;
    p.backend = o.be;
    mt_comm_t comm = NULL;
    mt_status_t st =
        axis_bit ? mt_comm_init_mesh(w->comm, mesh, axis_bit, &p, &comm) : mt_comm_init(w->comm, &p, &comm);
    mt_mesh_free(mesh);
    if (st != MT_OK) {
        fprintf(stderr, "meshtrain bench coll: rank %d: cannot create the %s communicator: %s\n", w->rank, o.group,
                mt_last_error_msg());
        return 1;
    }
    ctx_t x = {comm, w->comm, mt_comm_size(comm), mt_comm_rank(comm), NULL, MPI_DATATYPE_NULL, MPI_OP_NULL};
    if (o.compare_raw && mt_coll_mpi_types(o.dtype, o.redop, &x.mtype, &x.mop) != MT_OK) {
        fprintf(stderr, "meshtrain bench coll: %s\n", mt_last_error_msg());
        mt_comm_free(comm);
        return 1;
    }
#if MT_HAVE_CUDA
    cudaStream_t cs = NULL;
    if (o.device) {
        cudaStreamCreate(&cs);
        x.stream = cs;
    }
#endif
    FILE *json = NULL;
    if (o.json && w->rank == 0) {
        json = fopen(o.json, "w");
        if (!json) {
            fprintf(stderr, "meshtrain bench coll: cannot write --json %s\n", o.json);
        } else {
            fprintf(json, "{\"meshtrain_bench\": \"coll\", \"world\": %d, \"results\": [", w->size);
        }
    }
    int json_ok = json != NULL || !o.json || w->rank != 0;
    MPI_Bcast(&json_ok, 1, MPI_INT, 0, w->comm);
    if (!json_ok) {
        mt_comm_free(comm);
        return 2;
    }
    if (w->rank == 0) {
        printf("# meshtrain bench coll: %d ranks, sizes %lld..%lld x%lld, %d warm-up + %d x %d timed iterations%s\n",
               w->size, (long long)o.min_bytes, (long long)o.max_bytes, (long long)o.factor, o.warmup, o.rounds,
               o.iters, o.compare_raw ? ", raw MPI compared" : "");
    }
    /* Ranks in different groups run the same sequence concurrently; timing barriers span the world. */
    rc = 0;
    bool first = true;
    for (int op = 0; op < OP_N; op++) {
        if (!o.ops[op]) {
            continue;
        }
        double avg = 0;
        int r = run_bench(&x, (bench_op_t)op, &o, json, first, &avg);
        first = false;
        rc = r > rc ? r : rc;
    }
    int all_rc = rc;
    MPI_Allreduce(&rc, &all_rc, 1, MPI_INT, MPI_MAX, w->comm);
    if (json) {
        fprintf(json, "\n]}\n");
        fclose(json);
    }
#if MT_HAVE_CUDA
    if (cs) {
        cudaStreamDestroy(cs);
    }
#endif
    mt_comm_free(comm);
    if (all_rc && w->rank == 0) {
        fprintf(stderr, "meshtrain bench coll: FAILED: wrong results or errors (see above)\n");
    }
    return all_rc;
}
