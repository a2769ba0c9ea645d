/* Allocation history for profile.memory: an allocator hook appends events; live bytes per owner are
 * tracked so the owner breakdown at the highest total can be written next to the category breakdown.
 * SPDX-License-Identifier: MIT */
#include "memprof.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

typedef struct {
    double t;
    int where, cat;
    int64_t bytes;
    const char *owner;
} mem_event_t;

typedef struct {
    const char *owner;
    int cat;
    int64_t live, at_peak;
} owner_t;

static pthread_mutex_t mp_mutex = PTHREAD_MUTEX_INITIALIZER;
static mem_event_t *ev;
static size_t n_ev, cap_ev;
static owner_t *owners;
static size_t n_owners, cap_owners;
static int64_t live_total, peak_total;
static int64_t live_cat[MT_MEM_NCAT], peak_cat[MT_MEM_NCAT];
static double t_start;

static owner_t *owner_slot(const char *owner, int cat) {
    for (size_t i = 0; i < n_owners; i++) {
        if (owners[i].cat == cat && (owners[i].owner == owner || (owner && owners[i].owner &&
                                                                   !strcmp(owners[i].owner, owner)))) {
            return &owners[i];
        }
    }
    if (n_owners == cap_owners) {
        size_t cap = cap_owners ? cap_owners * 2 : 64;
        owner_t *o = realloc(owners, cap * sizeof(owner_t));
        if (!o) {
            return NULL;
        }
        owners = o;
        cap_owners = cap;
    }
    owners[n_owners] = (owner_t){.owner = owner, .cat = cat};
    return &owners[n_owners++];
}

static void hook(mt_mem_where_t where, mt_mem_cat_t cat, int64_t bytes, const void *ptr, const char *owner,
                 void *arg) {
    pthread_mutex_lock(&mp_mutex);
    if (n_ev == cap_ev) {
        size_t cap = cap_ev ? cap_ev * 2 : 4096;
        mem_event_t *e = realloc(ev, cap * sizeof(mem_event_t));
        if (!e) {
            pthread_mutex_unlock(&mp_mutex);
            return;
        }
        ev = e;
        cap_ev = cap;
    }
    ev[n_ev++] = (mem_event_t){mt_now() - t_start, (int)where, (int)cat, bytes, owner};
    owner_t *o = owner_slot(owner, (int)cat);
    if (o) {
        o->live += bytes;
    }
    live_total += bytes;
    live_cat[cat] += bytes;
    if (live_total > peak_total) {
        peak_total = live_total;
        memcpy(peak_cat, live_cat, sizeof(peak_cat));
        for (size_t i = 0; i < n_owners; i++) {
            owners[i].at_peak = owners[i].live;
        }
    }
    pthread_mutex_unlock(&mp_mutex);
}

void mt_memprof_start(void) {
    pthread_mutex_lock(&mp_mutex);
    /* Start from what is already held, so the peak is of the real footprint. */
    mt_mem_stats_t h, d;
    mt_mem_stats(MT_MEM_HOST, &h);
    mt_mem_stats(MT_MEM_DEVICE, &d);
    live_total = peak_total = h.total_current + d.total_current;
    for (int c = 0; c < MT_MEM_NCAT; c++) {
        live_cat[c] = peak_cat[c] = h.current[c] + d.current[c];
    }
    t_start = mt_now();
    pthread_mutex_unlock(&mp_mutex);
    mt_mem_reset_peak(MT_MEM_HOST);
    mt_mem_reset_peak(MT_MEM_DEVICE);
    mt_mem_set_hook(hook, NULL);
}

void mt_memprof_stop(void) { mt_mem_set_hook(NULL, NULL); }

size_t mt_memprof_count(void) {
    pthread_mutex_lock(&mp_mutex);
    size_t n = n_ev;
    pthread_mutex_unlock(&mp_mutex);
    return n;
}

mt_status_t mt_memprof_write(const char *path, int rank) {
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        return mt_error(MT_ERR_IO, "cannot write memory profile %s: %s", tmp, strerror(errno));
    }
    pthread_mutex_lock(&mp_mutex);
    fprintf(f, "{\"rank\":%d,\"note\":\"bytes held before profiling started are in the peak but not in events\",\n",
            rank);
    fprintf(f, "\"peak\":{\"total_bytes\":%lld,\"by_category\":{", (long long)peak_total);
    for (int c = 0; c < MT_MEM_NCAT; c++) {
        fprintf(f, "%s\"%s\":%lld", c ? "," : "", mt_mem_cat_name((mt_mem_cat_t)c), (long long)peak_cat[c]);
    }
    fputs("},\"by_owner\":[", f);
    bool first = true;
    for (size_t i = 0; i < n_owners; i++) {
        if (owners[i].at_peak > 0) {
            fprintf(f, "%s{\"owner\":\"%s\",\"category\":\"%s\",\"bytes\":%lld}", first ? "" : ",",
                    owners[i].owner ? owners[i].owner : "?", mt_mem_cat_name((mt_mem_cat_t)owners[i].cat),
                    (long long)owners[i].at_peak);
            first = false;
        }
    }
    fputs("]},\n\"events\":[\n", f);
    for (size_t i = 0; i < n_ev; i++) {
        fprintf(f, "%s{\"t_s\":%.6f,\"where\":\"%s\",\"category\":\"%s\",\"bytes\":%lld,\"owner\":\"%s\"}",
                i ? ",\n" : "", ev[i].t, ev[i].where == MT_MEM_HOST ? "host" : "device",
                mt_mem_cat_name((mt_mem_cat_t)ev[i].cat), (long long)ev[i].bytes, ev[i].owner ? ev[i].owner : "?");
    }
    fputs("\n]}\n", f);
    free(ev);
    ev = NULL;
    n_ev = cap_ev = 0;
    free(owners);
    owners = NULL;
    n_owners = cap_owners = 0;
    pthread_mutex_unlock(&mp_mutex);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        return mt_error(MT_ERR_IO, "cannot write memory profile %s", tmp);
    }
    if (rename(tmp, path) != 0) {
        return mt_error(MT_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    }
    return MT_OK;
}
