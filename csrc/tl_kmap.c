#include "tl_kmap.h"

#include <stdlib.h>

#include "tl_hash.h"

/* Input row feeding out through kernel position r, or -1. */
static int32_t tl_kmap_lookup(const tl_hash *h, tl_coord out, const tl_geom *g,
                              const int32_t r[3]) {
    int64_t c[3] = {out.x, out.y, out.z};
    int32_t p[3];
    for (int a = 0; a < 3; a++) {
        int64_t v = c[a] * g->stride[a] - g->padding[a] + (int64_t)r[a] * g->dilation[a];
        if (v < TL_COORD_MIN || v > TL_COORD_MAX) return TL_NO_ROW;
        p[a] = (int32_t)v;
    }
    tl_coord key = {out.b, p[0], p[1], p[2]};
    return (int32_t)tl_hash_find(h, key);
}

tl_status tl_kmap_build(const tl_ctx *ctx, const tl_coord *in, int64_t n_in,
                        const tl_coord *out, int64_t n_out, const tl_geom *g,
                        int32_t *nbr) {
    int64_t k;
    tl_status st = tl_geom_check(g, &k);
    if (st != TL_OK) return st;
    if (n_in < 0 || n_out < 0 || (n_in && !in) || (n_out && (!out || !nbr)))
        return TL_ERR_INVALID;
    if (n_in > TL_ROW_MAX || n_out > TL_ROW_MAX) return TL_ERR_OVERFLOW;
    for (int64_t i = 0; i < n_in; i++)
        if ((in[i].b | in[i].x | in[i].y | in[i].z) < 0) return TL_ERR_INVALID;
    int32_t *pos = malloc(sizeof(int32_t) * 3 * (size_t)k);
    if (!pos) return TL_ERR_NOMEM;
    for (int64_t n = 0; n < k; n++) tl_geom_position(g, n, pos + 3 * n);
    tl_hash h;
    st = tl_hash_build(&h, in, n_in, NULL);
    if (st != TL_OK) {
        free(pos);
        return st;
    }
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
    for (int64_t o = 0; o < n_out; o++) {
        int32_t *row = nbr + o * k;
        if (out[o].b < 0) {
            for (int64_t n = 0; n < k; n++) row[n] = TL_NO_ROW;
            continue;
        }
        for (int64_t n = 0; n < k; n++) row[n] = tl_kmap_lookup(&h, out[o], g, pos + 3 * n);
    }
    tl_hash_free(&h);
    free(pos);
    return TL_OK;
}

tl_status tl_kmap_reverse(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out,
                          int64_t k, int64_t n_in, int32_t *rev) {
    if (n_out < 0 || n_in < 0 || k < 1 || (n_out && !nbr) || (n_in && !rev))
        return TL_ERR_INVALID;
    if (n_in > TL_ROW_MAX || n_out > TL_ROW_MAX) return TL_ERR_OVERFLOW;
    int bad = 0;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
    for (int64_t j = 0; j < n_in * k; j++) rev[j] = TL_NO_ROW;
    /* Each (i, n) slot has at most one writer, so columns can be filled in
     * parallel; a second writer means the map is corrupt. */
#pragma omp parallel for num_threads(ctx->threads) schedule(static) reduction(| : bad)
    for (int64_t n = 0; n < k; n++) {
        for (int64_t o = 0; o < n_out; o++) {
            int32_t i = nbr[o * k + n];
            if (i == TL_NO_ROW) continue;
            if (i < 0 || i >= n_in || rev[i * k + n] != TL_NO_ROW) {
                bad = 1;
                continue;
            }
            rev[i * k + n] = (int32_t)o;
        }
    }
    return bad ? TL_ERR_INVALID : TL_OK;
}
