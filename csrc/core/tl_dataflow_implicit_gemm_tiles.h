/* How the implicit GEMM cuts its work (shared by the float kernels of
 * tl_dataflow_implicit_gemm.c and the half-precision ones of
 * tl_dataflow_implicit_gemm_half.c): the forward's output tiles of rows x
 * columns and the width of the L1-sized weight panels each tile's groups of
 * rows run against; the weight gradient's parts, tasks and pair blocks. */
#ifndef TL_DATAFLOW_IMPLICIT_GEMM_TILES_H
#define TL_DATAFLOW_IMPLICIT_GEMM_TILES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tl_conv.h"
#include "tl_list.h"
#include "tl_mem.h"
#include "tl_pairs.h"
#include "tl_simd.h"
#include "tl_tile_lists.h"

/* Forward tiles (see tl_fwd_tile_rows): output block bytes to aim for, an
 * eighth of the core's L2 and at least 128 KiB (tl_fwd_tile_bytes), so the
 * tile's output rows stay in L2 beside the x rows its lists name; bounds on
 * its rows; and the fewest
 * tiles each thread should get, for load balance.  Narrow layers reach the
 * largest tiles: 1024 rows of C = 16 give each kernel row of a sparse map
 * more neighbours per tile than 256 did, so fewer short and padded groups
 * (1.05-1.45x at C = 16, 1.02-1.29x at C = 32).  On a 1 MiB L2, 128 KiB
 * blocks instead of 64 KiB ran 1.00-1.19x (most on the strided and
 * transposed maps) and 256 KiB 0.97-1.06x more.  2048 rows at most instead
 * of 1024 (C <= 16 in fp32 on a 1 MiB L2), on the AMD EPYC of round
 * twenty-six: listing the table 0.98-1.09x at C = 8-16 (the LiDAR scan's
 * maps 1.05-1.09x), fetch-on-demand 1.00-1.07x, over tile lists 0.99-1.04x
 * in fp32 and 1.00-1.05x in bf16 and fp16.  At least 128 KiB (a quarter of
 * a 512 KiB L2) instead of 64 KiB, on the AVX2-only AMD EPYC (Zen 1) of round
 * thirty-five: 0.98-1.07x, median 1.02x, over the forward's submanifold and
 * stride-2 maps at C = 16-256. */
#define TL_TILE_BYTES_MIN (128 * 1024)
#define TL_TILE_BYTES_MAX (256 * 1024)
#define TL_TILE_ROWS_MIN 32
#define TL_TILE_ROWS_MAX 2048
#define TL_TILES_PER_THREAD 8
/* Tiles per thread where a tile's weights outgrow half the L2 (C = 128 and
 * up on 3x3x3 maps; the half types count 4 bytes a weight, as staged): every
 * tile streams all of them from L3, so on coarse levels of a network (a few
 * hundred to a few thousand rows) 8 tiles a thread read them 16 times over
 * for little work each (fp32 1.04-1.46x at 457-1,817 rows, C = 128 and 256;
 * bf16 1.05-1.37x; one tile a thread lost 0.92x at 1,700 rows to load
 * imbalance). */
#define TL_TILES_PER_THREAD_WIDE 2
/* Most bytes of neighbour lists (8 a listed pair: k x rows of them) that a
 * forward tile or a weight-gradient block may need per thread: kernels of
 * many offsets (a 7x7x7 kernel has 343, a generative 32^3 one 32768) get
 * fewer rows instead of lists of hundreds of megabytes. */
#define TL_LIST_BYTES (2 << 20)
/* Output columns per tile: wider layers are split so a tile's output rows
 * stay cache-resident.  A multiple of every micro-kernel's block width (4 to
 * 64 columns, 3 x 2^i with AVX2), so a tile's weight panels start where the
 * packed ones do (see tl_panel_cols). */
#define TL_TILE_COLS 384
/* Bytes of weights a forward panel holds (see tl_pack_panels): about
 * half of a 32 KiB L1, leaving room for the x and y rows of a group. */
#define TL_PANEL_BYTES (16 * 1024)
/* Input channels per pass of a forward group over its weight panel: wider
 * layers run the panel in blocks of this many rows, adding each block's sums
 * to the output rows in turn, so the block (64 columns x 128 channels of
 * fp32, 32 KiB) stays in L1 while a group's rows pass it; a whole panel of
 * C_in = 256 (64 KiB) was read from L2 for every group (1.06-1.10x at
 * C = 256).  A constant, not a function of the instruction set's panel width,
 * so every instruction set adds the same partial sums. */
#define TL_FWD_CIN_BLOCK 128

/* Output columns per forward weight panel: all of them when the kernel row's
 * weights fit in TL_PANEL_BYTES (and one column tile); otherwise the widest
 * multiple of the micro-kernel's block width that divides TL_TILE_COLS and
 * fits (at least one block), so every tile starts on a panel.  (Halving
 * C = 96 into two panels of 48 columns, each 8 rows of 3 vectors, ran
 * 0.96-1.02x of 64 + 32.) */
static inline int64_t tl_panel_cols(const tl_conv_desc *d, int64_t block_cols, int64_t elem_bytes) {
    const int64_t row_bytes = (d->c_in > 0 ? d->c_in : 1) * elem_bytes;
    if (d->c_out <= TL_TILE_COLS && d->c_out * row_bytes <= TL_PANEL_BYTES) return d->c_out;
    int64_t cols = block_cols;
    for (int64_t c = block_cols; c <= TL_TILE_COLS && c * row_bytes <= TL_PANEL_BYTES; c += block_cols)
        if (TL_TILE_COLS % c == 0) cols = c;
    return cols;
}

/* Output block bytes of a forward tile: an eighth of the L2, within
 * [TL_TILE_BYTES_MIN, TL_TILE_BYTES_MAX] (the minimum where the C library
 * does not say).  Any tiling gives the same sums (see tl_forward_tile). */
static inline int64_t tl_fwd_tile_bytes(void) {
    const int64_t b = tl_mem_l2_bytes() / 8;
    return b < TL_TILE_BYTES_MIN ? TL_TILE_BYTES_MIN : b > TL_TILE_BYTES_MAX ? TL_TILE_BYTES_MAX : b;
}

/* Output rows per forward tile for output blocks of acc_bytes per element:
 * as many as keep the tile's output block near tl_fwd_tile_bytes() (more rows give
 * each kernel row more neighbours per tile, so fewer padded groups), within
 * [TL_TILE_ROWS_MIN, TL_TILE_ROWS_MAX], few enough that every thread gets
 * several tiles (TL_TILES_PER_THREAD, or TL_TILES_PER_THREAD_WIDE for wide
 * weights) and that the tile's lists fit TL_LIST_BYTES. */
static inline int64_t tl_fwd_tile_rows(const tl_ctx *ctx, const tl_conv_desc *d,
                                       int64_t acc_bytes) {
    int64_t cw = d->c_out < TL_TILE_COLS ? d->c_out : TL_TILE_COLS;
    int64_t rows = tl_fwd_tile_bytes() / ((cw > 0 ? cw : 1) * acc_bytes);
    const int64_t weights = d->k * d->c_in * cw * acc_bytes; /* read by every tile */
    const int64_t per =
        weights > tl_mem_l2_bytes() / 2 ? TL_TILES_PER_THREAD_WIDE : TL_TILES_PER_THREAD;
    int64_t spread = d->n_out / (per * (int64_t)ctx->threads);
    int64_t listed = TL_LIST_BYTES / (8 * (d->k > 0 ? d->k : 1));
    if (rows > spread) rows = spread;
    if (rows > listed) rows = listed;
    if (rows > TL_TILE_ROWS_MAX) rows = TL_TILE_ROWS_MAX;
    return rows < TL_TILE_ROWS_MIN ? TL_TILE_ROWS_MIN : rows;
}

/* Weight gradient: the output rows are split into up to TL_WGRAD_PARTS parts
 * (each with its own (k, c_in, c_out) partial sum), fewer when the partial
 * sums would exceed TL_WGRAD_MAX_PARTIAL elements or a part would get under
 * TL_WGRAD_MIN_ROWS rows; kernel rows are split into groups until there are
 * about TL_WGRAD_TASKS tasks.  Few parts keep the final reduction of the
 * partial sums small.  Where TL_WGRAD_TASKS parts have enough rows and their
 * partial sums stay within TL_WGRAD_SMALL_PARTIAL elements (narrow layers),
 * or within TL_WGRAD_MAX_PARTIAL on maps of TL_WGRAD_WIDE_K or more kernel
 * rows, there are that many parts and no groups: a task with every kernel row
 * lists each block of its rows once for all of them (tl_list_tile, which also
 * checks the entries; a group's task lists the same block for its own few,
 * see tl_wgrad_split.listed), and reuses the block's x rows across all of
 * them (1.2-1.8x at C = 16-32; 1.02-1.35x at C = 48-64 on 3x3x3 maps, when
 * groups still read a column of the table per kernel row, a cache line per
 * entry; on k2 s2 maps the larger reduction cost as much as the listing
 * saved).  The split depends only on the problem size, never on the
 * thread count, so the result is the same for any thread count. */
#define TL_WGRAD_PARTS 8
#define TL_WGRAD_TASKS 32
#define TL_WGRAD_MIN_ROWS 1024
#define TL_WGRAD_MAX_PARTIAL (1 << 22)
#define TL_WGRAD_SMALL_PARTIAL (1 << 20)
#define TL_WGRAD_WIDE_K 16
/* Weight-gradient output rows per block: for each kernel row, a block's pairs
 * are reduced in register-blocked passes while their x and dy rows stay in
 * L1/L2 across the passes.  1024 rather than 256: each kernel row of a
 * sparse map gets more pairs per pass (1.0-1.1x at C <= 64, unchanged wider;
 * a part has at least TL_WGRAD_MIN_ROWS rows, so one block or more). */
#define TL_WGRAD_PAIRS 1024
/* Narrow float and double layers (x rows of at most 128 bytes) take blocks
 * of up to TL_WGRAD_MAX_TILES such tiles, as many as keep the block's dy rows
 * within TL_WGRAD_DY_BYTES (C_out <= 16 in fp32: 4 tiles, 17-32: 2): each
 * kernel row's passes then run more pairs per call (a short loop, rows_t_16
 * at C_out = 16, pays its set-up, its accumulators' loads and stores and its
 * first pairs' waits on every call) while the dy rows stay in L2 (see
 * tl_wgrad_block_rows). */
#define TL_WGRAD_MAX_TILES 4
#define TL_WGRAD_DY_BYTES (256 * 1024)
/* The weight gradient's tasks (see TL_WGRAD_PARTS): `parts` output-row parts
 * of rows_per rows, each cut into `groups` groups of kernel rows (so large
 * layers, with few parts, still give every thread work; groups write disjoint
 * slices of a part's partial sum). */
typedef struct tl_wgrad_split {
    int64_t parts, groups, rows_per;
    int64_t block; /* output rows per block (tl_wgrad_block_rows) */
    /* A block's lists fit TL_LIST_BYTES: each task lists a block of its
     * rows once for every kernel row (tl_wgrad_list_block, which checks the
     * table's entries), also where its group takes only some of them: the
     * listing reads the block's table rows once, contiguous, where reading a
     * kernel row's column touched a cache line per entry for each kernel row
     * (1.00-1.05x at C = 96-128 in fp32, 1.02-1.10x in bf16 on AMX).
     * Otherwise (over 256 kernel rows) the columns are read, and checked, one
     * kernel row at a time (TL_WGRAD_LIST). */
    int listed;
} tl_wgrad_split;

/* Output rows per weight-gradient block: TL_WGRAD_PAIRS, or a few times that
 * for narrow float and double layers (TL_WGRAD_MAX_TILES).  Against 1024-row
 * blocks on the AMD EPYC of round twenty-six, over the table: C = 16 in
 * 4096-row blocks 1.02-1.29x on four maps of both scenes (fetch-on-demand's
 * gradient 0.99-1.11x), C = 32 in 2048-row ones 0.98-1.09x; over tile lists
 * 1.01-1.05x and 1.00-1.04x.  (4096 rows at C = 32 lost 0.89-0.93x, 8192 at
 * C = 16 0.91-0.96x.)  The half types' kernels keep TL_WGRAD_PAIRS. */
static inline int64_t tl_wgrad_block_rows(const tl_conv_desc *d) {
    const int64_t elem = d->dtype == TL_F32 ? 4 : d->dtype == TL_F64 ? 8 : 0;
    if (elem == 0 || d->c_in * elem > 128 || d->c_out <= 0) return TL_WGRAD_PAIRS;
    int64_t tiles = TL_WGRAD_DY_BYTES / (TL_WGRAD_PAIRS * d->c_out * elem);
    tiles = tiles < 1 ? 1 : tiles > TL_WGRAD_MAX_TILES ? TL_WGRAD_MAX_TILES : tiles;
    return tiles * TL_WGRAD_PAIRS;
}

/* `parts` parts of whole blocks of `block` rows (tl_wgrad_block_rows; the
 * last part takes the rest), so every block starts on a multiple of
 * `block`, and so on a forward tile's first row where tiles divide it
 * (tl_tile_lists.h); fewer parts where the rows fill fewer. */
static inline tl_wgrad_split tl_wgrad_split_in(const tl_conv_desc *d, int64_t block,
                                               int64_t parts, int64_t groups, int listed) {
    const int64_t blocks = (d->n_out + block - 1) / block;
    const int64_t per = blocks > parts ? (blocks + parts - 1) / parts : 1;
    const int64_t rows_per = per * block;
    parts = d->n_out > 0 ? (d->n_out + rows_per - 1) / rows_per : 1;
    return (tl_wgrad_split){parts, groups, rows_per, block, listed};
}

static inline tl_wgrad_split tl_wgrad_split_of(const tl_conv_desc *d) {
    const int64_t by_rows = (d->n_out + TL_WGRAD_MIN_ROWS - 1) / TL_WGRAD_MIN_ROWS;
    const int64_t all = d->k * d->c_in * d->c_out;
    const int64_t block = tl_wgrad_block_rows(d);
    const int fits = d->k * block * 8 <= TL_LIST_BYTES;
    const int64_t small =
        d->k >= TL_WGRAD_WIDE_K ? TL_WGRAD_MAX_PARTIAL : TL_WGRAD_SMALL_PARTIAL;
    if (fits && by_rows >= TL_WGRAD_TASKS && TL_WGRAD_TASKS * all <= small)
        return tl_wgrad_split_in(d, block, TL_WGRAD_TASKS, 1, 1);
    int64_t parts = TL_WGRAD_PARTS;
    if (parts > by_rows) parts = by_rows;
    if (all > 0 && parts * all > TL_WGRAD_MAX_PARTIAL) parts = TL_WGRAD_MAX_PARTIAL / all;
    if (parts < 1) parts = 1;
    int64_t groups = (TL_WGRAD_TASKS + parts - 1) / parts;
    if (groups > d->k) groups = d->k;
    return tl_wgrad_split_in(d, block, parts, groups, fits);
}

/* Task t of parts x groups: its part, output rows [o0, o1) and kernel rows
 * [n0, n1). */
typedef struct tl_wgrad_task {
    int64_t part, o0, o1, n0, n1;
} tl_wgrad_task;

static inline tl_wgrad_task tl_wgrad_task_of(const tl_wgrad_split *s, const tl_conv_desc *d,
                                             int64_t t) {
    const int64_t p = t / s->groups, g = t % s->groups, o0 = p * s->rows_per;
    return (tl_wgrad_task){p, o0, o0 + s->rows_per < d->n_out ? o0 + s->rows_per : d->n_out,
                           d->k * g / s->groups, d->k * (g + 1) / s->groups};
}

/* What a forward tile lists its neighbours from: the (n_out, k) table nbr, or
 * (pairs non-NULL, fetch-on-demand) per-kernel-row pair lists sorted by
 * output row, already checked (tl_pairs_check), with starts[t * k + n] = the
 * first pair of kernel row n whose output row is in row tile t (of tile_rows
 * rows) or later (row_tiles + 1 rows of k; see tl_pair_starts); or (lists
 * non-NULL) the table's tile lists (tl_tile_lists.h), read in place. */
typedef struct tl_fwd_rel {
    const int32_t *nbr;
    const tl_pairs *pairs;
    int64_t *starts;
    int64_t tile_rows;
    const tl_tile_lists *lists; /* the table's lists, built for these tiles (or NULL) */
} tl_fwd_rel;

/* The first pair of kernel row n at or after `from` whose output row is at
 * least `row` (offsets[n + 1] if none): steps of 1, 2, 4, ... from `from`,
 * then a binary search within the last step. */
static inline int64_t tl_pairs_next_at(const tl_pairs *p, int64_t n, int64_t from, int64_t row) {
    int64_t lo = from, b = from, step = 1;
    const int64_t end = p->offsets[n + 1];
    while (b < end && p->out[b] < row) {
        lo = b + 1;
        b += step;
        step *= 2;
    }
    int64_t hi = b < end ? b : end;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (p->out[mid] < row)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The first pair of kernel row n of p (sorted by output row) whose output
 * row is at least `row` (offsets[n + 1] if none). */
static inline int64_t tl_pairs_first_at(const tl_pairs *p, int64_t n, int64_t row) {
    return tl_pairs_next_at(p, n, p->offsets[n], row);
}

/* starts (see tl_fwd_rel) for row tiles of `rows` output rows: each kernel
 * row's tiles in order, each search starting from the tile before's start
 * (tl_pairs_next_at), so it reads a few cache lines of the list near there.
 * A binary search of the whole list per tile, in parallel over tiles, took
 * 5% of a C = 16 fetch-on-demand forward on the LiDAR scan (a cache miss a
 * step); a walk through every pair (O(P), with a branch per pair) cost about
 * as much as listing a C = 16 forward's table. */
static inline void tl_pair_starts(const tl_ctx *ctx, const tl_pairs *p, int64_t rows,
                                  int64_t row_tiles, int64_t *starts) {
    const int64_t k = p->k;
#pragma omp parallel for num_threads(tl_threads_for(ctx, (row_tiles + 1) * k * 32)) \
    schedule(static)
    for (int64_t n = 0; n < k; n++) {
        int64_t at = p->offsets[n];
        for (int64_t t = 0; t <= row_tiles; t++)
            starts[t * k + n] = at = tl_pairs_next_at(p, n, at, t * rows);
    }
}

/* The pairs of the row tile of output rows [o0, ...) from pair lists, read in
 * place: kernel row n's are one run of its sorted list, cnt[n] of them, x rows
 * at il[n] and (the layer's) output rows at rl[n].  Nothing is copied (a copy
 * of 8 bytes a pair cost as much as listing the table at C = 16). */
static inline void tl_pairs_of_tile(const tl_fwd_rel *rel, int64_t o0, const int32_t **il,
                                    const int32_t **rl, int64_t *cnt) {
    const tl_pairs *p = rel->pairs;
    const int64_t k = p->k, *lo = rel->starts + o0 / rel->tile_rows * k, *hi = lo + k;
    for (int64_t n = 0; n < k; n++) {
        cnt[n] = hi[n] - lo[n];
        il[n] = p->in + lo[n];
        rl[n] = p->out + lo[n];
    }
}

/* How a kernel row's c listed rows of a tile run: rows [0, *full) in groups
 * (see TL_RUN_GROUPS), then the returned pad rows (0, 2 or 4) as one group,
 * the last 1 to 3 rows padded with a zero x row and a sink y row by the
 * caller: a 1-row pass costs as much as a 4-row one (both are bound by the
 * weight loads), and a remainder of 1 or 2 rows runs the 2-row pass. */
static inline int64_t tl_group_pad(int64_t c, int64_t *full) {
    *full = c / 4 * 4;
    return c - *full == 3 ? 4 : (c - *full + 1) / 2 * 2;
}

/* Whether each of a tile's m rows is listed by at most one kernel row (kernel
 * row n's cnt[n] output rows at rl[n], each minus base in [0, m)): the
 * inverse map of a transposed convolution whose stride is its kernel size, a
 * 1x1x1 map, the input gradient of such a strided one.  Then the forwards
 * write each listed row's sums once instead of adding them to a zeroed row,
 * and zero only the *nz rows no kernel row lists, which go to zr (hit: m
 * bytes of scratch).  Counts first, so a map with more pairs than rows costs
 * nothing more. */
static inline int tl_tile_single(const int32_t *const *rl, const int64_t *cnt, int64_t k,
                                 int64_t m, int64_t base, uint8_t *hit, int32_t *zr,
                                 int64_t *nz) {
    int64_t listed = 0;
    for (int64_t n = 0; n < k; n++) listed += cnt[n];
    if (listed > m) return 0;
    memset(hit, 0, (size_t)m);
    for (int64_t n = 0; n < k; n++) {
        const int32_t *lr = rl[n];
        for (int64_t t = 0; t < cnt[n]; t++) {
            if (hit[lr[t] - base]) return 0;
            hit[lr[t] - base] = 1;
        }
    }
    int64_t z = 0;
    for (int64_t r = 0; r < m; r++)
        if (!hit[r]) zr[z++] = (int32_t)r;
    *nz = z;
    return 1;
}

/* The next kernel row's x rows a forward tile asks for ahead of its groups
 * (tl_forward_tile): two groups' worth, as tl_rows_ahead's short groups. */
#define TL_FWD_NEXT_ROWS 8

/* Runs the groups of rows [0, FULL + PAD) (tl_group_pad): where EIGHT
 * (narrow tiles), the groups of 8 first, all in one GROUP8(c8) call (c8 =
 * FULL / 8 * 8 rows: rows_8, which asks for its next group's rows itself);
 * then GROUP(p, 4) for each group of 4 left and GROUP(FULL, PAD) for the
 * padded one.  Where AHEAD is not 0 (tl_rows_ahead), x rows XR[] (ROW_BYTES
 * each) are asked for AHEAD rows ahead while a group of 4 computes: on
 * strided and transposed maps each x row is read once, so they come from
 * memory (1.1-1.5x there; subm 1.0-1.1x). */
#define TL_RUN_GROUPS(FULL, PAD, EIGHT, AHEAD, XR, ROW_BYTES, GROUP8, GROUP)                   \
    do {                                                                                     \
        int64_t p_ = (EIGHT) ? (FULL) / 8 * 8 : 0;                                           \
        if (p_) GROUP8(p_);                                                                  \
        const int64_t p0_ = p_, ahead_ = (AHEAD);                                            \
        for (; p_ + 4 <= (FULL); p_ += 4) {                                                  \
            TL_PREFETCH_AHEAD((XR), p_, p0_, (FULL), 4, ahead_, (ROW_BYTES));               \
            GROUP(p_, 4);                                                                    \
        }                                                                                    \
        if (PAD) GROUP((FULL), (PAD));                                                       \
    } while (0)

/* A weight-gradient worker's lists of one block of output rows, for every
 * kernel row (tl_list_tile): li, lr k x `rows` (the block's), lc k; allocated
 * only where `listed` (a listed split, tl_wgrad_split.listed, over a table). */
typedef struct tl_wgrad_lists {
    int listed, level; /* level: the listing's instruction set (tl_list_tile) */
    int32_t *li, *lr;
    int64_t *lc;
} tl_wgrad_lists;

static inline int tl_wgrad_lists_init(tl_wgrad_lists *l, int listed, int level, int64_t k,
                                      int64_t rows) {
    *l = (tl_wgrad_lists){listed, level, NULL, NULL, NULL};
    if (!l->listed) return 1;
    l->li = malloc(sizeof(int32_t) * (size_t)(rows * k));
    l->lr = malloc(sizeof(int32_t) * (size_t)(rows * k));
    l->lc = malloc(sizeof(int64_t) * (size_t)k);
    return l->li && l->lr && l->lc;
}

static inline void tl_wgrad_lists_free(tl_wgrad_lists *l) {
    free(l->li);
    free(l->lr);
    free(l->lc);
}

/* Lists output rows [b0, b1) of the (n_out, k) table nbr for the task's
 * kernel rows [n0, n1) into l where the split is listed; returns 1 if one of
 * their entries is outside [-1, n_in) (nothing it names may be read), else
 * 0.  Otherwise each kernel row's column is read, and checked, as its turn
 * comes (TL_WGRAD_LIST).  The tasks' rows and kernel rows cover the table
 * once, so every entry is checked. */
static inline int tl_wgrad_list_block(tl_wgrad_lists *l, const int32_t *nbr, int64_t k,
                                      int64_t b0, int64_t b1, int64_t n0, int64_t n1,
                                      int64_t n_in) {
    if (!l->listed) return 0;
    return (int64_t)tl_list_tile_range(l->level, nbr, b0, b1 - b0, k, n0, n1, l->li, l->lr,
                                       l->lc) > n_in;
}

/* Kernel row N's pairs of the block [B0, B1) for the weight gradient: from
 * the block's lists L when the split is listed (see tl_wgrad_list_block),
 * else from column N of the (n_out, K) table NBR (see TL_WGRAD_LIST, which
 * checks it); arguments as TL_WGRAD_LIST's. */
#define TL_WGRAD_PAIRS_OF(L, NBR, K, N, B0, B1, N_IN, X, XSTRIDE, DY, DSTRIDE, XQ, DQ, C)      \
    do {                                                                                     \
        if ((L)->listed) { /* 8 pointers a step with AVX-512 (tl_point_rows) */              \
            const int64_t m_ = (B1) - (B0);                                                  \
            const int32_t *i_ = (L)->li + (N) * m_, *r_ = (L)->lr + (N) * m_;                 \
            (C) = (L)->lc[N];                                                                \
            tl_point_rows((L)->level, i_, r_, (C), (X), (XSTRIDE) * (int64_t)sizeof(*(X)),     \
                          (void *)(XQ), (void *)((DY) + (B0) * (DSTRIDE)),                   \
                          (DSTRIDE) * (int64_t)sizeof(*(DY)), (void *)(DQ));                \
        } else {                                                                             \
            TL_WGRAD_LIST(NBR, K, N, B0, B1, N_IN, X, XSTRIDE, DY, DSTRIDE, XQ, DQ, C);      \
        }                                                                                    \
    } while (0)

/* Kernel row N's pairs among output rows [B0, B1) of the (n_out, K) table
 * NBR, for the weight gradient: the c-th present one's x row XQ[c] = X + i *
 * XSTRIDE and dy row DQ[c] = DY + o * DSTRIDE; leaves the count in C, or -1
 * if an entry is outside [-1, N_IN) (then no row it names may be read; the
 * pointers are not used).  Checking here, as the column is read, spares a
 * pass over the whole table before the call (5% of a bf16 weight gradient
 * on AMX, whose kernels are fast enough for it to show): the tasks' blocks
 * and kernel rows cover every entry once.  Branch-free: every entry is
 * written at slot C (an absent one as row 0) and C advances only past
 * present ones, so a sparse map's scattered entries cost no mispredicted
 * branch (XQ and DQ hold B1 - B0 slots). */
#define TL_WGRAD_LIST(NBR, K, N, B0, B1, N_IN, X, XSTRIDE, DY, DSTRIDE, XQ, DQ, C)           \
    do {                                                                                     \
        uint32_t top_ = 0; /* the largest entry + 1: -1 is 0, below -1 wraps high */         \
        (C) = 0;                                                                             \
        for (int64_t o_ = (B0); o_ < (B1); o_++) {                                           \
            const int32_t i_ = (NBR)[o_ * (K) + (N)];                                        \
            const uint32_t u_ = (uint32_t)i_ + 1u;                                           \
            top_ = u_ > top_ ? u_ : top_;                                                    \
            (XQ)[C] = (X) + (int64_t)(i_ < 0 ? 0 : i_) * (XSTRIDE);                          \
            (DQ)[C] = (DY) + o_ * (DSTRIDE);                                                 \
            (C) += i_ >= 0;                                                                  \
        }                                                                                    \
        if ((int64_t)top_ > (N_IN)) (C) = -1;                                                \
    } while (0)

/* Values per weight row of a packed panel of wb columns: wb rounded up to a
 * multiple of pad (the kernels' tl_mk_ops.pad_cols; 1: wb). */
static inline int64_t tl_panel_ld(int64_t wb, int64_t pad) { return (wb + pad - 1) / pad * pad; }

/* Output rows from which a forward whose weights need panels narrower than
 * the layer packs them (tl_fwd_packs): packing copies all k x c_in x c_out
 * weights on one thread before any row runs, which fewer rows do not win
 * back (SparseResUNet42's deepest layers, C = 256 on 4-36 rows, took 2-3 ms
 * a call packing 7 MiB of weights). */
#define TL_FWD_PACK_MIN_ROWS 4096

/* Whether the forward packs its weights into panels of `width` columns
 * padded to `pad` (tl_pack_panels), rather than reading each panel where it
 * is, in the weight rows (c_out values apart): where the rows' length is not
 * a multiple of pad (AVX-512's padded blocks would read past a row's end,
 * see TL_MKI(padded)), or panels narrower than the layer stay in L1 over
 * enough output rows (TL_FWD_PACK_MIN_ROWS).  Either way each output's sums
 * are the same. */
static inline int tl_fwd_packs(const tl_conv_desc *d, int64_t width, int64_t pad) {
    return tl_panel_ld(d->c_out, pad) != d->c_out ||
           (width < d->c_out && d->n_out >= TL_FWD_PACK_MIN_ROWS);
}

/* Elements from the start of the packed weights to input channel c0 of the
 * panel of kernel row n starting at output column col, whose rows are ld
 * values (tl_panel_ld of its width) apart: every panel but a row's last is
 * `width` wide, a multiple of pad, so a kernel row holds
 * tl_panel_ld(c_out, pad) columns. */
static inline int64_t tl_panel_at(const tl_conv_desc *d, int64_t pad, int64_t n, int64_t col,
                                  int64_t c0, int64_t ld) {
    return (n * tl_panel_ld(d->c_out, pad) + col) * d->c_in + c0 * ld;
}

/* The weights (k, c_in, c_out) of elem_bytes each as panels: for each kernel
 * row n and each block of `width` output columns starting at j (narrower at
 * the end), the block's c_in rows of its columns, each padded with zeros to
 * tl_panel_ld(columns, pad) values, contiguous at tl_panel_at(d, pad, n, j,
 * 0, ...).  A panel (width from tl_panel_cols, a multiple of pad) stays in L1
 * while every group of output rows of a tile runs against it; wider weight
 * rows would be streamed from L2 or beyond for each group (at C = 256 their
 * 1 KiB stride also maps them onto a fraction of the cache's sets).  pw holds
 * tl_packed_elems(d, pad) elements. */
static inline void tl_pack_panels(const tl_conv_desc *d, int64_t width, int64_t pad,
                                  int64_t elem_bytes, const void *w, void *pw) {
    const int64_t cin = d->c_in, cout = d->c_out;
    const char *src = w;
    char *dst = pw;
    for (int64_t n = 0; n < d->k; n++)
        for (int64_t j = 0; j < cout; j += width) {
            const int64_t wb = cout - j < width ? cout - j : width, ld = tl_panel_ld(wb, pad);
            char *panel = dst + tl_panel_at(d, pad, n, j, 0, ld) * elem_bytes;
            for (int64_t ci = 0; ci < cin; ci++) {
                memcpy(panel + ci * ld * elem_bytes, src + ((n * cin + ci) * cout + j) * elem_bytes,
                       (size_t)(wb * elem_bytes));
                memset(panel + (ci * ld + wb) * elem_bytes, 0, (size_t)((ld - wb) * elem_bytes));
            }
        }
}

/* Elements of tl_pack_panels' packed weights. */
static inline int64_t tl_packed_elems(const tl_conv_desc *d, int64_t pad) {
    return d->k * d->c_in * tl_panel_ld(d->c_out, pad);
}

#endif
