/* llm.c token shards: writing one, and validating one completely before training touches it, so a
 * malformed file stops the job at start-up with its name and what is wrong rather than mid-run.
 * SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"

static mt_status_t write_all(int fd, const void *buf, size_t bytes, const char *path) {
    const char *p = buf;
    while (bytes > 0) {
        ssize_t w = write(fd, p, bytes);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            return mt_error(MT_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        }
        p += w;
        bytes -= (size_t)w;
    }
    return MT_OK;
}

mt_status_t mt_shard_write(const char *path, const uint16_t *tokens, size_t n) {
    if (n > INT32_MAX) {
        return mt_error(MT_ERR_INVALID_ARG, "%s: %zu tokens do not fit the int32 token count of the header", path, n);
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        return mt_error(MT_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    }
    int32_t header[MT_SHARD_HEADER_BYTES / 4] = {0};
    header[0] = MT_SHARD_MAGIC;
    header[1] = MT_SHARD_VERSION;
    header[2] = (int32_t)n;
    mt_status_t st = write_all(fd, header, sizeof(header), path);
    if (st == MT_OK) {
        st = write_all(fd, tokens, n * sizeof(uint16_t), path);
    }
    if (close(fd) != 0 && st == MT_OK) {
        st = mt_error(MT_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    }
    return st;
}

/* Reads exactly bytes at off, or reports how many there were. */
static mt_status_t read_at(int fd, void *buf, size_t bytes, off_t off, const char *path) {
    char *p = buf;
    while (bytes > 0) {
        ssize_t r = pread(fd, p, bytes, off);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            return mt_error(MT_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        }
        if (r == 0) {
            return mt_error(MT_ERR_IO, "%s: unexpected end of file at byte %lld", path, (long long)off);
        }
        p += r;
        off += r;
        bytes -= (size_t)r;
    }
    return MT_OK;
}

mt_status_t mt_shard_check(const char *path, int64_t vocab_size, int64_t *n_tokens) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        return mt_error(MT_ERR_IO, "cannot open token shard %s: %s", path, strerror(errno));
    }
    mt_status_t st = MT_OK;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = mt_error(MT_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
        goto exit;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = mt_error(MT_ERR_INVALID_ARG, "%s: not a regular file (%s): expected an llm.c token shard", path,
                      S_ISDIR(sb.st_mode) ? "a directory" : "a device, pipe or socket");
        goto exit;
    }
    if (sb.st_size < MT_SHARD_HEADER_BYTES) {
        st = mt_error(MT_ERR_INVALID_ARG,
                      "%s: truncated: %lld bytes, shorter than the %d-byte header of an llm.c token shard", path,
                      (long long)sb.st_size, MT_SHARD_HEADER_BYTES);
        goto exit;
    }
    int32_t header[MT_SHARD_HEADER_BYTES / 4];
    MT_CHECK_GOTO(read_at(fd, header, sizeof(header), 0, path), st, exit);
    if (header[0] != MT_SHARD_MAGIC) {
        st = mt_error(MT_ERR_INVALID_ARG,
                      "%s: bad magic %d (expected %d): not an llm.c token shard (write shards with llm.c's "
                      "data scripts or mt_shard_write)",
                      path, header[0], MT_SHARD_MAGIC);
        goto exit;
    }
    if (header[1] != MT_SHARD_VERSION) {
        st = mt_error(MT_ERR_INVALID_ARG, "%s: version %d, only version %d (uint16 tokens) is supported", path,
                      header[1], MT_SHARD_VERSION);
        goto exit;
    }
    int64_t n = header[2];
    if (n < 0) {
        st = mt_error(MT_ERR_INVALID_ARG, "%s: negative token count %lld in the header", path, (long long)n);
        goto exit;
    }
    int64_t expect = MT_SHARD_HEADER_BYTES + 2 * n;
    if ((int64_t)sb.st_size < expect) {
        st = mt_error(MT_ERR_INVALID_ARG, "%s: truncated: header says %lld tokens = %lld bytes, file has %lld", path,
                      (long long)n, (long long)expect, (long long)sb.st_size);
        goto exit;
    }
    if ((int64_t)sb.st_size > expect) {
        st = mt_error(MT_ERR_INVALID_ARG,
                      "%s: %lld bytes but the header says %lld tokens = %lld bytes: trailing data, or a corrupt "
                      "header",
                      path, (long long)sb.st_size, (long long)n, (long long)expect);
        goto exit;
    }
    if (vocab_size > 0) {
        enum { CHUNK = 1 << 16 };
        static _Thread_local uint16_t buf[CHUNK];
        for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
            int64_t m = MT_MIN((int64_t)CHUNK, n - i0);
            MT_CHECK_GOTO(read_at(fd, buf, (size_t)m * 2, MT_SHARD_HEADER_BYTES + 2 * i0, path), st, exit);
            for (int64_t i = 0; i < m; i++) {
                if (buf[i] >= vocab_size) {
                    st = mt_error(MT_ERR_INVALID_ARG,
                                  "%s: token %u at index %lld is >= vocab_size %lld (model.vocab_size too small "
                                  "for this data, or a shard of another tokenizer)",
                                  path, (unsigned)buf[i], (long long)(i0 + i), (long long)vocab_size);
                    goto exit;
                }
            }
        }
    }
    if (n_tokens) {
        *n_tokens = n;
    }
exit:
    close(fd);
    return st;
}
