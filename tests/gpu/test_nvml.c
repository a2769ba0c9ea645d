/* NVML energy through dlopen: the counter is monotonic over a short busy interval and the power reading is
 * plausible. Exits 77 ("skipped: ...") without a CUDA device or without a loadable NVML.
 * SPDX-License-Identifier: MIT */
#include <cuda_runtime_api.h>

#include "models/cuda/mt_cuda.h"
#include "runtime/nvml.h"
#include "testutil.h"

int main(void) {
    if (mt_cuda_device_count() == 0) {
        printf("skipped: no CUDA device\n");
        return MT_TEST_SKIP;
    }
    char bus[32] = "";
    CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), 0) == cudaSuccess, "bus id");
    mt_nvml_t h = NULL;
    mt_status_t st = mt_nvml_open(bus, 0, &h);
    if (st != MT_OK) {
        printf("skipped: NVML not usable here (%s)\n", mt_last_error_msg());
        return MT_TEST_SKIP;
    }
    printf("device %s at %s\n", mt_nvml_device_name(h), bus);
    mt_nvml_meter_t m;
    CHECK_OK(mt_nvml_meter_begin(&m, h));
    double t0 = mt_now();
    while (mt_now() - t0 < 0.3) {
    }
    double j = -1, w = -1;
    CHECK_OK(mt_nvml_meter_end(&m, &j, &w));
    unsigned mw = 0;
    CHECK_OK(mt_nvml_power_mw(h, &mw));
    printf("0.3 s: %.3f J, %.1f W mean, %.1f W now\n", j, w, mw / 1000.0);
    CHECK(j >= 0 && w >= 0 && w < 2000, "energy counter monotonic, mean power plausible");
    CHECK(mw > 1000 && mw < 2000000, "an idle GPU draws between 1 W and 2 kW (%u mW)", mw);
    mt_nvml_t bad = NULL;
    CHECK(mt_nvml_open("0000:ff:1f.7", 0, &bad) != MT_OK && bad == NULL, "unknown bus id refused");
    mt_nvml_close(h);
    return mt_test_finish("test_nvml");
}
