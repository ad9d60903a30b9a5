#include "tl_conv.h"

#include "tl_coords.h"

static int tl_mul_fits(int64_t a, int64_t b) { return a == 0 || b <= INT64_MAX / a; }

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
