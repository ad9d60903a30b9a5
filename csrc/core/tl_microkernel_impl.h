/* The register-blocked micro-kernels shared by every CPU dataflow, for one
 * element type: include with TL_T (element type) and TL_SFX (name suffix)
 * defined; names are tl_mk_<name>_<sfx>.  The kernels themselves are in
 * tl_microkernel_isa_impl.h, compiled once per instruction set; callers take
 * the table for this CPU from tl_mk_pick_<sfx>() once per call and run the
 * kernels through it. */
#ifndef TL_T
#error "define TL_T and TL_SFX before including this file"
#endif

#if TL_SIMD_X86
#include <immintrin.h> /* AVX-512's masked loads and stores (TL_BLOCK_PART) */
#endif

#define TL_MK_CAT2(a, b) a##_##b
#define TL_MK_CAT(a, b) TL_MK_CAT2(a, b)
#define TL_MK(name) TL_MK_CAT(tl_mk_##name, TL_SFX)

#ifndef TL_MK_RUN_DEFINED
#define TL_MK_RUN_DEFINED
/* count weight-gradient pairs named by index (tl_mk_ops.rows_t_16_runs):
 * pair q's x row is in[q] and its dy row dy + rows[q] rows of one vector. */
typedef struct tl_mk_run {
    const int32_t *in, *rows;
    const void *dy;
    int64_t count;
} tl_mk_run;
#endif

/* The micro-kernels of one instruction set: R = 8, 4, 2 or 1 rows of
 *   out[r][0:cw) += sum_q a[r][q] * b[q * ldb + 0:cw)  (rows_R)
 *   out[r][0:cw) += sum_q xr[q][c0 + r] * b[q][0:cw)   (rows_t_R)
 * Forward: q = input channel, a[r] = x row, b + q * ldb = weight row.
 * Weight gradient: q = pair, xr[q] = x row, b[q] = dy row. */
typedef struct TL_MK(ops) {
    /* Columns of the widest register block (TL_ISA_NV vectors): the forward
     * packs its weights into panels this wide (see tl_forward_tile). */
    int64_t block_cols;
    /* Widest block (columns) that rows_8 runs in one pass: a layer at most
     * this wide runs 8 output rows per pass, so 8 x (block) accumulators hide
     * the FMA latency that 4 rows of one or two vectors cannot. */
    int64_t rows8_cols;
    /* Widest panel rows_8 runs (3 vectors with AVX-512 as one block; 2 with
     * AVX2, 6 rows a block: rows_6_pass; else rows8_cols): the forward's
     * panels at most this wide run 8 rows a pass (tl_fwd_rows). */
    int64_t rows8_max_cols;
    /* Columns the forward's packed weight panels are padded to (whole
     * vectors with AVX-512, else 1: none), so the kernels compute a panel's
     * last vector whole (see TL_MKI(padded), tl_panel_ld). */
    int64_t pad_cols;
    /* 1 where the weight gradient's panel reads x rows of a multiple of 4
     * values in place (AVX-512), 0 where it packs them (see panel). */
    int panel_in_place;
    /* rows_8: c rows (a multiple of 8), 8 per pass, out[p] + oc (see
     * tl_microkernel_isa_impl.h). */
    void (*rows_8)(int64_t cw, int64_t nq, int64_t c, const TL_T *const *a, const TL_T *b,
                   int64_t ldb, TL_T *const *out, int64_t oc);
    void (*rows_4)(int64_t cw, int64_t nq, const TL_T *const *a, const TL_T *b, int64_t ldb,
                   TL_T *const *out);
    void (*rows_2)(int64_t cw, int64_t nq, const TL_T *const *a, const TL_T *b, int64_t ldb,
                   TL_T *const *out);
    void (*rows_1)(int64_t cw, int64_t nq, const TL_T *const *a, const TL_T *b, int64_t ldb,
                   TL_T *const *out);
    /* rows_8, rows_4 and rows_2 that replace out[r][0:cw) by the sums (plus
     * zero, so bit for bit what adding to zeroed rows gives) instead of
     * adding to it: the forward's rows listed for the first time (see
     * tl_forward_tile), which are then neither zeroed first nor read. */
    void (*rows_8_set)(int64_t cw, int64_t nq, int64_t c, const TL_T *const *a, const TL_T *b,
                       int64_t ldb, TL_T *const *out, int64_t oc);
    void (*rows_4_set)(int64_t cw, int64_t nq, const TL_T *const *a, const TL_T *b,
                       int64_t ldb, TL_T *const *out);
    void (*rows_2_set)(int64_t cw, int64_t nq, const TL_T *const *a, const TL_T *b,
                       int64_t ldb, TL_T *const *out);
    /* rows_8 and rows_8_set one vector wide and deep (cw = nq = 64 bytes of
     * values) over c rows (a multiple of 8) named by index: x row
     * x + idx[p] * ldx, output row y + rows[p] * ldy; NULL but with AVX-512. */
    void (*rows_8_at)(int64_t c, const int32_t *idx, const int32_t *rows, const TL_T *x,
                      int64_t ldx, const TL_T *b, int64_t ldb, TL_T *y, int64_t ldy);
    void (*rows_8_at_set)(int64_t c, const int32_t *idx, const int32_t *rows, const TL_T *x,
                          int64_t ldx, const TL_T *b, int64_t ldb, TL_T *y, int64_t ldy);
    /* rows_t_R also ask for byte pf_byte of each row pf[q], q < npf (see
     * outer_acc); rows_t_8 only for cw <= rows8_cols. */
    void (*rows_t_8)(int64_t cw, int64_t nq, int64_t c0, const TL_T *const *xr,
                     const TL_T *const *b, TL_T *const *out, const TL_T *const *pf,
                     int64_t npf, int64_t pf_byte);
    void (*rows_t_4)(int64_t cw, int64_t nq, int64_t c0, const TL_T *const *xr,
                     const TL_T *const *b, TL_T *const *out, const TL_T *const *pf,
                     int64_t npf, int64_t pf_byte);
    void (*rows_t_1)(int64_t cw, int64_t nq, int64_t c0, const TL_T *const *xr,
                     const TL_T *const *b, TL_T *const *out, const TL_T *const *pf,
                     int64_t npf, int64_t pf_byte);
    /* rows_t_R for 16 rows one vector wide (cw = 64 bytes), asking for byte
     * pf_byte of each row pf[q] and the first of pd[q] (pd may be NULL),
     * q < npf; NULL but with AVX-512. */
    void (*rows_t_16)(int64_t nq, int64_t c0, const TL_T *const *xr, const TL_T *const *b,
                      TL_T *const *out, const TL_T *const *pf, const TL_T *const *pd,
                      int64_t npf, int64_t pf_byte);
    /* rows_t_16 over `runs` runs of pairs named by index, x rows ldx values
     * apart, one after another; run j's pair q asks for byte pf_byte of the
     * x row of next[j]'s pair q and, dy set, its dy row (next NULL: none);
     * NULL but with AVX-512. */
    void (*rows_t_16_runs)(int64_t runs, const tl_mk_run *run, int64_t c0, const TL_T *x,
                           int64_t ldx, TL_T *const *out, const tl_mk_run *next,
                           int64_t pf_byte, int dy);
    /* rows_t_R for 12 rows more than one vector and at most two wide, asking
     * for two lines a pair (byte pf_byte of pf[q], q < npf, and pf_byte2 of
     * pf2[q], q < npf2); NULL but with AVX-512. */
    void (*rows_t_12)(int64_t cw, int64_t nq, int64_t c0, const TL_T *const *xr,
                      const TL_T *const *b, TL_T *const *out, const TL_T *const *pf,
                      int64_t npf, int64_t pf_byte, const TL_T *const *pf2, int64_t npf2,
                      int64_t pf_byte2);
    /* rows_t_R for 6 rows, in blocks of at most two vectors; NULL but with
     * AVX2 (see outer_acc). */
    void (*rows_t_6)(int64_t cw, int64_t nq, int64_t c0, const TL_T *const *xr,
                     const TL_T *const *b, TL_T *const *out, const TL_T *const *pf,
                     int64_t npf, int64_t pf_byte);
    /* Weight gradient over the x rows of nq pairs:
     *   out[c * ldo + j] += sum_q x_q[c] * dq[q][j],  c < rows, j < cw,
     * x_q = xq[q] (rows values), read in place (AVX-512, rows a multiple of
     * 4) or packed a chunk of pairs at a time into the scratch xp
     * (packed_ld(rows) values per pair, zero-padded past rows, at least
     * panel_pairs rows); or, xq NULL, x_q = xp + q * packed_ld(rows)
     * already packed for all nq pairs.  dq[q]: the pair's dy row (from the
     * block's first column).  While it runs it asks for each row pf[q],
     * q < npf, of `rows` values (the next kernel row's x rows), and, during
     * its last chunk, for the first chunk's dy rows pd[q] (pd NULL: none;
     * the next kernel row's, npf of them). */
    void (*panel)(int64_t cw, int64_t nq, int64_t rows, const TL_T *const *xq, TL_T *xp,
                  const TL_T *const *dq, TL_T *out, int64_t ldo, const TL_T *const *pf,
                  const TL_T *const *pd, int64_t npf);
} TL_MK(ops);

#ifndef TL_WGRAD_PACK_MIN_CIN
/* Input channels from which the weight gradient runs each kernel row's x
 * rows through the panel micro-kernel instead of the passes over rows in
 * place (tl_mk_outer_acc): from C_in = 64, and from TL_WGRAD_PACK_WIDE_MIN_CIN
 * where C_out is wider than outer_acc's 8-channel passes take (rows8_cols).
 * Since the x rows are copied whole (round nine), packing runs 1.0-1.26x the
 * passes at C = 40-56 (most on strided maps, whose x rows come from
 * memory), but 0.89-0.94x at C = 32 on 3x3x3 maps, where the 8-channel
 * passes run in place.  Where the panel reads x rows in place
 * (panel_in_place: AVX-512, C_in a multiple of 4), it also takes C_out of
 * [TL_WGRAD_IN_PLACE_MIN_COUT, TL_WGRAD_IN_PLACE_MAX_COUT] from C_in =
 * TL_WGRAD_IN_PLACE_MIN_CIN, and C_out strictly between those from C_in =
 * TL_WGRAD_IN_PLACE_NARROW_MIN_CIN (the passes run C_out = 36-44 with a
 * partial vector).  On the AMD EPYC of round thirty-three, C_in x C_out:
 * 32 x 32 1.01-1.19x, 48 x 32 1.07-1.23x, 32 x 40 1.22-1.30x, 36 x 36
 * 1.18-1.35x, 32 x 48 1.00-1.18x, 16 x 36 1.11-1.33x, 20 x 40 1.07-1.24x;
 * the passes stay better below C_out = 32 (32 x 16 0.84-0.97x for the
 * panel), at C_out = 32 from fewer input channels (16 x 32 and 24 x 32:
 * 0.89-0.99x), and from C_out = 52 (32 x 56 0.91-0.97x, 36 x 60
 * 0.78-0.81x: the panel's narrower blocks after its whole vectors, where
 * the passes read the last vector masked) to 64 (32 x 64 0.92-0.96x). */
#define TL_WGRAD_PACK_MIN_CIN 64
#define TL_WGRAD_PACK_WIDE_MIN_CIN 40
#define TL_WGRAD_IN_PLACE_MIN_CIN 32
#define TL_WGRAD_IN_PLACE_NARROW_MIN_CIN 16
#define TL_WGRAD_IN_PLACE_MIN_COUT 32
#define TL_WGRAD_IN_PLACE_MAX_COUT 48
#endif

/* Values per packed x row of the weight gradient (tl_mk_ops.panel): `rows`
 * input channels zero-padded to a multiple of 4, so register-blocked strips
 * of 4, 6 or 8 of them cover it (tl_mk_panel_strips). */
static inline int64_t TL_MK(packed_ld)(int64_t rows) { return (rows + 3) / 4 * 4; }

/* Whether the panel reads x rows of `rows` values in place: on an
 * instruction set whose panel does (tl_mk_ops.panel_in_place), where the
 * rows need no padding, so the strips end on each row's end. */
static inline int TL_MK(panel_reads_in_place)(int in_place_set, int64_t rows) {
    return in_place_set && TL_MK(packed_ld)(rows) == rows;
}

/* Whether a weight gradient of cin x cout runs the panel (which packs its
 * x rows or reads them in place) rather than outer_acc's passes:
 * TL_WGRAD_PACK_MIN_CIN. */
static inline int TL_MK(wgrad_packs)(const TL_MK(ops) *mk, int64_t cin, int64_t cout) {
    return cin >= TL_WGRAD_PACK_MIN_CIN ||
           (cin >= TL_WGRAD_PACK_WIDE_MIN_CIN && cout > mk->rows8_cols) ||
           (TL_MK(panel_reads_in_place)(mk->panel_in_place, cin) &&
            cout >= TL_WGRAD_IN_PLACE_MIN_COUT &&
            cout <= TL_WGRAD_IN_PLACE_MAX_COUT &&
            (cin >= TL_WGRAD_IN_PLACE_MIN_CIN ||
             (cin >= TL_WGRAD_IN_PLACE_NARROW_MIN_CIN && cout > TL_WGRAD_IN_PLACE_MIN_COUT &&
              cout < TL_WGRAD_IN_PLACE_MAX_COUT)));
}

/* Pairs ahead that the panel asks for an x row while packing a chunk: the
 * rows are gathered from anywhere in x (1.0-1.3x; most on strided maps). */
#define TL_MK_PACK_AHEAD 8

/* Pairs ahead that the weight gradient's passes over rows in place (rows_t_R)
 * ask for a pair's x row (the pass's line of it) and dy row (the block's
 * first line), besides the next kernel row's rows they ask for (outer_acc):
 * the rows of the kernel row's later pairs had been left to the hardware,
 * which does not follow a gather.  1.04-1.17x at C = 16 and 1.00-1.14x at
 * C = 24-32 on the submanifold, k2 s2 and k3 s2 p1 maps of both scenes on
 * the AMD EPYC (Zen 4) of round twenty-eight, bitwise; 6, 12 and 24 pairs ahead
 * measured the same within the VM's spread. */
#define TL_MK_PAIRS_AHEAD 16

/* Asks for pair q + TL_MK_PAIRS_AHEAD's x row (from value c0) and dy row
 * (from value j), where the pass has that pair: xr and b its row pointers. */
#define TL_MK_ASK_PAIR_AHEAD(xr, b, q, nq, c0, j)                  \
    do {                                                           \
        if ((q) + TL_MK_PAIRS_AHEAD < (nq)) {                      \
            __builtin_prefetch((xr)[(q) + TL_MK_PAIRS_AHEAD] + (c0)); \
            __builtin_prefetch((b)[(q) + TL_MK_PAIRS_AHEAD] + (j));   \
        }                                                          \
    } while (0)

/* Strips of r input channels (r = 4, 6 or 8) that the weight gradient's
 * panel runs over a packed row of ldx values (a multiple of 4) before strips
 * of 4 take the rest: as many as leave a multiple of 4 behind. */
static inline int64_t TL_MK(panel_strips)(int64_t ldx, int64_t r) {
    int64_t n = ldx / r;
    while ((ldx - n * r) % 4) n--;
    return n;
}

/* Pairs per chunk of the weight gradient's panel (tl_mk_ops.panel): the
 * chunk's x rows (ldx values each) and its dy rows of one column block (at
 * most 256 bytes each) within 96 KiB, a multiple of 16 from 16 to 64: 64
 * up to C_in = 320.  The same on every instruction set, so the chunks' sums
 * are too.  Of fixed chunks, 64 pairs ran best at C_in <= 128 (32 lost
 * 0.97-0.99x at C = 64, 128 0.96-1.02x).  At C_in = 160-256 the packed
 * panel ran best at 32-48 pairs (a 48 KiB budget; 64 lost 0.93-0.96x, its
 * packed rows outgrowing L1); read in place (AVX-512, round thirty-three)
 * 64 runs 1.01-1.04x over them, and AVX2, which still packs, 0.95-1.02x. */
static inline int64_t TL_MK(panel_pairs)(int64_t ldx) {
    const int64_t c = 96 * 1024 / (ldx * (int64_t)sizeof(TL_T) + 256) / 16 * 16;
    return c < 16 ? 16 : c > 64 ? 64 : c;
}

/* One set per instruction set (see tl_simd.h): AVX-512, AVX2 + FMA, and the
 * baseline of the target. */
#if TL_SIMD_X86
#define TL_ISA v4
#define TL_ISA_ATTR TL_TARGET_V4
#define TL_ISA_VBYTES 64
#define TL_ISA_NV 4
#define TL_ISA_NV_WG 4
/* Rows of the panel's strips for a block of NV vectors: 6 x 4, 8 x 3 and
 * 8 x 2 accumulators of AVX-512's 32 registers, where 4 x 4 and 4 x 2 loaded
 * one value of x and one of dy for every 2 or 1.3 multiply-adds (in L1, 1
 * thread: 4 x 4 150-163 GFLOP/s, 6 x 4 166-178, 4 x 2 144-153, 8 x 2
 * 162-168). */
#define TL_ISA_WG_ROWS(NV) ((NV) >= 4 ? 6 : 8)
#include "tl_microkernel_isa_impl.h"
#undef TL_ISA_WG_ROWS
#undef TL_ISA_NV_WG
#undef TL_ISA
#undef TL_ISA_ATTR
#undef TL_ISA_VBYTES
#undef TL_ISA_NV

#define TL_ISA v3
#define TL_ISA_ATTR TL_TARGET_V3
#define TL_ISA_VBYTES 32
#define TL_ISA_NV 3
#define TL_ISA_NV_WG 3
/* 4 x 3 or 6 x 2 accumulators of the 16 registers: in blocks of 2 vectors (C = 16,
 * the last of C = 40 or 64) strips of 6 input channels instead of 4 feed each dy
 * vector to 6 multiply-adds instead of 4 and keep 12 sums in flight, not 8 (on
 * the AVX2-only Zen 1 of round thirty-five, weight gradient 0.98-1.04x, median
 * 1.01x, at C = 16-128; the same sums). */
#define TL_ISA_WG_ROWS(NV) ((NV) >= 3 ? 4 : 6)
#include "tl_microkernel_isa_impl.h"
#undef TL_ISA_WG_ROWS
#undef TL_ISA_NV_WG
#undef TL_ISA
#undef TL_ISA_ATTR
#undef TL_ISA_VBYTES
#undef TL_ISA_NV
#endif

#define TL_ISA base
#define TL_ISA_ATTR
#define TL_ISA_VBYTES 16
#define TL_ISA_NV 2
#define TL_ISA_NV_WG 3
#define TL_ISA_WG_ROWS(NV) ((NV) >= 3 ? 4 : 6) /* as AVX2's, 16-byte vectors */
#include "tl_microkernel_isa_impl.h"
#undef TL_ISA_WG_ROWS
#undef TL_ISA_NV_WG
#undef TL_ISA
#undef TL_ISA_ATTR
#undef TL_ISA_VBYTES
#undef TL_ISA_NV

/* The widest set this CPU runs, at most ctx->simd_cap.  Asked once per call
 * of an entry point (libgcc caches the CPU's answer), so there is no state of
 * ours to initialize. */
__attribute__((unused)) static const TL_MK(ops) *TL_MK(pick)(const tl_ctx *ctx) {
    switch (tl_simd_vector_capped(ctx->simd_cap)) {
#if TL_SIMD_X86
    case TL_SIMD_V4_BF16:
    case TL_SIMD_V4:
        return &TL_MK_CAT(TL_MK(ops), v4);
    case TL_SIMD_V3:
        return &TL_MK_CAT(TL_MK(ops), v3);
#endif
    default:
        return &TL_MK_CAT(TL_MK(ops), base);
    }
}

/* out[0..m) += a[0..m) @ b (rows ldb apart) over cw columns for any number m
 * of distinct output rows: groups of 4, then 2, then 1. */
__attribute__((unused)) static void TL_MK(rows)(const TL_MK(ops) *mk, int64_t cw, int64_t nq,
                                               int64_t m, const TL_T *const *a, const TL_T *b,
                                               int64_t ldb, TL_T *const *out) {
    int64_t p = 0;
    for (; p + 4 <= m; p += 4) mk->rows_4(cw, nq, a + p, b, ldb, out + p);
    if (p + 2 <= m) {
        mk->rows_2(cw, nq, a + p, b, ldb, out + p);
        p += 2;
    }
    if (p < m) mk->rows_1(cw, nq, a + p, b, ldb, out + p);
}

/* Output columns from which outer_acc's passes ask for the next kernel row's
 * rows (below them a pass has too few multiply-adds per pair to hide the
 * extra instructions). */
#define TL_OUTER_PF_MIN_COLS 24

/* acc (cin x cout) += sum over c row pairs of xr[p]^T dq[p], register-blocked
 * passes over input channels (rows of acc; sixteen or twelve at a time with
 * AVX-512, below): four at a time, or, where cout is at most rows8_cols (two
 * fp32 vectors with AVX-512), eight after the first pass: 4 x 2 accumulators
 * let each dy vector feed 4 FMAs, 8 x 2 feed 8 (1.1-1.35x at C = 24 and 32
 * on the surface).  The first pass is four where cin is not a multiple of 8:
 * it is the one that waits on x rows from memory, and with half the work per
 * pair more pairs' loads are in flight (eight there lost 0.89-0.94x on the
 * LiDAR scan's strided maps, on an AMD core, before the forward's prefetch
 * changes of round fifteen).  Where cin is a multiple of 8, eight from the
 * start leaves no 4-row pass at the end (C = 32: 8 + 8 + 8 + 8 instead of
 * 4 + 8 + 8 + 8 + 4): 1.01-1.23x at C = 8-32 on every map on the Intel Xeon
 * of round fifteen.  Each element still adds its pairs in pair order, so the
 * passes' widths do not change the sums.  Pass s asks for cache line s of
 * each row pf[q], q < npf (the x rows the caller reads next; npf = 0 for
 * none), and the passes after those for the lines of each dy row pd[q] (the
 * next kernel row's, pd NULL for none), so that rows from memory arrive while
 * this one computes; not below TL_OUTER_PF_MIN_COLS output columns (x rows
 * alone: 0.93x at C = 16, 1.05-1.11x at 32; the dy rows too, against x rows
 * from 32 only: 1.22-1.34x at C = 32 and 1.14-1.54x at 24-28 on the LiDAR
 * scan's strided maps, 0.93-1.03x on the surface's, whose rows are more often
 * in cache; 0.92-1.11x at 16-20).  A 12-row pass asks for two lines. */
__attribute__((unused)) static void TL_MK(outer_acc)(const TL_MK(ops) *mk, int64_t cin,
                                                    int64_t cout, int64_t c,
                                                    const TL_T *const *xr,
                                                    const TL_T *const *dq, TL_T *acc,
                                                    const TL_T *const *pf,
                                                    const TL_T *const *pd, int64_t npf) {
    const int asks = cout >= TL_OUTER_PF_MIN_COLS;
    const int64_t xlines = (cin * (int64_t)sizeof(TL_T) + 63) / 64, lines = asks ? xlines : 0;
    const int64_t dlines = asks && pd ? (cout * (int64_t)sizeof(TL_T) + 63) / 64 : 0;
#define TL_PASS_PF(s) ((s) < lines ? pf : pd), ((s) < lines + dlines ? npf : 0), \
                      (((s) < lines ? (s) : (s) - lines) * 64)
    const int eight = cout <= mk->rows8_cols;
    int64_t ci = 0, s = 0;
    if (mk->rows_t_16 && cout * (int64_t)sizeof(TL_T) == 64) /* pass s: x line s, dy first */
        for (; ci + 16 <= cin; ci += 16, s++) {
            TL_T *o[16];
            for (int64_t r = 0; r < 16; r++) o[r] = acc + (ci + r) * cout;
            mk->rows_t_16(c, ci, xr, dq, o, pf, s == 0 ? pd : NULL, s < xlines ? npf : 0,
                          s * 64);
        }
    /* Where cout is more than one vector and at most two (C_out = 17-32 in
     * fp32), 12-row passes (24 accumulators: each pair's dy vectors and x row
     * pointer feed 24 multiply-adds instead of 16), as many as leave the rest
     * (but cin % 4) to 8-row passes, one of them first: cin / 4 = 3 x twelves
     * + 2 x eights, so C = 32 runs 8 + 12 + 12 (fewer passes over the pairs:
     * against 8-row passes only, 1.04-1.24x at C = 20-28 and 1.01-1.08x at
     * C = 32 on the four maps of both scenes of the AMD EPYC of round
     * twenty-four; the 8-row pass last instead ran 0.96-0.99x at C = 32). */
    int64_t twelves = mk->rows_t_12 && eight && cout > mk->rows8_cols / 2 ? cin / 12 : 0;
    if (twelves > 0 && (cin / 4 - 3 * twelves) % 2) twelves--;
    int eight_first = twelves > 0 && cin / 4 - 3 * twelves >= 2;
    /* AVX2 where cout is 2 or 4 whole vectors (rows8_cols: one there), and
     * maybe a narrower rest: 6-row passes (6 x 2 accumulators of its 16
     * registers instead of 4 x 2), an even number of them so that the rest is
     * whole 4-row passes; C = 16 runs 6 + 6 + 4, C = 32 6 x 4 + 4 + 4, each
     * pass over two column blocks (1.04-1.07x at C = 16, 1.07-1.11x at 32 on
     * the AMD EPYC of round twenty-four; at 3 vectors, C = 24, where the
     * 4-row passes run one block of 4 x 3, 0.82-0.88x).  (rows_t_12 and
     * rows_t_6 never both exist.) */
    const int64_t vecs = mk->rows_t_6 ? cout / mk->rows8_cols : 0;
    int64_t sixes = vecs == 2 || vecs == 4 ? cin / 6 / 2 * 2 : 0;
    while (ci + 4 <= cin) {
        const int64_t rows = eight_first ? 8
                             : twelves > 0 ? 12
                             : sixes > 0   ? 6
                             : eight && (s > 0 || cin % 8 == 0) && ci + 8 <= cin ? 8
                                                                                  : 4;
        TL_T *o[12];
        for (int64_t r = 0; r < rows; r++) o[r] = acc + (ci + r) * cout;
        if (rows == 12) /* asks for two lines */
            mk->rows_t_12(cout, c, ci, xr, dq, o, TL_PASS_PF(s), TL_PASS_PF(s + 1));
        else
            (rows == 6   ? mk->rows_t_6
             : rows == 8 ? mk->rows_t_8
                         : mk->rows_t_4)(cout, c, ci, xr, dq, o, TL_PASS_PF(s));
        s += rows == 12 ? 2 : 1;
        twelves -= rows == 12;
        sixes -= rows == 6;
        eight_first = 0;
        ci += rows;
    }
    for (; ci < cin; ci++, s++) {
        TL_T *o[1] = {acc + ci * cout};
        mk->rows_t_1(cout, c, ci, xr, dq, o, TL_PASS_PF(s));
    }
#undef TL_PASS_PF
}

/* dw[e] = sum over p of partial[p * all + e], p in order 0..parts-1: the
 * weight gradients' partial sums are added in a fixed order, so the result
 * does not depend on the thread count.  Blocks of TL_SUM_BLOCK elements, each
 * part's run added to the whole block: contiguous, so it vectorizes (one
 * element at a time walked the parts `all` apart, one dependent add after
 * another: 10% of a C = 64 weight gradient with 32 parts). */
#define TL_SUM_BLOCK 512
__attribute__((unused)) static void TL_MK(sum_parts)(int threads, const TL_T *partial,
                                                    int64_t parts, int64_t all, TL_T *dw) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t e0 = 0; e0 < all; e0 += TL_SUM_BLOCK) {
        const int64_t n = all - e0 < TL_SUM_BLOCK ? all - e0 : TL_SUM_BLOCK;
        TL_T *d = dw + e0;
        for (int64_t e = 0; e < n; e++) d[e] = 0;
        for (int64_t p = 0; p < parts; p++) {
            const TL_T *src = partial + p * all + e0;
            for (int64_t e = 0; e < n; e++) d[e] += src[e];
        }
    }
}
#undef TL_SUM_BLOCK

#undef TL_MK
#undef TL_MK_CAT
#undef TL_MK_CAT2
