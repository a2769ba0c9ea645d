/* Shared by the fuzz harnesses: the input as a file (a memfd named by /proc/self/fd/N, so the real
 * path-taking readers run unchanged and nothing touches the disk).
 * SPDX-License-Identifier: MIT */
#ifndef MT_FUZZ_UTIL_H
#define MT_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

/* Writes data into a fresh memfd and puts its path in path; returns the fd (close it) or -1. */
static inline int fuzz_as_file(const uint8_t *data, size_t size, char *path, size_t n) {
    int fd = memfd_create("meshtrain-fuzz", 0);
    if (fd < 0) {
        return -1;
    }
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        off += (size_t)w;
    }
    snprintf(path, n, "/proc/self/fd/%d", fd);
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
