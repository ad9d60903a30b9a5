#include "tl_generative.h"

#include "tl_hash.h"

static tl_status tl_generative_check(const tl_coord *in, int64_t n_in, const tl_geom *g) {
    int64_t k;
    tl_status st = tl_geom_check(g, &k);
    if (st != TL_OK) return st;
    for (int a = 0; a < 3; a++)
        if (g->padding[a] != 0 || g->dilation[a] != 1) return TL_ERR_INVALID;
    for (int64_t i = 0; i < n_in; i++) {
        const int32_t c[3] = {in[i].x, in[i].y, in[i].z};
        if ((in[i].b | c[0] | c[1] | c[2]) < 0) return TL_ERR_INVALID;
        for (int a = 0; a < 3; a++)
            if ((int64_t)c[a] * g->stride[a] + g->kernel_size[a] - 1 > TL_COORD_MAX)
                return TL_ERR_OVERFLOW;
    }
    return TL_OK;
}

tl_status tl_generative_support(const tl_coord *in, int64_t n_in, const tl_geom *g,
                                tl_coord *out, int64_t capacity, int64_t *n_out) {
    *n_out = 0;
    if (n_in < 0 || capacity < 0 || (n_in && !in) || (capacity && !out)) return TL_ERR_INVALID;
    tl_status st = tl_generative_check(in, n_in, g);
    if (st != TL_OK) return st;
    int64_t k = (int64_t)g->kernel_size[0] * g->kernel_size[1] * g->kernel_size[2];
    tl_hash seen;
    st = tl_hash_init(&seen, n_in);
    if (st != TL_OK) return st;
    int64_t m = 0;
    for (int64_t i = 0; i < n_in && st == TL_OK; i++) {
        for (int64_t n = 0; n < k; n++) {
            int32_t r[3];
            tl_geom_position(g, n, r);
            tl_coord q = {in[i].b, in[i].x * g->stride[0] + r[0],
                          in[i].y * g->stride[1] + r[1], in[i].z * g->stride[2] + r[2]};
            st = tl_hash_reserve(&seen, seen.size + 1);
            if (st != TL_OK) break;
            int64_t prev;
            st = tl_hash_insert(&seen, q, m, &prev);
            if (st != TL_OK) break;
            if (prev >= 0) continue;
            if (m == capacity) {
                st = TL_ERR_CAPACITY;
                break;
            }
            out[m++] = q;
        }
    }
    tl_hash_free(&seen);
    if (st != TL_OK) return st;
    *n_out = m;
    return tl_coords_sort(out, m);
}
