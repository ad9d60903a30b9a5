/* bfloat16 and IEEE half (float16) values, held as their 16-bit patterns, and
 * their conversions to and from float: exact one way, round-to-nearest-even
 * the other, NaN kept NaN and quiet, subnormals kept (the rounding torch's own
 * .to() does).  The scalar forms are portable C; the row forms run vector
 * code where the CPU has it (F16C for float16). */
#ifndef TL_HALF_H
#define TL_HALF_H

#include <stdint.h>
#include <string.h>

#include "tl_conv.h"
#include "tl_simd.h"

static inline float tl_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t tl_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* ties to the even bf16 */
    return (uint16_t)(u >> 16);
}

static inline float tl_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu,
                   man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13); /* infinity or NaN */
    } else if (exp) {
        u = sign | ((exp + 112u) << 23) | (man << 13); /* rebias 15 -> 127 */
    } else {
        float f = (float)man * 0x1p-24f; /* zero or subnormal: exact */
        memcpy(&u, &f, sizeof u);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t tl_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504 */
    if (a < 0x38800000u) {
        /* Below 2^-14: a multiple of 2^-24 in half.  |f| * 2^24 < 1024 is
         * exact; adding 2^23 rounds it to an integer, ties to even.  1024
         * itself is the smallest normal, 0x0400, as it should be. */
        float v;
        memcpy(&v, &a, sizeof v);
        v = (v * 0x1p24f + 0x1p23f) - 0x1p23f;
        return (uint16_t)(sign | (uint16_t)v);
    }
    uint32_t r = a - (112u << 23); /* rebias 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u); /* ties to the even half */
    return (uint16_t)(sign | (r >> 13));
}

/* dst[0..n) = the float values of src[0..n) (t is TL_BF16 or TL_F16). */
void tl_half_row_to_f32(tl_simd level, tl_dtype t, const uint16_t *src, int64_t n, float *dst);

/* dst + r * ld = the float values of rows[r][0..n), then zeros up to ld
 * (ld >= n), r < count (t is TL_BF16 or TL_F16): tl_half_row_to_f32 over
 * gathered rows, each asked for ahead. */
void tl_half_rows_to_f32(tl_simd level, tl_dtype t, const uint16_t *const *rows, int64_t count,
                         int64_t n, int64_t ld, float *dst);

/* dst[0..n) = src[0..n) rounded to t (TL_BF16 or TL_F16). */
void tl_f32_row_to_half(tl_simd level, tl_dtype t, const float *src, int64_t n, uint16_t *dst);

#endif
