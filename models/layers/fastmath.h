/* A vectorisable expf for the hot loops (softmax, attention, GELU): Cephes' range reduction and degree-6
 * polynomial, <= 4e-7 relative error (tested), no libm call, so `omp simd` loops vectorise without
 * -ffast-math (the float->int conversion needs -fno-trapping-math, set in models/CMakeLists.txt).
 * Inputs below -87.3 give 0 (softmax tails); inputs are clamped at 88.7.
 * SPDX-License-Identifier: MIT */
#ifndef MT_FASTMATH_H
#define MT_FASTMATH_H

#include <stdint.h>
#include <string.h>

static inline float mt_fast_expf(float x) {
    x = x > 88.7f ? 88.7f : x;
    float under = x < -87.3f ? 0.0f : 1.0f;
    x = x < -87.3f ? -87.3f : x;
    float t = x * 1.44269504088896341f + 0.5f;
    /* floor(t): truncate, then one less where that rounded up. Written in floats (exact here, |t| < 2^24) so
     * the AVX2/AVX-512 builds if-convert it too; an integer select defeated their vectoriser (measured). */
    float fn = (float)(int32_t)t;
    fn = fn > t ? fn - 1.0f : fn;
    int32_t n = (int32_t)fn;
    x -= fn * 0.693359375f;
    x -= fn * -2.12194440e-4f;
    float z = x * x;
    float y = 1.9875691500e-4f;
    y = y * x + 1.3981999507e-3f;
    y = y * x + 8.3334519073e-3f;
    y = y * x + 4.1665795894e-2f;
    y = y * x + 1.6666665459e-1f;
    y = y * x + 5.0000001201e-1f;
    y = y * z + x + 1.0f;
    /* Shifted as unsigned: for a NaN input n is INT32_MIN (x86's conversion of NaN), and a left shift of
     * a negative int is undefined (UBSan); the NaN then propagates through y as it should. */
    int32_t bits = (int32_t)((uint32_t)(n + 127) << 23);
    float p2;
    memcpy(&p2, &bits, sizeof(p2));
    return y * p2 * under;
}

#endif
