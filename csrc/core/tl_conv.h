/* Description of one sparse convolution call, shared by every dataflow and
 * backend.  Feature matrices are row-major: x (n_in, c_in), y (n_out, c_out),
 * weight (k, c_in, c_out), all contiguous. */
#ifndef TL_CONV_H
#define TL_CONV_H

#include <stdint.h>

#include "tl_ctx.h"
#include "tl_status.h"

typedef enum tl_dtype {
    TL_F32 = 0,
    TL_F64 = 1,
    TL_F16 = 2,
    TL_BF16 = 3
} tl_dtype;

/* Bytes per element of a dtype. */
static inline int64_t tl_dtype_bytes(tl_dtype t) {
    return t == TL_F64 ? 8 : t == TL_F32 ? 4 : 2;
}

typedef struct tl_conv_desc {
    tl_dtype dtype;
    int64_t n_in, n_out; /* rows of x and y */
    int64_t k;           /* kernel rows */
    int64_t c_in, c_out; /* channels */
} tl_conv_desc;

/* The CPU forwards' lead kernel row of a kernel of volume k: the middle
 * one where k is odd (an odd cube's centre offset, which on a submanifold
 * map names every output row, itself), else none (-1).  Each output row adds
 * its lead entry's product first, then the others in kernel-row order,
 * whatever the tiling, the threads, the instruction set, the dataflow
 * (implicit GEMM over its table or tile lists, fetch-on-demand,
 * gather-scatter), so those give the same bits; and an implicit GEMM tile
 * whose every row has a lead entry writes its rows there instead of zeroing
 * them first and adding (tl_forward_tile: 1.03-1.14x at C = 16-32 on the
 * 3x3x3 maps of both scenes, where the zeroing was 9% of a C = 16
 * forward). */
static inline int64_t tl_fwd_lead(int64_t k) { return k % 2 ? k / 2 : -1; }

/* The kernel row a forward tile runs i-th (0 <= i < k): the lead one first
 * (tl_fwd_lead), then the others in order. */
static inline int64_t tl_fwd_order(int64_t lead, int64_t i) {
    return lead < 0 ? i : i == 0 ? lead : i <= lead ? i - 1 : i;
}

/* Checks sizes are non-negative, k >= 1, rows fit int32 row indices and
 * every matrix's element count fits int64. */
tl_status tl_conv_desc_check(const tl_conv_desc *d);

/* Checks a CPU call: ctx with >= 1 thread, a valid descriptor
 * (tl_conv_desc_check) and dtype TL_F32 or TL_F64, or also TL_BF16 / TL_F16
 * when the caller's kernels take halves (TL_ERR_UNSUPPORTED otherwise). */
tl_status tl_conv_check_cpu(const tl_ctx *ctx, const tl_conv_desc *d, int halves);

/* Checks the three matrices of a call are present unless empty:
 * forward (weight_grad = 0): x (n_in, c_in), w (k, c_in*c_out), y (n_out, c_out);
 * weight gradient (weight_grad = 1): x, dy (n_out, c_out), dw (k, c_in*c_out). */
tl_status tl_conv_check_buffers(const tl_conv_desc *d, int weight_grad, const void *x,
                                const void *b, const void *out);

#endif
