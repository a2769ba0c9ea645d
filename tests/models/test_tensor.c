/* Tensors: allocation through the accounted allocator by category, shape errors, CUDA tensors refused
 * cleanly without a device, and exact bf16 / f16 conversions (rounding, specials, subnormals).
 * SPDX-License-Identifier: MIT */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "runtime/tensor.h"
#include "testutil.h"

int main(void) {
    mt_mem_stats_t s0, s1;
    mt_mem_stats(MT_MEM_HOST, &s0);
    mt_tensor_t t;
    int64_t shape[3] = {3, 5, 7};
    CHECK_OK(mt_tensor_alloc(&t, MT_BF16, MT_DEV_CPU, 3, shape, MT_MEM_OPTIMIZER, "test"));
    CHECK(mt_tensor_numel(&t) == 105 && mt_tensor_bytes(&t) == 210, "numel/bytes");
    CHECK(((uintptr_t)t.data % MT_ALLOC_ALIGN) == 0, "aligned");
    mt_mem_stats(MT_MEM_HOST, &s1);
    CHECK(s1.current[MT_MEM_OPTIMIZER] - s0.current[MT_MEM_OPTIMIZER] == 256,
          "210 bytes accounted as 256 (64-rounded)");
    mt_tensor_free(&t);
    mt_mem_stats(MT_MEM_HOST, &s1);
    CHECK(s1.current[MT_MEM_OPTIMIZER] == s0.current[MT_MEM_OPTIMIZER], "freed");
    CHECK(t.data == NULL, "cleared");
    int64_t neg[2] = {4, -1};
    CHECK(mt_tensor_alloc(&t, MT_F32, MT_DEV_CPU, 2, neg, MT_MEM_OTHER, "x") == MT_ERR_INVALID_ARG, "negative dim");
    CHECK(mt_tensor_alloc(&t, MT_F32, MT_DEV_CPU, 5, shape, MT_MEM_OTHER, "x") == MT_ERR_INVALID_ARG, "ndim 5");
    mt_status_t st = mt_tensor_alloc(&t, MT_F32, MT_DEV_CUDA, 1, shape, MT_MEM_PARAMS, "x");
#if MT_HAVE_CUDA
    if (st == MT_OK) {
        mt_mem_stats(MT_MEM_DEVICE, &s1);
        CHECK(s1.current[MT_MEM_PARAMS] >= 12, "device bytes accounted");
        mt_tensor_free(&t);
    } else {
        CHECK(st == MT_ERR_CUDA || st == MT_ERR_OOM, "no device: a CUDA error, not a crash (%s)", mt_last_error_msg());
    }
#else
    CHECK(st == MT_ERR_INVALID_USAGE, "CPU-only build refuses CUDA tensors");
#endif
    float buf[4] = {1, 2, 3, 4};
    mt_tensor_t v = mt_tensor_view(buf, MT_F32, MT_DEV_CPU, 1, (int64_t[]){4});
    mt_tensor_free(&v); /* a view is never freed */
    CHECK(buf[3] == 4.0f, "view untouched");

    /* bf16 */
    CHECK(mt_f32_to_bf16(1.0f) == 0x3f80 && mt_bf16_to_f32(0x3f80) == 1.0f, "bf16 1.0");
    CHECK(mt_f32_to_bf16(1.00390625f) == 0x3f80, "tie to even (down)"); /* 1 + 2^-8: halfway, even is 0x3f80 */
    CHECK(mt_f32_to_bf16(1.01171875f) == 0x3f82, "tie to even (up)");   /* 1 + 3*2^-8: halfway, even is 0x3f82 */
    CHECK(mt_f32_to_bf16(1.0f + 1.0f / 256 + 1.0f / 1048576) == 0x3f81, "above half rounds up");
    CHECK(isnan(mt_bf16_to_f32(mt_f32_to_bf16(NAN))), "NaN stays NaN");
    CHECK(mt_f32_to_bf16(INFINITY) == 0x7f80 && mt_f32_to_bf16(-0.0f) == 0x8000, "inf, -0");
    /* f16 */
    CHECK(mt_f32_to_f16(1.0f) == 0x3c00 && mt_f32_to_f16(-2.0f) == 0xc000 && mt_f32_to_f16(65504.0f) == 0x7bff,
          "f16 normals");
    CHECK(mt_f32_to_f16(65520.0f) == 0x7c00 && mt_f32_to_f16(65519.0f) == 0x7bff, "f16 overflow boundary");
    CHECK(mt_f32_to_f16(5.9604645e-8f) == 0x0001 && mt_f32_to_f16(2.9802322e-8f) == 0x0000, "subnormal, tie to 0");
    CHECK(mt_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00 && mt_f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02, "f16 ties");
    CHECK(mt_f32_to_f16(6.1035156e-05f) == 0x0400, "smallest normal");
    int rt_ok = 1;
    for (uint32_t h = 0; h < 65536; h++) { /* every half converts to float and back unchanged (NaNs stay NaN) */
        float f = mt_f16_to_f32((uint16_t)h);
        uint16_t back = mt_f32_to_f16(f);
        rt_ok &= isnan(f) ? (back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0 : back == h;
    }
    CHECK(rt_ok, "f16 -> f32 -> f16 identity over all 65536 values");
    int bf_ok = 1;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = mt_bf16_to_f32((uint16_t)h);
        bf_ok &= isnan(f) || mt_f32_to_bf16(f) == h;
    }
    CHECK(bf_ok, "bf16 -> f32 -> bf16 identity");
    float src[3] = {1.5f, -3.25f, 1e-3f};
    uint16_t mid[3];
    float dst[3];
    mt_convert(mid, MT_F16, src, MT_F32, 3);
    mt_convert(dst, MT_F32, mid, MT_F16, 3);
    CHECK(dst[0] == 1.5f && dst[1] == -3.25f && fabsf(dst[2] - 1e-3f) < 1e-6f, "mt_convert f32 <-> f16");
    return mt_test_finish("test_tensor");
}
