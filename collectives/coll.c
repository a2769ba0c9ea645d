/* The communicator dispatcher: creates communicators (from an MPI comm, a rank list or a mesh axis),
 * picks a backend per op by query()/priority with fall-through on NULL entries, validates arguments,
 * numbers every call, and runs asynchronous calls. Host backends get asynchrony from one progress
 * thread per communicator that executes queued calls in issue order (see docs/collectives.md); stream-
 * ordered backends (NCCL) from events recorded after each call.
 * SPDX-License-Identifier: MIT */
#include "collectives/coll_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "runtime/alloc.h"
#include "runtime/trace.h"

MT_PARAM_STR(coll_backend, "COLL_BACKEND", NULL)
MT_PARAM(coll_timeout, "COLL_TIMEOUT", 300)

const char *mt_coll_forced_backend(const mt_comm_params_t *params) {
    const char *f = params && params->backend ? params->backend : mt_param_coll_backend();
    return f && *f ? f : NULL;
}

/* Preference order (NCCL first): ties in priority go to the earlier entry. */
static const struct mt_coll_backend *const backends[] = {
#if MT_HAVE_NCCL
    &mt_coll_backend_nccl,
#endif
#if MT_HAVE_COLL_STAGED
    &mt_coll_backend_staged,
#endif
    &mt_coll_backend_shm,
    &mt_coll_backend_mpi,
    &mt_coll_backend_self,
};

static const char *kind_names[MT_COLL_KIND_COUNT] = {
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce",
    "all_to_all", "send",           "recv",       "barrier",   "group",
};

const char *mt_coll_kind_name(mt_coll_kind_t kind) {
    return (unsigned)kind < MT_COLL_KIND_COUNT ? kind_names[kind] : "?";
}

/* ---- per-op resolution ------------------------------------------------------------------------- */

static bool backend_has(const struct mt_coll_backend *be, mt_coll_kind_t k) {
    switch (k) {
    case MT_COLL_ALL_REDUCE:
        return be->all_reduce != NULL;
    case MT_COLL_REDUCE_SCATTER:
        return be->reduce_scatter != NULL;
    case MT_COLL_ALL_GATHER:
        return be->all_gather != NULL;
    case MT_COLL_BROADCAST:
        return be->broadcast != NULL;
    case MT_COLL_REDUCE:
        return be->reduce != NULL;
    case MT_COLL_ALL_TO_ALL:
        return be->all_to_all != NULL;
    case MT_COLL_SEND:
        return be->send != NULL && be->recv != NULL;
    case MT_COLL_RECV:
        return be->send != NULL && be->recv != NULL;
    case MT_COLL_BARRIER:
        return be->barrier != NULL;
    case MT_COLL_GROUP:
        return be->send != NULL && be->recv != NULL;
    default:
        return false;
    }
}

static void comm_set_error(mt_comm_t c, mt_status_t st, const char *msg) {
    pthread_mutex_lock(&c->mu);
    if (atomic_load(&c->async_error) == MT_OK) {
        snprintf(c->last_error, sizeof(c->last_error), "%s", msg);
        atomic_store(&c->async_error, (int)st);
    }
    pthread_mutex_unlock(&c->mu);
}

static void *progress_main(void *arg);

static void comm_destroy(mt_comm_t c) {
    mt_watchdog_group_unregister(c->wd); /* first: the watchdog thread must stop calling into c */
    for (int i = 0; i < c->n_backends; i++) {
        if (c->backends[i].inited && c->backends[i].be->free) {
            c->backends[i].be->free(c->backends[i].ctx);
        }
    }
    if (c->mpi != MPI_COMM_NULL) {
        MPI_Comm_free(&c->mpi);
    }
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv_work);
    pthread_cond_destroy(&c->cv_done);
    mt_free(c->group_ops);
    mt_free(c->parent_ranks);
    mt_free(c->events);
    mt_free(c);
}

/* ---- watchdog hooks (runtime/watchdog.h): every call is registered with its sequence number, op and
 * bytes when it is issued; the watchdog thread reads progress through mt_comm_seq_completed. ---------- */

static uint64_t wd_completed(void *arg) { return mt_comm_seq_completed((mt_comm_t)arg); }

/* Before the watchdog ends the job: cancel what a backend can cancel (NCCL: ncclCommAbort). */
static void wd_abort(void *arg) {
    mt_comm_t c = arg;
    for (int i = 0; i < c->n_backends; i++) {
        if (c->backends[i].inited && c->backends[i].be->abort) {
            c->backends[i].be->abort(c->backends[i].ctx);
        }
    }
}

/* Bytes of a call's buffer(s) as issued (per rank, the count the caller passed times the element size). */
static size_t call_bytes(const struct mt_coll_call *call) {
    size_t elems = call->count;
    for (int i = 0; i < call->n_group; i++) {
        elems += call->group[i].count;
    }
    return elems * mt_coll_dtype_size(call->n_group > 0 ? call->group[0].dtype : call->dtype);
}

static void wd_note(mt_comm_t c, uint64_t seq, const struct mt_coll_call *call) {
    if (!c->wd) {
        return;
    }
    int peer = (call->kind == MT_COLL_SEND || call->kind == MT_COLL_RECV) ? call->root : -1;
    mt_watchdog_op_begin(c->wd, seq, mt_coll_kind_name(call->kind), call_bytes(call), peer);
}

static mt_status_t exec_call(mt_comm_t c, const struct mt_coll_call *call);

/* Runs a call and, while the timeline profiler records, puts it on the calling thread's track (the
 * caller's for synchronous calls, the progress thread's for asynchronous ones) with its op, comm, bytes
 * and sequence number. For stream-ordered (device) comms the span is the enqueue, not the transfer. */
static mt_status_t exec_traced(mt_comm_t c, uint64_t seq, const struct mt_coll_call *call) {
    if (!mt_trace_on()) {
        return exec_call(c, call);
    }
    double t0 = mt_trace_now_us();
    mt_status_t st = exec_call(c, call);
    char args[256];
    snprintf(args, sizeof(args), "\"comm\": \"%s\", \"bytes\": %zu, \"seq\": %llu, \"peer\": %d, \"status\": \"%s\"",
             c->name, call_bytes(call), (unsigned long long)seq,
             (call->kind == MT_COLL_SEND || call->kind == MT_COLL_RECV) ? call->root : -1, mt_status_str(st));
    mt_trace_span("coll", mt_coll_kind_name(call->kind), t0, mt_trace_now_us(), args);
    return st;
}

/* Takes ownership of mpi (a fresh communicator): probes the backends, inits those that qualify. */
static mt_status_t comm_create(MPI_Comm mpi, MPI_Comm parent, const mt_comm_params_t *params, const char *dflt_name,
                               mt_comm_t *out) {
    mt_status_t st = MT_OK;
    mt_comm_params_t p = MT_COMM_PARAMS_INIT;
    if (params) {
        if (params->size < sizeof(size_t) || params->size > sizeof(p)) {
            MPI_Comm_free(&mpi);
            return mt_error(MT_ERR_INVALID_ARG, "mt_comm_params_t.size = %zu: initialise it with MT_COMM_PARAMS_INIT",
                            params->size);
        }
        memcpy(&p, params, params->size);
    }
    mt_comm_t c = mt_calloc(sizeof(*c), MT_MEM_COMM, "mt_comm");
    if (!c) {
        MPI_Comm_free(&mpi);
        return mt_error(MT_ERR_OOM, "cannot allocate a communicator");
    }
    c->mpi = mpi;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv_work, NULL);
    pthread_cond_init(&c->cv_done, NULL);
    snprintf(c->name, sizeof(c->name), "%s", p.name ? p.name : (dflt_name ? dflt_name : "comm"));
    c->memory = p.memory;
    c->timeout_s = p.timeout_s > 0 ? p.timeout_s : (double)mt_param_coll_timeout();
    MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
    MT_CHECK_GOTO(mt_coll_mpi_status(MPI_Comm_rank(mpi, &c->rank), "MPI_Comm_rank"), st, fail);
    MT_CHECK_GOTO(mt_coll_mpi_status(MPI_Comm_size(mpi, &c->size), "MPI_Comm_size"), st, fail);
    MPI_Query_thread(&c->thread_level);

    /* Parent ranks of the members, for error messages and mt_comm_parent_rank. */
    c->parent_ranks = mt_alloc(sizeof(int) * (size_t)c->size, MT_MEM_COMM, "mt_comm");
    if (!c->parent_ranks) {
        st = mt_error(MT_ERR_OOM, "cannot allocate the rank map of comm %s", c->name);
        goto fail;
    }
    {
        MPI_Group g_parent, g_mine;
        MPI_Comm_group(parent, &g_parent);
        MPI_Comm_group(mpi, &g_mine);
        int *mine = mt_alloc(sizeof(int) * (size_t)c->size, MT_MEM_OTHER, "mt_comm");
        for (int i = 0; mine && i < c->size; i++) {
            mine[i] = i;
        }
        if (mine) {
            MPI_Group_translate_ranks(g_mine, c->size, mine, g_parent, c->parent_ranks);
        }
        mt_free(mine);
        MPI_Group_free(&g_parent);
        MPI_Group_free(&g_mine);
    }

    struct mt_comm_info info = {c->rank, c->size, c->memory, c->thread_level, c->name, c->mpi};
    const char *forced = mt_coll_forced_backend(&p);
    if (forced && *forced) {
        const struct mt_coll_backend *be = NULL;
        char names[128] = "";
        for (size_t i = 0; i < MT_ARRAY_LEN(backends); i++) {
            if (!strcasecmp(backends[i]->name, forced)) {
                be = backends[i];
            }
            size_t at = strlen(names);
            snprintf(names + at, sizeof(names) - at, "%s%s", i ? " " : "", backends[i]->name);
        }
        if (!be) {
            st = mt_error(MT_ERR_INVALID_ARG,
                          "comm %s: backend '%s' (MESHTRAIN_COLL_BACKEND or params.backend) is not one of this "
                          "build's: %s",
                          c->name, forced, names);
            goto fail;
        }
        int prio = -1;
        MT_CHECK_GOTO(be->query(&info, &prio), st, fail);
        if (prio < 0) {
            st = mt_error(MT_ERR_INVALID_USAGE, "comm %s: backend '%s' was forced but cannot serve it: %s", c->name,
                          be->name, mt_last_error_msg());
            goto fail;
        }
        c->backends[c->n_backends++] = (struct mt_comm_backend_slot){be, NULL, prio, false};
    } else {
        for (size_t i = 0; i < MT_ARRAY_LEN(backends); i++) {
            int prio = -1;
            MT_CHECK_GOTO(backends[i]->query(&info, &prio), st, fail);
            if (prio < 0) {
                continue;
            }
            /* insertion by priority, stable for ties */
            int at = c->n_backends;
            while (at > 0 && c->backends[at - 1].priority < prio) {
                c->backends[at] = c->backends[at - 1];
                at--;
            }
            c->backends[at] = (struct mt_comm_backend_slot){backends[i], NULL, prio, false};
            c->n_backends++;
        }
    }
    if (c->n_backends == 0) {
        st = mt_error(MT_ERR_INVALID_USAGE, "comm %s: no collective backend can serve %s memory on %d ranks", c->name,
                      c->memory == MT_COMM_MEM_DEVICE ? "device" : "host", c->size);
        goto fail;
    }
    for (int i = 0; i < c->n_backends; i++) {
        MT_ASSERT(c->backends[i].be->api_version == MT_COLL_API_VERSION);
        MT_CHECK_GOTO(c->backends[i].be->init(c, &info, &c->backends[i].ctx), st, fail);
        c->backends[i].inited = true;
    }
    for (int k = 0; k < MT_COLL_KIND_COUNT; k++) {
        for (int i = 0; i < c->n_backends && !c->ops[k].be; i++) {
            if (backend_has(c->backends[i].be, (mt_coll_kind_t)k)) {
                c->ops[k] = c->backends[i];
            }
        }
        if (!c->ops[k].be) {
            st = mt_error(MT_ERR_INTERNAL, "comm %s: no backend implements %s", c->name,
                          mt_coll_kind_name((mt_coll_kind_t)k));
            goto fail;
        }
    }
    c->stream_ordered = c->ops[MT_COLL_ALL_REDUCE].be->stream_ordered;
    if (c->stream_ordered) {
        c->events = mt_calloc(sizeof(*c->events) * MT_COLL_EVENT_RING, MT_MEM_COMM, "mt_comm");
        if (!c->events) {
            st = mt_error(MT_ERR_OOM, "comm %s: cannot allocate its event ring", c->name);
            goto fail;
        }
    }
    MT_INFO(MT_LOG_COLL, "comm %s: rank %d/%d (parent rank %d), %s memory, backend %s (priority %d)%s", c->name,
            c->rank, c->size, c->parent_ranks[c->rank], c->memory == MT_COMM_MEM_DEVICE ? "device" : "host",
            c->ops[MT_COLL_ALL_REDUCE].be->name, c->ops[MT_COLL_ALL_REDUCE].priority,
            forced && *forced ? " forced" : "");
    c->wd = mt_watchdog_group_register(c->name, c->mpi, wd_completed, wd_abort, c);
    *out = c;
    return MT_OK;
fail : {
    char msg[512];
    snprintf(msg, sizeof(msg), "%s", mt_last_error_msg());
    comm_destroy(c);
    mt_error(st, "%s", msg);
}
    return st;
}

mt_status_t mt_comm_init(MPI_Comm parent, const mt_comm_params_t *params, mt_comm_t *out) {
    if (!out || parent == MPI_COMM_NULL) {
        return mt_error(MT_ERR_INVALID_ARG, "mt_comm_init: parent must be a communicator and out non-NULL");
    }
    *out = NULL;
    MPI_Comm dup;
    MT_CHECK(mt_coll_mpi_status(MPI_Comm_dup(parent, &dup), "MPI_Comm_dup"));
    return comm_create(dup, parent, params, NULL, out);
}

mt_status_t mt_comm_init_ranks(MPI_Comm world, const int *ranks, int n, const mt_comm_params_t *params,
                               mt_comm_t *out) {
    if (!out || !ranks || n <= 0 || world == MPI_COMM_NULL) {
        return mt_error(MT_ERR_INVALID_ARG, "mt_comm_init_ranks: need a world communicator, n > 0 ranks and out");
    }
    *out = NULL;
    int me, wsize;
    MPI_Comm_rank(world, &me);
    MPI_Comm_size(world, &wsize);
    bool member = false;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= wsize) {
            return mt_error(MT_ERR_INVALID_ARG, "mt_comm_init_ranks: rank %d at index %d is outside the world of %d",
                            ranks[i], i, wsize);
        }
        for (int j = 0; j < i; j++) {
            if (ranks[j] == ranks[i]) {
                return mt_error(MT_ERR_INVALID_ARG, "mt_comm_init_ranks: rank %d listed twice", ranks[i]);
            }
        }
        member |= ranks[i] == me;
    }
    if (!member) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "mt_comm_init_ranks: rank %d is not in the group it tries to create "
                        "(only members call it)",
                        me);
    }
    MPI_Group g_world, g_new;
    MPI_Comm newc = MPI_COMM_NULL;
    MT_CHECK(mt_coll_mpi_status(MPI_Comm_group(world, &g_world), "MPI_Comm_group"));
    int rc = MPI_Group_incl(g_world, n, ranks, &g_new);
    MPI_Group_free(&g_world);
    MT_CHECK(mt_coll_mpi_status(rc, "MPI_Group_incl"));
    /* The tag keeps concurrent creations over overlapping rank sets apart. */
    rc = MPI_Comm_create_group(world, g_new, 0x4d54, &newc);
    MPI_Group_free(&g_new);
    MT_CHECK(mt_coll_mpi_status(rc, "MPI_Comm_create_group"));
    return comm_create(newc, world, params, NULL, out);
}

/* ---- accessors ---------------------------------------------------------------------------------- */

int mt_comm_rank(const mt_comm_t comm) {
    return comm->rank;
}
int mt_comm_size(const mt_comm_t comm) {
    return comm->size;
}
const char *mt_comm_name(const mt_comm_t comm) {
    return comm->name;
}
MPI_Comm mt_comm_mpi(const mt_comm_t comm) {
    return comm->mpi;
}
const char *mt_comm_backend_name(const mt_comm_t comm) {
    return comm->ops[MT_COLL_ALL_REDUCE].be->name;
}
int mt_comm_parent_rank(const mt_comm_t comm, int r) {
    return (r >= 0 && r < comm->size) ? comm->parent_ranks[r] : -1;
}
uint64_t mt_comm_seq_issued(const mt_comm_t comm) {
    return atomic_load(&((struct mt_comm *)comm)->seq_issued);
}

const char *mt_comm_last_error(const mt_comm_t comm) {
    return comm->last_error;
}

mt_status_t mt_comm_get_async_error(mt_comm_t comm) {
    mt_status_t st = (mt_status_t)atomic_load(&comm->async_error);
    if (st != MT_OK) {
        return st;
    }
    for (int i = 0; i < comm->n_backends; i++) {
        if (comm->backends[i].be->get_async_error) {
            st = comm->backends[i].be->get_async_error(comm->backends[i].ctx);
            if (st != MT_OK) {
                comm_set_error(comm, st, mt_last_error_msg());
                return st;
            }
        }
    }
    return MT_OK;
}

mt_status_t mt_comm_abort(mt_comm_t comm) {
    comm_set_error(comm, MT_ERR_REMOTE, "communicator aborted by mt_comm_abort");
    for (int i = 0; i < comm->n_backends; i++) {
        if (comm->backends[i].be->abort) {
            mt_status_t st = comm->backends[i].be->abort(comm->backends[i].ctx);
            if (st != MT_OK) {
                return st;
            }
            return MT_OK;
        }
    }
    MT_WARN("comm %s: aborting: MPI_Abort (MPI cannot cancel a collective in flight)", comm->name);
    MPI_Abort(comm->mpi, 1);
    return MT_OK;
}

/* ---- stream-ordered completion (events) ------------------------------------------------------------ */

/* Polls the ring of events of a stream-ordered comm from the oldest, retiring those that fired, and
 * advances seq_completed. Caller holds c->mu. */
static mt_status_t events_poll_locked(mt_comm_t c) {
    const struct mt_coll_backend *be = c->ops[MT_COLL_ALL_REDUCE].be;
    void *ctx = c->ops[MT_COLL_ALL_REDUCE].ctx;
    while (c->ev_head != c->ev_tail) {
        struct mt_comm_event *e = &c->events[c->ev_head % MT_COLL_EVENT_RING];
        bool done = false;
        mt_status_t st = be->event_query(ctx, e->event, &done);
        if (st != MT_OK) {
            return st;
        }
        if (!done) {
            break;
        }
        be->event_free(ctx, e->event);
        atomic_store(&c->seq_completed, e->seq);
        c->ev_head++;
    }
    return MT_OK;
}

uint64_t mt_comm_seq_completed(const mt_comm_t comm) {
    struct mt_comm *c = (struct mt_comm *)comm;
    if (c->stream_ordered) {
        pthread_mutex_lock(&c->mu);
        mt_status_t st = events_poll_locked(c);
        pthread_mutex_unlock(&c->mu);
        if (st != MT_OK) {
            comm_set_error(c, st, mt_last_error_msg());
        }
    }
    return atomic_load(&c->seq_completed);
}

/* Records an event after call seq on stream (stream-ordered backends). When the ring is full, the
 * oldest event is waited for: the device is then MT_COLL_EVENT_RING calls behind the host. Between polls the
 * lock is let go, so the watchdog's thread can read this comm's progress and answer its peers meanwhile. */
static mt_status_t events_push(mt_comm_t c, uint64_t seq, mt_stream_t stream) {
    const struct mt_coll_backend *be = c->ops[MT_COLL_ALL_REDUCE].be;
    void *ev = NULL;
    MT_CHECK(be->event_record(c->ops[MT_COLL_ALL_REDUCE].ctx, stream, &ev));
    pthread_mutex_lock(&c->mu);
    mt_status_t st = MT_OK;
    double t0 = mt_now();
    while (c->ev_tail - c->ev_head >= MT_COLL_EVENT_RING) {
        st = events_poll_locked(c);
        if (st != MT_OK || c->ev_tail - c->ev_head < MT_COLL_EVENT_RING) {
            break;
        }
        pthread_mutex_unlock(&c->mu);
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&c->mu);
        if (mt_now() - t0 > c->timeout_s) {
            st = mt_error(MT_ERR_TIMEOUT, "comm %s: call %llu is %d calls ahead of the device for %.0f s", c->name,
                          (unsigned long long)seq, MT_COLL_EVENT_RING, c->timeout_s);
            break;
        }
    }
    if (st == MT_OK) {
        c->events[c->ev_tail % MT_COLL_EVENT_RING] = (struct mt_comm_event){seq, ev};
        c->ev_tail++;
    } else {
        be->event_free(c->ops[MT_COLL_ALL_REDUCE].ctx, ev);
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* ---- execution ------------------------------------------------------------------------------------ */

/* Runs one call on its backend (the calling thread: the issuer for synchronous calls, the progress
 * thread for asynchronous ones). */
static mt_status_t exec_call(mt_comm_t c, const struct mt_coll_call *a) {
    const struct mt_comm_backend_slot *s = &c->ops[a->kind];
    void *x = s->ctx;
    switch (a->kind) {
    case MT_COLL_ALL_REDUCE:
        return s->be->all_reduce(x, a->send, a->recv, a->count, a->dtype, a->op, a->stream);
    case MT_COLL_REDUCE_SCATTER:
        return s->be->reduce_scatter(x, a->send, a->recv, a->count, a->dtype, a->op, a->stream);
    case MT_COLL_ALL_GATHER:
        return s->be->all_gather(x, a->send, a->recv, a->count, a->dtype, a->stream);
    case MT_COLL_BROADCAST:
        return s->be->broadcast(x, a->send, a->recv, a->count, a->dtype, a->root, a->stream);
    case MT_COLL_REDUCE:
        return s->be->reduce(x, a->send, a->recv, a->count, a->dtype, a->op, a->root, a->stream);
    case MT_COLL_ALL_TO_ALL:
        return s->be->all_to_all(x, a->send, a->recv, a->count, a->dtype, a->stream);
    case MT_COLL_SEND:
        return s->be->send(x, a->send, a->count, a->dtype, a->root, a->stream);
    case MT_COLL_RECV:
        return s->be->recv(x, a->recv, a->count, a->dtype, a->root, a->stream);
    case MT_COLL_BARRIER:
        return s->be->barrier(x, a->stream);
    case MT_COLL_GROUP: {
        if (s->be->group_start) {
            MT_CHECK(s->be->group_start(x));
        }
        mt_status_t st = MT_OK;
        for (int i = 0; i < a->n_group && st == MT_OK; i++) {
            const struct mt_coll_call *g = &a->group[i];
            st = g->kind == MT_COLL_SEND ? s->be->send(x, g->send, g->count, g->dtype, g->root, a->stream)
                                         : s->be->recv(x, g->recv, g->count, g->dtype, g->root, a->stream);
        }
        /* group_end always runs so the backend leaves group mode (it completes or cancels what was posted) */
        if (s->be->group_end) {
            mt_status_t st2 = s->be->group_end(x, a->stream);
            if (st == MT_OK) {
                st = st2;
            }
        }
        return st;
    }
    default:
        return mt_error(MT_ERR_INTERNAL, "unknown call kind %d", (int)a->kind);
    }
}

static void work_release_locked(struct mt_work *w) {
    mt_free(w->call.group);
    mt_free(w);
}

static void *progress_main(void *arg) {
    mt_comm_t c = arg;
    char track[64];
    snprintf(track, sizeof(track), "coll progress (%s)", c->name);
    mt_trace_thread_name(track);
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->q_head && !c->stop) {
            pthread_cond_wait(&c->cv_work, &c->mu);
        }
        if (!c->q_head) {
            break; /* stop requested and nothing left */
        }
        struct mt_work *w = c->q_head;
        pthread_mutex_unlock(&c->mu);
        mt_status_t st = (mt_status_t)atomic_load(&c->async_error);
        char msg[512] = "";
        if (st == MT_OK) {
            st = exec_traced(c, w->seq, &w->call);
            if (st != MT_OK) {
                snprintf(msg, sizeof(msg), "%.300s (call %llu, %s on comm %s)", mt_last_error_msg(),
                         (unsigned long long)w->seq, mt_coll_kind_name(w->call.kind), c->name);
            }
        } else {
            snprintf(msg, sizeof(msg), "call %llu not run: comm %s already failed: %.300s", (unsigned long long)w->seq,
                     c->name, c->last_error);
        }
        if (st != MT_OK && atomic_load(&c->async_error) == MT_OK) {
            comm_set_error(c, st, msg);
        }
        pthread_mutex_lock(&c->mu);
        c->q_head = w->next;
        if (!c->q_head) {
            c->q_tail = NULL;
        }
        w->status = st;
        snprintf(w->err, sizeof(w->err), "%s", msg);
        atomic_store(&c->seq_completed, w->seq);
        atomic_fetch_sub(&c->n_pending, 1);
        atomic_store_explicit(&w->done, 1, memory_order_release);
        if (w->detached) {
            work_release_locked(w);
        }
        pthread_cond_broadcast(&c->cv_done);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Waits until every queued asynchronous call has completed (before a synchronous call, to keep issue
 * order, and in mt_comm_free). */
static mt_status_t drain(mt_comm_t c, const char *why) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    double t = (double)dl.tv_sec + 1e-9 * (double)dl.tv_nsec + c->timeout_s;
    dl.tv_sec = (time_t)t;
    dl.tv_nsec = (long)((t - (double)dl.tv_sec) * 1e9);
    pthread_mutex_lock(&c->mu);
    while (atomic_load(&c->n_pending) > 0) {
        if (pthread_cond_timedwait(&c->cv_done, &c->mu, &dl) == ETIMEDOUT) {
            uint64_t s = atomic_load(&c->seq_completed) + 1;
            pthread_mutex_unlock(&c->mu);
            return mt_error(MT_ERR_TIMEOUT,
                            "comm %s (rank %d/%d): %s waited %.1f s for asynchronous call %llu (%s) "
                            "to complete: a peer rank is missing or stuck",
                            c->name, c->rank, c->size, why, c->timeout_s, (unsigned long long)s,
                            c->q_head ? mt_coll_kind_name(c->q_head->call.kind) : "?");
        }
    }
    pthread_mutex_unlock(&c->mu);
    return MT_OK;
}

/* *out = a new work handle of comm c for call number seq (0: numbered when queued), not done yet.
 * MT_ERR_OOM if it cannot be allocated. */
static mt_status_t work_new(mt_comm_t c, uint64_t seq, mt_coll_kind_t kind, struct mt_work **out) {
    struct mt_work *w = mt_calloc(sizeof(*w), MT_MEM_COMM, "mt_work");
    if (!w) {
        return mt_error(MT_ERR_OOM, "cannot allocate a work handle");
    }
    w->comm = c;
    w->seq = seq;
    w->call.kind = kind;
    *out = w;
    return MT_OK;
}

/* Issues a validated call: synchronously on this thread (work == NULL), or as a work handle. */
mt_status_t mt_coll_issue(mt_comm_t c, const struct mt_coll_call *call, mt_work_t *work) {
    mt_status_t st = (mt_status_t)atomic_load_explicit(&c->async_error, memory_order_relaxed);
    if (st != MT_OK) {
        return mt_error(st, "comm %s failed earlier: %s", c->name, c->last_error);
    }
    if (c->stream_ordered) {
        uint64_t seq = atomic_fetch_add(&c->seq_issued, 1) + 1;
        wd_note(c, seq, call);
        st = exec_traced(c, seq, call);
        if (st != MT_OK) {
            /* a call that failed gets no event: the comm has failed (peers may be inside the call), so waits on it
             * and mt_comm_free end at once instead of at the timeout */
            comm_set_error(c, st, mt_last_error_msg());
            return st;
        }
        st = events_push(c, seq, call->stream);
        if (st != MT_OK) { /* the call runs but cannot be tracked: as a failed one */
            comm_set_error(c, st, mt_last_error_msg());
            return st;
        }
        if (work) {
            MT_CHECK(work_new(c, seq, call->kind, work));
        }
        return MT_OK;
    }
    if (!work || c->thread_level < MPI_THREAD_MULTIPLE) {
        /* Synchronous: straight to the backend once earlier asynchronous calls are done. */
        if (atomic_load_explicit(&c->n_pending, memory_order_acquire) > 0) {
            MT_CHECK(drain(c, mt_coll_kind_name(call->kind)));
        }
        uint64_t seq = atomic_fetch_add_explicit(&c->seq_issued, 1, memory_order_relaxed) + 1;
        wd_note(c, seq, call);
        st = exec_traced(c, seq, call);
        atomic_store_explicit(&c->seq_completed, seq, memory_order_release);
        if (work) {
            /* No MPI_THREAD_MULTIPLE: the call ran here; hand back a completed handle. */
            struct mt_work *w = NULL;
            MT_CHECK(work_new(c, seq, call->kind, &w));
            w->status = st;
            atomic_store(&w->done, 1);
            *work = w;
        }
        return st;
    }
    struct mt_work *w = NULL;
    MT_CHECK(work_new(c, 0, call->kind, &w));
    w->call = *call;
    if (call->kind == MT_COLL_GROUP) {
        /* the group's calls move into the handle; the comm's buffer stays for the next group */
        size_t bytes = sizeof(*call->group) * (size_t)call->n_group;
        w->call.group = mt_alloc(bytes, MT_MEM_COMM, "mt_work");
        if (!w->call.group) {
            mt_free(w);
            return mt_error(MT_ERR_OOM, "cannot allocate a work handle");
        }
        memcpy(w->call.group, call->group, bytes);
    }
    pthread_mutex_lock(&c->mu);
    if (!c->thread_started) {
        int rc = pthread_create(&c->thread, NULL, progress_main, c);
        if (rc != 0) {
            pthread_mutex_unlock(&c->mu);
            work_release_locked(w);
            return mt_error(MT_ERR_SYSTEM, "comm %s: cannot start its progress thread: %s", c->name, strerror(rc));
        }
        c->thread_started = true;
    }
    w->seq = atomic_fetch_add(&c->seq_issued, 1) + 1;
    wd_note(c, w->seq, call);
    if (c->q_tail) {
        c->q_tail->next = w;
    } else {
        c->q_head = w;
    }
    c->q_tail = w;
    atomic_fetch_add(&c->n_pending, 1);
    pthread_cond_signal(&c->cv_work);
    pthread_mutex_unlock(&c->mu);
    *work = w;
    return MT_OK;
}

/* ---- work handles ---------------------------------------------------------------------------------- */

uint64_t mt_work_seq(const mt_work_t work) {
    return work->seq;
}

mt_status_t mt_work_test(mt_work_t w, bool *done) {
    mt_comm_t c = w->comm;
    if (c->stream_ordered) {
        *done = mt_comm_seq_completed(c) >= w->seq;
        mt_status_t st = (mt_status_t)atomic_load(&c->async_error);
        if (st != MT_OK) {
            *done = true;
            return mt_error(st, "comm %s: %s", c->name, c->last_error);
        }
        return MT_OK;
    }
    *done = atomic_load_explicit(&w->done, memory_order_acquire) != 0;
    if (*done && w->status != MT_OK) {
        return mt_error(w->status, "%s", w->err);
    }
    return MT_OK;
}

mt_status_t mt_work_wait(mt_work_t w, double timeout_s) {
    if (!w) {
        return mt_error(MT_ERR_INVALID_ARG, "mt_work_wait: NULL handle");
    }
    mt_comm_t c = w->comm;
    if (timeout_s < 0) {
        timeout_s = c->timeout_s;
    }
    double t0 = mt_now();
    if (c->stream_ordered) {
        for (;;) {
            bool done = false;
            MT_CHECK(mt_work_test(w, &done));
            if (done) {
                return MT_OK;
            }
            if (mt_now() - t0 >= timeout_s) {
                break;
            }
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    } else {
        if (atomic_load_explicit(&w->done, memory_order_acquire)) {
            return w->status == MT_OK ? MT_OK : mt_error(w->status, "%s", w->err);
        }
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        double t = (double)dl.tv_sec + 1e-9 * (double)dl.tv_nsec + timeout_s;
        dl.tv_sec = (time_t)t;
        dl.tv_nsec = (long)((t - (double)dl.tv_sec) * 1e9);
        pthread_mutex_lock(&c->mu);
        while (!atomic_load(&w->done)) {
            if (pthread_cond_timedwait(&c->cv_done, &c->mu, &dl) == ETIMEDOUT) {
                break;
            }
        }
        bool done = atomic_load(&w->done) != 0;
        pthread_mutex_unlock(&c->mu);
        if (done) {
            return w->status == MT_OK ? MT_OK : mt_error(w->status, "%s", w->err);
        }
    }
    return mt_error(MT_ERR_TIMEOUT,
                    "comm %s (rank %d/%d): %s call %llu did not complete within %.3g s "
                    "(completed up to %llu): a peer rank is missing, stuck or issuing calls in another order",
                    c->name, c->rank, c->size, mt_coll_kind_name(w->call.kind), (unsigned long long)w->seq, timeout_s,
                    (unsigned long long)atomic_load(&c->seq_completed));
}

void mt_work_free(mt_work_t w) {
    if (!w) {
        return;
    }
    mt_comm_t c = w->comm;
    pthread_mutex_lock(&c->mu);
    if (c->stream_ordered || atomic_load(&w->done)) {
        work_release_locked(w);
    } else {
        w->detached = true; /* the progress thread frees it when the call completes */
    }
    pthread_mutex_unlock(&c->mu);
}

/* ---- free ------------------------------------------------------------------------------------------ */

mt_status_t mt_comm_free(mt_comm_t c) {
    if (!c) {
        return MT_OK;
    }
    mt_status_t st = MT_OK;
    if (c->thread_started) {
        st = drain(c, "mt_comm_free");
        if (st == MT_ERR_TIMEOUT) {
            MT_WARN("comm %s: freed with asynchronous work stuck; leaking it: %s", c->name, mt_last_error_msg());
            return st;
        }
        pthread_mutex_lock(&c->mu);
        c->stop = true;
        pthread_cond_signal(&c->cv_work);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL);
    }
    if (c->stream_ordered) {
        double t0 = mt_now();
        while (mt_comm_seq_completed(c) < atomic_load(&c->seq_issued) && mt_now() - t0 < c->timeout_s &&
               atomic_load(&c->async_error) == MT_OK) {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&c->mu);
        while (c->ev_head != c->ev_tail) {
            c->ops[MT_COLL_ALL_REDUCE].be->event_free(c->ops[MT_COLL_ALL_REDUCE].ctx,
                                                      c->events[c->ev_head++ % MT_COLL_EVENT_RING].event);
        }
        pthread_mutex_unlock(&c->mu);
    }
    if (c->in_group) {
        MT_WARN("comm %s freed inside mt_coll_group_start/end: the batched calls are dropped", c->name);
    }
    comm_destroy(c);
    return st;
}
