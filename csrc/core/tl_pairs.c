#include "tl_pairs.h"

#include "tl_coords.h"

tl_status tl_pairs_count(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out, int64_t k,
                         int64_t *offsets) {
    if (!ctx || n_out < 0 || k < 1 || (n_out && !nbr) || !offsets) return TL_ERR_INVALID;
    tl_status st = tl_table_check(n_out, k);
    if (st != TL_OK) return st;
    offsets[0] = 0;
#pragma omp parallel for num_threads(tl_threads_for(ctx, n_out * k)) schedule(static)
    for (int64_t n = 0; n < k; n++) {
        int64_t c = 0;
        for (int64_t o = 0; o < n_out; o++) c += nbr[o * k + n] >= 0;
        offsets[n + 1] = c;
    }
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

tl_status tl_pairs_check(const tl_ctx *ctx, const tl_pairs *p, int64_t n_in, int64_t n_out) {
    if (!ctx || !p || p->k < 1 || !p->offsets || p->offsets[0] != 0) return TL_ERR_INVALID;
    if (p->k > TL_ROW_MAX) return TL_ERR_OVERFLOW;
    for (int64_t n = 0; n < p->k; n++)
        if (p->offsets[n + 1] < p->offsets[n]) return TL_ERR_INVALID;
    if (p->offsets[p->k] && (!p->in || !p->out)) return TL_ERR_INVALID;
    int bad = 0;
#pragma omp parallel for num_threads(tl_threads_for(ctx, p->offsets[p->k])) schedule(static) \
    reduction(| : bad)
    for (int64_t n = 0; n < p->k; n++) {
        int64_t prev = -1;
        for (int64_t j = p->offsets[n]; j < p->offsets[n + 1]; j++) {
            bad |= p->in[j] < 0 || p->in[j] >= n_in || p->out[j] <= prev || p->out[j] >= n_out;
            prev = p->out[j];
        }
    }
    return bad ? TL_ERR_INVALID : TL_OK;
}
