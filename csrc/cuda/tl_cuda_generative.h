/* C ABI of the CUDA generative support (tl_cuda_generative.cu).
 *
 * Same conventions as tl_cuda.h: ctx first, device pointers owned by torch,
 * scratch in a caller-allocated workspace (256-byte aligned) sized by
 * tl_cuda_generative_workspace_size, no allocation in C.  One synchronization
 * (row count + row check).  The result equals tl_generative_support's. */
#ifndef TL_CUDA_GENERATIVE_H
#define TL_CUDA_GENERATIVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../core/tl_coords.h"
#include "../core/tl_ctx.h"
#include "../core/tl_status.h"

/* ---- generative support (tl_cuda_generative.cu) ---- */

/* Workspace bytes of tl_cuda_generative_support. */
tl_status tl_cuda_generative_workspace_size(int64_t n_in, const tl_geom *g, size_t *bytes);

/* tl_generative_support: unique{in * stride + r}, sorted by (b, x, y, z),
 * written to out (capacity rows; n_in * K suffices), *n_out the count.
 * TL_ERR_INVALID when padding != 0, dilation != 1 or a row is negative,
 * TL_ERR_OVERFLOW when a generated row passes INT32_MAX (the first offending
 * input row decides, as on the CPU), TL_ERR_CAPACITY when out is too small.
 * n_in * K must fit int32 (TL_ERR_OVERFLOW). */
tl_status tl_cuda_generative_support(const tl_ctx *ctx, const tl_coord *in, int64_t n_in,
                                     const tl_geom *g, void *workspace, tl_coord *out,
                                     int64_t capacity, int64_t *n_out);

#ifdef __cplusplus
}
#endif

#endif
