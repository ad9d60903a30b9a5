/* Voxelization: points -> unique voxel rows, per-voxel reductions, and the
 * point-to-voxel maps of devoxelization.
 *
 * Points are row-major (n, 3) float32 or float64 in world units.  A point p
 * of batch b falls in voxel (b, floor((p - origin) / size)) per axis.  Voxel
 * rows are tl_coord (b, x, y, z) and must be non-negative.  Every function
 * validates its arguments before writing anything. */
#ifndef TL_VOXEL_H
#define TL_VOXEL_H

#include "tl_conv.h"
#include "tl_coords.h"
#include "tl_ctx.h"

/* Reductions of tl_voxel_reduce. */
typedef enum tl_voxel_reduction {
    TL_VOXEL_MEAN = 0,
    TL_VOXEL_SUM = 1,
    TL_VOXEL_MAX = 2
} tl_voxel_reduction;

/* Geometry of a voxel grid: cell edge (> 0, finite) and origin per axis. */
typedef struct tl_voxel_grid {
    double size[3];
    double origin[3];
} tl_voxel_grid;

/* Voxel row of every point: rows[p] = (batch[p], floor((pts[p] - origin) / size)).
 *
 * `batch` is NULL (all 0) or n non-negative int64 values fitting int32.
 * Fails with TL_ERR_INVALID when a point lies below the origin or is not
 * finite, or a batch index is negative, and with TL_ERR_OVERFLOW when a
 * coordinate exceeds INT32_MAX; *bad (may be NULL) then receives the index
 * of the first offending point.  rows is untouched on failure. */
tl_status tl_voxel_quantize(const tl_ctx *ctx, tl_dtype dtype, const void *pts,
                            const int64_t *batch, int64_t n, const tl_voxel_grid *grid,
                            tl_coord *rows, int64_t *bad);

/* Unique rows sorted by (b, x, y, z) and the inverse map.
 *
 * `uniq` holds at least n rows; *n_uniq receives the unique count and
 * inverse[p] (n int64) the row of uniq equal to rows[p].  Rows must be
 * non-negative (TL_ERR_INVALID). */
tl_status tl_voxel_unique(const tl_ctx *ctx, const tl_coord *rows, int64_t n, tl_coord *uniq,
                          int64_t *n_uniq, int64_t *inverse);

/* Reduces point features into voxels: out (m, c) from feats (n, c), where
 * point p belongs to voxel inverse[p] in [0, m).
 *
 * MEAN and SUM accumulate in double in point order (deterministic); MAX
 * writes argmax (m, c) int64, the first point attaining the maximum (NaN
 * counts as largest), and needs argmax != NULL.  Voxels without points get
 * 0 (argmax -1).  dtype TL_F32 or TL_F64. */
tl_status tl_voxel_reduce(const tl_ctx *ctx, tl_dtype dtype, tl_voxel_reduction red,
                          const void *feats, int64_t n, int64_t c, const int64_t *inverse,
                          int64_t m, void *out, int64_t *argmax);

/* Devoxelization map from points to the voxel rows `vox` (m unique rows).
 *
 * trilinear == 0 (nearest): idx (n, 1) holds the row of the point's own
 * voxel or -1 when absent; w (n, 1) holds 1 where present, 0 otherwise.
 * trilinear != 0: with u = (p - origin) / size - 0.5, the 8 corners
 * floor(u) + {0, 1}^3 (x slowest, z fastest) get the weights
 * prod(frac or 1 - frac); idx (n, 8) is the corner's row or -1 (absent,
 * negative or beyond int32), and w (n, 8) the weight, 0 for absent corners
 * (weights are not renormalized).  Points below the origin: TL_ERR_INVALID
 * with *bad set, as in tl_voxel_quantize. */
tl_status tl_voxel_devoxel_map(const tl_ctx *ctx, tl_dtype dtype, const void *pts,
                               const int64_t *batch, int64_t n, const tl_voxel_grid *grid,
                               const tl_coord *vox, int64_t m, int trilinear, int64_t *idx,
                               double *w, int64_t *bad);

/* out[p] = sum_j w[p, j] * feats[idx[p, j]] over the k columns with
 * idx >= 0: out (n, c), feats (m, c), idx and w (n, k).  Rows with no
 * present column get 0.  dtype TL_F32 or TL_F64; idx must lie in [-1, m). */
tl_status tl_voxel_gather(const tl_ctx *ctx, tl_dtype dtype, const void *feats, int64_t m,
                          int64_t c, const int64_t *idx, const double *w, int64_t n, int64_t k,
                          void *out);

#endif
