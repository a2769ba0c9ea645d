// The CPU emulator behind the headers of this directory (see cuda_runtime.h): runtime API over host memory,
// kernel launches whose block threads are fibers (ucontext) scheduled round-robin on the calling thread and
// switched at __syncthreads and warp shuffles (a thread that returns counts as arrived, as on sm_70+),
// shuffles through double per-thread slots and one group barrier, and the cuBLASLt matmul subset. Streams are
// lazy queues (below: work runs when something waits for it) or, not lazy, every launch and copy completes
// before it returns; an event keeps the host time its record ran at, so elapsed times are the emulation's.
// Test-only.
// SPDX-License-Identifier: MIT
#include <atomic>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucontext.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "cublasLt.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

dim3 threadIdx, blockIdx, blockDim, gridDim;

#ifndef MT_EMU_LAZY_DEFAULT
#define MT_EMU_LAZY_DEFAULT 0
#endif

void mt_emu_pin(void *p, size_t bytes, bool add); /* pinned host memory (streams, below) */

/* ---- runtime API ---- */

static std::mutex mem_mu;
static std::map<void *, size_t> allocs;
static size_t held;

extern "C" {
/* Calls that create, touch or order device state (allocation, copies, sets, streams, events, launches,
 * cuBLASLt handles), for tests that a code path makes none (mt_emu_api_calls). */
static std::atomic<size_t> emu_api_calls;
size_t mt_emu_api_calls(void) {
    return emu_api_calls.load();
}
static std::atomic<size_t> host_waits[MT_EMU_WAIT_KINDS];
static thread_local int wait_depth; /* inside a counted wait (or a poll): inner waits are not counted */
size_t mt_emu_host_waits(int kind) {
    return kind >= 0 && kind < MT_EMU_WAIT_KINDS ? host_waits[kind].load() : 0;
}
static std::atomic<size_t> kernel_launches, matmuls, copy_bytes[cudaMemcpyDefault + 1];
size_t mt_emu_kernel_launches(void) {
    return kernel_launches.load();
}
size_t mt_emu_matmuls(void) {
    return matmuls.load();
}
size_t mt_emu_copy_bytes(int kind) {
    return kind >= 0 && kind <= cudaMemcpyDefault ? copy_bytes[kind].load() : 0;
}
static void copied(cudaMemcpyKind k, size_t bytes) {
    if (k >= 0 && k <= cudaMemcpyDefault) {
        copy_bytes[k] += bytes;
    }
}
namespace {
struct host_wait { /* kind < 0: a poll, or a call CUDA returns from at once: its inner synchronisation is no wait */
    explicit host_wait(int kind) {
        if (wait_depth++ == 0 && kind >= 0) {
            host_waits[kind]++;
        }
    }
    ~host_wait() {
        wait_depth--;
    }
};
} // namespace
/* Emulated devices: 1, or MESHTRAIN_EMU_DEVICES (1-64), for the emulated NCCL (emu_nccl.cpp: one device per
 * rank, as NCCL wants). They share one memory, this process's. */
static int emu_devices() {
    static int n = 0;
    if (n == 0) {
        const char *e = getenv("MESHTRAIN_EMU_DEVICES");
        int v = e && *e ? atoi(e) : 1;
        n = v < 1 ? 1 : v > 64 ? 64 : v;
    }
    return n;
}
static thread_local int current_device; /* per thread, as CUDA's */
cudaError_t cudaGetDeviceCount(int *n) {
    *n = emu_devices();
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    *d = current_device;
    return cudaSuccess;
}
/* As CUDA: each thread's last error, set by every call that returns one (a poll's cudaErrorNotReady too),
 * returned and cleared by cudaGetLastError, which the kernel launchers return after their launch. */
static thread_local cudaError_t last_error = cudaSuccess;
static cudaError_t fail(cudaError_t e) {
    last_error = e;
    return e;
}
cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) {
    return last_error;
}
const char *cudaGetErrorString(cudaError_t e) {
    return e == cudaSuccess                 ? "no error"
           : e == cudaErrorMemoryAllocation ? "out of memory"
           : e == cudaErrorNotReady         ? "device not ready"
           : e == cudaErrorInvalidConfiguration ? "invalid configuration argument"
                                            : "emulated error";
}
cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int dev) {
    if (dev < 0 || dev >= emu_devices()) {
        return fail(cudaErrorInvalidValue);
    }
    snprintf(bus, (size_t)len, "0000:%02x:00.0", dev);
    return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t bytes) {
    emu_api_calls++;
    if (bytes > ((size_t)64 << 30)) { /* the emulated device has 64 GiB */
        *p = NULL;
        return fail(cudaErrorMemoryAllocation);
    }
    if (posix_memalign(p, 256, bytes ? bytes : 1) != 0) {
        return fail(cudaErrorMemoryAllocation);
    }
    memset(*p, 0xa5, bytes); /* uninitialised device memory is garbage, not zeros */
    std::lock_guard<std::mutex> g(mem_mu);
    allocs[*p] = bytes;
    held += bytes;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    emu_api_calls++;
    if (!p) { /* freeing NULL waits for nothing */
        return cudaSuccess;
    }
    host_wait hw(MT_EMU_WAIT_FREE);
    cudaDeviceSynchronize(); /* as CUDA: the device's queued work runs first */
    std::lock_guard<std::mutex> g(mem_mu);
    auto it = allocs.find(p);
    if (it == allocs.end()) {
        return fail(cudaErrorInvalidValue);
    }
    held -= it->second;
    allocs.erase(it);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) {
    emu_api_calls++;
    *p = malloc(bytes ? bytes : 1);
    if (*p) {
        mt_emu_pin(*p, bytes ? bytes : 1, true);
    }
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void *p) {
    emu_api_calls++;
    if (p) {
        host_wait hw(MT_EMU_WAIT_FREE);
        cudaDeviceSynchronize(); /* as CUDA */
        mt_emu_pin(p, 0, false);
    }
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot) {
    std::lock_guard<std::mutex> g(mem_mu);
    *tot = (size_t)64 << 30;
    *fr = *tot - held;
    return cudaSuccess;
}
size_t mt_emu_device_bytes(void) {
    std::lock_guard<std::mutex> g(mem_mu);
    return held;
}
}

/* ---- streams ----
 * Lazy by default in builds with the staged backend (MT_EMU_LAZY_DEFAULT; MESHTRAIN_EMU_LAZY=0/1 overrides):
 * work on a stream (launches, async copies and sets, cuBLASLt products, event records and waits) is queued
 * and runs only when something needs it: a synchronisation of its stream, event or the device, a
 * synchronous copy or set (after the blocking streams), cudaFree, or a stream waiting on an event recorded
 * behind it, which runs the recording stream up to that record first. A stream runs no later than that, so
 * a reader on one stream that does not wait for the writer on another reads stale data, and a writer that
 * does not wait for a reader's event overwrites what the reader has not read yet: the orderings a real
 * device leaves to chance are decided against the program. Only the thread that queues work makes it run: a
 * poll (cudaEventQuery) from another thread, such as the collectives' watchdog, answers without running
 * anything, so when work runs does not depend on a timer. Not lazy: every call completes before it
 * returns (builds without CUDA, whose host-memory collectives ignore streams). MESHTRAIN_EMU_LAZY=2: lazy,
 * and a host synchronisation first lets the other streams run what they can (others_first). The legacy
 * default stream (0) runs at once, after the blocking streams, as on a device. */
namespace {
struct sop_t {
    enum { WORK, RECORD, WAIT } k;
    std::function<void()> fn; /* WORK */
    uintptr_t ev;             /* RECORD, WAIT */
    uint64_t gen;             /* the record's generation (WAIT: the one it waits for) */
    uintptr_t src;            /* WAIT: the stream of that record */
};
struct squeue_t {
    std::deque<sop_t> q;
    bool blocking = true;
    bool running = false;
};
std::recursive_mutex smu;
std::map<uintptr_t, squeue_t> &squeues = *new std::map<uintptr_t, squeue_t>;
std::map<uintptr_t, uint64_t> &ev_gen = *new std::map<uintptr_t, uint64_t>; /* records issued */
/* the records of each event issued and not yet run (an event re-recorded on other streams may run them out
 * of order): a wait or synchronisation is for one record, the latest at its call */
std::map<uintptr_t, std::set<uint64_t>> &ev_queued = *new std::map<uintptr_t, std::set<uint64_t>>;
std::map<uintptr_t, uintptr_t> &ev_where = *new std::map<uintptr_t, uintptr_t>;
std::map<uintptr_t, double> &event_ms = *new std::map<uintptr_t, double>; /* the last record's run time */
std::map<uintptr_t, size_t> &pinned = *new std::map<uintptr_t, size_t>;   /* cudaMallocHost blocks */

/* The thread that queues work: only it makes queued work run. Another thread (the collectives' watchdog,
 * which polls completion events) sees a record not yet run as not ready, so when work runs stays the
 * program's doing, not a timer's. */
std::thread::id worker;
bool worker_set;
/* the same, readable without smu: a thread that is not the worker must not wait for smu while the worker
 * runs queued work (an emulated NCCL op waiting for its peers holds it until they come or it is aborted) */
std::atomic<bool> worker_known;
std::atomic<std::thread::id> worker_atomic;

/* What a thread other than the worker may ask without smu, which the worker holds while it runs queued work
 * (an emulated NCCL op waiting for its peers holds it until they come or it is aborted): per event, its latest
 * record and the records not yet run, kept under a lock of their own. */
std::mutex mirror_mu;
std::map<uintptr_t, std::pair<uint64_t, std::set<uint64_t>>> &mirror =
    *new std::map<uintptr_t, std::pair<uint64_t, std::set<uint64_t>>>;
void mirror_issue(uintptr_t ev, uint64_t gen) {
    std::lock_guard<std::mutex> g(mirror_mu);
    auto &m = mirror[ev];
    m.first = gen;
    m.second.insert(gen);
}
void mirror_ran(uintptr_t ev, uint64_t gen) {
    std::lock_guard<std::mutex> g(mirror_mu);
    auto it = mirror.find(ev);
    if (it != mirror.end()) {
        it->second.second.erase(gen);
    }
}
void mirror_drop(uintptr_t ev) {
    std::lock_guard<std::mutex> g(mirror_mu);
    mirror.erase(ev);
}
bool mirror_latest_ran(uintptr_t ev) {
    std::lock_guard<std::mutex> g(mirror_mu);
    auto it = mirror.find(ev);
    return it == mirror.end() || !it->second.second.count(it->second.first);
}

bool ran(uintptr_t ev, uint64_t gen) {
    auto it = ev_queued.find(ev);
    return it == ev_queued.end() || !it->second.count(gen);
}

/* 0: eager; 1: lazy; 2: lazy, and other streams first at a host synchronisation (others_first). */
int lazy_mode() {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("MESHTRAIN_EMU_LAZY");
        v = e && *e ? atoi(e) : MT_EMU_LAZY_DEFAULT;
        v = v < 0 ? 0 : v > 2 ? 1 : v;
    }
    return v;
}

bool lazy() {
    return lazy_mode() != 0;
}

double now_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

void run_through(uintptr_t s, uintptr_t ev, uint64_t gen);

/* Runs op (popped from its queue). */
void run_op(sop_t &op) {
    if (op.k == sop_t::WORK) {
        op.fn();
    } else if (op.k == sop_t::RECORD) {
        event_ms[op.ev] = now_ms();
        ev_queued[op.ev].erase(op.gen);
        mirror_ran(op.ev, op.gen);
    } else if (!ran(op.ev, op.gen)) {
        run_through(op.src, op.ev, op.gen);
    }
}

/* Runs stream s's queue up to and including the record (ev, gen), or (ev = 0) all of it. */
void run_through(uintptr_t s, uintptr_t ev, uint64_t gen) {
    squeue_t &sq = squeues[s];
    if (sq.running) {
        fprintf(stderr, "emulator: streams wait on each other's events in a cycle (stream %#lx): a device would hang\n",
                (unsigned long)s);
        abort();
    }
    sq.running = true;
    while (!sq.q.empty()) {
        sop_t op = std::move(sq.q.front());
        sq.q.pop_front();
        run_op(op);
        if (ev && op.k == sop_t::RECORD && op.ev == ev && op.gen == gen) {
            break;
        }
    }
    sq.running = false;
    if (ev && !ran(ev, gen)) {
        fprintf(stderr, "emulator: event %#lx record %lu is not on stream %#lx\n", (unsigned long)ev,
                (unsigned long)gen, (unsigned long)s);
        abort();
    }
}

/* MESHTRAIN_EMU_LAZY=2, before a host synchronisation runs stream s: every other stream runs all it can
 * without waiting for a record not yet run (what a device may run early does run early). Plain lazy streams
 * catch a reader that runs before the writer it did not wait for whenever the reader's stream is what the
 * host synchronises; this catches it when the host synchronises the writer's stream and the reader's queue
 * reaches the writer's work only through a later wait: the reader runs first. */
void others_first(uintptr_t s) {
    if (lazy_mode() != 2) {
        return;
    }
    for (bool again = true; again;) {
        again = false;
        for (auto &kv : squeues) {
            squeue_t &sq = kv.second;
            if (kv.first == s || sq.running) {
                continue;
            }
            sq.running = true;
            while (!sq.q.empty() && !(sq.q.front().k == sop_t::WAIT && !ran(sq.q.front().ev, sq.q.front().gen))) {
                sop_t op = std::move(sq.q.front());
                sq.q.pop_front();
                run_op(op);
                again = true;
            }
            sq.running = false;
        }
    }
}

void drain_blocking() {
    for (auto &kv : squeues) {
        if (kv.second.blocking && !kv.second.q.empty()) {
            run_through(kv.first, 0, 0);
        }
    }
}

void drain_all() {
    for (bool again = true; again;) {
        again = false;
        for (auto &kv : squeues) {
            if (!kv.second.q.empty()) {
                run_through(kv.first, 0, 0);
                again = true;
            }
        }
    }
}

void enqueue_op(cudaStream_t s, sop_t op) {
    std::lock_guard<std::recursive_mutex> g(smu);
    uintptr_t k = (uintptr_t)s;
    if (!worker_set) {
        worker = std::this_thread::get_id();
        worker_set = true;
        worker_atomic.store(worker);
        worker_known.store(true);
    }
    if (!lazy() || k == 0) { /* at once (the legacy stream: after the blocking streams) */
        if (lazy()) {
            drain_blocking();
        }
        run_op(op);
        return;
    }
    squeues[k].q.push_back(std::move(op));
}

bool is_pinned(const void *p) {
    std::lock_guard<std::recursive_mutex> g(smu);
    auto it = pinned.upper_bound((uintptr_t)p);
    return it != pinned.begin() && (uintptr_t)p < std::prev(it)->first + std::prev(it)->second;
}
} // namespace

void mt_emu_pin(void *p, size_t bytes, bool add) {
    std::lock_guard<std::recursive_mutex> g(smu);
    if (add) {
        pinned[(uintptr_t)p] = bytes;
    } else {
        pinned.erase((uintptr_t)p);
    }
}

void mt_emu_enqueue(cudaStream_t s, std::function<void()> fn) {
    emu_api_calls++;
    enqueue_op(s, sop_t{sop_t::WORK, std::move(fn), 0, 0, 0});
}

/* For the emulated NCCL (emu_nccl.cpp): whether this thread may make queued work run (the thread that queues
 * it, or any before anything was queued), and e's stream run through e's latest record, with no other stream
 * first (MESHTRAIN_EMU_LAZY=2 does that at host synchronisations, not here). */
bool mt_emu_on_worker(void) {
    return !worker_known.load() || std::this_thread::get_id() == worker_atomic.load();
}

bool mt_emu_is_worker(void) {
    return worker_known.load() && std::this_thread::get_id() == worker_atomic.load();
}

std::recursive_mutex &mt_emu_streams_lock(void) {
    return smu;
}

void mt_emu_run_to_event(cudaEvent_t e) {
    std::lock_guard<std::recursive_mutex> g(smu);
    uintptr_t k = (uintptr_t)e;
    if (!ran(k, ev_gen[k])) {
        run_through(ev_where[k], k, ev_gen[k]);
    }
}

/* Whether p lies in a block of cudaMalloc. */
static bool is_device(const void *p) {
    std::lock_guard<std::mutex> g(mem_mu);
    auto it = allocs.upper_bound((void *)p);
    return it != allocs.begin() && (const char *)p < (const char *)std::prev(it)->first + std::prev(it)->second;
}
/* cudaMemcpyDefault as CUDA's unified addressing reads it: the direction from where the pointers lie. */
static cudaMemcpyKind resolve(cudaMemcpyKind k, const void *dst, const void *src) {
    if (k != cudaMemcpyDefault) {
        return k;
    }
    bool d = is_device(dst), s = is_device(src);
    return s ? (d ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
             : (d ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
}

extern "C" {
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind k) {
    k = resolve(k, dst, src);
    host_wait hw(k == cudaMemcpyDeviceToDevice ? -1 : MT_EMU_WAIT_COPY); /* device to device: no host wait */
    emu_api_calls++;
    copied(k, bytes);
    std::lock_guard<std::recursive_mutex> g(smu);
    if (lazy()) {
        drain_blocking();
    }
    memmove(dst, src, bytes);
    return cudaSuccess;
}
/* From pageable host memory the source is read before the call returns, into pageable host memory the call
 * waits for the stream and the copy (as CUDA's staging does); pinned and device memory wait their turn. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k, cudaStream_t s) {
    k = resolve(k, dst, src);
    copied(k, bytes);
    if (k == cudaMemcpyHostToDevice && !is_pinned(src)) {
        std::shared_ptr<std::vector<char>> copy = std::make_shared<std::vector<char>>((const char *)src,
                                                                                     (const char *)src + bytes);
        mt_emu_enqueue(s, [=]() { memmove(dst, copy->data(), bytes); });
        return cudaSuccess;
    }
    mt_emu_enqueue(s, [=]() { memmove(dst, src, bytes); });
    if (k == cudaMemcpyDeviceToHost && !is_pinned(dst)) {
        return cudaStreamSynchronize(s);
    }
    return cudaSuccess;
}
/* The largest pitch of a 2D copy: INT_MAX bytes, as on devices; MESHTRAIN_EMU_MAX_PITCH lowers it so that a
 * small test reaches the callers' fallback for larger pitches. */
static size_t emu_max_pitch() {
    static const size_t v = []() { /* initialised once, thread-safe */
        const char *e = getenv("MESHTRAIN_EMU_MAX_PITCH");
        long long p = e && *e ? atoll(e) : 0;
        return p > 0 && p < INT_MAX ? (size_t)p : (size_t)INT_MAX;
    }();
    return v;
}
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device) {
    if (attr != cudaDevAttrMaxPitch || device < 0 || device >= emu_devices()) {
        return fail(cudaErrorInvalidValue);
    }
    *value = (int)emu_max_pitch();
    return cudaSuccess;
}
/* height rows of width bytes, with the same pageable-memory semantics as cudaMemcpyAsync. */
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind k, cudaStream_t s) {
    if (dpitch > emu_max_pitch() || spitch > emu_max_pitch()) {
        return fail(cudaErrorInvalidPitchValue);
    }
    if (width > dpitch || width > spitch) {
        return fail(cudaErrorInvalidValue);
    }
    k = resolve(k, dst, src);
    copied(k, width * height);
    auto rows = [=](char *d, const char *sp, size_t sp_pitch) {
        for (size_t r = 0; r < height; r++) {
            memmove(d + r * dpitch, sp + r * sp_pitch, width);
        }
    };
    if (k == cudaMemcpyHostToDevice && !is_pinned(src) && height) {
        auto copy = std::make_shared<std::vector<char>>(width * height);
        for (size_t r = 0; r < height; r++) {
            memcpy(copy->data() + r * width, (const char *)src + r * spitch, width);
        }
        mt_emu_enqueue(s, [=]() { rows((char *)dst, copy->data(), width); });
        return cudaSuccess;
    }
    mt_emu_enqueue(s, [=]() { rows((char *)dst, (const char *)src, spitch); });
    if (k == cudaMemcpyDeviceToHost && !is_pinned(dst)) {
        return cudaStreamSynchronize(s);
    }
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int v, size_t bytes) {
    emu_api_calls++;
    std::lock_guard<std::recursive_mutex> g(smu);
    if (lazy()) {
        drain_blocking();
    }
    memset(p, v, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s) {
    mt_emu_enqueue(s, [=]() { memset(p, v, bytes); });
    return cudaSuccess;
}
static int stream_objs, event_objs;
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    emu_api_calls++;
    std::lock_guard<std::recursive_mutex> g(smu);
    *s = (cudaStream_t)(uintptr_t)(0x1000 + 16 * ++stream_objs);
    squeues[(uintptr_t)*s].blocking = !(flags & cudaStreamNonBlocking);
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) {
    return cudaStreamCreateWithFlags(s, 0);
}
// priorities order nothing here
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority) {
    return cudaStreamCreateWithFlags(s, flags);
}
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
    *least = 0;
    *greatest = 0;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    host_wait hw(MT_EMU_WAIT_STREAM);
    emu_api_calls++;
    std::lock_guard<std::recursive_mutex> g(smu);
    if ((uintptr_t)s == 0) {
        drain_blocking();
    } else if (squeues.count((uintptr_t)s)) {
        others_first((uintptr_t)s);
        run_through((uintptr_t)s, 0, 0);
    }
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    host_wait no_wait(-1); /* CUDA returns at once; the emulator runs the queue here, which no caller waits for */
    cudaStreamSynchronize(s); /* its queued work still runs, as on a device */
    std::lock_guard<std::recursive_mutex> g(smu);
    squeues.erase((uintptr_t)s);
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    host_wait hw(MT_EMU_WAIT_DEVICE);
    emu_api_calls++;
    std::lock_guard<std::recursive_mutex> g(smu);
    drain_all();
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    emu_api_calls++;
    std::lock_guard<std::recursive_mutex> g(smu);
    *e = (cudaEvent_t)(uintptr_t)(0x100000 + 16 * ++event_objs);
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    return cudaEventCreate(e);
}
static std::vector<uintptr_t> &deferred_destroy = *new std::vector<uintptr_t>; /* under mirror_mu */
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    emu_api_calls++;
    uintptr_t k = (uintptr_t)e;
    if (!mt_emu_on_worker()) { /* without smu (as cudaEventQuery): the worker forgets it at its next destroy */
        std::lock_guard<std::mutex> m(mirror_mu);
        deferred_destroy.push_back(k);
        return cudaSuccess;
    }
    std::lock_guard<std::recursive_mutex> g(smu);
    std::vector<uintptr_t> later;
    {
        std::lock_guard<std::mutex> m(mirror_mu);
        later.swap(deferred_destroy);
    }
    for (uintptr_t d : later) {
        cudaEventDestroy((cudaEvent_t)d);
    }
    if (ran(k, ev_gen[k])) { /* a record still queued keeps its entries (CUDA frees the event after it) */
        ev_gen.erase(k);
        ev_queued.erase(k);
        ev_where.erase(k);
        mirror_drop(k);
        event_ms.erase(k);
    }
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    emu_api_calls++;
    std::lock_guard<std::recursive_mutex> g(smu);
    uint64_t gen = ++ev_gen[(uintptr_t)e];
    ev_where[(uintptr_t)e] = (uintptr_t)s;
    ev_queued[(uintptr_t)e].insert(gen);
    mirror_issue((uintptr_t)e, gen);
    enqueue_op(s, sop_t{sop_t::RECORD, nullptr, (uintptr_t)e, gen, 0});
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    host_wait hw(MT_EMU_WAIT_EVENT);
    emu_api_calls++;
    std::lock_guard<std::recursive_mutex> g(smu);
    uintptr_t k = (uintptr_t)e;
    if (!ran(k, ev_gen[k])) {
        others_first(ev_where[k]);
        if (!ran(k, ev_gen[k])) {
            run_through(ev_where[k], k, ev_gen[k]);
        }
    }
    return cudaSuccess;
}
/* MESHTRAIN_EMU_BUSY_POLLS=1 (or mt_emu_busy_polls(1)): on the thread that queues work too, every other poll of
 * a record not yet run answers cudaErrorNotReady without running anything, as a device still busy with it may;
 * the next poll runs it, so a polling loop gets on. Read once per process. */
static std::atomic<int> busy_polls{-1};
static bool busy_polls_on() {
    int v = busy_polls.load();
    if (v < 0) {
        const char *e = getenv("MESHTRAIN_EMU_BUSY_POLLS");
        v = e && *e && atoi(e) ? 1 : 0;
        busy_polls.store(v);
    }
    return v != 0;
}
static thread_local bool answered_busy;
void mt_emu_busy_polls(int on) {
    busy_polls.store(on ? 1 : 0);
    answered_busy = false; /* this thread's next poll of a record not yet run answers busy */
}
/* A poll. On the thread that queues work it runs the work before the record (a lazy stream never gets there by
 * itself, and a polling loop would spin), unless it answers busy (above); on another thread it only answers. */
cudaError_t cudaEventQuery(cudaEvent_t e) {
    if (!mt_emu_on_worker()) { /* without smu: the worker may hold it while it runs queued work */
        return mirror_latest_ran((uintptr_t)e) ? cudaSuccess : fail(cudaErrorNotReady);
    }
    if (busy_polls_on() && !mirror_latest_ran((uintptr_t)e)) {
        answered_busy = !answered_busy;
        if (answered_busy) {
            return fail(cudaErrorNotReady);
        }
    }
    host_wait poll(-1);
    return cudaEventSynchronize(e);
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    std::lock_guard<std::recursive_mutex> g(smu);
    uintptr_t ka = (uintptr_t)a, kb = (uintptr_t)b;
    if (!ran(ka, ev_gen[ka]) || !ran(kb, ev_gen[kb])) {
        return fail(cudaErrorNotReady); /* as CUDA: a record not yet run */
    }
    auto ia = event_ms.find(ka), ib = event_ms.find(kb);
    if (ia == event_ms.end() || ib == event_ms.end()) {
        return fail(cudaErrorInvalidValue); /* as CUDA: an event never recorded */
    }
    *ms = (float)(ib->second - ia->second);
    return cudaSuccess;
}
/* s waits for the work before e's latest record at the time of the call. */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    emu_api_calls++;
    std::lock_guard<std::recursive_mutex> g(smu);
    uintptr_t k = (uintptr_t)e;
    if (ev_gen[k] > 0) {
        enqueue_op(s, sop_t{sop_t::WAIT, nullptr, k, ev_gen[k], ev_where[k]});
    }
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= emu_devices()) {
        return fail(cudaErrorInvalidValue);
    }
    current_device = d;
    return cudaSuccess;
}
}

/* ---- launches ---- */

namespace {

enum fstate { F_RUN, F_SYNC, F_GROUP, F_DONE };

/* Context switches: on x86-64 a minimal switch of the callee-saved registers and the stack pointer (glibc's
 * swapcontext makes a signal-mask system call per switch, which dominated the emulated run time); elsewhere
 * ucontext. */
#if defined(__x86_64__)
extern "C" void mt_emu_switch(void **save_sp, void *to_sp);
asm(R"(
    .text
    .globl mt_emu_switch
    .type mt_emu_switch, @function
mt_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size mt_emu_switch, .-mt_emu_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");
#define MT_EMU_FAST_SWITCH 1
#else
#define MT_EMU_FAST_SWITCH 0
#endif

struct fiber_t { /* small: the scheduler walks every thread's each round */
#if !MT_EMU_FAST_SWITCH
    ucontext_t ctx;
#endif
    void *sp;
    char *stack;
    fstate state;
    unsigned mask; /* F_GROUP: the shuffle's lane mask */
    unsigned gen;  /* shuffles this thread has made: its next value goes to slot half gen % 2 */
    unsigned rgen; /* the shuffle its last group release completed (gen - 1 then): readers take that half */
};

enum { STACK_BYTES = 256 << 10 };

struct launch_t {
    int n;
    std::vector<fiber_t> f;
    std::vector<float> slots;
    std::vector<unsigned> uslots;
#if !MT_EMU_FAST_SWITCH
    ucontext_t sched;
#endif
    void *sched_sp;
    int cur;
    int or_flag;
    const std::function<void()> *body;
    dim3 block;
};

launch_t *L;
std::recursive_mutex launch_mu;

void set_thread(int t) {
    L->cur = t;
    if (L->block.y == 1 && L->block.z == 1) { /* most launches: no divisions per switch */
        threadIdx = dim3((unsigned)t, 0, 0);
        return;
    }
    threadIdx =
        dim3((unsigned)t % L->block.x, (unsigned)t / L->block.x % L->block.y, (unsigned)t / (L->block.x * L->block.y));
}

/* The calling thread stops (it waits, or it returned). With the x86-64 switch it hands over directly to the next
 * runnable thread of the round (a higher index), so a round costs one switch per thread rather than two; the
 * last goes back to the scheduler, whose loop then finds the threads after it already run. */
void to_sched(fiber_t &me) {
#if MT_EMU_FAST_SWITCH
    for (int t = L->cur + 1; t < L->n; t++) {
        if (L->f[(size_t)t].state == F_RUN) {
            set_thread(t);
            mt_emu_switch(&me.sp, L->f[(size_t)t].sp);
            return;
        }
    }
    mt_emu_switch(&me.sp, L->sched_sp);
#else
    swapcontext(&me.ctx, &L->sched);
#endif
}

void trampoline() {
    (*L->body)();
    L->f[L->cur].state = F_DONE;
    to_sched(L->f[L->cur]);
    abort(); /* a finished fiber is never resumed */
}

/* Prepares fb to start in trampoline on its own stack. */
void start_fiber(fiber_t &fb) {
#if MT_EMU_FAST_SWITCH
    uintptr_t top = ((uintptr_t)fb.stack + STACK_BYTES) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = NULL;                 /* trampoline's return-address slot: rsp % 16 == 8 at its entry */
    *--sp = (void *)trampoline;   /* where mt_emu_switch's ret goes */
    for (int i = 0; i < 6; i++) { /* rbp rbx r12 r13 r14 r15 */
        *--sp = NULL;
    }
    fb.sp = sp;
#else
    getcontext(&fb.ctx);
    fb.ctx.uc_stack.ss_sp = fb.stack;
    fb.ctx.uc_stack.ss_size = STACK_BYTES;
    fb.ctx.uc_link = NULL;
    makecontext(&fb.ctx, trampoline, 0);
#endif
}

void resume(fiber_t &fb) {
#if MT_EMU_FAST_SWITCH
    mt_emu_switch(&L->sched_sp, fb.sp);
#else
    swapcontext(&L->sched, &fb.ctx);
#endif
}

void wait_as(fstate st, unsigned mask) {
    fiber_t &me = L->f[L->cur];
    me.state = st;
    me.mask = mask;
    to_sched(me);
}

/* Releases a barrier whose parties have all arrived. Returns whether any fiber became runnable. */
bool release() {
    int alive = 0, at_sync = 0;
    for (int t = 0; t < L->n; t++) {
        alive += L->f[t].state != F_DONE;
        at_sync += L->f[t].state == F_SYNC;
    }
    bool any = false;
    if (alive > 0 && at_sync == alive) {
        for (int t = 0; t < L->n; t++) {
            L->f[t].state = L->f[t].state == F_SYNC ? F_RUN : L->f[t].state;
        }
        return true;
    }
    for (int t = 0; t < L->n; t++) {
        if (L->f[t].state != F_GROUP) {
            continue;
        }
        int warp = t >> 5;
        unsigned mask = L->f[t].mask;
        bool all = true;
        for (int lane = 0; lane < 32 && all; lane++) {
            if (mask & (1u << lane)) {
                int u = warp * 32 + lane;
                all = u < L->n && L->f[u].state == F_GROUP && L->f[u].mask == mask;
            }
        }
        if (all) {
            for (int lane = 0; lane < 32; lane++) {
                if (mask & (1u << lane)) {
                    fiber_t &u = L->f[warp * 32 + lane];
                    u.state = F_RUN;
                    u.rgen = u.gen - 1u;
                }
            }
            any = true;
        }
    }
    return any;
}

} // namespace

void __syncthreads() {
    wait_as(F_SYNC, 0);
}

int __syncthreads_or(int pred) {
    __syncthreads();
    if (L->cur == 0) {
        L->or_flag = 0;
    }
    __syncthreads();
    if (pred) {
        L->or_flag = 1;
    }
    __syncthreads();
    int r = L->or_flag;
    __syncthreads();
    return r;
}

void __syncwarp(unsigned mask) {
    int warp0 = L->cur & ~31, left = L->n - warp0;
    if (left < 32) {
        mask &= (1u << left) - 1u; /* the lanes past the block's last thread do not exist */
    }
    wait_as(F_GROUP, mask);
}

/* A shuffle: each lane leaves its value in its slot, the group's barrier, each lane reads its source's. The slots
 * are double: a lane's next shuffle writes the other half, so a lane that went on to its next shuffle cannot
 * overwrite a value a slower lane of the group has yet to read. (A lane runs at most once per scheduling round
 * and a group is released between rounds, so a source is at most one shuffle ahead of its readers: every
 * reader of the group runs in the round after the release, before the source's next release.) */
namespace {
template <typename V> V shuffle(std::vector<V> &slots, unsigned mask, V v, int src_lane) {
    int t = L->cur, u = (t & ~31) | src_lane, half = (int)slots.size() / 2;
    fiber_t &me = L->f[(size_t)t];
    slots[(size_t)((me.gen & 1u) * half + t)] = v;
    me.gen++;
    wait_as(F_GROUP, mask);
    unsigned g = u < L->n ? L->f[(size_t)u].rgen : 0u; /* a lane past the block's end: its slot's zero */
    return slots[(size_t)((g & 1u) * half + u)];
}
} // namespace

float __shfl_xor_sync(unsigned mask, float v, int lane_mask, int width) {
    int lane = L->cur & 31;
    return shuffle(L->slots, mask, v, (lane & ~(width - 1)) | ((lane ^ lane_mask) & (width - 1)));
}

unsigned __shfl_sync(unsigned mask, unsigned v, int src_lane, int width) {
    int lane = L->cur & 31;
    return shuffle(L->uslots, mask, v, (lane & ~(width - 1)) | (src_lane & (width - 1)));
}

float atomicAdd(float *p, float v) {
    float old = *p;
    *p = old + v;
    return old;
}

int atomicOr(int *p, int v) {
    int old = *p;
    *p = old | v;
    return old;
}

static unsigned long n_launches, n_fibers;
static double t_launch;
static void stats_at_exit() {
    if (getenv("MT_EMU_STATS")) {
        fprintf(stderr, "emulator: %lu launches, %lu block threads run, %.2f s in kernels\n", n_launches, n_fibers,
                t_launch);
    }
}

bool mt_emu_launch_ok(dim3 grid, dim3 block) {
    unsigned long threads = (unsigned long)block.x * block.y * block.z;
    if (grid.x < 1 || grid.x > 2147483647u || grid.y < 1 || grid.y > 65535 || grid.z < 1 || grid.z > 65535 ||
        threads < 1 || threads > 1024 || block.z > 64) {
        fail(cudaErrorInvalidConfiguration);
        return false;
    }
    kernel_launches++;
    return true;
}

void mt_emu_run(dim3 grid, dim3 block, const std::function<void()> &body) { /* counted when issued */
    std::lock_guard<std::recursive_mutex> lg(launch_mu);
    if (n_launches++ == 0) {
        atexit(stats_at_exit);
    }
    struct timespec ts0, ts1;
    clock_gettime(CLOCK_MONOTONIC, &ts0);
    launch_t self;
    launch_t *outer = L; /* launches do not nest, but keep the state safe if they did */
    L = &self;
    self.n = (int)(block.x * block.y * block.z);
    if (self.n > 1024 || self.n < 1) {
        fprintf(stderr, "emulator: block of %d threads not supported\n", self.n);
        abort();
    }
    self.f.resize((size_t)self.n);
    self.slots.assign((size_t)((self.n + 31) / 32 * 32) * 2, 0.0f); /* two halves: shuffle() */
    self.uslots.assign((size_t)((self.n + 31) / 32 * 32) * 2, 0u);
    self.body = &body;
    self.block = block;
    blockDim = block;
    gridDim = grid;
    /* Kept for the process: mapping fresh stacks per launch is slow. Never destroyed (a heap object), so
     * the stacks stay reachable until exit instead of turning into leaks when static destructors run
     * before LeakSanitizer's exit check (sanitizer build). */
    static std::vector<char *> &stack_pool = *new std::vector<char *>;
    while (stack_pool.size() < self.f.size()) {
        stack_pool.push_back((char *)malloc(STACK_BYTES));
    }
    for (size_t t = 0; t < self.f.size(); t++) {
        self.f[t].stack = stack_pool[t];
    }
    unsigned long nblocks = (unsigned long)grid.x * grid.y * grid.z;
    for (unsigned long bi = 0; bi < nblocks; bi++) {
        blockIdx = dim3((unsigned)(bi % grid.x), (unsigned)(bi / grid.x % grid.y),
                        (unsigned)(bi / ((unsigned long)grid.x * grid.y)));
        for (int t = 0; t < self.n; t++) {
            fiber_t &fb = self.f[(size_t)t];
            start_fiber(fb);
            fb.state = F_RUN;
            fb.gen = fb.rgen = 0;
        }
        for (;;) {
            bool ran = false, done = true;
            for (int t = 0; t < self.n; t++) {
                if (self.f[(size_t)t].state == F_RUN) {
                    set_thread(t);
                    resume(self.f[(size_t)t]);
                    ran = true;
                }
                done &= self.f[(size_t)t].state == F_DONE;
            }
            if (done) {
                break;
            }
            if (!release() && !ran) {
                fprintf(stderr, "emulator: deadlock in block %lu (threads wait at barriers that cannot complete)\n",
                        bi);
                abort();
            }
        }
    }
    n_fibers += nblocks * (unsigned long)self.n;
    clock_gettime(CLOCK_MONOTONIC, &ts1);
    t_launch += (double)(ts1.tv_sec - ts0.tv_sec) + 1e-9 * (double)(ts1.tv_nsec - ts0.tv_nsec);
    L = outer;
}

/* ---- cuBLASLt ---- */

struct mt_emu_lt {
    int dummy;
};
struct mt_emu_op {
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    const void *bias = nullptr;
    void *aux = nullptr;
    int64_t aux_ld = 0;
};
struct mt_emu_layout {
    cudaDataType_t t;
    uint64_t rows, cols;
    int64_t ld;
};
struct mt_emu_pref { /* the alignments the caller promises for A, B, C, D (the library's default: 256) */
    uint32_t align[4] = {256, 256, 256, 256};
};

static double ld_el(const void *p, cudaDataType_t t, size_t i) {
    switch (t) {
    case CUDA_R_16BF:
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case CUDA_R_16F:
        return __half2float(((const __half *)p)[i]);
    default:
        return ((const float *)p)[i];
    }
}

static void st_el(void *p, cudaDataType_t t, size_t i, double v) {
    switch (t) {
    case CUDA_R_16BF:
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v);
        break;
    case CUDA_R_16F:
        ((__half *)p)[i] = __float2half_rn((float)v);
        break;
    default:
        ((float *)p)[i] = (float)v;
    }
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    emu_api_calls++;
    *h = new mt_emu_lt;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasLtGetStatusString(cublasStatus_t st) {
    return st == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "emulated cuBLAS error";
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t c, cudaDataType_t s) {
    *d = new mt_emu_op;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *v,
                                              size_t n) {
    switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
        memcpy(&d->ta, v, sizeof(d->ta));
        break;
    case CUBLASLT_MATMUL_DESC_TRANSB:
        memcpy(&d->tb, v, sizeof(d->tb));
        break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        memcpy(&d->epi, v, sizeof(d->epi));
        break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        memcpy(&d->bias, v, sizeof(d->bias));
        break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        memcpy(&d->aux, v, sizeof(d->aux));
        break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
        if (n != sizeof(int64_t)) {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        memcpy(&d->aux_ld, v, sizeof(d->aux_ld));
        break;
    default:
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t t, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    if (ld < (int64_t)rows) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *l = new mt_emu_layout{t, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = new mt_emu_pref;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a, const void *v, size_t n) {
    int i = a == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES   ? 0
            : a == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES ? 1
            : a == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES ? 2
            : a == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES ? 3
                                                              : -1;
    if (i >= 0) {
        if (n != sizeof(uint32_t)) {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        memcpy(&p->align[i], v, sizeof(uint32_t));
    }
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t p, int req,
                                              cublasLtMatmulHeuristicResult_t *res, int *n) {
    memset(res, 0, sizeof(*res));
    /* the algorithm remembers the alignments it was chosen for: a device kernel assumes them */
    static_assert(sizeof(res->algo.data) >= 4 * sizeof(uint32_t), "algo data holds the alignments");
    memcpy(res->algo.data, p->align, sizeof(p->align));
    *n = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static void lt_matmul(const mt_emu_op &o, float al, const void *A, const mt_emu_layout &ad, const void *B,
                      const mt_emu_layout &bd, float be, const void *C, const mt_emu_layout &cd, void *D,
                      const mt_emu_layout &dd, uint64_t m, uint64_t n, uint64_t k, bool bias, bool gelu);

static double gelu_d(double x) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t ad, const void *B, cublasLtMatrixLayout_t bd, const void *beta,
                              const void *C, cublasLtMatrixLayout_t cd, void *D, cublasLtMatrixLayout_t dd,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t s) {
    uint64_t m = dd->rows, n = dd->cols;
    uint64_t k = op->ta == CUBLAS_OP_T ? ad->rows : ad->cols;
    uint64_t am = op->ta == CUBLAS_OP_T ? ad->cols : ad->rows, bk = op->tb == CUBLAS_OP_T ? bd->cols : bd->rows;
    uint64_t bn = op->tb == CUBLAS_OP_T ? bd->rows : bd->cols;
    if (am != m || bk != k || bn != n || cd->rows != m || cd->cols != n) {
        fprintf(stderr, "emulated cublasLtMatmul: shapes do not agree (m %lu n %lu k %lu; A %lux%lu B %lux%lu)\n",
                (unsigned long)m, (unsigned long)n, (unsigned long)k, (unsigned long)ad->rows, (unsigned long)ad->cols,
                (unsigned long)bd->rows, (unsigned long)bd->cols);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    float al = *(const float *)alpha, be = *(const float *)beta; /* host scalars: read at the call */
    bool bias = op->epi == CUBLASLT_EPILOGUE_BIAS || op->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    bool gelu = op->epi == CUBLASLT_EPILOGUE_GELU_AUX || op->epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    if ((bias && !op->bias) || (gelu && (!op->aux || op->aux_ld < (int64_t)m || op->aux_ld % 8))) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    /* Alignment, which a device checks only by faulting ("misaligned address", a sticky error): A, B, C, D (and
     * the GELU epilogue's aux matrix, written as D is) at least as aligned as the algorithm's heuristic was told,
     * and the bias 16-byte aligned, which no preference covers and the library's kernels may assume (reported for
     * PyTorch, pytorch/pytorch#194497, and Marian on A100s). */
    uint32_t want[4] = {1, 1, 1, 1}; /* no algorithm given: the library picks one for these pointers */
    if (algo) {
        memcpy(want, algo->data, sizeof(want));
    }
    static const char *const names[5] = {"A", "B", "C", "D", "aux"};
    const void *ptrs[5] = {A, B, C, D, gelu ? op->aux : nullptr};
    for (int i = 0; i < 5; i++) {
        uint32_t w = want[i < 4 ? i : 3];
        if (ptrs[i] && w > 1 && (uintptr_t)ptrs[i] % w != 0) {
            fprintf(stderr, "emulated cublasLtMatmul: %s %p is not %u-byte aligned, as its algorithm assumes\n",
                    names[i], ptrs[i], (unsigned)w);
            return CUBLAS_STATUS_EXECUTION_FAILED;
        }
    }
    if (bias && (uintptr_t)op->bias % 16 != 0) {
        fprintf(stderr, "emulated cublasLtMatmul: bias %p is not 16-byte aligned (a device may fault)\n", op->bias);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    /* the descriptors by value: the caller may change or destroy them before the product runs */
    mt_emu_op o = *op;
    mt_emu_layout a = *ad, b = *bd, c = *cd, d = *dd;
    matmuls++;
    mt_emu_enqueue(s, [=]() { lt_matmul(o, al, A, a, B, b, be, C, c, D, d, m, n, k, bias, gelu); });
    return CUBLAS_STATUS_SUCCESS;
}

static void lt_matmul(const mt_emu_op &o, float al, const void *A, const mt_emu_layout &ad, const void *B,
                      const mt_emu_layout &bd, float be, const void *C, const mt_emu_layout &cd, void *D,
                      const mt_emu_layout &dd, uint64_t m, uint64_t n, uint64_t k, bool bias, bool gelu) {
    const mt_emu_op *op = &o;
    /* op(A) row by row and op(B) column by column as doubles (exact), so each dot product runs over contiguous
     * memory, in the same order */
    std::vector<double> ar(m * k), bc(n * k);
    for (uint64_t i = 0; i < m; i++) {
        for (uint64_t l = 0; l < k; l++) {
            ar[i * k + l] = ld_el(A, ad.t, op->ta == CUBLAS_OP_T ? l + i * ad.ld : i + l * ad.ld);
        }
    }
    for (uint64_t j = 0; j < n; j++) {
        for (uint64_t l = 0; l < k; l++) {
            bc[j * k + l] = ld_el(B, bd.t, op->tb == CUBLAS_OP_T ? j + l * bd.ld : l + j * bd.ld);
        }
    }
    for (uint64_t j = 0; j < n; j++) {
        for (uint64_t i = 0; i < m; i++) {
            const double *x = &ar[i * k], *y = &bc[j * k];
            double acc = 0.0;
            for (uint64_t l = 0; l < k; l++) {
                acc += x[l] * y[l];
            }
            double v = al * acc;
            if (be != 0.0f) {
                v += be * ld_el(C, cd.t, i + j * cd.ld);
            }
            if (bias) {
                v += ld_el(op->bias, dd.t, i);
            }
            if (gelu) {
                st_el(op->aux, dd.t, i + j * (size_t)op->aux_ld, v);
                v = gelu_d(v);
            }
            st_el(D, dd.t, i + j * dd.ld, v);
        }
    }
}
