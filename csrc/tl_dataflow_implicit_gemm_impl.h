/* Type-generic body of tl_dataflow_implicit_gemm.c.  Included once per
 * element type with TL_T (the C type) and TL_SFX (the name suffix) defined;
 * C has no templates, and this keeps one copy of each kernel. */
#ifndef TL_T
#error "define TL_T and TL_SFX before including this file"
#endif

#define TL_CAT2(a, b) a##_##b
#define TL_CAT(a, b) TL_CAT2(a, b)
#define TL_FN(name) TL_CAT(name, TL_SFX)

/* y0..y3 += a0..a3 * w over cw columns: four output rows share each load of
 * a weight row, which is what makes this loop compute-bound. */
TL_HOT static void TL_FN(tl_axpy4)(int64_t cw, const TL_T *restrict w, TL_T a0,
                                   TL_T a1, TL_T a2, TL_T a3, TL_T *restrict y0,
                                   TL_T *restrict y1, TL_T *restrict y2,
                                   TL_T *restrict y3) {
    for (int64_t j = 0; j < cw; j++) {
        TL_T wj = w[j];
        y0[j] += a0 * wj;
        y1[j] += a1 * wj;
        y2[j] += a2 * wj;
        y3[j] += a3 * wj;
    }
}

TL_HOT static void TL_FN(tl_axpy1)(int64_t cw, const TL_T *restrict w, TL_T a,
                                   TL_T *restrict y) {
    for (int64_t j = 0; j < cw; j++) y[j] += a * w[j];
}

/* One tile: output rows [o0, o0+m), columns [co0, co0+cw). */
static void TL_FN(tl_forward_tile)(const tl_conv_desc *d, const TL_T *x, const TL_T *w,
                                   const int32_t *nbr, TL_T *y, int64_t o0, int64_t m,
                                   int64_t co0, int64_t cw) {
    const int64_t k = d->k, cin = d->c_in, cout = d->c_out;
    int64_t lo[TL_TILE_ROWS];
    int64_t li[TL_TILE_ROWS];
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < cw; j++) y[(o0 + r) * cout + co0 + j] = 0;
    for (int64_t n = 0; n < k; n++) {
        int64_t c = 0;
        for (int64_t r = 0; r < m; r++) {
            int32_t i = nbr[(o0 + r) * k + n];
            if (i >= 0) {
                lo[c] = o0 + r;
                li[c++] = i;
            }
        }
        const TL_T *wn = w + n * cin * cout + co0;
        int64_t p = 0;
        for (; p + 4 <= c; p += 4) {
            const TL_T *x0 = x + li[p] * cin, *x1 = x + li[p + 1] * cin,
                       *x2 = x + li[p + 2] * cin, *x3 = x + li[p + 3] * cin;
            TL_T *y0 = y + lo[p] * cout + co0, *y1 = y + lo[p + 1] * cout + co0,
                 *y2 = y + lo[p + 2] * cout + co0, *y3 = y + lo[p + 3] * cout + co0;
            for (int64_t ci = 0; ci < cin; ci++)
                TL_FN(tl_axpy4)(cw, wn + ci * cout, x0[ci], x1[ci], x2[ci], x3[ci], y0,
                                y1, y2, y3);
        }
        for (; p < c; p++) {
            const TL_T *x0 = x + li[p] * cin;
            TL_T *y0 = y + lo[p] * cout + co0;
            for (int64_t ci = 0; ci < cin; ci++)
                TL_FN(tl_axpy1)(cw, wn + ci * cout, x0[ci], y0);
        }
    }
}

static void TL_FN(tl_forward)(const tl_ctx *ctx, const tl_conv_desc *d, const TL_T *x,
                              const TL_T *w, const int32_t *nbr, TL_T *y) {
    const int64_t row_tiles = (d->n_out + TL_TILE_ROWS - 1) / TL_TILE_ROWS;
    const int64_t col_tiles = (d->c_out + TL_TILE_COLS - 1) / TL_TILE_COLS;
#pragma omp parallel for num_threads(ctx->threads) schedule(dynamic, 4)
    for (int64_t t = 0; t < row_tiles * col_tiles; t++) {
        int64_t o0 = (t / col_tiles) * TL_TILE_ROWS;
        int64_t co0 = (t % col_tiles) * TL_TILE_COLS;
        int64_t m = d->n_out - o0 < TL_TILE_ROWS ? d->n_out - o0 : TL_TILE_ROWS;
        int64_t cw = d->c_out - co0 < TL_TILE_COLS ? d->c_out - co0 : TL_TILE_COLS;
        TL_FN(tl_forward_tile)(d, x, w, nbr, y, o0, m, co0, cw);
    }
}

/* acc (c_in, c_out) += sum over rows [o0, o1) of x[nbr[o, n]]^T dy[o]. */
static void TL_FN(tl_wgrad_part)(const tl_conv_desc *d, const TL_T *x, const TL_T *dy,
                                 const int32_t *nbr, int64_t n, int64_t o0, int64_t o1,
                                 TL_T *acc) {
    const int64_t k = d->k, cin = d->c_in, cout = d->c_out;
    int64_t lo[4], li[4], c = 0;
    for (int64_t o = o0; o <= o1; o++) {
        if (o < o1) {
            int32_t i = nbr[o * k + n];
            if (i < 0) continue;
            lo[c] = o;
            li[c++] = i;
            if (c < 4) continue;
        }
        if (c == 4) {
            const TL_T *d0 = dy + lo[0] * cout, *d1 = dy + lo[1] * cout,
                       *d2 = dy + lo[2] * cout, *d3 = dy + lo[3] * cout;
            for (int64_t ci = 0; ci < cin; ci++) {
                TL_T a0 = x[li[0] * cin + ci], a1 = x[li[1] * cin + ci],
                     a2 = x[li[2] * cin + ci], a3 = x[li[3] * cin + ci];
                TL_T *restrict row = acc + ci * cout;
                for (int64_t j = 0; j < cout; j++)
                    row[j] += a0 * d0[j] + a1 * d1[j] + a2 * d2[j] + a3 * d3[j];
            }
        } else {
            for (int64_t p = 0; p < c; p++)
                for (int64_t ci = 0; ci < cin; ci++)
                    TL_FN(tl_axpy1)(cout, dy + lo[p] * cout, x[li[p] * cin + ci],
                                    acc + ci * cout);
        }
        c = 0;
    }
}

static tl_status TL_FN(tl_weight_grad)(const tl_ctx *ctx, const tl_conv_desc *d,
                                       const TL_T *x, const TL_T *dy,
                                       const int32_t *nbr, TL_T *dw) {
    const int64_t k = d->k, mat = d->c_in * d->c_out;
    const int64_t parts = tl_wgrad_parts(d);
    TL_T *partial = dw;
    if (parts > 1) {
        partial = malloc(sizeof(TL_T) * (size_t)(k * parts * mat));
        if (!partial) return TL_ERR_NOMEM;
    }
    const int64_t rows_per = (d->n_out + parts - 1) / parts;
#pragma omp parallel for num_threads(ctx->threads) schedule(dynamic, 1)
    for (int64_t t = 0; t < k * parts; t++) {
        int64_t n = t / parts, p = t % parts;
        int64_t o0 = p * rows_per, o1 = o0 + rows_per < d->n_out ? o0 + rows_per : d->n_out;
        TL_T *acc = partial + t * mat;
        for (int64_t e = 0; e < mat; e++) acc[e] = 0;
        if (o0 < o1) TL_FN(tl_wgrad_part)(d, x, dy, nbr, n, o0, o1, acc);
    }
    if (parts > 1) {
        /* Fixed summation order over parts: deterministic for any threads. */
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
        for (int64_t e = 0; e < k * mat; e++) {
            int64_t n = e / mat, j = e % mat;
            TL_T s = 0;
            for (int64_t p = 0; p < parts; p++) s += partial[(n * parts + p) * mat + j];
            dw[e] = s;
        }
        free(partial);
    }
    return TL_OK;
}

#undef TL_FN
#undef TL_CAT
#undef TL_CAT2
