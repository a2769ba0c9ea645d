/* Replays fuzz inputs through a harness without libFuzzer: every file named on the command line, or in a
 * directory named there, goes through LLVMFuzzerTestOneInput once. Built in every configuration so the
 * regression inputs under tests/data/fuzz-regressions/ run in the normal suite (and under ASan there).
 * SPDX-License-Identifier: MIT */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_util.h"

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        fclose(f);
        free(buf);
        return 1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 0;
}

static int cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    int count = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "replay: %s does not exist\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(sb.st_mode)) {
            bad += run_file(argv[i]);
            count++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        char **names = NULL;
        size_t n = 0;
        while (d && (e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') {
                continue;
            }
            names = realloc(names, (n + 1) * sizeof(char *));
            names[n] = malloc(strlen(argv[i]) + strlen(e->d_name) + 2);
            sprintf(names[n], "%s/%s", argv[i], e->d_name);
            n++;
        }
        if (d) {
            closedir(d);
        }
        qsort(names, n, sizeof(char *), cmp);
        for (size_t k = 0; k < n; k++) {
            bad += run_file(names[k]);
            count++;
            free(names[k]);
        }
        free(names);
    }
    printf("replay: %d inputs, %d unreadable\n", count, bad);
    return (bad || count == 0) ? 1 : 0;
}
