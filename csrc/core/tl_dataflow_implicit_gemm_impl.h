/* Type-generic body of tl_dataflow_implicit_gemm.c.  Included once per
 * element type with TL_T (the C type) and TL_SFX (the name suffix) defined;
 * C has no templates, and this keeps one copy of each kernel.
 *
 * Both kernels run the register-blocked micro-kernels of
 * tl_microkernel_impl.h. */
#ifndef TL_T
#error "define TL_T and TL_SFX before including this file"
#endif

#define TL_CAT2(a, b) a##_##b
#define TL_CAT(a, b) TL_CAT2(a, b)
#define TL_FN(name) TL_CAT(name, TL_SFX)

#include "tl_microkernel_impl.h"

/* Scratch of one forward worker: the micro-kernels and panel width (chosen
 * once per call), the tile's lists, the listed x and y row pointers of one
 * kernel row, and a zero x row and a sink y row that pad the last group of a
 * kernel row (see tl_group_pad). */
typedef struct TL_FN(tl_fwd_scratch) {
    const TL_FN(tl_mk_ops) *mk;
    int64_t panel_cols; /* see tl_panel_cols */
    int packed;         /* the weights packed into panels (tl_fwd_packs), else read in place */
    int level;          /* the instruction set of the listing (tl_list_tile) */
    int32_t *li, *lr;   /* k x tile rows: listed x rows, tile rows (tl_list_tile) */
    int64_t *lc;        /* k: listed per kernel row */
    const int32_t **il; /* k: kernel row n's x rows (in li, or in place in pair lists) */
    const int32_t **rl; /* k: their output rows (lr, or the pair lists') */
    const TL_T **xr;    /* tile rows + 3 */
    TL_T **yr;          /* tile rows + 3 */
    TL_T *zero;         /* c_in zeros */
    TL_T *sink;         /* TL_TILE_COLS values, never read */
    int64_t *lf;        /* k: first entries per kernel row (tl_list_tile_split) */
    int32_t *zr;        /* tile rows: rows without a neighbour (the same) */
    uint8_t *hit;       /* tile rows: scratch of tl_tile_single */
} TL_FN(tl_fwd_scratch);

static int TL_FN(tl_fwd_scratch_init)(TL_FN(tl_fwd_scratch) *s, const tl_ctx *ctx,
                                      const TL_FN(tl_mk_ops) *mk,
                                      int64_t panel_cols, int packed, int64_t rows, int64_t k,
                                      int64_t cin) {
    s->mk = mk;
    s->panel_cols = panel_cols;
    s->packed = packed;
    s->level = tl_simd_vector_capped(ctx->simd_cap);
    s->li = malloc(sizeof(int32_t) * (size_t)(rows * k));
    s->lr = malloc(sizeof(int32_t) * (size_t)(rows * k));
    s->lc = malloc(sizeof(int64_t) * (size_t)k);
    s->il = malloc(sizeof(*s->il) * (size_t)k);
    s->rl = malloc(sizeof(*s->rl) * (size_t)k);
    s->xr = malloc(sizeof(TL_T *) * (size_t)(rows + 3));
    s->yr = malloc(sizeof(TL_T *) * (size_t)(rows + 3));
    s->zero = calloc((size_t)(cin + TL_TILE_COLS), sizeof(TL_T));
    s->sink = s->zero ? s->zero + cin : NULL;
    s->lf = malloc(sizeof(int64_t) * (size_t)k);
    s->zr = malloc(sizeof(int32_t) * (size_t)rows);
    s->hit = malloc((size_t)rows);
    return s->li && s->lr && s->lc && s->il && s->rl && s->xr && s->yr && s->zero && s->lf &&
           s->zr && s->hit;
}

static void TL_FN(tl_fwd_scratch_free)(TL_FN(tl_fwd_scratch) *s) {
    free(s->li);
    free(s->lr);
    free(s->lc);
    free(s->il);
    free(s->rl);
    free(s->xr);
    free(s->yr);
    free(s->zero);
    free(s->lf);
    free(s->zr);
    free(s->hit);
}

/* Output rows out[0..R) (R = 4 or 2), columns [j, j + wb), += their listed
 * x rows times the c_in x wb panel, rows ld apart (= where `set`: rows listed
 * for the first time, see tl_forward_tile). */
static inline void TL_FN(tl_fwd_group)(TL_FN(tl_fwd_scratch) *s, int set, int R, int64_t wb,
                                       int64_t ld, int64_t kb, const TL_T *panel,
                                       const TL_T *const *xr, TL_T *const *yr, int64_t j) {
    TL_T *o[8];
    if (j > 0) { /* a later panel: its columns of the rows */
        for (int r = 0; r < R; r++) o[r] = yr[r] + j;
        yr = o;
    }
    if (R == 2)
        (set ? s->mk->rows_2_set : s->mk->rows_2)(wb, kb, xr, panel, ld, yr);
    else
        (set ? s->mk->rows_4_set : s->mk->rows_4)(wb, kb, xr, panel, ld, yr);
}

/* Asks to write the 4 output rows yr[0..4) (their first wb values): rows
 * written first (`set`) are seldom in cache (on transposed maps every row is
 * written once), so the next group's rows are fetched while a group computes
 * instead of stalling its stores (1.02-1.07x on k2 s2 inverse maps). */
static inline void TL_FN(tl_fwd_ask_y)(TL_T *const *yr, int64_t wb) {
    for (int r = 0; r < 4; r++)
        for (int64_t b = 0; b < wb * (int64_t)sizeof(TL_T); b += 64)
            __builtin_prefetch((const char *)yr[r] + b, 1);
}

/* Kernel row n's c listed rows, x rows idx[] and output rows rows[] (output
 * row r at yb + r * c_out): each group of rows += its x
 * rows times the row's weight panels (= where `set`), a block of
 * TL_FWD_CIN_BLOCK input channels at a time (the x row pointers move along
 * the block, and back for the next panel). */
static void TL_FN(tl_fwd_rows)(const tl_conv_desc *d, const TL_T *x, const TL_T *pw,
                               TL_T *yb, int64_t co0, int64_t cw, int64_t n,
                               const int32_t *idx, const int32_t *rows, int64_t c, int set,
                               TL_FN(tl_fwd_scratch) *s) {
    const int64_t cin = d->c_in, cout = d->c_out, width = s->panel_cols;
    /* Groups of 8 rows on panels at most rows8_max_cols wide (narrow tiles,
     * 3 vectors with AVX-512, 2 with AVX2, which runs them 6 rows a block),
     * else 4: besides narrow tiles, a wide tile's
     * last panel (C = 96: 64 + 32 columns, whose 4 rows of 2 vectors loaded a
     * weight or x value for every 1.3 multiply-adds; 1.00-1.05x at C = 96 and
     * 160) and tiles of 3 vectors (C = 48, 8 rows of 3 where 4 rows of 3
     * loaded one for every 1.7; 1.06-1.20x at C = 48, 1.07-1.15x at
     * C = 112). */
    const TL_T **xr = s->xr;
    TL_T **yr = s->yr;
    /* No x row is asked for here: the groups ask for the next group's rows
     * as they run (rows_8, TL_RUN_GROUPS).  Asking for every listed row at
     * once (hundreds per kernel row on a C = 16 tile) filled the core's miss
     * buffers: without it, 0.96-1.23x on the Intel Xeon of round fifteen. */
    /* A layer one vector wide and deep (C = 16 in fp32 with AVX-512) runs its
     * groups of 8 over the lists by index (rows_8_at), so only the rows
     * after them need pointers (tl_point_rows was 9% of a C = 16 forward's
     * samples on the LiDAR scan, the kernels 63%). */
    const int at = s->mk->rows_8_at && cin * (int64_t)sizeof(TL_T) == 64 &&
                   cw * (int64_t)sizeof(TL_T) == 64;
    const int64_t c8 = at ? c / 8 * 8 : 0;
    tl_point_rows(s->level, idx + c8, rows + c8, c - c8, x, cin * (int64_t)sizeof(TL_T),
                  (void *)(xr + c8), yb + co0, cout * (int64_t)sizeof(TL_T), (void *)(yr + c8));
    int64_t full;
    const int64_t pad = tl_group_pad(c, &full);
    for (; c < full + pad; c++) {
        xr[c] = s->zero;
        yr[c] = s->sink;
    }
    const int64_t kc = cin > TL_FWD_CIN_BLOCK ? TL_FWD_CIN_BLOCK : cin;
    for (int64_t j = 0; j < cw; j += width) {
        const int64_t wb = cw - j < width ? cw - j : width;
        /* A panel's own width (which picks its groups), and its rows' stride:
         * the same packed (padded: tl_panel_ld); the weight rows' own in
         * place (tl_fwd_packs). */
        const int64_t pc = s->mk->pad_cols;
        const int64_t lw = s->packed ? tl_panel_ld(wb, pc) : wb, ld = s->packed ? lw : cout;
        for (int64_t c0 = 0; c0 < cin; c0 += kc) {
            const int64_t kb = cin - c0 < kc ? cin - c0 : kc;
            const int first = set && c0 == 0;
            const TL_T *panel = pw + (s->packed ? tl_panel_at(d, pc, n, co0 + j, c0, ld)
                                                : (n * cin + c0) * cout + co0 + j);
            if (c0 > 0)
                for (int64_t r = 0; r < full + pad; r++) xr[r] += kc;
#define TL_GROUP8(c8)                                                                  \
    do {                                                                               \
        if (at)                                                                        \
            (first ? s->mk->rows_8_at_set : s->mk->rows_8_at)((c8), idx, rows, x, cin, \
                                                             panel, ld, yb + co0, cout); \
        else                                                                           \
            (first ? s->mk->rows_8_set : s->mk->rows_8)(wb, kb, (c8), xr, panel, ld, yr, \
                                                        j);                            \
    } while (0)
#define TL_GROUP(p, R)                                                                       \
    do {                                                                                     \
        if (first && j == 0 && (p) + 8 <= full) TL_FN(tl_fwd_ask_y)(yr + (p) + 4, wb);       \
        TL_FN(tl_fwd_group)(s, first, (int)(R), wb, ld, kb, panel, xr + (p), yr + (p), j);   \
    } while (0)
            TL_RUN_GROUPS(full, pad, lw <= s->mk->rows8_max_cols,
                          j == 0 ? tl_rows_ahead(kb * wb) : 0, xr, kb * (int64_t)sizeof(TL_T),
                          TL_GROUP8, TL_GROUP);
#undef TL_GROUP
#undef TL_GROUP8
        }
        if (kc < cin)
            for (int64_t r = 0; r < full + pad; r++) xr[r] -= (cin - 1) / kc * kc;
    }
}

/* One tile: output rows [o0, o0+m), columns [co0, co0+cw).  For each kernel
 * row the tile's neighbours are listed, then for each weight panel (see
 * tl_pack_panels) handled 4 or 8 output rows at a time.  Each output
 * element adds its kernel rows' products in the order of tl_fwd_order (its
 * lead kernel row's first, then the others in kernel-row order), and within a
 * kernel row in input-channel order (blocks of TL_FWD_CIN_BLOCK channels, each
 * block's sum added in turn), whatever the tiling and the panel width,
 * so the result does not depend on the tile size, the thread count or the
 * instruction set's block width.  Each row's first kernel row writes its
 * sums (plus zero) instead of adding them to a zeroed row: the same bits,
 * without zeroing the tile first or reading the row back (only rows with no
 * neighbour are zeroed); on tiles listed from a table wider than 128 bytes,
 * on the others where no row has two neighbours, and, through the lead
 * kernel row, on tiles whose every row has a lead entry (a submanifold map's
 * centre).  1.05-1.24x on k2 s2 inverse maps, whose rows have one neighbour
 * each.  The listing also checks
 * every entry is in [-1, n_in) before any row it names is read (one pass over
 * nbr instead of two); returns 0, or 1 at the first entry that is not. */
static int TL_FN(tl_forward_tile)(const tl_conv_desc *d, const TL_T *x, const TL_T *pw,
                                  const tl_fwd_rel *rel, TL_T *y, int64_t o0, int64_t m,
                                  int64_t co0, int64_t cw, TL_FN(tl_fwd_scratch) *s) {
    const int64_t k = d->k, cout = d->c_out;
    /* Narrow tiles split only where no row has two neighbours (tl_tile_single):
     * there a kernel row's groups are cheap enough that running its first
     * entries and its others as two sets of groups, and the split listing,
     * cost more than they save (0.87-0.96x at C = 16-32 on the LiDAR scan).
     * Narrow: 32 floats, whatever the instruction set (AVX2 and SSE2 split
     * from their 8-row blocks' width, 8 and 4 floats, until round
     * twenty-four: not splitting there ran 1.00-1.02x on submanifold maps and
     * 1.01-1.33x (AVX2) and 1.01-1.46x (SSE2) on strided ones at C = 8-32). */
    const int split = !rel->pairs && !rel->lists && cw * (int64_t)sizeof(TL_T) > 128;
    const int64_t lead = tl_fwd_lead(k); /* run first (tl_fwd_order) */
    int64_t nz = 0; /* rows to zero, in zr, where first entries are written */
    /* Kernel row n's entries: x rows il[n][0..lc[n]) of output rows
     * rl[n][..] - base (base o0 for pair lists, whose rows are the layer's,
     * read in place; 0 for the tile's lists). */
    const int32_t **il = s->il, **rl = s->rl;
    int64_t base = 0;
    if (rel->pairs) {
        tl_pairs_of_tile(rel, o0, il, rl, s->lc);
        base = o0;
    } else if (rel->lists) { /* listed once, for this call's tiles */
        tl_tile_lists_of(rel->lists, o0 / rel->lists->tile_rows, k, il, rl, s->lc);
    } else {
        if ((int64_t)(split ? tl_list_tile_split(s->level, rel->nbr, o0, m, k, lead, s->li, s->lr,
                                                 s->lc, s->lf, s->zr, &nz)
                            : tl_list_tile(s->level, rel->nbr, o0, m, k, s->li, s->lr, s->lc)) >
            d->n_in)
            return 1; /* below -1 wraps to above n_in */
        for (int64_t n = 0; n < k; n++) {
            il[n] = s->li + n * m;
            rl[n] = s->lr + n * m;
        }
    }
    if (d->c_in == 0) { /* no products: every row is its zeros (the lists checked above) */
        for (int64_t r = 0; r < m; r++)
            memset(y + (o0 + r) * cout + co0, 0, sizeof(TL_T) * (size_t)cw);
        return 0;
    }
    /* single: every entry of the unsplit lists is its row's first */
    const int single = !split && tl_tile_single(rl, s->lc, k, m, base, s->hit, s->zr, &nz);
    /* led: the lead kernel row names every row of the tile (a row at most
     * once), which it then writes */
    const int led = !split && !single && lead >= 0 && s->lc[lead] == m;
    const int zeroed = !split && !single && !led; /* else only the nz rows of zr */
    if (zeroed && cw == cout)
        memset(y + o0 * cout, 0, sizeof(TL_T) * (size_t)(m * cout));
    else if (zeroed)
        for (int64_t r = 0; r < m; r++)
            memset(y + (o0 + r) * cout + co0, 0, sizeof(TL_T) * (size_t)cw);
    else
        for (int64_t r = 0; r < nz; r++)
            memset(y + (o0 + s->zr[r]) * cout + co0, 0, sizeof(TL_T) * (size_t)cw);
    TL_T *yb = y + (o0 - base) * cout;
    /* Where groups of 4 run (wider than rows_8's panels, which ask for their
     * first groups' rows themselves), the next kernel row's first x rows are
     * asked for while this one runs: its groups ask only for rows of their own
     * kernel row (1.01-1.06x on the LiDAR scan's maps at C = 64-128, 1.00-1.02x
     * on the surface's). */
    const int ask_next = cw > s->mk->rows8_max_cols;
    const int64_t row_bytes = (d->c_in < TL_FWD_CIN_BLOCK ? d->c_in : TL_FWD_CIN_BLOCK) *
                              (int64_t)sizeof(TL_T);
    for (int64_t i = 0; i < k; i++) {
        const int64_t n = tl_fwd_order(lead, i);
        const int64_t f = split ? s->lf[n] : 0;
        if (ask_next && i + 1 < k) {
            const int64_t nn = tl_fwd_order(lead, i + 1);
            const int64_t fn = split ? s->lf[nn] : 0;
            const int32_t *ni = fn > 0 ? il[nn] + m - fn : il[nn];
            const int64_t nc = fn > 0 ? fn : s->lc[nn];
            TL_PREFETCH_LISTED(x, ni, nc < TL_FWD_NEXT_ROWS ? nc : TL_FWD_NEXT_ROWS,
                               d->c_in * (int64_t)sizeof(TL_T), row_bytes);
        }
        if (f > 0)
            TL_FN(tl_fwd_rows)(d, x, pw, yb, co0, cw, n, il[n] + m - f, rl[n] + m - f, f, 1, s);
        if (s->lc[n] > 0)
            TL_FN(tl_fwd_rows)(d, x, pw, yb, co0, cw, n, il[n], rl[n], s->lc[n],
                               single || (led && i == 0), s);
    }
    return 0;
}

static tl_status TL_FN(tl_forward)(const tl_ctx *ctx, const tl_conv_desc *d, const TL_T *x,
                                   const TL_T *w, const tl_fwd_rel *rel_in, TL_T *y) {
    const int64_t rows = tl_fwd_tile_rows(ctx, d, (int64_t)sizeof(TL_T));
    const int64_t row_tiles = (d->n_out + rows - 1) / rows;
    const int64_t col_tiles = (d->c_out + TL_TILE_COLS - 1) / TL_TILE_COLS;
    const int64_t cin = d->c_in > 0 ? d->c_in : 1;
    const TL_FN(tl_mk_ops) *mk = TL_FN(tl_mk_pick)(ctx);
    /* One panel as wide as the layer is the weights' own layout. */
    const int64_t panel = tl_panel_cols(d, mk->block_cols, (int64_t)sizeof(TL_T));
    TL_T *packed = NULL;
    if (tl_fwd_packs(d, panel, mk->pad_cols)) {
        packed = tl_mem_aligned(sizeof(TL_T) * (size_t)tl_packed_elems(d, mk->pad_cols));
        if (!packed) return TL_ERR_NOMEM;
        tl_pack_panels(d, panel, mk->pad_cols, (int64_t)sizeof(TL_T), w, packed);
    }
    const TL_T *pw = packed ? packed : w;
    tl_fwd_rel rel_v = *rel_in, *rel = &rel_v;
    if (rel->pairs) {
        rel->starts = malloc(sizeof(int64_t) * (size_t)((row_tiles + 1) * rel->pairs->k + 1));
        if (!rel->starts) {
            free(packed);
            return TL_ERR_NOMEM;
        }
        rel->tile_rows = rows;
        tl_pair_starts(ctx, rel->pairs, rows, row_tiles, rel->starts);
    }
    int failed = 0, invalid = 0;
#pragma omp parallel num_threads(ctx->threads) reduction(| : failed, invalid)
    {
        TL_FN(tl_fwd_scratch) s;
        int ok = TL_FN(tl_fwd_scratch_init)(&s, ctx, mk, panel, packed != NULL, rows,
                                            d->k > 0 ? d->k : 1, cin);
        failed |= !ok;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < row_tiles * col_tiles; t++) {
            if (!ok || invalid) continue;
            int64_t o0 = (t / col_tiles) * rows;
            int64_t co0 = (t % col_tiles) * TL_TILE_COLS;
            int64_t m = d->n_out - o0 < rows ? d->n_out - o0 : rows;
            int64_t cw = d->c_out - co0 < TL_TILE_COLS ? d->c_out - co0 : TL_TILE_COLS;
            invalid |= TL_FN(tl_forward_tile)(d, x, pw, rel, y, o0, m, co0, cw, &s);
        }
        TL_FN(tl_fwd_scratch_free)(&s);
    }
    free(packed);
    free(rel->starts);
    return invalid ? TL_ERR_INVALID : failed ? TL_ERR_NOMEM : TL_OK;
}

/* Scratch of one weight-gradient worker: the x and dy row pointers of a
 * block's pairs through one kernel row and through the next (up to the
 * block's rows each), and the packed x rows of one chunk of the panel's
 * pairs (tl_mk_panel_pairs rows of c_in rounded up to 4). */
typedef struct TL_FN(tl_wgrad_scratch) {
    const TL_FN(tl_mk_ops) *mk;
    int64_t block;                       /* rows per block (tl_wgrad_block_rows) */
    const TL_T **xq[2], **dq[2];         /* slot n % 2: kernel row n, block rows each */
    TL_T *xp;
    tl_wgrad_lists lists;
    int64_t *cur; /* over pair lists: each kernel row's next pair (k) */
    /* The table's tile lists, whose tile rows divide the block's: a block is
     * whole tiles from tile b0 / tile rows (tl_wgrad_split_of); or NULL. */
    const tl_tile_lists *tiles;
    /* Where the pairs run by index from lists (tl_wgrad_by_runs): slot
     * n % 2 for kernel row n, a run per tile of a block of the table's tile
     * lists, or one, the block's own list (tl_wgrad_list_block); else NULL. */
    tl_mk_run *runs[2];
} TL_FN(tl_wgrad_scratch);

/* Kernel row n's pairs among output rows below b1 from pair lists sorted by
 * output row, starting at s->cur[n] (the first not yet taken): their x rows
 * xq[] and dy rows dq[]; returns their count and moves the cursor past them.
 * Checked pairs never repeat an output row within a kernel row, so a block
 * has at most as many as its rows.  The run's end found by
 * steps (tl_pairs_next_at) and its pointers 8 at a time (tl_point_rows), as
 * the table's lists are, not a pair at a time behind a branch. */
static int64_t TL_FN(tl_wgrad_pairs_run)(const tl_conv_desc *d, const tl_pairs *p, int64_t n,
                                         int64_t b1, const TL_T *x, const TL_T *dy,
                                         TL_FN(tl_wgrad_scratch) *s, const TL_T **xq,
                                         const TL_T **dq) {
    const int64_t j0 = s->cur[n], end = tl_pairs_next_at(p, n, j0, b1), c = end - j0;
    tl_point_rows(s->lists.level, p->in + j0, p->out + j0, c, x,
                  d->c_in * (int64_t)sizeof(TL_T), (void *)xq, (void *)dy,
                  d->c_out * (int64_t)sizeof(TL_T), (void *)dq);
    s->cur[n] = end;
    return c;
}

/* Kernel row n's pairs of the block [b0, b1) into xq[], dq[]: from pair
 * lists p (fetch-on-demand) or the table nbr (TL_WGRAD_PAIRS_OF); their
 * count, or -1 where the table names a row outside [-1, n_in). */
static inline int64_t TL_FN(tl_wgrad_pairs_of)(const tl_conv_desc *d, const TL_T *x,
                                               const TL_T *dy, const int32_t *nbr,
                                               const tl_pairs *p, int64_t n, int64_t b0,
                                               int64_t b1, TL_FN(tl_wgrad_scratch) *s,
                                               const TL_T **xq, const TL_T **dq) {
    if (p) return TL_FN(tl_wgrad_pairs_run)(d, p, n, b1, x, dy, s, xq, dq);
    if (s->tiles) { /* the block's tiles, listed once for the table, one after another */
        int64_t c = 0;
        const int64_t rows = s->tiles->tile_rows;
        for (int64_t t0 = b0; t0 < b1; t0 += rows) {
            const int64_t *at = s->tiles->start + t0 / rows * d->k + n;
            tl_point_rows(s->lists.level, s->tiles->in + at[0], s->tiles->rows + at[0],
                          at[1] - at[0], x, d->c_in * (int64_t)sizeof(TL_T), (void *)(xq + c),
                          (void *)(dy + t0 * d->c_out), d->c_out * (int64_t)sizeof(TL_T),
                          (void *)(dq + c));
            c += at[1] - at[0];
        }
        return c;
    }
    int64_t c;
    TL_WGRAD_PAIRS_OF(&s->lists, nbr, d->k, n, b0, b1, d->n_in, x, d->c_in, dy, d->c_out, xq,
                      dq, c);
    return c;
}

/* Whether the weight gradient of d reads its lists (the table's tile lists,
 * or each block's) by index (rows_t_16_runs) instead of through row pointers
 * listed from them first: one vector
 * of output channels and 16-row passes over whole input channels, the
 * layers where listing the pointers (tl_point_rows) showed beside the
 * multiply-adds (C = 16 in fp32: 10% of a LiDAR scan's samples, the kernel
 * 57%). */
static inline int TL_FN(tl_wgrad_by_runs)(const TL_FN(tl_mk_ops) *mk, const tl_conv_desc *d) {
    return mk->rows_t_16_runs && d->c_out * (int64_t)sizeof(TL_T) == 64 && d->c_in % 16 == 0 &&
           !TL_FN(tl_mk_wgrad_packs)(mk, d->c_in, d->c_out);
}

/* Kernel row n's pairs of the block [b0, b1) into run[], returning their
 * count and setting *runs: one run from the pair lists p (fetch-on-demand,
 * from the kernel row's cursor, which moves past them), a run per tile of
 * the table's tile lists L, or one, the block's own list l
 * (tl_wgrad_list_block). */
static int64_t TL_FN(tl_wgrad_runs_of)(const tl_conv_desc *d, const tl_pairs *p,
                                       const tl_tile_lists *L, TL_FN(tl_wgrad_scratch) *s,
                                       const TL_T *dy, int64_t n, int64_t b0, int64_t b1,
                                       tl_mk_run *run, int64_t *runs) {
    const tl_wgrad_lists *l = &s->lists;
    *runs = 1;
    if (p) {
        const int64_t j0 = s->cur[n], end = tl_pairs_next_at(p, n, j0, b1);
        run[0] = (tl_mk_run){p->in + j0, p->out + j0, dy, end - j0};
        s->cur[n] = end;
        return end - j0;
    }
    if (!L) {
        const int64_t at = n * (b1 - b0); /* the block's lists: b1 - b0 slots each */
        run[0] = (tl_mk_run){l->li + at, l->lr + at, dy + b0 * d->c_out, l->lc[n]};
        return l->lc[n];
    }
    int64_t c = 0;
    *runs = (b1 - b0 + L->tile_rows - 1) / L->tile_rows;
    for (int64_t j = 0; j < *runs; j++) {
        const int64_t t0 = b0 + j * L->tile_rows, *at = L->start + t0 / L->tile_rows * d->k + n;
        run[j] = (tl_mk_run){L->in + at[0], L->rows + at[0], dy + t0 * d->c_out, at[1] - at[0]};
        c += at[1] - at[0];
    }
    return c;
}

/* tl_wgrad_rows by index (tl_wgrad_by_runs), over pair lists p, the table's
 * tile lists or each block's own list: the same pairs in the same order into the same
 * 16-row passes, so the same sums; kernel row n + 1's runs are found before
 * n's passes, which ask for its rows.  Returns 1 where a block's list finds
 * an entry outside [-1, n_in) (as tl_wgrad_rows), else 0. */
static int TL_FN(tl_wgrad_runs)(const tl_conv_desc *d, const TL_T *x, const TL_T *dy,
                                const int32_t *nbr, const tl_pairs *p, int64_t o0, int64_t o1,
                                int64_t n0, int64_t n1, TL_T *acc,
                                TL_FN(tl_wgrad_scratch) *s) {
    const int64_t mat = d->c_in * d->c_out;
    const tl_tile_lists *L = s->tiles;
    if (p)
        for (int64_t n = n0; n < n1; n++) s->cur[n] = tl_pairs_first_at(p, n, o0);
    for (int64_t b0 = o0; b0 < o1; b0 += s->block) {
        const int64_t b1 = b0 + s->block < o1 ? b0 + s->block : o1;
        if (!p && !L && tl_wgrad_list_block(&s->lists, nbr, d->k, b0, b1, n0, n1, d->n_in))
            return 1;
        int64_t m = 0, mn = 0; /* runs of kernel rows n and n + 1 */
        int64_t c = n0 < n1 ? TL_FN(tl_wgrad_runs_of)(d, p, L, s, dy, n0, b0, b1,
                                                      s->runs[n0 % 2], &m)
                            : 0;
        for (int64_t n = n0; n < n1; n++) {
            tl_mk_run *next = n + 1 < n1 ? s->runs[(n + 1) % 2] : NULL;
            const int64_t after =
                next ? TL_FN(tl_wgrad_runs_of)(d, p, L, s, dy, n + 1, b0, b1, next, &mn) : 0;
            for (int64_t ci = 0; c > 0 && ci < d->c_in; ci += 16) { /* pass: x line ci / 16 */
                TL_T *o[16];
                for (int64_t r = 0; r < 16; r++) o[r] = acc + n * mat + (ci + r) * d->c_out;
                s->mk->rows_t_16_runs(m, s->runs[n % 2], ci, x, d->c_in, o, after ? next : NULL,
                                      ci / 16 * 64, ci == 0);
            }
            c = after;
            m = mn;
        }
    }
    return 0;
}

/* acc (k, c_in, c_out) += the contributions of output rows [o0, o1) through
 * kernel rows [n0, n1): blocks of s->block rows, every kernel row per
 * block, so the block's nbr rows and the x and dy rows they name are reused
 * from cache across kernel rows.  The pairs come from the table nbr, or
 * (p non-NULL, fetch-on-demand) from pair lists sorted by output row, the
 * same pairs in the same order, so both give the same sums.  Returns 1 at a
 * block or kernel row naming an entry outside [-1, n_in) (see
 * tl_wgrad_list_block and TL_WGRAD_LIST), before any row it names is read,
 * else 0. */
static int TL_FN(tl_wgrad_rows)(const tl_conv_desc *d, const TL_T *x, const TL_T *dy,
                                const int32_t *nbr, const tl_pairs *p, int64_t o0, int64_t o1,
                                int64_t n0, int64_t n1, TL_T *acc,
                                TL_FN(tl_wgrad_scratch) *s) {
    if (s->runs[0]) return TL_FN(tl_wgrad_runs)(d, x, dy, nbr, p, o0, o1, n0, n1, acc, s);
    const int64_t mat = d->c_in * d->c_out;
    const int packs = TL_FN(tl_mk_wgrad_packs)(s->mk, d->c_in, d->c_out);
    if (p)
        for (int64_t n = n0; n < n1; n++) s->cur[n] = tl_pairs_first_at(p, n, o0);
    for (int64_t b0 = o0; b0 < o1; b0 += s->block) {
        int64_t b1 = b0 + s->block < o1 ? b0 + s->block : o1;
        if (!p && !s->tiles &&
            tl_wgrad_list_block(&s->lists, nbr, d->k, b0, b1, n0, n1, d->n_in))
            return 1;
        /* Kernel row n's pairs in slot n % 2, listed one kernel row ahead so
         * that n's micro-kernel can ask for n + 1's x rows while it runs
         * (strided maps read each x row once, from memory: the packing
         * waited on them). */
        int64_t c = n0 < n1 ? TL_FN(tl_wgrad_pairs_of)(d, x, dy, nbr, p, n0, b0, b1, s,
                                                       s->xq[n0 % 2], s->dq[n0 % 2])
                            : 0;
        if (c < 0) return 1;
        for (int64_t n = n0; n < n1; n++) {
            const TL_T **xq = s->xq[n % 2], **dq = s->dq[n % 2], **xn = s->xq[(n + 1) % 2];
            const int64_t next = n + 1 < n1 ? TL_FN(tl_wgrad_pairs_of)(d, x, dy, nbr, p, n + 1,
                                                                       b0, b1, s, xn,
                                                                       s->dq[(n + 1) % 2])
                                            : 0;
            if (next < 0) return 1; /* before n's kernels ask for its rows */
            if (c > 0 && packs) {
                /* The pairs' x rows packed one after another a chunk at a
                 * time (tl_mk_ops.panel), so the panel's broadcasts read at a
                 * fixed stride, with no pointer load per pair, while the dy
                 * rows are read in place.  Whole rows: strips of 4 input
                 * channels side by side (before round nine) stored 16 bytes
                 * into each of c_in / 4 places per pair and waited on the
                 * stores (0.97-1.11x at C >= 64). */
                s->mk->panel(d->c_out, c, d->c_in, xq, s->xp, dq, acc + n * mat, d->c_out, xn,
                             s->dq[(n + 1) % 2], next);
            } else if (c > 0) {
                TL_FN(tl_mk_outer_acc)(s->mk, d->c_in, d->c_out, c, xq, dq, acc + n * mat, xn,
                                       s->dq[(n + 1) % 2], next);
            }
            c = next;
        }
    }
    return 0;
}

/* dw from the table nbr, or (nbr NULL) from checked pair lists p; from the
 * table's checked tile lists L instead where given and of tiles that divide
 * the blocks. */
static tl_status TL_FN(tl_weight_grad)(const tl_ctx *ctx, const tl_conv_desc *d,
                                       const TL_T *x, const TL_T *dy, const int32_t *nbr,
                                       const tl_pairs *p, const tl_tile_lists *L, TL_T *dw) {
    const int64_t mat = d->c_in * d->c_out, all = d->k * mat;
    const tl_wgrad_split split = tl_wgrad_split_of(d);
    if (L && (L->tile_rows < 1 || split.block % L->tile_rows)) L = NULL; /* not whole tiles */
    const int64_t parts = split.parts, ldx = TL_FN(tl_mk_packed_ld)(d->c_in);
    TL_T *partial = dw;
    if (parts > 1) {
        partial = tl_mem_aligned(sizeof(TL_T) * (size_t)(parts * all));
        if (!partial) return TL_ERR_NOMEM;
    }
    int failed = 0, invalid = 0;
#pragma omp parallel num_threads(ctx->threads) reduction(| : failed, invalid)
    {
        TL_FN(tl_wgrad_scratch) s;
        s.mk = TL_FN(tl_mk_pick)(ctx);
        s.block = split.block;
        s.cur = p ? malloc(sizeof(int64_t) * (size_t)d->k) : NULL;
        s.tiles = L;
        /* Two kernel rows' runs: one per tile of a block (tiles divide
         * blocks), or one, from the pair lists or the block's own list. */
        const int64_t runs = !TL_FN(tl_wgrad_by_runs)(s.mk, d) ? 0
                             : p || (!L && split.listed)       ? 1
                             : L                               ? split.block / L->tile_rows
                                                               : 0;
        s.runs[0] = runs ? malloc(sizeof(tl_mk_run) * (size_t)(2 * runs)) : NULL;
        s.runs[1] = s.runs[0] ? s.runs[0] + runs : NULL;
        /* Row pointers and packed x rows, which runs read by index without. */
        const TL_T **rows = runs ? NULL : malloc(sizeof(*rows) * (size_t)(4 * split.block));
        s.xq[0] = rows;
        s.xq[1] = rows ? rows + split.block : NULL;
        s.dq[0] = rows ? rows + 2 * split.block : NULL;
        s.dq[1] = rows ? rows + 3 * split.block : NULL;
        s.xp = runs ? NULL : malloc(sizeof(TL_T) * (size_t)(TL_FN(tl_mk_panel_pairs)(ldx) * ldx));
        /* Pair lists and tile lists need no listing. */
        const int level = tl_simd_vector_capped(ctx->simd_cap);
        const int ok = tl_wgrad_lists_init(&s.lists, split.listed && !p && !L, level, d->k,
                                           split.block) &&
                       (runs ? s.runs[0] != NULL : rows && s.xp) && (s.cur || !p);
        failed |= !ok;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < parts * split.groups; t++) {
            if (!ok || invalid) continue;
            const tl_wgrad_task w = tl_wgrad_task_of(&split, d, t);
            TL_T *acc = partial + w.part * all;
            memset(acc + w.n0 * mat, 0, sizeof(TL_T) * (size_t)((w.n1 - w.n0) * mat));
            if (w.o0 < w.o1)
                invalid |= TL_FN(tl_wgrad_rows)(d, x, dy, nbr, p, w.o0, w.o1, w.n0, w.n1, acc,
                                                &s);
        }
        free(rows);
        free(s.xp);
        free(s.cur);
        free(s.runs[0]);
        tl_wgrad_lists_free(&s.lists);
    }
    if (parts > 1 && !failed && !invalid)
        TL_FN(tl_mk_sum_parts)(ctx->threads, partial, parts, all, dw);
    if (parts > 1) free(partial);
    return invalid ? TL_ERR_INVALID : failed ? TL_ERR_NOMEM : TL_OK;
}

#undef TL_FN
#undef TL_CAT
#undef TL_CAT2
