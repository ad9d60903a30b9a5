#include "tl_voxel.h"

#include <math.h>
#include <stdlib.h>

#include "tl_hash.h"

static int tl_grid_ok(const tl_voxel_grid *g) {
    for (int a = 0; a < 3; a++) {
        if (!isfinite(g->size[a]) || !(g->size[a] > 0.0) || !isfinite(g->origin[a])) return 0;
    }
    return 1;
}

static double tl_point(tl_dtype dtype, const void *pts, int64_t p, int a) {
    return dtype == TL_F32 ? (double)((const float *)pts)[p * 3 + a]
                           : ((const double *)pts)[p * 3 + a];
}

/* Voxel row of point p; the one place that decides "below origin" and
 * "beyond int32". */
static tl_status tl_quantize_one(tl_dtype dtype, const void *pts, const int64_t *batch,
                                 int64_t p, const tl_voxel_grid *g, tl_coord *out) {
    int64_t b = batch ? batch[p] : 0;
    if (b < 0) return TL_ERR_INVALID;
    if (b > TL_COORD_MAX) return TL_ERR_OVERFLOW;
    int32_t v[3];
    for (int a = 0; a < 3; a++) {
        double u = (tl_point(dtype, pts, p, a) - g->origin[a]) / g->size[a];
        if (!isfinite(u) || !(u >= 0.0)) return TL_ERR_INVALID;
        double f = floor(u);
        if (f > (double)TL_COORD_MAX) return TL_ERR_OVERFLOW;
        v[a] = (int32_t)f;
    }
    out->b = (int32_t)b;
    out->x = v[0];
    out->y = v[1];
    out->z = v[2];
    return TL_OK;
}

/* First point whose quantization fails, or -1. */
static int64_t tl_first_bad_point(const tl_ctx *ctx, tl_dtype dtype, const void *pts,
                                  const int64_t *batch, int64_t n, const tl_voxel_grid *g) {
    int64_t first = n;
#pragma omp parallel for num_threads(ctx->threads) schedule(static) reduction(min : first)
    for (int64_t p = 0; p < n; p++) {
        tl_coord r;
        if (p < first && tl_quantize_one(dtype, pts, batch, p, g, &r) != TL_OK) first = p;
    }
    return first < n ? first : -1;
}

static tl_status tl_check_points(const tl_ctx *ctx, tl_dtype dtype, const void *pts,
                                 const int64_t *batch, int64_t n, const tl_voxel_grid *g,
                                 int64_t *bad) {
    if (bad) *bad = -1;
    if (!ctx || ctx->threads < 1 || !g || n < 0 || (n > 0 && !pts)) return TL_ERR_INVALID;
    if (dtype != TL_F32 && dtype != TL_F64) return TL_ERR_UNSUPPORTED;
    if (!tl_grid_ok(g)) return TL_ERR_INVALID;
    int64_t first = tl_first_bad_point(ctx, dtype, pts, batch, n, g);
    if (first < 0) return TL_OK;
    if (bad) *bad = first;
    tl_coord r;
    return tl_quantize_one(dtype, pts, batch, first, g, &r);
}

tl_status tl_voxel_quantize(const tl_ctx *ctx, tl_dtype dtype, const void *pts,
                            const int64_t *batch, int64_t n, const tl_voxel_grid *grid,
                            tl_coord *rows, int64_t *bad) {
    tl_status st = tl_check_points(ctx, dtype, pts, batch, n, grid, bad);
    if (st != TL_OK) return st;
    if (n > 0 && !rows) return TL_ERR_INVALID;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
    for (int64_t p = 0; p < n; p++) (void)tl_quantize_one(dtype, pts, batch, p, grid, &rows[p]);
    return TL_OK;
}

tl_status tl_voxel_unique(const tl_ctx *ctx, const tl_coord *rows, int64_t n, tl_coord *uniq,
                          int64_t *n_uniq, int64_t *inverse) {
    if (!ctx || ctx->threads < 1 || !n_uniq || n < 0) return TL_ERR_INVALID;
    if (n > 0 && (!rows || !uniq || !inverse)) return TL_ERR_INVALID;
    for (int64_t p = 0; p < n; p++) {
        if ((rows[p].b | rows[p].x | rows[p].y | rows[p].z) < 0) return TL_ERR_INVALID;
    }
    /* Pass 1: first occurrences, in point order.  Pass 2, after sorting: the
     * sorted row of every point. */
    tl_hash h;
    tl_status st = tl_hash_init(&h, n);
    if (st != TL_OK) return st;
    int64_t m = 0;
    for (int64_t p = 0; p < n; p++) {
        int64_t existing;
        st = tl_hash_insert(&h, rows[p], m, &existing);
        if (st != TL_OK) goto fail;
        if (existing < 0) uniq[m++] = rows[p];
    }
    tl_hash_free(&h);
    st = tl_coords_sort(uniq, m);
    if (st != TL_OK) return st;
    st = tl_hash_build(&h, uniq, m, NULL);
    if (st != TL_OK) goto fail;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
    for (int64_t p = 0; p < n; p++) inverse[p] = tl_hash_find(&h, rows[p]);
    *n_uniq = m;
fail:
    tl_hash_free(&h);
    return st;
}

/* Points of each voxel in point order: voxel v owns order[offsets[v] ..
 * offsets[v + 1]).  A stable counting sort, so results never depend on the
 * thread count. */
static tl_status tl_voxel_csr(const int64_t *inverse, int64_t n, int64_t m, int64_t **offsets,
                              int64_t **order) {
    *offsets = calloc((size_t)m + 1, sizeof(int64_t));
    *order = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    int64_t *cursor = malloc(sizeof(int64_t) * (size_t)(m > 0 ? m : 1));
    if (!*offsets || !*order || !cursor) {
        free(*offsets);
        free(*order);
        free(cursor);
        return TL_ERR_NOMEM;
    }
    for (int64_t p = 0; p < n; p++) (*offsets)[inverse[p] + 1]++;
    for (int64_t v = 0; v < m; v++) (*offsets)[v + 1] += (*offsets)[v];
    for (int64_t v = 0; v < m; v++) cursor[v] = (*offsets)[v];
    for (int64_t p = 0; p < n; p++) (*order)[cursor[inverse[p]]++] = p;
    free(cursor);
    return TL_OK;
}

#define TL_VOXEL_REDUCE(T, SFX)                                                               \
    static void tl_reduce_##SFX(const tl_ctx *ctx, tl_voxel_reduction red, const T *x,      \
                                int64_t c, const int64_t *off, const int64_t *order,        \
                                int64_t m, T *out, int64_t *arg) {                          \
        _Pragma("omp parallel for num_threads(ctx->threads) schedule(dynamic, 64)")          \
        for (int64_t v = 0; v < m; v++) {                                                     \
            int64_t lo = off[v], hi = off[v + 1];                                             \
            for (int64_t j = 0; j < c; j++) {                                                 \
                if (red == TL_VOXEL_MAX) {                                                    \
                    int64_t best = -1;                                                        \
                    for (int64_t q = lo; q < hi; q++) {                                       \
                        T val = x[order[q] * c + j];                                          \
                        if (best < 0 || val > x[best * c + j] ||                              \
                            (val != val && x[best * c + j] == x[best * c + j]))               \
                            best = order[q];                                                  \
                    }                                                                         \
                    out[v * c + j] = best < 0 ? (T)0 : x[best * c + j];                       \
                    arg[v * c + j] = best;                                                    \
                    continue;                                                                 \
                }                                                                             \
                double acc = 0.0;                                                             \
                for (int64_t q = lo; q < hi; q++) acc += (double)x[order[q] * c + j];        \
                if (red == TL_VOXEL_MEAN && hi > lo) acc /= (double)(hi - lo);                \
                out[v * c + j] = (T)acc;                                                      \
            }                                                                                 \
        }                                                                                     \
    }

TL_VOXEL_REDUCE(float, f32)
TL_VOXEL_REDUCE(double, f64)

static int tl_index_ok(const tl_ctx *ctx, const int64_t *idx, int64_t count, int64_t lo,
                       int64_t hi) {
    int bad = 0;
#pragma omp parallel for num_threads(ctx->threads) schedule(static) reduction(| : bad)
    for (int64_t i = 0; i < count; i++) bad |= idx[i] < lo || idx[i] >= hi;
    return !bad;
}

tl_status tl_voxel_reduce(const tl_ctx *ctx, tl_dtype dtype, tl_voxel_reduction red,
                          const void *feats, int64_t n, int64_t c, const int64_t *inverse,
                          int64_t m, void *out, int64_t *argmax) {
    if (!ctx || ctx->threads < 1 || n < 0 || c < 0 || m < 0) return TL_ERR_INVALID;
    if (red != TL_VOXEL_MEAN && red != TL_VOXEL_SUM && red != TL_VOXEL_MAX)
        return TL_ERR_INVALID;
    if (dtype != TL_F32 && dtype != TL_F64) return TL_ERR_UNSUPPORTED;
    /* Points and voxels x channels index in int64; m + 1 offsets are allocated. */
    if (!tl_mul_fits(n, c) || !tl_mul_fits(m, c) || m > (int64_t)(SIZE_MAX / sizeof(int64_t)) - 1)
        return TL_ERR_OVERFLOW;
    if ((n > 0 && !inverse) || (n * c > 0 && !feats) || (m * c > 0 && !out)) return TL_ERR_INVALID;
    if (red == TL_VOXEL_MAX && m * c > 0 && !argmax) return TL_ERR_INVALID;
    if (!tl_index_ok(ctx, inverse, n, 0, m)) return TL_ERR_INVALID;
    /* An empty output: no per-voxel count (16 bytes a voxel, 8.5 GB at 2^29 voxels). */
    if (m * c == 0) return TL_OK;
    int64_t *off, *order;
    tl_status st = tl_voxel_csr(inverse, n, m, &off, &order);
    if (st != TL_OK) return st;
    if (dtype == TL_F32)
        tl_reduce_f32(ctx, red, feats, c, off, order, m, out, argmax);
    else
        tl_reduce_f64(ctx, red, feats, c, off, order, m, out, argmax);
    free(off);
    free(order);
    return TL_OK;
}

/* Row of voxel (b, x, y, z) with 64-bit x, y, z, or -1 when it cannot exist. */
static int64_t tl_find_corner(const tl_hash *h, int32_t b, const int64_t v[3]) {
    for (int a = 0; a < 3; a++) {
        if (v[a] < 0 || v[a] > TL_COORD_MAX) return -1;
    }
    tl_coord key = {b, (int32_t)v[0], (int32_t)v[1], (int32_t)v[2]};
    return tl_hash_find(h, key);
}

static void tl_devoxel_point(tl_dtype dtype, const void *pts, const int64_t *batch, int64_t p,
                             const tl_voxel_grid *g, const tl_hash *h, int trilinear,
                             int64_t *idx, double *w) {
    int32_t b = (int32_t)(batch ? batch[p] : 0);
    double u[3];
    int64_t base[3];
    for (int a = 0; a < 3; a++) {
        u[a] = (tl_point(dtype, pts, p, a) - g->origin[a]) / g->size[a] - (trilinear ? 0.5 : 0);
        double f = floor(u[a]);
        base[a] = f > (double)TL_COORD_MAX ? (int64_t)TL_COORD_MAX + 1 : (int64_t)f;
        u[a] -= f; /* fraction in [0, 1) */
    }
    if (!trilinear) {
        idx[0] = tl_find_corner(h, b, base);
        w[0] = idx[0] >= 0 ? 1.0 : 0.0;
        return;
    }
    for (int j = 0; j < 8; j++) {
        int d[3] = {(j >> 2) & 1, (j >> 1) & 1, j & 1};
        int64_t v[3];
        double weight = 1.0;
        for (int a = 0; a < 3; a++) {
            v[a] = base[a] + d[a];
            weight *= d[a] ? u[a] : 1.0 - u[a];
        }
        idx[j] = tl_find_corner(h, b, v);
        w[j] = idx[j] >= 0 ? weight : 0.0;
    }
}

tl_status tl_voxel_devoxel_map(const tl_ctx *ctx, tl_dtype dtype, const void *pts,
                               const int64_t *batch, int64_t n, const tl_voxel_grid *grid,
                               const tl_coord *vox, int64_t m, int trilinear, int64_t *idx,
                               double *w, int64_t *bad) {
    tl_status st = tl_check_points(ctx, dtype, pts, batch, n, grid, bad);
    if (st != TL_OK) return st;
    if (m < 0 || (m > 0 && !vox) || (n > 0 && (!idx || !w))) return TL_ERR_INVALID;
    tl_hash h;
    st = tl_hash_build(&h, vox, m, NULL);
    if (st != TL_OK) return st;
    int k = trilinear ? 8 : 1;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
    for (int64_t p = 0; p < n; p++)
        tl_devoxel_point(dtype, pts, batch, p, grid, &h, trilinear, &idx[p * k], &w[p * k]);
    tl_hash_free(&h);
    return TL_OK;
}

#define TL_VOXEL_GATHER(T, SFX)                                                               \
    static void tl_gather_##SFX(const tl_ctx *ctx, const T *x, int64_t c, const int64_t *idx, \
                                const double *w, int64_t n, int64_t k, T *out) {            \
        _Pragma("omp parallel for num_threads(ctx->threads) schedule(static)")               \
        for (int64_t p = 0; p < n; p++) {                                                     \
            for (int64_t j = 0; j < c; j++) {                                                 \
                double acc = 0.0;                                                             \
                for (int64_t q = 0; q < k; q++) {                                             \
                    int64_t r = idx[p * k + q];                                               \
                    if (r >= 0) acc += w[p * k + q] * (double)x[r * c + j];                   \
                }                                                                             \
                out[p * c + j] = (T)acc;                                                      \
            }                                                                                 \
        }                                                                                     \
    }

TL_VOXEL_GATHER(float, f32)
TL_VOXEL_GATHER(double, f64)

tl_status tl_voxel_gather(const tl_ctx *ctx, tl_dtype dtype, const void *feats, int64_t m,
                          int64_t c, const int64_t *idx, const double *w, int64_t n, int64_t k,
                          void *out) {
    if (!ctx || ctx->threads < 1 || m < 0 || c < 0 || n < 0 || k < 1) return TL_ERR_INVALID;
    if (dtype != TL_F32 && dtype != TL_F64) return TL_ERR_UNSUPPORTED;
    if (!tl_mul_fits(n, k) || !tl_mul_fits(n, c) || !tl_mul_fits(m, c)) return TL_ERR_OVERFLOW;
    if ((n > 0 && (!idx || !w)) || (m * c > 0 && !feats) || (n * c > 0 && !out))
        return TL_ERR_INVALID;
    if (!tl_index_ok(ctx, idx, n * k, -1, m)) return TL_ERR_INVALID;
    if (dtype == TL_F32)
        tl_gather_f32(ctx, feats, c, idx, w, n, k, out);
    else
        tl_gather_f64(ctx, feats, c, idx, w, n, k, out);
    return TL_OK;
}
