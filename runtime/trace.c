/* Event recording for the timeline profiler: a growable per-process buffer of fixed-size records
 * behind one mutex (regions are coarse: modules, collectives, steps), clock alignment by ping-pong,
 * and the merge of all ranks into one Chrome trace file by rank 0.
 * SPDX-License-Identifier: MIT */
#include "trace.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

_Atomic int mt_trace_active;

typedef enum { EV_SPAN, EV_INSTANT, EV_COUNTER, EV_THREAD_NAME } ev_kind_t;

typedef struct {
    ev_kind_t kind;
    int tid;
    double t0, t1;
    char cat[16];
    char name[48];
    char *args; /* malloc'd or NULL */
    double value;
} event_t;

static pthread_mutex_t trace_mutex = PTHREAD_MUTEX_INITIALIZER;
static event_t *events;
static size_t n_events, cap_events;
static double clock_offset_us, clock_rtt_us;
static _Atomic int next_tid = 1;
static _Thread_local int my_tid;

static int thread_id(void) {
    if (my_tid == 0) {
        my_tid = atomic_fetch_add(&next_tid, 1);
    }
    return my_tid;
}

double mt_trace_now_us(void) { return mt_now() * 1e6 + clock_offset_us; }

void mt_trace_clock_offset(double *offset_us, double *rtt_us) {
    if (offset_us) {
        *offset_us = clock_offset_us;
    }
    if (rtt_us) {
        *rtt_us = clock_rtt_us;
    }
}

mt_status_t mt_trace_sync_clocks(MPI_Comm comm) {
    int rank, size;
    MT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    MT_MPI_CHECK(MPI_Comm_size(comm, &size));
    const int rounds = 8, tag = 7301;
    for (int peer = 1; peer < size; peer++) {
        if (rank == 0) {
            for (int i = 0; i < rounds; i++) {
                double dummy, now;
                MT_MPI_CHECK(MPI_Recv(&dummy, 1, MPI_DOUBLE, peer, tag, comm, MPI_STATUS_IGNORE));
                now = mt_now() * 1e6;
                MT_MPI_CHECK(MPI_Send(&now, 1, MPI_DOUBLE, peer, tag, comm));
            }
        } else if (rank == peer) {
            double best_rtt = 1e30, best_off = 0;
            for (int i = 0; i < rounds; i++) {
                double t_send = mt_now() * 1e6, remote;
                MT_MPI_CHECK(MPI_Send(&t_send, 1, MPI_DOUBLE, 0, tag, comm));
                MT_MPI_CHECK(MPI_Recv(&remote, 1, MPI_DOUBLE, 0, tag, comm, MPI_STATUS_IGNORE));
                double t_recv = mt_now() * 1e6, rtt = t_recv - t_send;
                if (rtt < best_rtt) {
                    best_rtt = rtt;
                    best_off = remote - 0.5 * (t_send + t_recv);
                }
            }
            clock_offset_us = best_off;
            clock_rtt_us = best_rtt;
        }
    }
    MT_INFO(MT_LOG_INIT, "trace clock offset to rank 0: %.1f us (round trip %.1f us)", clock_offset_us, clock_rtt_us);
    return MT_OK;
}

void mt_trace_start(void) { atomic_store(&mt_trace_active, 1); }
void mt_trace_stop(void) { atomic_store(&mt_trace_active, 0); }

void mt_trace_reset(void) {
    pthread_mutex_lock(&trace_mutex);
    for (size_t i = 0; i < n_events; i++) {
        free(events[i].args);
    }
    free(events);
    events = NULL;
    n_events = cap_events = 0;
    pthread_mutex_unlock(&trace_mutex);
}

size_t mt_trace_count(void) {
    pthread_mutex_lock(&trace_mutex);
    size_t n = n_events;
    pthread_mutex_unlock(&trace_mutex);
    return n;
}

static void push(event_t *ev) {
    pthread_mutex_lock(&trace_mutex);
    if (n_events == cap_events) {
        size_t cap = cap_events ? cap_events * 2 : 4096;
        event_t *e = realloc(events, cap * sizeof(event_t));
        if (!e) {
            pthread_mutex_unlock(&trace_mutex);
            free(ev->args);
            MT_WARN("trace: out of memory; event %s dropped", ev->name);
            return;
        }
        events = e;
        cap_events = cap;
    }
    events[n_events++] = *ev;
    pthread_mutex_unlock(&trace_mutex);
}

static void fill(event_t *ev, ev_kind_t kind, const char *cat, const char *name, const char *args) {
    memset(ev, 0, sizeof(*ev));
    ev->kind = kind;
    ev->tid = thread_id();
    snprintf(ev->cat, sizeof(ev->cat), "%s", cat ? cat : "");
    snprintf(ev->name, sizeof(ev->name), "%s", name ? name : "");
    ev->args = args ? strdup(args) : NULL;
}

void mt_trace_thread_name(const char *name) {
    event_t ev;
    fill(&ev, EV_THREAD_NAME, "", name, NULL);
    push(&ev); /* recorded even when off, so later spans of this thread have a named track */
}

void mt_trace_span(const char *cat, const char *name, double t0_us, double t1_us, const char *args_json) {
    if (!mt_trace_on()) {
        return;
    }
    event_t ev;
    fill(&ev, EV_SPAN, cat, name, args_json);
    ev.t0 = t0_us;
    ev.t1 = t1_us;
    push(&ev);
}

void mt_trace_instant(const char *cat, const char *name, const char *args_json) {
    if (!mt_trace_on()) {
        return;
    }
    event_t ev;
    fill(&ev, EV_INSTANT, cat, name, args_json);
    ev.t0 = mt_trace_now_us();
    push(&ev);
}

void mt_trace_counter(const char *name, const char *series, double value) {
    if (!mt_trace_on()) {
        return;
    }
    event_t ev;
    fill(&ev, EV_COUNTER, "counter", name, NULL);
    snprintf(ev.cat, sizeof(ev.cat), "%s", series ? series : "value");
    ev.t0 = mt_trace_now_us();
    ev.value = value;
    push(&ev);
}

/* Writes s as a JSON string body (escaping quotes, backslashes and control characters). */
static void json_str(FILE *f, const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            fprintf(f, "\\%c", c);
        } else if (c < 0x20) {
            fprintf(f, "\\u%04x", c);
        } else {
            fputc(c, f);
        }
    }
}

/* This rank's events as JSON objects separated by ",\n" (no surrounding brackets). */
static char *serialize(int rank, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    pthread_mutex_lock(&trace_mutex);
    for (size_t i = 0; i < n_events; i++) {
        const event_t *e = &events[i];
        fputs(i ? ",\n" : "", f);
        switch (e->kind) {
        case EV_THREAD_NAME:
            fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"", rank,
                    e->tid);
            json_str(f, e->name);
            fputs("\"}}", f);
            break;
        case EV_SPAN:
        case EV_INSTANT:
            fprintf(f, "{\"ph\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,", e->kind == EV_SPAN ? "X" : "i", rank,
                    e->tid, e->t0);
            if (e->kind == EV_SPAN) {
                fprintf(f, "\"dur\":%.3f,", e->t1 > e->t0 ? e->t1 - e->t0 : 0.0);
            } else {
                fputs("\"s\":\"p\",", f);
            }
            fputs("\"cat\":\"", f);
            json_str(f, e->cat);
            fputs("\",\"name\":\"", f);
            json_str(f, e->name);
            fprintf(f, "\",\"args\":{%s}}", e->args ? e->args : "");
            break;
        case EV_COUNTER:
            fprintf(f, "{\"ph\":\"C\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"name\":\"", rank, e->tid, e->t0);
            json_str(f, e->name);
            fputs("\",\"args\":{\"", f);
            json_str(f, e->cat);
            fprintf(f, "\":%.17g}}", e->value);
            break;
        }
    }
    pthread_mutex_unlock(&trace_mutex);
    fclose(f);
    return buf;
}

mt_status_t mt_trace_write(MPI_Comm comm, const char *path) {
    int rank, size;
    MT_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    MT_MPI_CHECK(MPI_Comm_size(comm, &size));
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    size_t len = 0;
    char *mine = serialize(rank, &len);
    if (len > (size_t)INT32_MAX) {
        MT_WARN("trace of rank %d is %zu bytes; truncating it to 2 GiB", rank, len);
        len = 0;
    }
    int my_len = (int)len;
    int *lens = NULL, *displs = NULL;
    char *all = NULL, (*hosts)[256] = NULL;
    long long total = 0;
    if (rank == 0) {
        lens = calloc((size_t)size, sizeof(int));
        displs = calloc((size_t)size, sizeof(int));
        hosts = calloc((size_t)size, 256);
    }
    MT_MPI_CHECK(MPI_Gather(&my_len, 1, MPI_INT, lens, 1, MPI_INT, 0, comm));
    MT_MPI_CHECK(MPI_Gather(host, 256, MPI_CHAR, hosts, 256, MPI_CHAR, 0, comm));
    if (rank == 0) {
        for (int r = 0; r < size; r++) {
            displs[r] = (int)total;
            total += lens[r];
        }
        if (total > INT32_MAX) {
            MT_WARN("merged trace exceeds 2 GiB; keeping only rank 0's events");
            for (int r = 1; r < size; r++) {
                lens[r] = 0;
                displs[r] = 0;
            }
            total = lens[0];
        }
        all = malloc((size_t)total + 1);
    }
    MT_MPI_CHECK(MPI_Gatherv(mine, my_len, MPI_CHAR, all, lens, displs, MPI_CHAR, 0, comm));
    free(mine);
    int ok = 1;
    char err[512] = "";
    if (rank == 0) {
        char tmp[4096];
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        FILE *f = fopen(tmp, "w");
        if (!f) {
            ok = 0;
            snprintf(err, sizeof(err), "cannot write trace file %s: %s", tmp, strerror(errno));
        } else {
            fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", f);
            bool first = true;
            for (int r = 0; r < size; r++) {
                fprintf(f, "%s{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":\"rank %d (",
                        first ? "" : ",\n", r, r);
                json_str(f, hosts[r]);
                fprintf(f,
                        ")\"}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,"
                        "\"args\":{\"sort_index\":%d}}",
                        r, r);
                first = false;
                if (lens[r] > 0) {
                    fputs(",\n", f);
                    fwrite(all + displs[r], 1, (size_t)lens[r], f);
                }
            }
            fputs("\n]}\n", f);
            if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
                ok = 0;
                snprintf(err, sizeof(err), "cannot write trace file %s: %s", tmp, strerror(errno));
            }
            fclose(f);
            if (ok && rename(tmp, path) != 0) {
                ok = 0;
                snprintf(err, sizeof(err), "cannot rename %s to %s: %s", tmp, path, strerror(errno));
            }
        }
        free(all);
        free(lens);
        free(displs);
        free(hosts);
    }
    MT_MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, comm));
    if (!ok) {
        if (rank == 0) {
            MT_WARN("%s", err);
        }
        return mt_error(MT_ERR_IO, "%s", rank == 0 ? err : "rank 0 could not write the trace file");
    }
    return MT_OK;
}
