/* The foundation every meshtrain module includes: one closed status enum, error text, checked-call
 * macros, always-on assertions with an abort hook, levelled logging by subsystem, and environment
 * parameters read once through one macro.
 * SPDX-License-Identifier: MIT */
#ifndef MT_CORE_H
#define MT_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>

#include "mt_build_config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ------------------------------------------------------------------------------- */

/* Every fallible call returns one of these. Anything the environment can cause (a failed library
 * call, a bad argument at the API, out of memory, a peer that failed) is a status, never an abort. */
typedef enum {
    MT_OK = 0,
    MT_ERR_CUDA,
    MT_ERR_NCCL,
    MT_ERR_MPI,
    MT_ERR_SYSTEM,
    MT_ERR_INVALID_ARG,
    MT_ERR_INVALID_USAGE,
    MT_ERR_OOM,
    MT_ERR_REMOTE,
    MT_ERR_INTERNAL,
    MT_ERR_TIMEOUT,
    MT_ERR_IO,
    MT_IN_PROGRESS,
    MT_STATUS_COUNT
} mt_status_t;

/* Name of a status ("MT_ERR_MPI"); never NULL. */
const char *mt_status_str(mt_status_t st);

/* Records a human-readable description of the last error of this thread (printf format) and returns
 * st, so a failing call can do `return mt_error(MT_ERR_IO, "cannot open %s: %s", path, strerror(e));`.
 * The message is also logged at INFO(ALL) so a trail exists even when the caller drops it. */
mt_status_t mt_error(mt_status_t st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The message recorded by the last mt_error() on this thread ("" if none). Valid until the next. */
const char *mt_last_error_msg(void);

/* ---- logging ------------------------------------------------------------------------------ */

typedef enum { MT_LOG_NONE = 0, MT_LOG_WARN = 1, MT_LOG_INFO = 2, MT_LOG_TRACE = 3 } mt_log_level_t;

/* Subsystem mask bits; MESHTRAIN_LOG_SUBSYS=INIT,COLL selects (default INIT,ENV; ALL for all). */
enum {
    MT_LOG_INIT = 1u << 0,
    MT_LOG_COLL = 1u << 1,
    MT_LOG_TOPO = 1u << 2,
    MT_LOG_MEM = 1u << 3,
    MT_LOG_MODEL = 1u << 4,
    MT_LOG_ENV = 1u << 5,
    MT_LOG_PAR = 1u << 6,
    MT_LOG_TRAIN = 1u << 7,
    MT_LOG_ALL = ~0u
};

extern _Atomic int mt_log_level_cached;    /* -1 until the environment has been read */
extern _Atomic unsigned mt_log_mask_cached;
void mt_log_init(void);
void mt_log_printf(mt_log_level_t level, unsigned subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The rank shown in log prefixes; set by the runtime once MPI is up (-1 before). */
void mt_log_set_rank(int rank);

static inline bool mt_log_enabled(mt_log_level_t level, unsigned subsys) {
    if (atomic_load_explicit(&mt_log_level_cached, memory_order_relaxed) < 0) {
        mt_log_init();
    }
    return atomic_load_explicit(&mt_log_level_cached, memory_order_relaxed) >= (int)level &&
           (level == MT_LOG_WARN || (atomic_load_explicit(&mt_log_mask_cached, memory_order_relaxed) & subsys));
}

/* Level and mask are checked before the arguments are formatted. */
#define MT_WARN(...) mt_log_printf(MT_LOG_WARN, MT_LOG_ALL, __FILE__, __LINE__, __VA_ARGS__)
#define MT_INFO(subsys, ...)                                                       \
    do {                                                                           \
        if (mt_log_enabled(MT_LOG_INFO, (subsys))) {                               \
            mt_log_printf(MT_LOG_INFO, (subsys), __FILE__, __LINE__, __VA_ARGS__); \
        }                                                                          \
    } while (0)
#define MT_TRACE(subsys, ...)                                                       \
    do {                                                                            \
        if (mt_log_enabled(MT_LOG_TRACE, (subsys))) {                               \
            mt_log_printf(MT_LOG_TRACE, (subsys), __FILE__, __LINE__, __VA_ARGS__); \
        }                                                                           \
    } while (0)

/* ---- checked calls -------------------------------------------------------------------------- */

/* MT_CHECK(call): return the status of a failing call, leaving a cheap backtrace in the INFO log. */
#define MT_CHECK(call)                                                                           \
    do {                                                                                         \
        mt_status_t mt_check_st_ = (call);                                                       \
        if (mt_check_st_ != MT_OK && mt_check_st_ != MT_IN_PROGRESS) {                           \
            MT_INFO(MT_LOG_ALL, "%s:%d -> %s", __FILE__, __LINE__, mt_status_str(mt_check_st_)); \
            return mt_check_st_;                                                                 \
        }                                                                                        \
    } while (0)

/* MT_CHECK_GOTO(call, st, label): store the status in st and jump to the single cleanup label. */
#define MT_CHECK_GOTO(call, st, label)                                                 \
    do {                                                                               \
        (st) = (call);                                                                 \
        if ((st) != MT_OK && (st) != MT_IN_PROGRESS) {                                 \
            MT_INFO(MT_LOG_ALL, "%s:%d -> %s", __FILE__, __LINE__, mt_status_str(st)); \
            goto label;                                                                \
        }                                                                              \
    } while (0)

/* Maps a foreign library's error code to a status, logging WARN with that library's message.
 * lib is "MPI", "CUDA", ... ; msg the library's own text for code. Returns st when code != ok. */
mt_status_t mt_foreign_error(const char *lib, mt_status_t st, int code, const char *msg, const char *expr,
                             const char *file, int line);

/* MT_MPI_CHECK(call): an MPI call that returns MPI_SUCCESS or an MPI error code. Requires <mpi.h>. */
#define MT_MPI_CHECK(call)                                                              \
    do {                                                                                \
        int mt_mpi_rc_ = (call);                                                        \
        if (mt_mpi_rc_ != MPI_SUCCESS) {                                                \
            char mt_mpi_msg_[MPI_MAX_ERROR_STRING];                                     \
            int mt_mpi_len_ = 0;                                                        \
            MPI_Error_string(mt_mpi_rc_, mt_mpi_msg_, &mt_mpi_len_);                    \
            return mt_foreign_error("MPI", MT_ERR_MPI, mt_mpi_rc_, mt_mpi_msg_, #call,  \
                                    __FILE__, __LINE__);                                \
        }                                                                               \
    } while (0)

/* ---- assertions and abort ---------------------------------------------------------------- */

/* Called by MT_ABORT before the process dies; launch/ installs one that calls MPI_Abort so a dead
 * rank takes the whole job down with its message instead of leaving the others hanging. */
typedef void (*mt_abort_hook_t)(int exit_code, void *arg);
void mt_set_abort_hook(mt_abort_hook_t hook, void *arg);

/* Prints "file:line:rank: message" and a backtrace to stderr, calls the abort hook, then abort(). */
_Noreturn void mt_abort_impl(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* For broken internal invariants only: always on, never compiled out. */
#define MT_ABORT(...) mt_abort_impl(__FILE__, __LINE__, __VA_ARGS__)
#define MT_ASSERT(cond)                                        \
    do {                                                       \
        if (!(cond)) {                                         \
            mt_abort_impl(__FILE__, __LINE__, "assertion failed: %s", #cond); \
        }                                                      \
    } while (0)

/* ---- environment parameters --------------------------------------------------------------- */

/* Reads MESHTRAIN_<suffix> once (an integer; K/M/G suffixes accepted), caches it, logs INFO(ENV)
 * when the environment overrides the default. A malformed value is a WARN and keeps the default. */
int64_t mt_param_load(const char *suffix, int64_t dflt, _Atomic int64_t *cache, _Atomic int *state);

/* MT_PARAM(name, "SUFFIX", default) defines `static int64_t mt_param_<name>(void)`. Put it at file scope
 * next to its use and list it in docs/params.md. */
#define MT_PARAM(name, suffix, dflt)                                                  \
    static int64_t mt_param_##name(void) {                                            \
        static _Atomic int64_t cache_;                                                \
        static _Atomic int state_;                                                    \
        if (atomic_load_explicit(&state_, memory_order_acquire) == 2) {               \
            return atomic_load_explicit(&cache_, memory_order_relaxed);               \
        }                                                                             \
        return mt_param_load(suffix, (dflt), &cache_, &state_);                       \
    }

/* String parameters: MESHTRAIN_<suffix>, read once; returns dflt (may be NULL) when unset. The
 * returned string lives for the process. */
const char *mt_param_str_load(const char *suffix, const char *dflt, _Atomic(const char *) *cache,
                              _Atomic int *state);
#define MT_PARAM_STR(name, suffix, dflt)                                                \
    static const char *mt_param_##name(void) {                                          \
        static _Atomic(const char *) cache_;                                            \
        static _Atomic int state_;                                                      \
        if (atomic_load_explicit(&state_, memory_order_acquire) == 2) {                 \
            return atomic_load_explicit(&cache_, memory_order_relaxed);                 \
        }                                                                               \
        return mt_param_str_load(suffix, (dflt), &cache_, &state_);                     \
    }

/* ---- small helpers ------------------------------------------------------------------------- */

/* Monotonic time in seconds. */
double mt_now(void);

/* Sorts v[0..n) ascending in place and returns its median (the mean of the two middle values for even n);
 * n >= 1. For benchmark figures. */
double mt_median(double *v, size_t n);

/* Parses "123", "64K", "1M", "2G" (binary multiples) into *out. Returns false on anything else. */
bool mt_parse_size(const char *s, int64_t *out);

#define MT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define MT_MAX(a, b) ((a) > (b) ? (a) : (b))
#define MT_DIV_UP(a, b) (((a) + (b) - 1) / (b))
#define MT_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#ifdef __cplusplus
}
#endif
#endif /* MT_CORE_H */
