/* The NCCL backend (device memory): one ncclComm_t per group, made from a unique id that the group's
 * rank 0 broadcasts over the group's MPI communicator; every op is enqueued on the caller's stream.
 * Completion is tracked with CUDA events (the dispatcher's ring), failures with ncclCommGetAsyncError,
 * hangs end with ncclCommAbort. Plain C against nccl.h and the CUDA runtime: no kernels needed.
 * SPDX-License-Identifier: MIT */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>

#include "collectives/coll_impl.h"
#include "collectives/coll_nccl_kernels.h"
#include "runtime/alloc.h"

struct nccl_ctx {
    ncclComm_t nccl;
    int rank, size, device;
    void *scratch; /* device: all-to-all in place, barrier */
    size_t scratch_bytes;
};

static mt_status_t nccl_st(ncclResult_t r, const char *what) {
    if (r == ncclSuccess || r == ncclInProgress) {
        return MT_OK;
    }
    const char *last = ncclGetLastError(NULL);
    char msg[512];
    snprintf(msg, sizeof(msg), "%s%s%s", ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
    return mt_foreign_error("NCCL", MT_ERR_NCCL, (int)r, msg, what, __FILE__, __LINE__);
}

#define CUDA_OK(call) mt_coll_cuda_status((int)(call), #call, __FILE__, __LINE__)
#define NCCL_OK(call) nccl_st((call), #call)

static ncclDataType_t nccl_type(mt_coll_dtype_t d) {
    switch (d) {
    case MT_COLL_F32:
        return ncclFloat32;
    case MT_COLL_F64:
        return ncclFloat64;
    case MT_COLL_F16:
        return ncclFloat16;
    case MT_COLL_BF16:
        return ncclBfloat16;
    case MT_COLL_I32:
        return ncclInt32;
    case MT_COLL_I64:
        return ncclInt64;
    default:
        return ncclUint8;
    }
}

static bool is_float(mt_coll_dtype_t d) {
    return d == MT_COLL_F32 || d == MT_COLL_F64 || d == MT_COLL_F16 || d == MT_COLL_BF16;
}

/* avg: integers use ncclAvg (the sum, then a truncating division: exact); floating types a sum followed
 * by our division kernel, because ncclAvg scales each input by 1/n before summing (not the exact sum/n). */
static ncclRedOp_t nccl_op(mt_coll_dtype_t d, mt_redop_t op) {
    switch (op) {
    case MT_REDOP_AVG:
        return is_float(d) ? ncclSum : ncclAvg;
    case MT_REDOP_MAX:
        return ncclMax;
    case MT_REDOP_MIN:
        return ncclMin;
    case MT_REDOP_PROD:
        return ncclProd;
    default:
        return ncclSum;
    }
}

static mt_status_t nccl_query(const struct mt_comm_info *info, int *priority) {
    *priority = -1;
    if (info->memory != MT_COMM_MEM_DEVICE) {
        mt_error(MT_ERR_INVALID_USAGE, "nccl backend: comm %s is for host memory; NCCL needs device buffers",
                 info->name);
        MT_INFO(MT_LOG_COLL, "comm %s: nccl backend disqualified: host memory", info->name);
        return MT_OK;
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        mt_error(MT_ERR_INVALID_USAGE, "nccl backend: no CUDA device (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        MT_INFO(MT_LOG_COLL, "comm %s: nccl backend disqualified: no CUDA device", info->name);
        return MT_OK;
    }
    *priority = 80;
    return MT_OK;
}

static mt_status_t scratch_reserve(struct nccl_ctx *x, size_t bytes) {
    if (bytes <= x->scratch_bytes) {
        return MT_OK;
    }
    if (x->scratch) {
        cudaFree(x->scratch);
        mt_mem_account(MT_MEM_DEVICE, MT_MEM_COMM, -(int64_t)x->scratch_bytes, x->scratch, "coll_nccl");
        x->scratch = NULL;
        x->scratch_bytes = 0;
    }
    MT_CHECK(CUDA_OK(cudaMalloc(&x->scratch, bytes)));
    x->scratch_bytes = bytes;
    mt_mem_account(MT_MEM_DEVICE, MT_MEM_COMM, (int64_t)bytes, x->scratch, "coll_nccl");
    return MT_OK;
}

static void nccl_free(void *ctx) {
    struct nccl_ctx *x = ctx;
    if (!x) {
        return;
    }
    if (x->nccl) {
        ncclCommDestroy(x->nccl);
    }
    if (x->scratch) {
        cudaFree(x->scratch);
        mt_mem_account(MT_MEM_DEVICE, MT_MEM_COMM, -(int64_t)x->scratch_bytes, x->scratch, "coll_nccl");
    }
    mt_free(x);
}

static mt_status_t nccl_init(mt_comm_t comm, const struct mt_comm_info *info, void **ctx) {
    struct nccl_ctx *x = mt_calloc(sizeof(*x), MT_MEM_COMM, "coll_nccl");
    if (!x) {
        return mt_error(MT_ERR_OOM, "nccl backend: out of memory");
    }
    mt_status_t st = MT_OK;
    x->rank = info->rank;
    x->size = info->size;
    MT_CHECK_GOTO(CUDA_OK(cudaGetDevice(&x->device)), st, fail);
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    /* A failed ncclGetUniqueId on rank 0 is broadcast as an all-zero id plus a flag so every rank fails. */
    int ok = 1;
    if (info->rank == 0) {
        ok = ncclGetUniqueId(&id) == ncclSuccess;
    }
    MT_CHECK_GOTO(mt_coll_mpi_status(MPI_Bcast(&ok, 1, MPI_INT, 0, info->mpi), "MPI_Bcast(nccl ok)"), st, fail);
    if (!ok) {
        st = mt_error(MT_ERR_NCCL, "comm %s: ncclGetUniqueId failed on the group's rank 0", info->name);
        goto fail;
    }
    MT_CHECK_GOTO(mt_coll_mpi_status(MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, info->mpi), "MPI_Bcast(nccl id)"), st,
                  fail);
    MT_CHECK_GOTO(NCCL_OK(ncclCommInitRank(&x->nccl, info->size, id, info->rank)), st, fail);
    MT_CHECK_GOTO(scratch_reserve(x, 256), st, fail);
    MT_INFO(MT_LOG_COLL, "comm %s: NCCL communicator rank %d/%d on device %d", info->name, x->rank, x->size, x->device);
    *ctx = x;
    return MT_OK;
fail:
    nccl_free(x);
    return st;
}

static mt_status_t d2d(const void *src, void *dst, size_t bytes, mt_stream_t stream) {
    if (src == dst || bytes == 0) {
        return MT_OK;
    }
    return CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream));
}

/* The division after a floating-point sum that makes avg (no-op for other ops and integer types). */
static mt_status_t avg_fixup(struct nccl_ctx *x, void *buf, size_t count, mt_coll_dtype_t d, mt_redop_t op,
                             mt_stream_t stream) {
    if (op != MT_REDOP_AVG || !is_float(d) || x->size == 1) {
        return MT_OK;
    }
    int kind = d == MT_COLL_F32   ? MT_COLL_NCCL_DIV_F32
               : d == MT_COLL_F64 ? MT_COLL_NCCL_DIV_F64
               : d == MT_COLL_F16 ? MT_COLL_NCCL_DIV_F16
                                  : MT_COLL_NCCL_DIV_BF16;
    return CUDA_OK((cudaError_t)mt_coll_nccl_divide(buf, count, kind, x->size, stream));
}

static mt_status_t nccl_all_reduce(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                   mt_redop_t op, mt_stream_t stream) {
    struct nccl_ctx *x = ctx;
    if (x->size == 1) {
        return d2d(send, recv, count * mt_coll_dtype_size(dtype), stream);
    }
    MT_CHECK(
        NCCL_OK(ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(dtype, op), x->nccl, (cudaStream_t)stream)));
    return avg_fixup(x, recv, count, dtype, op, stream);
}

static mt_status_t nccl_reduce_scatter(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                       mt_redop_t op, mt_stream_t stream) {
    struct nccl_ctx *x = ctx;
    size_t bytes = count * mt_coll_dtype_size(dtype);
    if (x->size == 1) {
        return d2d(send, recv, bytes, stream);
    }
    void *own_block = (char *)send + bytes * (size_t)x->rank;
    void *out = recv == send ? own_block : recv; /* recv == send: NCCL in place, then moved to the start */
    MT_CHECK(NCCL_OK(
        ncclReduceScatter(send, out, count, nccl_type(dtype), nccl_op(dtype, op), x->nccl, (cudaStream_t)stream)));
    MT_CHECK(avg_fixup(x, out, count, dtype, op, stream));
    return out != recv ? d2d(out, recv, bytes, stream) : MT_OK;
}

static mt_status_t nccl_all_gather(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                   mt_stream_t stream) {
    struct nccl_ctx *x = ctx;
    size_t bytes = count * mt_coll_dtype_size(dtype);
    if (x->size == 1) {
        return d2d(send, recv, bytes, stream);
    }
    void *own_block = (char *)recv + bytes * (size_t)x->rank;
    if (send == recv && x->rank != 0) {
        MT_CHECK(d2d(send, own_block, bytes, stream)); /* blocks 0 and rank do not overlap */
        send = own_block;
    }
    return NCCL_OK(ncclAllGather(send, recv, count, nccl_type(dtype), x->nccl, (cudaStream_t)stream));
}

static mt_status_t nccl_broadcast(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                  int root, mt_stream_t stream) {
    struct nccl_ctx *x = ctx;
    if (x->size == 1) {
        return d2d(send, recv, count * mt_coll_dtype_size(dtype), stream);
    }
    return NCCL_OK(ncclBroadcast(send, recv, count, nccl_type(dtype), root, x->nccl, (cudaStream_t)stream));
}

static mt_status_t nccl_reduce(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                               mt_redop_t op, int root, mt_stream_t stream) {
    struct nccl_ctx *x = ctx;
    if (x->size == 1) {
        return d2d(send, recv, count * mt_coll_dtype_size(dtype), stream);
    }
    MT_CHECK(NCCL_OK(
        ncclReduce(send, recv, count, nccl_type(dtype), nccl_op(dtype, op), root, x->nccl, (cudaStream_t)stream)));
    return x->rank == root ? avg_fixup(x, recv, count, dtype, op, stream) : MT_OK;
}

/* All-to-all as one group of sends and receives; in place goes through the scratch copy of send. */
static mt_status_t nccl_all_to_all(void *ctx, const void *send, void *recv, size_t count, mt_coll_dtype_t dtype,
                                   mt_stream_t stream) {
    struct nccl_ctx *x = ctx;
    size_t bytes = count * mt_coll_dtype_size(dtype);
    if (x->size == 1) {
        return d2d(send, recv, bytes, stream);
    }
    if (send == recv && bytes) {
        MT_CHECK(scratch_reserve(x, bytes * (size_t)x->size));
        MT_CHECK(d2d(send, x->scratch, bytes * (size_t)x->size, stream));
        send = x->scratch;
    }
    cudaStream_t s = (cudaStream_t)stream;
    MT_CHECK(NCCL_OK(ncclGroupStart()));
    mt_status_t st = MT_OK;
    for (int p = 0; p < x->size && st == MT_OK; p++) {
        st = NCCL_OK(ncclSend((const char *)send + bytes * (size_t)p, count, nccl_type(dtype), p, x->nccl, s));
        if (st == MT_OK) {
            st = NCCL_OK(ncclRecv((char *)recv + bytes * (size_t)p, count, nccl_type(dtype), p, x->nccl, s));
        }
    }
    mt_status_t st2 = NCCL_OK(ncclGroupEnd());
    return st != MT_OK ? st : st2;
}

static mt_status_t nccl_send(void *ctx, const void *buf, size_t count, mt_coll_dtype_t dtype, int peer,
                             mt_stream_t stream) {
    struct nccl_ctx *x = ctx;
    return NCCL_OK(ncclSend(buf, count, nccl_type(dtype), peer, x->nccl, (cudaStream_t)stream));
}

static mt_status_t nccl_recv(void *ctx, void *buf, size_t count, mt_coll_dtype_t dtype, int peer, mt_stream_t stream) {
    struct nccl_ctx *x = ctx;
    return NCCL_OK(ncclRecv(buf, count, nccl_type(dtype), peer, x->nccl, (cudaStream_t)stream));
}

static mt_status_t nccl_group_start(void *ctx) {
    return NCCL_OK(ncclGroupStart());
}

static mt_status_t nccl_group_end(void *ctx, mt_stream_t stream) {
    return NCCL_OK(ncclGroupEnd());
}

/* A 1-element all-reduce on the scratch buffer: ordered on stream like everything else. */
static mt_status_t nccl_barrier(void *ctx, mt_stream_t stream) {
    struct nccl_ctx *x = ctx;
    if (x->size == 1) {
        return MT_OK;
    }
    return NCCL_OK(ncclAllReduce(x->scratch, x->scratch, 1, ncclInt32, ncclSum, x->nccl, (cudaStream_t)stream));
}

static mt_status_t nccl_event_record(void *ctx, mt_stream_t stream, void **event) {
    cudaEvent_t ev;
    MT_CHECK(CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)));
    mt_status_t st = CUDA_OK(cudaEventRecord(ev, (cudaStream_t)stream));
    if (st != MT_OK) {
        cudaEventDestroy(ev);
        return st;
    }
    *event = ev;
    return MT_OK;
}

static mt_status_t nccl_get_async_error(void *ctx) {
    struct nccl_ctx *x = ctx;
    ncclResult_t r = ncclSuccess;
    if (!x->nccl) {
        return MT_OK;
    }
    MT_CHECK(NCCL_OK(ncclCommGetAsyncError(x->nccl, &r)));
    return NCCL_OK(r);
}

/* Makes the comm's device current on this thread. The watchdog's thread polls events and never chose a
 * device: its first CUDA call would otherwise create a context on device 0, hundreds of MiB on another
 * rank's GPU for every rank of the node (cudaGetDevice itself creates none; cudaSetDevice to the device
 * this process already uses shares its primary context). */
static void use_device(const struct nccl_ctx *x) {
    int d = -1;
    if (x && cudaGetDevice(&d) == cudaSuccess && d != x->device) {
        cudaSetDevice(x->device);
    }
}

static mt_status_t nccl_event_query(void *ctx, void *event, bool *done) {
    use_device(ctx);
    cudaError_t e = cudaEventQuery((cudaEvent_t)event);
    if (e == cudaSuccess) {
        *done = true;
        return MT_OK;
    }
    *done = false;
    if (e != cudaErrorNotReady) {
        return CUDA_OK(e);
    }
    /* CUDA keeps "not ready" as this thread's last error, which the next kernel launcher would return as its
     * own failure (its cudaGetLastError): an answer, not an error, so cleared */
    (void)cudaGetLastError();
    return nccl_get_async_error(ctx); /* a failed peer shows up here while the event never fires */
}

static void nccl_event_free(void *ctx, void *event) {
    use_device(ctx);
    cudaEventDestroy((cudaEvent_t)event);
}

static mt_status_t nccl_abort(void *ctx) {
    struct nccl_ctx *x = ctx;
    if (!x->nccl) {
        return MT_OK;
    }
    use_device(x); /* the watchdog's thread aborts a hung comm */
    mt_status_t st = NCCL_OK(ncclCommAbort(x->nccl));
    x->nccl = NULL;
    return st;
}

const struct mt_coll_backend mt_coll_backend_nccl = {
    .name = "nccl",
    .api_version = MT_COLL_API_VERSION,
    .stream_ordered = true,
    .query = nccl_query,
    .init = nccl_init,
    .free = nccl_free,
    .all_reduce = nccl_all_reduce,
    .reduce_scatter = nccl_reduce_scatter,
    .all_gather = nccl_all_gather,
    .broadcast = nccl_broadcast,
    .reduce = nccl_reduce,
    .all_to_all = nccl_all_to_all,
    .send = nccl_send,
    .recv = nccl_recv,
    .group_start = nccl_group_start,
    .group_end = nccl_group_end,
    .barrier = nccl_barrier,
    .event_record = nccl_event_record,
    .event_query = nccl_event_query,
    .event_free = nccl_event_free,
    .get_async_error = nccl_get_async_error,
    .abort = nccl_abort,
};
