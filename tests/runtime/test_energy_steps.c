/* mt_energy_steps (runtime/nvml.h): per-step energy from a counter that updates more coarsely than a step, on
 * made-up readings (no NVML needed).
 * SPDX-License-Identifier: MIT */
#include "runtime/nvml.h"
#include "testutil.h"

int main(void) {
    mt_energy_steps_t s;
    double j = -1.0;
    /* before the counter first changes: power x wall time, or no figure without a power reading */
    mt_energy_steps_init(&s, 1000000, 10.0);
    CHECK(!mt_energy_steps_update(&s, 1000000, 10.5, -1.0, &j) && j == -1.0, "no counter change, no power: none");
    CHECK(mt_energy_steps_update(&s, 1000000, 10.75, 400.0, &j), "no counter change: power x time");
    CHECK_CLOSE(j, 100.0, 1e-12, 0);
    /* the counter (mJ) changes every second step by 2 x 30 J: every step reports 30 J from then on */
    mt_energy_steps_init(&s, 1000000, 0.0);
    CHECK(mt_energy_steps_update(&s, 1060000, 1.0, 999.0, &j), "a figure once it changed");
    CHECK_CLOSE(j, 60.0, 1e-12, 0);
    CHECK(mt_energy_steps_update(&s, 1060000, 2.0, 999.0, &j), "an unchanged counter keeps the last figure");
    CHECK_CLOSE(j, 60.0, 1e-12, 0);
    CHECK(mt_energy_steps_update(&s, 1120000, 3.0, 999.0, &j), "the next change, over two steps");
    CHECK_CLOSE(j, 30.0, 1e-12, 0);
    /* every step updates: the plain difference */
    CHECK(mt_energy_steps_update(&s, 1145000, 4.0, 999.0, &j), "per-step change");
    CHECK_CLOSE(j, 25.0, 1e-12, 0);
    /* three steps without a change, then 90 J: 22.5 J each from the change; the sum over the run is kept */
    for (int k = 0; k < 3; k++) {
        CHECK(mt_energy_steps_update(&s, 1145000, 5.0 + k, 999.0, &j), "carried figure");
        CHECK_CLOSE(j, 25.0, 1e-12, 0);
    }
    CHECK(mt_energy_steps_update(&s, 1235000, 8.0, 999.0, &j), "change after four steps");
    CHECK_CLOSE(j, 22.5, 1e-12, 0);
    CHECK_CLOSE(j * 4, 90.0, 1e-12, 0);
    /* a counter that goes backwards (a reset) is not a change; counting restarts from the new reading */
    CHECK(mt_energy_steps_update(&s, 5, 9.0, 999.0, &j), "a smaller reading keeps the last figure");
    CHECK_CLOSE(j, 22.5, 1e-12, 0);
    CHECK(mt_energy_steps_update(&s, 30005, 10.0, 999.0, &j), "after the reset");
    CHECK_CLOSE(j, 30.0, 1e-12, 0);
    return mt_test_finish("test_energy_steps");
}
