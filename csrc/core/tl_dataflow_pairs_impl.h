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

/* Per-thread scratch: the micro-kernels and row pointers: a forward block's,
 * or two weight-gradient chunks' (the current one and the next, whose rows
 * the current one asks for). */
typedef struct TL_FN(tl_pairs_scratch) {
    const TL_FN(tl_mk_ops) *mk; /* the micro-kernels for this CPU */
    const TL_T *xr[2][TL_PAIR_BLOCK], *dr[2][TL_PAIR_BLOCK];
    TL_T *yr[TL_PAIR_BLOCK];
    int64_t step; /* the forward's pairs a step (tl_pairs_step) */
    TL_T *xp; /* the weight gradient's packed x rows where it packs them, else NULL */
} TL_FN(tl_pairs_scratch);

/* Gather-scatter, pairs [j0, j1) of one kernel row: y[out] += x[in] @ wn (the
 * kernel row's c_in x c_out weights), each pair's product summed in registers
 * and added to its output row.  The micro-kernels read rows through
 * pointers, so the "gather" and "scatter" are pointers to the pairs' rows in
 * place: copying the x rows into a dense block and multiplying into a zeroed
 * block scatter-added after (before 2026-12-06) added the same products in
 * the same order (0 + sum, then y + that: bitwise y + sum, as y is never -0)
 * at 0.3-0.9x the speed of this.  The rows are taken a step at a time, the next
 * step's x and y rows asked for first (about TL_PAIR_AHEAD_BYTES of them:
 * 16 pairs at C = 16 in fp32, 8 at 32, 4 from 64, each the best of 2-32 on
 * both scenes' maps; without asking, 0.44-1.02x); where the layer is at most
 * rows8_max_cols wide, eight rows a pass as implicit GEMM's forward runs
 * them (0.97-1.15x; 1.10-1.15x at C = 16).  A kernel row's outputs are distinct
 * (strictly increasing, checked), so its blocks may run on any threads.
 * (The fetch-on-demand forward runs implicit GEMM's tiles over the pair
 * lists, tl_implicit_gemm_forward_pairs; the sums are the same, so the two
 * forwards are bitwise equal where both run these micro-kernels.) */
static void TL_FN(tl_pairs_block)(const tl_conv_desc *d, const TL_T *x, const TL_T *wn,
                                  const tl_pairs *p, int64_t j0, int64_t j1,
                                  TL_FN(tl_pairs_scratch) *s, TL_T *y) {
    const int64_t cin = d->c_in, cout = d->c_out, m = j1 - j0;
    const TL_T **xr = s->xr[0];
    for (int64_t q = 0; q < m; q++) {
        xr[q] = x + (int64_t)p->in[j0 + q] * cin;
        s->yr[q] = y + (int64_t)p->out[j0 + q] * cout;
    }
    const int64_t xb = cin * (int64_t)sizeof(TL_T), yb = cout * (int64_t)sizeof(TL_T);
    const int64_t step = s->step;
    const int eight = cout <= s->mk->rows8_max_cols;
    for (int64_t q0 = 0; q0 < m; q0 += step) {
        const int64_t q1 = q0 + step < m ? q0 + step : m;
        for (int64_t q = q1; q < q1 + step && q < m; q++) {
            for (int64_t b = 0; b < xb; b += 64) __builtin_prefetch((const char *)xr[q] + b);
            for (int64_t b = 0; b < yb; b += 64) __builtin_prefetch((const char *)s->yr[q] + b, 1);
        }
        const int64_t e = eight ? (q1 - q0) / 8 * 8 : 0; /* then groups of 4, 2, 1 */
        if (e) s->mk->rows_8(cout, cin, e, xr + q0, wn, cout, s->yr + q0, 0);
        TL_FN(tl_mk_rows)(s->mk, cout, cin, q1 - q0 - e, xr + q0 + e, wn, cout, s->yr + q0 + e);
    }
}

/* Pairs a step of tl_pairs_block: about TL_PAIR_AHEAD_BYTES of x and y rows,
 * 4 to 16 of them, a multiple of 8 where eight rows run a pass. */
static int64_t TL_FN(tl_pairs_step)(const TL_FN(tl_mk_ops) *mk, const tl_conv_desc *d) {
    const int64_t bytes = (d->c_in + d->c_out) * (int64_t)sizeof(TL_T);
    int64_t step = bytes > 0 ? TL_PAIR_AHEAD_BYTES / bytes / 4 * 4 : 16;
    step = step < 4 ? 4 : step > 16 ? 16 : step;
    if (d->c_out <= mk->rows8_max_cols) step = step < 8 ? 8 : step / 8 * 8;
    return step;
}

static tl_status TL_FN(tl_pairs_fwd)(const tl_ctx *ctx, const tl_conv_desc *d, const TL_T *x,
                                     const TL_T *w, const tl_pairs *p, TL_T *y) {
    const int64_t cin = d->c_in, cout = d->c_out;
    memset(y, 0, sizeof(TL_T) * (size_t)(d->n_out * cout));
    const int threads = tl_threads_for(ctx, p->offsets[p->k] * cin * cout);
#pragma omp parallel num_threads(threads)
    {
        TL_FN(tl_pairs_scratch) s = {.mk = TL_FN(tl_mk_pick)(ctx)};
        s.step = TL_FN(tl_pairs_step)(s.mk, d);
        /* Kernel rows one after another (the loop's barrier): a row's outputs
         * are distinct, two rows' are not.  In implicit GEMM's order, the lead
         * kernel row first (tl_fwd_order), so the two forwards' sums agree. */
        const int64_t lead = tl_fwd_lead(p->k);
        for (int64_t i = 0; i < p->k; i++) {
            const int64_t n = tl_fwd_order(lead, i);
            const int64_t j0 = p->offsets[n], j1 = p->offsets[n + 1];
#pragma omp for schedule(static)
            for (int64_t j = j0; j < j1; j += TL_PAIR_BLOCK)
                TL_FN(tl_pairs_block)(d, x, w + n * cin * cout, p, j,
                                      j + TL_PAIR_BLOCK < j1 ? j + TL_PAIR_BLOCK : j1, &s, y);
        }
    }
    return TL_OK;
}

/* Lists the row pointers of pairs [j, j + m) (at most TL_PAIR_BLOCK, up to
 * j1) into xr and dr; returns m. */
static int64_t TL_FN(tl_pairs_chunk)(const TL_T *x, const TL_T *dy, const tl_pairs *p,
                                     int64_t cin, int64_t cout, int64_t j, int64_t j1,
                                     const TL_T **xr, const TL_T **dr) {
    const int64_t m = j1 - j < TL_PAIR_BLOCK ? j1 - j : TL_PAIR_BLOCK;
    for (int64_t q = 0; q < m; q++) {
        xr[q] = x + (int64_t)p->in[j + q] * cin;
        dr[q] = dy + (int64_t)p->out[j + q] * cout;
    }
    return m;
}

/* Gather-scatter: acc += sum over pairs [j0, j1) of x[in]^T dy[out], in
 * chunks of TL_PAIR_BLOCK pairs, both rows read through pointers in place
 * (before 2026-12-06 the dy rows were copied into a block first: the same
 * sums at 0.3-0.9x the speed) or, where implicit GEMM's weight gradient
 * packs its x rows (tl_mk_wgrad_packs), the x rows packed by the panel
 * micro-kernel (1.06-1.42x; sums over its own chunks), each chunk's passes
 * asking for the next chunk's rows.  (The fetch-on-demand weight gradient
 * runs implicit GEMM's blocks over the pair lists:
 * tl_implicit_gemm_weight_grad_pairs.) */
static void TL_FN(tl_pairs_wgrad_range)(const tl_conv_desc *d, const TL_T *x, const TL_T *dy,
                                        const tl_pairs *p, int64_t j0, int64_t j1,
                                        TL_FN(tl_pairs_scratch) *s, TL_T *acc) {
    const int64_t cin = d->c_in, cout = d->c_out;
    int c = 0;
    int64_t j = j0, m = j < j1 ? TL_FN(tl_pairs_chunk)(x, dy, p, cin, cout, j, j1, s->xr[0],
                                                       s->dr[0])
                               : 0;
    while (m > 0) {
        /* The next chunk's rows listed first, so that this one's passes ask for them. */
        const int64_t jn = j + m;
        const int64_t next = jn < j1 ? TL_FN(tl_pairs_chunk)(x, dy, p, cin, cout, jn, j1,
                                                             s->xr[c ^ 1], s->dr[c ^ 1])
                                     : 0;
        if (s->xp)
            s->mk->panel(cout, m, cin, s->xr[c], s->xp, s->dr[c], acc, cout, s->xr[c ^ 1],
                         s->dr[c ^ 1], next);
        else
            TL_FN(tl_mk_outer_acc)(s->mk, cin, cout, m, s->xr[c], s->dr[c], acc, s->xr[c ^ 1],
                                   s->dr[c ^ 1], next);
        j = jn;
        m = next;
        c ^= 1;
    }
}

static tl_status TL_FN(tl_pairs_wgrad)(const tl_ctx *ctx, const tl_conv_desc *d,
                                       const TL_T *x, const TL_T *dy, const tl_pairs *p,
                                       TL_T *dw) {
    const int64_t k = p->k, mat = d->c_in * d->c_out, parts = tl_pairs_wgrad_parts(d);
    TL_T *partial = parts > 1 ? tl_mem_aligned(sizeof(TL_T) * (size_t)(k * parts * mat)) : dw;
    if (!partial) return TL_ERR_NOMEM;
    const int threads = tl_threads_for(ctx, p->offsets[k] * mat);
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        TL_FN(tl_pairs_scratch) s = {.mk = TL_FN(tl_mk_pick)(ctx)};
        if (TL_FN(tl_mk_wgrad_packs)(s.mk, d->c_in, d->c_out)) {
            const int64_t ldx = TL_FN(tl_mk_packed_ld)(d->c_in);
            s.xp = malloc(sizeof(TL_T) * (size_t)(TL_FN(tl_mk_panel_pairs)(ldx) * ldx));
            failed |= s.xp == NULL;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < k * parts; t++) {
            const int64_t n = t / parts, part = t % parts;
            const int64_t len = p->offsets[n + 1] - p->offsets[n];
            const int64_t j0 = p->offsets[n] + len * part / parts;
            const int64_t j1 = p->offsets[n] + len * (part + 1) / parts;
            TL_T *acc = partial + (part * k + n) * mat; /* layout [part][n] */
            memset(acc, 0, sizeof(TL_T) * (size_t)mat);
            if (!failed) TL_FN(tl_pairs_wgrad_range)(d, x, dy, p, j0, j1, &s, acc);
        }
        free(s.xp);
    }
    if (failed) {
        if (parts > 1) free(partial);
        return TL_ERR_NOMEM;
    }
    if (parts > 1) {
        TL_FN(tl_mk_sum_parts)(tl_threads_for(ctx, k * mat * parts), partial, parts, k * mat, dw);
        free(partial);
    }
    return TL_OK;
}

#undef TL_FN
#undef TL_CAT
#undef TL_CAT2
