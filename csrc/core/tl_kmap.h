/* Kernel maps: which input row feeds which output row through which kernel
 * row.
 *
 * Output-stationary neighbour table `nbr`, shape (n_out, K) int32:
 *   nbr[o*K + n] = i   iff   in[i] == out[o] * stride - padding + r_n * dilation
 *                            (same batch), else TL_NO_ROW (-1).
 * Input-stationary table `rev`, shape (n_in, K) int32, is its transpose:
 *   rev[i*K + n] = o   iff   nbr[o*K + n] == i.
 * Each (i, n) pair has at most one o, because o is solved uniquely from i
 * and r_n, so rev is well defined and both tables can be filled without
 * atomics.  A submanifold map is the case stride 1, padding d*(K-1)/2. */
#ifndef TL_KMAP_H
#define TL_KMAP_H

#include "tl_coords.h"
#include "tl_ctx.h"

/* Fills nbr (n_out*K int32).  Input rows must be unique and non-negative
 * (TL_ERR_DUPLICATE / TL_ERR_INVALID); n_in and n_out must not exceed
 * TL_ROW_MAX (TL_ERR_OVERFLOW).  nbr is untouched on failure. */
tl_status tl_kmap_build(const tl_ctx *ctx, const tl_coord *in, int64_t n_in,
                        const tl_coord *out, int64_t n_out, const tl_geom *g,
                        int32_t *nbr);

/* Fills rev (n_in*K int32) from nbr (n_out*K).  TL_ERR_INVALID if nbr holds
 * a row outside [-1, n_in) or maps two outputs onto the same (i, n). */
tl_status tl_kmap_reverse(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out,
                          int64_t k, int64_t n_in, int32_t *rev);

#endif
