/* Sparse pooling over a kernel map (see tl_kmap.h for nbr/rev).
 *
 * Features are row-major: x (n_in, c), y (n_out, c).  Pooling is per
 * channel over the kernel rows whose input exists:
 *   sum:  y[o] = sum_n x[nbr[o, n]]
 *   avg:  y[o] = sum / (number of present n), 0 when none
 *   max:  y[o] = max_n x[nbr[o, n]], 0 when none; argmax[o, c] is the input
 *         row attaining it (the first in kernel-row order; NaN wins), -1 when none.
 * Work is partitioned over output rows (forward) or input rows (max
 * backward), so there are no atomics and results never depend on the
 * thread count.  dtype TL_F32 or TL_F64; every nbr/rev entry must lie in
 * [-1, rows of the other side) (TL_ERR_INVALID). */
#ifndef TL_POOL_H
#define TL_POOL_H

#include "tl_conv.h"
#include "tl_ctx.h"

/* Shape of one pooling call: rows of both sides, kernel rows, channels. */
typedef struct tl_pool_desc {
    tl_dtype dtype;
    int64_t n_in, n_out, k, c;
} tl_pool_desc;

/* Sum pooling, or average pooling when `average` is non-zero.  The
 * gradient of sum pooling is sum pooling over rev with the sides swapped. */
tl_status tl_pool_sum(const tl_ctx *ctx, const tl_pool_desc *d, const void *x,
                      const int32_t *nbr, int average, void *y);

/* Max pooling: y (n_out, c) and argmax (n_out, c) int32. */
tl_status tl_pool_max(const tl_ctx *ctx, const tl_pool_desc *d, const void *x,
                      const int32_t *nbr, void *y, int32_t *argmax);

/* Gradient of max pooling: dx[i, c] = sum over n with o = rev[i, n] >= 0 and
 * argmax[o, c] == i of dy[o, c].  dx (n_in, c) is overwritten. */
tl_status tl_pool_max_backward(const tl_ctx *ctx, const tl_pool_desc *d, const void *dy,
                               const int32_t *rev, const int32_t *argmax, void *dx);

#endif
