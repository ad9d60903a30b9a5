#include "tl_dataflow_implicit_gemm.h"

#include <stdlib.h>
#include <string.h>

#include "tl_mem.h"
#include "tl_simd.h"

/* Forward tiles (see tl_fwd_tile_rows): output block bytes to aim for, so
 * the tile's output rows stay in L2; bounds on its rows; and the fewest
 * tiles each thread should get, for load balance. */
#define TL_TILE_BYTES (64 * 1024)
#define TL_TILE_ROWS_MIN 32
#define TL_TILE_ROWS_MAX 256
#define TL_TILES_PER_THREAD 8
/* Output columns per tile: wider layers are split so a tile's output rows
 * stay cache-resident.  A multiple of every micro-kernel's block width (4 to
 * 64 columns, 3 x 2^i with AVX2), so a tile's weight panels start where the
 * packed ones do (see tl_panel_cols). */
#define TL_TILE_COLS 384
/* Weight gradient: the output rows are split into up to TL_WGRAD_PARTS parts
 * (each with its own (k, c_in, c_out) partial sum), fewer when the partial
 * sums would exceed TL_WGRAD_MAX_PARTIAL elements or a part would get under
 * TL_WGRAD_MIN_ROWS rows; kernel rows are split into groups until there are
 * about TL_WGRAD_TASKS tasks.  Few parts keep the final reduction of the
 * partial sums small.  The split depends only on the problem size, never on
 * the thread count, so the result is the same for any thread count. */
#define TL_WGRAD_PARTS 8
#define TL_WGRAD_TASKS 32
#define TL_WGRAD_MIN_ROWS 1024
#define TL_WGRAD_MAX_PARTIAL (1 << 22)
/* Weight-gradient output rows per block: for each kernel row, a block's pairs
 * are reduced in register-blocked passes while their x and dy rows stay in
 * L1/L2 across the passes. */
#define TL_WGRAD_PAIRS 256
/* Input channels from which the weight gradient packs each block's x values
 * (tl_wgrad_pack + the panel micro-kernel): measured 1.2x to 1.5x faster at
 * C = 64..256 with AVX2, but 0.7x to 0.9x at C <= 33, where the copy costs
 * more than the pointer-chasing loads it saves; below it the rows are read in
 * place (tl_mk_outer_acc). */
#define TL_WGRAD_PACK_MIN_CIN 64

/* Bytes of weights a forward panel holds (see tl_pack_weight_panels): about
 * half of a 32 KiB L1, leaving room for the x and y rows of a group. */
#define TL_PANEL_BYTES (16 * 1024)

/* Output columns per forward weight panel: all of them when the kernel row's
 * weights fit in TL_PANEL_BYTES (and one column tile); otherwise the widest
 * multiple of the micro-kernel's block width that divides TL_TILE_COLS and
 * fits (at least one block), so every tile starts on a panel. */
static int64_t tl_panel_cols(const tl_conv_desc *d, int64_t block_cols, int64_t elem_bytes) {
    const int64_t row_bytes = (d->c_in > 0 ? d->c_in : 1) * elem_bytes;
    if (d->c_out <= TL_TILE_COLS && d->c_out * row_bytes <= TL_PANEL_BYTES) return d->c_out;
    int64_t cols = block_cols;
    for (int64_t c = block_cols; c <= TL_TILE_COLS && c * row_bytes <= TL_PANEL_BYTES; c += block_cols)
        if (TL_TILE_COLS % c == 0) cols = c;
    return cols;
}

/* Number of output-row parts of the weight gradient (see TL_WGRAD_PARTS). */
static int64_t tl_wgrad_parts(const tl_conv_desc *d) {
    int64_t parts = TL_WGRAD_PARTS;
    int64_t by_rows = (d->n_out + TL_WGRAD_MIN_ROWS - 1) / TL_WGRAD_MIN_ROWS;
    if (parts > by_rows) parts = by_rows;
    int64_t all = d->k * d->c_in * d->c_out;
    if (all > 0 && parts * all > TL_WGRAD_MAX_PARTIAL) parts = TL_WGRAD_MAX_PARTIAL / all;
    return parts < 1 ? 1 : parts;
}

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
    tl_status st = tl_conv_check_cpu(ctx, d);
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
    tl_mem_prefer_huge(y, d->n_out * d->c_out * tl_dtype_bytes(d->dtype));
    if (d->dtype == TL_F32) return tl_forward_f32(ctx, d, x, w, nbr, y);
    return tl_forward_f64(ctx, d, x, w, nbr, y);
}

tl_status tl_implicit_gemm_weight_grad(const tl_ctx *ctx, const tl_conv_desc *d,
                                       const void *x, const void *dy,
                                       const int32_t *nbr, void *dw) {
    tl_status st = tl_check_args(ctx, d, 1, x, dy, nbr, dw, 1);
    if (st != TL_OK) return st;
    if (d->k * d->c_in * d->c_out == 0) return TL_OK;
    if (d->dtype == TL_F32) return tl_weight_grad_f32(ctx, d, x, dy, nbr, dw);
    return tl_weight_grad_f64(ctx, d, x, dy, nbr, dw);
}
