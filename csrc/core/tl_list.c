#include "tl_list.h"

#include <string.h>

#include "tl_simd.h"

#if TL_SIMD_X86
#include <immintrin.h>

/* Rows of the table one chunk of the gathered listing covers: 64 rows of
 * k = 27 entries are 7 KB, so the k passes over them (one per kernel row)
 * read from L1. */
#define TL_LIST_CHUNK 64
/* Largest k whose 16 gather offsets (l * k entries) fit int32. */
#define TL_LIST_GATHER_MAX_K (INT32_MAX / 16)
/* Smallest k listed by gathers: at k = 8 they gained 1.10-1.13x on a k2 s2
 * Conv3d's map and lost 0.89-0.94x on its inverse's (C = 16, 2 threads); at
 * k = 27 1.03-1.26x on every map. */
#define TL_LIST_GATHER_MIN_K 16
/* Bytes of the table asked for ahead of the row-major listing. */
#define TL_LIST_AHEAD 1024
/* Smallest kernel volume listed by vectors: a row-major step's lanes wrap
 * past the end of a row up to 16 / k times, each one a few instructions. */
#define TL_LIST_VEC_MIN_K 4

/* Wide tables (k >= TL_LIST_GATHER_MIN_K), kernel row by kernel row within
 * chunks of TL_LIST_CHUNK rows: 16 rows' entries of one kernel row in one
 * gather (a column of the chunk, in L1), the present ones compressed with
 * their rows and stored at the end of the kernel row's list.  Every step has
 * the same shape, so no branch depends on the data, where the row-major
 * listing (tl_list_v4_rows) mispredicts its per-entry loop on sparse 3x3x3
 * maps (this costs about half as much per entry there).  The next chunk's
 * rows are asked for while this one is listed. */
static TL_TARGET_V4 uint32_t tl_list_v4_gather(const int32_t *nbr, int64_t o0, int64_t m,
                                               int64_t k, int32_t *idx, int32_t *rows,
                                               int64_t *cnt) {
    const int32_t *t = nbr + o0 * k;
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i one = _mm512_set1_epi32(1), zero = _mm512_setzero_si512();
    const __m512i at = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int32_t)k));
    const int64_t lines = (TL_LIST_CHUNK * k * (int64_t)sizeof(int32_t) + 63) / 64;
    __m512i most = zero;
    for (int64_t r0 = 0; r0 < m; r0 += TL_LIST_CHUNK) {
        const int64_t r1 = r0 + TL_LIST_CHUNK < m ? r0 + TL_LIST_CHUNK : m;
        const char *next = (const char *)(t + r1 * k);
        const int64_t ahead = r1 < m ? lines : 0;
        for (int64_t n = 0; n < k; n++) {
            /* The next chunk's lines, spread over this chunk's kernel rows;
             * a prefetch past the table does not fault. */
            for (int64_t l = n * ahead / k; l < (n + 1) * ahead / k; l++)
                __builtin_prefetch(next + l * 64);
            int32_t *li = idx + n * m, *lr = rows + n * m;
            int64_t c = cnt[n];
            for (int64_t r = r0; r < r1; r += 16) {
                const __mmask16 live =
                    r1 - r >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (r1 - r)) - 1);
                const __m512i v =
                    _mm512_mask_i32gather_epi32(zero, live, at, (const void *)(t + r * k + n), 4);
                most = _mm512_mask_max_epu32(most, live, most, _mm512_add_epi32(v, one));
                const __mmask16 here = _mm512_mask_cmpge_epi32_mask(live, v, zero);
                const __mmask16 first = (__mmask16)((1u << __builtin_popcount(here)) - 1);
                _mm512_mask_storeu_epi32(li + c, first, _mm512_maskz_compress_epi32(here, v));
                const __m512i rv = _mm512_add_epi32(lane, _mm512_set1_epi32((int32_t)r));
                _mm512_mask_storeu_epi32(lr + c, first, _mm512_maskz_compress_epi32(here, rv));
                c += __builtin_popcount(here);
            }
            cnt[n] = c;
        }
    }
    return _mm512_reduce_max_epu32(most);
}

/* Lanes whose kernel row *nv reached k start the next row: kernel row - k,
 * row + 1 (as often as it takes; at most 16 / k times). */
static inline __attribute__((always_inline)) TL_TARGET_V4 void tl_list_wrap(__m512i *nv,
                                                                            __m512i *rv,
                                                                            __m512i kk) {
    const __m512i one = _mm512_set1_epi32(1);
    for (__mmask16 over; (over = _mm512_cmpge_epi32_mask(*nv, kk));) {
        *nv = _mm512_mask_sub_epi32(*nv, over, *nv, kk);
        *rv = _mm512_mask_add_epi32(*rv, over, *rv, one);
    }
}

/* Narrow tables (TL_LIST_VEC_MIN_K <= k < TL_LIST_GATHER_MIN_K): 16 entries a
 * step, across row ends: compare with 0, compress the present ones with their
 * row and kernel row to the front of a vector, and put them from a small
 * buffer.  The table streams from memory once per call, so it is asked for
 * TL_LIST_AHEAD bytes ahead (1.2-1.4x at C = 16).  The per-entry loop's trip
 * count is the step's present entries: well predicted where every row has
 * the same number (an inverse transpose's map has one of 8), mispredicted
 * often on sparse 3x3x3 maps, which tl_list_v4_gather serves. */
static TL_TARGET_V4 uint32_t tl_list_v4_rows(const int32_t *nbr, int64_t o0, int64_t m, int64_t k,
                                        int32_t *idx, int32_t *rows, int64_t *cnt) {
    const int32_t *t = nbr + o0 * k;
    const int64_t all = m * k;
    const __m512i one = _mm512_set1_epi32(1), zero = _mm512_setzero_si512();
    const __m512i kk = _mm512_set1_epi32((int32_t)k), step = _mm512_set1_epi32(16);
    /* Lane l of the step at p: entry p + l, of row (p + l) / k, kernel row
     * (p + l) % k, carried from step to step without a division. */
    __m512i nv = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i rv = zero;
    tl_list_wrap(&nv, &rv, kk);
    __m512i most = zero;
    int32_t be[16], br[16], bn[16];
    for (int64_t p = 0; p < all; p += 16) {
        const __mmask16 live = all - p >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (all - p)) - 1);
        /* An address past the table is never read (a prefetch does not fault). */
        __builtin_prefetch((const void *)((uintptr_t)(t + p) + TL_LIST_AHEAD));
        const __m512i v = _mm512_maskz_loadu_epi32(live, t + p);
        most = _mm512_mask_max_epu32(most, live, most, _mm512_add_epi32(v, one));
        const __mmask16 here = _mm512_mask_cmpge_epi32_mask(live, v, zero);
        if (here) {
            _mm512_storeu_si512((void *)be, _mm512_maskz_compress_epi32(here, v));
            _mm512_storeu_si512((void *)br, _mm512_maskz_compress_epi32(here, rv));
            _mm512_storeu_si512((void *)bn, _mm512_maskz_compress_epi32(here, nv));
            const int c = __builtin_popcount((unsigned)here);
            for (int q = 0; q < c; q++) { /* to the end of its kernel row's list */
                const int64_t at = bn[q] * m + cnt[bn[q]]++;
                idx[at] = be[q];
                rows[at] = br[q];
            }
        }
        nv = _mm512_add_epi32(nv, step);
        tl_list_wrap(&nv, &rv, kk);
    }
    return _mm512_reduce_max_epu32(most);
}
#endif

/* Branch-free: whether an entry is present is close to random on sparse
 * scenes, so a branch would be mispredicted often (an absent entry is
 * written past the list's end and then overwritten). */
static uint32_t tl_list_scalar(const int32_t *nbr, int64_t o0, int64_t m, int64_t k,
                               int32_t *idx, int32_t *rows, int64_t *cnt) {
    uint32_t most = 0;
    for (int64_t r = 0; r < m; r++)
        for (int64_t n = 0; n < k; n++) {
            const int32_t e = nbr[(o0 + r) * k + n];
            const uint32_t u = (uint32_t)e + 1u;
            most = u > most ? u : most;
            const int64_t at = n * m + cnt[n];
            idx[at] = e;
            rows[at] = (int32_t)r;
            cnt[n] += e >= 0;
        }
    return most;
}

uint32_t tl_list_tile(int vec, const int32_t *nbr, int64_t o0, int64_t m, int64_t k,
                      int32_t *idx, int32_t *rows, int64_t *cnt) {
    memset(cnt, 0, sizeof(int64_t) * (size_t)k);
#if TL_SIMD_X86
    if (vec && k >= TL_LIST_GATHER_MIN_K && k <= TL_LIST_GATHER_MAX_K)
        return tl_list_v4_gather(nbr, o0, m, k, idx, rows, cnt);
    if (vec && k >= TL_LIST_VEC_MIN_K) return tl_list_v4_rows(nbr, o0, m, k, idx, rows, cnt);
#else
    (void)vec;
#endif
    return tl_list_scalar(nbr, o0, m, k, idx, rows, cnt);
}
