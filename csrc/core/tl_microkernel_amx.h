/* The bfloat16 micro-kernels (forward and weight gradient) for CPUs with AMX
 * (tl_simd level TL_SIMD_V4_AMX: AMX-TILE and AMX-BF16, and the operating
 * system's leave to use the tile registers), and float16 through the same
 * tiles (below, tl_amx_pack_f16).  One tdpbf16ps multiplies a 16 x 32 bfloat16 tile by a
 * 32 x 16 one into 16 x 16 float sums: 8,192 multiply-adds, where a float
 * FMA does 16, so on such CPUs (Intel Xeon from Sapphire Rapids on) it runs
 * several times the float rate, which vdpbf16ps does not (it issues on one
 * port there, half the float FMA rate).
 *
 * Forward: each group of 16 listed x rows is copied into a dense tile
 * (channels padded to 32 with zeros), multiplied by the kernel row's packed
 * weights, and the 16 x 16 float blocks are added to the listed rows' float
 * sums.  Each sum starts from zero per kernel row, so as in the other kernels
 * an output adds its kernel rows' products in kernel-row order, whichever
 * group a row falls in; within a kernel row the tile unit sums the channels.
 * Weight gradient: tl_amx_wgrad below. */
#ifndef TL_MICROKERNEL_AMX_H
#define TL_MICROKERNEL_AMX_H

#include <stdint.h>

#include "tl_conv.h"
#include "tl_simd.h"

/* Channels of a packed kernel row: c_in rounded up to 32 (one tile's depth). */
static inline int64_t tl_amx_depth(int64_t cin) { return (cin + 31) / 32 * 32; }

/* Elements of one kernel row's packed weights (tl_amx_pack): tl_amx_depth(c_in)
 * x c_out rounded up to 16; all k rows hold k times as many. */
static inline int64_t tl_amx_row_elems(int64_t cin, int64_t cout) {
    return tl_amx_depth(cin) * ((cout + 15) / 16 * 16);
}

/* Packs w (k, c_in, c_out) for tl_amx_rows: kernel row n, block b of 16
 * output columns and channel pair p (kp = tl_amx_depth(c_in), nb = c_out / 16
 * rounded up) hold 32 values at pw + ((n * nb + b) * kp / 2 + p) * 32:
 * w[n][2p][16b + j] then w[n][2p + 1][16b + j] for j < 16 (0 past c_in and
 * c_out), the pair-interleaved layout a tile's right operand takes. */
void tl_amx_pack(const tl_conv_desc *d, const uint16_t *w, uint16_t *pw);

/* float16 through the same tiles: a float16 value has 11 significant bits,
 * bfloat16 8, so each is split into two bfloat16 values whose sum it is
 * exactly (high part: the top 8 bits; low part: the other 3), and a product
 * of two float16 values is the sum of the four products of their parts, each
 * exact in float.  Four tile products per block of sums, where a float FMA
 * kernel does one product per multiply-add; infinities and NaN do not split
 * (inf - inf), so the caller takes another kernel where one occurs. */

/* Packs float16 weights w (k, c_in, c_out): kernel row n's high parts as
 * tl_amx_pack lays them out at pw + 2 n E, its low parts at pw + (2 n + 1) E
 * (E = tl_amx_row_elems(c_in, c_out)); converted at `level`.  *finite: 0
 * where a weight is infinite or NaN. */
tl_status tl_amx_pack_f16(tl_simd level, const tl_conv_desc *d, const uint16_t *w, uint16_t *pw,
                          int *finite);

/* Scratch values tl_amx_wgrad needs for at most `pairs` pairs: its x tile
 * (uint32 units) and its dy tile (bfloat16 values), each 64-byte aligned. */
int64_t tl_amx_wgrad_x_units(int64_t pairs, int64_t cin);
int64_t tl_amx_wgrad_dy_elems(int64_t pairs, int64_t cout);

#if TL_SIMD_AMX
/* Loads this thread's tile configuration; call before tl_amx_rows on a
 * thread, and tl_amx_stop after its last call. */
void tl_amx_start(void);

/* Releases this thread's tile state. */
void tl_amx_stop(void);

/* out[q][0:cw) += a[q] (c_in bfloat16 channels) times the columns
 * [co0, co0 + cw) of one kernel row's packed weights pw_n (tl_amx_pack;
 * co0 a multiple of 16), for q < c, two groups of 16 rows at a time (where
 * `set`, = the products plus zero: out is not read).  abuf: 32 x
 * tl_amx_depth(c_in) bfloat16 values, cbuf: 16 x 64 floats, both 64-byte
 * aligned scratch. */
void tl_amx_rows(int set, int64_t c, int64_t cin, int64_t co0, int64_t cw,
                 const uint16_t *const *a, const uint16_t *pw_n, float *const *out,
                 uint16_t *abuf, float *cbuf);

/* tl_amx_rows for float16 rows and weights packed by tl_amx_pack_f16 (its
 * cout: the layer's c_out); abuf: 32 x 2 tl_amx_depth(c_in) values.  Returns
 * 1 where a row read holds an infinity or NaN: its sums are then wrong, and
 * the caller runs the call through another kernel. */
int tl_amx_rows_f16(int set, int64_t c, int64_t cin, int64_t cout, int64_t co0, int64_t cw,
                    const uint16_t *const *a, const uint16_t *pw_n, float *const *out,
                    uint16_t *abuf, float *cbuf);


/* out[ci * ldo + j] += sum_q xq[q][ci] * dq[q][j] over the c pairs (x row
 * xq[q], dy row dq[q]), ci < cin, j < cout, in float.  The pairs are the
 * tiles' depth: dy rows interleaved two by two (the right operand's layout),
 * x rows interleaved the same way and transposed so each channel's pairs are
 * a row (the left operand).  xt, dt: scratch of tl_amx_wgrad_x_units and
 * tl_amx_wgrad_dy_elems; cbuf 16 x 64 floats; all 64-byte aligned. */
void tl_amx_wgrad(int64_t c, int64_t cin, int64_t cout, const uint16_t *const *xq,
                  const uint16_t *const *dq, uint32_t *xt, uint16_t *dt, float *cbuf,
                  float *out, int64_t ldo);

/* tl_amx_wgrad for float16 rows (split as tl_amx_pack_f16 splits weights):
 * xt and dt twice the size.  Returns 1 where a row read holds an infinity or
 * NaN (out is then wrong). */
int tl_amx_wgrad_f16(int64_t c, int64_t cin, int64_t cout, const uint16_t *const *xq,
                     const uint16_t *const *dq, uint32_t *xt, uint16_t *dt, float *cbuf,
                     float *out, int64_t ldo);
#endif

#endif
