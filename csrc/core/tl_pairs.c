#include "tl_pairs.h"

#include <stdint.h>

#include "tl_coords.h"
#include "tl_simd.h"

tl_status tl_pairs_count(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out, int64_t k,
                         int64_t *offsets) {
    if (!ctx || n_out < 0 || k < 1 || (n_out && !nbr) || !offsets) return TL_ERR_INVALID;
    tl_status st = tl_table_check(n_out, k);
    if (st != TL_OK) return st;
    offsets[0] = 0;
    /* Only -1 means "no neighbour": any other negative entry is a malformed table,
     * refused here (in the counting pass, at no extra read) rather than dropped. */
    int bad = 0;
#pragma omp parallel for num_threads(tl_threads_for(ctx, n_out * k)) schedule(static) \
    reduction(| : bad)
    for (int64_t n = 0; n < k; n++) {
        int64_t c = 0;
        for (int64_t o = 0; o < n_out; o++) {
            const int32_t i = nbr[o * k + n];
            c += i >= 0;
            bad |= i < -1;
        }
        offsets[n + 1] = c;
    }
    if (bad) return TL_ERR_INVALID;
    for (int64_t n = 0; n < k; n++) offsets[n + 1] += offsets[n];
    return TL_OK;
}

tl_status tl_pairs_fill(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out, int64_t k,
                        const int64_t *offsets, int32_t *in, int32_t *out) {
    if (!ctx || n_out < 0 || k < 1 || (n_out && !nbr) || !offsets) return TL_ERR_INVALID;
    tl_status st = tl_table_check(n_out, k);
    if (st != TL_OK) return st;
    if (offsets[k] && (!in || !out)) return TL_ERR_INVALID;
    /* Offsets not forming a CSR (offsets[0] = 0, non-decreasing) would send
     * the writes below outside [0, offsets[k]). */
    if (offsets[0] != 0) return TL_ERR_INVALID;
    for (int64_t n = 0; n < k; n++)
        if (offsets[n + 1] < offsets[n]) return TL_ERR_INVALID;
    int bad = 0;
#pragma omp parallel for num_threads(tl_threads_for(ctx, n_out * k)) schedule(static) \
    reduction(| : bad)
    for (int64_t n = 0; n < k; n++) {
        int64_t j = offsets[n];
        for (int64_t o = 0; o < n_out; o++) {
            int32_t i = nbr[o * k + n];
            if (i < 0) continue;
            if (j >= offsets[n + 1]) {
                bad = 1;
                break;
            }
            in[j] = i;
            out[j++] = (int32_t)o;
        }
        bad |= j != offsets[n + 1];
    }
    return bad ? TL_ERR_INVALID : TL_OK;
}

/* Whether kernel row run [0, c) of pairs is bad: an input outside [0, n_in)
 * or an output outside [0, n_out) (both compared unsigned, so negatives are
 * out), or an output not above the one before it.  Written without a carried
 * `prev`, so the compiler vectorizes it (compiled again for AVX-512 and for
 * AVX2 below): the scalar loop took 13% of a C = 16 fetch-on-demand forward
 * on the LiDAR scan. */
static inline __attribute__((always_inline)) int tl_pairs_bad_body(const int32_t *in,
                                                                   const int32_t *out, int64_t c,
                                                                   uint32_t n_in, uint32_t n_out) {
    if (c == 0) return 0;
    int bad = (uint32_t)in[0] >= n_in || (uint32_t)out[0] >= n_out;
    for (int64_t j = 1; j < c; j++)
        bad |= ((uint32_t)in[j] >= n_in) | ((uint32_t)out[j] >= n_out) | (out[j] <= out[j - 1]);
    return bad;
}

static int tl_pairs_bad(const int32_t *in, const int32_t *out, int64_t c, uint32_t n_in,
                        uint32_t n_out) {
    return tl_pairs_bad_body(in, out, c, n_in, n_out);
}

#if TL_SIMD_X86
static TL_TARGET_V4 int tl_pairs_bad_v4(const int32_t *in, const int32_t *out, int64_t c,
                                        uint32_t n_in, uint32_t n_out) {
    return tl_pairs_bad_body(in, out, c, n_in, n_out);
}

static TL_TARGET_V3 int tl_pairs_bad_v3(const int32_t *in, const int32_t *out, int64_t c,
                                        uint32_t n_in, uint32_t n_out) {
    return tl_pairs_bad_body(in, out, c, n_in, n_out);
}
#endif

tl_status tl_pairs_check(const tl_ctx *ctx, const tl_pairs *p, int64_t n_in, int64_t n_out) {
    if (!ctx || !p || p->k < 1 || !p->offsets || p->offsets[0] != 0) return TL_ERR_INVALID;
    if (p->k > TL_ROW_MAX) return TL_ERR_OVERFLOW;
    for (int64_t n = 0; n < p->k; n++)
        if (p->offsets[n + 1] < p->offsets[n]) return TL_ERR_INVALID;
    if (p->offsets[p->k] && (!p->in || !p->out)) return TL_ERR_INVALID;
    /* Entries are int32, so a bound past INT32_MAX holds every non-negative one. */
    const uint32_t ni = n_in > INT32_MAX ? (uint32_t)INT32_MAX + 1u : (uint32_t)(n_in < 0 ? 0 : n_in);
    const uint32_t no =
        n_out > INT32_MAX ? (uint32_t)INT32_MAX + 1u : (uint32_t)(n_out < 0 ? 0 : n_out);
#if TL_SIMD_X86
    const tl_simd level = tl_simd_vector_capped(ctx->simd_cap);
    int (*bad_of)(const int32_t *, const int32_t *, int64_t, uint32_t, uint32_t) =
        level >= TL_SIMD_V4   ? tl_pairs_bad_v4
        : level >= TL_SIMD_V3 ? tl_pairs_bad_v3
                              : tl_pairs_bad;
#else
    int (*bad_of)(const int32_t *, const int32_t *, int64_t, uint32_t, uint32_t) = tl_pairs_bad;
#endif
    int bad = 0;
#pragma omp parallel for num_threads(tl_threads_for(ctx, p->offsets[p->k])) schedule(static) \
    reduction(| : bad)
    for (int64_t n = 0; n < p->k; n++) {
        const int64_t lo = p->offsets[n];
        bad |= bad_of(p->in + lo, p->out + lo, p->offsets[n + 1] - lo, ni, no);
    }
    return bad ? TL_ERR_INVALID : TL_OK;
}
