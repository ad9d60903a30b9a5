/* Type-generic body of tl_dataflow_pairs.c: include with TL_T (element type)
 * and TL_SFX (name suffix) defined.  The arithmetic is the register-blocked
 * micro-kernels of tl_microkernel_impl.h, shared with implicit GEMM. */
#ifndef TL_T
#error "define TL_T and TL_SFX before including this file"
#endif

#define TL_CAT2(a, b) a##_##b
#define TL_CAT(a, b) TL_CAT2(a, b)
#define TL_FN(name) TL_CAT(name, TL_SFX)

#include "tl_microkernel_impl.h"

/* Per-thread scratch.  Forward (gather-scatter): row pointers of a block and
 * the gathered block.
 * Weight gradient: row pointers of a chunk and (gather-scatter) its gathered
 * dy rows. */
typedef struct TL_FN(tl_pairs_scratch) {
    const TL_FN(tl_mk_ops) *mk; /* the micro-kernels for this CPU */
    const TL_T *xr[TL_PAIR_BLOCK], *dr[TL_PAIR_BLOCK];
    TL_T *yr[TL_PAIR_BLOCK];
    TL_T *gx, *gy; /* TL_PAIR_BLOCK x c_in, TL_PAIR_BLOCK x c_out */
    TL_T *gd;      /* TL_PAIR_BLOCK x c_out */
} TL_FN(tl_pairs_scratch);

static int TL_FN(tl_scratch_init)(TL_FN(tl_pairs_scratch) *s, const tl_ctx *ctx,
                                  const tl_conv_desc *d) {
    s->mk = TL_FN(tl_mk_pick)(ctx);
    const size_t cin = (size_t)d->c_in, cout = (size_t)d->c_out, B = TL_PAIR_BLOCK;
    s->gx = tl_mem_aligned(sizeof(TL_T) * (B * (cin + 2 * cout)));
    s->gy = s->gx ? s->gx + B * cin : NULL;
    s->gd = s->gx ? s->gy + B * cout : NULL;
    return s->gx != NULL;
}

static void TL_FN(tl_scratch_free)(TL_FN(tl_pairs_scratch) *s) {
    free(s->gx);
}

/* Gather-scatter, pairs [j0, j1) of one kernel row: y[out] += x[in] @ wn (the
 * kernel row's c_in x c_out weights): the input rows gathered into a dense
 * block, multiplied into a zeroed block, and that scatter-added.  (The
 * fetch-on-demand forward runs implicit GEMM's tiles over the pair lists:
 * tl_implicit_gemm_forward_pairs.) */
static void TL_FN(tl_pairs_block)(const tl_conv_desc *d, const TL_T *x, const TL_T *wn,
                                  const tl_pairs *p, int64_t j0, int64_t j1,
                                  TL_FN(tl_pairs_scratch) *s, TL_T *y) {
    const int64_t cin = d->c_in, cout = d->c_out, m = j1 - j0;
    for (int64_t q = 0; q < m; q++) {
        memcpy(s->gx + q * cin, x + (int64_t)p->in[j0 + q] * cin, sizeof(TL_T) * (size_t)cin);
        memset(s->gy + q * cout, 0, sizeof(TL_T) * (size_t)cout);
        s->xr[q] = s->gx + q * cin;
        s->yr[q] = s->gy + q * cout;
    }
    TL_FN(tl_mk_rows)(s->mk, cout, cin, m, s->xr, wn, cout, s->yr);
    for (int64_t q = 0; q < m; q++) {
        TL_T *dst = y + (int64_t)p->out[j0 + q] * cout;
        const TL_T *blk = s->gy + q * cout;
        for (int64_t c = 0; c < cout; c++) dst[c] += blk[c];
    }
}

static tl_status TL_FN(tl_pairs_fwd)(const tl_ctx *ctx, const tl_conv_desc *d, const TL_T *x,
                                     const TL_T *w, const tl_pairs *p, TL_T *y) {
    const int64_t cin = d->c_in, cout = d->c_out;
    memset(y, 0, sizeof(TL_T) * (size_t)(d->n_out * cout));
    int failed = 0; /* shared: every thread must reach the same worksharing loops */
    const int threads = tl_threads_for(ctx, p->offsets[p->k] * cin * cout);
#pragma omp parallel num_threads(threads)
    {
        TL_FN(tl_pairs_scratch) s;
        if (!TL_FN(tl_scratch_init)(&s, ctx, d)) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        int stop;
#pragma omp atomic read
        stop = failed;
        for (int64_t n = 0; !stop && n < p->k; n++) {
            const int64_t j0 = p->offsets[n], j1 = p->offsets[n + 1];
#pragma omp for schedule(static)
            for (int64_t j = j0; j < j1; j += TL_PAIR_BLOCK)
                TL_FN(tl_pairs_block)(d, x, w + n * cin * cout, p, j,
                                      j + TL_PAIR_BLOCK < j1 ? j + TL_PAIR_BLOCK : j1, &s, y);
        }
        TL_FN(tl_scratch_free)(&s);
    }
    return failed ? TL_ERR_NOMEM : TL_OK;
}

/* Gather-scatter: acc += sum over pairs [j0, j1) of x[in]^T dy[out], in
 * chunks of TL_PAIR_BLOCK pairs whose dy rows are gathered first.  (The
 * fetch-on-demand weight gradient runs implicit GEMM's blocks over the pair
 * lists: tl_implicit_gemm_weight_grad_pairs.) */
static void TL_FN(tl_pairs_wgrad_range)(const tl_conv_desc *d, const TL_T *x, const TL_T *dy,
                                        const tl_pairs *p, int64_t j0, int64_t j1,
                                        TL_FN(tl_pairs_scratch) *s, TL_T *acc) {
    const int64_t cin = d->c_in, cout = d->c_out;
    for (int64_t j = j0; j < j1; j += TL_PAIR_BLOCK) {
        const int64_t m = j1 - j < TL_PAIR_BLOCK ? j1 - j : TL_PAIR_BLOCK;
        for (int64_t q = 0; q < m; q++) {
            s->xr[q] = x + (int64_t)p->in[j + q] * cin;
            memcpy(s->gd + q * cout, dy + (int64_t)p->out[j + q] * cout,
                   sizeof(TL_T) * (size_t)cout);
            s->dr[q] = s->gd + q * cout;
        }
        TL_FN(tl_mk_outer_acc)(s->mk, cin, cout, m, s->xr, s->dr, acc, NULL, NULL, 0);
    }
}

static tl_status TL_FN(tl_pairs_wgrad)(const tl_ctx *ctx, const tl_conv_desc *d,
                                       const TL_T *x, const TL_T *dy, const tl_pairs *p,
                                       TL_T *dw) {
    const int64_t k = p->k, mat = d->c_in * d->c_out, parts = tl_pairs_wgrad_parts(d);
    TL_T *partial = parts > 1 ? tl_mem_aligned(sizeof(TL_T) * (size_t)(k * parts * mat)) : dw;
    if (!partial) return TL_ERR_NOMEM;
    int failed = 0;
    const int threads = tl_threads_for(ctx, p->offsets[k] * mat);
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        TL_FN(tl_pairs_scratch) s;
        int ok = TL_FN(tl_scratch_init)(&s, ctx, d);
        failed |= !ok;
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < k * parts; t++) {
            const int64_t n = t / parts, part = t % parts;
            const int64_t len = p->offsets[n + 1] - p->offsets[n];
            const int64_t j0 = p->offsets[n] + len * part / parts;
            const int64_t j1 = p->offsets[n] + len * (part + 1) / parts;
            TL_T *acc = partial + (part * k + n) * mat; /* layout [part][n] */
            memset(acc, 0, sizeof(TL_T) * (size_t)mat);
            if (ok) TL_FN(tl_pairs_wgrad_range)(d, x, dy, p, j0, j1, &s, acc);
        }
        TL_FN(tl_scratch_free)(&s);
    }
    if (parts > 1) {
        TL_FN(tl_mk_sum_parts)(tl_threads_for(ctx, k * mat * parts), partial, parts, k * mat, dw);
        free(partial);
    }
    return failed ? TL_ERR_NOMEM : TL_OK;
}

#undef TL_FN
#undef TL_CAT
#undef TL_CAT2
