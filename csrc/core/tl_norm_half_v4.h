/* Batch normalization's passes with no sums (normalize, the input gradient)
 * over bfloat16 or float16 rows with AVX-512, converted in registers: each
 * row's values are read, computed and written in one loop, as float32's
 * are, where widening blocks of rows into float first (tl_norm.c) reads,
 * computes and writes a block at a time.  The operations are the float
 * loops' (tl_norm_impl.h, as GCC contracts them: the same multiply-adds), so
 * the values and their rounding are the same bit for bit.  tl_norm.c
 * includes this where TL_SIMD_X86 holds. */
#ifndef TL_NORM_HALF_V4_H
#define TL_NORM_HALF_V4_H

#include "tl_half_v4.h"

/* The lanes of channels [j, c) of a row, at most 16. */
static inline TL_TARGET_V4 __mmask16 tl_norm_lanes(int64_t j, int64_t c) {
    return c - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (c - j)) - 1u);
}

static inline TL_TARGET_V4 __m512 tl_norm_load_half(tl_dtype t, __mmask16 m, const uint16_t *p) {
    return tl_to_f32_16(t, _mm256_maskz_loadu_epi16(m, p));
}

/* y = x * scale + shift per channel, then max(., 0) where relu (NaN stays
 * NaN, -0 stays -0: the float loop's select). */
static TL_TARGET_V4 void tl_norm_apply_half_v4(tl_dtype t, const uint16_t *x, int64_t rows,
                                               int64_t c, const float *scale,
                                               const float *shift, int relu, uint16_t *y) {
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < c; j += 16) {
            const __mmask16 m = tl_norm_lanes(j, c);
            __m512 v = _mm512_fmadd_ps(tl_norm_load_half(t, m, x + r * c + j),
                                       _mm512_maskz_loadu_ps(m, scale + j),
                                       _mm512_maskz_loadu_ps(m, shift + j));
            if (relu) v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, zero, _CMP_NLT_UQ), v);
            _mm256_mask_storeu_epi16(y + r * c + j, m, tl_from_f32_16(t, v));
        }
}

/* dx = g * a + x * b + k per channel, g cut to 0 where relu and the
 * pre-activation x * scale + shift is not positive; b and k NULL (eval):
 * dx = g * a.  Contracted as the float loop is: fma(g, a, x * b) + k. */
static TL_TARGET_V4 void tl_norm_bapply_half_v4(tl_dtype t, const uint16_t *g, const uint16_t *x,
                                                int64_t rows, int64_t c, const float *scale,
                                                const float *shift, int relu, const float *a,
                                                const float *b, const float *k, uint16_t *dx) {
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < c; j += 16) {
            const __mmask16 m = tl_norm_lanes(j, c);
            const int64_t at = r * c + j;
            __m512 gv = tl_norm_load_half(t, m, g + at);
            const __m512 xv = tl_norm_load_half(t, m, x + at);
            if (relu) {
                const __m512 pre = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(m, scale + j),
                                                   _mm512_maskz_loadu_ps(m, shift + j));
                gv = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(pre, zero, _CMP_GT_OQ), gv);
            }
            const __m512 av = _mm512_maskz_loadu_ps(m, a + j);
            __m512 d;
            if (b) {
                const __m512 xb = _mm512_mul_ps(xv, _mm512_maskz_loadu_ps(m, b + j));
                d = _mm512_add_ps(_mm512_fmadd_ps(gv, av, xb), _mm512_maskz_loadu_ps(m, k + j));
            } else {
                d = _mm512_mul_ps(gv, av);
            }
            _mm256_mask_storeu_epi16(dx + at, m, tl_from_f32_16(t, d));
        }
}

#endif
