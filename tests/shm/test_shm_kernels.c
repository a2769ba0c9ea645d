/* The shared-memory reduction kernels, one process: the branch-free 16-bit conversions bit for bit
 * against the library's scalar ones (every f16 and bf16 value; f32 values by stride, around the rounding
 * boundaries and at random), and every dtype x op x input count x length (across the 1024-element
 * accumulation block) bit for bit against the scalar reference in shm_testlib.h.
 * SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "collectives/shm.h"
#include "runtime/alloc.h"
#include "shm_testlib.h"
#include "testutil.h"

static int bad_store;
static void check_store(uint32_t u) {
    float f = mt_bits_f32(u);
    uint16_t a = mt_shm_f32_to_f16(f), b = mt_f32_to_f16(f);
    uint16_t c = mt_shm_f32_to_bf16(f), d = mt_f32_to_bf16(f);
    if ((a != b || c != d) && bad_store++ < 5) {
        fprintf(stderr, "f32 0x%08x: f16 %04x vs %04x, bf16 %04x vs %04x\n", u, a, b, c, d);
    }
}

static void test_conversions(void) {
    int bad_load = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if (mt_f32_bits(mt_shm_f16_to_f32((uint16_t)h)) != mt_f32_bits(mt_f16_to_f32((uint16_t)h)) ||
            mt_f32_bits(mt_shm_bf16_to_f32((uint16_t)h)) != mt_f32_bits(mt_bf16_to_f32((uint16_t)h))) {
            bad_load++;
        }
        /* round trip of every 16-bit value through f32 */
        check_store(mt_f32_bits(mt_f16_to_f32((uint16_t)h)));
        check_store(mt_f32_bits(mt_bf16_to_f32((uint16_t)h)));
    }
    CHECK(bad_load == 0, "%d 16-bit values load differently", bad_load);
    for (uint64_t u = 0; u < (1ull << 32); u += 251) {
        check_store((uint32_t)u);
    }
    /* every f32 around the subnormal/normal and the overflow boundaries of f16, and the halfway points */
    const uint32_t centres[] = {0x38800000u, 0x477ff000u, 0x33000000u, 0x3f800000u};
    for (size_t c = 0; c < MT_ARRAY_LEN(centres); c++) {
        for (uint32_t d = 0; d < 0x40000u; d++) {
            check_store(centres[c] - 0x20000u + d);
            check_store((centres[c] - 0x20000u + d) | 0x80000000u);
        }
    }
    for (uint64_t k = 0; k < 4000000; k++) {
        check_store((uint32_t)tl_hash(k));
    }
    CHECK(bad_store == 0, "%d f32 values round differently to f16/bf16", bad_store);
}

static void test_kernels(void) {
    const size_t lens[] = {0, 1, 17, 1023, 1024, 1025, 3001};
    const size_t maxn = 3001;
    void *in[5], *out = mt_alloc(maxn * 8, MT_MEM_OTHER, "test"), *ref = mt_alloc(maxn * 8, MT_MEM_OTHER, "test");
    for (int r = 0; r < 5; r++) {
        in[r] = mt_alloc(maxn * 8, MT_MEM_OTHER, "test");
    }
    for (int d = 0; d < MT_COLL_DTYPE_COUNT; d++) {
        size_t es = mt_coll_dtype_size((mt_coll_dtype_t)d);
        for (int op = 0; op < MT_REDOP_COUNT; op++) {
            for (int n = 1; n <= 5; n++) {
                for (size_t l = 0; l < MT_ARRAY_LEN(lens); l++) {
                    size_t len = lens[l];
                    for (int r = 0; r < n; r++) {
                        tl_fill(in[r], (mt_coll_dtype_t)d, (mt_redop_t)op, r, 7 + len, len);
                    }
                    memset(out, 0xcd, maxn * 8);
                    memset(ref, 0xcd, maxn * 8);
                    mt_shm_reduce_kernel(out, (const void *const *)in, n, len, (mt_coll_dtype_t)d, (mt_redop_t)op, n);
                    tl_reference(ref, (const void *const *)in, n, len, (mt_coll_dtype_t)d, (mt_redop_t)op);
                    CHECK(memcmp(out, ref, maxn * es) == 0, "kernel %s %s n=%d len=%zu differs from the reference",
                          mt_coll_dtype_name((mt_coll_dtype_t)d), mt_redop_name((mt_redop_t)op), n, len);
                }
            }
        }
    }
    for (int r = 0; r < 5; r++) {
        mt_free(in[r]);
    }
    mt_free(out);
    mt_free(ref);
}

int main(void) {
    test_conversions();
    test_kernels();
    return mt_test_finish("test_shm_kernels");
}
