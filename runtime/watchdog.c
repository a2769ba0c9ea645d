/* The hang watchdog (see watchdog.h): a registry of groups with a ring of their recent calls, a thread
 * that checks for a call pending too long, and the desync round: query every member of the stuck group
 * over a private MPI communicator, classify the answers (waiting in the call / passed it / never arrived
 * / no answer), let exactly one rank print the report, then end the job.
 * SPDX-License-Identifier: MIT */
#include "runtime/watchdog.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/alloc.h"
#include "runtime/rt.h"
#include "runtime/trace.h"

MT_PARAM(watchdog_s, "WATCHDOG_S", 600)
MT_PARAM(watchdog_answer_s, "WATCHDOG_ANSWER_S", 5)
MT_PARAM(test_hang_step, "TEST_HANG_STEP", 0)
MT_PARAM(test_kill_step, "TEST_KILL_STEP", 0)
MT_PARAM(test_fault_rank, "TEST_FAULT_RANK", 0)

#define WD_RING 1024 /* calls remembered per group: more outstanding calls than this lose their details */
#define WD_OP_LEN 24
#define WD_NAME_LEN 48
#define WD_TAG_QUERY 0x5744
#define WD_TAG_ANSWER 0x5745
#define WD_TAG_DONE 0x5746 /* the reporter tells everyone the job is ending (launchers that keep survivors) */
#define WD_SERVE_S 0.02    /* how often the thread answers peers */

typedef struct {
    uint64_t seq;
    const char *op;
    uint64_t bytes;
    int peer;
    double t;
} wd_slot_t;

struct mt_wd_group {
    char name[WD_NAME_LEN];
    uint64_t hash, occ; /* identity across ranks: name + members, and the how-many-th such group */
    int size, rank;
    int *world; /* group rank -> MPI_COMM_WORLD rank */
    mt_wd_completed_fn completed;
    mt_wd_abort_fn abort_fn;
    void *arg;
    pthread_mutex_t mu;
    uint64_t issued;
    wd_slot_t ring[WD_RING];
    struct mt_wd_group *next;
};

/* What one rank says about call #seq of a group. Sent as bytes: every rank runs the same binary. */
typedef struct {
    uint64_t hash, occ, seq;
    int32_t rank, member, fired, pad;
    uint64_t issued, completed;
    char op_at[WD_OP_LEN]; /* the op this rank issued as #seq ("" if it has not) */
    uint64_t bytes_at;
    int32_t peer_at, pad2;
    double age_at; /* how long it has waited in #seq (if waiting) */
    char last_op[WD_OP_LEN];
    char busy_group[WD_NAME_LEN]; /* its oldest pending call on any group ("" if none) */
    uint64_t busy_seq;
    char busy_op[WD_OP_LEN];
    double busy_age;
} wd_answer_t;

typedef struct {
    uint64_t hash, occ, seq;
    int32_t asker, pad;
} wd_query_t;

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct mt_wd_group *groups;
/* How many groups of each identity were ever registered: the k-th "dp" over the same members is the k-th
 * on every member, because communicators are created collectively in the same order. Never reset. */
static struct { uint64_t hash, count; } * occ_tab;
static size_t n_occ, cap_occ;

/* The round in progress (watchdog thread only). */
typedef struct {
    uint64_t hash, occ, seq;
    wd_answer_t *ans; /* by world rank */
    bool *got;
} wd_round_t;

static struct {
    bool running, multi;
    pthread_t thread;
    MPI_Comm side;
    int rank, size;
    double timeout_s, poll_s, answer_s;
    int exit_code;
    char *report_path;
    _Atomic int stop;
    bool fired;
    wd_round_t *round;
    /* answers in flight, one slot per destination */
    wd_answer_t *out_ans;
    MPI_Request *out_req;
    wd_query_t *out_q;
    MPI_Request *out_qreq;
} wd;

/* ---- registry ------------------------------------------------------------------------------------ */

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ b[i]) * 1099511628211ull;
    }
    return h;
}

mt_wd_group_t mt_watchdog_group_register(const char *name, MPI_Comm comm, mt_wd_completed_fn completed,
                                         mt_wd_abort_fn abort_fn, void *arg) {
    if (comm == MPI_COMM_NULL || !completed) {
        return NULL;
    }
    struct mt_wd_group *g = mt_calloc(sizeof(*g), MT_MEM_COMM, "watchdog");
    if (!g) {
        return NULL;
    }
    snprintf(g->name, sizeof(g->name), "%s", name ? name : "comm");
    MPI_Comm_size(comm, &g->size);
    MPI_Comm_rank(comm, &g->rank);
    g->world = mt_alloc(sizeof(int) * 2 * (size_t)g->size, MT_MEM_COMM, "watchdog");
    if (!g->world) {
        mt_free(g);
        return NULL;
    }
    int *in = g->world + g->size; /* scratch: 0..size-1, then reused as nothing */
    for (int i = 0; i < g->size; i++) {
        in[i] = i;
    }
    MPI_Group gc, gw;
    MPI_Comm_group(comm, &gc);
    MPI_Comm_group(MPI_COMM_WORLD, &gw);
    MPI_Group_translate_ranks(gc, g->size, in, gw, g->world);
    MPI_Group_free(&gc);
    MPI_Group_free(&gw);
    g->completed = completed;
    g->abort_fn = abort_fn;
    g->arg = arg;
    pthread_mutex_init(&g->mu, NULL);
    uint64_t h = fnv(1469598103934665603ull, g->name, strlen(g->name));
    g->hash = fnv(h, g->world, sizeof(int) * (size_t)g->size);

    pthread_mutex_lock(&reg_mu);
    size_t i = 0;
    while (i < n_occ && occ_tab[i].hash != g->hash) {
        i++;
    }
    if (i == n_occ) {
        if (n_occ == cap_occ) {
            size_t cap = cap_occ ? 2 * cap_occ : 16;
            void *p = realloc(occ_tab, cap * sizeof(*occ_tab));
            if (!p) {
                pthread_mutex_unlock(&reg_mu);
                pthread_mutex_destroy(&g->mu);
                mt_free(g->world);
                mt_free(g);
                return NULL;
            }
            occ_tab = p;
            cap_occ = cap;
        }
        occ_tab[n_occ].hash = g->hash;
        occ_tab[n_occ++].count = 0;
    }
    g->occ = occ_tab[i].count++;
    g->next = groups;
    groups = g;
    pthread_mutex_unlock(&reg_mu);
    return g;
}

void mt_watchdog_group_unregister(mt_wd_group_t g) {
    if (!g) {
        return;
    }
    pthread_mutex_lock(&reg_mu);
    for (struct mt_wd_group **p = &groups; *p; p = &(*p)->next) {
        if (*p == g) {
            *p = g->next;
            break;
        }
    }
    pthread_mutex_unlock(&reg_mu);
    pthread_mutex_destroy(&g->mu);
    mt_free(g->world);
    mt_free(g);
}

void mt_watchdog_op_begin(mt_wd_group_t g, uint64_t seq, const char *op, size_t bytes, int peer) {
    if (!g) {
        return;
    }
    double t = mt_now();
    pthread_mutex_lock(&g->mu);
    g->ring[seq % WD_RING] = (wd_slot_t){seq, op, bytes, peer, t};
    if (seq > g->issued) {
        g->issued = seq;
    }
    pthread_mutex_unlock(&g->mu);
}

/* The slot of call seq if it is still remembered. Caller holds g->mu. */
static const wd_slot_t *slot_of(const struct mt_wd_group *g, uint64_t seq) {
    const wd_slot_t *s = &g->ring[seq % WD_RING];
    return (seq > 0 && s->seq == seq) ? s : NULL;
}

/* Progress of a group: issued and completed (completed clamped to issued). Caller holds reg_mu. */
static void group_progress(struct mt_wd_group *g, uint64_t *issued, uint64_t *completed) {
    uint64_t c = g->completed(g->arg);
    pthread_mutex_lock(&g->mu);
    *issued = g->issued;
    pthread_mutex_unlock(&g->mu);
    *completed = c < *issued ? c : *issued;
}

/* This rank's oldest pending call over all groups. Caller holds reg_mu. */
static void busy_of(double now, wd_answer_t *a) {
    double best = -1.0;
    for (struct mt_wd_group *g = groups; g; g = g->next) {
        uint64_t is, co;
        group_progress(g, &is, &co);
        if (co >= is) {
            continue;
        }
        pthread_mutex_lock(&g->mu);
        const wd_slot_t *s = slot_of(g, co + 1);
        double age = s ? now - s->t : 0.0;
        if (age > best) {
            best = age;
            snprintf(a->busy_group, sizeof(a->busy_group), "%s", g->name);
            a->busy_seq = co + 1;
            snprintf(a->busy_op, sizeof(a->busy_op), "%s", s && s->op ? s->op : "?");
            a->busy_age = age;
        }
        pthread_mutex_unlock(&g->mu);
    }
}

static void make_answer(uint64_t hash, uint64_t occ, uint64_t seq, wd_answer_t *a) {
    memset(a, 0, sizeof(*a));
    a->hash = hash;
    a->occ = occ;
    a->seq = seq;
    a->rank = wd.rank;
    a->fired = wd.fired;
    a->peer_at = -1;
    double now = mt_now();
    pthread_mutex_lock(&reg_mu);
    for (struct mt_wd_group *g = groups; g; g = g->next) {
        if (g->hash != hash || g->occ != occ) {
            continue;
        }
        a->member = 1;
        group_progress(g, &a->issued, &a->completed);
        pthread_mutex_lock(&g->mu);
        const wd_slot_t *s = a->issued >= seq ? slot_of(g, seq) : NULL;
        if (s) {
            snprintf(a->op_at, sizeof(a->op_at), "%s", s->op ? s->op : "?");
            a->bytes_at = s->bytes;
            a->peer_at = s->peer;
            a->age_at = a->completed < seq ? now - s->t : 0.0;
        }
        const wd_slot_t *l = slot_of(g, a->issued);
        snprintf(a->last_op, sizeof(a->last_op), "%s", l && l->op ? l->op : "");
        pthread_mutex_unlock(&g->mu);
        break;
    }
    busy_of(now, a);
    pthread_mutex_unlock(&reg_mu);
}

/* ---- the side channel -------------------------------------------------------------------------------- */

static void send_answer(int dest, const wd_answer_t *a) {
    MPI_Request *r = &wd.out_req[dest];
    if (*r != MPI_REQUEST_NULL) {
        int done = 0;
        MPI_Test(r, &done, MPI_STATUS_IGNORE);
        if (!done) {
            return; /* the previous answer to that rank is still in flight: it will ask again if it must */
        }
    }
    wd.out_ans[dest] = *a;
    MPI_Isend(&wd.out_ans[dest], (int)sizeof(*a), MPI_BYTE, dest, WD_TAG_ANSWER, wd.side, r);
}

/* Answers queries and files answers to the round in progress. */
static void serve(void) {
    for (;;) {
        int flag = 0;
        MPI_Status status;
        if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, wd.side, &flag, &status) != MPI_SUCCESS || !flag) {
            return;
        }
        if (status.MPI_TAG == WD_TAG_QUERY) {
            wd_query_t q;
            MPI_Recv(&q, (int)sizeof(q), MPI_BYTE, status.MPI_SOURCE, WD_TAG_QUERY, wd.side, MPI_STATUS_IGNORE);
            wd_answer_t a;
            make_answer(q.hash, q.occ, q.seq, &a);
            send_answer(status.MPI_SOURCE, &a);
        } else if (status.MPI_TAG == WD_TAG_ANSWER) {
            wd_answer_t a;
            MPI_Recv(&a, (int)sizeof(a), MPI_BYTE, status.MPI_SOURCE, WD_TAG_ANSWER, wd.side, MPI_STATUS_IGNORE);
            wd_round_t *r = wd.round;
            if (r && a.hash == r->hash && a.occ == r->occ && a.seq == r->seq) {
                r->ans[status.MPI_SOURCE] = a;
                r->got[status.MPI_SOURCE] = true;
            }
        } else if (status.MPI_TAG == WD_TAG_DONE) {
            int32_t from = -1;
            MPI_Recv(&from, 1, MPI_INT32_T, status.MPI_SOURCE, WD_TAG_DONE, wd.side, MPI_STATUS_IGNORE);
            /* The report is out; a launcher that did not end us on the reporter's MPI_Abort gets our exit. */
            MT_INFO(MT_LOG_COLL, "watchdog: rank %d reported a stuck call; ending", (int)from);
            mt_rt_abort_job(wd.exit_code);
        } else {
            char junk[1];
            MPI_Recv(junk, 0, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, wd.side, MPI_STATUS_IGNORE);
        }
    }
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---- the report ----------------------------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, len;
} sbuf_t;

static void sb_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf_t *b, const char *fmt, ...) {
    if (b->len >= b->n) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->p + b->len, b->n - b->len, fmt, ap);
    va_end(ap);
    if (k > 0) {
        b->len = MT_MIN(b->n - 1, b->len + (size_t)k);
    }
}

/* Appends the world ranks of the members with flag[i] set: "1, 3, 5". */
static void sb_ranks(sbuf_t *b, const int *world, const bool *flag, int n) {
    bool first = true;
    for (int i = 0; i < n; i++) {
        if (flag[i]) {
            sb_printf(b, "%s%d", first ? "" : ", ", world[i]);
            first = false;
        }
    }
    if (first) {
        sb_printf(b, "none");
    }
}

int mt_watchdog_local_view(char *buf, size_t n) {
    sbuf_t b = {buf, n, 0};
    if (n > 0) {
        buf[0] = '\0';
    }
    int count = 0;
    double now = mt_now();
    pthread_mutex_lock(&reg_mu);
    for (struct mt_wd_group *g = groups; g; g = g->next) {
        uint64_t is, co;
        group_progress(g, &is, &co);
        if (co >= is) {
            continue;
        }
        count++;
        pthread_mutex_lock(&g->mu);
        const wd_slot_t *s = slot_of(g, co + 1);
        sb_printf(&b, "  comm '%s' (%d ranks): call #%llu %s (%llu bytes) pending %.1f s; %llu issued\n", g->name,
                  g->size, (unsigned long long)(co + 1), s && s->op ? s->op : "?",
                  (unsigned long long)(s ? s->bytes : 0), s ? now - s->t : 0.0, (unsigned long long)is);
        pthread_mutex_unlock(&g->mu);
    }
    pthread_mutex_unlock(&reg_mu);
    return count;
}

MT_PARAM(wd_abort_grace_ms, "WD_ABORT_GRACE_MS", 10000)
static atomic_bool aborts_done;

/* Every registered group's abort (the reporter's last step before MPI_Abort), then aborts_done. */
static void *abort_groups(void *arg) {
    (void)arg;
    pthread_mutex_lock(&reg_mu);
    for (struct mt_wd_group *g = groups; g; g = g->next) {
        if (g->abort_fn) {
            g->abort_fn(g->arg);
        }
    }
    pthread_mutex_unlock(&reg_mu);
    atomic_store(&aborts_done, true);
    return NULL;
}

/* Prints the report (one write), records it in the trace and the report file, then ends the job. */
static _Noreturn void report_and_abort(const char *text, const char *trace_args) {
    fputs(text, stderr);
    fflush(stderr);
    if (mt_trace_on()) {
        mt_trace_instant("watchdog", "desync report", trace_args);
    }
    if (wd.report_path) {
        FILE *f = fopen(wd.report_path, "w");
        size_t n = strlen(wd.report_path);
        if (f && n > 5 && !strcmp(wd.report_path + n - 5, ".json")) {
            /* A Chrome trace-event file of its own: the job's trace is written collectively at the end,
             * which an aborted job never reaches; this one opens next to it in Perfetto. */
            fprintf(f,
                    "{\"traceEvents\": [{\"name\": \"desync report\", \"cat\": \"watchdog\", \"ph\": \"i\", "
                    "\"s\": \"g\", \"ts\": %.3f, \"pid\": %d, \"tid\": 0, \"args\": {%s, \"report\": \"",
                    mt_trace_now_us(), wd.rank, trace_args);
            for (const char *c = text; *c; c++) {
                if (*c == '"' || *c == '\\') {
                    fprintf(f, "\\%c", *c);
                } else if (*c == '\n') {
                    fputs("\\n", f);
                } else if ((unsigned char)*c >= 0x20) {
                    fputc(*c, f);
                }
            }
            fputs("\"}}]}\n", f);
            fclose(f);
        } else if (f) {
            fputs(text, f);
            fclose(f);
        } else {
            MT_WARN("watchdog: cannot write the report to %s", wd.report_path);
        }
    }
    if (wd.multi) {
        /* Launchers that keep the survivors of an MPI_Abort (Open MPI --enable-recovery, srun without
         * --kill-on-bad-exit) would leave the other ranks to time out and report again: tell them. */
        static int32_t me;
        me = wd.rank;
        MPI_Request *req = calloc((size_t)wd.size, sizeof(MPI_Request));
        for (int d = 0; req && d < wd.size; d++) {
            req[d] = MPI_REQUEST_NULL;
            if (d != wd.rank) {
                MPI_Isend(&me, 1, MPI_INT32_T, d, WD_TAG_DONE, wd.side, &req[d]);
            }
        }
        double t0 = mt_now();
        int all = 0;
        while (req && !all && mt_now() - t0 < 1.0) {
            MPI_Testall(wd.size, req, &all, MPI_STATUSES_IGNORE);
            sleep_s(0.005);
        }
    }
    /* The comms' own aborts (ncclCommAbort) run on a thread of their own, given MESHTRAIN_WD_ABORT_GRACE_MS: one
     * can wait on another comm's kernel that spins on the stuck peer (NVIDIA/nccl#564) and never return. The job
     * ends the same with or without them. */
    pthread_t t;
    if (pthread_create(&t, NULL, abort_groups, NULL) == 0) {
        pthread_detach(t);
        double t0 = mt_now(), grace = (double)mt_param_wd_abort_grace_ms() / 1000.0;
        while (!atomic_load(&aborts_done) && mt_now() - t0 < grace) {
            sleep_s(0.005);
        }
        if (!atomic_load(&aborts_done)) {
            fprintf(stderr, "meshtrain watchdog: rank %d: the communicators' aborts did not return within %g s; "
                            "ending the job without them\n", wd.rank, grace);
        }
    }
    mt_rt_abort_job(wd.exit_code);
}

typedef struct {
    char name[WD_NAME_LEN];
    uint64_t hash, occ, seq;
    int size, me;
    int *world;
} wd_stuck_t;

static bool is_member(const wd_stuck_t *st, int world_rank) {
    for (int i = 0; i < st->size; i++) {
        if (st->world[i] == world_rank) {
            return true;
        }
    }
    return false;
}

/* The desync round for call st->seq of a group. Every rank of the world is asked (not only the group's
 * members: a rank stuck elsewhere, or dead, is often the cause); the report is printed by the lowest
 * rank whose own oldest pending call is overdue, so one report comes out however many ranks are stuck.
 * Never returns. */
static _Noreturn void fire(const wd_stuck_t *st) {
    wd.fired = true;
    int n = st->size, W = wd.size;
    wd_answer_t *ans = calloc((size_t)W, sizeof(*ans));
    bool *got = calloc((size_t)W, sizeof(bool)), *waiting = calloc((size_t)n, sizeof(bool)),
         *passed = calloc((size_t)n, sizeof(bool)), *never = calloc((size_t)n, sizeof(bool)),
         *culprit = calloc((size_t)n, sizeof(bool));
    size_t cap = 8192 + 512 * (size_t)W;
    char *text = malloc(cap), *args = malloc(cap);
    if (!ans || !got || !waiting || !passed || !never || !culprit || !text || !args) {
        fprintf(stderr,
                "meshtrain watchdog: rank %d: call #%llu on comm '%s' is stuck (out of memory for the "
                "report); aborting\n",
                wd.rank, (unsigned long long)st->seq, st->name);
        mt_rt_abort_job(wd.exit_code);
    }
    make_answer(st->hash, st->occ, st->seq, &ans[wd.rank]);
    got[wd.rank] = true;
    const wd_answer_t *mine = &ans[wd.rank];
    wd_round_t round = {st->hash, st->occ, st->seq, ans, got};
    if (wd.multi) {
        wd.round = &round;
        wd_query_t q = {st->hash, st->occ, st->seq, wd.rank, 0};
        for (int d = 0; d < W; d++) {
            if (d != wd.rank && wd.out_qreq[d] == MPI_REQUEST_NULL) {
                wd.out_q[d] = q;
                MPI_Isend(&wd.out_q[d], (int)sizeof(q), MPI_BYTE, d, WD_TAG_QUERY, wd.side, &wd.out_qreq[d]);
            }
        }
        double t0 = mt_now();
        for (;;) {
            serve();
            int missing = 0;
            for (int d = 0; d < W; d++) {
                missing += !got[d];
            }
            if (missing == 0 || mt_now() - t0 > wd.answer_s) {
                break;
            }
            sleep_s(0.005);
        }
    }
    /* Who reports: the lowest rank whose oldest pending call has waited at least half the timeout. */
    int printer = wd.rank;
    double printer_age = wd.timeout_s;
    for (int d = 0; d < wd.rank; d++) {
        if (got[d] && ans[d].busy_group[0] && ans[d].busy_age >= 0.5 * wd.timeout_s) {
            printer = d;
            printer_age = ans[d].busy_age;
            break;
        }
    }
    if (printer != wd.rank) {
        /* Serve its query, and report ourselves only if it has not ended the job when it should have. */
        double grace = MT_MAX(0.0, wd.timeout_s - printer_age) + wd.poll_s + wd.answer_s + 2.0;
        double t0 = mt_now();
        wd.round = NULL;
        while (mt_now() - t0 < grace) {
            serve();
            sleep_s(WD_SERVE_S);
        }
        MT_WARN("watchdog: rank %d was expected to report a stuck call and has not: reporting instead", printer);
    }
    for (int i = 0; i < n; i++) {
        int d = st->world[i];
        const wd_answer_t *a = &ans[d];
        if (!got[d] || !a->member) {
            culprit[i] = got[d] || wd.multi;
        } else if (a->completed >= st->seq) {
            passed[i] = true;
        } else if (a->issued >= st->seq) {
            waiting[i] = true;
        } else {
            never[i] = culprit[i] = true;
        }
    }
    sbuf_t b = {text, cap, 0};
    const char *op = mine->op_at[0] ? mine->op_at : "?";
    sb_printf(&b, "meshtrain watchdog: DESYNC on comm '%s' (%d ranks): call #%llu %s", st->name, n,
              (unsigned long long)st->seq, op);
    if (mine->peer_at >= 0) {
        sb_printf(&b, " with group rank %d (world rank %d)", mine->peer_at,
                  mine->peer_at < n ? st->world[mine->peer_at] : -1);
    }
    sb_printf(&b, " of %llu bytes has been pending for %.1f s on rank %d (runtime.watchdog_s = %g)\n",
              (unsigned long long)mine->bytes_at, mine->age_at, wd.rank, wd.timeout_s);
    if (!wd.multi) {
        sb_printf(&b, "  (no side channel: MPI granted no MPI_THREAD_MULTIPLE, so only this rank's view)\n");
    }
    sb_printf(&b, "  waiting in call #%llu: ranks ", (unsigned long long)st->seq);
    sb_ranks(&b, st->world, waiting, n);
    sb_printf(&b, "\n");
    for (int i = 0; i < n; i++) {
        int d = st->world[i];
        const wd_answer_t *a = &ans[d];
        if (waiting[i] && strcmp(a->op_at, op) != 0) {
            sb_printf(&b, "  MISMATCH: rank %d issued call #%llu as %s (%llu bytes), not %s\n", d,
                      (unsigned long long)st->seq, a->op_at, (unsigned long long)a->bytes_at, op);
        }
        if (never[i]) {
            sb_printf(&b, "  NEVER ARRIVED: rank %d (issued up to call #%llu%s%s, completed #%llu); ", d,
                      (unsigned long long)a->issued, a->last_op[0] ? " " : "", a->last_op,
                      (unsigned long long)a->completed);
            if (a->busy_group[0]) {
                sb_printf(&b, "it is waiting in call #%llu %s on comm '%s' for %.1f s\n",
                          (unsigned long long)a->busy_seq, a->busy_op, a->busy_group, a->busy_age);
            } else {
                sb_printf(&b, "it is not inside any collective (computing, or stuck outside communication)\n");
            }
        }
        if (got[d] && !a->member) {
            sb_printf(&b,
                      "  NEVER ARRIVED: rank %d has no comm '%s' of these members (never created it, or freed "
                      "it)\n",
                      d, st->name);
        }
    }
    bool any = false;
    for (int i = 0; i < n; i++) {
        any |= passed[i];
    }
    if (any) {
        sb_printf(&b, "  already completed call #%llu: ranks ", (unsigned long long)st->seq);
        sb_ranks(&b, st->world, passed, n);
        sb_printf(&b, "\n");
    }
    if (wd.multi) {
        for (int d = 0; d < W; d++) {
            if (!got[d]) {
                sb_printf(&b,
                          "  LOST: rank %d did not answer the watchdog within %.1f s: it is dead or unresponsive "
                          "(killed, crashed, out of memory, or its node is gone)\n",
                          d, wd.answer_s);
            } else if (!is_member(st, d) && ans[d].busy_group[0]) {
                sb_printf(&b, "  rank %d is waiting in call #%llu %s on comm '%s' for %.1f s\n", d,
                          (unsigned long long)ans[d].busy_seq, ans[d].busy_op, ans[d].busy_group, ans[d].busy_age);
            }
        }
    }
    sbuf_t ab = {args, cap, 0};
    sb_printf(&ab, "\"comm\": \"%s\", \"seq\": %llu, \"op\": \"%s\", \"missing\": [", st->name,
              (unsigned long long)st->seq, op);
    bool first = true;
    for (int i = 0; i < n; i++) {
        if (culprit[i]) {
            sb_printf(&ab, "%s%d", first ? "" : ", ", st->world[i]);
            first = false;
        }
    }
    sb_printf(&ab, "]");
    sb_printf(&b, "meshtrain watchdog: ranks that never arrived at call #%llu %s on comm '%s': ",
              (unsigned long long)st->seq, op, st->name);
    sb_ranks(&b, st->world, culprit, n);
    sb_printf(&b, "; aborting the job (exit status %d)\n", wd.exit_code);
    report_and_abort(text, args);
}

/* Finds the group whose oldest pending call has waited longest beyond the timeout. */
static bool find_overdue(wd_stuck_t *out) {
    bool found = false;
    double now = mt_now(), worst = wd.timeout_s;
    pthread_mutex_lock(&reg_mu);
    for (struct mt_wd_group *g = groups; g; g = g->next) {
        uint64_t is, co;
        group_progress(g, &is, &co);
        if (co >= is) {
            continue;
        }
        pthread_mutex_lock(&g->mu);
        const wd_slot_t *s = slot_of(g, co + 1);
        if (s && now - s->t > worst) {
            worst = now - s->t;
            found = true;
            snprintf(out->name, sizeof(out->name), "%s", g->name);
            out->hash = g->hash;
            out->occ = g->occ;
            out->seq = co + 1;
            out->size = g->size;
            out->me = g->rank;
            free(out->world);
            out->world = malloc(sizeof(int) * (size_t)g->size);
            if (out->world) {
                memcpy(out->world, g->world, sizeof(int) * (size_t)g->size);
            } else {
                found = false;
            }
        }
        pthread_mutex_unlock(&g->mu);
    }
    pthread_mutex_unlock(&reg_mu);
    return found;
}

static void *wd_main(void *arg) {
    (void)arg;
    mt_trace_thread_name("watchdog");
    double last_check = mt_now();
    wd_stuck_t st = {0};
    while (!atomic_load(&wd.stop)) {
        if (wd.multi) {
            serve();
        }
        if (mt_now() - last_check >= wd.poll_s) {
            last_check = mt_now();
            if (find_overdue(&st)) {
                fire(&st);
            }
        }
        sleep_s(WD_SERVE_S);
    }
    free(st.world);
    if (!wd.multi) {
        return NULL;
    }
    /* Stop together: keep answering until every rank has stopped (peers may still be asking). */
    MPI_Request bar;
    MPI_Ibarrier(wd.side, &bar);
    double t0 = mt_now();
    for (;;) {
        int done = 0;
        MPI_Test(&bar, &done, MPI_STATUS_IGNORE);
        if (done) {
            break;
        }
        if (mt_now() - t0 > wd.timeout_s) {
            MT_WARN("watchdog: not every rank stopped its watchdog within %.0f s; stopping anyway", wd.timeout_s);
            return (void *)1;
        }
        serve();
        sleep_s(WD_SERVE_S);
    }
    return NULL;
}

/* ---- start / stop ------------------------------------------------------------------------------------ */

bool mt_watchdog_running(void) {
    return wd.running;
}

mt_status_t mt_watchdog_start(const mt_watchdog_params_t *params) {
    mt_watchdog_params_t p = MT_WATCHDOG_PARAMS_INIT;
    if (params) {
        if (params->size != sizeof(p)) {
            return mt_error(MT_ERR_INVALID_ARG, "mt_watchdog_start: params.size not set (use MT_WATCHDOG_PARAMS_INIT)");
        }
        p = *params;
    }
    if (wd.running) {
        return mt_error(MT_ERR_INVALID_USAGE, "mt_watchdog_start: the watchdog is already running");
    }
    double timeout = p.timeout_s > 0 ? p.timeout_s : (double)mt_param_watchdog_s();
    if (!(timeout > 0)) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "watchdog timeout %g s: must be > 0 (runtime.watchdog_s or "
                        "MESHTRAIN_WATCHDOG_S)",
                        timeout);
    }
    int level = MPI_THREAD_SINGLE;
    MT_MPI_CHECK(MPI_Query_thread(&level));
    MT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &wd.rank));
    MT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &wd.size));
    wd.multi = level >= MPI_THREAD_MULTIPLE;
    wd.timeout_s = timeout;
    wd.poll_s = p.poll_s > 0 ? p.poll_s : MT_MIN(1.0, MT_MAX(0.05, timeout / 8));
    wd.answer_s = p.answer_s > 0 ? p.answer_s : (double)MT_MAX(1, mt_param_watchdog_answer_s());
    wd.exit_code = p.exit_code;
    free(wd.report_path);
    wd.report_path = p.report_path ? strdup(p.report_path) : NULL;
    wd.fired = false;
    wd.round = NULL;
    atomic_store(&wd.stop, 0);
    wd.side = MPI_COMM_NULL;
    if (wd.multi) {
        MT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &wd.side));
        MPI_Comm_set_errhandler(wd.side, MPI_ERRORS_RETURN);
        wd.out_ans = calloc((size_t)wd.size, sizeof(*wd.out_ans));
        wd.out_q = calloc((size_t)wd.size, sizeof(*wd.out_q));
        wd.out_req = malloc(sizeof(MPI_Request) * (size_t)wd.size);
        wd.out_qreq = malloc(sizeof(MPI_Request) * (size_t)wd.size);
        if (!wd.out_ans || !wd.out_q || !wd.out_req || !wd.out_qreq) {
            MPI_Comm_free(&wd.side);
            return mt_error(MT_ERR_OOM, "watchdog: out of memory");
        }
        for (int i = 0; i < wd.size; i++) {
            wd.out_req[i] = wd.out_qreq[i] = MPI_REQUEST_NULL;
        }
    } else {
        MT_WARN("watchdog: MPI granted thread level %d, not MPI_THREAD_MULTIPLE: hangs are still detected, but "
                "the report shows only each stuck rank's own view",
                level);
    }
    int rc = pthread_create(&wd.thread, NULL, wd_main, NULL);
    if (rc != 0) {
        if (wd.multi) {
            MPI_Comm_free(&wd.side);
        }
        return mt_error(MT_ERR_SYSTEM, "watchdog: cannot start its thread: %s", strerror(rc));
    }
    wd.running = true;
    MT_INFO(MT_LOG_COLL,
            "watchdog: calls pending over %g s are reported and abort the job (poll %.2f s, side "
            "channel %s)",
            wd.timeout_s, wd.poll_s, wd.multi ? "MPI" : "none");
    return MT_OK;
}

mt_status_t mt_watchdog_stop(void) {
    if (!wd.running) {
        return MT_OK;
    }
    atomic_store(&wd.stop, 1);
    void *ret = NULL;
    pthread_join(wd.thread, &ret);
    wd.running = false;
    mt_status_t st = MT_OK;
    if (wd.multi) {
        bool clean = ret == NULL;
        for (int i = 0; clean && i < wd.size; i++) {
            /* Answers and queries are small eager messages; one still in flight means a peer is gone. */
            int d1 = 1, d2 = 1;
            if (wd.out_req[i] != MPI_REQUEST_NULL) {
                MPI_Test(&wd.out_req[i], &d1, MPI_STATUS_IGNORE);
            }
            if (wd.out_qreq[i] != MPI_REQUEST_NULL) {
                MPI_Test(&wd.out_qreq[i], &d2, MPI_STATUS_IGNORE);
            }
            clean = d1 && d2;
        }
        if (clean) {
            MPI_Comm_free(&wd.side);
            free(wd.out_ans);
            free(wd.out_q);
            free(wd.out_req);
            free(wd.out_qreq);
        } else {
            st = mt_error(MT_ERR_TIMEOUT, "watchdog: stopped with peers unaccounted for (side channel left open)");
        }
        wd.out_ans = NULL;
        wd.out_q = NULL;
        wd.out_req = wd.out_qreq = NULL;
    }
    free(wd.report_path);
    wd.report_path = NULL;
    return st;
}

void mt_watchdog_test_fault(int64_t step, int rank) {
    if (rank != mt_param_test_fault_rank()) {
        return;
    }
    if (step == mt_param_test_kill_step()) {
        fprintf(stderr, "test knob: rank %d kills itself (SIGKILL) at step %lld\n", rank, (long long)step);
        fflush(stderr);
        raise(SIGKILL);
    }
    if (step == mt_param_test_hang_step()) {
        fprintf(stderr, "test knob: rank %d stops at step %lld (outside any collective)\n", rank, (long long)step);
        fflush(stderr);
        for (;;) {
            sleep_s(1.0);
        }
    }
}
