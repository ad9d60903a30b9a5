/* Type-generic body of tl_dataflow_pairs.c: include with TL_T (element type)
 * and TL_SFX (name suffix) defined. */
#ifndef TL_T
#error "define TL_T and TL_SFX before including this file"
#endif

#define TL_CAT2(a, b) a##_##b
#define TL_CAT(a, b) TL_CAT2(a, b)
#define TL_FN(name) TL_CAT(name, TL_SFX)

/* y[0..4) += x[0..4) @ w: four distinct rows share each weight-row load. */
TL_SIMD_CLONES static void TL_FN(tl_rows4_acc)(int64_t cin, int64_t cout,
                                               const TL_T *const x[4], const TL_T *restrict w,
                                               TL_T *const y[4]) {
    TL_T *restrict y0 = y[0], *restrict y1 = y[1], *restrict y2 = y[2], *restrict y3 = y[3];
    for (int64_t c = 0; c < cin; c++) {
        const TL_T a0 = x[0][c], a1 = x[1][c], a2 = x[2][c], a3 = x[3][c];
        const TL_T *restrict wr = w + c * cout;
        for (int64_t j = 0; j < cout; j++) {
            y0[j] += a0 * wr[j];
            y1[j] += a1 * wr[j];
            y2[j] += a2 * wr[j];
            y3[j] += a3 * wr[j];
        }
    }
}

TL_SIMD_CLONES static void TL_FN(tl_row_acc)(int64_t cin, int64_t cout, const TL_T *restrict x,
                                             const TL_T *restrict w, TL_T *restrict y) {
    for (int64_t c = 0; c < cin; c++) {
        const TL_T a = x[c];
        const TL_T *restrict wr = w + c * cout;
        for (int64_t j = 0; j < cout; j++) y[j] += a * wr[j];
    }
}

/* acc (cin x cout) += sum_q x[q]^T dy[q] over m <= 4 row pairs. */
TL_SIMD_CLONES static void TL_FN(tl_outer_acc)(int64_t cin, int64_t cout, int m,
                                               const TL_T *const x[4], const TL_T *const dy[4],
                                               TL_T *restrict acc) {
    if (m == 4) {
        const TL_T *restrict d0 = dy[0], *restrict d1 = dy[1], *restrict d2 = dy[2],
                             *restrict d3 = dy[3];
        for (int64_t c = 0; c < cin; c++) {
            const TL_T a0 = x[0][c], a1 = x[1][c], a2 = x[2][c], a3 = x[3][c];
            TL_T *restrict row = acc + c * cout;
            for (int64_t j = 0; j < cout; j++)
                row[j] += a0 * d0[j] + a1 * d1[j] + a2 * d2[j] + a3 * d3[j];
        }
        return;
    }
    for (int q = 0; q < m; q++)
        for (int64_t c = 0; c < cin; c++) {
            const TL_T a = x[q][c];
            TL_T *restrict row = acc + c * cout;
            for (int64_t j = 0; j < cout; j++) row[j] += a * dy[q][j];
        }
}

/* Pairs [j0, j1) of one kernel row: y[out] += x[in] @ wn.  Gather-scatter
 * gathers the block's input rows into `gx` and its current output rows into
 * `gy`, runs the block product there, and scatters `gy` back.  Carrying the
 * running sums through `gy` (rather than adding a fresh block result) gives
 * the same operation order as fetch-on-demand, so the two agree bitwise. */
static void TL_FN(tl_pairs_block)(const tl_conv_desc *d, int gather, const TL_T *x,
                                  const TL_T *wn, const tl_pairs *p, int64_t j0, int64_t j1,
                                  TL_T *gx, TL_T *gy, TL_T *y) {
    const int64_t cin = d->c_in, cout = d->c_out, m = j1 - j0;
    const TL_T *xr[TL_PAIR_BLOCK];
    TL_T *yr[TL_PAIR_BLOCK];
    for (int64_t q = 0; q < m; q++) {
        const TL_T *src = x + (int64_t)p->in[j0 + q] * cin;
        if (gather) {
            for (int64_t c = 0; c < cin; c++) gx[q * cin + c] = src[c];
            const TL_T *dst = y + (int64_t)p->out[j0 + q] * cout;
            for (int64_t c = 0; c < cout; c++) gy[q * cout + c] = dst[c];
            xr[q] = gx + q * cin;
            yr[q] = gy + q * cout;
        } else {
            xr[q] = src;
            yr[q] = y + (int64_t)p->out[j0 + q] * cout;
        }
    }
    int64_t q = 0;
    for (; q + 4 <= m; q += 4) TL_FN(tl_rows4_acc)(cin, cout, xr + q, wn, yr + q);
    for (; q < m; q++) TL_FN(tl_row_acc)(cin, cout, xr[q], wn, yr[q]);
    if (gather)
        for (q = 0; q < m; q++) {
            TL_T *dst = y + (int64_t)p->out[j0 + q] * cout;
            for (int64_t c = 0; c < cout; c++) dst[c] = gy[q * cout + c];
        }
}

static tl_status TL_FN(tl_pairs_fwd)(const tl_ctx *ctx, int gather, const tl_conv_desc *d,
                                     const TL_T *x, const TL_T *w, const tl_pairs *p, TL_T *y) {
    const int64_t cin = d->c_in, cout = d->c_out;
    for (int64_t e = 0; e < d->n_out * cout; e++) y[e] = 0;
    int failed = 0; /* shared: every thread must reach the same worksharing loops */
    const int threads = tl_threads_for(ctx, p->offsets[p->k] * cin * cout);
#pragma omp parallel num_threads(threads)
    {
        TL_T *gx = NULL, *gy = NULL;
        if (gather) {
            gx = malloc(sizeof(TL_T) * (size_t)(TL_PAIR_BLOCK * (cin + cout) + 1));
            gy = gx ? gx + TL_PAIR_BLOCK * cin : NULL;
            if (!gx) {
#pragma omp atomic write
                failed = 1;
            }
        }
#pragma omp barrier
        int stop;
#pragma omp atomic read
        stop = failed;
        for (int64_t n = 0; !stop && n < p->k; n++) {
            const int64_t j0 = p->offsets[n], j1 = p->offsets[n + 1];
            const TL_T *wn = w + n * cin * cout;
#pragma omp for schedule(static)
            for (int64_t j = j0; j < j1; j += TL_PAIR_BLOCK)
                TL_FN(tl_pairs_block)(d, gather, x, wn, p, j,
                                      j + TL_PAIR_BLOCK < j1 ? j + TL_PAIR_BLOCK : j1, gx, gy, y);
        }
        free(gx);
    }
    return failed ? TL_ERR_NOMEM : TL_OK;
}

/* acc += sum over pairs [j0, j1) of x[in]^T dy[out]; gather-scatter packs
 * four rows of x and dy into `g` first. */
static void TL_FN(tl_pairs_wgrad_range)(const tl_conv_desc *d, int gather, const TL_T *x,
                                        const TL_T *dy, const tl_pairs *p, int64_t j0,
                                        int64_t j1, TL_T *g, TL_T *acc) {
    const int64_t cin = d->c_in, cout = d->c_out;
    for (int64_t j = j0; j < j1; j += 4) {
        int m = (int)(j1 - j < 4 ? j1 - j : 4);
        const TL_T *xr[4], *dr[4];
        for (int q = 0; q < m; q++) {
            xr[q] = x + (int64_t)p->in[j + q] * cin;
            dr[q] = dy + (int64_t)p->out[j + q] * cout;
            if (gather) {
                TL_T *gxq = g + q * (cin + cout), *gdq = gxq + cin;
                for (int64_t c = 0; c < cin; c++) gxq[c] = xr[q][c];
                for (int64_t c = 0; c < cout; c++) gdq[c] = dr[q][c];
                xr[q] = gxq;
                dr[q] = gdq;
            }
        }
        TL_FN(tl_outer_acc)(cin, cout, m, xr, dr, acc);
    }
}

static tl_status TL_FN(tl_pairs_wgrad)(const tl_ctx *ctx, int gather, const tl_conv_desc *d,
                                       const TL_T *x, const TL_T *dy, const tl_pairs *p,
                                       TL_T *dw) {
    const int64_t k = p->k, mat = d->c_in * d->c_out, parts = tl_pairs_wgrad_parts(d);
    TL_T *partial = parts > 1 ? malloc(sizeof(TL_T) * (size_t)(k * parts * mat)) : dw;
    if (!partial) return TL_ERR_NOMEM;
    int failed = 0;
    const int threads = tl_threads_for(ctx, p->offsets[k] * mat);
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        TL_T *g = gather ? malloc(sizeof(TL_T) * (size_t)(4 * (d->c_in + d->c_out) + 1)) : NULL;
        failed = gather && !g;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < k * parts; t++) {
            const int64_t n = t / parts, part = t % parts;
            const int64_t len = p->offsets[n + 1] - p->offsets[n];
            const int64_t j0 = p->offsets[n] + len * part / parts;
            const int64_t j1 = p->offsets[n] + len * (part + 1) / parts;
            TL_T *acc = partial + t * mat;
            for (int64_t e = 0; e < mat; e++) acc[e] = 0;
            if (!failed) TL_FN(tl_pairs_wgrad_range)(d, gather, x, dy, p, j0, j1, g, acc);
        }
        free(g);
    }
    if (parts > 1) {
        /* Fixed summation order over parts: deterministic for any threads. */
#pragma omp parallel for num_threads(tl_threads_for(ctx, k * mat * parts)) schedule(static)
        for (int64_t e = 0; e < k * mat; e++) {
            const int64_t n = e / mat, j = e % mat;
            TL_T s = 0;
            for (int64_t q = 0; q < parts; q++) s += partial[(n * parts + q) * mat + j];
            dw[e] = s;
        }
        free(partial);
    }
    return failed ? TL_ERR_NOMEM : TL_OK;
}

#undef TL_FN
#undef TL_CAT
#undef TL_CAT2
