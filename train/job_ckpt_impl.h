/* Shared inside the checkpoint module (train/job_ckpt*.c): the pieces, the manifest and the set-up/save
 * protocol each in its own file. Not for use outside train/job_ckpt*.c.
 * SPDX-License-Identifier: MIT */
#ifndef MT_TRAIN_JOB_CKPT_IMPL_H
#define MT_TRAIN_JOB_CKPT_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "train/job_impl.h"
#include "train/job_json.h"

/* job_ckpt.c */
/* Reads a whole small file (manifest, latest) into a NUL-terminated buffer; at most max bytes. */
mt_status_t ckpt_slurp(const char *path, size_t max, char **out, size_t *len);

/* job_ckpt_pieces.c */
/* Copies the intersection of box [slo, shi) (src, row-major) into box [dlo, dhi) (dst, rows dst_ld apart);
 * returns the elements copied. */
int64_t ckpt_copy_overlap(int ndim, const int64_t *slo, const int64_t *shi, const float *src, const int64_t *dlo,
                          const int64_t *dhi, float *dst, int64_t dst_ld);
/* Zeroes rows [r0, r1) (global) of a 2-D piece; returns the elements zeroed. */
int64_t ckpt_zero_rows(mt_ckpt_piece_t *pc, int64_t r0, int64_t r1);
/* Every size the manifest states checked against the pieces before any is used. */
mt_status_t ckpt_check_sizes(const char *dir, const mt_json_t *man, const mt_ckpt_piece_t *pc, int n, int64_t vocab);
/* Fills every piece from the shards of the checkpoint in dir that overlap it. */
mt_status_t ckpt_fill_pieces(const char *dir, const mt_json_t *man, mt_ckpt_piece_t *pc, int n, int64_t vocab);
/* Writes this rank's shard file; meta gets one line per piece, total the bytes written. */
mt_status_t ckpt_write_shard(const char *path, const mt_ckpt_piece_t *pc, int n, char **meta, size_t *meta_len,
                             int64_t *total);

/* job_ckpt_manifest.c */
/* The loss scaler's state saved in a manifest (have = false: none to restore). */
typedef struct {
    bool have;
    float scale;
    int64_t clean;
} scaler_state_t;

mt_status_t ckpt_check_header(const mt_json_t *man, const char *path);
mt_status_t ckpt_read_manifest(const char *dir, mt_json_t **out);
mt_status_t ckpt_read_scaler(const mt_json_t *man, const char *path, job_t *j, scaler_state_t *out);
void ckpt_warn_unused_state(const char *dir, const mt_json_t *man, const mt_optim_params_t *optim);
mt_status_t ckpt_write_manifest(job_t *j, const char *path, int64_t step, char **all, const int64_t *bytes);
mt_status_t ckpt_write_config(const mt_config_t *cfg, const char *path);

#endif
