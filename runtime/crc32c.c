/* CRC32C, reflected polynomial 0x82F63B78: hardware (SSE4.2 crc32, 8 bytes a step) when the CPU has it,
 * else a byte-wise table. The two are checked against each other and the standard check value in
 * tests/jobs/test_crc32c.c.
 * SPDX-License-Identifier: MIT */
#include "crc32c.h"

#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

static uint32_t table[256];
static bool table_ready;

static void table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        }
        table[i] = c;
    }
    table_ready = true;
}

/* The portable version, also called by the test to check the hardware path against it. */
uint32_t mt_crc32c_sw(uint32_t crc, const void *p, size_t n);
uint32_t mt_crc32c_sw(uint32_t crc, const void *p, size_t n) {
    if (!table_ready) {
        table_init(); /* idempotent: concurrent first calls write the same values */
    }
    const unsigned char *b = p;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc = table[(crc ^ b[i]) & 0xff] ^ (crc >> 8);
    }
    return ~crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t c = ~crc & 0xffffffffu;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, b, 8);
        c = _mm_crc32_u64(c, v);
        b += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) {
        c32 = _mm_crc32_u8(c32, *b++);
    }
    return ~c32;
}
#endif

uint32_t mt_crc32c(uint32_t crc, const void *p, size_t n) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2")) {
        return crc32c_hw(crc, p, n);
    }
#endif
    return mt_crc32c_sw(crc, p, n);
}
