/* A 16 x 16 transpose of 32-bit lanes in AVX-512 registers, shared by the
 * tile listing (tl_list.c: entries of 16 rows by kernel row) and the AMX
 * weight gradient (tl_microkernel_amx.c: x units by channel); and an 8 x 8
 * one in AVX2 registers (the listing without AVX-512).  x86 only. */
#ifndef TL_TRANSPOSE_H
#define TL_TRANSPOSE_H

#include <immintrin.h>

#include "tl_simd.h"

/* r[i] lane j -> r[j] lane i: pairs of rows interleaved by 32 bits, then by
 * 64, then 128-bit lanes exchanged twice (64 shuffles for 256 values). */
static inline __attribute__((always_inline)) TL_TARGET_V4 void tl_transpose16_epi32(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* r[4g + c], 128-bit lane l: rows 4g..4g+3 of column 4l + c */
    for (int g = 0; g < 16; g += 4) {
        r[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
        r[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        r[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
        r[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    /* column 4l + c, lane g = r[4g + c] lane l: a 4 x 4 transpose of lanes */
    for (int c = 0; c < 4; c++) {
        const __m512i p0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);
        const __m512i p1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);
        const __m512i q0 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
        const __m512i q1 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
        t[c] = _mm512_shuffle_i32x4(p0, q0, 0x88);
        t[4 + c] = _mm512_shuffle_i32x4(p1, q1, 0x88);
        t[8 + c] = _mm512_shuffle_i32x4(p0, q0, 0xdd);
        t[12 + c] = _mm512_shuffle_i32x4(p1, q1, 0xdd);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* The same for 8 x 8 in AVX2 registers (24 shuffles for 64 values). */
static inline __attribute__((always_inline)) TL_TARGET_V3 void tl_transpose8_epi32(__m256i r[8]) {
    __m256i t[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* r[4g + c], 128-bit lane l: rows 4g..4g+3 of column 4l + c */
    for (int g = 0; g < 8; g += 4) {
        r[g] = _mm256_unpacklo_epi64(t[g], t[g + 2]);
        r[g + 1] = _mm256_unpackhi_epi64(t[g], t[g + 2]);
        r[g + 2] = _mm256_unpacklo_epi64(t[g + 1], t[g + 3]);
        r[g + 3] = _mm256_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    for (int c = 0; c < 4; c++) {
        t[c] = _mm256_permute2x128_si256(r[c], r[4 + c], 0x20);
        t[4 + c] = _mm256_permute2x128_si256(r[c], r[4 + c], 0x31);
    }
    for (int i = 0; i < 8; i++) r[i] = t[i];
}

#endif
