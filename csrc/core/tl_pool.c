#include "tl_pool.h"

#include "tl_coords.h"

static tl_status tl_pool_check(const tl_ctx *ctx, const tl_pool_desc *d) {
    if (!ctx || !d || ctx->threads < 1) return TL_ERR_INVALID;
    if (d->n_in < 0 || d->n_out < 0 || d->k < 1 || d->c < 0) return TL_ERR_INVALID;
    if (d->n_in > TL_ROW_MAX || d->n_out > TL_ROW_MAX || d->k > TL_ROW_MAX)
        return TL_ERR_OVERFLOW;
    /* rows x channels index the feature arrays in int64. */
    if (!tl_mul_fits(d->n_in, d->c) || !tl_mul_fits(d->n_out, d->c)) return TL_ERR_OVERFLOW;
    if (d->dtype != TL_F32 && d->dtype != TL_F64) return TL_ERR_UNSUPPORTED;
    return TL_OK;
}

/* Rejects table entries outside [-1, limit) before any kernel reads them. */
static tl_status tl_pool_check_table(const tl_ctx *ctx, const int32_t *t, int64_t rows,
                                     int64_t k, int64_t limit) {
    if (rows * k > 0 && !t) return TL_ERR_INVALID;
    int bad = 0;
#pragma omp parallel for num_threads(ctx->threads) schedule(static) reduction(| : bad)
    for (int64_t j = 0; j < rows * k; j++) bad |= t[j] < -1 || t[j] >= limit;
    return bad ? TL_ERR_INVALID : TL_OK;
}

#define TL_POOL_KERNELS(T, SFX)                                                               \
    static void tl_sum_##SFX(const tl_ctx *ctx, const tl_pool_desc *d, const T *x,          \
                             const int32_t *nbr, int average, T *y) {                       \
        const int64_t k = d->k, c = d->c;                                                     \
        _Pragma("omp parallel for num_threads(ctx->threads) schedule(static)")               \
        for (int64_t o = 0; o < d->n_out; o++) {                                              \
            T *yo = y + o * c;                                                                \
            int64_t count = 0;                                                                \
            for (int64_t j = 0; j < c; j++) yo[j] = (T)0;                                     \
            for (int64_t n = 0; n < k; n++) {                                                 \
                int32_t i = nbr[o * k + n];                                                   \
                if (i < 0) continue;                                                          \
                count++;                                                                      \
                const T *xi = x + (int64_t)i * c;                                             \
                for (int64_t j = 0; j < c; j++) yo[j] += xi[j];                               \
            }                                                                                 \
            if (average && count > 1)                                                         \
                for (int64_t j = 0; j < c; j++) yo[j] /= (T)count;                            \
        }                                                                                     \
    }                                                                                         \
    static void tl_max_##SFX(const tl_ctx *ctx, const tl_pool_desc *d, const T *x,          \
                             const int32_t *nbr, T *y, int32_t *arg) {                      \
        const int64_t k = d->k, c = d->c;                                                     \
        _Pragma("omp parallel for num_threads(ctx->threads) schedule(static)")               \
        for (int64_t o = 0; o < d->n_out; o++) {                                              \
            T *yo = y + o * c;                                                                \
            int32_t *ao = arg + o * c;                                                        \
            for (int64_t j = 0; j < c; j++) {                                                 \
                yo[j] = (T)0;                                                                 \
                ao[j] = -1;                                                                   \
            }                                                                                 \
            for (int64_t n = 0; n < k; n++) {                                                 \
                int32_t i = nbr[o * k + n];                                                   \
                if (i < 0) continue;                                                          \
                const T *xi = x + (int64_t)i * c;                                             \
                for (int64_t j = 0; j < c; j++) {                                             \
                    int take = ao[j] < 0 || xi[j] > yo[j] || (xi[j] != xi[j] && yo[j] == yo[j]); \
                    if (take) {                                                               \
                        yo[j] = xi[j];                                                        \
                        ao[j] = i;                                                            \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    static void tl_max_bwd_##SFX(const tl_ctx *ctx, const tl_pool_desc *d, const T *dy,     \
                                 const int32_t *rev, const int32_t *arg, T *dx) {           \
        const int64_t k = d->k, c = d->c;                                                     \
        _Pragma("omp parallel for num_threads(ctx->threads) schedule(static)")               \
        for (int64_t i = 0; i < d->n_in; i++) {                                               \
            T *dxi = dx + i * c;                                                              \
            for (int64_t j = 0; j < c; j++) dxi[j] = (T)0;                                    \
            for (int64_t n = 0; n < k; n++) {                                                 \
                int32_t o = rev[i * k + n];                                                   \
                if (o < 0) continue;                                                          \
                for (int64_t j = 0; j < c; j++)                                               \
                    if (arg[(int64_t)o * c + j] == i) dxi[j] += dy[(int64_t)o * c + j];       \
            }                                                                                 \
        }                                                                                     \
    }

TL_POOL_KERNELS(float, f32)
TL_POOL_KERNELS(double, f64)

tl_status tl_pool_sum(const tl_ctx *ctx, const tl_pool_desc *d, const void *x,
                      const int32_t *nbr, int average, void *y) {
    tl_status st = tl_pool_check(ctx, d);
    if (st != TL_OK) return st;
    if ((d->n_in * d->c > 0 && !x) || (d->n_out * d->c > 0 && !y)) return TL_ERR_INVALID;
    st = tl_pool_check_table(ctx, nbr, d->n_out, d->k, d->n_in);
    if (st != TL_OK) return st;
    if (d->dtype == TL_F32)
        tl_sum_f32(ctx, d, x, nbr, average, y);
    else
        tl_sum_f64(ctx, d, x, nbr, average, y);
    return TL_OK;
}

tl_status tl_pool_max(const tl_ctx *ctx, const tl_pool_desc *d, const void *x,
                      const int32_t *nbr, void *y, int32_t *argmax) {
    tl_status st = tl_pool_check(ctx, d);
    if (st != TL_OK) return st;
    if ((d->n_in * d->c > 0 && !x) || (d->n_out * d->c > 0 && (!y || !argmax)))
        return TL_ERR_INVALID;
    st = tl_pool_check_table(ctx, nbr, d->n_out, d->k, d->n_in);
    if (st != TL_OK) return st;
    if (d->dtype == TL_F32)
        tl_max_f32(ctx, d, x, nbr, y, argmax);
    else
        tl_max_f64(ctx, d, x, nbr, y, argmax);
    return TL_OK;
}

tl_status tl_pool_max_backward(const tl_ctx *ctx, const tl_pool_desc *d, const void *dy,
                               const int32_t *rev, const int32_t *argmax, void *dx) {
    tl_status st = tl_pool_check(ctx, d);
    if (st != TL_OK) return st;
    if ((d->n_out * d->c > 0 && (!dy || !argmax)) || (d->n_in * d->c > 0 && !dx))
        return TL_ERR_INVALID;
    st = tl_pool_check_table(ctx, rev, d->n_in, d->k, d->n_out);
    if (st != TL_OK) return st;
    int bad = 0;
    const int64_t count = d->n_out * d->c;
#pragma omp parallel for num_threads(ctx->threads) schedule(static) reduction(| : bad)
    for (int64_t j = 0; j < count; j++) bad |= argmax[j] < -1 || argmax[j] >= d->n_in;
    if (bad) return TL_ERR_INVALID;
    if (d->dtype == TL_F32)
        tl_max_bwd_f32(ctx, d, dy, rev, argmax, dx);
    else
        tl_max_bwd_f64(ctx, d, dy, rev, argmax, dx);
    return TL_OK;
}
