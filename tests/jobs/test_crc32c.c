/* CRC32C: the standard check value, the hardware path against the table, and chained updates.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "runtime/crc32c.h"
#include "testutil.h"

uint32_t mt_crc32c_sw(uint32_t crc, const void *p, size_t n);

int main(void) {
    CHECK(mt_crc32c(0, "123456789", 9) == 0xE3069283u, "check value: %08x", mt_crc32c(0, "123456789", 9));
    CHECK(mt_crc32c_sw(0, "123456789", 9) == 0xE3069283u, "table check value");
    CHECK(mt_crc32c(0, "", 0) == 0, "empty input");
    unsigned char buf[1031];
    for (size_t i = 0; i < sizeof(buf); i++) {
        buf[i] = (unsigned char)(i * 131 + 7);
    }
    for (size_t n = 0; n < sizeof(buf); n += 97) {
        CHECK(mt_crc32c(0, buf, n) == mt_crc32c_sw(0, buf, n), "hardware = table over %zu bytes", n);
        uint32_t c = mt_crc32c(mt_crc32c(0, buf, n / 3), buf + n / 3, n - n / 3);
        CHECK(c == mt_crc32c(0, buf, n), "chained = whole over %zu bytes", n);
    }
    uint32_t a = mt_crc32c(0, buf, sizeof(buf));
    buf[500] ^= 1;
    CHECK(mt_crc32c(0, buf, sizeof(buf)) != a, "one flipped bit changes the CRC");
    return mt_test_finish("test_crc32c");
}
