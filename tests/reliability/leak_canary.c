/* Sanitizer builds only: a deliberate leak from meshtrain code after MPI start-up and shutdown. The test
 * passes when LeakSanitizer reports it, proving the Open MPI suppressions (tests/lsan.supp) hide only
 * Open MPI's allocations and not ours.
 * SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <stdlib.h>

#include "runtime/rt.h"

static void *canary;

int main(int argc, char **argv) {
    if (mt_rt_init(&argc, &argv) != MT_OK) {
        return 1;
    }
    canary = malloc(4321);
    printf("leak canary: %p\n", canary);
    canary = NULL; /* now unreachable */
    mt_rt_finalize();
    return 0;
}
