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

/* Scratch of one forward worker: the kernel row's c_in weight-row pointers,
 * a zero x row and a sink y row that pad the last group of a kernel row to 4
 * (a 1-row pass costs as much as a 4-row one: both are bound by the weight
 * loads, so padding makes the remainder up to 3x cheaper on sparse scenes;
 * a remainder of 1 or 2 rows runs the 2-row pass, which costs half). */
typedef struct TL_FN(tl_fwd_scratch) {
    const TL_T **wq;
    TL_T *zero; /* c_in zeros */
    TL_T *sink; /* TL_TILE_COLS values, never read */
} TL_FN(tl_fwd_scratch);

/* One tile: output rows [o0, o0+m), columns [co0, co0+cw).  For each kernel
 * row the tile's neighbours are listed, then handled 4 output rows at a time
 * against the kernel row's weight rows. */
static void TL_FN(tl_forward_tile)(const tl_conv_desc *d, const TL_T *x, const TL_T *w,
                                   const int32_t *nbr, TL_T *y, int64_t o0, int64_t m,
                                   int64_t co0, int64_t cw, TL_FN(tl_fwd_scratch) *s) {
    const int64_t k = d->k, cin = d->c_in, cout = d->c_out;
    const TL_T *xr[TL_TILE_ROWS + 3];
    TL_T *yr[TL_TILE_ROWS + 3];
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < cw; j++) y[(o0 + r) * cout + co0 + j] = 0;
    for (int64_t n = 0; n < k; n++) {
        int64_t c = 0;
        for (int64_t r = 0; r < m; r++) {
            int32_t i = nbr[(o0 + r) * k + n];
            if (i >= 0) {
                xr[c] = x + (int64_t)i * cin;
                yr[c++] = y + (o0 + r) * cout + co0;
            }
        }
        if (c == 0) continue;
        /* Pad the last group to 4 rows, or to 2 when it has 1 or 2. */
        int64_t full = c / 4 * 4, pad = c - full == 3 ? 4 : (c - full + 1) / 2 * 2;
        for (; c < full + pad; c++) {
            xr[c] = s->zero;
            yr[c] = s->sink;
        }
        const TL_T *wn = w + n * cin * cout + co0;
        for (int64_t ci = 0; ci < cin; ci++) s->wq[ci] = wn + ci * cout;
        for (int64_t p = 0; p < full; p += 4) TL_FN(tl_mk_rows_4)(cw, cin, xr + p, s->wq, yr + p);
        if (pad == 4) TL_FN(tl_mk_rows_4)(cw, cin, xr + full, s->wq, yr + full);
        if (pad == 2) TL_FN(tl_mk_rows_2)(cw, cin, xr + full, s->wq, yr + full);
    }
}

static tl_status TL_FN(tl_forward)(const tl_ctx *ctx, const tl_conv_desc *d, const TL_T *x,
                                   const TL_T *w, const int32_t *nbr, TL_T *y) {
    const int64_t row_tiles = (d->n_out + TL_TILE_ROWS - 1) / TL_TILE_ROWS;
    const int64_t col_tiles = (d->c_out + TL_TILE_COLS - 1) / TL_TILE_COLS;
    const int64_t cin = d->c_in > 0 ? d->c_in : 1;
    int failed = 0;
#pragma omp parallel num_threads(ctx->threads) reduction(| : failed)
    {
        TL_FN(tl_fwd_scratch) s;
        s.wq = malloc(sizeof(TL_T *) * (size_t)cin);
        s.zero = calloc((size_t)(cin + TL_TILE_COLS), sizeof(TL_T));
        s.sink = s.zero ? s.zero + cin : NULL;
        int ok = s.wq && s.zero;
        failed |= !ok;
#pragma omp for schedule(dynamic, 4)
        for (int64_t t = 0; t < row_tiles * col_tiles; t++) {
            if (!ok) continue;
            int64_t o0 = (t / col_tiles) * TL_TILE_ROWS;
            int64_t co0 = (t % col_tiles) * TL_TILE_COLS;
            int64_t m = d->n_out - o0 < TL_TILE_ROWS ? d->n_out - o0 : TL_TILE_ROWS;
            int64_t cw = d->c_out - co0 < TL_TILE_COLS ? d->c_out - co0 : TL_TILE_COLS;
            TL_FN(tl_forward_tile)(d, x, w, nbr, y, o0, m, co0, cw, &s);
        }
        free(s.wq);
        free(s.zero);
    }
    return failed ? TL_ERR_NOMEM : TL_OK;
}

/* Scratch of one weight-gradient worker: the x and dy row pointers of a
 * chunk of up to TL_WGRAD_PAIRS pairs. */
typedef struct TL_FN(tl_wgrad_scratch) {
    const TL_T *xq[TL_WGRAD_PAIRS], *dq[TL_WGRAD_PAIRS];
} TL_FN(tl_wgrad_scratch);

/* acc (k, c_in, c_out) += the contributions of output rows [o0, o1) through
 * kernel rows [n0, n1): blocks of TL_WGRAD_PAIRS rows, every kernel row per
 * block, so the block's nbr rows and the x rows they name are reused from
 * cache across kernel rows. */
static void TL_FN(tl_wgrad_rows)(const tl_conv_desc *d, const TL_T *x, const TL_T *dy,
                                 const int32_t *nbr, int64_t o0, int64_t o1, int64_t n0,
                                 int64_t n1, TL_T *acc, TL_FN(tl_wgrad_scratch) *s) {
    const int64_t k = d->k, mat = d->c_in * d->c_out;
    for (int64_t b0 = o0; b0 < o1; b0 += TL_WGRAD_PAIRS) {
        int64_t b1 = b0 + TL_WGRAD_PAIRS < o1 ? b0 + TL_WGRAD_PAIRS : o1;
        for (int64_t n = n0; n < n1; n++) {
            int64_t c = 0;
            for (int64_t o = b0; o < b1; o++) {
                int32_t i = nbr[o * k + n];
                if (i < 0) continue;
                s->xq[c] = x + (int64_t)i * d->c_in;
                s->dq[c++] = dy + o * d->c_out;
            }
            if (c)
                TL_FN(tl_mk_outer_acc)(d->c_in, d->c_out, c, s->xq, s->dq, acc + n * mat);
        }
    }
}

static tl_status TL_FN(tl_weight_grad)(const tl_ctx *ctx, const tl_conv_desc *d,
                                       const TL_T *x, const TL_T *dy,
                                       const int32_t *nbr, TL_T *dw) {
    const int64_t k = d->k, mat = d->c_in * d->c_out, all = k * mat;
    const int64_t parts = tl_wgrad_parts(d);
    /* Kernel rows are split into groups too, so large layers (few parts)
     * still give every thread work; groups write disjoint slices of a part. */
    int64_t groups = (TL_WGRAD_TASKS + parts - 1) / parts;
    if (groups > k) groups = k;
    TL_T *partial = dw;
    if (parts > 1) {
        partial = malloc(sizeof(TL_T) * (size_t)(parts * all));
        if (!partial) return TL_ERR_NOMEM;
    }
    const int64_t rows_per = (d->n_out + parts - 1) / parts;
#pragma omp parallel num_threads(ctx->threads)
    {
        TL_FN(tl_wgrad_scratch) s;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < parts * groups; t++) {
            int64_t p = t / groups, g = t % groups;
            int64_t o0 = p * rows_per;
            int64_t o1 = o0 + rows_per < d->n_out ? o0 + rows_per : d->n_out;
            int64_t n0 = k * g / groups, n1 = k * (g + 1) / groups;
            TL_T *acc = partial + p * all;
            memset(acc + n0 * mat, 0, sizeof(TL_T) * (size_t)((n1 - n0) * mat));
            if (o0 < o1) TL_FN(tl_wgrad_rows)(d, x, dy, nbr, o0, o1, n0, n1, acc, &s);
        }
    }
    if (parts > 1) {
        TL_FN(tl_mk_sum_parts)(ctx->threads, partial, parts, all, dw);
        free(partial);
    }
    return TL_OK;
}

#undef TL_FN
#undef TL_CAT
#undef TL_CAT2
