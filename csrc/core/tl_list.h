/* Which output rows of a tile have a neighbour through each kernel row: the
 * first step of each implicit GEMM tile (tl_dataflow_implicit_gemm_impl.h and
 * _half.c), which then runs only the rows listed here.  The tile's rows of
 * the (n_out, k) table are contiguous.  With AVX-512 (and k >= 4), 16 rows at
 * a time are transposed in registers, so each kernel row's entries of them
 * are one vector, and its present entries (a LiDAR scan has about 5.6 of 27
 * per row) compressed onto the end of its list; with AVX2, 8 rows at a time.
 * Otherwise one entry at a time, branch-free.  `level` (every function
 * here): the instruction set the caller may use (a tl_simd; the caller
 * checked the CPU has it). */
#ifndef TL_LIST_H
#define TL_LIST_H

#include <stdint.h>

/* Lists the neighbours among output rows [o0, o0 + m) of the (n_out, k)
 * table nbr, for every kernel row n: its c = cnt[n] present entries (>= 0),
 * in row order, at idx[n * m + 0..c) (the entry: an x row) and
 * rows[n * m + 0..c) (the output row - o0); idx and rows hold k * m entries,
 * cnt k.  Returns the largest entry + 1 as uint32 (-1 -> 0, anything below
 * -1 wraps above any row count), so the caller can reject a bad table before
 * reading a row it names; the lists are then incomplete.  The slots' places
 * past their lists may be written too. */
uint32_t tl_list_tile(int level, const int32_t *nbr, int64_t o0, int64_t m, int64_t k,
                      int32_t *idx, int32_t *rows, int64_t *cnt);

/* tl_list_tile for kernel rows [lo, hi) only (the others' counts 0): a
 * weight-gradient task that takes a few kernel rows lists no other.  The
 * return covers those kernel rows' entries only. */
uint32_t tl_list_tile_range(int level, const int32_t *nbr, int64_t o0, int64_t m, int64_t k,
                            int64_t lo, int64_t hi, int32_t *idx, int32_t *rows, int64_t *cnt);

/* tl_list_tile with each output row's first entry kept apart, so the
 * forward can write the row there instead of zeroing it and adding: its
 * entry in kernel row `lead` where it has one, else its lowest kernel row's
 * (the forward's order, tl_fwd_lead; lead -1: always the lowest).  Kernel
 * row n's first entries, fc[n] of them, at
 * idx/rows[n * m + m - fc[n] .. n * m + m) (the back of its slot, in no
 * particular order), its other cnt[n] at the front as in tl_list_tile; the
 * *nz rows with no entry at all in zr[0..*nz) (zr holds m).  A row's entries
 * come one per kernel row, so the two lists never overlap.  Same return. */
uint32_t tl_list_tile_split(int level, const int32_t *nbr, int64_t o0, int64_t m, int64_t k,
                            int64_t lead, int32_t *idx, int32_t *rows, int64_t *cnt, int64_t *fc,
                            int32_t *zr, int64_t *nz);

/* Widens [*lo, *hi] to hold the c entries v[0..c) (all >= 0): 16 entries
 * a step with AVX-512, 8 with AVX2. */
void tl_list_span(int level, const int32_t *v, int64_t c, int64_t *lo, int64_t *hi);

/* The row pointers of c listed rows for the micro-kernels: xr[q] = x +
 * idx[q] * x_bytes and yr[q] = y + rows[q] * y_bytes (byte strides; idx[] and
 * rows[] >= 0, checked by the caller).  xr and yr are arrays of c pointers of
 * the caller's element type, written through types that may alias any
 * pointer.  8 rows a step with AVX-512. */
void tl_point_rows(int level, const int32_t *idx, const int32_t *rows, int64_t c, const void *x,
                   int64_t x_bytes, void *xr, void *y, int64_t y_bytes, void *yr);

#endif
