/* CPU emulation of __half (storage + round-to-nearest-even conversion, IEEE binary16). Test-only.
 * SPDX-License-Identifier: MIT */
#ifndef MT_EMU_CUDA_FP16_H
#define MT_EMU_CUDA_FP16_H
#include <math.h>
#include <stdint.h>
#include <string.h>
struct __half {
    uint16_t x;
};
static inline float __half2float(__half h) {
    uint32_t sign = (uint32_t)(h.x & 0x8000u) << 16, e = (h.x >> 10) & 0x1fu, m = h.x & 0x3ffu, u;
    if (e == 0) {
        float v = (float)m * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    u = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e - 15 + 127) << 23) | (m << 13));
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline __half __float2half_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    __half h;
    if (a > 0x7f800000u) {
        h.x = (uint16_t)(sign | 0x7e00u);
    } else if (a >= 0x477ff000u) {
        h.x = (uint16_t)(sign | 0x7c00u);
    } else if (a < 0x38800000u) {
        float af;
        memcpy(&af, &a, 4);
        h.x = (uint16_t)(sign | (uint32_t)nearbyintf(af * 16777216.0f));
    } else {
        uint32_t r = (((a >> 23) - 112) << 10) | ((a & 0x7fffffu) >> 13), rest = a & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) {
            r++;
        }
        h.x = (uint16_t)(sign | r);
    }
    return h;
}
#endif
