/* Output support of a generative transposed convolution.
 *
 * Every source row q and every kernel position r produce the fine row
 * q * stride + r (padding 0, dilation 1); the support is the deduplicated
 * set of those rows, sorted by (b, x, y, z).  Nothing is clipped: a row that
 * would leave the int32 range is an error, not dropped. */
#ifndef TL_GENERATIVE_H
#define TL_GENERATIVE_H

#include "tl_coords.h"

/* Writes the support to `out` (capacity rows; n_in * K always suffices) and
 * its row count to *n_out.  TL_ERR_INVALID if g has padding != 0 or
 * dilation != 1; TL_ERR_OVERFLOW if a row exceeds TL_COORD_MAX;
 * TL_ERR_CAPACITY if `out` is too small. */
tl_status tl_generative_support(const tl_coord *in, int64_t n_in, const tl_geom *g,
                                tl_coord *out, int64_t capacity, int64_t *n_out);

#endif
