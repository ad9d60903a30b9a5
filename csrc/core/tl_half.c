#include "tl_half.h"

#if TL_SIMD_X86
#include <immintrin.h>

#include "tl_half_v4.h"
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
 * same rounding as tl_f32_to_f16; bfloat16 by a shift (its 16 bits above 16
 * zero bits); the portable loop for the tail. */
static inline TL_TARGET_V3 void tl_to_f32_v3(tl_dtype t, const uint16_t *src, int64_t n,
                                             float *dst) {
    int64_t i = 0;
    if (t == TL_F16)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    else
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_si256(
                (__m256i *)(dst + i),
                _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i))),
                                  16));
    if (i < n) tl_to_f32_v3_loop(t, src + i, n - i, dst + i);
}

/* Gathered rows ahead of the one converted that tl_half_rows_to_f32 asks for. */
#define TL_HALF_AHEAD 8

static TL_TARGET_V3 void tl_from_f32_v3(tl_dtype t, const float *src, int64_t n, uint16_t *dst) {
    int64_t i = 0;
    if (t == TL_F16)
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(dst + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    tl_from_f32_v3_loop(t, src + i, n - i, dst + i);
}

static TL_TARGET_V4 void tl_to_f32_v4(tl_dtype t, const uint16_t *src, int64_t n, float *dst) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, tl_to_f32_16(t, _mm256_loadu_si256((const __m256i *)(src + i))));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(dst + i, m, tl_to_f32_16(t, _mm256_maskz_loadu_epi16(m, src + i)));
    }
}

static TL_TARGET_V4 void tl_from_f32_v4(tl_dtype t, const float *src, int64_t n, uint16_t *dst) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), tl_from_f32_16(t, _mm512_loadu_ps(src + i)));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm256_mask_storeu_epi16(dst + i, m, tl_from_f32_16(t, _mm512_maskz_loadu_ps(m, src + i)));
    }
}
#endif

void tl_half_row_to_f32(tl_simd level, tl_dtype t, const uint16_t *src, int64_t n, float *dst) {
#if TL_SIMD_X86
    if (level >= TL_SIMD_V4) {
        tl_to_f32_v4(t, src, n, dst);
        return;
    }
    if (level >= TL_SIMD_V3) {
        tl_to_f32_v3(t, src, n, dst);
        return;
    }
#endif
    (void)level;
    tl_to_f32_base(t, src, n, dst);
}

/* The gathered rows one after another, ld floats apart, each asked for
 * TL_HALF_AHEAD rows before it is converted, so the misses of several rows
 * overlap (one call per listed kernel row, not per x row). */
#if TL_SIMD_X86
#define TL_ROWS_TO_F32(ISA, ATTR)                                                           \
    static ATTR void tl_rows_to_f32_##ISA(tl_dtype t, const uint16_t *const *rows,          \
                                          int64_t count, int64_t n, int64_t ld, float *dst) { \
        const int64_t bytes = n * (int64_t)sizeof(uint16_t);                                \
        TL_PREFETCH_ROWS(rows, count < TL_HALF_AHEAD ? count : TL_HALF_AHEAD, bytes);       \
        for (int64_t r = 0; r < count; r++) {                                               \
            if (r + TL_HALF_AHEAD < count) TL_PREFETCH_ROWS(rows + r + TL_HALF_AHEAD, 1, bytes); \
            tl_to_f32_##ISA(t, rows[r], n, dst + r * ld);                                   \
            for (int64_t i = n; i < ld; i++) dst[r * ld + i] = 0;                           \
        }                                                                                   \
    }
TL_ROWS_TO_F32(v4, TL_TARGET_V4)
TL_ROWS_TO_F32(v3, TL_TARGET_V3)
#undef TL_ROWS_TO_F32
#endif

void tl_half_rows_to_f32(tl_simd level, tl_dtype t, const uint16_t *const *rows, int64_t count,
                         int64_t n, int64_t ld, float *dst) {
#if TL_SIMD_X86
    if (level >= TL_SIMD_V4) {
        tl_rows_to_f32_v4(t, rows, count, n, ld, dst);
        return;
    }
    if (level >= TL_SIMD_V3) {
        tl_rows_to_f32_v3(t, rows, count, n, ld, dst);
        return;
    }
#endif
    (void)level;
    for (int64_t r = 0; r < count; r++) {
        tl_to_f32_base(t, rows[r], n, dst + r * ld);
        for (int64_t i = n; i < ld; i++) dst[r * ld + i] = 0;
    }
}

void tl_f32_row_to_half(tl_simd level, tl_dtype t, const float *src, int64_t n, uint16_t *dst) {
#if TL_SIMD_X86
    if (level >= TL_SIMD_V4) {
        tl_from_f32_v4(t, src, n, dst);
        return;
    }
    if (level >= TL_SIMD_V3) {
        tl_from_f32_v3(t, src, n, dst);
        return;
    }
#endif
    (void)level;
    tl_from_f32_base(t, src, n, dst);
}
