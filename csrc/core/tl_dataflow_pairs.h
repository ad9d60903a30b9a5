/* The pair-list dataflows on the CPU: fetch-on-demand and gather-scatter
 * (docs/kernel-maps.md).  Gather-scatter's forward and weight gradient walk
 * kernel rows in order n = 0..k-1 and, within a row, split its pairs among
 * threads; no output row repeats within a kernel row, so outputs
 * are written without atomics, and the summation order per output row (over
 * n) is fixed: results do not depend on threads.
 *
 *   fetch-on-demand: each pair reads x[in] and accumulates x[in] @ W_n into
 *                    y[out] directly; the forward and the weight gradient
 *                    run implicit GEMM's output tiles and blocks over the
 *                    pair lists (tl_implicit_gemm_forward_pairs and
 *                    _weight_grad_pairs: bitwise its results);
 *   gather-scatter:  a block of pairs is gathered into a dense buffer, one
 *                    block GEMM with W_n, then scattered into y[out].
 *
 * The input gradient is the forward call on the reversed pairs with W^T. */
#ifndef TL_DATAFLOW_PAIRS_H
#define TL_DATAFLOW_PAIRS_H

#include "tl_conv.h"
#include "tl_pairs.h"

typedef enum tl_pairs_mode {
    TL_PAIRS_FETCH_ON_DEMAND = 0,
    TL_PAIRS_GATHER_SCATTER = 1
} tl_pairs_mode;

/* y (n_out, c_out) = sum over pairs (i, o, n) of x[i] @ w[n] into row o;
 * y is overwritten.  dtype TL_F32 or TL_F64. */
tl_status tl_pairs_forward(const tl_ctx *ctx, tl_pairs_mode mode, const tl_conv_desc *d,
                           const void *x, const void *w, const tl_pairs *p, void *y);

/* dw (k, c_in, c_out) = sum over pairs of x[i]^T dy[o]; overwritten.
 * Partial sums over a fixed partition (of each kernel row's pairs for
 * gather-scatter, of the output rows for fetch-on-demand), added in a fixed
 * order. */
tl_status tl_pairs_weight_grad(const tl_ctx *ctx, tl_pairs_mode mode, const tl_conv_desc *d,
                               const void *x, const void *dy, const tl_pairs *p, void *dw);

#endif
