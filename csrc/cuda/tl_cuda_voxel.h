/* C ABI of the CUDA voxel kernels (tl_cuda_voxel.cu): voxelize, voxel
 * reduction, devoxel map and gather.
 *
 * Same conventions as tl_cuda.h: ctx first (ctx->device made current for the
 * call, all work on ctx->stream), device pointers owned by torch, scratch in a
 * caller-allocated workspace (256-byte aligned) sized by the matching
 * *_workspace_size function, no allocation in C.
 *
 * Every result equals the CPU function named in each comment (same rows, same
 * order, same tie-breaking), so the CPU core is the reference.  Features may
 * be TL_F32, TL_F64, TL_F16 or TL_BF16; sums accumulate in fp32 (fp64 for
 * TL_F64).  Index tables (inverse, idx) are not validated on the device, since
 * that would cost a synchronization: entries outside their range are skipped,
 * never dereferenced.  They must come from the functions that build them (as
 * the op layer's do).
 *
 * Synchronizations: tl_cuda_voxelize (one: unique count + point check) and
 * tl_cuda_devoxel_map (one: point check + duplicate voxel rows).  Nothing else
 * synchronizes. */
#ifndef TL_CUDA_VOXEL_H
#define TL_CUDA_VOXEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../core/tl_coords.h"
#include "../core/tl_ctx.h"
#include "../core/tl_status.h"
#include "../core/tl_voxel.h"

/* ---- voxelization (tl_cuda_voxel.cu) ---- */

/* Workspace bytes of tl_cuda_voxelize for n points. */
tl_status tl_cuda_voxelize_workspace_size(int64_t n, size_t *bytes);

/* tl_voxel_quantize followed by tl_voxel_unique: uniq (capacity n rows)
 * receives the unique voxel rows sorted by (b, x, y, z), *n_uniq their count
 * and inverse (n int64) the row of uniq of every point.  pts (n, 3) TL_F32
 * or TL_F64, batch NULL or n int64.  A rejected point gives the CPU's status
 * (TL_ERR_INVALID: below origin, not finite, negative batch;
 * TL_ERR_OVERFLOW: beyond int32) with *bad the first such point; outputs are
 * then unspecified.  n must fit int32 (TL_ERR_OVERFLOW). */
tl_status tl_cuda_voxelize(const tl_ctx *ctx, tl_dtype dtype, const void *pts,
                           const int64_t *batch, int64_t n, const tl_voxel_grid *grid,
                           void *workspace, tl_coord *uniq, int64_t *inverse, int64_t *n_uniq,
                           int64_t *bad);

/* Workspace bytes of tl_cuda_voxel_reduce. */
tl_status tl_cuda_voxel_reduce_workspace_size(int64_t n, int64_t m, size_t *bytes);

/* tl_voxel_reduce: out (m, c) from feats (n, c) with voxel inverse[p].  Mean
 * and sum add the points of a voxel in point order (deterministic); max
 * writes argmax (m, c) int64, the first point attaining the maximum (NaN
 * largest).  Empty voxels get 0 (argmax -1). */
tl_status tl_cuda_voxel_reduce(const tl_ctx *ctx, tl_dtype dtype, tl_voxel_reduction red,
                               const void *feats, int64_t n, int64_t c, const int64_t *inverse,
                               int64_t m, void *workspace, void *out, int64_t *argmax);

/* Workspace bytes of tl_cuda_devoxel_map for m voxel rows. */
tl_status tl_cuda_devoxel_map_workspace_size(int64_t m, size_t *bytes);

/* tl_voxel_devoxel_map: idx (n, k) int64 and w (n, k) double, k = 8 when
 * trilinear else 1.  Point errors as in tl_cuda_voxelize (checked first);
 * then TL_ERR_DUPLICATE when vox repeats a row. */
tl_status tl_cuda_devoxel_map(const tl_ctx *ctx, tl_dtype dtype, const void *pts,
                              const int64_t *batch, int64_t n, const tl_voxel_grid *grid,
                              const tl_coord *vox, int64_t m, int trilinear, void *workspace,
                              int64_t *idx, double *w, int64_t *bad);

/* tl_voxel_gather: out (n, c) = sum_j w[p, j] * feats[idx[p, j]] over
 * idx in [0, m); rows with none get 0. */
tl_status tl_cuda_devoxel_gather(const tl_ctx *ctx, tl_dtype dtype, const void *feats,
                                 int64_t m, int64_t c, const int64_t *idx, const double *w,
                                 int64_t n, int64_t k, void *out);

#ifdef __cplusplus
}
#endif

#endif
