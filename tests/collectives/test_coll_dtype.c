/* Element types: names and parsing, single elements through double, f16/bf16 <-> f32 conversions (exact
 * round trips, round to nearest even on ties, NaN/inf/subnormals), and the MPI backend's user-defined
 * f16/bf16 reductions checked element by element against f32 arithmetic rounded once, at odd lengths and
 * unaligned offsets.
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "runtime/rt.h"
#include "testutil.h"

static uint32_t rng = 12345;
static uint32_t next_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

int main(int argc, char **argv) {
    CHECK_OK(mt_rt_init(&argc, &argv));
    /* names */
    mt_coll_dtype_t d;
    mt_redop_t o;
    CHECK(mt_coll_dtype_parse("bf16", &d) && d == MT_COLL_BF16, "bf16");
    CHECK(mt_coll_dtype_parse("float32", &d) && d == MT_COLL_F32, "float32");
    CHECK(mt_coll_dtype_parse("HALF", &d) && d == MT_COLL_F16, "half");
    CHECK(!mt_coll_dtype_parse("f8", &d), "f8 is not a dtype");
    CHECK(mt_redop_parse("avg", &o) && o == MT_REDOP_AVG, "avg");
    CHECK(!mt_redop_parse("xor", &o), "xor");
    CHECK(mt_coll_dtype_size(MT_COLL_I64) == 8 && mt_coll_dtype_size(MT_COLL_BF16) == 2 &&
              mt_coll_dtype_size(MT_COLL_U8) == 1,
          "sizes");
    CHECK(!strcmp(mt_coll_dtype_name(MT_COLL_F16), "f16") && !strcmp(mt_redop_name(MT_REDOP_PROD), "prod"), "names");

    /* single elements through double: every dtype stores and returns -3 and 1.5 where it can hold them,
     * at the right offset, and the combine of each op */
    for (int dt = 0; dt < MT_COLL_DTYPE_COUNT; dt++) {
        mt_coll_dtype_t t = (mt_coll_dtype_t)dt;
        uint64_t buf[4] = {0};
        bool integral = t == MT_COLL_I32 || t == MT_COLL_I64 || t == MT_COLL_U8;
        double v = t == MT_COLL_U8 ? 200.0 : integral ? -3.0 : 1.5;
        mt_coll_elem_set(buf, t, 2, v);
        CHECK(mt_coll_elem_get(buf, t, 2) == v && mt_coll_elem_get(buf, t, 1) == 0.0 &&
                  mt_coll_elem_get(buf, t, 3) == 0.0,
              "element round trip of %s", mt_coll_dtype_name(t));
    }
    CHECK(mt_redop_apply(MT_REDOP_SUM, 2, 3) == 5 && mt_redop_apply(MT_REDOP_AVG, 2, 3) == 5 &&
              mt_redop_apply(MT_REDOP_MAX, 2, -3) == 2 && mt_redop_apply(MT_REDOP_MIN, 2, -3) == -3 &&
              mt_redop_apply(MT_REDOP_PROD, 2, -3) == -6,
          "mt_redop_apply");

    /* every 16-bit pattern round-trips (NaN stays NaN) */
    int bad_bf = 0, bad_h = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float fb = mt_bf16_to_f32((uint16_t)h), fh = mt_f16_to_f32((uint16_t)h);
        bad_bf += isnan(fb) ? !isnan(mt_bf16_to_f32(mt_f32_to_bf16(fb))) : mt_f32_to_bf16(fb) != h;
        bad_h += isnan(fh) ? !isnan(mt_f16_to_f32(mt_f32_to_f16(fh))) : mt_f32_to_f16(fh) != h;
    }
    CHECK(bad_bf == 0 && bad_h == 0, "round trips: %d bf16, %d f16 wrong", bad_bf, bad_h);
    /* ties go to even; overflow to inf; subnormals */
    CHECK(mt_f32_to_bf16(1.0f + 1.0f / 256) == 0x3f80, "bf16 tie down to even");
    CHECK(mt_f32_to_bf16(1.0f + 3.0f / 256) == 0x3f82, "bf16 tie up to even");
    CHECK(mt_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00, "f16 tie down to even");
    CHECK(mt_f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02, "f16 tie up to even");
    CHECK(mt_f32_to_f16(65520.0f) == 0x7c00 && mt_f32_to_f16(65519.0f) == 0x7bff, "f16 overflow");
    CHECK(mt_f32_to_f16(5.9604644775390625e-8f) == 0x0001 && mt_f16_to_f32(0x0001) == 5.9604644775390625e-8f,
          "f16 smallest subnormal");
    CHECK(mt_f32_to_f16(2.98e-8f) == 0x0000 && mt_f32_to_f16(-3.0e-8f) == 0x8001, "f16 subnormal rounding");
    CHECK(mt_f32_to_bf16(mt_bits_f32(0x7f7fffffu)) == 0x7f80, "bf16 max float rounds to inf");

    /* the MPI reductions against f32 arithmetic rounded once, odd lengths, unaligned starts */
    int bad_op = 0;
    uint16_t a[80], b[80], want[80];
    for (int dt16 = 0; dt16 < 2; dt16++) {
        int dt = dt16 ? MT_COLL_BF16 : MT_COLL_F16;
        for (int op = 0; op < MT_REDOP_COUNT; op++) {
            MPI_Datatype t;
            MPI_Op mop;
            CHECK_OK(mt_coll_mpi_types((mt_coll_dtype_t)dt, (mt_redop_t)op, &t, &mop));
            for (int len = 1; len <= 67; len += 3) {
                for (int off = 0; off < 2; off++) {
                    for (int i = 0; i < len; i++) {
                        float x = (float)((int)(next_u32() % 2001) - 1000) / 64.0f;
                        float y = (float)((int)(next_u32() % 2001) - 1000) / 64.0f;
                        if (i == 3) {
                            x = NAN; /* a NaN operand must give NaN for sum/prod */
                        }
                        bool bf = dt == MT_COLL_BF16;
                        a[off + i] = bf ? mt_f32_to_bf16(x) : mt_f32_to_f16(x);
                        b[off + i] = bf ? mt_f32_to_bf16(y) : mt_f32_to_f16(y);
                        float xa = bf ? mt_bf16_to_f32(a[off + i]) : mt_f16_to_f32(a[off + i]);
                        float ya = bf ? mt_bf16_to_f32(b[off + i]) : mt_f16_to_f32(b[off + i]);
                        float r = op == MT_REDOP_PROD  ? xa * ya
                                  : op == MT_REDOP_MAX ? (xa > ya ? xa : ya)
                                  : op == MT_REDOP_MIN ? (xa < ya ? xa : ya)
                                                       : xa + ya;
                        want[off + i] = bf ? mt_f32_to_bf16(r) : mt_f32_to_f16(r);
                    }
                    MPI_Reduce_local(a + off, b + off, len, t, mop);
                    for (int i = 0; i < len; i++) {
                        bool bf = dt == MT_COLL_BF16;
                        float g = bf ? mt_bf16_to_f32(b[off + i]) : mt_f16_to_f32(b[off + i]);
                        float w = bf ? mt_bf16_to_f32(want[off + i]) : mt_f16_to_f32(want[off + i]);
                        bool ok = (isnan(g) && isnan(w)) || b[off + i] == want[off + i];
                        if (!ok && bad_op < 5) {
                            fprintf(stderr, "%s %s len %d off %d [%d]: got %g want %g\n",
                                    mt_coll_dtype_name((mt_coll_dtype_t)dt), mt_redop_name((mt_redop_t)op), len, off, i,
                                    g, w);
                        }
                        bad_op += !ok;
                    }
                }
            }
        }
    }
    CHECK(bad_op == 0, "%d elements of f16/bf16 MPI reductions differ from f32 arithmetic rounded once", bad_op);
    return mt_test_finish_mpi("test_coll_dtype");
}
