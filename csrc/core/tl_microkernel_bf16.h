/* The bfloat16 micro-kernels for CPUs with AVX512_BF16 (tl_simd level
 * TL_SIMD_V4_BF16): vdpbf16ps multiplies pairs of bfloat16 values and adds
 * both products to a float accumulator, twice the multiply-adds of a float
 * FMA per instruction.  The pairs run along the input channels, so the
 * weights are packed with each output column's two channel weights side by
 * side (tl_bf16_pack_panels) and each x row's channel pair is broadcast as
 * one 32-bit value.  Accumulation is float; the caller rounds once. */
#ifndef TL_MICROKERNEL_BF16_H
#define TL_MICROKERNEL_BF16_H

#include <stdint.h>

#include "tl_conv.h"
#include "tl_simd.h"

/* Elements of the packed weights: k x c_in rounded up to even x c_out. */
int64_t tl_bf16_panel_elems(const tl_conv_desc *d);

/* Packs w (k, c_in, c_out) into panels of `width` output columns: for kernel
 * row n and the block of wb columns starting at j (narrower at the end), the
 * block is at pw + n * cp * c_out + j * cp (cp = c_in rounded up to even) and
 * holds, for each channel pair p and column jj, w[n][2p][j + jj] then
 * w[n][2p + 1][j + jj] (0 past c_in). */
void tl_bf16_pack_panels(const tl_conv_desc *d, int64_t width, const uint16_t *w, uint16_t *pw);

#if TL_SIMD_X86
/* Two bfloat16 rows as one row of 32-bit pairs: out[2i] = a[i], out[2i + 1] =
 * b[i] (0 without b) for i < n, and 0 for n <= i < m (m >= n).  Masked loads
 * read nothing past n, so a may be any row when n is 0.  Only on CPUs of level
 * TL_SIMD_V4_BF16 or above. */
void tl_bf16_interleave(const uint16_t *a, const uint16_t *b, int64_t n, int64_t m,
                        uint16_t *out);

/* out[r][0:cw) += sum_c a[r][c] * w(c, 0:cw) for r < R (4 or 2), where
 * a[r] is a bfloat16 row of cin channels and w one packed panel of cw
 * columns (where `set`, = the sum plus zero: out is not read).  Only on CPUs
 * of level TL_SIMD_V4_BF16. */
void tl_bf16_rows(int set, int R, int64_t cw, int64_t cin, const uint16_t *const *a,
                  const uint16_t *panel, float *const *out);

/* The same for the c rows a[0..c) (a multiple of 8), 8 per pass, into
 * out[p] + oc (cw at most 32): a narrow tile's full groups of one kernel
 * row in one call.  Where oc = 0 each group asks for the next group's x
 * rows. */
void tl_bf16_rows_8(int set, int64_t cw, int64_t cin, int64_t c, const uint16_t *const *a,
                    const uint16_t *panel, float *const *out, int64_t oc);

/* The weight gradient over c pairs (x row xq[q], dy row dq[q]) runs the dot
 * products along the pairs: pairs 2t and 2t + 1 side by side.  Packs
 *   xp: strips of 4 input channels; strip s, pair pair t, channel 4s + r at
 *       xp[(s * tp + t) * 4 + r] as (x[2t][4s + r], x[2t + 1][4s + r]);
 *   dp: for pair pair t, dp[(t * cout + j) * 2 + u] = dq[2t + u][j];
 * tp = c / 2 rounded up (an odd c's last partner and channels past cin are 0);
 * tmp: scratch of 2 x (cin rounded up to 4) values. */
void tl_bf16_wgrad_pack(int64_t c, int64_t cin, int64_t cout, const uint16_t *const *xq,
                        const uint16_t *const *dq, uint32_t *xp, uint16_t *dp, uint16_t *tmp);

/* out[ci * ldo + j] += sum_q x[q][ci] * dy[q][j] over the packed pairs
 * (tl_bf16_wgrad_pack), ci < cin, j < cout, in float. */
void tl_bf16_wgrad_panel(int64_t cin, int64_t cout, int64_t tp, const uint32_t *xp,
                         const uint16_t *dp, float *out, int64_t ldo);
#endif

#endif
