/* Checkpoints: a directory per step holding manifest.json (format version, config, mesh, step, data
 * position, RNG seeds, and for every global tensor its shape, dtype and the shards that hold it: rank,
 * box, file, offset, bytes, CRC32C), config.toml and one shard file per rank with the pieces that rank
 * owns. Tensors are described by global name, shape and boxes, so a reader under any layout assembles
 * any piece it needs from whichever shards overlap it (resharding). Writing is atomic: a temporary
 * directory, every rank fsyncs its file, rank 0 writes the manifest last, renames the directory into
 * place, then replaces `latest` with a rename; older checkpoints beyond checkpoint.keep go only after
 * that. Format and protocol: docs/checkpoints.md.
 * SPDX-License-Identifier: MIT */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/job_impl.h"
#include "train/job_json.h"
#include "models/llmc.h"
#include "runtime/crc32c.h"
#include "runtime/signals.h"
#include "runtime/rt.h"
#include "runtime/trace.h"

#define CKPT_FORMAT "meshtrain-checkpoint"
#define CKPT_VERSION 1
#define CKPT_MAX_DIM (INT64_C(1) << 32) /* any dimension beyond this is not a real tensor */
#define CKPT_MAX_NUMEL (INT64_C(1) << 40)

/* Test knob: the Nth checkpoint this process writes stops rank 0 with _exit(86) after every shard file
 * is written and synced but before the manifest and the rename (tests/jobs: a crash mid-save). */
MT_PARAM(ckpt_test_crash, "CKPT_TEST_CRASH", 0)

struct job_ckpt {
    char dir[1024]; /* checkpoint.dir ("" = no saving) */
    int64_t every, keep;
    char resume[1100]; /* step directory to resume from ("" = none) */
    int n_saved;
    bool on_signal; /* handlers installed (checkpoint.on_signal with a checkpoint.dir) */
    char last[1100];        /* the last complete checkpoint written or resumed from ("" = none) */
};


/* ---- small file helpers ---------------------------------------------------------------------------- */

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void rm_rf(const char *path) {
    nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static mt_status_t mkdir_p(const char *path) {
    char d[1100];
    snprintf(d, sizeof(d), "%s", path);
    for (char *c = d + 1;; c++) {
        if (*c == '/' || *c == '\0') {
            char save = *c;
            *c = '\0';
            if (mkdir(d, 0755) != 0 && errno != EEXIST) {
                return mt_error(MT_ERR_IO, "checkpoint.dir: cannot create %s: %s", d, strerror(errno));
            }
            *c = save;
            if (!save) {
                break;
            }
        }
    }
    return MT_OK;
}

static mt_status_t fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        return mt_error(MT_ERR_IO, "checkpoint: cannot open %s to sync it: %s", path, strerror(errno));
    }
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL) { /* some file systems cannot fsync directories */
        return mt_error(MT_ERR_IO, "checkpoint: fsync %s: %s", path, strerror(e));
    }
    return MT_OK;
}

/* Reads a whole small file (manifest, latest) into a NUL-terminated buffer; at most max bytes. */
static mt_status_t slurp(const char *path, size_t max, char **out, size_t *len) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: cannot read %s: %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || sb.st_size < 0 || (size_t)sb.st_size > max) {
        fclose(f);
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: %s is %lld bytes, more than the %zu a manifest may have", path,
                        (long long)sb.st_size, max);
    }
    char *buf = malloc((size_t)sb.st_size + 1);
    if (!buf) {
        fclose(f);
        return mt_error(MT_ERR_OOM, "checkpoint: out of memory reading %s", path);
    }
    size_t n = fread(buf, 1, (size_t)sb.st_size, f);
    fclose(f);
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return MT_OK;
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* path is a step directory (has manifest.json) or a checkpoint.dir (has latest): the step directory. */
static mt_status_t resolve(const char *path, char *out, size_t len, const char *what) {
    char m[1200];
    snprintf(m, sizeof(m), "%s/manifest.json", path);
    if (exists(m)) {
        snprintf(out, len, "%s", path);
        return MT_OK;
    }
    char l[1200];
    snprintf(l, sizeof(l), "%s/latest", path);
    if (!exists(l)) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "%s = \"%s\": neither a checkpoint (no manifest.json) nor a checkpoint directory (no "
                        "`latest`)%s",
                        what, path, is_dir(path) ? "" : "; it does not exist");
    }
    char *text = NULL;
    size_t n = 0;
    MT_CHECK(slurp(l, 4096, &text, &n));
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == ' ')) {
        text[--n] = '\0';
    }
    if (n == 0 || strchr(text, '/')) {
        mt_status_t st =
            mt_error(MT_ERR_INVALID_ARG, "checkpoint: %s does not name a step directory (\"%s\")", l, text);
        free(text);
        return st;
    }
    snprintf(out, len, "%s/%s", path, text);
    free(text);
    snprintf(m, sizeof(m), "%s/manifest.json", out);
    if (!exists(m)) {
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: %s points to %s, which has no manifest.json", l, out);
    }
    return MT_OK;
}

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
static int64_t copy_overlap(int ndim, const int64_t *slo, const int64_t *shi, const float *src, const int64_t *dlo,
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
static int64_t zero_rows(mt_ckpt_piece_t *pc, int64_t r0, int64_t r1) {
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
static mt_status_t check_sizes(const char *dir, const mt_json_t *man, const mt_ckpt_piece_t *pc, int n, int64_t vocab) {
    const mt_json_t *tensors = mt_json_get(man, "tensors"), *files = mt_json_get(man, "files");
    if (!tensors || tensors->kind != MT_JSON_ARRAY) {
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint %s: manifest has no \"tensors\" array", dir);
    }
    if (files && files->kind != MT_JSON_ARRAY) {
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint %s: the manifest's \"files\" is not an array", dir);
    }
    /* the files: each as large as the manifest says (a shorter one was truncated after it was written).
     * Without "files" (a hand-made manifest) fill_pieces still checks each shard against its file. */
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
            continue; /* fill_pieces says which tensor is missing */
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
static mt_status_t fill_pieces(const char *dir, const mt_json_t *man, mt_ckpt_piece_t *pc, int n, int64_t vocab) {
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
            got += zero_rows(&pc[i], shape[0], pc[i].shape[0]); /* padding the checkpoint does not have */
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
            got += copy_overlap(sh.ndim, sh.lo, sh.hi, buf, pc[i].lo, pc[i].hi, pc[i].data, pc[i].ld);
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

/* The manifest's format name and version. */
static mt_status_t check_header(const mt_json_t *man, const char *path) {
    const char *fmt = mt_json_get_str(man, "format");
    int64_t ver = 0;
    if (!fmt || strcmp(fmt, CKPT_FORMAT) != 0 || !mt_json_get_int(man, "version", &ver)) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "checkpoint: %s is not a meshtrain checkpoint manifest (no \"format\": "
                        "\"%s\" or no \"version\")",
                        path, CKPT_FORMAT);
    }
    if (ver != CKPT_VERSION) {
        return mt_error(MT_ERR_INVALID_ARG, "checkpoint: %s has format version %lld; this meshtrain reads version %d",
                        path, (long long)ver, CKPT_VERSION);
    }
    return MT_OK;
}

/* Reads and parses dir/manifest.json, checking the format and version. */
static mt_status_t read_manifest(const char *dir, mt_json_t **out) {
    char path[1200], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof(path), "%s/manifest.json", dir);
    MT_CHECK(slurp(path, (size_t)1 << 30, &text, &len));
    mt_status_t st = mt_json_parse(text, len, path, out);
    free(text);
    MT_CHECK(st);
    int64_t step = 0;
    st = check_header(*out, path);
    if (st == MT_OK && (!mt_json_get_int(*out, "step", &step) || step < 0)) {
        st = mt_error(MT_ERR_INVALID_ARG, "checkpoint: %s has no valid \"step\"", path);
    }
    if (st != MT_OK) {
        mt_json_free(*out);
        *out = NULL;
    }
    return st;
}

mt_status_t mt_job_ckpt_read_model(const char *path, mt_model_t *model, mt_config_t **cfg_out, char *from,
                                   size_t from_len) {
    *model = NULL;
    if (cfg_out) {
        *cfg_out = NULL;
    }
    char dir[1100];
    MT_CHECK(resolve(path, dir, sizeof(dir), "checkpoint"));
    if (from) {
        snprintf(from, from_len, "%s", dir);
    }
    mt_json_t *man = NULL;
    MT_CHECK(read_manifest(dir, &man));
    const mt_json_t *mj = mt_json_get(man, "model");
    mt_model_config_t mc = MT_MODEL_CONFIG_INIT;
    int64_t v[7];
    const char *keys[7] = {"n_layer", "n_head", "n_embd", "seq_len", "vocab_size", "padded_vocab", "seed"};
    const char *kind = mt_json_get_str(mj, "kind");
    bool ok = kind != NULL;
    for (int k = 0; k < 7 && ok; k++) {
        ok = mt_json_get_int(mj, keys[k], &v[k]) && v[k] >= 0 && v[k] < (INT64_C(1) << 31);
    }
    mt_status_t st = MT_OK;
    if (!ok) {
        st = mt_error(MT_ERR_INVALID_ARG, "checkpoint %s: the manifest's \"model\" section is missing or malformed",
                      dir);
    }
    if (st == MT_OK) {
        mc.kind = strcmp(kind, "mlp") ? MT_MODEL_GPT2 : MT_MODEL_MLP;
        mc.n_layer = (int)v[0];
        mc.n_head = (int)v[1];
        mc.n_embd = (int)v[2];
        mc.seq_len = (int)v[3];
        mc.vocab_size = (int)v[4];
        mc.padded_vocab = (int)v[5];
        mc.seed = (uint64_t)v[6];
        st = mt_model_init(&mc, model); /* registers shapes, allocates no storage */
    }
    mt_ckpt_piece_t *pc = NULL;
    int np = *model ? mt_model_n_params(*model) : 0;
    if (st == MT_OK) {
        pc = calloc((size_t)MT_MAX(np, 1), sizeof(*pc));
        st = pc ? MT_OK : mt_error(MT_ERR_OOM, "checkpoint: out of memory");
    }
    for (int i = 0; i < np && st == MT_OK; i++) {
        mt_param_t *p = mt_model_param(*model, i);
        snprintf(pc[i].tensor, sizeof(pc[i].tensor), "param/%s", p->name);
        pc[i].ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) {
            pc[i].shape[d] = p->global_shape[d];
            pc[i].hi[d] = p->global_shape[d];
        }
    }
    if (st == MT_OK) { /* sizes first: nothing is allocated from a manifest that disagrees with its files */
        st = check_sizes(dir, man, pc, np, mc.vocab_size);
    }
    if (st == MT_OK) {
        int64_t have = 0, f = 0;
        const mt_json_t *files = mt_json_get(man, "files");
        for (int k = 0; files && k < files->n; k++) {
            have += mt_json_get_int(files->items[k], "bytes", &f) ? f : 0;
        }
        size_t need = mt_model_numel(*model) * sizeof(float);
        if ((uint64_t)need > (uint64_t)have) {
            st = mt_error(MT_ERR_INVALID_ARG,
                          "checkpoint %s: its \"model\" section describes %zu bytes of parameters but its shard files "
                          "hold %lld bytes in all: the manifest is damaged; use another checkpoint",
                          dir, need, (long long)have);
        }
    }
    if (st == MT_OK) {
        st = mt_model_alloc_params(*model);
    }
    for (int i = 0; i < np && st == MT_OK; i++) {
        pc[i].data = mt_model_param(*model, i)->data;
    }
    if (st == MT_OK) {
        st = fill_pieces(dir, man, pc, np, mc.vocab_size);
    }
    if (st == MT_OK && cfg_out) {
        char cp[1200];
        snprintf(cp, sizeof(cp), "%s/config.toml", dir);
        st = mt_config_load(cp, 0, NULL, 0, cfg_out, stderr);
    }
    free(pc);
    mt_json_free(man);
    if (st != MT_OK) {
        mt_model_free(*model);
        *model = NULL;
    }
    return st;
}

/* ---- set-up and resume ----------------------------------------------------------------------------- */

mt_status_t mt_job_ckpt_init(job_t *j, job_ckpt_t **out) {
    *out = NULL;
    const mt_config_t *cfg = j->cfg;
    const char *dir = mt_config_str(cfg, "checkpoint.dir"), *resume = mt_config_str(cfg, "checkpoint.resume");
    bool resume_path = strcmp(resume, "auto") != 0 && strcmp(resume, "none") != 0 && resume[0];
    if (!dir[0] && !resume_path) {
        return MT_OK;
    }
    if (!j->engine->ckpt_pieces || !j->engine->ckpt_get_step || !j->engine->ckpt_set_step) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "checkpoint.dir / checkpoint.resume: the engine \"%s\" cannot write or read checkpoints "
                        "(unset checkpoint.dir)",
                        j->engine->name);
    }
    job_ckpt_t *c = calloc(1, sizeof(*c));
    if (!c) {
        return mt_error(MT_ERR_OOM, "checkpoint: out of memory");
    }
    *out = c;
    snprintf(c->dir, sizeof(c->dir), "%s", dir);
    if (dir[0] && mt_config_bool(cfg, "checkpoint.on_signal")) {
        MT_CHECK(mt_signals_install()); /* SIGTERM, SIGINT, SIGUSR1: runtime/signals.h */
        c->on_signal = true;
    }
    c->every = mt_config_int(cfg, "checkpoint.every");
    c->keep = mt_config_int(cfg, "checkpoint.keep");
    /* rank 0 decides what to resume from; everyone gets its verdict */
    mt_status_t st = MT_OK;
    char msg[1024] = "";
    if (j->rank == 0 && dir[0]) { /* a directory that cannot take checkpoints is found now, not after training */
        st = mkdir_p(dir) == MT_OK ? MT_OK : MT_ERR_INVALID_ARG; /* bad input: the message names the path */
        if (st == MT_OK && (!is_dir(dir) || access(dir, W_OK | X_OK) != 0)) {
            st = mt_error(MT_ERR_INVALID_ARG, "checkpoint.dir = \"%s\" is not a writable directory (%s)", dir,
                          is_dir(dir) ? strerror(errno) : "a file is in the way");
        }
    }
    if (j->rank == 0 && st == MT_OK) {
        if (resume_path) {
            st = resolve(resume, c->resume, sizeof(c->resume), "checkpoint.resume");
        } else if (!strcmp(resume, "auto") && dir[0]) {
            char l[1100];
            snprintf(l, sizeof(l), "%s/latest", dir);
            if (exists(l)) {
                st = resolve(dir, c->resume, sizeof(c->resume), "checkpoint.dir");
            }
        }
    }
    if (j->rank == 0 && st != MT_OK) {
        snprintf(msg, sizeof(msg), "%s", mt_last_error_msg());
    }
    int sti = (int)st;
    MT_CHECK(mt_job_bcast(&j->sync, "resume_verdict", &sti, 1, MPI_INT, 0));
    MT_CHECK(mt_job_bcast(&j->sync, "resume_message", msg, (int)sizeof(msg), MPI_CHAR, 0));
    MT_CHECK(mt_job_bcast(&j->sync, "resume_path", c->resume, (int)sizeof(c->resume), MPI_CHAR, 0));
    if (sti != MT_OK) {
        return mt_error((mt_status_t)sti, "%s", msg);
    }
    return MT_OK;
}

/* The loss scaler's state in the manifest ("precision"): restored when both the checkpoint and this job
 * run fp16 (a checkpoint of another mode, or of a meshtrain before the field, starts from
 * precision.init_scale). A present but malformed value is refused. */
typedef struct {
    bool have;
    float scale;
    int64_t clean;
} scaler_state_t;

static mt_status_t read_scaler(const mt_json_t *man, const char *path, job_t *j, scaler_state_t *out) {
    const mt_json_t *p = mt_json_get(man, "precision");
    const mt_loss_scaler_t *sc = mt_job_scaler(j);
    if (!p || !sc->dynamic) {
        return MT_OK;
    }
    const char *mode = mt_json_get_str(p, "compute");
    double scale = 0.0;
    int64_t clean = 0;
    if (!mode || !mt_json_get_num(p, "loss_scale", &scale) || !mt_json_get_int(p, "clean_steps", &clean) ||
        !(scale >= sc->min_scale && scale <= sc->max_scale) || clean < 0) {
        return mt_error(MT_ERR_INVALID_ARG,
                        "checkpoint: %s has a malformed \"precision\" section (loss_scale must lie in [1, 2^24], "
                        "clean_steps >= 0): the manifest is damaged; resume from an older checkpoint",
                        path);
    }
    if (strcmp(mode, "fp16") != 0) {
        return MT_OK;
    }
    out->have = true;
    out->scale = (float)scale;
    out->clean = clean;
    return MT_OK;
}

/* Rank 0: a warning when the checkpoint holds optimizer state this run's optimizer has no buffer for (AdamW's
 * moments resumed under SGD; SGD's momentum under AdamW or plain SGD; state the run needs and the checkpoint
 * lacks is fill_pieces's error): the weights and the step count resume, that state does not. */
static void warn_unused_state(const char *dir, const mt_json_t *man, const mt_optim_params_t *optim) {
    bool sgd = optim->kind == MT_OPTIM_SGD;
    bool mom = sgd && optim->momentum > 0.0f;
    static const char *const kinds[] = {"adamw.m", "adamw.v", "sgd.momentum"};
    bool used[] = {!sgd, !sgd, mom}, held[] = {false, false, false};
    const mt_json_t *tensors = mt_json_get(man, "tensors");
    for (int k = 0; tensors && tensors->kind == MT_JSON_ARRAY && k < tensors->n; k++) {
        const char *nm = mt_json_get_str(tensors->items[k], "name");
        for (size_t i = 0; nm && i < MT_ARRAY_LEN(kinds); i++) {
            size_t kl = strlen(kinds[i]);
            held[i] |= !strncmp(nm, kinds[i], kl) && nm[kl] == '/';
        }
    }
    char list[64] = "";
    for (size_t i = 0; i < MT_ARRAY_LEN(kinds); i++) {
        if (held[i] && !used[i]) {
            snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", list[0] ? ", " : "", kinds[i]);
        }
    }
    if (list[0]) {
        MT_WARN("checkpoint %s holds optimizer state (%s) that optimizer.kind = \"%s\"%s does not use: the weights "
                "and the step count resume, that state is left behind (resume with the optimizer.* of the "
                "checkpoint's config.toml to keep it)",
                dir, list, sgd ? "sgd" : "adamw", sgd && !mom ? " without momentum" : "");
    }
}

mt_status_t mt_job_ckpt_resume(job_ckpt_t *c, job_t *j) {
    if (!c || !c->resume[0]) {
        return MT_OK;
    }
    /* rank 0 reads the manifest and broadcasts it, so ranks agree on it even while it is being replaced */
    char path[1200], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof(path), "%s/manifest.json", c->resume);
    mt_status_t st = MT_OK;
    char msg[1024] = "";
    if (j->rank == 0) {
        st = slurp(path, (size_t)1 << 30, &text, &len);
        if (st != MT_OK) {
            snprintf(msg, sizeof(msg), "%s", mt_last_error_msg());
        }
    }
    int64_t l64 = st == MT_OK ? (int64_t)len : -1;
    MT_CHECK(mt_job_bcast(&j->sync, "manifest_length", &l64, 1, MPI_INT64_T, 0));
    if (l64 < 0) {
        MT_CHECK(mt_job_bcast(&j->sync, "manifest_message", msg, (int)sizeof(msg), MPI_CHAR, 0));
        free(text);
        return mt_error(MT_ERR_INVALID_ARG, "%s", msg);
    }
    mt_status_t ast = MT_OK;
    if (j->rank != 0) {
        text = malloc((size_t)l64 + 1);
        if (!text) {
            ast = mt_error(MT_ERR_OOM, "checkpoint: out of memory for the manifest (%lld bytes)", (long long)l64);
        } else {
            text[l64] = '\0';
        }
    }
    st = mt_job_agree(&j->sync, "manifest_alloc", ast); /* no rank may skip the broadcast below alone */
    if (st != MT_OK) {
        free(text);
        return st;
    }
    MT_CHECK(mt_job_bcast(&j->sync, "manifest", text, (int)l64, MPI_CHAR, 0)); /* manifests stay far below 2 GiB */
    mt_json_t *man = NULL;
    st = mt_json_parse(text, (size_t)l64, path, &man);
    free(text);
    MT_CHECK(st);
    int64_t step = 0, ostep = 0;
    st = check_header(man, path);
    if (st == MT_OK && (!mt_json_get_int(man, "step", &step) || !mt_json_get_int(man, "optimizer_step", &ostep) ||
                        step < 0 || ostep < 0)) {
        st = mt_error(MT_ERR_INVALID_ARG, "checkpoint: %s has no valid \"step\" or \"optimizer_step\"", path);
    } else if (st == MT_OK && step > mt_config_int(j->cfg, "train.steps")) {
        st = mt_error(MT_ERR_INVALID_ARG,
                      "checkpoint %s was written after step %lld, beyond train.steps = %lld (raise train.steps or "
                      "set checkpoint.resume = \"none\")",
                      c->resume, (long long)step, (long long)mt_config_int(j->cfg, "train.steps"));
    }
    scaler_state_t ps = {0};
    if (st == MT_OK) {
        st = read_scaler(man, path, j, &ps);
    }
    mt_ckpt_piece_t *pc = NULL;
    int n = 0;
    if (st == MT_OK) {
        st = j->engine->ckpt_pieces(j->ectx, false, &pc, &n);
    }
    if (st == MT_OK) { /* every size the manifest states, against the model and the files, before reading */
        st = check_sizes(c->resume, man, pc, n, mt_model_config(j->model)->vocab_size);
    }
    if (st == MT_OK) {
        st = fill_pieces(c->resume, man, pc, n, mt_model_config(j->model)->vocab_size);
    }
    if (st == MT_OK && j->rank == 0) {
        warn_unused_state(c->resume, man, &j->set.optim);
    }
    free(pc);
    mt_json_free(man);
    MT_CHECK(st);
    j->engine->ckpt_set_step(j->ectx, ostep);
    if (ps.have) { /* fp16 continues with the scale and clean-step count it stopped with */
        mt_loss_scaler_t *sc = mt_job_scaler(j); /* the engine's own when it scales on its device */
        sc->scale = ps.scale;
        sc->clean_steps = ps.clean;
    }
    if (j->engine->ckpt_loaded) {
        MT_CHECK(j->engine->ckpt_loaded(j->ectx));
    }
    j->start_step = step;
    return MT_OK;
}

const char *mt_job_ckpt_resumed_from(const job_ckpt_t *c) {
    return c && c->resume[0] ? c->resume : NULL;
}

mt_status_t mt_job_init_llmc(job_t *j) {
    if (!j->info.init_llmc || !j->engine->ckpt_pieces) {
        return MT_OK;
    }
    /* the whole model in the file's shape, read by every rank; each rank copies the boxes it holds */
    mt_model_config_t mc = *mt_model_config(j->model);
    mc.tp_rank = 0;
    mc.tp_size = 1;
    mc.tp_ops = NULL;
    mt_llmc_header_t h;
    MT_CHECK(mt_llmc_read_header(j->info.init_llmc, &h));
    MT_CHECK(mt_llmc_apply_header(&h, j->info.init_llmc, 0, &mc));
    mt_model_t whole = NULL;
    mt_ckpt_piece_t *pc = NULL;
    int n = 0;
    mt_status_t st = mt_model_init(&mc, &whole);
    if (st == MT_OK) {
        st = mt_model_alloc_params(whole);
    }
    if (st == MT_OK) {
        st = mt_llmc_load(whole, j->info.init_llmc);
    }
    if (st == MT_OK) {
        st = j->engine->ckpt_pieces(j->ectx, false, &pc, &n);
    }
    for (int i = 0; i < n && st == MT_OK; i++) {
        if (strncmp(pc[i].tensor, "param/", 6) != 0) {
            continue; /* optimizer state starts at zero */
        }
        int k = mt_model_find_param(whole, pc[i].tensor + 6);
        const mt_param_t *p = k >= 0 ? mt_model_param(whole, k) : NULL;
        if (!p || p->ndim != pc[i].ndim || (p->ndim == 2 && p->global_shape[1] != pc[i].shape[1])) {
            st = mt_error(MT_ERR_INTERNAL, "model.init: %s has no counterpart in the llm.c model", pc[i].tensor);
            break;
        }
        /* rows beyond the file's (padding when tensor parallelism pads the vocabulary further) are zero */
        int64_t rows = p->global_shape[0];
        if (pc[i].ndim == 2) {
            zero_rows(&pc[i], rows, pc[i].hi[0]);
        } else if (pc[i].hi[0] > rows) {
            memset(pc[i].data + MT_MAX(rows - pc[i].lo[0], 0), 0,
                   (size_t)(pc[i].hi[0] - MT_MAX(rows, pc[i].lo[0])) * sizeof(float));
        }
        int64_t lo[2] = {0, 0}, hi[2] = {rows, p->ndim == 2 ? p->global_shape[1] : 1};
        copy_overlap(pc[i].ndim, lo, hi, p->data, pc[i].lo, pc[i].hi, pc[i].data, pc[i].ld);
    }
    free(pc);
    mt_model_free(whole);
    MT_CHECK(st);
    return j->engine->ckpt_loaded ? j->engine->ckpt_loaded(j->ectx) : MT_OK;
}

const char *mt_job_ckpt_last(const job_ckpt_t *c) {
    if (!c) {
        return "";
    }
    return c->last[0] ? c->last : c->resume;
}

void mt_job_ckpt_free(job_ckpt_t *c) {
    if (c && c->on_signal) {
        mt_signals_restore();
    }
    free(c);
}

/* ---- saving -------------------------------------------------------------------------------------------- */

/* This rank's shard file: every piece's data back to back. meta gets one line per piece:
 * "tensor ndim s0 s1 lo0 lo1 hi0 hi1 offset bytes crc". */
static mt_status_t write_shard(const char *path, const mt_ckpt_piece_t *pc, int n, char **meta, size_t *meta_len,
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

typedef struct {
    char tensor[MT_CKPT_NAME_MAX];
    int rank, ndim;
    long long shape[2], lo[2], hi[2], offset, bytes;
    unsigned crc;
} meta_t;

static int meta_cmp(const void *a, const void *b) {
    const meta_t *x = a, *y = b;
    int c = strcmp(x->tensor, y->tensor);
    if (c) {
        return c;
    }
    if (x->lo[0] != y->lo[0]) {
        return x->lo[0] < y->lo[0] ? -1 : 1;
    }
    if (x->lo[1] != y->lo[1]) {
        return x->lo[1] < y->lo[1] ? -1 : 1;
    }
    return x->rank - y->rank;
}

/* Rank 0: the manifest from every rank's piece lines (all[r] for rank r), written to path and synced.
 * Checks that each tensor's shards add up to the whole tensor. */
static mt_status_t write_manifest(job_t *j, const char *path, int64_t step, char **all, const int64_t *bytes) {
    size_t n = 0, cap = 256;
    meta_t *ms = malloc(cap * sizeof(*ms));
    if (!ms) {
        return mt_error(MT_ERR_OOM, "checkpoint: out of memory");
    }
    for (int r = 0; r < j->world; r++) {
        for (char *line = all[r]; line && *line;) {
            char *nl = strchr(line, '\n');
            if (nl) {
                *nl = '\0';
            }
            if (n == cap) {
                cap *= 2;
                meta_t *g = realloc(ms, cap * sizeof(*ms));
                if (!g) {
                    free(ms);
                    return mt_error(MT_ERR_OOM, "checkpoint: out of memory");
                }
                ms = g;
            }
            meta_t *m = &ms[n];
            m->rank = r;
            if (sscanf(line, "%95s %d %lld %lld %lld %lld %lld %lld %lld %lld %u", m->tensor, &m->ndim, &m->shape[0],
                       &m->shape[1], &m->lo[0], &m->lo[1], &m->hi[0], &m->hi[1], &m->offset, &m->bytes,
                       &m->crc) == 11) {
                n++;
            }
            line = nl ? nl + 1 : line + strlen(line);
        }
    }
    qsort(ms, n, sizeof(*ms), meta_cmp);
    FILE *f = fopen(path, "w");
    if (!f) {
        free(ms);
        return mt_error(MT_ERR_IO, "checkpoint: cannot create %s: %s", path, strerror(errno));
    }
    const mt_config_t *cfg = j->cfg;
    const mt_model_config_t *mc = mt_model_config(j->model);
    fprintf(f, "{\n  \"format\": \"%s\",\n  \"version\": %d,\n  \"step\": %lld,\n  \"optimizer_step\": %lld,\n",
            CKPT_FORMAT, CKPT_VERSION, (long long)step, (long long)j->engine->ckpt_get_step(j->ectx));
    const mt_loss_scaler_t *sc = mt_job_scaler(j); /* the engine's own when it scales on its device */
    fprintf(f, "  \"precision\": {\"compute\": \"%s\", \"loss_scale\": %.9g, \"clean_steps\": %lld},\n",
            mt_prec_name(j->set.prec.compute), (double)sc->scale, (long long)sc->clean_steps);
    fprintf(f,
            "  \"data\": {\"kind\": \"%s\", \"order\": \"%s\", \"next_step\": %lld, \"global_batch\": %lld, "
            "\"seq_len\": %lld},\n",
            mt_config_str(cfg, "data.kind"), mt_config_str(cfg, "data.order"), (long long)step,
            (long long)j->info.global_batch, (long long)j->info.seq_len);
    fprintf(f,
            "  \"rng\": {\"init_seed\": %llu, \"data_seed\": %lld, \"generator\": \"counter-based: values depend "
            "only on (seed, step, row, position), so the data position is next_step\"},\n",
            (unsigned long long)mc->seed, (long long)mt_config_int(cfg, "train.seed"));
    fprintf(f,
            "  \"model\": {\"kind\": \"%s\", \"n_layer\": %d, \"n_head\": %d, \"n_embd\": %d, \"seq_len\": %d, "
            "\"vocab_size\": %d, \"padded_vocab\": %d, \"seed\": %llu, \"n_params\": %zu},\n",
            mc->kind == MT_MODEL_MLP ? "mlp" : "gpt2", mc->n_layer, mc->n_head, mc->n_embd, mc->seq_len, mc->vocab_size,
            mc->padded_vocab, (unsigned long long)mc->seed, mt_model_numel(j->model));
    fprintf(f,
            "  \"mesh\": {\"world\": %d, \"tp\": %d, \"pp\": %d, \"dp\": %d, \"order\": \"%s\", \"engine\": "
            "\"%s\", \"zero_stage\": %d},\n",
            j->world, j->set.par.tp, j->set.par.pp, j->info.dp_size, j->set.par.order, j->engine->name,
            j->set.par.zero_stage);
    fprintf(f, "  \"files\": [");
    for (int r = 0; r < j->world; r++) {
        fprintf(f, "%s{\"rank\": %d, \"file\": \"rank-%05d.bin\", \"bytes\": %lld}", r ? ", " : "", r, r,
                (long long)bytes[r]);
    }
    fprintf(f, "],\n  \"tensors\": [\n");
    mt_status_t st = MT_OK;
    for (size_t i = 0; i < n;) {
        size_t k = i;
        long long numel = 0;
        fprintf(f, "    {\"name\": ");
        mt_json_write_string(f, ms[i].tensor);
        if (ms[i].ndim == 2) {
            fprintf(f, ", \"dtype\": \"f32\", \"shape\": [%lld, %lld], \"shards\": [", ms[i].shape[0], ms[i].shape[1]);
        } else {
            fprintf(f, ", \"dtype\": \"f32\", \"shape\": [%lld], \"shards\": [", ms[i].shape[0]);
        }
        for (; k < n && !strcmp(ms[k].tensor, ms[i].tensor); k++) {
            const meta_t *m = &ms[k];
            if (m->ndim == 2) {
                fprintf(f, "%s\n      {\"rank\": %d, \"lo\": [%lld, %lld], \"hi\": [%lld, %lld], ", k > i ? "," : "",
                        m->rank, m->lo[0], m->lo[1], m->hi[0], m->hi[1]);
                numel += (m->hi[0] - m->lo[0]) * (m->hi[1] - m->lo[1]);
            } else {
                fprintf(f, "%s\n      {\"rank\": %d, \"lo\": [%lld], \"hi\": [%lld], ", k > i ? "," : "", m->rank,
                        m->lo[0], m->hi[0]);
                numel += m->hi[0] - m->lo[0];
            }
            fprintf(f, "\"file\": \"rank-%05d.bin\", \"offset\": %lld, \"bytes\": %lld, \"crc32c\": %u}", m->rank,
                    m->offset, m->bytes, m->crc);
        }
        long long whole = ms[i].shape[0] * (ms[i].ndim == 2 ? ms[i].shape[1] : 1);
        if (numel != whole && st == MT_OK) {
            st = mt_error(MT_ERR_INTERNAL, "checkpoint: the engine's shards of %s hold %lld of its %lld elements",
                          ms[i].tensor, numel, whole);
        }
        fprintf(f, "]}%s\n", k < n ? "," : "");
        i = k;
    }
    fprintf(f, "  ],\n  \"config\": ");
    char *ctext = NULL;
    size_t clen = 0;
    FILE *mem = open_memstream(&ctext, &clen);
    if (mem) {
        mt_config_print(cfg, mem);
        fclose(mem);
    }
    mt_json_write_string(f, ctext ? ctext : "");
    free(ctext);
    fprintf(f, "\n}\n");
    free(ms);
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
        st = st == MT_OK ? mt_error(MT_ERR_IO, "checkpoint: writing %s: %s", path, strerror(errno)) : st;
    }
    if (fclose(f) != 0 && st == MT_OK) {
        st = mt_error(MT_ERR_IO, "checkpoint: closing %s: %s", path, strerror(errno));
    }
    return st;
}

static mt_status_t write_config(const mt_config_t *cfg, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) {
        return mt_error(MT_ERR_IO, "checkpoint: cannot create %s: %s", path, strerror(errno));
    }
    mt_config_print(cfg, f);
    int rc = fflush(f) | fsync(fileno(f));
    rc |= fclose(f);
    return rc ? mt_error(MT_ERR_IO, "checkpoint: writing %s failed", path) : MT_OK;
}

static int64_t step_of(const char *name) {
    long long s = -1;
    char tail = 0;
    if (sscanf(name, "step-%lld%c", &s, &tail) != 1) {
        return -1;
    }
    return s;
}

static int cmp_i64_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Rank 0, after the new checkpoint is complete: removes step directories beyond the keep newest and any
 * temporary directories left by crashed saves. */
static void prune(const char *dir, int64_t keep, int64_t newest) {
    DIR *d = opendir(dir);
    if (!d) {
        return;
    }
    int64_t steps[4096];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t s = step_of(e->d_name);
        if (s >= 0 && n < (int)MT_ARRAY_LEN(steps)) {
            steps[n++] = s;
        } else if (!strncmp(e->d_name, ".tmp-step-", 10) || !strncmp(e->d_name, ".old-step-", 10)) {
            char p[2200];
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            rm_rf(p);
        }
    }
    closedir(d);
    qsort(steps, (size_t)n, sizeof(int64_t), cmp_i64_desc);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (steps[i] == newest || kept < keep) {
            kept++;
            continue;
        }
        char p[1200];
        snprintf(p, sizeof(p), "%s/step-%08lld", dir, (long long)steps[i]);
        rm_rf(p);
    }
}

static mt_status_t agree_st(job_t *j, mt_status_t st) {
    int mine = (int)st, worst = 0;
    MT_CHECK(mt_job_allreduce(&j->sync, "ckpt_agree", &mine, &worst, 1, MPI_INT, MPI_MAX));
    if (st == MT_OK && worst != MT_OK) {
        return mt_error((mt_status_t)worst, "checkpoint: another rank failed (its message is above)");
    }
    return st;
}

static mt_status_t save(job_ckpt_t *c, job_t *j, int64_t step) {
    double t0 = mt_now();
    char final[1100], tmp[1100], name[64];
    snprintf(name, sizeof(name), "step-%08lld", (long long)step);
    snprintf(final, sizeof(final), "%s/%s", c->dir, name);
    snprintf(tmp, sizeof(tmp), "%s/.tmp-%s", c->dir, name);
    mt_status_t st = MT_OK;
    if (j->rank == 0) {
        st = mkdir_p(c->dir);
        if (st == MT_OK) {
            rm_rf(tmp);
            if (mkdir(tmp, 0755) != 0) {
                st = mt_error(MT_ERR_IO, "checkpoint: cannot create %s: %s", tmp, strerror(errno));
            }
        }
    }
    MT_CHECK(agree_st(j, st));
    /* every rank: its shard file */
    mt_ckpt_piece_t *pc = NULL;
    int n = 0;
    char *meta = NULL;
    size_t meta_len = 0;
    int64_t total = 0;
    char file[1200];
    snprintf(file, sizeof(file), "%s/rank-%05d.bin", tmp, j->rank);
    st = j->engine->ckpt_pieces(j->ectx, true, &pc, &n);
    if (st == MT_OK) {
        st = write_shard(file, pc, n, &meta, &meta_len, &total);
    }
    free(pc);
    st = agree_st(j, st);
    if (st != MT_OK) {
        free(meta);
        return st;
    }
    c->n_saved++;
    if (mt_param_ckpt_test_crash() == c->n_saved && j->rank == 0) {
        fprintf(stderr,
                "meshtrain: MESHTRAIN_CKPT_TEST_CRASH: stopping in the middle of checkpoint %s (shard files "
                "written, no manifest)\n",
                name);
        fflush(stderr);
        _exit(86);
    }
    /* gather every rank's piece lines and byte counts on rank 0 */
    int len = (int)meta_len, *lens = NULL, *displs = NULL;
    int64_t *bytes = NULL;
    char *all = NULL, **per = NULL;
    if (j->rank == 0) {
        lens = calloc((size_t)j->world, sizeof(int));
        displs = calloc((size_t)j->world, sizeof(int));
        bytes = calloc((size_t)j->world, sizeof(int64_t));
        per = calloc((size_t)j->world, sizeof(char *));
    }
    st = mt_job_gather(&j->sync, "ckpt_meta_lengths", &len, 1, MPI_INT, lens, 0);
    if (st == MT_OK) {
        st = mt_job_gather(&j->sync, "ckpt_shard_bytes", &total, 1, MPI_INT64_T, bytes, 0);
    }
    size_t sum = 0;
    if (j->rank == 0) {
        for (int r = 0; r < j->world; r++) {
            displs[r] = (int)sum;
            sum += (size_t)lens[r] + 1;
        }
        all = calloc(sum + 1, 1);
    }
    if (st == MT_OK) {
        st = mt_job_gatherv(&j->sync, "ckpt_meta", meta, len, MPI_CHAR, all, lens, displs, 0);
    }
    free(meta);
    if (j->rank == 0) {
        for (int r = 0; r < j->world; r++) {
            per[r] = all + displs[r];
            per[r][lens[r]] = '\0'; /* the extra byte after each rank's text */
        }
        char path[1200];
        snprintf(path, sizeof(path), "%s/config.toml", tmp);
        st = st == MT_OK ? write_config(j->cfg, path) : st; /* nothing is written after a failed gather */
        if (st == MT_OK) {
            snprintf(path, sizeof(path), "%s/manifest.json", tmp);
            st = write_manifest(j, path, step, per, bytes); /* the manifest is the last file written */
        }
        if (st == MT_OK) {
            st = fsync_path(tmp);
        }
        if (st == MT_OK && exists(final)) {
            /* The same step written before (a fresh run over an old directory): swap the two directories in
             * one step, so `latest`, which may name this step, never points at a missing directory; the old
             * one (now under the temporary name) is removed by prune. Without RENAME_EXCHANGE (old kernels,
             * some file systems) the old one is moved aside first. */
            if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) != 0) {
                char old[1200];
                snprintf(old, sizeof(old), "%s/.old-%s", c->dir, name);
                rm_rf(old);
                if (rename(final, old) != 0 || rename(tmp, final) != 0) {
                    st = mt_error(MT_ERR_IO, "checkpoint: replacing %s failed: %s", final, strerror(errno));
                }
            }
        } else if (st == MT_OK && rename(tmp, final) != 0) {
            st = mt_error(MT_ERR_IO, "checkpoint: rename %s -> %s: %s", tmp, final, strerror(errno));
        }
        if (st == MT_OK) {
            st = fsync_path(c->dir);
        }
        if (st == MT_OK) { /* latest: written aside, synced, renamed over the old pointer */
            char lt[1200], lp[1200];
            snprintf(lt, sizeof(lt), "%s/latest.tmp", c->dir);
            snprintf(lp, sizeof(lp), "%s/latest", c->dir);
            FILE *f = fopen(lt, "w");
            if (!f || fprintf(f, "%s\n", name) < 0 || fflush(f) != 0 || fsync(fileno(f)) != 0) {
                st = mt_error(MT_ERR_IO, "checkpoint: writing %s: %s", lt, strerror(errno));
            }
            if (f && fclose(f) != 0 && st == MT_OK) {
                st = mt_error(MT_ERR_IO, "checkpoint: writing %s: %s", lt, strerror(errno));
            }
            if (st == MT_OK && rename(lt, lp) != 0) {
                st = mt_error(MT_ERR_IO, "checkpoint: rename %s -> %s: %s", lt, lp, strerror(errno));
            }
            if (st == MT_OK) {
                st = fsync_path(c->dir);
            }
        }
        if (st == MT_OK) {
            prune(c->dir, c->keep, step);
        }
        if (st == MT_OK && j->out) {
            int64_t b = 0;
            for (int r = 0; r < j->world; r++) {
                b += bytes[r];
            }
            fprintf(j->out, "checkpoint: step %lld written to %s (%.1f MiB in %d shard file%s, %.2f s)\n",
                    (long long)step, final, (double)b / (1024.0 * 1024.0), j->world, j->world == 1 ? "" : "s",
                    mt_now() - t0);
            fflush(j->out);
        }
        free(lens);
        free(displs);
        free(bytes);
        free(per);
        free(all);
    }
    return agree_st(j, st);
}

mt_status_t mt_job_ckpt_after_step(job_ckpt_t *c, job_t *j, int64_t s, bool last) {
    if (!c || !c->dir[0]) {
        return MT_OK;
    }
    int sig = 0;
    if (c->on_signal) { /* every rank learns of a signal any rank got, at the same step */
        uint64_t call = mt_job_sync_begin(&j->sync, "signal_agree", sizeof(int)); /* watched (job_sync.c) */
        mt_status_t st = mt_signals_agree(j->comm, &sig);
        mt_job_sync_end(&j->sync, call);
        MT_CHECK(st);
    }
    if (!last && !sig && (c->every <= 0 || (s + 1) % c->every != 0)) {
        return MT_OK;
    }
    MT_TRACE_BEGIN(t_ck);
    mt_status_t st = save(c, j, s + 1);
    MT_TRACE_END(t_ck, "checkpoint", "checkpoint");
    if (st == MT_OK) {
        snprintf(c->last, sizeof(c->last), "%s/step-%08lld", c->dir, (long long)s + 1);
    }
    if (st == MT_OK && sig && !last) {
        j->stop_signal = sig;
        return mt_error(MT_ERR_SYSTEM,
                        "stopped by %s after step %lld; checkpoint %s/step-%08lld written: run the same command "
                        "again to resume (checkpoint.resume = \"auto\")",
                        sig == SIGTERM  ? "SIGTERM"
                        : sig == SIGINT ? "SIGINT"
                                        : "a signal",
                        (long long)s + 1, c->dir, (long long)s + 1);
    }
    return st;
}
