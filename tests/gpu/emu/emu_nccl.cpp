// An emulated NCCL for the CPU emulator of CUDA (cuda_emu.cpp), so that the NCCL backend
// (collectives/coll_nccl.c, compiled against the real nccl.h) and the GPU engine over it run in CI without a GPU.
// Linked into a test executable as its own objects, its definitions take the place of libnccl's. What it keeps
// of NCCL:
//  - every op is enqueued on its stream and runs in the stream's order (the emulator's lazy streams: when
//    something waits for it), reading its input and writing its output then, not at the call;
//  - ops between ncclGroupStart and ncclGroupEnd run together (sends and receives posted at once); an error
//    inside a group is ncclGroupEnd's, and nothing of the group runs;
//  - the buffer rules: in place only in each op's documented form (reduce-scatter: recv = send + rank * count,
//    all-gather: send = recv + rank * count), otherwise no overlap; a send completes only with its receive;
//  - avg: floating types scale each input by 1/n before the sum (NCCL's pre-multiplied sum), integers divide
//    the sum held in the type;
//  - ncclCommInitRank meets the id's other ranks (the id's creator must be rank 0) and refuses two ranks on one
//    (host, device); ncclCommAbort ends an op waiting for its peers (its output undefined) and
//    ncclCommGetAsyncError then reports ncclRemoteError.
// Underneath: MPI, on a communicator made for each NCCL one out of a private duplicate of MPI_COMM_WORLD.
// Reductions run in rank order in the type's accumulation type (f32 for f16/bf16, rounded after each rank), so
// results are deterministic but not NCCL's bit for bit.
//
// Two things a device does by itself must be made to happen here, or the ranks would wait on each other forever:
//  - a device runs its streams while the host does something else. Before this rank blocks in an MPI call of
//    its own (the profiling interface's wrappers below) or in ncclCommInitRank, every op already enqueued runs;
//  - a device runs independent streams side by side. Here an op first runs every op enqueued before it (any
//    stream), so each rank runs its ops in the order it issued them, which every rank of a correct program
//    can follow. The price: the work queued ahead of those ops on their streams runs too, so a stream that
//    reads, after a collective, what another stream wrote before an earlier collective is ordered by that,
//    not by a wait of its own, and a missing wait of that shape goes unseen.
// An op that waits longer than MESHTRAIN_EMU_NCCL_TIMEOUT_S (default 240) for its peers prints what it waited
// for and aborts the process. Test-only.
// SPDX-License-Identifier: MIT
#define OMPI_SKIP_MPICXX 1 /* the C API only */
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

// The subset of nccl.h this emulates, with NCCL's values (the ABI coll_nccl.c was compiled against).
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7
} ncclResult_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
typedef enum {
    ncclInt8 = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclFloat32 = 7,
    ncclFloat64 = 8,
    ncclBfloat16 = 9
} ncclDataType_t;
typedef struct {
    char internal[128];
} ncclUniqueId;

struct ncclComm {
    MPI_Comm comm;
    int rank, size;
    std::atomic<bool> aborted{false};
    std::atomic<int> async_error{ncclSuccess};
};
typedef struct ncclComm *ncclComm_t;

namespace {

const char magic[8] = "mtemunc";
struct id_body {
    char magic[8];
    int root_world; // the world rank that made the id: NCCL rank 0 of the communicator
    unsigned serial;
};

MPI_Comm emu_world = MPI_COMM_NULL;
unsigned id_serial;
thread_local std::string last_error;

ncclResult_t fail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t fail(ncclResult_t r, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    last_error = buf;
    return r;
}

size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    }
    return 0;
}

// ---- reductions: dst = src[0] op src[1] ... in rank order, n inputs of count elements each ----
template <typename T, typename A> struct conv {
    static A get(const void *p, size_t i) { return (A)((const T *)p)[i]; }
    static void put(void *p, size_t i, A v) { ((T *)p)[i] = (T)v; }
};
template <> struct conv<__half, float> {
    static float get(const void *p, size_t i) { return __half2float(((const __half *)p)[i]); }
    static void put(void *p, size_t i, float v) { ((__half *)p)[i] = __float2half_rn(v); }
};
template <> struct conv<__nv_bfloat16, float> {
    static float get(const void *p, size_t i) { return __bfloat162float(((const __nv_bfloat16 *)p)[i]); }
    static void put(void *p, size_t i, float v) { ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); }
};

template <typename T, typename A> A rounded(A v) { // v stored as T and read back
    T tmp[1];
    conv<T, A>::put(tmp, 0, v);
    return conv<T, A>::get(tmp, 0);
}

// avg as NCCL computes it: floating types scale each input by 1/n before the sum (ncclAvg's pre-multiplied
// sum, which is why coll_nccl.c sums and divides itself), integers divide the sum held in the type.
template <typename T, typename A>
void reduce_t(void *dst, const char *src, size_t stride, int n, size_t count, ncclRedOp_t op) {
    typedef conv<T, A> C;
    const bool premul = op == ncclAvg && std::is_floating_point<A>::value;
    const A inv = premul ? (A)1 / (A)n : (A)1;
    for (size_t i = 0; i < count; i++) {
        A acc = premul ? rounded<T, A>(C::get(src, i) * inv) : C::get(src, i);
        for (int r = 1; r < n; r++) {
            A v = C::get(src + stride * (size_t)r, i);
            v = premul ? rounded<T, A>(v * inv) : v;
            switch (op) {
            case ncclProd: acc = acc * v; break;
            case ncclMax: acc = v > acc ? v : acc; break;
            case ncclMin: acc = v < acc ? v : acc; break;
            default: acc = acc + v; break; // sum, avg
            }
            if (r + 1 < n) { // rounded to the type after each rank, as a device's ring stores partial sums
                acc = rounded<T, A>(acc);
            }
        }
        if (op == ncclAvg && !premul) {
            acc = rounded<T, A>(acc) / (A)n; // the truncating division of the sum held in the type
        }
        C::put(dst, i, acc);
    }
}

void reduce(void *dst, const char *src, size_t stride, int n, size_t count, ncclDataType_t t, ncclRedOp_t op) {
    switch (t) {
    case ncclInt8: reduce_t<int8_t, int64_t>(dst, src, stride, n, count, op); break;
    case ncclUint8: reduce_t<uint8_t, uint64_t>(dst, src, stride, n, count, op); break;
    case ncclInt32: reduce_t<int32_t, int64_t>(dst, src, stride, n, count, op); break;
    case ncclUint32: reduce_t<uint32_t, uint64_t>(dst, src, stride, n, count, op); break;
    case ncclInt64: reduce_t<int64_t, int64_t>(dst, src, stride, n, count, op); break;
    case ncclUint64: reduce_t<uint64_t, uint64_t>(dst, src, stride, n, count, op); break;
    case ncclFloat16: reduce_t<__half, float>(dst, src, stride, n, count, op); break;
    case ncclFloat32: reduce_t<float, float>(dst, src, stride, n, count, op); break;
    case ncclFloat64: reduce_t<double, double>(dst, src, stride, n, count, op); break;
    case ncclBfloat16: reduce_t<__nv_bfloat16, float>(dst, src, stride, n, count, op); break;
    }
}

// ---- ops ----
enum kind_t { ALL_REDUCE, REDUCE, BROADCAST, ALL_GATHER, REDUCE_SCATTER, SEND, RECV };
const char *kind_name[] = {"AllReduce", "Reduce", "Broadcast", "AllGather", "ReduceScatter", "Send", "Recv"};

struct op_t {
    kind_t k;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t dt;
    ncclRedOp_t red;
    int peer; // root (Reduce, Broadcast) or peer (Send, Recv)
    ncclComm_t comm;
    cudaStream_t stream;
};

double now_s() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double timeout_s() {
    static double t = -1;
    if (t < 0) {
        const char *e = getenv("MESHTRAIN_EMU_NCCL_TIMEOUT_S");
        t = e && *e ? atof(e) : 240.0;
    }
    return t;
}

// Waits for reqs of ops (a group); false if a comm of theirs was aborted meanwhile (the outputs are then
// undefined, as NCCL's; the comm reports the abort as its asynchronous error).
bool wait_reqs(std::vector<MPI_Request> &reqs, const std::vector<op_t> &ops) {
    const op_t &op = ops[0];
    ncclComm_t c = op.comm;
    double t0 = now_s();
    long nap = 1000; // ns
    for (;;) {
        int done = 0;
        PMPI_Testall((int)reqs.size(), reqs.data(), &done, MPI_STATUSES_IGNORE);
        if (done) {
            return true;
        }
        for (const op_t &o : ops) {
            if (o.comm->aborted.load()) {
                for (const op_t &o2 : ops) {
                    o2.comm->async_error.store(ncclRemoteError);
                }
                return false;
            }
        }
        if (now_s() - t0 > timeout_s()) {
            int wr = -1;
            PMPI_Comm_rank(MPI_COMM_WORLD, &wr);
            fprintf(stderr, "emulated NCCL: world rank %d, rank %d of %d: nccl%s of %zu elements (peer/root %d) waited "
                    "%.0f s for the other ranks: aborting (MESHTRAIN_EMU_NCCL_TIMEOUT_S)\n", wr, c->rank, c->size,
                    kind_name[op.k], op.count, op.peer, timeout_s());
            fflush(stderr);
            abort();
        }
        struct timespec ts = {0, nap};
        nanosleep(&ts, NULL);
        nap = nap < 1000000 ? nap * 2 : nap;
    }
}

// Whether an op's bytes (each rank's part, n ranks) fit MPI's int counts.
bool too_big(size_t bytes, int n) {
    return bytes > (size_t)INT32_MAX / (size_t)(n > 0 ? n : 1);
}

// One op of a group in flight: its input read into in when the op runs (stream order), what arrives in out.
struct xfer_t {
    op_t op;
    std::vector<char> in, out;
};

// What aborted ops left to MPI: their buffers stay allocated, as MPI may still write into them.
std::mutex grave_mu;
std::vector<std::vector<xfer_t>> &graveyard = *new std::vector<std::vector<xfer_t>>;

// Posts op (reading its input now) into reqs.
void post(xfer_t &x, std::vector<MPI_Request> &reqs) {
    const op_t &op = x.op;
    ncclComm_t c = op.comm;
    int n = c->size, me = c->rank;
    size_t b = op.count * type_size(op.dt);
    size_t in_b = op.k == REDUCE_SCATTER ? b * (size_t)n : b;
    if (too_big(in_b, n)) {
        fprintf(stderr, "emulated NCCL: nccl%s of %zu bytes per rank is beyond the emulator (MPI int counts)\n",
                kind_name[op.k], in_b);
        abort();
    }
    bool reads = op.k != RECV && (op.k != BROADCAST || me == op.peer);
    if (reads) {
        x.in.assign((const char *)op.send, (const char *)op.send + in_b);
    }
    reqs.emplace_back();
    MPI_Request *r = &reqs.back();
    switch (op.k) {
    case SEND: // synchronous mode: NCCL promises no buffering, so neither does this
        PMPI_Issend(x.in.data(), (int)b, MPI_BYTE, op.peer, 7, c->comm, r);
        return;
    case RECV:
        x.out.resize(b);
        PMPI_Irecv(x.out.data(), (int)b, MPI_BYTE, op.peer, 7, c->comm, r);
        return;
    case BROADCAST:
        x.out = me == op.peer ? x.in : std::vector<char>(b);
        PMPI_Ibcast(x.out.data(), (int)b, MPI_BYTE, op.peer, c->comm, r);
        return;
    default: // every rank's input to every rank; the reduction when it has arrived
        x.out.resize(in_b * (size_t)n);
        PMPI_Iallgather(x.in.data(), (int)in_b, MPI_BYTE, x.out.data(), (int)in_b, MPI_BYTE, c->comm, r);
        return;
    }
}

// Writes op's output from what arrived.
void finish(const xfer_t &x) {
    const op_t &op = x.op;
    int n = op.comm->size, me = op.comm->rank;
    size_t b = op.count * type_size(op.dt);
    switch (op.k) {
    case SEND: return;
    case RECV:
    case BROADCAST:
    case ALL_GATHER: memcpy(op.recv, x.out.data(), x.out.size()); return;
    case REDUCE_SCATTER: // rank me's block of every rank's input
        reduce(op.recv, x.out.data() + b * (size_t)me, x.in.size(), n, op.count, op.dt, op.red);
        return;
    case ALL_REDUCE:
    case REDUCE:
        if (op.k == ALL_REDUCE || me == op.peer) {
            reduce(op.recv, x.out.data(), b, n, op.count, op.dt, op.red);
        }
        return;
    }
}

// Runs a group's ops together (one op alone is a group of one).
void run_group(const std::vector<op_t> &ops) {
    for (const op_t &op : ops) {
        if (op.comm->aborted.load()) {
            return; // nothing of a group on an aborted comm runs
        }
    }
    std::vector<xfer_t> xs;
    xs.reserve(ops.size());
    std::vector<MPI_Request> reqs;
    for (const op_t &op : ops) {
        xs.push_back(xfer_t{op, {}, {}});
        post(xs.back(), reqs);
    }
    if (!wait_reqs(reqs, ops)) {
        std::lock_guard<std::mutex> g(grave_mu);
        graveyard.push_back(std::move(xs));
        return;
    }
    for (const xfer_t &x : xs) {
        finish(x);
    }
}

// Ops enqueued and not yet run, in the order this process issued them: a marker event recorded after each.
struct marker_t {
    uint64_t seq;
    cudaEvent_t ev;
};
std::deque<marker_t> markers; // under the emulator's lock (mt_emu_streams_lock): one lock, one order
uint64_t issued, done_upto;
thread_local bool running_before;

// Runs every op issued before seq (all of them: seq = UINT64_MAX). On the emulator's worker thread only.
void run_before(uint64_t seq) {
    std::lock_guard<std::recursive_mutex> g(mt_emu_streams_lock());
    while (!markers.empty() && markers.front().seq < seq) {
        marker_t m = markers.front();
        if (done_upto < m.seq) {
            mt_emu_run_to_event(m.ev); // the op runs, and may pop the markers before it: look again
            continue;
        }
        markers.pop_front();
        cudaEventDestroy(m.ev);
    }
}

ncclResult_t enqueue(std::vector<op_t> ops) {
    cudaStream_t s = ops[0].stream;
    for (const op_t &op : ops) {
        if (op.stream != s) {
            return fail(ncclInvalidUsage, "emulated NCCL: a group's ops on two streams (the emulator runs a group "
                        "on one)");
        }
    }
    std::lock_guard<std::recursive_mutex> g(mt_emu_streams_lock());
    uint64_t seq = ++issued;
    mt_emu_enqueue(s, [ops, seq]() {
        run_before(seq);
        run_group(ops);
        std::lock_guard<std::recursive_mutex> g2(mt_emu_streams_lock());
        done_upto = seq;
    });
    cudaEvent_t ev;
    cudaEventCreate(&ev);
    cudaEventRecord(ev, s);
    markers.push_back(marker_t{seq, ev});
    return ncclSuccess;
}

thread_local int group_depth;
thread_local std::vector<op_t> group_ops;
thread_local ncclResult_t group_error; // the first error inside the group: ncclGroupEnd returns it, runs nothing

// NCCL's buffer rules: in place only in the one form each op documents, otherwise no overlap.
ncclResult_t check_buffers(const op_t &op) {
    int n = op.comm->size, me = op.comm->rank;
    size_t b = op.count * type_size(op.dt);
    if (b == 0 || op.k == SEND || op.k == RECV) {
        return ncclSuccess;
    }
    bool has_send = op.k != BROADCAST || me == op.peer, has_recv = op.k != REDUCE || me == op.peer;
    if (!has_send || !has_recv) {
        return ncclSuccess;
    }
    const char *s = (const char *)op.send, *r = (const char *)op.recv;
    size_t s_b = op.k == REDUCE_SCATTER ? b * (size_t)n : b, r_b = op.k == ALL_GATHER ? b * (size_t)n : b;
    bool in_place = op.k == REDUCE_SCATTER ? r == s + b * (size_t)me : op.k == ALL_GATHER ? s == r + b * (size_t)me
                                                                                        : s == r;
    if (in_place || s + s_b <= r || r + r_b <= s) {
        return ncclSuccess;
    }
    return fail(ncclInvalidArgument, "emulated NCCL: nccl%s: send and receive buffers overlap other than in NCCL's "
                "in-place form", kind_name[op.k]);
}

ncclResult_t submit(const op_t &op) {
    ncclResult_t r = ncclSuccess;
    if (!op.comm) {
        r = fail(ncclInvalidArgument, "emulated NCCL: comm is NULL");
    } else if (op.comm->aborted.load()) {
        r = fail(ncclInvalidUsage, "emulated NCCL: comm was aborted");
    } else if (type_size(op.dt) == 0 || (unsigned)op.red > ncclAvg) {
        r = fail(ncclInvalidArgument, "emulated NCCL: datatype %d or op %d not emulated", (int)op.dt, (int)op.red);
    } else if ((op.k == REDUCE || op.k == BROADCAST || op.k == SEND || op.k == RECV) &&
               (op.peer < 0 || op.peer >= op.comm->size)) {
        r = fail(ncclInvalidArgument, "emulated NCCL: nccl%s root/peer %d of %d ranks", kind_name[op.k], op.peer,
                 op.comm->size);
    } else if (group_depth == 0 && (op.k == SEND || op.k == RECV) && op.peer == op.comm->rank) {
        // alone, a send to oneself would wait for its receive forever, as NCCL's would
        r = fail(ncclInvalidUsage, "emulated NCCL: nccl%s to itself outside a group", kind_name[op.k]);
    } else {
        r = check_buffers(op);
    }
    if (group_depth > 0) {
        if (r != ncclSuccess && group_error == ncclSuccess) {
            group_error = r;
        }
        if (r == ncclSuccess) {
            group_ops.push_back(op);
        }
        return r;
    }
    return r != ncclSuccess ? r : enqueue(std::vector<op_t>{op});
}

// Before this rank blocks in MPI: the ops it issued run, as a device would run them meanwhile.
void before_mpi() {
    if (running_before || !mt_emu_is_worker()) { // (before anything is queued there is nothing to run)
        return;
    }
    {
        std::lock_guard<std::recursive_mutex> g(mt_emu_streams_lock());
        if (markers.empty()) {
            return;
        }
    }
    running_before = true;
    run_before(UINT64_MAX);
    running_before = false;
}

} // namespace

extern "C" {

ncclResult_t ncclGetVersion(int *version) {
    *version = 22800;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclSystemError: return "unhandled system error";
    default: return "internal error";
    }
}

const char *ncclGetLastError(ncclComm_t) {
    return last_error.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (emu_world == MPI_COMM_NULL) {
        return fail(ncclInvalidUsage, "emulated NCCL: MPI is not initialised");
    }
    id_body b;
    memcpy(b.magic, magic, sizeof(magic));
    PMPI_Comm_rank(emu_world, &b.root_world);
    b.serial = ++id_serial;
    memset(id, 0, sizeof(*id));
    memcpy(id->internal, &b, sizeof(b));
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
    id_body b;
    memcpy(&b, id.internal, sizeof(b));
    if (memcmp(b.magic, magic, sizeof(magic)) != 0) {
        return fail(ncclInvalidArgument, "emulated NCCL: not an id of ncclGetUniqueId");
    }
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        return fail(ncclInvalidArgument, "emulated NCCL: rank %d of %d", rank, nranks);
    }
    int me = -1;
    PMPI_Comm_rank(emu_world, &me);
    if ((rank == 0) != (me == b.root_world)) {
        return fail(ncclInvalidUsage, "emulated NCCL: rank 0 must be the process that made the id (world rank %d)",
                    b.root_world);
    }
    before_mpi(); // NCCL's init blocks until every rank is there: what this rank queued runs meanwhile
    int tag = 100 + (int)(b.serial % 15000u), reply = tag + 15000;
    std::vector<int> table((size_t)nranks, -1);
    if (rank == 0) {
        table[0] = me;
        for (int i = 1; i < nranks; i++) {
            int msg[2];
            PMPI_Recv(msg, 2, MPI_INT, MPI_ANY_SOURCE, tag, emu_world, MPI_STATUS_IGNORE);
            if (msg[0] <= 0 || msg[0] >= nranks || table[(size_t)msg[0]] != -1) {
                return fail(ncclInvalidUsage, "emulated NCCL: rank %d joined twice or is out of range", msg[0]);
            }
            table[(size_t)msg[0]] = msg[1];
        }
        for (int i = 1; i < nranks; i++) {
            PMPI_Send(table.data(), nranks, MPI_INT, table[(size_t)i], reply, emu_world);
        }
    } else {
        int msg[2] = {rank, me};
        PMPI_Send(msg, 2, MPI_INT, b.root_world, tag, emu_world);
        PMPI_Recv(table.data(), nranks, MPI_INT, b.root_world, reply, emu_world, MPI_STATUS_IGNORE);
    }
    MPI_Group world_group, group;
    PMPI_Comm_group(emu_world, &world_group);
    PMPI_Group_incl(world_group, nranks, table.data(), &group);
    ncclComm_t c = new ncclComm;
    PMPI_Comm_create_group(emu_world, group, tag, &c->comm);
    PMPI_Group_free(&group);
    PMPI_Group_free(&world_group);
    c->rank = rank;
    c->size = nranks;
    // NCCL refuses two ranks of a communicator on one GPU: (host, current device) must differ between ranks
    struct where_t {
        char host[64];
        int device;
    } mine = {}, *all = new where_t[(size_t)nranks];
    gethostname(mine.host, sizeof(mine.host) - 1);
    cudaGetDevice(&mine.device);
    PMPI_Allgather(&mine, (int)sizeof(mine), MPI_BYTE, all, (int)sizeof(mine), MPI_BYTE, c->comm);
    for (int i = 0; i < nranks; i++) {
        for (int j = i + 1; j < nranks; j++) {
            if (all[i].device == all[j].device && !strncmp(all[i].host, all[j].host, sizeof(all[i].host))) {
                ncclResult_t r = fail(ncclInvalidUsage, "emulated NCCL: Duplicate GPU detected: ranks %d and %d both "
                                      "on CUDA device %d of host %s", i, j, all[i].device, all[i].host);
                delete[] all;
                PMPI_Comm_free(&c->comm);
                delete c;
                return r;
            }
        }
    }
    delete[] all;
    *out = c;
    return ncclSuccess;
}

// Ops still queued on the comm run first (NCCL's destroy waits for them too).
ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (!c) {
        return ncclSuccess;
    }
    if (!mt_emu_on_worker()) {
        return ncclSuccess; // another thread may not run the ops still queued on it: the comm stays
    }
    if (mt_emu_is_worker()) { // queued ops use the comm: they run first (on the thread that queued them)
        run_before(UINT64_MAX);
    }
    if (!c->aborted.load()) {
        PMPI_Comm_free(&c->comm);
        delete c;
    }
    return ncclSuccess;
}

// An op waiting in the comm ends (its output undefined); the comm's memory stays, as an op may still hold it.
ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (c) {
        c->aborted.store(true);
    }
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *err) {
    *err = c ? (ncclResult_t)c->async_error.load() : ncclInvalidArgument;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) {
        return fail(ncclInvalidUsage, "emulated NCCL: ncclGroupEnd without ncclGroupStart");
    }
    if (--group_depth > 0) {
        return ncclSuccess;
    }
    std::vector<op_t> ops;
    ops.swap(group_ops);
    ncclResult_t err = group_error;
    group_error = ncclSuccess;
    if (err != ncclSuccess) { // as NCCL: the group's error, and none of its ops launched
        return err;
    }
    return ops.empty() ? ncclSuccess : enqueue(std::move(ops));
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t s) {
    return submit(op_t{ALL_REDUCE, send, recv, count, dt, op, 0, comm, s});
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t s) {
    return submit(op_t{REDUCE, send, recv, count, dt, op, root, comm, s});
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t dt, int root, ncclComm_t comm,
                           cudaStream_t s) {
    return submit(op_t{BROADCAST, send, recv, count, dt, ncclSum, root, comm, s});
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclComm_t comm,
                           cudaStream_t s) {
    return submit(op_t{ALL_GATHER, send, recv, count, dt, ncclSum, 0, comm, s});
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t s) {
    return submit(op_t{REDUCE_SCATTER, send, recv, count, dt, op, 0, comm, s});
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t s) {
    return submit(op_t{SEND, send, nullptr, count, dt, ncclSum, peer, comm, s});
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t s) {
    return submit(op_t{RECV, nullptr, recv, count, dt, ncclSum, peer, comm, s});
}

// ---- MPI's profiling interface: the private world at start, and the ops run before this rank blocks ----

int MPI_Init(int *argc, char ***argv) {
    int rc = PMPI_Init(argc, argv);
    if (rc == MPI_SUCCESS) {
        PMPI_Comm_dup(MPI_COMM_WORLD, &emu_world);
    }
    return rc;
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
    int rc = PMPI_Init_thread(argc, argv, required, provided);
    if (rc == MPI_SUCCESS) {
        PMPI_Comm_dup(MPI_COMM_WORLD, &emu_world);
    }
    return rc;
}

int MPI_Finalize(void) {
    before_mpi();
    if (emu_world != MPI_COMM_NULL) {
        PMPI_Comm_free(&emu_world);
    }
    return PMPI_Finalize();
}

#define BLOCKING(ret, name, params, args)                                                                              \
    ret name params {                                                                                                  \
        before_mpi();                                                                                                  \
        return P##name args;                                                                                           \
    }

BLOCKING(int, MPI_Allreduce, (const void *s, void *r, int n, MPI_Datatype t, MPI_Op o, MPI_Comm c),
         (s, r, n, t, o, c))
BLOCKING(int, MPI_Bcast, (void *b, int n, MPI_Datatype t, int root, MPI_Comm c), (b, n, t, root, c))
BLOCKING(int, MPI_Allgather, (const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, MPI_Comm c),
         (s, sn, st, r, rn, rt, c))
BLOCKING(int, MPI_Gather,
         (const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, int root, MPI_Comm c),
         (s, sn, st, r, rn, rt, root, c))
BLOCKING(int, MPI_Gatherv,
         (const void *s, int sn, MPI_Datatype st, void *r, const int *rn, const int *d, MPI_Datatype rt, int root,
          MPI_Comm c),
         (s, sn, st, r, rn, d, rt, root, c))
BLOCKING(int, MPI_Alltoall, (const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, MPI_Comm c),
         (s, sn, st, r, rn, rt, c))
BLOCKING(int, MPI_Reduce, (const void *s, void *r, int n, MPI_Datatype t, MPI_Op o, int root, MPI_Comm c),
         (s, r, n, t, o, root, c))
BLOCKING(int, MPI_Reduce_scatter_block, (const void *s, void *r, int n, MPI_Datatype t, MPI_Op o, MPI_Comm c),
         (s, r, n, t, o, c))
BLOCKING(int, MPI_Barrier, (MPI_Comm c), (c))
BLOCKING(int, MPI_Send, (const void *b, int n, MPI_Datatype t, int dst, int tag, MPI_Comm c), (b, n, t, dst, tag, c))
BLOCKING(int, MPI_Recv, (void *b, int n, MPI_Datatype t, int src, int tag, MPI_Comm c, MPI_Status *st),
         (b, n, t, src, tag, c, st))
BLOCKING(int, MPI_Sendrecv,
         (const void *sb, int sn, MPI_Datatype st, int dst, int stag, void *rb, int rn, MPI_Datatype rt, int src,
          int rtag, MPI_Comm c, MPI_Status *s),
         (sb, sn, st, dst, stag, rb, rn, rt, src, rtag, c, s))
BLOCKING(int, MPI_Wait, (MPI_Request * r, MPI_Status *s), (r, s))
BLOCKING(int, MPI_Waitall, (int n, MPI_Request r[], MPI_Status s[]), (n, r, s))
BLOCKING(int, MPI_Test, (MPI_Request * r, int *f, MPI_Status *s), (r, f, s))
BLOCKING(int, MPI_Testall, (int n, MPI_Request r[], int *f, MPI_Status s[]), (n, r, f, s))
BLOCKING(int, MPI_Iprobe, (int src, int tag, MPI_Comm c, int *f, MPI_Status *s), (src, tag, c, f, s))
BLOCKING(int, MPI_Comm_dup, (MPI_Comm c, MPI_Comm *o), (c, o))
BLOCKING(int, MPI_Comm_split, (MPI_Comm c, int color, int key, MPI_Comm *o), (c, color, key, o))
BLOCKING(int, MPI_Comm_split_type, (MPI_Comm c, int type, int key, MPI_Info i, MPI_Comm *o), (c, type, key, i, o))
BLOCKING(int, MPI_Comm_create_group, (MPI_Comm c, MPI_Group g, int tag, MPI_Comm *o), (c, g, tag, o))

} // extern "C"
