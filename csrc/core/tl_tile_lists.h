/* A neighbour table's tile lists, built once and kept with the table: what
 * each implicit GEMM forward tile lists from the table on every call
 * (tl_list_tile: each kernel row's present entries among the tile's rows,
 * in row order), stored one tile after another, so a table that several
 * calls run over (the layers of a network level, a forward and its input
 * gradient's next use) is listed once.  Listing is a fixed cost per call
 * that does not shrink with the channels: about a third of a C = 16 forward
 * on a LiDAR scan.
 *
 * Tile t (output rows [t * tile_rows, ...)) lists kernel row n's entries at
 * [start[t * k + n], start[t * k + n + 1]) of in (the x rows) and rows (the
 * output row - t * tile_rows), the order tl_list_tile gives, so a forward
 * over the lists is bitwise the forward over the table. */
#ifndef TL_TILE_LISTS_H
#define TL_TILE_LISTS_H

#include <stdint.h>

#include "tl_ctx.h"
#include "tl_status.h"

typedef struct tl_tile_lists {
    int64_t tile_rows;    /* rows per tile (the last may have fewer) */
    int64_t top;          /* the largest x row listed + 1 (0 if none) */
    const int64_t *start; /* tiles x k + 1, start[0] = 0 */
    const int32_t *in;    /* start[tiles x k] x rows */
    const int32_t *rows;  /* start[tiles x k] rows within their tile */
} tl_tile_lists;

/* Tiles of tile_rows rows that cover n_out rows. */
static inline int64_t tl_tile_lists_tiles(int64_t n_out, int64_t tile_rows) {
    return tile_rows > 0 ? (n_out + tile_rows - 1) / tile_rows : 0;
}

/* Tile t's lists: kernel row n's cnt[n] entries, x rows at il[n] and rows
 * within the tile at rl[n] (k of each), read in place. */
static inline void tl_tile_lists_of(const tl_tile_lists *lists, int64_t t, int64_t k,
                                    const int32_t **il, const int32_t **rl, int64_t *cnt) {
    const int64_t *at = lists->start + t * k;
    for (int64_t n = 0; n < k; n++) {
        cnt[n] = at[n + 1] - at[n];
        il[n] = lists->in + at[n];
        rl[n] = lists->rows + at[n];
    }
}

/* Fills start (tiles x k + 1) from the (n_out, k) table nbr, and *top (see
 * tl_tile_lists).  TL_ERR_INVALID where an entry is below -1 or tile_rows
 * below 1. */
tl_status tl_tile_lists_count(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out, int64_t k,
                              int64_t tile_rows, int64_t *start, int64_t *top);

/* Fills in and rows (start[tiles x k] each) from nbr and the start and top
 * of tl_tile_lists_count.  TL_ERR_INVALID, with nothing written outside
 * [0, start[tiles x k]), where a tile's lists do not match start or name a
 * row at or above top (the table changed in between: the kernels over the
 * lists trust top, checked against their rows once). */
tl_status tl_tile_lists_fill(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out, int64_t k,
                             int64_t tile_rows, const int64_t *start, int64_t top, int32_t *in,
                             int32_t *rows);

#endif
