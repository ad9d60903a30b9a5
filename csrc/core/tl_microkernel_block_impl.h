/* One register-blocked update of tl_microkernel_isa_impl.h, at one vector
 * width.  Included with TL_BLOCK_FN (function name), TL_BLOCK_VEC (vector
 * type name), TL_BLOCK_BYTES (bytes per vector) and TL_BLOCK_NV (most vectors
 * per row) defined, inside the instruction set's TL_T and TL_ISA_ATTR: once at
 * the full register width, and at narrower widths for the columns left over.
 *
 *   out[r][j + :] += sum_q a(r, q) * b[q][j + :],  r < R, NV vectors wide
 *   (R <= 4, or R = 8 with R * NV <= 16 accumulators),
 *
 * where a(r, q) is a[r][q] and b[q] is bp + q * ldb (transposed == 0:
 * forward, q = input channel, a[r] = x row, weight rows ldb apart, no pointer
 * to load per row) or a(r, q) is a[q][c0 + r] (transposed == 1: weight
 * gradient, q = pair, a[q] = x row, b[q] = dy row, so no transposed copy of
 * the x rows is needed; byte pf_byte of each row pf[q], q < npf, is asked
 * for on the way, as in TL_BLOCK_PFN).  Where `set` (forward only), the sums
 * replace out instead (out = sum + 0, bit for bit what adding them to a
 * zeroed out gives, -0 included), so out is not read.  Only the columns of
 * out below cv are read and written: with AVX-512 a block may compute its
 * last vector whole where fewer of its lanes are columns (see
 * TL_MKI(padded): a forward over weight rows padded with zeros, or a weight
 * gradient that reads the dy rows' last vector masked), and then reads and
 * writes only its first cv - j - (NV - 1) * vl lanes.  Always inlined with
 * constant R, NV, transposed and set, so acc[][] lives in registers.
 * TL_BLOCK_PFN is the same update over packed panels (below). */
#if !defined(TL_BLOCK_FN) || !defined(TL_BLOCK_PFN) || !defined(TL_BLOCK_BYTES) || \
    !defined(TL_BLOCK_PARTS)
#error "define TL_BLOCK_FN, _PFN, _VEC, _BYTES, _NV and _PARTS first"
#endif
/* TL_BLOCK_PARTS: 1 where the block may be padded (AVX-512's full width), with
 * TL_BLOCK_LOAD_PART(p, left) (the first `left` lanes at p, the others zero)
 * and TL_BLOCK_STORE_PART(p, v, left) (v's first `left` lanes to p) defined. */

typedef TL_T TL_BLOCK_VEC __attribute__((vector_size(TL_BLOCK_BYTES)));

static inline __attribute__((always_inline)) TL_ISA_ATTR void TL_BLOCK_FN(
    int R, int NV, int transposed, int set, int64_t j, int64_t nq, int64_t c0,
    const TL_T *const *a, const TL_T *const *b, const TL_T *bp, int64_t ldb,
    TL_T *const *out, const TL_T *const *pf, int64_t npf, int64_t pf_byte, int64_t cv) {
    const int64_t vl = (int64_t)(TL_BLOCK_BYTES / sizeof(TL_T));
#if TL_BLOCK_PARTS
    /* Lanes of the last vector that are columns of out (and of the dy rows):
     * all but where the caller computes padding columns. */
    const int64_t left = cv - j - (NV - 1) * vl;
#else
    (void)cv; /* never padded: cv >= j + NV * vl */
#endif
    TL_BLOCK_VEC acc[8][TL_BLOCK_NV];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = (TL_BLOCK_VEC){0};
#pragma GCC unroll 2
    for (int64_t q = 0; q < nq; q++) {
        /* Unrolled by pragma, as in TL_BLOCK_PFN below (NV = 3 spills otherwise). */
        TL_BLOCK_VEC bv[TL_BLOCK_NV];
        if (transposed && q < npf) __builtin_prefetch((const char *)pf[q] + pf_byte);
        if (transposed) TL_MK_ASK_PAIR_AHEAD(a, b, q, nq, c0, j);
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) {
            const TL_T *bq = transposed ? b[q] : bp + q * ldb;
#if TL_BLOCK_PARTS
            if (transposed && v == NV - 1 && left < vl) { /* the dy row ends inside it */
                bv[v] = TL_BLOCK_LOAD_PART(bq + j + v * vl, left);
                continue;
            }
#endif
            memcpy(&bv[v], bq + j + v * vl, sizeof(TL_BLOCK_VEC));
        }
        /* One base pointer per pair, opaque to the compiler, so that the R
         * broadcasts take constant offsets: GCC otherwise hoists each
         * (c0 + r) as an index register, and at R = 8 spills them. */
        const TL_T *aq = transposed ? a[q] + c0 : NULL;
        if (transposed) __asm__("" : "+r"(aq));
        for (int r = 0; r < R; r++) {
            TL_T s = transposed ? aq[r] : a[r][q];
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) acc[r][v] += s * bv[v];
        }
    }
    /* Where the last vector is partial, the rows read their columns
     * (TL_BLOCK_LOAD_PART) before any is written (TL_BLOCK_STORE_PART): a
     * masked store spans the next row's first columns, and a load after it
     * waits for it to reach the cache (C = 24 ran at 0.5x of C = 32 per
     * multiply-add when each row was read just after the previous one was
     * written).  Unrolled, so that acc[][] stays in registers. */
#if TL_BLOCK_PARTS
    if (left < vl) {
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) {
                const TL_T *p = out[r] + j + v * vl;
                TL_BLOCK_VEC o = (TL_BLOCK_VEC){0};
                if (!set && v < NV - 1) memcpy(&o, p, sizeof(TL_BLOCK_VEC));
                if (!set && v == NV - 1) o = TL_BLOCK_LOAD_PART(p, left);
                acc[r][v] = o + acc[r][v];
            }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) {
                TL_T *p = out[r] + j + v * vl;
                if (v < NV - 1)
                    memcpy(p, &acc[r][v], sizeof(TL_BLOCK_VEC));
                else
                    TL_BLOCK_STORE_PART(p, acc[r][v], left);
            }
        return;
    }
#endif
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) {
            TL_BLOCK_VEC o = (TL_BLOCK_VEC){0};
            if (!set) memcpy(&o, out[r] + j + v * vl, sizeof(TL_BLOCK_VEC));
            o += acc[r][v];
            memcpy(out[r] + j + v * vl, &o, sizeof(TL_BLOCK_VEC));
        }
}

/* The weight gradient's update over packed x rows:
 *   out[r * ldo + j + :] += sum_q xp[q * ldx + r] * dq[q][j + :],  r < R,
 * where xp + q * ldx holds R input channels of pair q (packed rows ldx
 * apart: a fixed stride, no pointer load per pair), or, xr not NULL, the
 * same over x rows in place, xr[q][c0 + r] for xp[q * ldx + r] (a pointer
 * load per pair; the caller keeps c0 + R within the rows); dq[q] is the
 * pair's dy row: each dy vector feeds R FMAs (R = 4, 6 or 8, R * NV <= 24
 * accumulators).  Only rows r < valid are written (the last input channels
 * may be padding zeros).  While it runs, byte pf_byte of the rows pf[q],
 * q < npf, and byte pf_byte2 of pf2[q], q < npf2, are asked for (see
 * tl_mk_ops.panel). */
static inline __attribute__((always_inline)) TL_ISA_ATTR void TL_BLOCK_PFN(
    int R, int NV, int64_t j, int64_t nq, const TL_T *xp, int64_t ldx, const TL_T *const *xr,
    int64_t c0, const TL_T *const *dq, TL_T *out, int64_t ldo, int64_t valid,
    const TL_T *const *pf, int64_t npf, int64_t pf_byte, const TL_T *const *pf2, int64_t npf2,
    int64_t pf_byte2) {
    const int64_t vl = (int64_t)(TL_BLOCK_BYTES / sizeof(TL_T));
    TL_BLOCK_VEC acc[8][TL_BLOCK_NV];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = (TL_BLOCK_VEC){0};
    for (int64_t q = 0; q < nq; q++) {
        /* Unrolled by hand: GCC leaves a 3-iteration loop rolled, and bv[]
         * then lives on the stack. */
        TL_BLOCK_VEC bv[TL_BLOCK_NV];
        if (q < npf) __builtin_prefetch((const char *)pf[q] + pf_byte);
        if (q < npf2) __builtin_prefetch((const char *)pf2[q] + pf_byte2);
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++)
            memcpy(&bv[v], dq[q] + j + v * vl, sizeof(TL_BLOCK_VEC));
        /* Opaque in place, so the R broadcasts take constant offsets (as in
         * TL_BLOCK_FN). */
        const TL_T *aq = xr ? xr[q] + c0 : xp + q * ldx;
        if (xr) __asm__("" : "+r"(aq));
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            TL_T s = aq[r];
#pragma GCC unroll 8
            for (int v = 0; v < NV; v++) acc[r][v] += s * bv[v];
        }
    }
    for (int r = 0; r < R; r++) {
        if (r >= valid) break;
        for (int v = 0; v < NV; v++) {
            TL_BLOCK_VEC o;
            memcpy(&o, out + r * ldo + j + v * vl, sizeof(TL_BLOCK_VEC));
            o += acc[r][v];
            memcpy(out + r * ldo + j + v * vl, &o, sizeof(TL_BLOCK_VEC));
        }
    }
}
