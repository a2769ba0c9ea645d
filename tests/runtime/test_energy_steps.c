/* mt_energy_steps (runtime/nvml.h): per-step energy from a counter that updates more coarsely than a step, on
 * made-up readings (no NVML needed).
 * SPDX-License-Identifier: MIT */
#include "runtime/nvml.h"
#include "testutil.h"

int main(void) {
    mt_energy_steps_t s;
    double j = -1.0;
    /* the counter (mJ) changes every second step by 2 x 30 J: every step reports 30 J from the first change */
    mt_energy_steps_init(&s, 1000000);
    CHECK(!mt_energy_steps_update(&s, 1000000, &j) && j == -1.0, "no figure before the counter first changes");
    CHECK(mt_energy_steps_update(&s, 1060000, &j), "a figure once it changed");
    CHECK_CLOSE(j, 30.0, 1e-12, 0);
    CHECK(mt_energy_steps_update(&s, 1060000, &j), "an unchanged counter keeps the last per-step figure");
    CHECK_CLOSE(j, 30.0, 1e-12, 0);
    CHECK(mt_energy_steps_update(&s, 1120000, &j), "the next change");
    CHECK_CLOSE(j, 30.0, 1e-12, 0);
    /* every step updates: the plain difference */
    CHECK(mt_energy_steps_update(&s, 1145000, &j), "per-step change");
    CHECK_CLOSE(j, 25.0, 1e-12, 0);
    /* three steps without a change, then 90 J: 30 J each at the change; the sum over the run is kept */
    double sum = 0.0;
    for (int k = 0; k < 3; k++) {
        CHECK(mt_energy_steps_update(&s, 1145000, &j), "carried figure");
        CHECK_CLOSE(j, 25.0, 1e-12, 0);
    }
    CHECK(mt_energy_steps_update(&s, 1235000, &j), "change after four steps");
    sum += j * 4;
    CHECK_CLOSE(j, 22.5, 1e-12, 0);
    CHECK_CLOSE(sum, 90.0, 1e-12, 0);
    /* a counter that goes backwards (a reset) is not a change; counting restarts from the new reading */
    CHECK(mt_energy_steps_update(&s, 5, &j), "a smaller reading keeps the last figure");
    CHECK_CLOSE(j, 22.5, 1e-12, 0);
    CHECK(mt_energy_steps_update(&s, 30005, &j), "after the reset");
    CHECK_CLOSE(j, 30.0, 1e-12, 0);
    return mt_test_finish("test_energy_steps");
}
