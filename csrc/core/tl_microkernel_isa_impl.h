/* The register-blocked micro-kernels for one element type and one instruction
 * set.  tl_microkernel_impl.h includes this once per instruction set with
 * TL_T, TL_SFX (type suffix), TL_ISA (instruction-set suffix), TL_ISA_ATTR
 * (the functions' target attribute), TL_ISA_VBYTES (bytes per vector) and
 * TL_ISA_NV (most vectors per block row) and TL_ISA_NV_WG (vectors per row of
 * the weight gradient's packed panel blocks) defined.  Functions are named
 * tl_mk_<name>_<sfx>_<isa>; the table tl_mk_ops_<sfx>_<isa> lists them.
 *
 * A block of 4 rows x TL_ISA_NV vectors of accumulators stays in registers
 * over the whole reduction, so each loaded weight or gradient vector feeds 4
 * FMAs and outputs are read and written once per block instead of once per
 * channel.  The shape is per instruction set because the register files
 * differ: AVX-512 has 32 vector registers (16 accumulators of 64 bytes fit,
 * 24 in the weight gradient's panel: TL_ISA_WG_ROWS), AVX2 and SSE2 have 16
 * (8 accumulators of 32 or 16 bytes).  The vector type
 * is GCC's generic vector extension at the target's register width (a wider
 * one would be split through memory) or narrower, for leftover columns. */
#if !defined(TL_T) || !defined(TL_ISA)
#error "define TL_T, TL_SFX, TL_ISA, TL_ISA_ATTR, TL_ISA_VBYTES and TL_ISA_NV first"
#endif

#define TL_MKI_CAT3(a, b, c) a##_##b##_##c
#define TL_MKI_CAT(a, b, c) TL_MKI_CAT3(a, b, c)
#define TL_MKI(name) TL_MKI_CAT(tl_mk_##name, TL_SFX, TL_ISA)

/* A block's last vector where only its first `left` lanes are columns of
 * the output (see TL_MKI(columns)), read and written with AVX-512's masked
 * loads and stores; the narrower blocks never get one (TL_BLOCK_PARTS 0). */
#if TL_ISA_VBYTES == 64
typedef TL_T TL_MKI(pvec) __attribute__((vector_size(64)));
static inline __attribute__((always_inline)) TL_ISA_ATTR TL_MKI(pvec)
    TL_MKI(load_part)(const TL_T *p, int64_t left) {
    if (sizeof(TL_T) == 4)
        return (TL_MKI(pvec))_mm512_maskz_loadu_ps((__mmask16)((1u << left) - 1u), p);
    return (TL_MKI(pvec))_mm512_maskz_loadu_pd((__mmask8)((1u << left) - 1u), p);
}
static inline __attribute__((always_inline)) TL_ISA_ATTR void TL_MKI(store_part)(
    TL_T *p, TL_MKI(pvec) v, int64_t left) {
    if (sizeof(TL_T) == 4)
        _mm512_mask_storeu_ps(p, (__mmask16)((1u << left) - 1u), (__m512)v);
    else
        _mm512_mask_storeu_pd(p, (__mmask8)((1u << left) - 1u), (__m512d)v);
}
#define TL_BLOCK_LOAD_PART(P, LEFT) TL_MKI(load_part)(P, LEFT)
#define TL_BLOCK_STORE_PART(P, V, LEFT) TL_MKI(store_part)(P, V, LEFT)
#define TL_BLOCK_PARTS 1
#else
#define TL_BLOCK_PARTS 0
#endif

/* The register-blocked updates (tl_microkernel_block_impl.h): block at the
 * full register width, block_32 and block_16 at 32 and 16 bytes where those
 * are narrower, so that columns left over by the full-width blocks still run
 * as vectors where the weight rows end at the last column. */
#define TL_BLOCK_FN TL_MKI(block)
#define TL_BLOCK_PFN TL_MKI(pblock)
#define TL_BLOCK_VEC TL_MKI(vec)
#define TL_BLOCK_BYTES TL_ISA_VBYTES
#define TL_BLOCK_NV (TL_ISA_NV > TL_ISA_NV_WG ? TL_ISA_NV : TL_ISA_NV_WG)
#include "tl_microkernel_block_impl.h"
#undef TL_BLOCK_PFN
#undef TL_BLOCK_FN
#undef TL_BLOCK_VEC
#undef TL_BLOCK_BYTES
#undef TL_BLOCK_NV
#undef TL_BLOCK_PARTS
#define TL_BLOCK_PARTS 0
#if TL_ISA_VBYTES > 32
#define TL_BLOCK_FN TL_MKI(block_32)
#define TL_BLOCK_PFN TL_MKI(pblock_32)
#define TL_BLOCK_VEC TL_MKI(vec_32)
#define TL_BLOCK_BYTES 32
#define TL_BLOCK_NV 1
#include "tl_microkernel_block_impl.h"
#undef TL_BLOCK_PFN
#undef TL_BLOCK_FN
#undef TL_BLOCK_VEC
#undef TL_BLOCK_BYTES
#undef TL_BLOCK_NV
#endif
#if TL_ISA_VBYTES > 16
#define TL_BLOCK_FN TL_MKI(block_16)
#define TL_BLOCK_PFN TL_MKI(pblock_16)
#define TL_BLOCK_VEC TL_MKI(vec_16)
#define TL_BLOCK_BYTES 16
#define TL_BLOCK_NV 1
#include "tl_microkernel_block_impl.h"
#undef TL_BLOCK_PFN
#undef TL_BLOCK_FN
#undef TL_BLOCK_VEC
#undef TL_BLOCK_BYTES
#undef TL_BLOCK_NV
#endif
#undef TL_BLOCK_PARTS
#if TL_ISA_VBYTES == 64
#undef TL_BLOCK_LOAD_PART
#undef TL_BLOCK_STORE_PART
#endif

#define TL_VL ((int64_t)(TL_ISA_VBYTES / sizeof(TL_T))) /* lanes per full vector */

/* Walks the column blocks of cw columns with j at each block's first column:
 * blocks of NVMAX vectors (only while that leaves no single vector behind
 * when NVMAX is odd or SPLIT_LAST is 1: 4 vectors run as 2 + 2, not 3 + 1),
 * then pairs, then 1; then one 32-byte and one 16-byte vector where they fit.
 * CALL(W, NV) runs one block of NV vectors at width W (empty: the full
 * register width, _32 or _16).  Leaves j at the first of the scalar columns
 * narrower than 16 bytes. */
#define TL_COLUMN_BLOCKS(NVMAX, SPLIT_LAST, CALL)                                           \
    do {                                                                                    \
        int64_t vecs_ = cw / TL_VL;                                                         \
        for (; vecs_ >= (NVMAX) &&                                                          \
               (((NVMAX) % 2 == 0 && !(SPLIT_LAST)) || vecs_ - (NVMAX) != 1);               \
             vecs_ -= (NVMAX), j += (NVMAX) * TL_VL)                                        \
            CALL(, NVMAX);                                                                  \
        TL_COLUMN_TAIL(CALL);                                                               \
    } while (0)
/* The vecs_ vectors left after the widest blocks: pairs, then 1; then the
 * narrower vectors where they fit (inside TL_COLUMN_BLOCKS and the like). */
#define TL_COLUMN_TAIL(CALL)                                                                \
    for (; vecs_ >= 2; vecs_ -= 2, j += 2 * TL_VL) CALL(, 2);                               \
    if (vecs_ >= 1) {                                                                       \
        CALL(, 1);                                                                          \
        j += TL_VL;                                                                         \
    }                                                                                       \
    TL_COLUMN_NARROW(32, CALL);                                                             \
    TL_COLUMN_NARROW(16, CALL)
#if TL_ISA_VBYTES > 32
#define TL_COLUMN_NARROW_32(CALL)                                                           \
    if (j + (int64_t)(32 / sizeof(TL_T)) <= cw) {                                           \
        CALL(_32, 1);                                                                       \
        j += (int64_t)(32 / sizeof(TL_T));                                                  \
    }
#else
#define TL_COLUMN_NARROW_32(CALL)
#endif
#if TL_ISA_VBYTES > 16
#define TL_COLUMN_NARROW_16(CALL)                                                           \
    if (j + (int64_t)(16 / sizeof(TL_T)) <= cw) {                                           \
        CALL(_16, 1);                                                                       \
        j += (int64_t)(16 / sizeof(TL_T));                                                  \
    }
#else
#define TL_COLUMN_NARROW_16(CALL)
#endif
#define TL_COLUMN_NARROW(BYTES, CALL) TL_COLUMN_NARROW_##BYTES(CALL)

/* Most vectors per block row of the 8-row forward blocks: 8 x NV accumulators
 * must leave registers for the weight vectors and broadcasts (16 of AVX-512's
 * 32; 8 of AVX2's or SSE2's 16). */
#define TL_ISA_NV8 (TL_ISA_NV / 2)
/* Most vectors of an 8-row block where a caller asks for wider ones
 * (rows8_max_cols): 8 x 3 accumulators with AVX-512 (plus 3 weight vectors
 * and a broadcast: 28 of 32 registers), one weight or x load for every 2.2
 * multiply-adds where 4 rows of 3 vectors load one for every 1.7. */
#define TL_ISA_NV8_MAX (TL_ISA_VBYTES == 64 ? 3 : TL_ISA_NV8)

/* Columns the blocks of TL_MKI(columns) compute for cw output columns: with
 * AVX-512, cw rounded up to whole vectors where every row of the other
 * operand holds them (ldb: a forward's weight rows, a padded panel's width,
 * see tl_panel_ld; the weight gradient's rows_t read their dy rows' last
 * vector masked, so any ldb), so that C = 24, 40 or 56 run as the blocks of
 * 32, 48 or 64, reading and writing only their first cw columns, instead of
 * leaving a narrower vector or scalars to a pass of their own that loads
 * every x value again (forward 1.1-1.5x at C = 20-56, weight gradient
 * 1.2-1.35x at C = 20-24).  The weight gradient's packed panel keeps its
 * narrower last blocks (padded there, C_out = 40-72 ran 0.85-0.95x).
 * Else cw. */
static inline int64_t TL_MKI(padded)(int64_t cw, int64_t ldb) {
    const int64_t up = (cw + TL_VL - 1) / TL_VL * TL_VL;
    return TL_ISA_VBYTES == 64 && up <= ldb ? up : cw;
}

/* All cw columns for R rows: the column blocks of TL_COLUMN_BLOCKS (at most
 * TL_ISA_NV vectors wide, TL_ISA_NV8 for 8 rows) over TL_MKI(padded)'s
 * columns, then scalars.  (setup.py compiles with -ffp-contract=fast, so the
 * multiply-adds become FMA instructions where the target has them; -std=c11
 * alone would turn contraction off.) */
static inline __attribute__((always_inline)) TL_ISA_ATTR void TL_MKI(columns)(
    int R, int transposed, int set, int64_t cv, int64_t nq, int64_t c0, const TL_T *const *a,
    const TL_T *const *b, const TL_T *bp, int64_t ldb, TL_T *const *out,
    const TL_T *const *pf, int64_t npf, int64_t pf_byte) {
    int64_t j = 0;
    const int64_t cw = TL_MKI(padded)(cv, transposed ? INT64_MAX : ldb);
#define TL_COLUMNS_CALL(W, NV)                                                              \
    TL_MKI(block##W)(R, NV, transposed, set, j, nq, c0, a, b, bp, ldb, out, pf,               \
                     j == 0 ? npf : 0, pf_byte, cv)
    TL_COLUMN_BLOCKS(R == 8 ? TL_ISA_NV8_MAX : R == 6 ? 2 : TL_ISA_NV, 0, TL_COLUMNS_CALL);
#undef TL_COLUMNS_CALL
    for (int r = 0; r < R; r++)
        for (int64_t jj = j; jj < cw; jj++) {
            TL_T s = 0;
            for (int64_t q = 0; q < nq; q++)
                s += transposed ? a[q][c0 + r] * b[q][jj] : a[r][q] * bp[q * ldb + jj];
            out[r][jj] = (set ? (TL_T)0 : out[r][jj]) + s;
        }
}

/* out[r][0:cw) += sum_q a[r][q] * b[q * ldb + 0:cw), for 4, 2 or 1 rows
 * (rows_R), or = it (rows_R_set, SET 1: see TL_BLOCK_FN). */
#define TL_DEFINE_ROWS(R, NAME, SET)                                                       \
    static TL_ISA_ATTR void TL_MKI(NAME)(int64_t cw, int64_t nq, const TL_T *const *a,     \
                                         const TL_T *b, int64_t ldb, TL_T *const *out) {   \
        TL_MKI(columns)(R, 0, SET, cw, nq, 0, a, NULL, b, ldb, out, NULL, 0, 0);           \
    }
TL_DEFINE_ROWS(4, rows_4, 0)
TL_DEFINE_ROWS(2, rows_2, 0)
TL_DEFINE_ROWS(1, rows_1, 0)
TL_DEFINE_ROWS(4, rows_4_set, 1)
TL_DEFINE_ROWS(2, rows_2_set, 1)
#undef TL_DEFINE_ROWS

/* rows_8 for a layer one vector wide and one vector deep (cw = nq = TL_VL:
 * C = 16 in fp32 with AVX-512): the panel's nq weight vectors stay in
 * registers for every group, beside the 8 accumulators.  Same sums in the
 * same order as TL_MKI(columns). */
static inline __attribute__((always_inline)) TL_ISA_ATTR void TL_MKI(rows_8_vv)(
    int set, int64_t c, const TL_T *const *a, const TL_T *b, int64_t ldb, TL_T *const *out,
    int64_t oc) {
    TL_MKI(vec) w[TL_VL];
#pragma GCC unroll 16
    for (int q = 0; q < TL_VL; q++) memcpy(&w[q], b + q * ldb, sizeof(w[q]));
    const int64_t ahead = oc == 0 ? 8 * tl_rows8_ahead(TL_VL * TL_VL) : 0;
    for (int64_t p = 0; p < c; p += 8) {
        TL_PREFETCH_AHEAD(a, p, 0, c, 8, ahead, TL_VL * (int64_t)sizeof(TL_T));
        TL_MKI(vec) acc[8];
        for (int r = 0; r < 8; r++) acc[r] = (TL_MKI(vec)){0};
#pragma GCC unroll 16
        for (int q = 0; q < TL_VL; q++)
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++) acc[r] += a[p + r][q] * w[q];
        for (int r = 0; r < 8; r++) {
            TL_MKI(vec) o = (TL_MKI(vec)){0};
            if (!set) memcpy(&o, out[p + r] + oc, sizeof(o));
            o += acc[r];
            memcpy(out[p + r] + oc, &o, sizeof(o));
        }
    }
}

#if TL_ISA_VBYTES == 64
/* rows_8_vv over rows named by index: x row x + idx[p] * ldx, output row
 * y + rows[p] * ldy, the tile lists read in place where rows_8_vv reads row
 * pointers that a pass over the lists (tl_point_rows) wrote first.  Same
 * sums in the same order; each group asks for the x rows of the group 8 x
 * tl_rows8_ahead rows on, as rows_8_vv at oc = 0. */
static inline __attribute__((always_inline)) TL_ISA_ATTR void TL_MKI(rows_8_at_body)(
    int set, int64_t c, const int32_t *idx, const int32_t *rows, const TL_T *x, int64_t ldx,
    const TL_T *b, int64_t ldb, TL_T *y, int64_t ldy) {
    TL_MKI(vec) w[TL_VL];
#pragma GCC unroll 16
    for (int q = 0; q < TL_VL; q++) memcpy(&w[q], b + q * ldb, sizeof(w[q]));
    const int64_t ahead = 8 * tl_rows8_ahead(TL_VL * TL_VL);
    for (int64_t q = 8; q < ahead && q < c; q++) __builtin_prefetch(x + idx[q] * ldx);
    for (int64_t p = 0; p < c; p += 8) {
        if (p + ahead < c)
            for (int r = 0; r < 8; r++) __builtin_prefetch(x + idx[p + ahead + r] * ldx);
        TL_MKI(vec) acc[8];
        for (int r = 0; r < 8; r++) acc[r] = (TL_MKI(vec)){0};
        const TL_T *a[8];
        for (int r = 0; r < 8; r++) a[r] = x + idx[p + r] * ldx;
#pragma GCC unroll 16
        for (int q = 0; q < TL_VL; q++)
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++) acc[r] += a[r][q] * w[q];
        for (int r = 0; r < 8; r++) {
            TL_T *out = y + rows[p + r] * ldy;
            TL_MKI(vec) o = (TL_MKI(vec)){0};
            if (!set) memcpy(&o, out, sizeof(o));
            o += acc[r];
            memcpy(out, &o, sizeof(o));
        }
    }
}

static TL_ISA_ATTR void TL_MKI(rows_8_at)(int64_t c, const int32_t *idx, const int32_t *rows,
                                          const TL_T *x, int64_t ldx, const TL_T *b,
                                          int64_t ldb, TL_T *y, int64_t ldy) {
    TL_MKI(rows_8_at_body)(0, c, idx, rows, x, ldx, b, ldb, y, ldy);
}

static TL_ISA_ATTR void TL_MKI(rows_8_at_set)(int64_t c, const int32_t *idx,
                                              const int32_t *rows, const TL_T *x, int64_t ldx,
                                              const TL_T *b, int64_t ldb, TL_T *y,
                                              int64_t ldy) {
    TL_MKI(rows_8_at_body)(1, c, idx, rows, x, ldx, b, ldb, y, ldy);
}
#define TL_ISA_ROWS_8_AT TL_MKI(rows_8_at)
#define TL_ISA_ROWS_8_AT_SET TL_MKI(rows_8_at_set)
#else
#define TL_ISA_ROWS_8_AT NULL
#define TL_ISA_ROWS_8_AT_SET NULL
#endif

#if TL_ISA_VBYTES == 32
/* AVX2's rows_8 over panels of more than one vector (up to 2: C = 16 in fp32):
 * 8 rows x 2 vectors of accumulators do not fit its 16 registers, so the c
 * rows run 6 at a time (12 accumulators, 2 weight vectors, a broadcast),
 * then 4 or 2 (c - c / 6 * 6 is even), where groups of 4 (tl_fwd_rows) loaded
 * a weight or x value for every 1.3 multiply-adds and paid their call and the
 * output rows' reads and writes for 128 of them: C = 16 forward 1.01-1.18x
 * (median 1.07x) over both scenes' subm3, k2 s2, inverse and k3 s2 p1 maps on
 * the AMD EPYC (Zen 1) of round thirty-six.  A panel of one vector and a
 * part (C = 9-15) keeps groups of 4 (its 6-row blocks ran 0.91-1.04x).  Each
 * group asks for the x rows 6 x tl_rows8_ahead rows on where oc = 0, and for
 * the next group's output rows where `set` (rows written first, as
 * tl_fwd_ask_y).  Same sums in the same order as TL_MKI(columns) for any
 * number of rows. */
static inline __attribute__((always_inline)) TL_ISA_ATTR void TL_MKI(rows_6_pass)(
    int set, int64_t cw, int64_t nq, int64_t c, const TL_T *const *a, const TL_T *b,
    int64_t ldb, TL_T *const *out, int64_t oc) {
    const int64_t ahead = oc == 0 ? 6 * tl_rows8_ahead(nq * cw) : 0;
    const int64_t row_bytes = nq * (int64_t)sizeof(TL_T);
    for (int64_t q = 6; q < ahead && q < c; q++) TL_PREFETCH_ROWS(a + q, 1, row_bytes);
    TL_T *o[6];
    int64_t p = 0;
    for (; cw == 2 * TL_VL && p + 6 <= c; p += 6) {
        for (int64_t q = p + ahead; q < p + ahead + 6 && q < c; q++)
            TL_PREFETCH_ROWS(a + q, 1, row_bytes);
        if (set && oc == 0) /* rows written first are seldom in cache (tl_fwd_ask_y) */
            for (int64_t q = p + 6; q < p + 12 && q < c; q++)
                for (int64_t b = 0; b < cw * (int64_t)sizeof(TL_T); b += 64)
                    __builtin_prefetch((const char *)out[q] + b, 1);
        for (int r = 0; r < 6; r++) o[r] = out[p + r] + oc;
        TL_MKI(columns)(6, 0, set, cw, nq, 0, a + p, NULL, b, ldb, o, NULL, 0, 0);
    }
    for (; p + 4 <= c; p += 4) {
        for (int64_t q = p + ahead; q < p + ahead + 4 && q < c; q++)
            TL_PREFETCH_ROWS(a + q, 1, row_bytes);
        for (int r = 0; r < 4; r++) o[r] = out[p + r] + oc;
        TL_MKI(columns)(4, 0, set, cw, nq, 0, a + p, NULL, b, ldb, o, NULL, 0, 0);
    }
    if (p < c) {
        for (int r = 0; r < 2; r++) o[r] = out[p + r] + oc;
        TL_MKI(columns)(2, 0, set, cw, nq, 0, a + p, NULL, b, ldb, o, NULL, 0, 0);
    }
}
#endif

/* out[p][oc + 0:cw) += sum_q a[p][q] * b[q * ldb + 0:cw) for the c rows
 * (a multiple of 8), 8 per pass: a narrow tile's full groups of one kernel
 * row in one call, so no group pays a call and its set-up.  Where oc = 0 (a
 * tile's first panel, whose x rows come from memory) each group asks for
 * the next group's x rows. */
static inline __attribute__((always_inline)) TL_ISA_ATTR void TL_MKI(rows_8_body)(
    int set, int64_t cw, int64_t nq, int64_t c, const TL_T *const *a, const TL_T *b,
    int64_t ldb, TL_T *const *out, int64_t oc) {
    if (cw == TL_VL && nq == TL_VL) {
        TL_MKI(rows_8_vv)(set, c, a, b, ldb, out, oc);
        return;
    }
#if TL_ISA_VBYTES == 32
    if (cw > TL_ISA_NV8 * TL_VL) {
        TL_MKI(rows_6_pass)(set, cw, nq, c, a, b, ldb, out, oc);
        return;
    }
#endif
    const int64_t ahead = oc == 0 ? 8 * tl_rows8_ahead(nq * cw) : 0;
    for (int64_t p = 0; p < c; p += 8) {
        TL_PREFETCH_AHEAD(a, p, 0, c, 8, ahead, nq * (int64_t)sizeof(TL_T));
        TL_T *o[8];
        for (int r = 0; r < 8; r++) o[r] = out[p + r] + oc;
        TL_MKI(columns)(8, 0, set, cw, nq, 0, a + p, NULL, b, ldb, o, NULL, 0, 0);
    }
}

static TL_ISA_ATTR void TL_MKI(rows_8)(int64_t cw, int64_t nq, int64_t c, const TL_T *const *a,
                                       const TL_T *b, int64_t ldb, TL_T *const *out,
                                       int64_t oc) {
    TL_MKI(rows_8_body)(0, cw, nq, c, a, b, ldb, out, oc);
}

static TL_ISA_ATTR void TL_MKI(rows_8_set)(int64_t cw, int64_t nq, int64_t c,
                                           const TL_T *const *a, const TL_T *b, int64_t ldb,
                                           TL_T *const *out, int64_t oc) {
    TL_MKI(rows_8_body)(1, cw, nq, c, a, b, ldb, out, oc);
}

/* out[r][0:cw) += sum_q xr[q][c0 + r] * b[q][0:cw), for 8, 4 or 1 rows, asking
 * for byte pf_byte of each row pf[q], q < npf, on the way. */
#define TL_DEFINE_ROWS_T(R)                                                               \
    static TL_ISA_ATTR void TL_MKI(rows_t_##R)(                                           \
        int64_t cw, int64_t nq, int64_t c0, const TL_T *const *xr, const TL_T *const *b,  \
        TL_T *const *out, const TL_T *const *pf, int64_t npf, int64_t pf_byte) {          \
        TL_MKI(columns)(R, 1, 0, cw, nq, c0, xr, b, NULL, 0, out, pf, npf, pf_byte);      \
    }
TL_DEFINE_ROWS_T(8)
#if TL_ISA_VBYTES == 32
/* AVX2's 16 registers: 6 rows x 2 vectors of accumulators, beside the pair's
 * dy vectors and a broadcast (see outer_acc). */
TL_DEFINE_ROWS_T(6)
#define TL_ISA_ROWS_T_6 TL_MKI(rows_t_6)
#else
#define TL_ISA_ROWS_T_6 NULL
#endif
TL_DEFINE_ROWS_T(4)
TL_DEFINE_ROWS_T(1)
#undef TL_DEFINE_ROWS_T

#if TL_ISA_VBYTES == 64
/* One pair of a 16-row pass (rows_t_16, rows_t_16_runs): acc[r] += aq[r] times
 * the dy vector at dy, r < 16. */
static inline __attribute__((always_inline)) TL_ISA_ATTR void TL_MKI(pair_16)(
    TL_MKI(vec) *acc, const TL_T *aq, const TL_T *dy) {
    TL_MKI(vec) bv;
    memcpy(&bv, dy, sizeof(bv));
    __asm__("" : "+r"(aq)); /* constant offsets for the broadcasts (TL_BLOCK_FN) */
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) acc[r] += aq[r] * bv;
}

/* out[r][0:TL_VL) += acc[r], r < 16: a 16-row pass's sums. */
static inline __attribute__((always_inline)) TL_ISA_ATTR void TL_MKI(add_16)(
    const TL_MKI(vec) *acc, TL_T *const *out) {
    for (int r = 0; r < 16; r++) {
        TL_MKI(vec) o;
        memcpy(&o, out[r], sizeof(o));
        o += acc[r];
        memcpy(out[r], &o, sizeof(o));
    }
}

/* out[r][0:TL_VL) += sum_q xr[q][c0 + r] * b[q][0:TL_VL) for 16 rows: the
 * weight gradient of a layer one vector wide (C_out = 16 in fp32, 8 in
 * fp64, with AVX-512) in one pass over the pairs instead of two of 8 rows, so each dy
 * row and x row pointer is loaded once for 16 multiply-adds.  Same sums in
 * the same order as rows_t_8.  Asking for the next kernel row's rows (see
 * outer_acc): 1.05-1.30x on the LiDAR scan's maps, 0.97-1.08x on the
 * surface's. */
static TL_ISA_ATTR void TL_MKI(rows_t_16)(int64_t nq, int64_t c0, const TL_T *const *xr,
                                          const TL_T *const *b, TL_T *const *out,
                                          const TL_T *const *pf, const TL_T *const *pd,
                                          int64_t npf, int64_t pf_byte) {
    TL_MKI(vec) acc[16];
    for (int r = 0; r < 16; r++) acc[r] = (TL_MKI(vec)){0};
    for (int64_t q = 0; q < nq; q++) {
        if (q < npf) {
            __builtin_prefetch((const char *)pf[q] + pf_byte);
            if (pd) __builtin_prefetch(pd[q]);
        }
        TL_MK_ASK_PAIR_AHEAD(xr, b, q, nq, c0, 0);
        TL_MKI(pair_16)(acc, xr[q] + c0, b[q]);
    }
    TL_MKI(add_16)(acc, out);
}
#define TL_ISA_ROWS_T_16 TL_MKI(rows_t_16)

/* rows_t_16 over runs of pairs named by index (tl_mk_run): the table's tile
 * lists read in place, where rows_t_16 reads row pointers that a pass over
 * the lists (tl_point_rows) wrote first.  The accumulators run on across the
 * runs, so the sums are rows_t_16's over the runs one after another, bit for
 * bit.  Run j's pair q asks for byte pf_byte of the x row of next[j]'s pair
 * q and, with dy set, its dy row (next NULL: none). */
static TL_ISA_ATTR void TL_MKI(rows_t_16_runs)(int64_t runs, const tl_mk_run *run, int64_t c0,
                                               const TL_T *x, int64_t ldx, TL_T *const *out,
                                               const tl_mk_run *next, int64_t pf_byte,
                                               int dy) {
    TL_MKI(vec) acc[16];
    for (int r = 0; r < 16; r++) acc[r] = (TL_MKI(vec)){0};
    const TL_T *xc = x + c0;
    for (int64_t j = 0; j < runs; j++) {
        const int32_t *in = run[j].in, *rows = run[j].rows;
        const TL_T *d = run[j].dy;
        const int64_t nq = run[j].count;
        const int64_t npf = !next ? 0 : next[j].count < nq ? next[j].count : nq;
        for (int64_t q = 0; q < nq; q++) {
            if (q < npf) {
                __builtin_prefetch((const char *)(x + next[j].in[q] * ldx) + pf_byte);
                if (dy) __builtin_prefetch((const TL_T *)next[j].dy + next[j].rows[q] * TL_VL);
            }
            if (q + TL_MK_PAIRS_AHEAD < nq) { /* as TL_MK_ASK_PAIR_AHEAD */
                __builtin_prefetch(xc + in[q + TL_MK_PAIRS_AHEAD] * ldx);
                __builtin_prefetch(d + rows[q + TL_MK_PAIRS_AHEAD] * TL_VL);
            }
            TL_MKI(pair_16)(acc, xc + in[q] * ldx, d + rows[q] * TL_VL);
        }
    }
    TL_MKI(add_16)(acc, out);
}
#define TL_ISA_ROWS_T_16_RUNS TL_MKI(rows_t_16_runs)

/* out[r][0:cw) += sum_q xr[q][c0 + r] * b[q][0:cw) for 12 rows of two
 * vectors, the second partial where cw is not 2 x TL_VL (TL_VL < cw <=
 * 2 x TL_VL: C_out = 17-32 in fp32): 24 accumulators, so each pair's two
 * dy vectors and x row pointer feed 24 multiply-adds where rows_t_8 feeds
 * 16 (C = 32 runs 8 + 12 + 12 rows, three passes over the pairs instead of
 * four: outer_acc).  Each pair asks for byte pf_byte of pf[q] (q < npf) and pf_byte2
 * of pf2[q] (q < npf2): two of outer_acc's lines, as two 8-row passes
 * would.  Every row's columns are read before any is written (see
 * TL_BLOCK_FN).  Same sums in the same order as rows_t_8. */
static TL_ISA_ATTR void TL_MKI(rows_t_12)(int64_t cw, int64_t nq, int64_t c0,
                                          const TL_T *const *xr, const TL_T *const *b,
                                          TL_T *const *out, const TL_T *const *pf,
                                          int64_t npf, int64_t pf_byte, const TL_T *const *pf2,
                                          int64_t npf2, int64_t pf_byte2) {
    const int64_t left = cw - TL_VL;
    TL_MKI(vec) acc[12][2];
#pragma GCC unroll 12
    for (int r = 0; r < 12; r++) acc[r][0] = acc[r][1] = (TL_MKI(vec)){0};
    for (int64_t q = 0; q < nq; q++) {
        if (q < npf) __builtin_prefetch((const char *)pf[q] + pf_byte);
        if (q < npf2) __builtin_prefetch((const char *)pf2[q] + pf_byte2);
        TL_MK_ASK_PAIR_AHEAD(xr, b, q, nq, c0, 0);
        TL_MKI(vec) b0;
        memcpy(&b0, b[q], sizeof(b0));
        const TL_MKI(vec) b1 = TL_MKI(load_part)(b[q] + TL_VL, left);
        const TL_T *aq = xr[q] + c0;
        __asm__("" : "+r"(aq)); /* constant offsets for the broadcasts (TL_BLOCK_FN) */
#pragma GCC unroll 12
        for (int r = 0; r < 12; r++) {
            const TL_T s = aq[r];
            acc[r][0] += s * b0;
            acc[r][1] += s * b1;
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < 12; r++) {
        TL_MKI(vec) o;
        memcpy(&o, out[r], sizeof(o));
        acc[r][0] = o + acc[r][0];
        acc[r][1] = TL_MKI(load_part)(out[r] + TL_VL, left) + acc[r][1];
    }
#pragma GCC unroll 12
    for (int r = 0; r < 12; r++) {
        memcpy(out[r], &acc[r][0], sizeof(acc[r][0]));
        TL_MKI(store_part)(out[r] + TL_VL, acc[r][1], left);
    }
}
#define TL_ISA_ROWS_T_12 TL_MKI(rows_t_12)
#else
#define TL_ISA_ROWS_T_16 NULL
#define TL_ISA_ROWS_T_16_RUNS NULL
#define TL_ISA_ROWS_T_12 NULL
#endif

/* Packs rows xq[0..nq) of `rows` values into xp, packed_ld(rows) apart and
 * zero-padded (the panel's layout), in whole vectors of this set's width;
 * rows up to xq[avail - 1] (avail >= nq) are asked for `ahead` rows before
 * their turn. */
static inline __attribute__((always_inline)) TL_ISA_ATTR void TL_MKI(pack)(
    int64_t nq, int64_t avail, int64_t rows, const TL_T *const *xq, TL_T *xp, int64_t ahead) {
    const int64_t ldx = TL_MK(packed_ld)(rows), row_bytes = rows * (int64_t)sizeof(TL_T);
    const int64_t vl = TL_ISA_VBYTES / (int64_t)sizeof(TL_T);
    for (int64_t q = 0; q < nq; q++) {
        if (q + ahead < avail)
            for (int64_t b = 0; b < row_bytes; b += 64)
                __builtin_prefetch((const char *)xq[q + ahead] + b);
        const TL_T *src = xq[q];
        TL_T *dst = xp + q * ldx;
        int64_t r = 0;
        for (; r + vl <= rows; r += vl) memcpy(dst + r, src + r, TL_ISA_VBYTES);
        for (; r < rows; r++) dst[r] = src[r];
        for (; r < ldx; r++) dst[r] = 0;
    }
}

/* The panel's column blocks: TL_COLUMN_BLOCKS of TL_ISA_NV_WG vectors, never
 * leaving a single vector behind; with AVX-512 (4 vectors) a block of 3 where
 * 3 or 5 are left (C_out = 48 ran 2 + 1, 80 ran 2 + 2 + 1, 8 rows of 1 vector
 * loading a dy vector or x value for every 0.9 multiply-adds). */
#if TL_ISA_NV_WG == 4
#define TL_PANEL_BLOCKS(CALL)                                                               \
    do {                                                                                    \
        int64_t vecs_ = cw / TL_VL;                                                         \
        for (; vecs_ >= 4 && vecs_ != 5; vecs_ -= 4, j += 4 * TL_VL) CALL(, 4);             \
        if (vecs_ == 3 || vecs_ == 5) {                                                     \
            CALL(, 3);                                                                      \
            vecs_ -= 3;                                                                     \
            j += 3 * TL_VL;                                                                 \
        }                                                                                   \
        TL_COLUMN_TAIL(CALL);                                                               \
    } while (0)
#else
#define TL_PANEL_BLOCKS(CALL) TL_COLUMN_BLOCKS(TL_ISA_NV_WG, 1, CALL)
#endif

/* Whether the panel below reads x rows in place (tl_mk_ops.panel_in_place). */
#define TL_ISA_PANEL_IN_PLACE (TL_ISA_VBYTES == 64)

/* One kernel row of the weight gradient (see tl_mk_ops), in chunks of pairs
 * (tl_mk_panel_pairs).  With AVX-512, where rows is a multiple of 4
 * (tl_mk_panel_reads_in_place), the strips read each pair's x values in
 * place through its row pointer; otherwise each chunk's x rows are
 * packed just before its strips run, so they are read from L1 (packing a
 * kernel row's pairs at once left the first chunks' rows in L2 by the time
 * they ran).  In place skips the copy, 8% of a C = 64 weight gradient's
 * samples: 1.00-1.10x at C = 40-256 on the maps of round thirty-three (AMD
 * EPYC; the LiDAR scan's k2 s2 at C = 64 0.95-1.01x), bitwise; with AVX2's
 * narrower strips it lost 0.83-1.0x at C >= 64, so AVX2 packs.  The strips
 * that ask for no x row of the next kernel row ask for the next chunk's dy
 * rows, a line per strip; and, in
 * the last column block, for the next chunk's x rows, a line per strip:
 * packing, the strips after those (the pack then finds them in L1: they
 * were asked for a kernel row before and back in L2 by then; 1.01-1.06x at
 * C >= 64 in round thirty-two); in place, the last pf_lines strips, which
 * every width has (a strip reads at most 8 values of a 16-value line), as
 * a second request, so the rows arrive just before the next chunk (at the
 * chunk's start they were evicted from L1 again before their turn:
 * 0.95-0.99x).  Then, for each block of columns, every strip of input
 * channels (TL_ISA_WG_ROWS(NV) wide, then 4; see tl_mk_panel_strips), so
 * the chunk's dy columns (up to 64 rows x TL_ISA_NV_WG vectors, 16 KiB) and
 * x rows stay in L1 while the x strips pass them; a whole block's pairs (up
 * to TL_WGRAD_PAIRS) were streamed from L2 for each strip (1.01-1.19x at
 * C >= 64).  Each chunk's sums are added to out in chunk order, a fixed
 * order whatever the instruction set or the thread count, and in place or
 * packed the same products are summed in the same order.  Column blocks:
 * TL_COLUMN_BLOCKS of TL_ISA_NV_WG vectors, never leaving a single vector
 * behind; then scalars.  The first column block's strip s asks for cache
 * line s of each row pf[q] (q < npf; rows of `rows` values, as the x rows
 * read here), one per pair, spread over the multiply-adds. */
static TL_ISA_ATTR void TL_MKI(panel)(int64_t cw, int64_t nq, int64_t rows,
                                      const TL_T *const *xq, TL_T *xp,
                                      const TL_T *const *dq, TL_T *out, int64_t ldo,
                                      const TL_T *const *pf, const TL_T *const *pd,
                                      int64_t npf) {
    const int64_t ldx = TL_MK(packed_ld)(rows);
    const int64_t pf_lines = (rows * (int64_t)sizeof(TL_T) + 63) / 64;
    const int64_t chunk = TL_MK(panel_pairs)(ldx);
    const int in_place = xq && TL_MK(panel_reads_in_place)(TL_ISA_PANEL_IN_PLACE, rows);
    for (int64_t q0 = 0; q0 < nq; q0 += chunk) {
        const int64_t cq = nq - q0 < chunk ? nq - q0 : chunk;
        const int64_t cpf = npf - q0 < 0 ? 0 : npf - q0 < cq ? npf - q0 : cq;
        /* The chunk's packed rows: xp's own (xq NULL), or packed here. */
        const TL_T *xc = xq ? xp : xp + q0 * ldx;
        if (xq && !in_place) TL_MKI(pack)(cq, nq - q0, rows, xq + q0, xp, TL_MK_PACK_AHEAD);
        /* In place: the strips' x rows (xc unused). */
        const TL_T *const *xr = in_place ? xq + q0 : NULL;
        const TL_T *const *dc = dq + q0, *const *pc = cpf > 0 ? pf + q0 : pf;
        /* The next chunk's dy rows, asked for by the strips that do not ask
         * for x rows: a line of the column block per strip; after the last
         * chunk, the next kernel row's first (on strided and transposed maps
         * a kernel row of a block has one or two chunks, and each dy row is
         * read by one or two kernel rows, so from memory: 1.02-1.15x on the
         * LiDAR scan's strided maps at C = 48-128, the surface's 0.98-1.04x).
         * The next chunk's x rows: n_ (packing) or m_ (in place) below. */
        const int last = q0 + cq >= nq;
        const TL_T *const *dn = last ? pd : dq + q0 + cq;
        const TL_T *const *xn = last || !xq ? NULL : xq + q0 + cq;
        const int64_t left = last ? (pd ? npf : 0) : nq - q0 - cq;
        const int64_t cdn = left < chunk ? left : chunk;
        int64_t j = 0;
/* Strip s of a block (of ns_ strips) asks for line pb_ of rows pq_[q < npq_]
 * and, in place, line pb2_ of the next chunk's x rows xn[q < npq2_]. */
#define TL_PANEL_PF(W, NV, s)                                                               \
    const int64_t xl_ = j == 0 ? pf_lines : 0;                                              \
    const int64_t dl_ = ((NV) * (int64_t)sizeof(TL_MKI(vec##W)) + 63) / 64;                 \
    const int lb_ = !last && j + (NV) * TL_VL >= cw; /* last column block */                \
    const int x_ = (s) < xl_, d_ = !x_ && (s) - xl_ < dl_;                                  \
    const int n_ = !x_ && !d_ && xq && !in_place && lb_ && (s) - xl_ - dl_ < pf_lines;     \
    const int m_ = in_place && lb_ && (s) >= ns_ - pf_lines;                                \
    const TL_T *const *pq_ = x_ ? pc : n_ ? xn : dn;                                        \
    const int64_t npq_ = x_ ? cpf : d_ || n_ ? cdn : 0;                                     \
    const int64_t pb_ = x_ ? (s) * 64                                                       \
                        : n_ ? ((s) - xl_ - dl_) * 64                                       \
                             : j * (int64_t)sizeof(TL_T) + ((s) - xl_) * 64;                \
    const int64_t npq2_ = m_ ? cdn : 0, pb2_ = ((s) - ns_ + pf_lines) * 64
#define TL_PANEL_CALL(W, NV)                                                                \
    do {                                                                                    \
        const int r_ = TL_ISA_WG_ROWS(NV);                                                  \
        const int64_t wide_ = TL_MK(panel_strips)(ldx, r_);                                 \
        const int64_t ns_ = wide_ + (ldx - wide_ * r_) / 4;                                 \
        int64_t c_ = 0, s = 0;                                                              \
        for (; s < wide_; s++, c_ += r_) {                                                  \
            TL_PANEL_PF(W, NV, s);                                                          \
            TL_MKI(pblock##W)(r_, NV, j, cq, xc + c_, ldx, xr, c_, dc, out + c_ * ldo, ldo, \
                              rows - c_, pq_, npq_, pb_, xn, npq2_, pb2_);                  \
        }                                                                                   \
        for (; c_ < ldx; s++, c_ += 4) {                                                    \
            TL_PANEL_PF(W, NV, s);                                                          \
            TL_MKI(pblock##W)(4, NV, j, cq, xc + c_, ldx, xr, c_, dc, out + c_ * ldo, ldo,  \
                              rows - c_, pq_, npq_, pb_, xn, npq2_, pb2_);                  \
        }                                                                                   \
    } while (0)
        TL_PANEL_BLOCKS(TL_PANEL_CALL);
#undef TL_PANEL_CALL
#undef TL_PANEL_PF
        for (int64_t r = 0; r < rows; r++)
            for (int64_t jj = j; jj < cw; jj++) {
                TL_T sum = 0;
                for (int64_t q = 0; q < cq; q++)
                    sum += (xr ? xr[q][r] : xc[q * ldx + r]) * dc[q][jj];
                out[r * ldo + jj] += sum;
            }
    }
}

static const TL_MK(ops) TL_MKI(ops) = {
    .block_cols = TL_ISA_NV * TL_VL,
    .rows8_cols = TL_ISA_NV8 * TL_VL,
    .rows8_max_cols = (TL_ISA_VBYTES == 32 ? 2 : TL_ISA_NV8_MAX) * TL_VL, /* rows_6_pass */
    .pad_cols = TL_ISA_VBYTES == 64 ? TL_VL : 1,
    .panel_in_place = TL_ISA_PANEL_IN_PLACE,
    .rows_8 = TL_MKI(rows_8),
    .rows_4 = TL_MKI(rows_4),
    .rows_2 = TL_MKI(rows_2),
    .rows_1 = TL_MKI(rows_1),
    .rows_8_set = TL_MKI(rows_8_set),
    .rows_8_at = TL_ISA_ROWS_8_AT,
    .rows_8_at_set = TL_ISA_ROWS_8_AT_SET,
    .rows_4_set = TL_MKI(rows_4_set),
    .rows_2_set = TL_MKI(rows_2_set),
    .rows_t_8 = TL_MKI(rows_t_8),
    .rows_t_4 = TL_MKI(rows_t_4),
    .rows_t_1 = TL_MKI(rows_t_1),
    .rows_t_16 = TL_ISA_ROWS_T_16,
    .rows_t_16_runs = TL_ISA_ROWS_T_16_RUNS,
    .rows_t_12 = TL_ISA_ROWS_T_12,
    .rows_t_6 = TL_ISA_ROWS_T_6,
    .panel = TL_MKI(panel),
};
#undef TL_ISA_ROWS_T_16
#undef TL_ISA_ROWS_8_AT
#undef TL_ISA_ROWS_8_AT_SET
#undef TL_ISA_ROWS_T_16_RUNS
#undef TL_ISA_ROWS_T_12
#undef TL_ISA_ROWS_T_6
#undef TL_ISA_PANEL_IN_PLACE

#undef TL_COLUMN_BLOCKS
#undef TL_COLUMN_TAIL
#undef TL_PANEL_BLOCKS
#undef TL_ISA_NV8
#undef TL_ISA_NV8_MAX
#undef TL_COLUMN_NARROW
#undef TL_COLUMN_NARROW_32
#undef TL_COLUMN_NARROW_16
#undef TL_VL
#undef TL_MKI
#undef TL_MKI_CAT
#undef TL_MKI_CAT3
