#include "tl_dataflow_pairs.h"

#include <stdlib.h>
#include <string.h>

#include "tl_dataflow_implicit_gemm.h"
#include "tl_mem.h"
#include "tl_simd.h"

/* Pairs per block (gather-scatter's forward) and per chunk (its weight
 * gradient): enough rows for the 4-row micro-kernel and to amortize a
 * parallel-for's scheduling; the row pointers of one block live in each
 * thread's scratch. */
#define TL_PAIR_BLOCK 128
/* Bytes of x and y rows gather-scatter's forward asks for a step ahead
 * (tl_pairs_block). */
#define TL_PAIR_AHEAD_BYTES 2048
/* Weight-gradient partial sums: about this many (kernel row, part) tasks,
 * with the partial buffer capped at this many elements. */
#define TL_PAIRS_WGRAD_TASKS 64
#define TL_PAIRS_WGRAD_MAX_PARTIAL (1 << 22)

/* Parts each kernel row's pairs are split into; depends on the problem size
 * only, never on the thread count, so the reduction order is fixed. */
static int64_t tl_pairs_wgrad_parts(const tl_conv_desc *d) {
    int64_t parts = (TL_PAIRS_WGRAD_TASKS + d->k - 1) / d->k;
    int64_t mat = d->k * d->c_in * d->c_out;
    if (mat > 0 && parts * mat > TL_PAIRS_WGRAD_MAX_PARTIAL)
        parts = TL_PAIRS_WGRAD_MAX_PARTIAL / mat;
    return parts < 1 ? 1 : parts;
}

#define TL_T float
#define TL_SFX f32
#include "tl_dataflow_pairs_impl.h"
#undef TL_T
#undef TL_SFX

#define TL_T double
#define TL_SFX f64
#include "tl_dataflow_pairs_impl.h"
#undef TL_T
#undef TL_SFX

static tl_status tl_pairs_args(const tl_ctx *ctx, tl_pairs_mode mode, const tl_conv_desc *d,
                               int weight_grad, const void *x, const void *b,
                               const tl_pairs *p, const void *out) {
    if (!p || (mode != TL_PAIRS_FETCH_ON_DEMAND && mode != TL_PAIRS_GATHER_SCATTER))
        return TL_ERR_INVALID;
    tl_status st = tl_conv_check_cpu(ctx, d, 0);
    if (st == TL_OK) st = tl_conv_check_buffers(d, weight_grad, x, b, out);
    if (st != TL_OK) return st;
    if (p->k != d->k) return TL_ERR_INVALID;
    return tl_pairs_check(ctx, p, d->n_in, d->n_out);
}

tl_status tl_pairs_forward(const tl_ctx *ctx, tl_pairs_mode mode, const tl_conv_desc *d,
                           const void *x, const void *w, const tl_pairs *p, void *y) {
    tl_status st = tl_pairs_args(ctx, mode, d, 0, x, w, p, y);
    if (st != TL_OK) return st;
    if (d->n_out * d->c_out == 0) return TL_OK;
    if (mode == TL_PAIRS_FETCH_ON_DEMAND) return tl_implicit_gemm_forward_pairs(ctx, d, x, w, p, y);
    if (d->dtype == TL_F32) return tl_pairs_fwd_f32(ctx, d, x, w, p, y);
    return tl_pairs_fwd_f64(ctx, d, x, w, p, y);
}

tl_status tl_pairs_weight_grad(const tl_ctx *ctx, tl_pairs_mode mode, const tl_conv_desc *d,
                               const void *x, const void *dy, const tl_pairs *p, void *dw) {
    tl_status st = tl_pairs_args(ctx, mode, d, 1, x, dy, p, dw);
    if (st != TL_OK) return st;
    if (d->k * d->c_in * d->c_out == 0) return TL_OK;
    if (mode == TL_PAIRS_FETCH_ON_DEMAND)
        return tl_implicit_gemm_weight_grad_pairs(ctx, d, x, dy, p, dw);
    if (d->dtype == TL_F32) return tl_pairs_wgrad_f32(ctx, d, x, dy, p, dw);
    return tl_pairs_wgrad_f64(ctx, d, x, dy, p, dw);
}
