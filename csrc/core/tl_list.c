#include "tl_list.h"

#include <stdint.h>
#include <string.h>

#include "tl_simd.h"

/* The rows among t's rows [r0, r0 + live) (of k entries) that have an entry
 * in kernel row `lead`, a bit each from bit 0 (none where lead is -1): a
 * split listing's rows whose first entry is there (tl_list_tile_split). */
static inline unsigned tl_list_led(const int32_t *t, int64_t r0, int64_t live, int64_t k,
                                   int64_t lead) {
    unsigned led = 0;
    if (lead >= 0)
        for (int64_t i = 0; i < live; i++) led |= (unsigned)(t[(r0 + i) * k + lead] >= 0) << i;
    return led;
}

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
 * the rows seen so far (from the start, the rows with an entry in kernel row
 * `lead`) sends each row's first entry to the back of its kernel row's slot
 * instead, and the rows never seen to zr. */
static inline __attribute__((always_inline)) TL_TARGET_V4 uint32_t tl_list_v4_body(
    int split, const int32_t *nbr, int64_t o0, int64_t m, int64_t k, int64_t lo, int64_t hi,
    int64_t lead, int32_t *idx, int32_t *rows, int64_t *cnt, int64_t *fc, int32_t *zr,
    int64_t *nz) {
    const int32_t *t = nbr + o0 * k;
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i one = _mm512_set1_epi32(1), none = _mm512_set1_epi32(-1);
    const __m512i zero = _mm512_setzero_si512();
    __m512i most = zero;
    for (int64_t r0 = 0; r0 < m; r0 += 16) {
        const int64_t live = m - r0 < 16 ? m - r0 : 16;
        const __m512i rv = _mm512_add_epi32(lane, _mm512_set1_epi32((int32_t)r0));
        __mmask16 seen = split ? (__mmask16)tl_list_led(t, r0, live, k, lead) : 0;
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
                    const __mmask16 fst = n == lead ? here : (__mmask16)(here & ~seen);
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

/* The entry points of one instruction set's body: tl_list_ISA_columns (a
 * range of kernel rows) and tl_list_ISA_split (tl_list_tile_split). */
#define TL_LIST_ENTRIES(ISA, ATTR)                                                          \
    static ATTR uint32_t tl_list_##ISA##_columns(const int32_t *nbr, int64_t o0, int64_t m,  \
                                                 int64_t k, int64_t lo, int64_t hi,         \
                                                 int32_t *idx, int32_t *rows, int64_t *cnt) { \
        return tl_list_##ISA##_body(0, nbr, o0, m, k, lo, hi, -1, idx, rows, cnt, NULL, NULL, \
                                    NULL);                                                  \
    }                                                                                       \
    static ATTR uint32_t tl_list_##ISA##_split(const int32_t *nbr, int64_t o0, int64_t m,    \
                                               int64_t k, int64_t lead, int32_t *idx,       \
                                               int32_t *rows, int64_t *cnt, int64_t *fc,    \
                                               int32_t *zr, int64_t *nz) {                  \
        return tl_list_##ISA##_body(1, nbr, o0, m, k, 0, k, lead, idx, rows, cnt, fc, zr,   \
                                    nz);                                                    \
    }

TL_LIST_ENTRIES(v4, TL_TARGET_V4)

/* 8 rows at a time where the CPU has AVX2 but not AVX-512: as
 * tl_list_v4_body, with 8 x 8 transposes, and each compression a lane
 * permutation (AVX2 has no compress instruction) built from a 4-lane table
 * per half (tl_list_pack8); a list's entries are stored 8 at a time where
 * its slot has room past them (the extra lanes are overwritten later or
 * never read), else masked to the entries (tl_list_store8).  Against the
 * one-entry-at-a-time listing it replaced there, alone on the LiDAR scan's
 * 3x3x3 map (1024-row tiles): 14 ns a row instead of 45-48 (26-31 on the
 * surface's). */

/* For each 4-bit mask, the indices of its set bits, lowest first, a byte
 * each. */
static const uint32_t tl_list_pack4[16] = {
    0x00000000u, 0x00000000u, 0x00000001u, 0x00000100u, 0x00000002u, 0x00000200u,
    0x00000201u, 0x00020100u, 0x00000003u, 0x00000300u, 0x00000301u, 0x00030100u,
    0x00000302u, 0x00030200u, 0x00030201u, 0x03020100u};

/* The lanes of v that `keep` names, in order, at the front. */
static inline __attribute__((always_inline)) TL_TARGET_V3 __m256i tl_list_pack8(__m256i v,
                                                                                unsigned keep) {
    const unsigned lo = keep & 15u, hi = keep >> 4;
    const uint64_t perm =
        (uint64_t)tl_list_pack4[lo] |
        ((uint64_t)(tl_list_pack4[hi] + 0x04040404u) << (8 * __builtin_popcount(lo)));
    const __m256i lanes = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)perm));
    return _mm256_permutevar8x32_epi32(v, lanes);
}

/* The first `count` lanes of v to p, where `room` values from p may be
 * written: all 8 where they fit, else only `count` (a masked store, slow on
 * some cores). */
static inline __attribute__((always_inline)) TL_TARGET_V3 void tl_list_store8(int32_t *p,
                                                                              __m256i v,
                                                                              int count,
                                                                              int64_t room) {
    if (room >= 8) {
        _mm256_storeu_si256((__m256i *)(void *)p, v);
        return;
    }
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_maskstore_epi32(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(count), lane), v);
}

static inline __attribute__((always_inline)) TL_TARGET_V3 uint32_t tl_list_v3_body(
    int split, const int32_t *nbr, int64_t o0, int64_t m, int64_t k, int64_t lo, int64_t hi,
    int64_t lead, int32_t *idx, int32_t *rows, int64_t *cnt, int64_t *fc, int32_t *zr,
    int64_t *nz) {
    const int32_t *t = nbr + o0 * k;
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i one = _mm256_set1_epi32(1), none = _mm256_set1_epi32(-1);
    __m256i most = _mm256_setzero_si256();
    for (int64_t r0 = 0; r0 < m; r0 += 8) {
        const int64_t live = m - r0 < 8 ? m - r0 : 8;
        const __m256i rv = _mm256_add_epi32(lane, _mm256_set1_epi32((int32_t)r0));
        unsigned seen = split ? tl_list_led(t, r0, live, k, lead) : 0;
        /* 8 rows are k half lines: each kernel row asks for one, as many
         * rows ahead as the AVX-512 listing (a prefetch past the table does
         * not fault) */
        const uintptr_t ahead =
            (uintptr_t)t + (uintptr_t)((r0 + 8 * 2 * TL_LIST_STEPS_AHEAD) * k) * sizeof(int32_t);
        for (int64_t n0 = lo; n0 < hi; n0 += 8) {
            const int64_t nk = hi - n0 < 8 ? hi - n0 : 8;
            const __m256i cols = _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)nk), lane);
            __m256i v[8];
            /* Rows past the tile and columns past hi read as absent (-1);
             * nothing is read under a zero mask. */
            for (int i = 0; i < 8; i++) {
                const int32_t *src = t + (r0 + i) * k + n0;
                if (i >= live)
                    v[i] = none;
                else if (nk == 8)
                    v[i] = _mm256_loadu_si256((const __m256i *)(const void *)src);
                else
                    v[i] = _mm256_blendv_epi8(none, _mm256_maskload_epi32(src, cols), cols);
            }
            tl_transpose8_epi32(v);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                if (j >= nk) break;
                const int64_t n = n0 + j;
                __builtin_prefetch((const void *)(ahead + (uintptr_t)(n - lo) * 32));
                most = _mm256_max_epu32(most, _mm256_add_epi32(v[j], one));
                unsigned here = (unsigned)_mm256_movemask_ps(
                    _mm256_castsi256_ps(_mm256_cmpgt_epi32(v[j], none)));
                int64_t end = m; /* where the front of the slot must stop */
                if (split) {
                    const unsigned fst = n == lead ? here : here & ~seen;
                    if (fst) { /* into the back of the slot, above the entries there */
                        const int nf = __builtin_popcount(fst);
                        const int64_t f = fc[n] + nf;
                        tl_list_store8(idx + n * m + m - f, tl_list_pack8(v[j], fst), nf, 0);
                        tl_list_store8(rows + n * m + m - f, tl_list_pack8(rv, fst), nf, 0);
                        fc[n] = f;
                        seen |= here;
                        here &= ~fst;
                    }
                    end = m - fc[n];
                }
                const int pc = __builtin_popcount(here);
                const int64_t c = cnt[n];
                tl_list_store8(idx + n * m + c, tl_list_pack8(v[j], here), pc, end - c);
                tl_list_store8(rows + n * m + c, tl_list_pack8(rv, here), pc, end - c);
                cnt[n] = c + pc;
            }
        }
        for (int64_t j = hi - lo; j < k; j++) /* the step's other half lines */
            __builtin_prefetch((const void *)(ahead + (uintptr_t)j * 32));
        if (split) {
            const unsigned lonely = ~seen & ((1u << live) - 1u);
            const int nl = __builtin_popcount(lonely);
            tl_list_store8(zr + *nz, tl_list_pack8(rv, lonely), nl, m - *nz);
            *nz += nl;
        }
    }
    __m128i mx = _mm_max_epu32(_mm256_castsi256_si128(most), _mm256_extracti128_si256(most, 1));
    mx = _mm_max_epu32(mx, _mm_shuffle_epi32(mx, 0x4e));
    mx = _mm_max_epu32(mx, _mm_shuffle_epi32(mx, 0xb1));
    return (uint32_t)_mm_cvtsi128_si32(mx);
}

TL_LIST_ENTRIES(v3, TL_TARGET_V3)

#endif

/* Branch-free: whether an entry is present is close to random on sparse
 * scenes, so a branch would be mispredicted often (an absent entry is
 * written past the list's end and then overwritten).  Where `split`, each
 * row's first entry (in kernel row `lead` where it has one) goes to the back
 * of its kernel row's slot (descending) and the rows without any entry to
 * zr. */
static inline __attribute__((always_inline)) uint32_t tl_list_scalar_body(
    int split, const int32_t *nbr, int64_t o0, int64_t m, int64_t k, int64_t lo, int64_t hi,
    int64_t lead, int32_t *idx, int32_t *rows, int64_t *cnt, int64_t *fc, int32_t *zr,
    int64_t *nz) {
    uint32_t most = 0;
    for (int64_t r = 0; r < m; r++) {
        int seen = split ? (int)tl_list_led(nbr + o0 * k, r, 1, k, lead) : 0;
        for (int64_t n = lo; n < hi; n++) {
            const int32_t e = nbr[(o0 + r) * k + n];
            const uint32_t u = (uint32_t)e + 1u;
            most = u > most ? u : most;
            const int here = e >= 0, fst = split && here && (n == lead || !seen);
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

uint32_t tl_list_tile_split(int level, const int32_t *nbr, int64_t o0, int64_t m, int64_t k,
                            int64_t lead, int32_t *idx, int32_t *rows, int64_t *cnt, int64_t *fc,
                            int32_t *zr, int64_t *nz) {
    memset(cnt, 0, sizeof(int64_t) * (size_t)k);
    memset(fc, 0, sizeof(int64_t) * (size_t)k);
    *nz = 0;
#if TL_SIMD_X86
    if (level >= TL_SIMD_V4 && k >= TL_LIST_VEC_MIN_K)
        return tl_list_v4_split(nbr, o0, m, k, lead, idx, rows, cnt, fc, zr, nz);
    if (level >= TL_SIMD_V3 && k >= TL_LIST_VEC_MIN_K)
        return tl_list_v3_split(nbr, o0, m, k, lead, idx, rows, cnt, fc, zr, nz);
#else
    (void)level;
#endif
    return tl_list_scalar_body(1, nbr, o0, m, k, 0, k, lead, idx, rows, cnt, fc, zr, nz);
}

uint32_t tl_list_tile_range(int level, const int32_t *nbr, int64_t o0, int64_t m, int64_t k,
                            int64_t lo, int64_t hi, int32_t *idx, int32_t *rows, int64_t *cnt) {
    memset(cnt, 0, sizeof(int64_t) * (size_t)k);
#if TL_SIMD_X86
    if (level >= TL_SIMD_V4 && k >= TL_LIST_VEC_MIN_K)
        return tl_list_v4_columns(nbr, o0, m, k, lo, hi, idx, rows, cnt);
    if (level >= TL_SIMD_V3 && k >= TL_LIST_VEC_MIN_K)
        return tl_list_v3_columns(nbr, o0, m, k, lo, hi, idx, rows, cnt);
#else
    (void)level;
#endif
    return tl_list_scalar_body(0, nbr, o0, m, k, lo, hi, -1, idx, rows, cnt, NULL, NULL, NULL);
}

uint32_t tl_list_tile(int level, const int32_t *nbr, int64_t o0, int64_t m, int64_t k,
                      int32_t *idx, int32_t *rows, int64_t *cnt) {
    return tl_list_tile_range(level, nbr, o0, m, k, 0, k, idx, rows, cnt);
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

/* AVX2: 8 entries a step, the rest one by one (the scalar loop below stores
 * through lo and hi at every entry: 1.3% of a staged C = 64 float16 forward
 * on the Zen 1). */
static TL_TARGET_V3 void tl_list_span_v3(const int32_t *v, int64_t c, int64_t *lo, int64_t *hi) {
    __m256i a = _mm256_set1_epi32(INT32_MAX), b = _mm256_set1_epi32(-1);
    int64_t q = 0;
    for (; q + 8 <= c; q += 8) {
        const __m256i e = _mm256_loadu_si256((const __m256i *)(const void *)(v + q));
        a = _mm256_min_epi32(a, e);
        b = _mm256_max_epi32(b, e);
    }
    int32_t av[8], bv[8];
    _mm256_storeu_si256((__m256i *)(void *)av, a);
    _mm256_storeu_si256((__m256i *)(void *)bv, b);
    int64_t ra = *lo, rb = *hi;
    for (int t = 0; t < 8; t++) {
        ra = av[t] < ra ? av[t] : ra;
        rb = bv[t] > rb ? bv[t] : rb;
    }
    for (; q < c; q++) {
        ra = v[q] < ra ? v[q] : ra;
        rb = v[q] > rb ? v[q] : rb;
    }
    *lo = ra;
    *hi = rb;
}
#endif

void tl_list_span(int level, const int32_t *v, int64_t c, int64_t *lo, int64_t *hi) {
#if TL_SIMD_X86
    if (level >= TL_SIMD_V4) {
        if (c > 0) tl_list_span_v4(v, c, lo, hi);
        return;
    }
    if (level >= TL_SIMD_V3) {
        tl_list_span_v3(v, c, lo, hi);
        return;
    }
#else
    (void)level;
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

/* The same with AVX2, 4 rows a step (about 6% of a C = 16 forward on the
 * LiDAR scan went to the one-by-one loop). */
static TL_TARGET_V3 void tl_point_rows_v3(const int32_t *idx, const int32_t *rows, int64_t c,
                                          const void *x, int64_t x_bytes, char *xo, void *y,
                                          int64_t y_bytes, char *yo) {
    const __m256i xb = _mm256_set1_epi64x(x_bytes), yb = _mm256_set1_epi64x(y_bytes);
    const __m256i x0 = _mm256_set1_epi64x((int64_t)(uintptr_t)x);
    const __m256i y0 = _mm256_set1_epi64x((int64_t)(uintptr_t)y);
    int64_t q = 0;
    for (; q + 4 <= c; q += 4) {
        const __m128i i32 = _mm_loadu_si128((const __m128i *)(const void *)(idx + q));
        const __m128i r32 = _mm_loadu_si128((const __m128i *)(const void *)(rows + q));
        const __m256i i = _mm256_cvtepu32_epi64(i32), r = _mm256_cvtepu32_epi64(r32);
        _mm256_storeu_si256((__m256i *)(void *)(xo + q * 8),
                            _mm256_add_epi64(x0, _mm256_mul_epu32(i, xb)));
        _mm256_storeu_si256((__m256i *)(void *)(yo + q * 8),
                            _mm256_add_epi64(y0, _mm256_mul_epu32(r, yb)));
    }
    for (; q < c; q++) {
        const uintptr_t xp = (uintptr_t)x + (uintptr_t)((int64_t)idx[q] * x_bytes);
        const uintptr_t yp = (uintptr_t)y + (uintptr_t)((int64_t)rows[q] * y_bytes);
        memcpy(xo + q * 8, &xp, sizeof(xp));
        memcpy(yo + q * 8, &yp, sizeof(yp));
    }
}
#endif

void tl_point_rows(int level, const int32_t *idx, const int32_t *rows, int64_t c, const void *x,
                   int64_t x_bytes, void *xr, void *y, int64_t y_bytes, void *yr) {
#if TL_SIMD_X86
    if (level >= TL_SIMD_V3 && x_bytes <= (int64_t)UINT32_MAX && y_bytes <= (int64_t)UINT32_MAX) {
        (level >= TL_SIMD_V4 ? tl_point_rows_v4 : tl_point_rows_v3)(idx, rows, c, x, x_bytes, xr,
                                                                     y, y_bytes, yr);
        return;
    }
#else
    (void)level;
#endif
    /* A pointer-sized store that may alias the caller's pointer type. */
    typedef uintptr_t __attribute__((may_alias)) tl_any_ptr;
    tl_any_ptr *xo = xr, *yo = yr;
    for (int64_t q = 0; q < c; q++) {
        xo[q] = (uintptr_t)x + (uintptr_t)((int64_t)idx[q] * x_bytes);
        yo[q] = (uintptr_t)y + (uintptr_t)((int64_t)rows[q] * y_bytes);
    }
}
