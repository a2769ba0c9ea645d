/* The staged backend (device memory without NCCL): each op copies its device input into pinned host memory
 * on the caller's stream, waits for that copy, runs the MPI backend's op on the host copy and enqueues the
 * copy of the result back on the stream, so, as with NCCL, the result is there in the stream's order (the
 * completion event is a CUDA event recorded after that copy) and the host does not wait for it; the next op
 * of the comm does, before it reuses the memory. A collective runs in pieces of at most MESHTRAIN_STAGED_CHUNK
 * bytes of pinned memory (the smallest any rank of the comm asked for), two in flight: piece j+1's copy down is
 * enqueued before the host reduces piece j, so PCIe copies and the host's MPI work overlap, and a comm pins
 * two pieces whatever its ops' sizes (more only where a piece cannot hold one element per rank). It serves
 * ranks that share a GPU (NCCL refuses two ranks of a communicator on one device), builds or machines
 * without NCCL, and the tests of the GPU engine's communication on a one-GPU machine. It costs two copies
 * over PCIe and a host reduction per op: NCCL (priority 80) wins wherever both qualify.
 * SPDX-License-Identifier: MIT */
#include <cuda_runtime.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "collectives/coll_impl.h"
#include "runtime/alloc.h"

/* A send or receive posted between group_start and group_end, run at group_end. */
struct staged_p2p {
    bool is_send;
    void *dev;
    size_t count;
    mt_coll_dtype_t dtype;
    int peer;
};

struct staged_ctx {
    void *mpi; /* the MPI backend's context on the same communicator */
    int rank, size, device;
    unsigned char *host; /* pinned staging buffer */
    size_t cap;
    size_t piece;        /* pinned bytes per piece of a collective, the same on every rank */
    size_t max_pitch;    /* the device's largest 2D-copy pitch (cudaDevAttrMaxPitch) */
    cudaEvent_t in_ev[2]; /* recorded after each slot's copy down */
    cudaEvent_t out_ev;  /* recorded after the last op's copy out of host */
    bool out_pending;    /* that copy may still be reading host */
    bool in_group;
    struct staged_p2p *ops;
    int n_ops, cap_ops;
};

static const struct mt_coll_backend *const mpi = &mt_coll_backend_mpi;

/* Pinned bytes per piece of a collective (two pieces in flight); below 4 KiB it is 4 KiB, above 1 GiB 1 GiB. */
MT_PARAM(staged_chunk, "STAGED_CHUNK", 8 << 20)

mt_status_t mt_coll_cuda_status(int err, const char *what, const char *file, int line) {
    if (err == (int)cudaSuccess) {
        return MT_OK;
    }
    return mt_foreign_error("CUDA", MT_ERR_CUDA, err, cudaGetErrorString((cudaError_t)err), what, file, line);
}

#define CUDA_OK(call) mt_coll_cuda_status((int)(call), #call, __FILE__, __LINE__)

static mt_status_t staged_query(const struct mt_comm_info *info, int *priority) {
    *priority = -1;
    if (info->memory != MT_COMM_MEM_DEVICE) {
        mt_error(MT_ERR_INVALID_USAGE, "staged backend: comm %s is for host memory; use the mpi backend", info->name);
        MT_INFO(MT_LOG_COLL, "comm %s: staged backend disqualified: host memory", info->name);
        return MT_OK;
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        mt_error(MT_ERR_INVALID_USAGE, "staged backend: no CUDA device (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        MT_INFO(MT_LOG_COLL, "comm %s: staged backend disqualified: no CUDA device", info->name);
        return MT_OK;
    }
    *priority = 20;
    return MT_OK;
}

static void release_host(struct staged_ctx *x) {
    if (x->host) {
        cudaFreeHost(x->host);
        mt_mem_account(MT_MEM_HOST, MT_MEM_COMM, -(int64_t)x->cap, x->host, "coll_staged");
        x->host = NULL;
        x->cap = 0;
    }
}

/* The host buffer is free: the last op's copy out of it has run. */
static mt_status_t out_wait(struct staged_ctx *x) {
    if (!x->out_pending) {
        return MT_OK;
    }
    MT_CHECK(CUDA_OK(cudaEventSynchronize(x->out_ev)));
    x->out_pending = false;
    return MT_OK;
}

/* At least bytes of pinned staging memory (grown by doubling, never shrunk until the comm is freed), free to
 * be written. */
static mt_status_t reserve(struct staged_ctx *x, size_t bytes) {
    MT_CHECK(out_wait(x));
    if (bytes <= x->cap) {
        return MT_OK;
    }
    size_t want = MT_MAX(bytes, 2 * x->cap);
    want = MT_MAX(want, (size_t)1 << 16);
    release_host(x);
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, want);
    if (e != cudaSuccess) {
        return mt_error(MT_ERR_OOM, "staged backend: cannot pin %zu bytes of host memory for staging: %s", want,
                        cudaGetErrorString(e));
    }
    x->host = p;
    x->cap = want;
    mt_mem_account(MT_MEM_HOST, MT_MEM_COMM, (int64_t)want, p, "coll_staged");
    return MT_OK;
}

static mt_status_t down(void *host, const void *dev, size_t bytes, mt_stream_t stream) {
    return bytes ? CUDA_OK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream)) : MT_OK;
}

static mt_status_t up(void *dev, const void *host, size_t bytes, mt_stream_t stream) {
    return bytes ? CUDA_OK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream)) : MT_OK;
}

static mt_status_t sync(mt_stream_t stream) {
    return CUDA_OK(cudaStreamSynchronize((cudaStream_t)stream));
}

static void staged_free(void *ctx) {
    struct staged_ctx *x = ctx;
    if (!x) {
        return;
    }
    if (x->out_ev) {
        out_wait(x);
        cudaEventDestroy(x->out_ev);
    }
    for (int i = 0; i < 2; i++) {
        if (x->in_ev[i]) {
            cudaEventSynchronize(x->in_ev[i]); /* a failed op may leave a copy down in flight */
            cudaEventDestroy(x->in_ev[i]);
        }
    }
    release_host(x);
    if (x->mpi) {
        mpi->free(x->mpi);
    }
    mt_free(x->ops);
    mt_free(x);
}

static mt_status_t staged_init(mt_comm_t comm, const struct mt_comm_info *info, void **ctx) {
    struct staged_ctx *x = mt_calloc(sizeof(*x), MT_MEM_COMM, "coll_staged");
    if (!x) {
        return mt_error(MT_ERR_OOM, "staged backend: out of memory");
    }
    mt_status_t st = MT_OK;
    x->rank = info->rank;
    x->size = info->size;
    /* this rank's own set-up, then one all-reduce every rank reaches whatever happened (on the comm's MPI
     * communicator itself, so that it does not depend on the MPI backend's set-up either): a rank that failed
     * makes all fail, none is left waiting in a collective, and the ranks agree on the piece size, so they
     * cut every op into the same pieces (the smallest any rank asked for) */
    mt_status_t mine = mpi->init(comm, info, &x->mpi);
    mine = mine != MT_OK ? mine : CUDA_OK(cudaGetDevice(&x->device));
    mine = mine != MT_OK ? mine : CUDA_OK(cudaEventCreateWithFlags(&x->out_ev, cudaEventDisableTiming));
    for (int i = 0; i < 2 && mine == MT_OK; i++) {
        mine = CUDA_OK(cudaEventCreateWithFlags(&x->in_ev[i], cudaEventDisableTiming));
    }
    char why[256] = "";
    if (mine != MT_OK) {
        snprintf(why, sizeof(why), "%s", mt_last_error_msg());
    }
    int mp = 0;
    if (mine == MT_OK && cudaDeviceGetAttribute(&mp, cudaDevAttrMaxPitch, x->device) != cudaSuccess) {
        mp = 0;
        (void)cudaGetLastError(); /* INT_MAX below: not the next kernel launch's error */
    }
    x->max_pitch = mp > 0 ? (size_t)mp : (size_t)INT_MAX;
    int64_t piece = MT_MIN(MT_MAX(mt_param_staged_chunk(), (int64_t)4096), (int64_t)1 << 30);
    int64_t agree[2] = {mine != MT_OK, -piece}; /* by MAX: any rank failed; the smallest piece */
    int mrc = MPI_Allreduce(MPI_IN_PLACE, agree, 2, MPI_INT64_T, MPI_MAX, info->mpi);
    if (mine != MT_OK) {
        st = mt_error(mine, "staged backend: comm %s rank %d: %s", info->name, x->rank, why);
        goto fail;
    }
    if (mrc != MPI_SUCCESS) {
        st = mt_error(MT_ERR_MPI, "staged backend: comm %s rank %d: MPI_Allreduce of the set-up agreement failed "
                      "(error %d)", info->name, x->rank, mrc);
        goto fail;
    }
    if (agree[0]) {
        st = mt_error(MT_ERR_REMOTE, "staged backend: comm %s: another rank could not set up its staging (its log "
                      "says why)", info->name);
        goto fail;
    }
    x->piece = (size_t)-agree[1];
    MT_INFO(MT_LOG_COLL, "comm %s: staged (MPI through pinned host memory) rank %d/%d on device %d, pieces of %zu "
            "bytes", info->name, x->rank, x->size, x->device, x->piece);
    *ctx = x;
    return MT_OK;
fail:
    staged_free(x);
    return st;
}

/* Room for `room` pinned bytes, then bytes of the device's src copied to x->host + at once everything enqueued
 * on stream before it has run. */
static mt_status_t stage_in(struct staged_ctx *x, size_t room, size_t at, const void *src, size_t bytes,
                            mt_stream_t stream) {
    MT_CHECK(reserve(x, room));
    MT_CHECK(down(x->host + at, src, bytes, stream));
    return sync(stream);
}

/* After the copies out of host were enqueued on stream: the event the next op waits for (if it cannot be
 * recorded, the stream is synchronised instead, so the buffer is free all the same). */
static mt_status_t out_mark(struct staged_ctx *x, mt_stream_t stream) {
    mt_status_t st = CUDA_OK(cudaEventRecord(x->out_ev, (cudaStream_t)stream));
    if (st != MT_OK) {
        cudaStreamSynchronize((cudaStream_t)stream);
        x->out_pending = false;
    }
    return st;
}

/* bytes at x->host + at copied to the device's dst in stream's order; the next op waits for the copy before
 * it writes host again (out_wait). */
static mt_status_t stage_out(struct staged_ctx *x, void *dst, size_t at, size_t bytes, mt_stream_t stream) {
    x->out_pending = true; /* from the first copy's enqueue on */
    MT_CHECK(up(dst, x->host + at, bytes, stream));
    return out_mark(x, stream);
}

/* A collective in pieces. Piece j covers elements [j*per, min(count, (j+1)*per)) of every rank's block of
 * count elements (the whole buffer for all_reduce, broadcast and reduce); its pinned slot holds `factor`
 * such runs (reduce_scatter: the size input runs, then the result; all_gather: the gathered runs, then this
 * rank's; all_to_all: the size input runs, then the size output runs; reduce: input, then result). A piece
 * reads and writes only its own element range of each block, so every in-place form stays correct however
 * the pieces interleave. */
struct pieces {
    mt_coll_kind_t kind;
    const unsigned char *send;
    unsigned char *recv;
    size_t count, esize, block; /* block = count * esize: the pitch between ranks' blocks */
    mt_coll_dtype_t dtype;
    mt_redop_t op;
    int root;
};

/* rows runs of width bytes, one per rank's block, in stream order: one 2D copy, or a copy per row where a pitch
 * exceeds what a 2D copy takes (blocks over 2 GiB). */
static mt_status_t copy2d(const struct staged_ctx *x, void *dst, size_t dpitch, const void *src, size_t spitch,
                          size_t width, size_t rows, bool to_host, mt_stream_t stream) {
    if (!width || !rows) {
        return MT_OK;
    }
    cudaStream_t s = (cudaStream_t)stream;
    int kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice; /* an enum without a typedef in C */
    if (MT_MAX(dpitch, spitch) > x->max_pitch) {
        for (size_t r = 0; r < rows; r++) {
            MT_CHECK(CUDA_OK(
                cudaMemcpyAsync((char *)dst + r * dpitch, (const char *)src + r * spitch, width, kind, s)));
        }
        return MT_OK;
    }
    return CUDA_OK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, kind, s));
}

static size_t piece_factor(const struct staged_ctx *x, mt_coll_kind_t kind) {
    switch (kind) {
    case MT_COLL_REDUCE_SCATTER:
    case MT_COLL_ALL_GATHER:
        return (size_t)x->size + 1;
    case MT_COLL_ALL_TO_ALL:
        return 2 * (size_t)x->size;
    case MT_COLL_REDUCE:
        return 2;
    default:
        return 1;
    }
}

/* The piece [off, off + len) elements copied from the device into slot h, in stream order. */
static mt_status_t piece_in(const struct staged_ctx *x, const struct pieces *p, unsigned char *h, size_t off,
                            size_t len, mt_stream_t stream) {
    if (!len) {
        return MT_OK;
    }
    size_t o = off * p->esize, b = len * p->esize, n = (size_t)x->size;
    switch (p->kind) {
    case MT_COLL_REDUCE_SCATTER:
    case MT_COLL_ALL_TO_ALL:
        return copy2d(x, h, b, p->send + o, p->block, b, n, true, stream);
    case MT_COLL_ALL_GATHER:
        return down(h + n * b, p->send + o, b, stream);
    case MT_COLL_BROADCAST:
        return x->rank == p->root ? down(h, p->send + o, b, stream) : MT_OK;
    default: /* all_reduce, reduce */
        return down(h, p->send + o, b, stream);
    }
}

/* The MPI backend's op on the piece in slot h. */
static mt_status_t piece_host(const struct staged_ctx *x, const struct pieces *p, unsigned char *h, size_t len) {
    size_t b = len * p->esize, n = (size_t)x->size;
    switch (p->kind) {
    case MT_COLL_ALL_REDUCE:
        return mpi->all_reduce(x->mpi, h, h, len, p->dtype, p->op, NULL);
    case MT_COLL_REDUCE:
        return mpi->reduce(x->mpi, h, h + b, len, p->dtype, p->op, p->root, NULL);
    case MT_COLL_BROADCAST:
        return mpi->broadcast(x->mpi, h, h, len, p->dtype, p->root, NULL);
    case MT_COLL_REDUCE_SCATTER:
        return mpi->reduce_scatter(x->mpi, h, h + n * b, len, p->dtype, p->op, NULL);
    case MT_COLL_ALL_GATHER:
        return mpi->all_gather(x->mpi, h + n * b, h, len, p->dtype, NULL);
    case MT_COLL_ALL_TO_ALL:
        return mpi->all_to_all(x->mpi, h, h + n * b, len, p->dtype, NULL);
    default:
        return mt_error(MT_ERR_INTERNAL, "staged backend: op kind %d is not a collective", (int)p->kind);
    }
}

/* The piece's result copied from slot h to the device, in stream order. */
static mt_status_t piece_out(const struct staged_ctx *x, const struct pieces *p, const unsigned char *h, size_t off,
                             size_t len, mt_stream_t stream) {
    if (!len) {
        return MT_OK;
    }
    size_t o = off * p->esize, b = len * p->esize, n = (size_t)x->size;
    switch (p->kind) {
    case MT_COLL_REDUCE:
        return x->rank == p->root ? up(p->recv + o, h + b, b, stream) : MT_OK;
    case MT_COLL_REDUCE_SCATTER:
        return up(p->recv + o, h + n * b, b, stream);
    case MT_COLL_ALL_GATHER:
        return copy2d(x, p->recv + o, p->block, h, b, b, n, false, stream);
    case MT_COLL_ALL_TO_ALL:
        return copy2d(x, p->recv + o, p->block, h + n * b, b, b, n, false, stream);
    default: /* all_reduce, broadcast */
        return up(p->recv + o, h, b, stream);
    }
}

/* The op, piece by piece through two slots: piece j+1 is copied down (after piece j-1's copy up out of the
 * same slot, by the stream's order) while the host runs piece j. Each rank cuts the same pieces (x->piece
 * is agreed at init), so the MPI calls match. A zero-count op is one empty piece: one MPI call, as before. */
static mt_status_t run_pieces(struct staged_ctx *x, const struct pieces *p, mt_stream_t stream) {
    size_t factor = piece_factor(x, p->kind), unit = p->esize * factor;
    size_t per = MT_MAX((size_t)1, x->piece / unit);
    size_t n = p->count ? (p->count + per - 1) / per : 1;
    size_t slot = n == 1 ? p->count * unit : (per * unit + 63) & ~(size_t)63;
    MT_CHECK(reserve(x, MT_MAX((size_t)1, n == 1 ? slot : 2 * slot)));
    x->out_pending = true; /* from the first copy's enqueue on; out_mark clears it where it cannot record */
    mt_status_t st = MT_OK;
    MT_CHECK_GOTO(piece_in(x, p, x->host, 0, MT_MIN(per, p->count), stream), st, done);
    MT_CHECK_GOTO(CUDA_OK(cudaEventRecord(x->in_ev[0], (cudaStream_t)stream)), st, done);
    for (size_t j = 0; j < n; j++) {
        unsigned char *h = x->host + (j & 1) * slot;
        size_t off = j * per, len = MT_MIN(per, p->count - MT_MIN(off, p->count));
        if (j + 1 < n) {
            size_t off1 = off + per, len1 = MT_MIN(per, p->count - off1);
            MT_CHECK_GOTO(piece_in(x, p, x->host + ((j + 1) & 1) * slot, off1, len1, stream), st, done);
            MT_CHECK_GOTO(CUDA_OK(cudaEventRecord(x->in_ev[(j + 1) & 1], (cudaStream_t)stream)), st, done);
        }
        MT_CHECK_GOTO(CUDA_OK(cudaEventSynchronize(x->in_ev[j & 1])), st, done);
        MT_CHECK_GOTO(piece_host(x, p, h, len), st, done);
        MT_CHECK_GOTO(piece_out(x, p, h, off, len, stream), st, done);
    }
done:; /* even after a failure, the next op waits for what was enqueued here before it reuses the buffer */
    mt_status_t st2 = out_mark(x, stream);
    return st != MT_OK ? st : st2;
}

static mt_status_t staged_all_reduce(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                     mt_redop_t op, mt_stream_t stream) {
    size_t es = mt_coll_dtype_size(dtype);
    struct pieces p = {MT_COLL_ALL_REDUCE, send, recv, count, es, count * es, dtype, op, 0};
    return run_pieces(ctx, &p, stream);
}

static mt_status_t staged_reduce_scatter(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                         mt_redop_t op, mt_stream_t stream) {
    size_t es = mt_coll_dtype_size(dtype);
    struct pieces p = {MT_COLL_REDUCE_SCATTER, send, recv, count, es, count * es, dtype, op, 0};
    return run_pieces(ctx, &p, stream);
}

static mt_status_t staged_all_gather(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                     mt_stream_t stream) {
    size_t es = mt_coll_dtype_size(dtype);
    struct pieces p = {MT_COLL_ALL_GATHER, send, recv, count, es, count * es, dtype, MT_REDOP_SUM, 0};
    return run_pieces(ctx, &p, stream);
}

/* send is read on root only. */
static mt_status_t staged_broadcast(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                    int root, mt_stream_t stream) {
    size_t es = mt_coll_dtype_size(dtype);
    struct pieces p = {MT_COLL_BROADCAST, send, recv, count, es, count * es, dtype, MT_REDOP_SUM, root};
    return run_pieces(ctx, &p, stream);
}

/* recv is written on root only. */
static mt_status_t staged_reduce(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                 mt_redop_t op, int root, mt_stream_t stream) {
    size_t es = mt_coll_dtype_size(dtype);
    struct pieces p = {MT_COLL_REDUCE, send, recv, count, es, count * es, dtype, op, root};
    return run_pieces(ctx, &p, stream);
}

static mt_status_t staged_all_to_all(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                     mt_stream_t stream) {
    size_t es = mt_coll_dtype_size(dtype);
    struct pieces p = {MT_COLL_ALL_TO_ALL, send, recv, count, es, count * es, dtype, MT_REDOP_SUM, 0};
    return run_pieces(ctx, &p, stream);
}

static mt_status_t post(struct staged_ctx *x, bool is_send, const void *buf, size_t count, mt_coll_dtype_t dtype,
                        int peer) {
    if (x->n_ops == x->cap_ops) {
        int cap = x->cap_ops ? 2 * x->cap_ops : 8;
        struct staged_p2p *ops = mt_alloc(sizeof(*ops) * (size_t)cap, MT_MEM_COMM, "coll_staged");
        if (!ops) {
            return mt_error(MT_ERR_OOM, "staged backend: cannot grow the group of %d calls", x->n_ops);
        }
        if (x->n_ops) {
            memcpy(ops, x->ops, sizeof(*ops) * (size_t)x->n_ops);
        }
        mt_free(x->ops);
        x->ops = ops;
        x->cap_ops = cap;
    }
    x->ops[x->n_ops++] = (struct staged_p2p){is_send, (void *)buf, count, dtype, peer};
    return MT_OK;
}

static mt_status_t staged_send(void *ctx, const void *buf, size_t count, mt_coll_dtype_t dtype, int peer,
                               mt_stream_t stream) {
    struct staged_ctx *x = ctx;
    if (x->in_group) {
        return post(x, true, buf, count, dtype, peer);
    }
    size_t bytes = count * mt_coll_dtype_size(dtype);
    MT_CHECK(stage_in(x, bytes, 0, buf, bytes, stream));
    return mpi->send(x->mpi, x->host, count, dtype, peer, NULL);
}

static mt_status_t staged_recv(void *ctx, void *buf, size_t count, mt_coll_dtype_t dtype, int peer,
                               mt_stream_t stream) {
    struct staged_ctx *x = ctx;
    if (x->in_group) {
        return post(x, false, buf, count, dtype, peer);
    }
    size_t bytes = count * mt_coll_dtype_size(dtype);
    MT_CHECK(reserve(x, bytes));
    MT_CHECK(mpi->recv(x->mpi, x->host, count, dtype, peer, NULL));
    return stage_out(x, buf, 0, bytes, stream);
}

static mt_status_t staged_group_start(void *ctx) {
    struct staged_ctx *x = ctx;
    x->in_group = true;
    x->n_ops = 0;
    return MT_OK;
}

static size_t slot_bytes(const struct staged_p2p *o) {
    return (o->count * mt_coll_dtype_size(o->dtype) + 63) & ~(size_t)63;
}

/* Every posted send staged down, all of them posted to MPI together (MPI's group: no order between peers
 * can deadlock), then every receive copied up. */
static mt_status_t staged_group_end(void *ctx, mt_stream_t stream) {
    struct staged_ctx *x = ctx;
    int n = x->n_ops;
    x->in_group = false;
    x->n_ops = 0;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        total += slot_bytes(&x->ops[i]);
    }
    MT_CHECK(reserve(x, total));
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (x->ops[i].is_send) {
            MT_CHECK(down(x->host + off, x->ops[i].dev, x->ops[i].count * mt_coll_dtype_size(x->ops[i].dtype), stream));
        }
        off += slot_bytes(&x->ops[i]);
    }
    MT_CHECK(sync(stream));
    MT_CHECK(mpi->group_start(x->mpi));
    mt_status_t st = MT_OK;
    off = 0;
    for (int i = 0; i < n && st == MT_OK; i++) {
        const struct staged_p2p *o = &x->ops[i];
        st = o->is_send ? mpi->send(x->mpi, x->host + off, o->count, o->dtype, o->peer, NULL)
                        : mpi->recv(x->mpi, x->host + off, o->count, o->dtype, o->peer, NULL);
        off += slot_bytes(o);
    }
    mt_status_t st2 = mpi->group_end(x->mpi, NULL); /* always: it completes what was posted */
    MT_CHECK(st != MT_OK ? st : st2);
    off = 0;
    x->out_pending = true;
    for (int i = 0; i < n; i++) {
        if (!x->ops[i].is_send) {
            MT_CHECK(up(x->ops[i].dev, x->host + off, x->ops[i].count * mt_coll_dtype_size(x->ops[i].dtype), stream));
        }
        off += slot_bytes(&x->ops[i]);
    }
    return out_mark(x, stream);
}

/* Everything before it on stream has run, then every rank has arrived. */
static mt_status_t staged_barrier(void *ctx, mt_stream_t stream) {
    struct staged_ctx *x = ctx;
    MT_CHECK(sync(stream));
    return mpi->barrier(x->mpi, NULL);
}

/* The device the comm was created on, current on the calling thread (the watchdog's thread polls events). */
static void use_device(const struct staged_ctx *x) {
    int d = -1;
    if (x && cudaGetDevice(&d) == cudaSuccess && d != x->device) {
        cudaSetDevice(x->device);
    }
}

/* An op's host part is done when it returns; its copy out runs in the stream's order: a CUDA event after it. */
static mt_status_t staged_event_record(void *ctx, mt_stream_t stream, void **event) {
    cudaEvent_t ev = NULL;
    MT_CHECK(CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)));
    mt_status_t st = CUDA_OK(cudaEventRecord(ev, (cudaStream_t)stream));
    if (st != MT_OK) {
        cudaEventDestroy(ev);
        return st;
    }
    *event = ev;
    return MT_OK;
}

static mt_status_t staged_event_query(void *ctx, void *event, bool *done) {
    use_device(ctx);
    cudaError_t e = cudaEventQuery((cudaEvent_t)event);
    *done = e == cudaSuccess;
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError(); /* an answer, not an error: see nccl_event_query */
        return MT_OK;
    }
    return CUDA_OK(e);
}

static void staged_event_free(void *ctx, void *event) {
    use_device(ctx);
    cudaEventDestroy((cudaEvent_t)event);
}

const struct mt_coll_backend mt_coll_backend_staged = {
    .name = "staged",
    .api_version = MT_COLL_API_VERSION,
    .stream_ordered = true,
    .query = staged_query,
    .init = staged_init,
    .free = staged_free,
    .all_reduce = staged_all_reduce,
    .reduce_scatter = staged_reduce_scatter,
    .all_gather = staged_all_gather,
    .broadcast = staged_broadcast,
    .reduce = staged_reduce,
    .all_to_all = staged_all_to_all,
    .send = staged_send,
    .recv = staged_recv,
    .group_start = staged_group_start,
    .group_end = staged_group_end,
    .barrier = staged_barrier,
    .event_record = staged_event_record,
    .event_query = staged_event_query,
    .event_free = staged_event_free,
};
