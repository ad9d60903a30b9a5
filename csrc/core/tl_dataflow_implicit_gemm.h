/* Implicit-GEMM dataflow on the CPU: output-stationary over the (n_out, K)
 * neighbour table of tl_kmap.h.  Each thread owns a tile of output rows, so
 * results are written without atomics and are independent of the thread
 * count.
 *
 * The input gradient is the same forward call on the transposed relation:
 *   dx = forward(dy, weight^T (k, c_out, c_in), rev)
 * where rev is the input-stationary table, so no separate kernel exists. */
#ifndef TL_DATAFLOW_IMPLICIT_GEMM_H
#define TL_DATAFLOW_IMPLICIT_GEMM_H

#include "tl_conv.h"
#include "tl_pairs.h"
#include "tl_tile_lists.h"

#include <stdint.h>

/* y[o] = sum_n x[nbr[o, n]] @ w[n]; y (n_out, c_out) is overwritten.
 * dtype TL_F32, TL_F64, or TL_BF16 / TL_F16 (x, w and y all of it; sums in
 * float, each output rounded once). */
tl_status tl_implicit_gemm_forward(const tl_ctx *ctx, const tl_conv_desc *d,
                                   const void *x, const void *w,
                                   const int32_t *nbr, void *y);

/* Rows per tile of a forward that can run over a table's tile lists
 * (tl_tile_lists.h), for lists built with that many rows per tile; 0 where
 * the forward lists each tile itself (TL_F32 and TL_F64 outputs wider than
 * 256 bytes, whose tiles keep each row's first entry apart).  Depends on the
 * thread count. */
int64_t tl_implicit_gemm_list_rows(const tl_ctx *ctx, const tl_conv_desc *d);

/* tl_implicit_gemm_forward over the table nbr's tile lists, built with
 * tl_implicit_gemm_list_rows(ctx, d) rows per tile (checked here, the one
 * place: else TL_ERR_INVALID, as where the lists name an x row at or past
 * n_in): bitwise its result, without listing the table (the half types'
 * rerun through the float kernels after an infinity or NaN on AMX lists nbr
 * where its tiles differ). */
tl_status tl_implicit_gemm_forward_listed(const tl_ctx *ctx, const tl_conv_desc *d,
                                          const void *x, const void *w, const int32_t *nbr,
                                          const tl_tile_lists *lists, void *y);

/* The same output-stationary tiles over per-kernel-row pair lists sorted by
 * output row (the fetch-on-demand forward, tl_dataflow_pairs.c): each tile
 * takes its run of every kernel row's pairs (found by one walk through each
 * kernel row per call) instead of listing the table.  TL_F32 or TL_F64; arguments and pairs already checked
 * (tl_pairs_check); y is overwritten.  Bitwise the result of
 * tl_implicit_gemm_forward over the table the pairs were built from. */
tl_status tl_implicit_gemm_forward_pairs(const tl_ctx *ctx, const tl_conv_desc *d, const void *x,
                                         const void *w, const tl_pairs *p, void *y);

/* Rows per block of the weight gradient (tl_wgrad_block_rows): it runs over
 * tile lists whose tile rows divide this; 0 for the half types, which list
 * the table. */
int64_t tl_implicit_gemm_weight_grad_list_rows(const tl_ctx *ctx, const tl_conv_desc *d);

/* tl_implicit_gemm_weight_grad (TL_F32 or TL_F64; else TL_ERR_INVALID, as
 * where the lists name an x row at or past n_in) over the table nbr's tile
 * lists where their tile rows divide tl_implicit_gemm_weight_grad_list_rows
 * (each block is whole tiles), else over nbr: bitwise its result either way. */
tl_status tl_implicit_gemm_weight_grad_listed(const tl_ctx *ctx, const tl_conv_desc *d,
                                              const void *x, const void *dy,
                                              const int32_t *nbr, const tl_tile_lists *lists,
                                              void *dw);

/* The same weight gradient over per-kernel-row pair lists sorted by output
 * row (the fetch-on-demand weight gradient, tl_dataflow_pairs.c): each
 * block of output rows takes its run of every kernel row's pairs instead of
 * listing the table.  TL_F32 or TL_F64; arguments and pairs already checked
 * (tl_pairs_check); dw is overwritten.  Bitwise the result of
 * tl_implicit_gemm_weight_grad over the table the pairs were built from. */
tl_status tl_implicit_gemm_weight_grad_pairs(const tl_ctx *ctx, const tl_conv_desc *d,
                                             const void *x, const void *dy, const tl_pairs *p,
                                             void *dw);

/* The TL_BF16 / TL_F16 forward behind tl_implicit_gemm_forward (arguments
 * already checked; tl_dataflow_implicit_gemm_half.c), over nbr's checked
 * tile lists where given and of its tiles. */
tl_status tl_implicit_gemm_forward_half(const tl_ctx *ctx, const tl_conv_desc *d,
                                        const uint16_t *x, const uint16_t *w,
                                        const int32_t *nbr, const tl_tile_lists *lists,
                                        uint16_t *y);

/* Output rows per tile of the TL_BF16 / TL_F16 forward. */
int64_t tl_implicit_gemm_half_tile_rows(const tl_ctx *ctx, const tl_conv_desc *d);

/* The TL_BF16 / TL_F16 weight gradient behind tl_implicit_gemm_weight_grad
 * (arguments already checked). */
tl_status tl_implicit_gemm_weight_grad_half(const tl_ctx *ctx, const tl_conv_desc *d,
                                            const uint16_t *x, const uint16_t *dy,
                                            const int32_t *nbr, uint16_t *dw);

/* dw[n] = sum_o x[nbr[o, n]]^T dy[o]; dw (k, c_in, c_out) is overwritten.
 * Partial sums are taken over a fixed partition of the output rows and added
 * in a fixed order, so the result is deterministic.  dtype TL_F32, TL_F64,
 * or TL_BF16 / TL_F16 (float sums, rounded once). */
tl_status tl_implicit_gemm_weight_grad(const tl_ctx *ctx, const tl_conv_desc *d,
                                       const void *x, const void *dy,
                                       const int32_t *nbr, void *dw);

#endif
