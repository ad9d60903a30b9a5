#include "tl_list.h"

#include <stdint.h>
#include <string.h>

#include "tl_simd.h"

#if TL_SIMD_X86
#include "tl_transpose.h"

/* 16-row steps ahead that tl_list_v4_columns asks for the table. */
#define TL_LIST_STEPS_AHEAD 4
/* Smallest kernel volume listed by vectors: a step transposes 16 columns
 * whatever k is, so below this most of its work would be padding. */
#define TL_LIST_VEC_MIN_K 4

/* 16 rows at a time: each block of 16 kernel rows' entries of the 16 rows
 * loaded in order and transposed in registers, so each kernel row's 16
 * entries are one vector; the present ones compressed with their rows onto
 * the end of its list.  No branch depends on the map (a LiDAR scan has about
 * 5.6 of 27 entries present per row, close to random), and the table is read
 * in order.  Against the listings it replaced (each kernel row's column
 * gathered 16 entries at a time for k >= 16; rows read in order and the
 * present entries sorted one by one into the lists for k < 16): forward and
 * weight gradient 0.97-1.30x on the Intel Xeon of round fifteen, most at
 * C = 16 and on k2 s2 maps.  Where `split` (tl_list_tile_split), a mask of
 * the rows seen so far sends each row's first entry to the back of its
 * kernel row's slot instead, and the rows never seen to zr. */
static inline __attribute__((always_inline)) TL_TARGET_V4 uint32_t tl_list_v4_body(
    int split, const int32_t *nbr, int64_t o0, int64_t m, int64_t k, int64_t lo, int64_t hi,
    int32_t *idx, int32_t *rows, int64_t *cnt, int64_t *fc, int32_t *zr, int64_t *nz) {
    const int32_t *t = nbr + o0 * k;
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i one = _mm512_set1_epi32(1), none = _mm512_set1_epi32(-1);
    const __m512i zero = _mm512_setzero_si512();
    __m512i most = zero;
    for (int64_t r0 = 0; r0 < m; r0 += 16) {
        const int64_t live = m - r0 < 16 ? m - r0 : 16;
        const __m512i rv = _mm512_add_epi32(lane, _mm512_set1_epi32((int32_t)r0));
        __mmask16 seen = 0;
        /* 16 rows are k cache lines, asked for one per kernel row, steps
         * ahead (a prefetch past the table does not fault). */
        const uintptr_t ahead = (uintptr_t)t + (uintptr_t)((r0 + 16 * TL_LIST_STEPS_AHEAD) * k) *
                                                   sizeof(int32_t);
        for (int64_t n0 = lo; n0 < hi; n0 += 16) {
            const int64_t nk = hi - n0 < 16 ? hi - n0 : 16;
            const __mmask16 cols = nk == 16 ? (__mmask16)0xffff : (__mmask16)((1u << nk) - 1);
            __m512i v[16];
            /* Rows past the tile and columns past k read as absent (-1). */
            for (int i = 0; i < 16; i++) /* (nothing is read under a zero mask) */
                v[i] = _mm512_mask_loadu_epi32(none, i < live ? cols : 0,
                                               i < live ? t + (r0 + i) * k + n0 : t);
            tl_transpose16_epi32(v);
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++) {
                if (j >= nk) break;
                const int64_t n = n0 + j;
                __builtin_prefetch((const void *)(ahead + (uintptr_t)(n - lo) * 64));
                most = _mm512_max_epu32(most, _mm512_add_epi32(v[j], one));
                __mmask16 here = _mm512_cmpge_epi32_mask(v[j], zero);
                if (split) {
                    const __mmask16 fst = (__mmask16)(here & ~seen);
                    const int64_t f = fc[n] + __builtin_popcount(fst);
                    const __mmask16 low = (__mmask16)((1u << __builtin_popcount(fst)) - 1);
                    _mm512_mask_storeu_epi32(idx + n * m + m - f, low,
                                             _mm512_maskz_compress_epi32(fst, v[j]));
                    _mm512_mask_storeu_epi32(rows + n * m + m - f, low,
                                             _mm512_maskz_compress_epi32(fst, rv));
                    fc[n] = f;
                    seen = (__mmask16)(seen | here);
                    here = (__mmask16)(here & ~fst);
                }
                const __mmask16 first = (__mmask16)((1u << __builtin_popcount(here)) - 1);
                const int64_t c = cnt[n];
                _mm512_mask_storeu_epi32(idx + n * m + c, first,
                                         _mm512_maskz_compress_epi32(here, v[j]));
                _mm512_mask_storeu_epi32(rows + n * m + c, first,
                                         _mm512_maskz_compress_epi32(here, rv));
                cnt[n] = c + __builtin_popcount(here);
            }
        }
        for (int64_t j = hi - lo; j < k; j++) /* the step's other lines (a range of columns) */
            __builtin_prefetch((const void *)(ahead + (uintptr_t)j * 64));
        if (split) {
            const __mmask16 lonely =
                (__mmask16)(~seen & (live == 16 ? 0xffffu : (1u << live) - 1u));
            _mm512_mask_storeu_epi32(zr + *nz, (__mmask16)((1u << __builtin_popcount(lonely)) - 1),
                                     _mm512_maskz_compress_epi32(lonely, rv));
            *nz += __builtin_popcount(lonely);
        }
    }
    return _mm512_reduce_max_epu32(most);
}

static TL_TARGET_V4 uint32_t tl_list_v4_columns(const int32_t *nbr, int64_t o0, int64_t m,
                                                int64_t k, int64_t lo, int64_t hi, int32_t *idx,
                                                int32_t *rows, int64_t *cnt) {
    return tl_list_v4_body(0, nbr, o0, m, k, lo, hi, idx, rows, cnt, NULL, NULL, NULL);
}

static TL_TARGET_V4 uint32_t tl_list_v4_split(const int32_t *nbr, int64_t o0, int64_t m,
                                              int64_t k, int32_t *idx, int32_t *rows,
                                              int64_t *cnt, int64_t *fc, int32_t *zr,
                                              int64_t *nz) {
    return tl_list_v4_body(1, nbr, o0, m, k, 0, k, idx, rows, cnt, fc, zr, nz);
}

#endif

/* Branch-free: whether an entry is present is close to random on sparse
 * scenes, so a branch would be mispredicted often (an absent entry is
 * written past the list's end and then overwritten).  Where `split`, each
 * row's first entry goes to the back of its kernel row's slot (descending)
 * and the rows without any entry to zr. */
static inline __attribute__((always_inline)) uint32_t tl_list_scalar_body(
    int split, const int32_t *nbr, int64_t o0, int64_t m, int64_t k, int64_t lo, int64_t hi,
    int32_t *idx, int32_t *rows, int64_t *cnt, int64_t *fc, int32_t *zr, int64_t *nz) {
    uint32_t most = 0;
    for (int64_t r = 0; r < m; r++) {
        int seen = 0;
        for (int64_t n = lo; n < hi; n++) {
            const int32_t e = nbr[(o0 + r) * k + n];
            const uint32_t u = (uint32_t)e + 1u;
            most = u > most ? u : most;
            const int here = e >= 0, fst = split && here && !seen;
            /* rows before r filled at most r of the slot's m places, so the
             * absent entry's write lands between the two lists */
            const int64_t at = fst ? n * m + m - 1 - fc[n] : n * m + cnt[n];
            idx[at] = e;
            rows[at] = (int32_t)r;
            cnt[n] += here && !fst;
            if (split) fc[n] += fst;
            seen |= here;
        }
        if (split && !seen) zr[(*nz)++] = (int32_t)r;
    }
    return most;
}

uint32_t tl_list_tile_split(int vec, const int32_t *nbr, int64_t o0, int64_t m, int64_t k,
                            int32_t *idx, int32_t *rows, int64_t *cnt, int64_t *fc, int32_t *zr,
                            int64_t *nz) {
    memset(cnt, 0, sizeof(int64_t) * (size_t)k);
    memset(fc, 0, sizeof(int64_t) * (size_t)k);
    *nz = 0;
#if TL_SIMD_X86
    if (vec && k >= TL_LIST_VEC_MIN_K)
        return tl_list_v4_split(nbr, o0, m, k, idx, rows, cnt, fc, zr, nz);
#else
    (void)vec;
#endif
    return tl_list_scalar_body(1, nbr, o0, m, k, 0, k, idx, rows, cnt, fc, zr, nz);
}

uint32_t tl_list_tile_range(int vec, const int32_t *nbr, int64_t o0, int64_t m, int64_t k,
                            int64_t lo, int64_t hi, int32_t *idx, int32_t *rows, int64_t *cnt) {
    memset(cnt, 0, sizeof(int64_t) * (size_t)k);
#if TL_SIMD_X86
    if (vec && k >= TL_LIST_VEC_MIN_K)
        return tl_list_v4_columns(nbr, o0, m, k, lo, hi, idx, rows, cnt);
#else
    (void)vec;
#endif
    return tl_list_scalar_body(0, nbr, o0, m, k, lo, hi, idx, rows, cnt, NULL, NULL, NULL);
}

uint32_t tl_list_tile(int vec, const int32_t *nbr, int64_t o0, int64_t m, int64_t k,
                      int32_t *idx, int32_t *rows, int64_t *cnt) {
    return tl_list_tile_range(vec, nbr, o0, m, k, 0, k, idx, rows, cnt);
}

#if TL_SIMD_X86
static TL_TARGET_V4 void tl_list_span_v4(const int32_t *v, int64_t c, int64_t *lo, int64_t *hi) {
    __m512i a = _mm512_set1_epi32(INT32_MAX), b = _mm512_set1_epi32(-1);
    for (int64_t q = 0; q < c; q += 16) {
        const __mmask16 live = c - q >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (c - q)) - 1);
        a = _mm512_mask_min_epi32(a, live, a, _mm512_maskz_loadu_epi32(live, v + q));
        b = _mm512_mask_max_epi32(b, live, b, _mm512_maskz_loadu_epi32(live, v + q));
    }
    const int64_t ra = _mm512_reduce_min_epi32(a), rb = _mm512_reduce_max_epi32(b);
    *lo = ra < *lo ? ra : *lo;
    *hi = rb > *hi ? rb : *hi;
}
#endif

void tl_list_span(int vec, const int32_t *v, int64_t c, int64_t *lo, int64_t *hi) {
#if TL_SIMD_X86
    if (vec) {
        if (c > 0) tl_list_span_v4(v, c, lo, hi);
        return;
    }
#else
    (void)vec;
#endif
    for (int64_t t = 0; t < c; t++) {
        *lo = v[t] < *lo ? v[t] : *lo;
        *hi = v[t] > *hi ? v[t] : *hi;
    }
}

#if TL_SIMD_X86
/* An index widened to 64 bits times the row stride (one unsigned 32 x 32 ->
 * 64-bit multiply) plus the base, 8 rows a step.  Per row the plain loop
 * spent a load, a multiply, an add and a store on each pointer: about 14% of
 * a C = 16 forward's time. */
static TL_TARGET_V4 void tl_point_rows_v4(const int32_t *idx, const int32_t *rows, int64_t c,
                                          const void *x, int64_t x_bytes, char *xo, void *y,
                                          int64_t y_bytes, char *yo) {
    const __m512i xb = _mm512_set1_epi64(x_bytes), yb = _mm512_set1_epi64(y_bytes);
    const __m512i x0 = _mm512_set1_epi64((int64_t)(uintptr_t)x);
    const __m512i y0 = _mm512_set1_epi64((int64_t)(uintptr_t)y);
    for (int64_t q = 0; q < c; q += 8) {
        const __mmask8 live = c - q >= 8 ? (__mmask8)0xff : (__mmask8)((1u << (c - q)) - 1);
        const __m512i i = _mm512_cvtepu32_epi64(_mm256_maskz_loadu_epi32(live, idx + q));
        const __m512i r = _mm512_cvtepu32_epi64(_mm256_maskz_loadu_epi32(live, rows + q));
        _mm512_mask_storeu_epi64(xo + q * 8, live, _mm512_add_epi64(x0, _mm512_mul_epu32(i, xb)));
        _mm512_mask_storeu_epi64(yo + q * 8, live, _mm512_add_epi64(y0, _mm512_mul_epu32(r, yb)));
    }
}
#endif

void tl_point_rows(int vec, const int32_t *idx, const int32_t *rows, int64_t c, const void *x,
                   int64_t x_bytes, void *xr, void *y, int64_t y_bytes, void *yr) {
#if TL_SIMD_X86
    if (vec && x_bytes <= (int64_t)UINT32_MAX && y_bytes <= (int64_t)UINT32_MAX) {
        tl_point_rows_v4(idx, rows, c, x, x_bytes, xr, y, y_bytes, yr);
        return;
    }
#else
    (void)vec;
#endif
    /* A pointer-sized store that may alias the caller's pointer type. */
    typedef uintptr_t __attribute__((may_alias)) tl_any_ptr;
    tl_any_ptr *xo = xr, *yo = yr;
    for (int64_t q = 0; q < c; q++) {
        xo[q] = (uintptr_t)x + (uintptr_t)((int64_t)idx[q] * x_bytes);
        yo[q] = (uintptr_t)y + (uintptr_t)((int64_t)rows[q] * y_bytes);
    }
}
