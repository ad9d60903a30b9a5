#include "tl_conv.h"

#include "tl_coords.h"

tl_status tl_conv_desc_check(const tl_conv_desc *d) {
    if (d->n_in < 0 || d->n_out < 0 || d->k < 1 || d->c_in < 0 || d->c_out < 0)
        return TL_ERR_INVALID;
    if (d->n_in > TL_ROW_MAX || d->n_out > TL_ROW_MAX) return TL_ERR_OVERFLOW;
    if (!tl_mul_fits(d->n_in, d->c_in) || !tl_mul_fits(d->n_out, d->c_out) ||
        !tl_mul_fits(d->n_out, d->k) || !tl_mul_fits(d->n_in, d->k) ||
        !tl_mul_fits(d->c_in, d->c_out) || !tl_mul_fits(d->k, d->c_in * d->c_out))
        return TL_ERR_OVERFLOW;
    return TL_OK;
}

tl_status tl_conv_check_cpu(const tl_ctx *ctx, const tl_conv_desc *d, int halves) {
    if (!ctx || !d || ctx->threads < 1) return TL_ERR_INVALID;
    tl_status st = tl_conv_desc_check(d);
    if (st != TL_OK) return st;
    if (d->dtype == TL_F32 || d->dtype == TL_F64) return TL_OK;
    return halves && (d->dtype == TL_BF16 || d->dtype == TL_F16) ? TL_OK : TL_ERR_UNSUPPORTED;
}

/* A pointer may be NULL only when its matrix is empty. */
static int tl_present(const void *p, int64_t rows, int64_t cols) {
    return p != NULL || rows == 0 || cols == 0;
}

tl_status tl_conv_check_buffers(const tl_conv_desc *d, int weight_grad, const void *x,
                                const void *b, const void *out) {
    const int64_t mat = d->c_in * d->c_out;
    int ok = tl_present(x, d->n_in, d->c_in);
    if (weight_grad)
        ok = ok && tl_present(b, d->n_out, d->c_out) && tl_present(out, d->k, mat);
    else
        ok = ok && tl_present(b, d->k, mat) && tl_present(out, d->n_out, d->c_out);
    return ok ? TL_OK : TL_ERR_INVALID;
}
