/* Tiny test harness: checks that count failures and say where, a closing line per test, and a
 * multi-rank verdict (any rank failing fails the test on every rank).
 * SPDX-License-Identifier: MIT */
#ifndef MT_TESTUTIL_H
#define MT_TESTUTIL_H

#include <math.h>
#include <stdio.h>

#include "runtime/mt_core.h"

#define MT_TEST_SKIP 77

extern int mt_test_failures;
extern int mt_test_checks;

#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        mt_test_checks++;                                                        \
        if (!(cond)) {                                                           \
            mt_test_failures++;                                                  \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);      \
            fprintf(stderr, __VA_ARGS__);                                        \
            fprintf(stderr, "\n");                                               \
        }                                                                        \
    } while (0)

#define CHECK_OK(call)                                                                          \
    do {                                                                                        \
        mt_status_t chk_st_ = (call);                                                           \
        CHECK(chk_st_ == MT_OK, "%s returned %s (%s)", #call, mt_status_str(chk_st_), mt_last_error_msg()); \
    } while (0)

/* |a-b| <= atol + rtol*|b| */
#define CHECK_CLOSE(a, b, rtol, atol)                                                                       \
    do {                                                                                                    \
        double chk_a_ = (double)(a), chk_b_ = (double)(b);                                                  \
        CHECK(fabs(chk_a_ - chk_b_) <= (atol) + (rtol) * fabs(chk_b_), "%s = %.9g, %s = %.9g", #a, chk_a_, #b, \
              chk_b_);                                                                                      \
    } while (0)

/* Prints "name: N checks, M failed" and returns the exit code (0 or 1). */
int mt_test_finish(const char *name);

/* Multi-rank: MPI is up (mt_rt_init). All ranks agree: the test fails if any rank failed. */
int mt_test_finish_mpi(const char *name);

#endif
