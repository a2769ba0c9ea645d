/* The recording device table of rec_device.h.
 * SPDX-License-Identifier: MIT */
#include <string.h>

#include "rec_device.h"

rec_device_t rec;
struct mt_device rec_table;

void rec_reset(void) {
    struct mt_device base = rec.base;
    memset(&rec, 0, sizeof(rec));
    rec.base = base;
}

static mt_status_t rec_alloc(void **ptr, size_t bytes, mt_mem_cat_t cat, const char *owner, void *stream) {
    MT_CHECK(rec.base.alloc(ptr, bytes, cat, owner, stream));
    if (rec.n_live == REC_MAX_BLOCKS) {
        return mt_error(MT_ERR_OOM, "recording device table: more than %d live blocks", REC_MAX_BLOCKS);
    }
    int64_t b = (int64_t)mt_alloc_accounted(bytes);
    rec.ptr[rec.n_live] = *ptr;
    rec.bytes[rec.n_live] = b;
    rec.cat[rec.n_live++] = cat;
    rec.live[cat] += b;
    rec.peak[cat] = MT_MAX(rec.peak[cat], rec.live[cat]);
    rec.allocs++;
    return MT_OK;
}

static void rec_free(void *ptr) {
    rec.frees++;
    for (int i = 0; i < rec.n_live; i++) {
        if (rec.ptr[i] == ptr) {
            rec.live[rec.cat[i]] -= rec.bytes[i];
            rec.n_live--;
            rec.ptr[i] = rec.ptr[rec.n_live];
            rec.bytes[i] = rec.bytes[rec.n_live];
            rec.cat[i] = rec.cat[rec.n_live];
            rec.base.free(ptr);
            return;
        }
    }
    rec.unknown_frees++; /* not from this table: left alone, reported by the test */
}

static mt_status_t rec_copy(void *dst, const void *src, size_t bytes, void *stream) {
    rec.copies++;
    return rec.base.copy(dst, src, bytes, stream);
}

static mt_status_t rec_zero(void *ptr, size_t bytes, void *stream) {
    rec.zeros++;
    return rec.base.zero(ptr, bytes, stream);
}

static mt_status_t rec_wait(void *stream) {
    rec.waits++;
    return rec.base.wait(stream);
}

static mt_status_t rec_sumsq(double *sumsq, int *nonfinite, const float *x, size_t n, void *stream) {
    rec.sumsqs++;
    return rec.base.sumsq(sumsq, nonfinite, x, n, stream);
}

static mt_status_t rec_step(const mt_device_step_t *s, float *param, const float *grad, float *m, float *v, size_t n,
                            void *stream) {
    rec.steps++;
    return rec.base.step(s, param, grad, m, v, n, stream);
}

void rec_install(void) {
    rec.base = *mt_device_cpu();
    rec_table = rec.base;
    rec_table.name = "recording-cpu";
    rec_table.alloc = rec_alloc;
    rec_table.free = rec_free;
    rec_table.copy = rec_copy;
    rec_table.zero = rec_zero;
    rec_table.wait = rec_wait;
    rec_table.sumsq = rec_sumsq;
    rec_table.step = rec_step;
}
