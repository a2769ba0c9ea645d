/* A recording device table for tests: the CPU table's entries, each counted, every live block tracked by
 * category, so a test can hold a module to doing all its device work through the table it is given
 * (tests/parallel/test_engine_device.c, tests/parallel3d/test_p3d_device.c).
 * SPDX-License-Identifier: MIT */
#ifndef MT_TEST_REC_DEVICE_H
#define MT_TEST_REC_DEVICE_H

#include "runtime/device_impl.h"

#define REC_MAX_BLOCKS 4096

typedef struct {
    struct mt_device base; /* the CPU table's entries */
    void *ptr[REC_MAX_BLOCKS];
    int64_t bytes[REC_MAX_BLOCKS];
    mt_mem_cat_t cat[REC_MAX_BLOCKS];
    int n_live;
    int64_t live[MT_MEM_NCAT], peak[MT_MEM_NCAT]; /* accounted bytes (mt_alloc_accounted) by category */
    int64_t allocs, frees, unknown_frees, zeros, sumsqs, steps, copies, waits;
} rec_device_t;

/* What the table saw since the last rec_reset (one table per process). */
extern rec_device_t rec;
/* The table ("recording-cpu"), ready after rec_install. */
extern struct mt_device rec_table;

void rec_install(void);
/* Forgets the counts and the blocks (keeps the table). */
void rec_reset(void);

#endif
