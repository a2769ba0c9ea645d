/* Checkpoint pieces: the boxes of global tensors a rank owns, checked against the manifest's sizes, filled
 * from whichever shard files overlap them (resharding), and written back to back into this rank's shard
 * file with one CRC32C per piece. The manifest side is job_ckpt_manifest.c; format: docs/checkpoints.md.
 * SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/crc32c.h"
#include "runtime/rt.h"
#include "train/job_ckpt_impl.h"
#include "train/job_impl.h"
#include "train/job_json.h"

#define CKPT_MAX_DIM (INT64_C(1) << 32) /* any dimension beyond this is not a real tensor */
#define CKPT_MAX_NUMEL (INT64_C(1) << 40)

/* ---- pieces and boxes --------------------------------------------------------------------------------- */

static int64_t box_numel(int ndim, const int64_t *lo, const int64_t *hi) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        n *= hi[d] - lo[d];
    }
    return n;
}

/* Copies the intersection of box src (data row-major of src) into box dst (rows dst_ld apart; 0 = the
 * box's width); returns the elements copied. Up to 2 dimensions (1-D uses dimension 0 only). */
int64_t ckpt_copy_overlap(int ndim, const int64_t *slo, const int64_t *shi, const float *src, const int64_t *dlo,
                          const int64_t *dhi, float *dst, int64_t dst_ld) {
    int64_t lo[2] = {0, 0}, hi[2] = {1, 1};
    for (int d = 0; d < ndim; d++) {
        lo[d] = MT_MAX(slo[d], dlo[d]);
        hi[d] = MT_MIN(shi[d], dhi[d]);
        if (hi[d] <= lo[d]) {
            return 0;
        }
    }
    if (ndim == 1) {
        memcpy(dst + (lo[0] - dlo[0]), src + (lo[0] - slo[0]), (size_t)(hi[0] - lo[0]) * sizeof(float));
        return hi[0] - lo[0];
    }
    int64_t sw = shi[1] - slo[1], dw = dst_ld > 0 ? dst_ld : dhi[1] - dlo[1], w = hi[1] - lo[1];
    for (int64_t r = lo[0]; r < hi[0]; r++) {
        memcpy(dst + (r - dlo[0]) * dw + (lo[1] - dlo[1]), src + (r - slo[0]) * sw + (lo[1] - slo[1]),
               (size_t)w * sizeof(float));
    }
    return (hi[0] - lo[0]) * w;
}

/* ---- loading ------------------------------------------------------------------------------------------- */

typedef struct {
    int ndim;
    int64_t lo[2], hi[2], offset, bytes;
    uint32_t crc;
    const char *file;
} shard_t;

static bool read_dims(const mt_json_t *a, int ndim, int64_t *out) {
    if (!a || a->kind != MT_JSON_ARRAY || a->n != ndim) {
        return false;
    }
    for (int d = 0; d < ndim; d++) {
        double v = a->items[d]->num;
        if (a->items[d]->kind != MT_JSON_NUMBER || v != floor(v) || v < 0 || v > (double)CKPT_MAX_DIM) {
            return false;
        }
        out[d] = (int64_t)v;
    }
    return true;
}

/* Zeroes rows [r0, r1) (global) of a 2-D piece; returns the elements zeroed. */
int64_t ckpt_zero_rows(mt_ckpt_piece_t *pc, int64_t r0, int64_t r1) {
    int64_t lo = MT_MAX(r0, pc->lo[0]), hi = MT_MIN(r1, pc->hi[0]), w = pc->hi[1] - pc->lo[1];
    int64_t ld = pc->ld > 0 ? pc->ld : w;
    for (int64_t r = lo; r < hi; r++) {
        memset(pc->data + (r - pc->lo[0]) * ld, 0, (size_t)w * sizeof(float));
    }
    return hi > lo ? (hi - lo) * w : 0;
}

static void fmt_shape(char *buf, size_t len, int ndim, const int64_t *shape) {
    if (ndim == 2) {
        snprintf(buf, len, "[%lld, %lld]", (long long)shape[0], (long long)shape[1]);
    } else {
        snprintf(buf, len, "[%lld]", (long long)shape[0]);
    }
}

/* The manifest's shape of a tensor as text, whatever it holds (for messages about a wrong one). */
static void fmt_json_shape(char *buf, size_t len, const mt_json_t *a) {
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int d = 0; a && a->kind == MT_JSON_ARRAY && d < a->n && d < 4 && o < len; d++) {
        const mt_json_t *v = a->items[d];
        if (v->kind == MT_JSON_NUMBER) {
            o += (size_t)snprintf(buf + o, len - o, "%s%.17g", d ? ", " : "", v->num);
        } else {
            o += (size_t)snprintf(buf + o, len - o, "%s?", d ? ", " : "");
        }
    }
    if (o < len) {
        snprintf(buf + o, len - o, "]");
    }
}

/* Every size the manifest states, checked before any of it is used to allocate or read: the shape of each
 * tensor this rank fills against the model the config built (both shapes named), absurd shapes, each
 * shard's box and byte count against its tensor, and each shard file's size on disk against the size the
 * manifest gives it ("files") and against the shards that lie in it. Errors name the checkpoint, the
 * tensor or file, and the fix. */
mt_status_t ckpt_check_sizes(const char *dir, const mt_json_t *man, const mt_ckpt_piece_t *pc, int n, int64_t vocab) {
    const mt_json_t *tensors = mt_json_get(man, "tensors"), *files = mt_json_get(man, "files");
    if (!tensors || tensors->kind != MT_JSON_ARRAY) {
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint %s: manifest has no \"tensors\" array", dir);
    }
    if (files && files->kind != MT_JSON_ARRAY) {
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint %s: the manifest's \"files\" is not an array", dir);
    }
    /* the files: each as large as the manifest says (a shorter one was truncated after it was written).
     * Without "files" (a hand-made manifest) ckpt_fill_pieces still checks each shard against its file. */
    for (int k = 0; files && k < files->n; k++) {
        const char *name = mt_json_get_str(files->items[k], "file");
        int64_t bytes = -1;
        if (!name || strchr(name, '/') || !mt_json_get_int(files->items[k], "bytes", &bytes) || bytes < 0 ||
            bytes > CKPT_MAX_NUMEL * (int64_t)sizeof(float)) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "checkpoint %s: entry %d of the manifest's \"files\" is malformed or gives an absurd size: "
                            "the manifest is damaged; resume from an older checkpoint (checkpoint.resume = PATH)",
                            dir, k);
        }
        char path[1200];
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        struct stat sb;
        if (stat(path, &sb) != 0) {
            return mt_error(MT_ERR_INVALID_ARG, "checkpoint: cannot read shard file %s: %s", path, strerror(errno));
        }
        if ((int64_t)sb.st_size != bytes) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "checkpoint: shard file %s is %lld bytes but the manifest says %lld: the file is %s; "
                            "resume from an older checkpoint (checkpoint.resume = PATH)",
                            path, (long long)sb.st_size, (long long)bytes,
                            (int64_t)sb.st_size < bytes ? "truncated" : "not the one this manifest was written with");
        }
    }
    int64_t man_vocab = 0;
    mt_json_get_int(mt_json_get(man, "model"), "vocab_size", &man_vocab);
    for (int i = 0; i < n; i++) {
        const mt_json_t *t = NULL;
        for (int k = 0; k < tensors->n && !t; k++) {
            const char *nm = mt_json_get_str(tensors->items[k], "name");
            t = nm && !strcmp(nm, pc[i].tensor) ? tensors->items[k] : NULL;
        }
        if (!t) {
            continue; /* ckpt_fill_pieces says which tensor is missing */
        }
        int64_t shape[2] = {0, 1};
        char want[64], got[96];
        fmt_shape(want, sizeof(want), pc[i].ndim, pc[i].shape);
        fmt_json_shape(got, sizeof(got), mt_json_get(t, "shape"));
        bool dims_ok = read_dims(mt_json_get(t, "shape"), pc[i].ndim, shape);
        if (dims_ok && pc[i].ndim == 2 && shape[0] > 0 && shape[1] > CKPT_MAX_NUMEL / shape[0]) {
            dims_ok = false; /* rows x columns beyond any real tensor (and beyond int64 arithmetic) */
        }
        if (!dims_ok) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "checkpoint %s: tensor %s has another shape than %s in the model this config builds: the "
                            "absurd or malformed %s in the manifest, which is damaged; resume from an older checkpoint "
                            "(checkpoint.resume = PATH)",
                            dir, pc[i].tensor, want, got);
        }
        bool padded = pc[i].ndim == 2 && shape[1] == pc[i].shape[1] && shape[0] != pc[i].shape[0] && vocab > 0 &&
                      man_vocab == vocab && shape[0] >= vocab && pc[i].shape[0] >= vocab;
        if (!padded && (shape[0] != pc[i].shape[0] || (pc[i].ndim == 2 && shape[1] != pc[i].shape[1]))) {
            return mt_error(MT_ERR_INVALID_ARG,
                            "checkpoint %s: tensor %s has another shape than %s in the model this config builds: %s "
                            "in the checkpoint. Either the config is wrong (use the model.* of the checkpoint's "
                            "config.toml) or the checkpoint is (point checkpoint.resume at one written for this model)",
                            dir, pc[i].tensor, want, got);
        }
        const mt_json_t *shards = mt_json_get(t, "shards");
        for (int k = 0; shards && shards->kind == MT_JSON_ARRAY && k < shards->n; k++) {
            const mt_json_t *sj = shards->items[k];
            int64_t lo[2] = {0, 0}, hi[2] = {1, 1}, off = -1, bytes = -1;
            const char *file = mt_json_get_str(sj, "file");
            bool ok = file && read_dims(mt_json_get(sj, "lo"), pc[i].ndim, lo) &&
                      read_dims(mt_json_get(sj, "hi"), pc[i].ndim, hi) && mt_json_get_int(sj, "offset", &off) &&
                      mt_json_get_int(sj, "bytes", &bytes) && off >= 0 && bytes >= 0;
            for (int d = 0; ok && d < pc[i].ndim; d++) {
                ok = lo[d] < hi[d] && hi[d] <= shape[d];
            }
            if (!ok || bytes != box_numel(pc[i].ndim, lo, hi) * (int64_t)sizeof(float)) {
                return mt_error(MT_ERR_INVALID_ARG,
                                "checkpoint %s: shard %d of tensor %s lies outside the tensor's shape %s or its byte "
                                "count %lld does not match its box: the manifest is damaged; resume from an older "
                                "checkpoint",
                                dir, k, pc[i].tensor, got, (long long)bytes);
            }
            if (!files) {
                continue;
            }
            int64_t fbytes = -1;
            for (int f = 0; f < files->n; f++) {
                const char *nm = mt_json_get_str(files->items[f], "file");
                if (nm && !strcmp(nm, file)) {
                    mt_json_get_int(files->items[f], "bytes", &fbytes);
                }
            }
            if (fbytes < 0 || off > fbytes || bytes > fbytes - off) {
                return mt_error(MT_ERR_INVALID_ARG,
                                "checkpoint %s: shard %d of tensor %s needs bytes [%lld, +%lld) of %s, which the "
                                "manifest's \"files\" %s: the manifest is damaged; resume from an older checkpoint",
                                dir, k, pc[i].tensor, (long long)off, (long long)bytes, file,
                                fbytes < 0 ? "does not list" : "says is shorter");
            }
        }
    }
    return MT_OK;
}

/* Fills every piece from the checkpoint in dir (manifest parsed in man). Each shard overlapping a piece
 * is read whole, its CRC32C checked, and the overlap copied; every element of every piece must be
 * covered. vocab (> 0) is the model's vocabulary: a 2-D tensor whose first dimension differs only in
 * padding rows (both >= vocab: the padded vocabulary, which tensor parallelism rounds up differently)
 * is read for the rows both have and zero beyond (padding rows are zero and stay zero). Errors name the
 * checkpoint, the tensor and the file. */
mt_status_t ckpt_fill_pieces(const char *dir, const mt_json_t *man, mt_ckpt_piece_t *pc, int n, int64_t vocab) {
    const mt_json_t *tensors = mt_json_get(man, "tensors");
    if (!tensors || tensors->kind != MT_JSON_ARRAY) {
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint %s: manifest has no \"tensors\" array", dir);
    }
    mt_status_t st = MT_OK;
    float *buf = NULL;
    size_t buf_cap = 0;
    int fd = -1;
    char fd_name[1200] = "";
    for (int i = 0; i < n && st == MT_OK; i++) {
        const mt_json_t *t = NULL;
        for (int k = 0; k < tensors->n; k++) {
            const char *nm = mt_json_get_str(tensors->items[k], "name");
            if (nm && !strcmp(nm, pc[i].tensor)) {
                t = tensors->items[k];
                break;
            }
        }
        if (!t) {
            st = mt_error(MT_ERR_INVALID_ARG,
                          "checkpoint %s has no tensor %s: it was written for another model or optimizer "
                          "(compare model.* and optimizer.kind with its config.toml)",
                          dir, pc[i].tensor);
            break;
        }
        const char *dtype = mt_json_get_str(t, "dtype");
        int64_t shape[2] = {0, 0};
        if (!dtype || strcmp(dtype, "f32") != 0) {
            st = mt_error(MT_ERR_INVALID_ARG, "checkpoint %s: tensor %s has dtype %s, expected f32", dir, pc[i].tensor,
                          dtype ? dtype : "(missing)");
            break;
        }
        int64_t man_vocab = 0;
        mt_json_get_int(mt_json_get(man, "model"), "vocab_size", &man_vocab);
        bool dims_ok = read_dims(mt_json_get(t, "shape"), pc[i].ndim, shape);
        bool padded = dims_ok && pc[i].ndim == 2 && shape[1] == pc[i].shape[1] && shape[0] != pc[i].shape[0] &&
                      vocab > 0 && man_vocab == vocab && shape[0] >= vocab && pc[i].shape[0] >= vocab;
        if (!dims_ok || (!padded && (shape[0] != pc[i].shape[0] || (pc[i].ndim == 2 && shape[1] != pc[i].shape[1])))) {
            char want[64];
            snprintf(want, sizeof(want), pc[i].ndim == 2 ? "[%lld, %lld]" : "[%lld]", (long long)pc[i].shape[0],
                     (long long)pc[i].shape[1]);
            st = mt_error(MT_ERR_INVALID_ARG,
                          "checkpoint %s: tensor %s has another shape than %s in this model: the checkpoint was "
                          "written for another model.* configuration (see its config.toml)",
                          dir, pc[i].tensor, want);
            break;
        }
        const mt_json_t *shards = mt_json_get(t, "shards");
        if (!shards || shards->kind != MT_JSON_ARRAY) {
            st = mt_error(MT_ERR_INVALID_ARG, "checkpoint %s: tensor %s has no shard list", dir, pc[i].tensor);
            break;
        }
        int64_t want = box_numel(pc[i].ndim, pc[i].lo, pc[i].hi), got = 0;
        if (padded && shape[0] < pc[i].shape[0]) {
            got += ckpt_zero_rows(&pc[i], shape[0], pc[i].shape[0]); /* padding the checkpoint does not have */
        }
        for (int k = 0; k < shards->n && st == MT_OK; k++) {
            const mt_json_t *sj = shards->items[k];
            shard_t sh = {.ndim = pc[i].ndim};
            int64_t crc = 0;
            sh.file = mt_json_get_str(sj, "file");
            if (!read_dims(mt_json_get(sj, "lo"), sh.ndim, sh.lo) ||
                !read_dims(mt_json_get(sj, "hi"), sh.ndim, sh.hi) || !mt_json_get_int(sj, "offset", &sh.offset) ||
                !mt_json_get_int(sj, "bytes", &sh.bytes) || !mt_json_get_int(sj, "crc32c", &crc) || !sh.file ||
                strchr(sh.file, '/') || sh.offset < 0 || crc < 0 || crc > UINT32_MAX) {
                st = mt_error(MT_ERR_INVALID_ARG, "checkpoint %s: shard %d of tensor %s is malformed in the manifest",
                              dir, k, pc[i].tensor);
                break;
            }
            sh.crc = (uint32_t)crc;
            bool inside = true;
            for (int d = 0; d < sh.ndim; d++) {
                inside = inside && sh.lo[d] < sh.hi[d] && sh.hi[d] <= shape[d];
            }
            int64_t numel = inside ? box_numel(sh.ndim, sh.lo, sh.hi) : -1;
            if (!inside || numel > CKPT_MAX_NUMEL || sh.bytes != numel * (int64_t)sizeof(float)) {
                st = mt_error(MT_ERR_INVALID_ARG,
                              "checkpoint %s: shard %d of tensor %s lies outside the tensor or its byte count %lld "
                              "does not match its box",
                              dir, k, pc[i].tensor, (long long)sh.bytes);
                break;
            }
            /* does it overlap the piece? */
            bool overlap = true;
            for (int d = 0; d < sh.ndim; d++) {
                overlap = overlap && sh.lo[d] < pc[i].hi[d] && pc[i].lo[d] < sh.hi[d];
            }
            if (!overlap) {
                continue;
            }
            char path[1200];
            snprintf(path, sizeof(path), "%s/%s", dir, sh.file);
            if (strcmp(path, fd_name) != 0) {
                if (fd >= 0) {
                    close(fd);
                }
                fd = open(path, O_RDONLY);
                snprintf(fd_name, sizeof(fd_name), "%s", fd >= 0 ? path : "");
                if (fd < 0) {
                    st = mt_error(MT_ERR_INVALID_ARG, "checkpoint: cannot open shard file %s: %s", path,
                                  strerror(errno));
                    break;
                }
            }
            struct stat sb;
            if (fstat(fd, &sb) != 0 || sh.offset < 0 || sh.bytes < 0 || sh.offset > (int64_t)sb.st_size ||
                sh.bytes > (int64_t)sb.st_size - sh.offset) {
                st = mt_error(MT_ERR_INVALID_ARG,
                              "checkpoint: shard file %s is truncated: tensor %s needs bytes [%lld, %lld), the file "
                              "has %lld",
                              path, pc[i].tensor, (long long)sh.offset, (long long)(sh.offset + sh.bytes),
                              (long long)sb.st_size);
                break;
            }
            if ((size_t)sh.bytes > buf_cap) {
                free(buf);
                buf_cap = (size_t)sh.bytes;
                buf = malloc(buf_cap);
                if (!buf) {
                    buf_cap = 0;
                    st = mt_error(MT_ERR_OOM, "checkpoint: out of memory reading %lld bytes of %s", (long long)sh.bytes,
                                  path);
                    break;
                }
            }
            size_t done = 0;
            while (done < (size_t)sh.bytes) {
                ssize_t r = pread(fd, (char *)buf + done, (size_t)sh.bytes - done, (off_t)(sh.offset + (int64_t)done));
                if (r <= 0) {
                    break;
                }
                done += (size_t)r;
            }
            if (done != (size_t)sh.bytes) {
                st = mt_error(MT_ERR_INVALID_ARG, "checkpoint: reading %s at offset %lld failed: %s", path,
                              (long long)sh.offset, strerror(errno));
                break;
            }
            uint32_t c = mt_crc32c(0, buf, (size_t)sh.bytes);
            if (c != sh.crc) {
                st = mt_error(MT_ERR_INVALID_ARG,
                              "checkpoint: CRC32C mismatch in %s (tensor %s, bytes [%lld, %lld)): computed %08x, the "
                              "manifest says %08x: the file is corrupt; resume from an older checkpoint "
                              "(checkpoint.resume = PATH)",
                              path, pc[i].tensor, (long long)sh.offset, (long long)(sh.offset + sh.bytes), c, sh.crc);
                break;
            }
            got += ckpt_copy_overlap(sh.ndim, sh.lo, sh.hi, buf, pc[i].lo, pc[i].hi, pc[i].data, pc[i].ld);
        }
        if (st == MT_OK && got != want) {
            st = mt_error(MT_ERR_INVALID_ARG,
                          "checkpoint %s: the shards of tensor %s cover %lld of the %lld elements this rank needs "
                          "(missing or overlapping shards)",
                          dir, pc[i].tensor, (long long)got, (long long)want);
        }
    }
    if (fd >= 0) {
        close(fd);
    }
    free(buf);
    return st;
}

/* ---- saving -------------------------------------------------------------------------------------------- */

/* This rank's shard file: every piece's data back to back. meta gets one line per piece:
 * "tensor ndim s0 s1 lo0 lo1 hi0 hi1 offset bytes crc". */
mt_status_t ckpt_write_shard(const char *path, const mt_ckpt_piece_t *pc, int n, char **meta, size_t *meta_len,
                             int64_t *total) {
    *meta = NULL;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        return mt_error(MT_ERR_IO, "checkpoint: cannot create %s: %s", path, strerror(errno));
    }
    size_t cap = (size_t)n * 200 + 1, len = 0;
    char *m = malloc(cap);
    mt_status_t st = m ? MT_OK : mt_error(MT_ERR_OOM, "checkpoint: out of memory");
    int64_t off = 0;
    for (int i = 0; i < n && st == MT_OK; i++) {
        int64_t bytes = box_numel(pc[i].ndim, pc[i].lo, pc[i].hi) * (int64_t)sizeof(float);
        /* rows of a strided piece are written one after the other: the file holds the box row-major */
        int64_t width = pc[i].ndim == 2 ? pc[i].hi[1] - pc[i].lo[1] : bytes / (int64_t)sizeof(float);
        int64_t ld = pc[i].ndim == 2 && pc[i].ld > 0 ? pc[i].ld : width;
        int64_t rows = ld == width ? 1 : pc[i].hi[0] - pc[i].lo[0];
        size_t run = ld == width ? (size_t)bytes : (size_t)width * sizeof(float);
        uint32_t crc = 0;
        for (int64_t r = 0; r < rows && st == MT_OK; r++) {
            const char *src = (const char *)(pc[i].data + r * ld);
            crc = mt_crc32c(crc, src, run);
            size_t done = 0;
            while (done < run) {
                ssize_t w = write(fd, src + done, run - done);
                if (w <= 0) {
                    st = mt_error(MT_ERR_IO, "checkpoint: writing %s: %s", path, strerror(errno));
                    break;
                }
                done += (size_t)w;
            }
        }
        len += (size_t)snprintf(m + len, cap - len, "%s %d %lld %lld %lld %lld %lld %lld %lld %lld %u\n", pc[i].tensor,
                                pc[i].ndim, (long long)pc[i].shape[0], (long long)(pc[i].ndim > 1 ? pc[i].shape[1] : 0),
                                (long long)pc[i].lo[0], (long long)(pc[i].ndim > 1 ? pc[i].lo[1] : 0),
                                (long long)pc[i].hi[0], (long long)(pc[i].ndim > 1 ? pc[i].hi[1] : 0), (long long)off,
                                (long long)bytes, crc);
        off += bytes;
    }
    if (st == MT_OK && fsync(fd) != 0) {
        st = mt_error(MT_ERR_IO, "checkpoint: fsync %s: %s", path, strerror(errno));
    }
    if (close(fd) != 0 && st == MT_OK) {
        st = mt_error(MT_ERR_IO, "checkpoint: closing %s: %s", path, strerror(errno));
    }
    if (st != MT_OK) {
        free(m);
        return st;
    }
    *meta = m;
    *meta_len = len;
    *total = off;
    return MT_OK;
}
