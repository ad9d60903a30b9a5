/* Per-kernel-row pair lists (docs/kernel-maps.md), the kernel-map format of
 * the fetch-on-demand and gather-scatter dataflows.
 *
 * CSR by kernel row: offsets (k + 1) int64 with offsets[0] = 0 and
 * offsets[k] = P; kernel row n owns pairs offsets[n] .. offsets[n+1]-1, and
 * pair j says row in[j] of the input feeds row out[j] of the output.  Built
 * from an (n_out, k) neighbour table, so within a kernel row the pairs are
 * sorted by output row and no output row repeats. */
#ifndef TL_PAIRS_H
#define TL_PAIRS_H

#include "tl_ctx.h"
#include "tl_status.h"

#include <stdint.h>

typedef struct tl_pairs {
    int64_t k;
    const int64_t *offsets; /* (k + 1) */
    const int32_t *in;      /* (offsets[k]) */
    const int32_t *out;     /* (offsets[k]) */
} tl_pairs;

/* offsets (k + 1) from nbr (n_out, k): counts of non-negative entries per
 * column, prefix-summed.  TL_ERR_INVALID if an entry is below -1. */
tl_status tl_pairs_count(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out, int64_t k,
                         int64_t *offsets);

/* Fills in/out (offsets[k] each) from nbr and the offsets of tl_pairs_count.
 * TL_ERR_INVALID, with nothing written outside [0, offsets[k]), when the
 * offsets are not a CSR (offsets[0] = 0, non-decreasing) or a kernel row's
 * slots do not match its pair count. */
tl_status tl_pairs_fill(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out, int64_t k,
                        const int64_t *offsets, int32_t *in, int32_t *out);

/* Checks offsets form a CSR over k rows, every pair indexes [0, n_in) x
 * [0, n_out), and outputs strictly increase within a kernel row: no output
 * repeats, which is what lets the dataflows write without atomics. */
tl_status tl_pairs_check(const tl_ctx *ctx, const tl_pairs *p, int64_t n_in, int64_t n_out);

#endif
