#include "tl_dataflow_implicit_gemm.h"

#include <stdlib.h>
#include <string.h>

#include "tl_dataflow_implicit_gemm_tiles.h"
#include "tl_mem.h"
#include "tl_simd.h"

#define TL_T float
#define TL_SFX f32
#include "tl_dataflow_implicit_gemm_impl.h"
#undef TL_T
#undef TL_SFX

#define TL_T double
#define TL_SFX f64
#include "tl_dataflow_implicit_gemm_impl.h"
#undef TL_T
#undef TL_SFX

/* Rejects neighbour entries outside [-1, n_in) before any kernel reads them. */
static tl_status tl_check_nbr(const tl_ctx *ctx, const int32_t *nbr, int64_t count,
                              int64_t n_in) {
    int bad = 0;
#pragma omp parallel for num_threads(ctx->threads) schedule(static) reduction(| : bad)
    for (int64_t j = 0; j < count; j++) bad |= nbr[j] < -1 || nbr[j] >= n_in;
    return bad ? TL_ERR_INVALID : TL_OK;
}

/* Checks a call's arguments; the neighbour entries only when scan_nbr (the
 * forward checks them while it lists them). */
static tl_status tl_check_args(const tl_ctx *ctx, const tl_conv_desc *d, int weight_grad,
                               const void *x, const void *b, const int32_t *nbr,
                               const void *out, int scan_nbr) {
    tl_status st = tl_conv_check_cpu(ctx, d, 1); /* implicit GEMM runs the half types */
    if (st == TL_OK) st = tl_conv_check_buffers(d, weight_grad, x, b, out);
    if (st != TL_OK) return st;
    if (!nbr && d->n_out * d->k > 0) return TL_ERR_INVALID;
    return scan_nbr ? tl_check_nbr(ctx, nbr, d->n_out * d->k, d->n_in) : TL_OK;
}

tl_status tl_implicit_gemm_forward(const tl_ctx *ctx, const tl_conv_desc *d,
                                   const void *x, const void *w,
                                   const int32_t *nbr, void *y) {
    tl_status st = tl_check_args(ctx, d, 0, x, w, nbr, y, 0);
    if (st != TL_OK) return st;
    if (d->n_out * d->c_out == 0) return tl_check_nbr(ctx, nbr, d->n_out * d->k, d->n_in);
    const tl_fwd_rel rel = {nbr, NULL, NULL, 0, NULL};
    if (d->dtype == TL_F32) return tl_forward_f32(ctx, d, x, w, &rel, y);
    if (d->dtype == TL_F64) return tl_forward_f64(ctx, d, x, w, &rel, y);
    return tl_implicit_gemm_forward_half(ctx, d, x, w, nbr, NULL, y);
}

int64_t tl_implicit_gemm_list_rows(const tl_ctx *ctx, const tl_conv_desc *d) {
    if (d->n_out * d->c_out * d->k == 0) return 0;
    if (d->dtype == TL_BF16 || d->dtype == TL_F16) /* never split */
        return tl_implicit_gemm_half_tile_rows(ctx, d);
    const int64_t elem = d->dtype == TL_F32 ? 4 : d->dtype == TL_F64 ? 8 : 0;
    /* Up to 256 bytes an output row (C_out <= 64 in fp32).  Over 128 a tile
     * listed from the table splits each kernel row's first entries from the
     * rest, so rows need no zeroing (tl_forward_tile); over lists the tile is
     * zeroed instead: against the split listing, on the AMD EPYC of round
     * twenty-six, 1.07-1.11x at C = 40-48 and 1.02-1.03x at 64 on the LiDAR
     * scan, 1.01-1.05x at 40-48 and 0.98-0.99x at 64 on the surface; at
     * C = 128 0.98-0.99x on both. */
    if (elem == 0 || d->c_out * elem > 256) return 0;
    return tl_fwd_tile_rows(ctx, d, elem);
}

tl_status tl_implicit_gemm_forward_listed(const tl_ctx *ctx, const tl_conv_desc *d,
                                          const void *x, const void *w, const int32_t *nbr,
                                          const tl_tile_lists *lists, void *y) {
    tl_status st = tl_check_args(ctx, d, 0, x, w, nbr, y, 0);
    if (st != TL_OK) return st;
    if (!lists || lists->top > d->n_in || lists->tile_rows != tl_implicit_gemm_list_rows(ctx, d))
        return TL_ERR_INVALID;
    const tl_fwd_rel rel = {NULL, NULL, NULL, 0, lists};
    if (d->dtype == TL_F32) return tl_forward_f32(ctx, d, x, w, &rel, y);
    if (d->dtype == TL_F64) return tl_forward_f64(ctx, d, x, w, &rel, y);
    return tl_implicit_gemm_forward_half(ctx, d, x, w, nbr, lists, y);
}

tl_status tl_implicit_gemm_forward_pairs(const tl_ctx *ctx, const tl_conv_desc *d, const void *x,
                                         const void *w, const tl_pairs *p, void *y) {
    const tl_fwd_rel rel = {NULL, p, NULL, 0, NULL};
    if (d->dtype == TL_F32) return tl_forward_f32(ctx, d, x, w, &rel, y);
    if (d->dtype == TL_F64) return tl_forward_f64(ctx, d, x, w, &rel, y);
    return TL_ERR_UNSUPPORTED;
}

tl_status tl_implicit_gemm_weight_grad(const tl_ctx *ctx, const tl_conv_desc *d,
                                       const void *x, const void *dy,
                                       const int32_t *nbr, void *dw) {
    /* The kernels check the table as they read it (tl_wgrad_list_block,
     * TL_WGRAD_LIST); an empty product reads none of it. */
    const int empty = d->k * d->c_in * d->c_out == 0;
    tl_status st = tl_check_args(ctx, d, 1, x, dy, nbr, dw, empty);
    if (st != TL_OK || empty) return st;
    if (d->dtype == TL_F32) return tl_weight_grad_f32(ctx, d, x, dy, nbr, NULL, NULL, dw);
    if (d->dtype == TL_F64) return tl_weight_grad_f64(ctx, d, x, dy, nbr, NULL, NULL, dw);
    return tl_implicit_gemm_weight_grad_half(ctx, d, x, dy, nbr, dw);
}

int64_t tl_implicit_gemm_weight_grad_list_rows(const tl_ctx *ctx, const tl_conv_desc *d) {
    (void)ctx; /* the blocks do not depend on the thread count */
    return d->dtype == TL_F32 || d->dtype == TL_F64 ? tl_wgrad_block_rows(d) : 0;
}

tl_status tl_implicit_gemm_weight_grad_listed(const tl_ctx *ctx, const tl_conv_desc *d,
                                              const void *x, const void *dy,
                                              const int32_t *nbr, const tl_tile_lists *lists,
                                              void *dw) {
    if (d->dtype != TL_F32 && d->dtype != TL_F64) return TL_ERR_INVALID;
    const int empty = d->k * d->c_in * d->c_out == 0;
    tl_status st = tl_check_args(ctx, d, 1, x, dy, nbr, dw, empty);
    if (st != TL_OK || empty) return st;
    if (!lists || lists->top > d->n_in) return TL_ERR_INVALID;
    return d->dtype == TL_F32 ? tl_weight_grad_f32(ctx, d, x, dy, nbr, NULL, lists, dw)
                              : tl_weight_grad_f64(ctx, d, x, dy, nbr, NULL, lists, dw);
}

tl_status tl_implicit_gemm_weight_grad_pairs(const tl_ctx *ctx, const tl_conv_desc *d,
                                             const void *x, const void *dy, const tl_pairs *p,
                                             void *dw) {
    if (d->dtype == TL_F32) return tl_weight_grad_f32(ctx, d, x, dy, NULL, p, NULL, dw);
    if (d->dtype == TL_F64) return tl_weight_grad_f64(ctx, d, x, dy, NULL, p, NULL, dw);
    return TL_ERR_UNSUPPORTED;
}
