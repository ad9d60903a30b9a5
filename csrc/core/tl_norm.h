/* Batch normalization of row-major (n, c) features, with the ReLU after it
 * fused in, for the CPU.
 *
 * Per channel j the layer is y = act(x * scale[j] + shift[j]); the caller
 * derives scale and shift from the batch statistics (training) or the running
 * ones (eval), and the gradient's coefficients from the two sums of the
 * backward reduction, so this file holds only the passes over the features:
 *
 *   stats            mean[j], var[j] (biased) of x over the n rows
 *   apply            y = act(x * scale + shift)
 *   backward_reduce  sum_g[j] = sum g, sum_gx[j] = sum g * (x - mean[j]),
 *                    g = dy, or 0 where the fused ReLU cut x * scale + shift <= 0
 *   backward_apply   dx = g * a[j] + x * b[j] + k[j], or g * a[j] (eval: b, k NULL)
 *
 * Features are float32, bfloat16 or float16 (TL_F32, TL_BF16, TL_F16); half
 * types are widened to float in blocks and y / dx rounded once.  Sums are in
 * double over fixed chunks of rows, added in chunk order, so no result
 * depends on the thread count.  The ReLU mask of the backward is recomputed
 * from x with the forward's own expression, so x is the only saved tensor. */
#ifndef TL_NORM_H
#define TL_NORM_H

#include "tl_conv.h"
#include "tl_ctx.h"

/* One call's shape: rows, channels, and whether the ReLU is fused (0 or 1). */
typedef struct tl_norm_desc {
    tl_dtype dtype;
    int64_t n, c;
    int relu;
} tl_norm_desc;

/* mean (c) and biased var (c) of x over its n >= 1 rows. */
tl_status tl_norm_stats(const tl_ctx *ctx, const tl_norm_desc *d, const void *x, double *mean,
                        double *var);

/* y (n, c) = act(x * scale + shift); y may be x. */
tl_status tl_norm_apply(const tl_ctx *ctx, const tl_norm_desc *d, const void *x,
                        const float *scale, const float *shift, void *y);

/* sum_g (c) and sum_gx (c) of the gradient dy (n, c) (see the top). */
tl_status tl_norm_backward_reduce(const tl_ctx *ctx, const tl_norm_desc *d, const void *dy,
                                  const void *x, const float *scale, const float *shift,
                                  const double *mean, double *sum_g, double *sum_gx);

/* dx (n, c) = g * a + x * b + k, or g * a when b and k are both NULL (see the
 * top); dx may be dy. */
tl_status tl_norm_backward_apply(const tl_ctx *ctx, const tl_norm_desc *d, const void *dy,
                                 const void *x, const float *scale, const float *shift,
                                 const float *a, const float *b, const float *k, void *dx);

#endif
