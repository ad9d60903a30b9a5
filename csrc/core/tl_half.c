#include "tl_half.h"

#if TL_SIMD_X86
#include <immintrin.h>
#endif

/* The portable loops; compiled again below with AVX2's target attribute,
 * where GCC vectorizes the bfloat16 ones (shifts and adds). */
#define TL_HALF_LOOPS(SFX, ATTR)                                                             \
    static ATTR void tl_to_f32_##SFX(tl_dtype t, const uint16_t *src, int64_t n, float *dst) { \
        if (t == TL_BF16)                                                                    \
            for (int64_t i = 0; i < n; i++) dst[i] = tl_bf16_to_f32(src[i]);                 \
        else                                                                                 \
            for (int64_t i = 0; i < n; i++) dst[i] = tl_f16_to_f32(src[i]);                  \
    }                                                                                        \
    static ATTR void tl_from_f32_##SFX(tl_dtype t, const float *src, int64_t n,              \
                                       uint16_t *dst) {                                      \
        if (t == TL_BF16)                                                                    \
            for (int64_t i = 0; i < n; i++) dst[i] = tl_f32_to_bf16(src[i]);                 \
        else                                                                                 \
            for (int64_t i = 0; i < n; i++) dst[i] = tl_f32_to_f16(src[i]);                  \
    }

TL_HALF_LOOPS(base, )

#if TL_SIMD_X86
TL_HALF_LOOPS(v3_loop, TL_TARGET_V3)

/* float16 through F16C (part of x86-64-v3): 8 values per instruction, the
 * same rounding as tl_f32_to_f16; the portable loop for the tail. */
static TL_TARGET_V3 void tl_to_f32_v3(tl_dtype t, const uint16_t *src, int64_t n, float *dst) {
    int64_t i = 0;
    if (t == TL_F16)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    tl_to_f32_v3_loop(t, src + i, n - i, dst + i);
}

static TL_TARGET_V3 void tl_from_f32_v3(tl_dtype t, const float *src, int64_t n, uint16_t *dst) {
    int64_t i = 0;
    if (t == TL_F16)
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(dst + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    tl_from_f32_v3_loop(t, src + i, n - i, dst + i);
}
#endif

void tl_half_row_to_f32(tl_simd level, tl_dtype t, const uint16_t *src, int64_t n, float *dst) {
#if TL_SIMD_X86
    if (level >= TL_SIMD_V3) {
        tl_to_f32_v3(t, src, n, dst);
        return;
    }
#endif
    (void)level;
    tl_to_f32_base(t, src, n, dst);
}

void tl_f32_row_to_half(tl_simd level, tl_dtype t, const float *src, int64_t n, uint16_t *dst) {
#if TL_SIMD_X86
    if (level >= TL_SIMD_V3) {
        tl_from_f32_v3(t, src, n, dst);
        return;
    }
#endif
    (void)level;
    tl_from_f32_base(t, src, n, dst);
}
