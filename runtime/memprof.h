/* The memory profiler behind profile.memory: while on, records every allocation and free the runtime
 * allocator sees (time, host/device, category, bytes, owner) and the breakdown at the peak, by
 * category and by owner, so an out-of-memory can be explained. Writes one JSON file per rank.
 * SPDX-License-Identifier: MIT */
#ifndef MT_MEMPROF_H
#define MT_MEMPROF_H

#include "mt_core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Starts recording (installs the allocator hook; resets the host/device peaks to now). */
void mt_memprof_start(void);
/* Stops recording (removes the hook); the history is kept for mt_memprof_write. */
void mt_memprof_stop(void);
/* Number of recorded events. */
size_t mt_memprof_count(void);
/* Writes {"rank", "events": [...], "peak": {...by category, by owner}} to path (atomically: path.tmp
 * then rename). MT_ERR_IO naming the path if it cannot. Frees the history. */
mt_status_t mt_memprof_write(const char *path, int rank);

#ifdef __cplusplus
}
#endif
#endif
