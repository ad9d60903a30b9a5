/* The implicit GEMM (forward and weight gradient) for bfloat16 and float16
 * features and weights: products summed in float, each output rounded once to
 * the input's type.
 * Three ways, chosen per call by the CPU's instruction set:
 *   - bfloat16 on CPUs with AMX: the forward's listed x rows, 16 at a time,
 *     and the weight gradient's pairs through the tile unit
 *     (tl_microkernel_amx.c); float16 there too where the layer is wide
 *     enough (TL_F16_AMX_FORWARD_MIN and _MIN_ROWS, TL_F16_AMX_WGRAD_MIN),
 *     each value split into two bfloat16 parts and each block of sums four
 *     tile products (tl_amx_pack_f16), so every float16 product is summed
 *     exactly; a call that meets an infinity or NaN runs again through the
 *     float kernels;
 *   - bfloat16 on AVX512_BF16: the x rows are read as they are and multiplied
 *     by channel pairs with vdpbf16ps (tl_microkernel_bf16.c);
 *   - otherwise (float16 without AMX or in narrow layers, bfloat16 without
 *     AVX512_BF16): each tile's
 *     x rows are converted to float in a small staging buffer (F16C for
 *     float16; the span its lists name where rows are reused, else each kernel
 *     row's listed rows) and run through the float micro-kernels against float
 *     panels.
 * The weight gradient (below) runs the same three ways, its dot products
 * along pairs of pairs; staged, a block's dy rows are converted once.  Tiles,
 * panels, parts and the order of each output's sums are those of the float
 * kernels (tl_dataflow_implicit_gemm_impl.h), the lead kernel row first
 * (tl_fwd_order; until round thirty-five the staged forward ran kernel rows
 * in plain order, so its outputs differed from the float forward's in the last
 * bit); a forward tile's sums live in a float block until its last kernel row.
 * Staged, the forward is therefore the float forward of the same values
 * rounded once, bit for bit (tests/ops/test_cpu_half.py). */
#include <stdlib.h>
#include <string.h>

#include "tl_dataflow_implicit_gemm.h"
#include "tl_dataflow_implicit_gemm_tiles.h"
#include "tl_half.h"
#include "tl_microkernel_amx.h"
#include "tl_microkernel_bf16.h"
#include "tl_simd.h"

#define TL_T float
#define TL_SFX f32
#include "tl_microkernel_impl.h"
#undef TL_T
#undef TL_SFX

/* A staged tile converts the x rows its lists span, [lo, hi], once, when
 * the listed pairs are at least twice as many (each row is reused) and the
 * span is at most TL_HALF_WINDOW times the tile's rows and TL_HALF_WINDOW_BYTES
 * as float (sorted supports keep a tile's neighbours near its rows:
 * submanifold maps); otherwise each kernel row's listed rows, as listed
 * (strided maps, where each x row is in about one pair). */
#define TL_HALF_WINDOW 4
#define TL_HALF_WINDOW_BYTES (1 << 20)

/* Multiply-adds per pair from which staged tiles have twice the rows (see
 * tl_half_forward). */
#define TL_HALF_WIDE_TILES (64 * 64)

/* What one call shares between its workers. */
typedef struct tl_half_call {
    const tl_conv_desc *d;
    tl_simd level;
    int dot;                 /* bfloat16 dot-product kernels; else staged through float */
    int amx;                 /* bfloat16 through AMX tiles (dot is set too) */
    int f16_amx;             /* float16 split through AMX tiles (amx and dot are set too) */
    const tl_mk_ops_f32 *mk; /* the float micro-kernels (staged) */
    int64_t rows;            /* output rows per tile */
    int64_t panel_cols;      /* see tl_panel_cols */
    const uint16_t *pw_dot;  /* packed pair panels (dot) */
    const uint16_t *pw_amx;  /* packed tile weights (amx: tl_amx_pack, tl_amx_pack_f16) */
    const float *pw_f32;     /* packed float panels (staged) */
    int64_t window_rows;     /* staged: most x rows a tile converts as one span */
    const tl_tile_lists *lists; /* the table's tile lists of f->rows a tile, or NULL */
} tl_half_call;

/* float16 runs through the tiles (tl_amx_pack_f16) where c_in x c_out is at
 * least this, in the forward and in the weight gradient: below, four tile
 * products per block (and, in the weight gradient, the split of the
 * transposed x rows) cost more than the float kernels' conversions save.
 * Measured on the Intel Xeon of round twenty (docs/benchmarks/README.md):
 * forward 0.82-0.89x at 16 x 16, 1.00-1.02x at 16 x 32, 1.09-1.43x at
 * 24 x 24, up to 1.87x at 128; weight gradient 0.92-1.11x at 32, 0.97-1.20x
 * at 48, 1.07-1.33x at 64, up to 1.9x at 256.  The forward also needs
 * TL_F16_AMX_MIN_ROWS output rows: it splits and packs every weight per call
 * (a level of 457 rows, 5,039 pairs: 0.95x at C = 64, 1.14-1.17x at 128-256;
 * 1,817 rows: 1.51-1.55x). */
#define TL_F16_AMX_FORWARD_MIN (16 * 32)
#define TL_F16_AMX_WGRAD_MIN (64 * 64)
#define TL_F16_AMX_MIN_ROWS 256

/* bfloat16's weight gradient runs the dot products (tl_bf16_wgrad_pack and
 * _panel) from this many multiply-adds per packed value on: each pair's x
 * and dy rows are interleaved into pairs of channels (c_in + c_out values)
 * for its c_in x c_out multiply-adds, and below 32 (C = 64 square) the
 * packing costs more than the dot products save; narrower layers convert to
 * float and run the float kernels, as on CPUs without AVX512_BF16.  Staged
 * against the dot products on the AMD EPYC of round twenty-three (SubmConv3d
 * maps): 1.33x at C = 16-48 on the LiDAR scan, 1.07-1.45x on the surface,
 * 0.77-0.93x at C = 64; k2 s2 maps 1.16-1.42x at C = 16, at C = 48 1.42x
 * (LiDAR) and 0.93x (surface). */
#define TL_BF16_DOT_WGRAD_PER_VALUE 32

/* Chooses f's kernels from the CPU's level and the dtype; `tiles`: float16
 * may run through the tiles from `least` multiply-adds per pair on (0 for a
 * call's rerun after an infinity or NaN). */
static void tl_half_kernels(tl_half_call *f, int tiles, int64_t least) {
    const tl_conv_desc *d = f->d;
    const int amx = TL_SIMD_AMX && f->level >= TL_SIMD_V4_AMX;
    f->f16_amx = amx && tiles && d->dtype == TL_F16 && d->c_in * d->c_out >= least;
    f->dot = (f->level >= TL_SIMD_V4_BF16 && d->dtype == TL_BF16) || f->f16_amx;
    f->amx = (amx && d->dtype == TL_BF16) || f->f16_amx;
}

/* Scratch of one worker: the tile's listed x rows (as stored, and staged as
 * float), their output rows in the tile's float block, a zero x row and a sink
 * output row that pad the last group of a kernel row (as in the float
 * forward). */
typedef struct tl_half_scratch {
    int32_t *li, *lr;    /* k x tile rows: listed x rows, tile rows (tl_list_tile) */
    int64_t *lc;         /* k: listed per kernel row */
    const int32_t **il;  /* k: kernel row n's x rows (li + n * tile rows, or the kept lists) */
    const int32_t **rl;  /* k: kernel row n's tile rows (lr + n * tile rows, or the same) */
    const uint16_t **xh; /* tile rows + 3 */
    const float **xf;    /* tile rows + 3 */
    float **yr;          /* tile rows + 3 */
    float *acc;          /* tile rows x TL_TILE_COLS */
    float *stage;        /* (tile rows + 3) x c_in, staged only */
    float *window;       /* window_rows x c_in, staged only */
    float *zero;         /* c_in + 2 zero floats, also read as bfloat16 zeros */
    float *sink;         /* TL_TILE_COLS values, never read */
    uint16_t *abuf;      /* amx: 32 x tl_amx_depth(c_in) (f16_amx: twice), 64-byte aligned */
    float *cbuf;         /* amx: 16 x 64, 64-byte aligned */
    int32_t *zr;         /* tile rows: rows without a neighbour (tl_tile_single) */
    uint8_t *hit;        /* tile rows: scratch of tl_tile_single */
} tl_half_scratch;

static int tl_half_scratch_init(tl_half_scratch *s, const tl_half_call *f) {
    const int64_t rows = f->rows + 3, cin = f->d->c_in;
    const int64_t k = f->d->k > 0 ? f->d->k : 1;
    s->li = malloc(sizeof(int32_t) * (size_t)(f->rows * k));
    s->lr = malloc(sizeof(int32_t) * (size_t)(f->rows * k));
    s->lc = malloc(sizeof(int64_t) * (size_t)k);
    s->il = malloc(sizeof(*s->il) * (size_t)k);
    s->rl = malloc(sizeof(*s->rl) * (size_t)k);
    s->xh = malloc(sizeof(*s->xh) * (size_t)rows);
    s->xf = malloc(sizeof(*s->xf) * (size_t)rows);
    s->yr = malloc(sizeof(*s->yr) * (size_t)rows);
    s->acc = tl_mem_aligned(sizeof(float) * (size_t)(f->rows * TL_TILE_COLS));
    s->stage = f->dot ? NULL : malloc(sizeof(float) * (size_t)(rows * cin + 1));
    s->window = f->dot ? NULL : malloc(sizeof(float) * (size_t)(f->window_rows * cin + 1));
    s->zero = calloc((size_t)(cin + 2 + TL_TILE_COLS), sizeof(float));
    s->sink = s->zero ? s->zero + cin + 2 : NULL;
    const int64_t parts = f->f16_amx ? 2 : 1;
    s->abuf = f->amx ? tl_mem_aligned(sizeof(uint16_t) * (size_t)(32 * parts * tl_amx_depth(cin)))
                     : NULL;
    s->cbuf = f->amx ? tl_mem_aligned(sizeof(float) * 16 * 64) : NULL;
    s->zr = malloc(sizeof(int32_t) * (size_t)f->rows);
    s->hit = malloc((size_t)f->rows);
    return s->li && s->lr && s->lc && s->il && s->rl && s->xh && s->xf && s->yr && s->acc &&
           s->zr && s->hit && (f->dot || (s->stage && s->window)) && s->zero &&
           (!f->amx || (s->abuf && s->cbuf));
}

static void tl_half_scratch_free(tl_half_scratch *s) {
    free(s->li);
    free(s->lr);
    free(s->lc);
    free(s->il);
    free(s->rl);
    free(s->xh);
    free(s->xf);
    free(s->yr);
    free(s->acc);
    free(s->stage);
    free(s->window);
    free(s->zero);
    free(s->abuf);
    free(s->cbuf);
    free(s->zr);
    free(s->hit);
}

/* Listed rows [p, p + R) (R = 4 or 2; or a multiple of 8: all of a
 * narrow tile's groups of 8, in one call) += their x rows times a kernel
 * row's panel of wb columns starting at tile column j; = where `set`
 * (tl_tile_single).  The panel is the caller's, worked out once per panel
 * (tl_panel_ld divides: two divisions per group of 4 were 1-2% of a C = 64
 * float16 forward on the Zen 1): the dot products' pair panel over all
 * input channels, or the float kernels' of the kb input channels from the
 * caller's c0 on (blocks of TL_FWD_CIN_BLOCK, as the float forward; the
 * caller moves the float x rows s->xf to channel c0), rows ld apart. */
static void tl_half_group(const tl_half_call *f, tl_half_scratch *s, int set, int R, int64_t p,
                          int64_t j, int64_t wb, int64_t kb, const void *panel, int64_t ld) {
    float *o[4]; /* groups of 4 or 2: their rows' columns from j */
    if (R < 8)
        for (int r = 0; r < R; r++) o[r] = s->yr[p + r] + j;
    if (f->dot) {
#if TL_SIMD_X86
        if (R >= 8)
            tl_bf16_rows_8(set, wb, f->d->c_in, R, s->xh + p, panel, s->yr + p, j);
        else
            tl_bf16_rows(set, R, wb, f->d->c_in, s->xh + p, panel, o);
#endif
        return;
    }
    const float *fp = panel;
    if (R >= 8)
        (set ? f->mk->rows_8_set : f->mk->rows_8)(wb, kb, R, s->xf + p, fp, ld, s->yr + p, j);
    else if (R == 2)
        (set ? f->mk->rows_2_set : f->mk->rows_2)(wb, kb, s->xf + p, fp, ld, o);
    else
        (set ? f->mk->rows_4_set : f->mk->rows_4)(wb, kb, s->xf + p, fp, ld, o);
}

/* Kernel row n's c listed rows, x rows idx[] and tile rows rows[] (the
 * float block's, row stride cw), += their x rows times n's panels (= where
 * `set`); `lo`: the first x row of the converted span (s->window), or -1
 * where the listed rows are converted (s->stage).  (nidx, nc): the next
 * kernel row's x rows, asked for while this one computes where staged.
 * Returns 2 where f16_amx read an infinity or NaN, else 0. */
static int tl_half_run(const tl_half_call *f, tl_half_scratch *s, const uint16_t *x, int64_t n,
                       const int32_t *idx, const int32_t *rows, int64_t c, int set,
                       int64_t co0, int64_t cw, int64_t lo, const int32_t *nidx, int64_t nc) {
    const tl_conv_desc *d = f->d;
    const int64_t cin = d->c_in, width = f->panel_cols;
    const int64_t cp = (cin + 1) / 2 * 2; /* the dot products' channel pairs */
    /* Groups of 8 rows on panels at most 32 floats wide with AVX-512 (the dot
     * products' 8-row blocks hold 2 vectors of 16), or rows8_max_cols (the
     * float kernels', AVX-512's 3 vectors, AVX2's 2), else 4.  AVX2 ran
     * groups of 4 until round thirty-six: staged bfloat16 and float16 at
     * C = 8 ran 1.18-1.40x and at C = 16 1.11-1.20x with 8 (the Zen 1's
     * subm3, k2 s2 and inverse maps; C = 32-64 0.97-1.03x), bitwise. */
    const int64_t eight_cols = f->level < TL_SIMD_V3 ? 0 : f->dot ? 32 : f->mk->rows8_max_cols;
    if (lo >= 0 && !f->dot) /* the float rows of the converted span, as rows of a float x */
        tl_point_rows(f->level, idx, rows, c,
                      (const void *)((uintptr_t)s->window -
                                     (uintptr_t)(lo * cin) * sizeof(float)),
                      cin * (int64_t)sizeof(float), (void *)s->xf, s->acc,
                      cw * (int64_t)sizeof(float), (void *)s->yr);
    else
        tl_point_rows(f->level, idx, rows, c, x, cin * (int64_t)sizeof(uint16_t), (void *)s->xh,
                      s->acc, cw * (int64_t)sizeof(float), (void *)s->yr);
    if (f->f16_amx) {
#if TL_SIMD_AMX
        if (tl_amx_rows_f16(set, c, cin, d->c_out, co0, cw, s->xh,
                            f->pw_amx + 2 * n * tl_amx_row_elems(cin, d->c_out), s->yr, s->abuf,
                            s->cbuf))
            return 2;
#endif
        return 0;
    }
    if (f->amx) {
#if TL_SIMD_AMX
        tl_amx_rows(set, c, cin, co0, cw, s->xh,
                    f->pw_amx + n * tl_amx_row_elems(cin, d->c_out), s->yr, s->abuf, s->cbuf);
#endif
        return 0;
    }
    if (lo < 0 && !f->dot) {
        tl_half_rows_to_f32(f->level, d->dtype, s->xh, c, cin, cin, s->stage);
        for (int64_t t = 0; t < c; t++) s->xf[t] = s->stage + t * cin;
        /* the next kernel row's x rows load while this one computes */
        const int64_t bytes = cin * (int64_t)sizeof(uint16_t);
        TL_PREFETCH_LISTED(x, nidx, nc, bytes, bytes);
    }
    int64_t full;
    const int64_t pad = tl_group_pad(c, &full);
    for (; c < full + pad; c++) {
        s->xh[c] = (const uint16_t *)(const void *)s->zero;
        s->xf[c] = s->zero;
        s->yr[c] = s->sink;
    }
    const int64_t kc = !f->dot && cin > TL_FWD_CIN_BLOCK ? TL_FWD_CIN_BLOCK : cin;
    for (int64_t j = 0; j < cw; j += width) {
        const int64_t wb = cw - j < width ? cw - j : width;
        const int64_t ld = f->dot ? 0 : tl_panel_ld(wb, f->mk->pad_cols);
        for (int64_t c0 = 0; c0 < cin; c0 += kc) {
            const int64_t kb = cin - c0 < kc ? cin - c0 : kc;
            const int first = set && c0 == 0;
            const void *panel =
                f->dot ? (const void *)(f->pw_dot + (n * d->c_out + co0 + j) * cp)
                       : (const void *)(f->pw_f32 +
                                        tl_panel_at(d, f->mk->pad_cols, n, co0 + j, c0, ld));
            if (c0 > 0)
                for (int64_t r = 0; r < full + pad; r++) s->xf[r] += kc;
#define TL_GROUP8(c8) tl_half_group(f, s, first, (int)(c8), 0, j, wb, kb, panel, ld)
#define TL_GROUP(p, R) tl_half_group(f, s, first, (int)(R), (p), j, wb, kb, panel, ld)
            TL_RUN_GROUPS(full, pad, (f->dot ? wb : ld) <= eight_cols,
                          f->dot && j == 0 ? tl_rows_ahead(cin * wb / 2) : 0, s->xh,
                          cin * (int64_t)sizeof(uint16_t), TL_GROUP8, TL_GROUP);
#undef TL_GROUP
#undef TL_GROUP8
        }
        if (kc < cin)
            for (int64_t r = 0; r < full + pad; r++) s->xf[r] -= (cin - 1) / kc * kc;
    }
    return 0;
}

/* One tile: output rows [o0, o0+m), columns [co0, co0+cw), as the float
 * forward's tl_forward_tile, into the float block s->acc (row stride cw),
 * then rounded into y.  Where no row has two neighbours (tl_tile_single),
 * each listed row's sums are written into the block instead of added to a
 * zeroed row, and only the others zeroed.  (Writing each row's first kernel
 * row's sums on every tile, as the float forward does on wide tiles, ran
 * 0.98-1.01x here: the block stays in cache.)  Returns 1 at the first nbr
 * entry outside [-1, n_in), before any row it names is read; 2 where f16_amx
 * read an infinity or NaN (the tile's outputs are then not written); else 0. */
static int tl_half_tile(const tl_half_call *f, const uint16_t *x, const int32_t *nbr, uint16_t *y,
                        int64_t o0, int64_t m, int64_t co0, int64_t cw, tl_half_scratch *s) {
    const tl_conv_desc *d = f->d;
    const int64_t k = d->k, cin = d->c_in, cout = d->c_out;
    /* Below 1024 multiply-adds per row (C = 16) the check costs more than the
     * zeroing it saves (bfloat16 0.90x on the LiDAR scan's inverse map); there
     * the block is zeroed before the listing, as before the check existed
     * (after it: 0.95-0.97x). */
    const int check = cin * cw >= 1024;
    if (!check) memset(s->acc, 0, sizeof(float) * (size_t)(m * cw));
    if (f->lists) { /* listed once, for tiles of f->rows rows */
        tl_tile_lists_of(f->lists, o0 / f->rows, k, s->il, s->rl, s->lc);
    } else {
        if ((int64_t)tl_list_tile(f->level, nbr, o0, m, k, s->li, s->lr, s->lc) > d->n_in)
            return 1;
        for (int64_t n = 0; n < k; n++) {
            s->il[n] = s->li + n * m;
            s->rl[n] = s->lr + n * m;
        }
    }
    int64_t nz = 0;
    const int64_t lead = tl_fwd_lead(k); /* run first, as the float forward (tl_fwd_order) */
    const int single = check && tl_tile_single(s->rl, s->lc, k, m, 0, s->hit, s->zr, &nz);
    /* led: the lead kernel row names every row of the tile, once (a submanifold
     * map's centre), so its sums are written and the block needs no zeroing */
    const int led = check && !single && lead >= 0 && s->lc[lead] == m;
    if (single)
        for (int64_t r = 0; r < nz; r++)
            memset(s->acc + s->zr[r] * cw, 0, sizeof(float) * (size_t)cw);
    else if (check && !led)
        memset(s->acc, 0, sizeof(float) * (size_t)(m * cw));
    /* The span of listed x rows, when converting it whole beats converting the
     * listed rows one kernel row at a time (TL_HALF_WINDOW). */
    int64_t lo = -1;
    if (!f->dot) {
        int64_t listed = 0, a = d->n_in, b = -1;
        for (int64_t n = 0; n < k; n++) {
            listed += s->lc[n];
            tl_list_span(f->level, s->il[n], s->lc[n], &a, &b);
        }
        if (b >= a && 2 * (b - a + 1) <= listed && b - a + 1 <= f->window_rows) {
            lo = a;
            tl_half_row_to_f32(f->level, d->dtype, x + a * cin, (b - a + 1) * cin, s->window);
        }
    }
    int64_t i = 0;
    while (i < k && s->lc[tl_fwd_order(lead, i)] == 0) i++;
    while (i < k) { /* each nonempty kernel row, asking for the next one's x rows */
        const int64_t n = tl_fwd_order(lead, i);
        int64_t ii = i + 1;
        while (ii < k && s->lc[tl_fwd_order(lead, ii)] == 0) ii++;
        const int64_t nn = ii < k ? tl_fwd_order(lead, ii) : k;
        if (tl_half_run(f, s, x, n, s->il[n], s->rl[n], s->lc[n], single || (led && i == 0),
                        co0, cw, lo, nn < k ? s->il[nn] : NULL, nn < k ? s->lc[nn] : 0))
            return 2;
        i = ii;
    }
    if (cw == cout) /* the block's rows are y's, one after another */
        tl_f32_row_to_half(f->level, d->dtype, s->acc, m * cw, y + o0 * cout);
    else
        for (int64_t q = 0; q < m; q++)
            tl_f32_row_to_half(f->level, d->dtype, s->acc + q * cw, cw, y + (o0 + q) * cout + co0);
    return 0;
}

/* Packs the weights for the chosen kernels into *packed (freed by the
 * caller): tile blocks, bfloat16 pair panels, or float panels of the
 * converted weights.  *finite: 0 where f16_amx met an infinite or NaN weight
 * (tl_amx_pack_f16). */
static tl_status tl_half_pack(tl_half_call *f, const uint16_t *w, void **packed, int *finite) {
    const tl_conv_desc *d = f->d;
    const int64_t all = d->k * d->c_in * d->c_out;
    if (f->amx) {
        const int64_t elems = d->k * tl_amx_row_elems(d->c_in, d->c_out) * (f->f16_amx ? 2 : 1);
        uint16_t *pw = tl_mem_aligned(sizeof(uint16_t) * (size_t)elems);
        if (!pw) return TL_ERR_NOMEM;
        *packed = pw;
        f->pw_amx = pw;
        if (!f->f16_amx) {
            tl_amx_pack(d, w, pw);
            return TL_OK;
        }
        return tl_amx_pack_f16(f->level, d, w, pw, finite);
    }
    if (f->dot) {
        uint16_t *pw = tl_mem_aligned(sizeof(uint16_t) * (size_t)tl_bf16_panel_elems(d));
        if (!pw) return TL_ERR_NOMEM;
        tl_bf16_pack_panels(d, f->panel_cols, w, pw);
        f->pw_dot = pw;
        *packed = pw;
        return TL_OK;
    }
    float *wf = malloc(sizeof(float) * (size_t)(all + 1));
    float *pw = tl_mem_aligned(sizeof(float) * (size_t)tl_packed_elems(d, f->mk->pad_cols));
    if (!wf || !pw) {
        free(wf);
        free(pw);
        return TL_ERR_NOMEM;
    }
    tl_half_row_to_f32(f->level, d->dtype, w, all, wf);
    tl_pack_panels(d, f->panel_cols, f->mk->pad_cols, (int64_t)sizeof(float), wf, pw);
    free(wf);
    f->pw_f32 = pw;
    *packed = pw;
    return TL_OK;
}

/* Output rows per tile of the forward with f's kernels. */
static int64_t tl_half_tile_rows(const tl_ctx *ctx, const tl_half_call *f) {
    /* Staged layers of 64 x 64 and wider take tiles of twice the float
     * forward's rows: a tile's span of x rows grows more slowly than its rows
     * (about 2.2 times a 512-row tile's on both scenes, 1.6 times a 1024-row
     * one's), so each x row is converted fewer times (1.00-1.05x at C = 64-256;
     * C = 32 ran 0.97-1.00x). */
    const int wide = !f->dot && f->d->c_in * f->d->c_out >= TL_HALF_WIDE_TILES;
    return tl_fwd_tile_rows(ctx, f->d, (int64_t)sizeof(float) / (wide ? 2 : 1));
}

int64_t tl_implicit_gemm_half_tile_rows(const tl_ctx *ctx, const tl_conv_desc *d) {
    tl_half_call f = {.d = d, .level = tl_simd_capped(ctx->simd_cap)};
    tl_half_kernels(&f, d->n_out >= TL_F16_AMX_MIN_ROWS, TL_F16_AMX_FORWARD_MIN);
    return tl_half_tile_rows(ctx, &f);
}

/* The forward; `tiles`: float16 may run through the tiles; `lists`: the
 * table's tile lists (or NULL), used where they are of this call's tiles. */
static tl_status tl_half_forward(const tl_ctx *ctx, const tl_conv_desc *d, const uint16_t *x,
                                 const uint16_t *w, const int32_t *nbr,
                                 const tl_tile_lists *lists, uint16_t *y, int tiles) {
    tl_half_call f = {.d = d, .level = tl_simd_capped(ctx->simd_cap), .mk = tl_mk_pick_f32(ctx)};
    tl_half_kernels(&f, tiles && d->n_out >= TL_F16_AMX_MIN_ROWS, TL_F16_AMX_FORWARD_MIN);
    f.rows = tl_half_tile_rows(ctx, &f);
    f.lists = lists && lists->tile_rows == f.rows ? lists : NULL;
    f.window_rows = TL_HALF_WINDOW_BYTES / ((d->c_in > 0 ? d->c_in : 1) * (int64_t)sizeof(float));
    if (f.window_rows > TL_HALF_WINDOW * f.rows) f.window_rows = TL_HALF_WINDOW * f.rows;
    /* A dot-product block is 4 vectors of 16 columns, each 2 channels of
     * 2 bytes: a panel column costs c_in x 2 bytes, as in bfloat16. */
    f.panel_cols = f.dot ? tl_panel_cols(d, 64, (int64_t)sizeof(uint16_t))
                         : tl_panel_cols(d, f.mk->block_cols, (int64_t)sizeof(float));
    void *packed = NULL;
    int finite = 1;
    tl_status st = tl_half_pack(&f, w, &packed, &finite);
    if (st != TL_OK || !finite) {
        free(packed);
        return st != TL_OK ? st : tl_half_forward(ctx, d, x, w, nbr, lists, y, 0);
    }
    const int64_t row_tiles = (d->n_out + f.rows - 1) / f.rows;
    const int64_t col_tiles = (d->c_out + TL_TILE_COLS - 1) / TL_TILE_COLS;
    int failed = 0, invalid = 0, nonfinite = 0;
#pragma omp parallel num_threads(ctx->threads) reduction(| : failed, invalid, nonfinite)
    {
        tl_half_scratch s;
        int ok = tl_half_scratch_init(&s, &f);
        failed |= !ok;
#if TL_SIMD_AMX
        if (f.amx) tl_amx_start();
#endif
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < row_tiles * col_tiles; t++) {
            if (!ok || invalid || nonfinite) continue;
            int64_t o0 = (t / col_tiles) * f.rows;
            int64_t co0 = (t % col_tiles) * TL_TILE_COLS;
            int64_t m = d->n_out - o0 < f.rows ? d->n_out - o0 : f.rows;
            int64_t cw = d->c_out - co0 < TL_TILE_COLS ? d->c_out - co0 : TL_TILE_COLS;
            const int r = tl_half_tile(&f, x, nbr, y, o0, m, co0, cw, &s);
            invalid |= r == 1;
            nonfinite |= r == 2;
        }
#if TL_SIMD_AMX
        if (f.amx) tl_amx_stop();
#endif
        tl_half_scratch_free(&s);
    }
    free(packed);
    if (invalid) return TL_ERR_INVALID;
    if (failed) return TL_ERR_NOMEM;
    /* an infinity or NaN in x: every output again, through the float kernels */
    return nonfinite ? tl_half_forward(ctx, d, x, w, nbr, lists, y, 0) : TL_OK;
}

tl_status tl_implicit_gemm_forward_half(const tl_ctx *ctx, const tl_conv_desc *d,
                                        const uint16_t *x, const uint16_t *w,
                                        const int32_t *nbr, const tl_tile_lists *lists,
                                        uint16_t *y) {
    return tl_half_forward(ctx, d, x, w, nbr, lists, y, 1);
}

/* ---- weight gradient ---------------------------------------------------------- */

/* Scratch of one weight-gradient worker: a block's pairs (x and dy rows as
 * stored), and either their packed pair pairs (dot) or their float copies
 * (staged). */
typedef struct tl_half_wg_scratch {
    const uint16_t *xq[TL_WGRAD_PAIRS], *dq[TL_WGRAD_PAIRS];
    const float *xf[TL_WGRAD_PAIRS], *df[TL_WGRAD_PAIRS];
    uint32_t *xp;  /* dot: (c_in rounded up to 4) x TL_WGRAD_PAIRS / 2 */
    uint16_t *dp;  /* dot: TL_WGRAD_PAIRS x c_out */
    uint16_t *tmp; /* dot: 2 x (c_in rounded up to 4) */
    float *stage;  /* staged: TL_WGRAD_PAIRS x rows of c_in rounded up to 4, then the
                    * block's dy rows */
    uint32_t *xt;  /* amx: tl_amx_wgrad_x_units(TL_WGRAD_PAIRS, c_in) (f16_amx: twice),
                    * 64-byte aligned */
    uint16_t *dt;  /* amx: tl_amx_wgrad_dy_elems(TL_WGRAD_PAIRS, c_out), the same */
    float *cbuf;   /* amx: 16 x 64, the same */
    tl_wgrad_lists lists;
} tl_half_wg_scratch;

static int tl_half_wg_init(tl_half_wg_scratch *s, const tl_conv_desc *d,
                           const tl_wgrad_split *split, const tl_half_call *f) {
    const int dot = f->dot, amx = f->amx, parts = f->f16_amx ? 2 : 1;
    const int64_t cin4 = (d->c_in + 3) / 4 * 4;
    const int pack = dot && !amx; /* the dot-product kernels' packed pairs */
    const int64_t xt = amx ? parts * tl_amx_wgrad_x_units(TL_WGRAD_PAIRS, d->c_in) : 0;
    const int64_t dt = amx ? parts * tl_amx_wgrad_dy_elems(TL_WGRAD_PAIRS, d->c_out) : 0;
    s->xt = amx ? tl_mem_aligned(sizeof(uint32_t) * (size_t)xt) : NULL;
    s->dt = amx ? tl_mem_aligned(sizeof(uint16_t) * (size_t)dt) : NULL;
    s->cbuf = amx ? tl_mem_aligned(sizeof(float) * 16 * 64) : NULL;
    s->xp = pack ? malloc(sizeof(uint32_t) * (size_t)(cin4 * TL_WGRAD_PAIRS / 2 + 1)) : NULL;
    s->dp = pack ? tl_mem_aligned(sizeof(uint16_t) * (size_t)(TL_WGRAD_PAIRS * d->c_out)) : NULL;
    s->tmp = pack ? malloc(sizeof(uint16_t) * (size_t)(2 * cin4 + 1)) : NULL;
    s->stage =
        dot ? NULL : malloc(sizeof(float) * (size_t)(TL_WGRAD_PAIRS * (cin4 + d->c_out) + 1));
    const int lists =
        tl_wgrad_lists_init(&s->lists, split->listed, f->level, d->k, split->block);
    return lists && (amx    ? s->xt && s->dt && s->cbuf
                     : pack ? s->xp && s->dp && s->tmp
                            : s->stage != NULL);
}

static void tl_half_wg_free(tl_half_wg_scratch *s) {
    free(s->xp);
    free(s->dp);
    free(s->tmp);
    free(s->stage);
    free(s->xt);
    free(s->dt);
    free(s->cbuf);
    tl_wgrad_lists_free(&s->lists);
}

/* acc (k, c_in, c_out) += the contributions of output rows [o0, o1) through
 * kernel rows [n0, n1), blocks of TL_WGRAD_PAIRS rows as in the float
 * weight gradient (tl_wgrad_rows; tl_wgrad_block_rows gives the half types
 * that many, and tl_wgrad_lists_init sizes the lists by it); returns 1 as it
 * does, 2 where f16_amx read an infinity or NaN. */
static int tl_half_wg_rows(const tl_half_call *f, const uint16_t *x, const uint16_t *dy,
                           const int32_t *nbr, int64_t o0, int64_t o1, int64_t n0, int64_t n1,
                           float *acc, tl_half_wg_scratch *s) {
    const tl_conv_desc *d = f->d;
    const int64_t k = d->k, cin = d->c_in, cout = d->c_out, mat = cin * cout;
    /* staged: from C_in = 24 the x rows are converted into the panel's
     * packed layout (rows ldx apart, zero-padded), so the panel needs no
     * packing of its own: against the in-place passes (tl_mk_outer_acc),
     * float16 on the Intel Xeon of round sixteen, 1.20-1.40x at C >= 64 and
     * 1.0-1.13x at C = 24-32, 0.92-1.01x at 16. */
    const int packs = cin >= 24;
    const int64_t ldx = packs ? tl_mk_packed_ld_f32(cin) : cin;
    for (int64_t b0 = o0; b0 < o1; b0 += TL_WGRAD_PAIRS) {
        const int64_t b1 = b0 + TL_WGRAD_PAIRS < o1 ? b0 + TL_WGRAD_PAIRS : o1;
        if (tl_wgrad_list_block(&s->lists, nbr, k, b0, b1, n0, n1, d->n_in)) return 1;
        /* staged: the block's dy rows as float, after its x rows' room */
        float *dyf = f->dot ? NULL : s->stage + TL_WGRAD_PAIRS * ldx;
        int dy_staged = 0;
        for (int64_t n = n0; n < n1; n++) {
            int64_t c;
            TL_WGRAD_PAIRS_OF(&s->lists, nbr, k, n, b0, b1, d->n_in, x, cin, dy, cout, s->xq,
                              s->dq, c);
            if (c < 0) return 1;
            if (c == 0) continue;
            if (f->f16_amx) {
#if TL_SIMD_AMX
                if (tl_amx_wgrad_f16(c, cin, cout, s->xq, s->dq, s->xt, s->dt, s->cbuf,
                                     acc + n * mat, cout))
                    return 2;
#endif
                continue;
            }
            if (f->amx) {
#if TL_SIMD_AMX
                tl_amx_wgrad(c, cin, cout, s->xq, s->dq, s->xt, s->dt, s->cbuf, acc + n * mat,
                             cout);
#endif
                continue;
            }
            if (f->dot) {
#if TL_SIMD_X86
                tl_bf16_wgrad_pack(c, cin, cout, s->xq, s->dq, s->xp, s->dp, s->tmp);
                tl_bf16_wgrad_panel(cin, cout, (c + 1) / 2, s->xp, s->dp, acc + n * mat, cout);
#endif
                continue;
            }
            if (!dy_staged) { /* the block's dy rows serve every kernel row: once */
                tl_half_row_to_f32(f->level, d->dtype, dy + b0 * cout, (b1 - b0) * cout, dyf);
                dy_staged = 1;
            }
            tl_half_rows_to_f32(f->level, d->dtype, s->xq, c, cin, ldx, s->stage);
            for (int64_t q = 0; q < c; q++) {
                s->xf[q] = s->stage + q * ldx;
                s->df[q] = dyf + (s->dq[q] - (dy + b0 * cout));
            }
            if (packs)
                f->mk->panel(cout, c, cin, NULL, s->stage, s->df, acc + n * mat, cout, NULL, NULL,
                             0);
            else
                tl_mk_outer_acc_f32(f->mk, cin, cout, c, s->xf, s->df, acc + n * mat, NULL, NULL,
                                    0);
        }
    }
    return 0;
}

/* The weight gradient; `tiles` as in tl_half_forward. */
static tl_status tl_half_weight_grad(const tl_ctx *ctx, const tl_conv_desc *d, const uint16_t *x,
                                     const uint16_t *dy, const int32_t *nbr, uint16_t *dw,
                                     int tiles) {
    tl_half_call f = {.d = d, .level = tl_simd_capped(ctx->simd_cap), .mk = tl_mk_pick_f32(ctx)};
    tl_half_kernels(&f, tiles, TL_F16_AMX_WGRAD_MIN);
    if (f.dot && !f.amx && d->c_in * d->c_out < TL_BF16_DOT_WGRAD_PER_VALUE * (d->c_in + d->c_out))
        f.dot = 0; /* narrow: the staged float kernels */
    const int64_t mat = d->c_in * d->c_out, all = d->k * mat;
    const tl_wgrad_split split = tl_wgrad_split_of(d);
    const int64_t parts = split.parts;
    /* Float partial sums, one set per part, then their sum (fixed order). */
    float *partial = tl_mem_aligned(sizeof(float) * (size_t)((parts + 1) * all));
    if (!partial) return TL_ERR_NOMEM;
    int failed = 0, invalid = 0, nonfinite = 0;
#pragma omp parallel num_threads(ctx->threads) reduction(| : failed, invalid, nonfinite)
    {
        tl_half_wg_scratch s;
        int ok = tl_half_wg_init(&s, d, &split, &f);
        failed |= !ok;
#if TL_SIMD_AMX
        if (f.amx) tl_amx_start();
#endif
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < parts * split.groups; t++) {
            if (!ok || invalid || nonfinite) continue;
            const tl_wgrad_task w = tl_wgrad_task_of(&split, d, t);
            float *acc = partial + w.part * all;
            memset(acc + w.n0 * mat, 0, sizeof(float) * (size_t)((w.n1 - w.n0) * mat));
            const int r =
                w.o0 < w.o1 ? tl_half_wg_rows(&f, x, dy, nbr, w.o0, w.o1, w.n0, w.n1, acc, &s) : 0;
            invalid |= r == 1;
            nonfinite |= r == 2;
        }
#if TL_SIMD_AMX
        if (f.amx) tl_amx_stop();
#endif
        tl_half_wg_free(&s);
    }
    if (!failed && !invalid && !nonfinite) {
        float *sum = partial + parts * all;
        tl_mk_sum_parts_f32(ctx->threads, partial, parts, all, sum);
        tl_f32_row_to_half(f.level, d->dtype, sum, all, dw);
    }
    free(partial);
    if (invalid) return TL_ERR_INVALID;
    if (failed) return TL_ERR_NOMEM;
    /* an infinity or NaN in x or dy: again, through the float kernels */
    return nonfinite ? tl_half_weight_grad(ctx, d, x, dy, nbr, dw, 0) : TL_OK;
}

tl_status tl_implicit_gemm_weight_grad_half(const tl_ctx *ctx, const tl_conv_desc *d,
                                            const uint16_t *x, const uint16_t *dy,
                                            const int32_t *nbr, uint16_t *dw) {
    return tl_half_weight_grad(ctx, d, x, dy, nbr, dw, 1);
}
