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
 * differ: AVX-512 has 32 vector registers (16 accumulators of 64 bytes fit),
 * AVX2 and SSE2 have 16 (8 accumulators of 32 or 16 bytes).  The vector type
 * is GCC's generic vector extension at the target's register width (a wider
 * one would be split through memory) or narrower, for leftover columns. */
#if !defined(TL_T) || !defined(TL_ISA)
#error "define TL_T, TL_SFX, TL_ISA, TL_ISA_ATTR, TL_ISA_VBYTES and TL_ISA_NV first"
#endif

#define TL_MKI_CAT3(a, b, c) a##_##b##_##c
#define TL_MKI_CAT(a, b, c) TL_MKI_CAT3(a, b, c)
#define TL_MKI(name) TL_MKI_CAT(tl_mk_##name, TL_SFX, TL_ISA)

/* The register-blocked updates (tl_microkernel_block_impl.h): block at the
 * full register width, block_32 and block_16 at 32 and 16 bytes where those
 * are narrower, so that columns left over by the full-width blocks still run
 * as vectors (C = 24 is one 64-byte and one 32-byte vector of floats). */
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

#define TL_VL ((int64_t)(TL_ISA_VBYTES / sizeof(TL_T))) /* lanes per full vector */

/* All cw columns for R rows: full-width blocks of TL_ISA_NV vectors (with an
 * odd TL_ISA_NV, only while that leaves no single vector behind: 4 vectors
 * run as 2 + 2, not 3 + 1), then pairs, then 1; then one 32-byte and one
 * 16-byte vector where they fit; scalars for the last columns narrower than
 * 16 bytes.  (setup.py compiles with
 * -ffp-contract=fast, so the multiply-adds become FMA instructions where the
 * target has them; -std=c11 alone would turn contraction off.) */
static inline __attribute__((always_inline)) TL_ISA_ATTR void TL_MKI(columns)(
    int R, int transposed, int64_t cw, int64_t nq, int64_t c0, const TL_T *const *a,
    const TL_T *const *b, const TL_T *bp, int64_t ldb, TL_T *const *out) {
    int64_t j = 0, vecs = cw / TL_VL;
    for (; vecs >= TL_ISA_NV && (TL_ISA_NV % 2 == 0 || vecs - TL_ISA_NV != 1);
         vecs -= TL_ISA_NV, j += TL_ISA_NV * TL_VL)
        TL_MKI(block)(R, TL_ISA_NV, transposed, j, nq, c0, a, b, bp, ldb, out);
    for (; TL_ISA_NV > 2 && vecs >= 2; vecs -= 2, j += 2 * TL_VL)
        TL_MKI(block)(R, 2, transposed, j, nq, c0, a, b, bp, ldb, out);
    if (vecs >= 1) {
        TL_MKI(block)(R, 1, transposed, j, nq, c0, a, b, bp, ldb, out);
        j += TL_VL;
    }
#if TL_ISA_VBYTES > 32
    if (j + (int64_t)(32 / sizeof(TL_T)) <= cw) {
        TL_MKI(block_32)(R, 1, transposed, j, nq, c0, a, b, bp, ldb, out);
        j += (int64_t)(32 / sizeof(TL_T));
    }
#endif
#if TL_ISA_VBYTES > 16
    if (j + (int64_t)(16 / sizeof(TL_T)) <= cw) {
        TL_MKI(block_16)(R, 1, transposed, j, nq, c0, a, b, bp, ldb, out);
        j += (int64_t)(16 / sizeof(TL_T));
    }
#endif
    for (int r = 0; r < R; r++)
        for (int64_t jj = j; jj < cw; jj++) {
            TL_T s = 0;
            for (int64_t q = 0; q < nq; q++)
                s += transposed ? a[q][c0 + r] * b[q][jj] : a[r][q] * bp[q * ldb + jj];
            out[r][jj] += s;
        }
}

/* out[r][0:cw) += sum_q a[r][q] * b[q * ldb + 0:cw), for 4, 2 or 1 rows. */
#define TL_DEFINE_ROWS(R)                                                                 \
    static TL_ISA_ATTR void TL_MKI(rows_##R)(int64_t cw, int64_t nq, const TL_T *const *a, \
                                             const TL_T *b, int64_t ldb, TL_T *const *out) { \
        TL_MKI(columns)(R, 0, cw, nq, 0, a, NULL, b, ldb, out);                          \
    }
TL_DEFINE_ROWS(4)
TL_DEFINE_ROWS(2)
TL_DEFINE_ROWS(1)
#undef TL_DEFINE_ROWS

/* out[r][0:cw) += sum_q xr[q][c0 + r] * b[q][0:cw), for 4 or 1 rows. */
#define TL_DEFINE_ROWS_T(R)                                                               \
    static TL_ISA_ATTR void TL_MKI(rows_t_##R)(int64_t cw, int64_t nq, int64_t c0,        \
                                               const TL_T *const *xr, const TL_T *const *b, \
                                               TL_T *const *out) {                        \
        TL_MKI(columns)(R, 1, cw, nq, c0, xr, b, NULL, 0, out);                          \
    }
TL_DEFINE_ROWS_T(4)
TL_DEFINE_ROWS_T(1)
#undef TL_DEFINE_ROWS_T

/* All strips of one packed weight-gradient panel (see tl_mk_ops): for each
 * block of columns, every strip of 4 input channels, so the block's dy
 * columns (nq rows x up to TL_ISA_NV_WG vectors) stay in L1 while the x strips
 * stream past them.  Column blocks: TL_ISA_NV_WG vectors while that leaves
 * no single vector behind, then pairs, then one, then the narrower vectors
 * and scalars. */
static TL_ISA_ATTR void TL_MKI(panel)(int64_t cw, int64_t nq, int64_t rows, const TL_T *xp,
                                      const TL_T *const *dq, TL_T *out, int64_t ldo) {
    const int64_t strips = (rows + 3) / 4;
#define TL_PANEL_STRIPS(FN, NV)                                                           \
    for (int64_t s = 0; s < strips; s++)                                                  \
        FN(NV, j, nq, xp + s * 4 * nq, dq, out + s * 4 * ldo, ldo, rows - s * 4)
    int64_t j = 0, vecs = cw / TL_VL;
    for (; vecs >= TL_ISA_NV_WG && vecs - TL_ISA_NV_WG != 1; vecs -= TL_ISA_NV_WG) {
        TL_PANEL_STRIPS(TL_MKI(pblock), TL_ISA_NV_WG);
        j += TL_ISA_NV_WG * TL_VL;
    }
    for (; vecs >= 2; vecs -= 2) {
        TL_PANEL_STRIPS(TL_MKI(pblock), 2);
        j += 2 * TL_VL;
    }
    if (vecs == 1) {
        TL_PANEL_STRIPS(TL_MKI(pblock), 1);
        j += TL_VL;
    }
#if TL_ISA_VBYTES > 32
    if (j + (int64_t)(32 / sizeof(TL_T)) <= cw) {
        TL_PANEL_STRIPS(TL_MKI(pblock_32), 1);
        j += (int64_t)(32 / sizeof(TL_T));
    }
#endif
#if TL_ISA_VBYTES > 16
    if (j + (int64_t)(16 / sizeof(TL_T)) <= cw) {
        TL_PANEL_STRIPS(TL_MKI(pblock_16), 1);
        j += (int64_t)(16 / sizeof(TL_T));
    }
#endif
#undef TL_PANEL_STRIPS
    for (int64_t r = 0; r < rows; r++)
        for (int64_t jj = j; jj < cw; jj++) {
            const TL_T *xs = xp + r / 4 * 4 * nq + r % 4;
            TL_T s = 0;
            for (int64_t q = 0; q < nq; q++) s += xs[4 * q] * dq[q][jj];
            out[r * ldo + jj] += s;
        }
}

static const TL_MK(ops) TL_MKI(ops) = {
    TL_ISA_NV * TL_VL,
    TL_MKI(rows_4),   TL_MKI(rows_2),   TL_MKI(rows_1),
    TL_MKI(rows_t_4), TL_MKI(rows_t_1), TL_MKI(panel),
};

#undef TL_VL
#undef TL_MKI
#undef TL_MKI_CAT
#undef TL_MKI_CAT3
