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
