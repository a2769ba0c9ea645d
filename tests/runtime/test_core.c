/* Status names, error text, size parsing and environment parameters (read once, cached, malformed
 * values keep the default).
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "runtime/mt_core.h"
#include "testutil.h"

MT_PARAM(test_knob, "TEST_KNOB", 7)
MT_PARAM(test_bad, "TEST_BAD", 3)
MT_PARAM_STR(test_str, "TEST_STR", "dflt")

int main(void) {
    CHECK(!strcmp(mt_status_str(MT_OK), "MT_OK"), "ok name");
    CHECK(!strcmp(mt_status_str(MT_ERR_MPI), "MT_ERR_MPI"), "mpi name");
    CHECK(!strcmp(mt_status_str((mt_status_t)999), "MT_ERR_UNKNOWN"), "out of range");
    CHECK(mt_error(MT_ERR_IO, "cannot open %s", "x.bin") == MT_ERR_IO, "returns status");
    CHECK(!strcmp(mt_last_error_msg(), "cannot open x.bin"), "message kept: %s", mt_last_error_msg());

    int64_t v = 0;
    CHECK(mt_parse_size("64K", &v) && v == 65536, "64K");
    CHECK(mt_parse_size("1M", &v) && v == 1 << 20, "1M");
    CHECK(mt_parse_size("2GB", &v) && v == 2LL << 30, "2GB");
    CHECK(mt_parse_size("17", &v) && v == 17, "17");
    CHECK(!mt_parse_size("17x", &v), "17x rejected");
    CHECK(!mt_parse_size("", &v), "empty rejected");
    CHECK(!mt_parse_size("99999999999G", &v), "overflow rejected");

    double odd[] = {5, 1, 3}, even[] = {4, 1, 3, 2}, one[] = {7};
    CHECK(mt_median(odd, 3) == 3 && odd[0] == 1 && odd[2] == 5, "median of 3, sorted in place");
    CHECK(mt_median(even, 4) == 2.5, "median of 4: mean of the middle two");
    CHECK(mt_median(one, 1) == 7, "median of 1");

    setenv("MESHTRAIN_TEST_KNOB", "1K", 1);
    setenv("MESHTRAIN_TEST_BAD", "many", 1);
    setenv("MESHTRAIN_TEST_STR", "hello", 1);
    CHECK(mt_param_test_knob() == 1024, "env read: %lld", (long long)mt_param_test_knob());
    setenv("MESHTRAIN_TEST_KNOB", "5", 1);
    CHECK(mt_param_test_knob() == 1024, "read once, cached");
    CHECK(mt_param_test_bad() == 3, "malformed keeps default");
    CHECK(!strcmp(mt_param_test_str(), "hello"), "string param");
    return mt_test_finish("test_core");
}
