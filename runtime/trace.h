/* The timeline profiler: named regions that the code opens and closes (data, forward/backward of each
 * module, collectives, pipeline send/recv, optimizer, checkpoint), recorded per thread into per-rank
 * buffers and merged by rank 0 into one Chrome trace-event JSON file (Perfetto, chrome://tracing): one
 * process per rank, one track per thread. Clocks are aligned to rank 0's at start-up. When tracing is
 * off a region costs one relaxed atomic load and a branch.
 * SPDX-License-Identifier: MIT */
#ifndef MT_TRACE_H
#define MT_TRACE_H

#include <mpi.h>

#include "mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

extern _Atomic int mt_trace_active;

/* True while events are being recorded. */
static inline bool mt_trace_on(void) { return atomic_load_explicit(&mt_trace_active, memory_order_relaxed) != 0; }

/* Microseconds on this rank's trace clock (monotonic, shifted by the offset to rank 0 measured by
 * mt_trace_sync_clocks). */
double mt_trace_now_us(void);

/* Measures this rank's clock offset to rank 0 of comm (collective; ping-pong, the round trip with the
 * least delay wins). Call once at start-up, before recording. */
mt_status_t mt_trace_sync_clocks(MPI_Comm comm);

/* Measured offset (µs added to the local clock) and the round trip it was measured with. */
void mt_trace_clock_offset(double *offset_us, double *rtt_us);

/* Starts / stops recording on this rank. Events recorded stay until mt_trace_write or mt_trace_reset. */
void mt_trace_start(void);
void mt_trace_stop(void);
void mt_trace_reset(void);

/* Names the calling thread's track ("main", "coll progress", "data loader"). */
void mt_trace_thread_name(const char *name);

/* Records a complete span [t0_us, t1_us] on the calling thread. cat and name are copied. args_json, if
 * not NULL, is the text of a JSON object's members without braces (`"bytes": 4096, "seq": 12`). */
void mt_trace_span(const char *cat, const char *name, double t0_us, double t1_us, const char *args_json);

/* Records an instant event (e.g. a desync report) and a counter sample (e.g. memory in bytes). */
void mt_trace_instant(const char *cat, const char *name, const char *args_json);
void mt_trace_counter(const char *name, const char *series, double value);

/* A region: `MT_TRACE_BEGIN(t); ... MT_TRACE_END(t, "forward", "block.3");` */
#define MT_TRACE_BEGIN(var) double var = mt_trace_on() ? mt_trace_now_us() : 0.0
#define MT_TRACE_END(var, cat, name)                                \
    do {                                                            \
        if (mt_trace_on() && (var) > 0.0) {                         \
            mt_trace_span((cat), (name), (var), mt_trace_now_us(), NULL); \
        }                                                           \
    } while (0)

/* Number of events recorded on this rank. */
size_t mt_trace_count(void);

/* Collective over comm: gathers every rank's events to rank 0, which writes one Chrome trace JSON file
 * at path (process = rank, named "rank R (host)"; tracks = threads), written to path.tmp then renamed.
 * Errors (rank 0 cannot write) are returned on every rank as MT_ERR_IO with the path named. */
mt_status_t mt_trace_write(MPI_Comm comm, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* MT_TRACE_H */
