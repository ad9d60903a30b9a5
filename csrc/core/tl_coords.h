/* Coordinates and convolution geometry.
 *
 * A coordinate row is four int32 values (batch, x, y, z), all >= 0, stored
 * row-major as an (N, 4) int32 array.  Coordinates are logical grid indices
 * on the tensor's own lattice. */
#ifndef TL_COORDS_H
#define TL_COORDS_H

#include <stddef.h>
#include <stdint.h>

#include "tl_status.h"

#define TL_COORD_MIN 0
#define TL_COORD_MAX INT32_MAX
/* Row indices in kernel maps are int32; -1 marks "no neighbour". */
#define TL_ROW_MAX INT32_MAX
#define TL_NO_ROW (-1)

/* Whether a * b fits int64 for a, b >= 0: every size product (rows x kernel
 * rows, rows x channels) is checked with it before it is formed. */
static inline int tl_mul_fits(int64_t a, int64_t b) { return a == 0 || b <= INT64_MAX / a; }

/* A table of `rows` rows by `k` kernel rows as the C core indexes it: rows
 * and k within TL_ROW_MAX (int32 row indices), so rows * k fits int64. */
static inline tl_status tl_table_check(int64_t rows, int64_t k) {
    if (rows < 0 || k < 1) return TL_ERR_INVALID;
    return rows > TL_ROW_MAX || k > TL_ROW_MAX ? TL_ERR_OVERFLOW : TL_OK;
}

typedef struct tl_coord {
    int32_t b, x, y, z;
} tl_coord;

/* Per-axis geometry of one convolution relation:
 *   input = output * stride - padding + r * dilation,   0 <= r < kernel_size.
 * Kernel row n enumerates (rx, ry, rz) with z fastest. */
typedef struct tl_geom {
    int32_t kernel_size[3];
    int32_t stride[3];
    int32_t padding[3];
    int32_t dilation[3];
} tl_geom;

/* Checks kernel_size, stride, dilation >= 1 and padding >= 0, and that the
 * kernel volume fits TL_ROW_MAX.  On success *volume receives K. */
tl_status tl_geom_check(const tl_geom *g, int64_t *volume);

/* Kernel row n -> per-axis position r (z fastest). */
void tl_geom_position(const tl_geom *g, int64_t n, int32_t r[3]);

/* Output support of a strided (support-generating) convolution.
 *
 * Every q with 0 <= q < out_range per axis such that some kernel row maps it
 * onto a row of `in` (same batch) is written to `out`, unique and sorted by
 * (b, x, y, z).  `out` holds `capacity` rows; *n_out receives the count.
 * Returns TL_ERR_CAPACITY (and *n_out = the needed count is NOT known) when
 * capacity is too small; use tl_coords_generate_bound for a safe capacity. */
tl_status tl_coords_generate(const tl_coord *in, int64_t n_in, const tl_geom *g,
                             const int64_t out_range[3], tl_coord *out,
                             int64_t capacity, int64_t *n_out);

/* Upper bound on the rows tl_coords_generate can produce for n_in inputs. */
tl_status tl_coords_generate_bound(int64_t n_in, const tl_geom *g,
                                   const int64_t out_range[3], int64_t n_batches,
                                   int64_t *bound);

/* Most stride whose residues get a plan (tl_axis_plan_init); wider strides
 * go without one. */
#define TL_PLAN_MAX_STRIDE 64
/* Most targets per input and axis a caller's buffers need for a plan of
 * this width or less (tl_axis_plan_hits writes w entries). */
#define TL_PLAN_MAX_W 64
/* An offset that puts any q below 0 (|Q| < 2^33), so it is never a target. */
#define TL_PLAN_NONE (-((int64_t)1 << 40))

/* Where inputs land along axis a of a geometry, without a division per
 * kernel position: with c + p = Q s + rho (0 <= rho < s), kernel position
 * r lands on a multiple of s exactly when rho - r d is one, at
 * q = Q + (rho - r d) / s.  dq[rho * w ..] holds those offsets for residue
 * rho and r[rho * w ..] their kernel positions, r ascending, then
 * TL_PLAN_NONE up to w, the most any residue has: every input runs the same
 * w steps, without a branch on its residue.  dq == NULL where the axis
 * gets no plan (a stride above TL_PLAN_MAX_STRIDE or a kernel size above
 * TL_PLAN_MAX_W).  shift: log2(s) where s is a
 * power of two (Q and rho without a division), else -1.  Targets are kept
 * below `range`. */
typedef struct tl_axis_plan {
    int64_t s, p, range;
    int w, shift;
    int64_t *dq;
    int32_t *r;
} tl_axis_plan;

tl_status tl_axis_plan_init(tl_axis_plan *pl, const tl_geom *g, int a, int64_t range);
void tl_axis_plan_free(tl_axis_plan *pl);

/* The targets q of coordinate c (c + p >= 0, a plan with dq) and their
 * kernel positions r, in r order; returns how many.  q and r hold w
 * entries (a miss is written and then overwritten: no branch). */
static inline int tl_axis_plan_hits(const tl_axis_plan *pl, int64_t c, int32_t *q, int32_t *r) {
    /* Locals: stores through q and r (int32) may alias the plan's int
     * fields, which the loop would otherwise reload on every step. */
    const int64_t s = pl->s, range = pl->range, v = c + pl->p;
    const int w = pl->w;
    const int64_t Q = pl->shift >= 0 ? v >> pl->shift : v / s;
    const int64_t *dq = pl->dq + (v - Q * s) * w;
    const int32_t *rr = pl->r + (v - Q * s) * w;
    int m = 0;
    for (int j = 0; j < w; j++) {
        const int64_t t = Q + dq[j];
        q[m] = (int32_t)t;
        r[m] = rr[j];
        m += (t >= 0) & (t < range);
    }
    return m;
}

/* Sorts rows by (b, x, y, z) in place.  Rows must be non-negative. */
tl_status tl_coords_sort(tl_coord *rows, int64_t n);

/* 1 if rows[0..n) ascend in (b, x, y, z) order (strictly when `strict`:
 * then they are also unique), else 0. */
int tl_coords_ascending(const tl_coord *rows, int64_t n, int strict);

/* Finds a repeated row: *first_dup = index of the second occurrence of the
 * earliest repeated row, or -1 when all rows are unique.  Also rejects
 * negative coordinates (TL_ERR_INVALID). */
tl_status tl_coords_find_duplicate(const tl_coord *rows, int64_t n,
                                   int64_t *first_dup);

#endif
