/* C ABI of the CUDA pooling kernels (tl_cuda_pool.cu).
 *
 * Same conventions as tl_cuda.h (ctx first, device pointers owned by torch,
 * no allocation in C); no workspace and no synchronization.  Index tables
 * (nbr, rev, argmax) are not validated on the device: entries outside their
 * range are skipped, never dereferenced. */
#ifndef TL_CUDA_POOL_H
#define TL_CUDA_POOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../core/tl_ctx.h"
#include "../core/tl_pool.h"
#include "../core/tl_status.h"

/* ---- pooling (tl_cuda_pool.cu): tl_pool_sum, tl_pool_max,
 *      tl_pool_max_backward on the device, one thread per (row, channel),
 *      kernel rows in order, so results match the CPU's bit for bit in fp32
 *      and fp64 and no atomics are used. ---- */

tl_status tl_cuda_pool_sum(const tl_ctx *ctx, const tl_pool_desc *d, const void *x,
                           const int32_t *nbr, int average, void *y);
tl_status tl_cuda_pool_max(const tl_ctx *ctx, const tl_pool_desc *d, const void *x,
                           const int32_t *nbr, void *y, int32_t *argmax);
tl_status tl_cuda_pool_max_backward(const tl_ctx *ctx, const tl_pool_desc *d, const void *dy,
                                    const int32_t *rev, const int32_t *argmax, void *dx);

#ifdef __cplusplus
}
#endif

#endif
