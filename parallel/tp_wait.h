/* Bounded waits for the model-parallel code (tp, pipeline, parallel3d): every collective is issued with a
 * work handle and waited for with a timeout, so a missing or stuck peer ends in MT_ERR_TIMEOUT naming the
 * operation, the comm and its sequence number instead of a hang.
 * SPDX-License-Identifier: MIT */
#ifndef MT_TP_WAIT_H
#define MT_TP_WAIT_H

#include "collectives/coll.h"

/* Completes the call that `issued` is the status of and that wrote *w: waits up to timeout_s (< 0: the
 * comm's default timeout) and frees the handle. Usage:
 *   mt_work_t w = NULL;
 *   MT_CHECK(mt_mp_wait(mt_coll_all_reduce(comm, buf, buf, n, MT_COLL_F32, MT_REDOP_SUM, NULL, &w), &w, -1));
 * (the handle is passed by address: C leaves the order of argument evaluation open). */
static inline mt_status_t mt_mp_wait(mt_status_t issued, mt_work_t *w, double timeout_s) {
    if (issued != MT_OK) {
        mt_work_free(*w);
        *w = NULL;
        return issued;
    }
    mt_status_t st = mt_work_wait(*w, timeout_s);
    mt_work_free(*w);
    *w = NULL;
    return st;
}

#endif /* MT_TP_WAIT_H */
