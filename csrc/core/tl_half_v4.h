/* bfloat16 and float16 to and from float, 16 values in one AVX-512 vector:
 * for the row conversions (tl_half.c) and the passes that convert in
 * registers (tl_norm.c).  Include only where TL_SIMD_X86 holds. */
#ifndef TL_HALF_V4_H
#define TL_HALF_V4_H

#include <immintrin.h>

#include "tl_conv.h"
#include "tl_simd.h"

/* 16 values per step with AVX-512: the same conversions as tl_half.c's
 * tl_to_f32_v3 and tl_from_f32_v3, bfloat16's rounding (tl_f32_to_bf16: ties to even, NaN
 * kept quiet, subnormals kept) in integer lanes, so results equal the
 * portable loop's bit for bit (AVX512_BF16's vcvtneps2bf16 flushes
 * subnormals, so it is not used).  The last 1 to 15 values take the same
 * step under a mask (the AVX2 and portable loops took them one at a time for
 * bfloat16: 4% of a bfloat16 C = 24 forward, in the outputs' rounding). */
static inline TL_TARGET_V4 __m512 tl_to_f32_16(tl_dtype t, __m256i h) {
    if (t == TL_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline TL_TARGET_V4 __m256i tl_from_f32_16(tl_dtype t, __m512 f) {
    if (t == TL_F16) return _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT);
    const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    const __m512i quiet = _mm512_set1_epi32(0x40);
    const __m512i u = _mm512_castps_si512(f);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i even = _mm512_add_epi32(half, _mm512_and_si512(hi, one));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, even), 16);
    r = _mm512_mask_or_epi32(r, nan, hi, quiet);
    return _mm512_cvtepi32_epi16(r);
}

#endif
