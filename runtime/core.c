/* Status names, per-thread error text, logging, the abort path and environment parameters: the
 * process-wide plumbing behind runtime/mt_core.h.
 * SPDX-License-Identifier: MIT */
#include "mt_core.h"

#include <ctype.h>
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* ---- status ------------------------------------------------------------------------------- */

const char *mt_status_str(mt_status_t st) {
    static const char *names[MT_STATUS_COUNT] = {
        [MT_OK] = "MT_OK",
        [MT_ERR_CUDA] = "MT_ERR_CUDA",
        [MT_ERR_NCCL] = "MT_ERR_NCCL",
        [MT_ERR_MPI] = "MT_ERR_MPI",
        [MT_ERR_SYSTEM] = "MT_ERR_SYSTEM",
        [MT_ERR_INVALID_ARG] = "MT_ERR_INVALID_ARG",
        [MT_ERR_INVALID_USAGE] = "MT_ERR_INVALID_USAGE",
        [MT_ERR_OOM] = "MT_ERR_OOM",
        [MT_ERR_REMOTE] = "MT_ERR_REMOTE",
        [MT_ERR_INTERNAL] = "MT_ERR_INTERNAL",
        [MT_ERR_TIMEOUT] = "MT_ERR_TIMEOUT",
        [MT_ERR_IO] = "MT_ERR_IO",
        [MT_IN_PROGRESS] = "MT_IN_PROGRESS",
    };
    if ((int)st < 0 || st >= MT_STATUS_COUNT || names[st] == NULL) {
        return "MT_ERR_UNKNOWN";
    }
    return names[st];
}

static _Thread_local char last_error[1024];

mt_status_t mt_error(mt_status_t st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    MT_INFO(MT_LOG_ALL, "%s: %s", mt_status_str(st), last_error);
    return st;
}

const char *mt_last_error_msg(void) { return last_error; }

mt_status_t mt_foreign_error(const char *lib, mt_status_t st, int code, const char *msg, const char *expr,
                             const char *file, int line) {
    mt_log_printf(MT_LOG_WARN, MT_LOG_ALL, file, line, "%s error %d (%s) in %s", lib, code, msg ? msg : "?", expr);
    snprintf(last_error, sizeof(last_error), "%s error %d (%s) in %s", lib, code, msg ? msg : "?", expr);
    return st;
}

/* ---- logging ------------------------------------------------------------------------------ */

_Atomic int mt_log_level_cached = -1;
_Atomic unsigned mt_log_mask_cached = MT_LOG_INIT | MT_LOG_ENV;
static _Atomic int log_rank = -1;
static FILE *log_file;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t log_mutex = PTHREAD_MUTEX_INITIALIZER;
static char log_host[64];

static const struct {
    const char *name;
    unsigned bit;
} subsys_names[] = {
    {"INIT", MT_LOG_INIT}, {"COLL", MT_LOG_COLL},   {"TOPO", MT_LOG_TOPO}, {"MEM", MT_LOG_MEM},
    {"MODEL", MT_LOG_MODEL}, {"ENV", MT_LOG_ENV}, {"PAR", MT_LOG_PAR},   {"TRAIN", MT_LOG_TRAIN},
    {"ALL", MT_LOG_ALL},
};

static const char *subsys_name(unsigned subsys) {
    if (subsys == MT_LOG_ALL) {
        return "ALL";
    }
    for (size_t i = 0; i < MT_ARRAY_LEN(subsys_names); i++) {
        if (subsys_names[i].bit & subsys) {
            return subsys_names[i].name;
        }
    }
    return "?";
}

/* The logging knobs are the one place that reads the environment directly: MT_PARAM logs through
 * this code, so it cannot be used here. They are still listed in docs/params.md. */
static void log_init_once(void) {
    gethostname(log_host, sizeof(log_host) - 1);
    char *dot = strchr(log_host, '.');
    if (dot) {
        *dot = '\0';
    }
    int level = MT_LOG_WARN;
    const char *lv = getenv("MESHTRAIN_LOG_LEVEL");
    if (lv) {
        if (!strcasecmp(lv, "NONE")) {
            level = MT_LOG_NONE;
        } else if (!strcasecmp(lv, "WARN")) {
            level = MT_LOG_WARN;
        } else if (!strcasecmp(lv, "INFO")) {
            level = MT_LOG_INFO;
        } else if (!strcasecmp(lv, "TRACE")) {
            level = MT_LOG_TRACE;
        } else {
            fprintf(stderr, "meshtrain: MESHTRAIN_LOG_LEVEL=%s is not one of NONE, WARN, INFO, TRACE; using WARN\n",
                    lv);
        }
    }
    const char *ss = getenv("MESHTRAIN_LOG_SUBSYS");
    if (ss) {
        unsigned mask = 0;
        char buf[256];
        snprintf(buf, sizeof(buf), "%s", ss);
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            bool found = false;
            for (size_t i = 0; i < MT_ARRAY_LEN(subsys_names); i++) {
                if (!strcasecmp(tok, subsys_names[i].name)) {
                    mask |= subsys_names[i].bit;
                    found = true;
                }
            }
            if (!found) {
                fprintf(stderr, "meshtrain: MESHTRAIN_LOG_SUBSYS: unknown subsystem '%s' (known: INIT COLL TOPO MEM "
                                "MODEL ENV PAR TRAIN ALL)\n", tok);
            }
        }
        atomic_store(&mt_log_mask_cached, mask);
    }
    const char *lf = getenv("MESHTRAIN_LOG_FILE");
    if (lf && *lf) {
        char path[1024];
        size_t o = 0;
        for (const char *p = lf; *p && o + 32 < sizeof(path); p++) {
            if (p[0] == '%' && p[1] == 'h') {
                o += snprintf(path + o, sizeof(path) - o, "%s", log_host);
                p++;
            } else if (p[0] == '%' && p[1] == 'p') {
                o += snprintf(path + o, sizeof(path) - o, "%d", (int)getpid());
                p++;
            } else {
                path[o++] = *p;
            }
        }
        path[o] = '\0';
        log_file = fopen(path, "a");
        if (!log_file) {
            fprintf(stderr, "meshtrain: cannot open MESHTRAIN_LOG_FILE %s: %s; logging to stderr\n", path,
                    strerror(errno));
        }
    }
    atomic_store(&mt_log_level_cached, level);
}

void mt_log_init(void) { pthread_once(&log_once, log_init_once); }

void mt_log_set_rank(int rank) { atomic_store(&log_rank, rank); }

void mt_log_printf(mt_log_level_t level, unsigned subsys, const char *file, int line, const char *fmt, ...) {
    mt_log_init();
    if (level == MT_LOG_WARN && atomic_load(&mt_log_level_cached) < MT_LOG_WARN) {
        return;
    }
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    FILE *out = log_file ? log_file : stderr;
    pthread_mutex_lock(&log_mutex);
    if (level == MT_LOG_WARN) {
        fprintf(out, "%s:%d:%d [WARN] %s (%s:%d)\n", log_host, (int)getpid(), atomic_load(&log_rank), msg, base, line);
    } else {
        fprintf(out, "%s:%d:%d [%s] %s\n", log_host, (int)getpid(), atomic_load(&log_rank), subsys_name(subsys), msg);
    }
    fflush(out);
    pthread_mutex_unlock(&log_mutex);
}

/* ---- abort -------------------------------------------------------------------------------- */

static mt_abort_hook_t abort_hook;
static void *abort_hook_arg;

void mt_set_abort_hook(mt_abort_hook_t hook, void *arg) {
    abort_hook = hook;
    abort_hook_arg = arg;
}

_Noreturn void mt_abort_impl(const char *file, int line, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    mt_log_init();
    fprintf(stderr, "%s:%d:rank %d: meshtrain internal error: %s\n", file, line, atomic_load(&log_rank), msg);
    void *frames[64];
    int n = backtrace(frames, 64);
    backtrace_symbols_fd(frames, n, 2);
    fflush(stderr);
    if (abort_hook) {
        mt_abort_hook_t h = abort_hook;
        abort_hook = NULL; /* never re-enter */
        h(134, abort_hook_arg);
    }
    abort();
}

/* ---- small helpers ------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double mt_median(double *v, size_t n) {
    MT_ASSERT(n >= 1);
    qsort(v, n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- parameters ---------------------------------------------------------------------------- */

bool mt_parse_size(const char *s, int64_t *out) {
    if (!s || !*s) {
        return false;
    }
    errno = 0;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s) {
        return false;
    }
    int64_t mult = 1;
    if (*end) {
        switch (toupper((unsigned char)*end)) {
        case 'K': mult = 1LL << 10; break;
        case 'M': mult = 1LL << 20; break;
        case 'G': mult = 1LL << 30; break;
        default: return false;
        }
        end++;
        if (*end == 'B' || *end == 'b') {
            end++;
        }
        if (*end) {
            return false;
        }
    }
    if (v < 0 ? v < INT64_MIN / mult : v > INT64_MAX / mult) {
        return false;
    }
    *out = (int64_t)v * mult;
    return true;
}

static pthread_mutex_t param_mutex = PTHREAD_MUTEX_INITIALIZER;

int64_t mt_param_load(const char *suffix, int64_t dflt, _Atomic int64_t *cache, _Atomic int *state) {
    pthread_mutex_lock(&param_mutex);
    if (atomic_load(state) != 2) {
        char name[128];
        snprintf(name, sizeof(name), "MESHTRAIN_%s", suffix);
        int64_t v = dflt;
        const char *env = getenv(name);
        if (env) {
            if (mt_parse_size(env, &v)) {
                MT_INFO(MT_LOG_ENV, "%s set by environment to %lld", name, (long long)v);
            } else {
                MT_WARN("%s=%s is not an integer (K/M/G suffixes allowed); using the default %lld", name, env,
                        (long long)dflt);
                v = dflt;
            }
        }
        atomic_store(cache, v);
        atomic_store_explicit(state, 2, memory_order_release);
    }
    pthread_mutex_unlock(&param_mutex);
    return atomic_load(cache);
}

const char *mt_param_str_load(const char *suffix, const char *dflt, _Atomic(const char *) *cache,
                              _Atomic int *state) {
    pthread_mutex_lock(&param_mutex);
    if (atomic_load(state) != 2) {
        char name[128];
        snprintf(name, sizeof(name), "MESHTRAIN_%s", suffix);
        const char *env = getenv(name);
        const char *v = dflt;
        if (env && *env) {
            v = strdup(env);
            MT_INFO(MT_LOG_ENV, "%s set by environment to %s", name, v);
        }
        atomic_store(cache, v);
        atomic_store_explicit(state, 2, memory_order_release);
    }
    pthread_mutex_unlock(&param_mutex);
    return atomic_load(cache);
}

double mt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
