/* The register-blocked micro-kernels shared by every CPU dataflow.
 * Type-generic: include with TL_T (element type) and TL_SFX (name suffix)
 * defined; functions are named tl_mk_<name>_<sfx>.
 *
 * A small block of accumulators (4 rows x 2 vectors of TL_VBYTES bytes) stays
 * in registers over the whole reduction, so each loaded weight or gradient
 * vector feeds 4 FMAs and outputs are read and written once per block
 * instead of once per channel.  The vector type is GCC's generic vector
 * extension: each target_clones variant (TL_HOT) lowers it to its own widest
 * registers. */
#ifndef TL_T
#error "define TL_T and TL_SFX before including this file"
#endif

#define TL_MK_CAT2(a, b) a##_##b
#define TL_MK_CAT(a, b) TL_MK_CAT2(a, b)
#define TL_MK(name) TL_MK_CAT(tl_mk_##name, TL_SFX)

#define TL_VL ((int64_t)(TL_VBYTES / sizeof(TL_T))) /* lanes per vector */
typedef TL_T TL_MK(vec) __attribute__((vector_size(TL_VBYTES)));
#define TL_VEC TL_MK(vec)

/* Register-blocked update, for r < R and columns [j, j + NV*VL):
 *   out[r][j + :] += sum_q a[r][q] * b[q][j + :]
 * Forward: q = input channel, a[r] = x row, b[q] = weight row.
 * Weight grad: q = pair, a[r] = gathered x column, b[q] = dy row.
 * Always inlined with constant R and NV, so acc[][] lives in registers. */
static inline __attribute__((always_inline)) void TL_MK(block)(
    int R, int NV, int64_t j, int64_t nq, const TL_T *const *a, const TL_T *const *b,
    TL_T *const *out) {
    TL_VEC acc[4][2];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = (TL_VEC){0};
    for (int64_t q = 0; q < nq; q++) {
        TL_VEC bv[2];
        for (int v = 0; v < NV; v++) memcpy(&bv[v], b[q] + j + v * TL_VL, sizeof(TL_VEC));
        for (int r = 0; r < R; r++) {
            TL_T s = a[r][q];
            for (int v = 0; v < NV; v++) acc[r][v] += s * bv[v];
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) {
            TL_VEC o;
            memcpy(&o, out[r] + j + v * TL_VL, sizeof(TL_VEC));
            o += acc[r][v];
            memcpy(out[r] + j + v * TL_VL, &o, sizeof(TL_VEC));
        }
}

/* out[r][0:cw) += sum_q a[r][q] * b[q][0:cw) for R rows (4, 2 or 1): column
 * blocks of 2 vectors, then 1, then scalars for a tail narrower than one.
 * (setup.py compiles with -ffp-contract=fast, so the multiply-adds become
 * FMA instructions; -std=c11 alone would turn contraction off.) */
#define TL_DEFINE_ROWS(R)                                                           \
    TL_HOT __attribute__((unused)) static void TL_MK(rows_##R)(int64_t cw, int64_t nq,   \
                                                 const TL_T *const *a,              \
                                                 const TL_T *const *b,              \
                                                 TL_T *const *out) {                \
        int64_t j = 0;                                                              \
        for (; j + 2 * TL_VL <= cw; j += 2 * TL_VL)                                 \
            TL_MK(block)(R, 2, j, nq, a, b, out);                                \
        if (j + TL_VL <= cw) {                                                      \
            TL_MK(block)(R, 1, j, nq, a, b, out);                                \
            j += TL_VL;                                                             \
        }                                                                           \
        for (int r = 0; r < R; r++)                                                 \
            for (int64_t jj = j; jj < cw; jj++) {                                   \
                TL_T s = 0;                                                         \
                for (int64_t q = 0; q < nq; q++) s += a[r][q] * b[q][jj];           \
                out[r][jj] += s;                                                    \
            }                                                                       \
    }
TL_DEFINE_ROWS(4)
TL_DEFINE_ROWS(2)
TL_DEFINE_ROWS(1)
#undef TL_DEFINE_ROWS

/* out[0..m) += a[0..m) @ b over cw columns for any number m of distinct
 * output rows: groups of 4, then 2, then 1. */
__attribute__((unused)) static void TL_MK(rows)(int64_t cw, int64_t nq, int64_t m,
                                               const TL_T *const *a, const TL_T *const *b,
                                               TL_T *const *out) {
    int64_t p = 0;
    for (; p + 4 <= m; p += 4) TL_MK(rows_4)(cw, nq, a + p, b, out + p);
    if (p + 2 <= m) {
        TL_MK(rows_2)(cw, nq, a + p, b, out + p);
        p += 2;
    }
    if (p < m) TL_MK(rows_1)(cw, nq, a + p, b, out + p);
}

/* Register-blocked update with the rows of `a` read across pairs:
 *   out[r][j + :] += sum_q xr[q][c0 + r] * b[q][j + :]
 * i.e. the block above with a[r][q] = xr[q][c0 + r], so the weight gradient
 * needs no transposed copy of its x rows. */
static inline __attribute__((always_inline)) void TL_MK(block_t)(
    int R, int NV, int64_t j, int64_t nq, int64_t c0, const TL_T *const *xr,
    const TL_T *const *b, TL_T *const *out) {
    TL_VEC acc[4][2];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = (TL_VEC){0};
    for (int64_t q = 0; q < nq; q++) {
        TL_VEC bv[2];
        for (int v = 0; v < NV; v++) memcpy(&bv[v], b[q] + j + v * TL_VL, sizeof(TL_VEC));
        const TL_T *xq = xr[q] + c0;
        for (int r = 0; r < R; r++) {
            TL_T s = xq[r];
            for (int v = 0; v < NV; v++) acc[r][v] += s * bv[v];
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) {
            TL_VEC o;
            memcpy(&o, out[r] + j + v * TL_VL, sizeof(TL_VEC));
            o += acc[r][v];
            memcpy(out[r] + j + v * TL_VL, &o, sizeof(TL_VEC));
        }
}

/* out[r][0:cw) += sum_q xr[q][c0 + r] * b[q][0:cw) for R rows (4 or 1). */
#define TL_DEFINE_ROWS_T(R)                                                           \
    TL_HOT __attribute__((unused)) static void TL_MK(rows_t_##R)(                     \
        int64_t cw, int64_t nq, int64_t c0, const TL_T *const *xr, const TL_T *const *b, \
        TL_T *const *out) {                                                           \
        int64_t j = 0;                                                                \
        for (; j + 2 * TL_VL <= cw; j += 2 * TL_VL)                                   \
            TL_MK(block_t)(R, 2, j, nq, c0, xr, b, out);                              \
        if (j + TL_VL <= cw) {                                                        \
            TL_MK(block_t)(R, 1, j, nq, c0, xr, b, out);                              \
            j += TL_VL;                                                               \
        }                                                                             \
        for (int r = 0; r < R; r++)                                                   \
            for (int64_t jj = j; jj < cw; jj++) {                                     \
                TL_T s = 0;                                                           \
                for (int64_t q = 0; q < nq; q++) s += xr[q][c0 + r] * b[q][jj];       \
                out[r][jj] += s;                                                      \
            }                                                                         \
    }
TL_DEFINE_ROWS_T(4)
TL_DEFINE_ROWS_T(1)
#undef TL_DEFINE_ROWS_T

/* acc (cin x cout) += sum over c row pairs of xr[p]^T dq[p], four input
 * channels (rows of acc) per register-blocked pass. */
__attribute__((unused)) static void TL_MK(outer_acc)(int64_t cin, int64_t cout, int64_t c,
                                                    const TL_T *const *xr,
                                                    const TL_T *const *dq, TL_T *acc) {
    int64_t ci = 0;
    for (; ci + 4 <= cin; ci += 4) {
        TL_T *o[4] = {acc + ci * cout, acc + (ci + 1) * cout, acc + (ci + 2) * cout,
                      acc + (ci + 3) * cout};
        TL_MK(rows_t_4)(cout, c, ci, xr, dq, o);
    }
    for (; ci < cin; ci++) {
        TL_T *o[1] = {acc + ci * cout};
        TL_MK(rows_t_1)(cout, c, ci, xr, dq, o);
    }
}

/* dw[e] = sum over p of partial[p * all + e], p in order 0..parts-1: the
 * weight gradients' partial sums are added in a fixed order, so the result
 * does not depend on the thread count. */
__attribute__((unused)) static void TL_MK(sum_parts)(int threads, const TL_T *partial,
                                                    int64_t parts, int64_t all, TL_T *dw) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t e = 0; e < all; e++) {
        TL_T sum = 0;
        for (int64_t p = 0; p < parts; p++) sum += partial[p * all + e];
        dw[e] = sum;
    }
}

#undef TL_VEC
#undef TL_VL
#undef TL_MK
#undef TL_MK_CAT
#undef TL_MK_CAT2
