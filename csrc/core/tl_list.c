#include "tl_list.h"

#include <string.h>

#include "tl_simd.h"

/* Bytes of the table asked for ahead of the vector listing. */
#define TL_LIST_AHEAD 1024
/* Smallest kernel volume listed by vectors: a step's lanes wrap past the end of
 * a row up to 16 / k times, each one a few instructions. */
#define TL_LIST_VEC_MIN_K 4

#if TL_SIMD_X86
#include <immintrin.h>

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

/* 16 entries a step, across row ends (k >= TL_LIST_VEC_MIN_K): compare with
 * 0, compress the present ones with their row and kernel row to the front of
 * a vector, and put them from a small buffer.  The table streams from memory
 * once per call, so it is asked for TL_LIST_AHEAD bytes ahead (1.2-1.4x at
 * C = 16). */
static TL_TARGET_V4 uint32_t tl_list_v4(const int32_t *nbr, int64_t o0, int64_t m, int64_t k,
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
    if (vec && k >= TL_LIST_VEC_MIN_K) return tl_list_v4(nbr, o0, m, k, idx, rows, cnt);
#else
    (void)vec;
#endif
    return tl_list_scalar(nbr, o0, m, k, idx, rows, cnt);
}
