/* C ABI of the CUDA half of Torch Lattice (the .cu files of csrc/cuda).
 *
 * Every entry point takes the execution context first: ctx->device is the
 * CUDA device index (made current for the call, then restored) and
 * ctx->stream is torch's current cudaStream_t for that device; all work is
 * enqueued on that stream.  Pointers are device pointers owned by torch: C
 * never allocates.  Scratch memory comes from a caller-allocated workspace
 * (a torch uint8 tensor, 256-byte aligned) whose size the matching
 * *_workspace_size function returns.
 *
 * Nothing synchronizes except where a count or an error flag must reach the
 * host: tl_cuda_kmap_build (duplicate / negative input rows),
 * tl_cuda_generate (row count) and tl_cuda_pairs_count (pair count).
 *
 * A call that returns TL_ERR_CUDA describes the failing CUDA call in
 * ctx->err when it can (file:line, the call, cudaGetErrorName and
 * cudaGetErrorString); see tl_ctx.h and tl_cuda_error_describe.
 *
 * Formats are those of docs/kernel-maps.md, identical to the CPU core:
 * coordinates (N, 4) int32 rows (b, x, y, z); nbr (n_out, K) int32 with -1
 * for "no input row"; pair lists in CSR by kernel row. */
#ifndef TL_CUDA_H
#define TL_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "../core/tl_conv.h"
#include "../core/tl_coords.h"
#include "../core/tl_ctx.h"
#include "../core/tl_status.h"

/* ---- kernel maps (tl_cuda_kmap.cu) ---- */

/* Workspace bytes of tl_cuda_kmap_build for n_in input rows. */
tl_status tl_cuda_kmap_workspace_size(int64_t n_in, size_t *bytes);

/* Fills nbr (n_out * K int32) exactly as tl_kmap_build: nbr[o*K + n] = i iff
 * in[i] == out[o] * stride - padding + r_n * dilation (same batch), else -1;
 * positions outside [0, INT32_MAX] and outputs with a negative batch give -1.
 * Input rows must be non-negative (TL_ERR_INVALID) and unique
 * (TL_ERR_DUPLICATE); both are checked on the device and read back (one
 * synchronization), before nbr is written, so nbr is untouched on failure. */
tl_status tl_cuda_kmap_build(const tl_ctx *ctx, const tl_coord *in, int64_t n_in,
                             const tl_coord *out, int64_t n_out, const tl_geom *g,
                             void *workspace, int32_t *nbr);

/* Fills rev (n_in * K int32), the transpose of nbr: rev[i*K + n] = o iff
 * nbr[o*K + n] = i.  nbr must come from tl_cuda_kmap_build (no
 * synchronization, so it is not validated; entries outside [-1, n_in) are
 * skipped, never written out of bounds). */
tl_status tl_cuda_kmap_reverse(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out,
                               int64_t k, int64_t n_in, int32_t *rev);

/* ---- generated output support (tl_cuda_coords.cu) ---- */

/* Workspace bytes of tl_cuda_generate. */
tl_status tl_cuda_generate_workspace_size(int64_t n_in, const tl_geom *g,
                                          const int64_t out_range[3], size_t *bytes);

/* The CPU tl_coords_generate on the device: every q in [0, out_range) that
 * some kernel row maps onto an input row of the same batch, unique and
 * sorted by (b, x, y, z), written to out (capacity rows; use
 * tl_coords_generate_bound).  *n_out receives the count (read back: one
 * synchronization).  TL_ERR_CAPACITY when capacity is too small,
 * TL_ERR_INVALID when a generated row would have a negative batch. */
tl_status tl_cuda_generate(const tl_ctx *ctx, const tl_coord *in, int64_t n_in,
                           const tl_geom *g, const int64_t out_range[3], void *workspace,
                           tl_coord *out, int64_t capacity, int64_t *n_out);

/* ---- pair lists (tl_cuda_pairs.cu) ---- */

/* Workspace bytes of tl_cuda_pairs_count / tl_cuda_pairs_build. */
tl_status tl_cuda_pairs_workspace_size(int64_t n_out, int64_t k, size_t *bytes);

/* Number of non-negative entries of nbr (n_out, k) (one synchronization). */
tl_status tl_cuda_pairs_count(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out, int64_t k,
                              void *workspace, int64_t *n_pairs);

/* CSR pair lists from nbr: offsets (k + 1, int64), pair_in and pair_out
 * (n_pairs each, the count from tl_cuda_pairs_count).  Within a kernel row
 * pairs are sorted by output row (stable compaction of column n).  Pairs
 * beyond n_pairs are never written. */
tl_status tl_cuda_pairs_build(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out, int64_t k,
                              void *workspace, int64_t n_pairs, int64_t *offsets,
                              int32_t *pair_in, int32_t *pair_out);

/* ---- dataflows (tl_cuda_implicit_gemm.cu, tl_cuda_fetch_on_demand.cu,
 *      tl_cuda_gather_scatter.cu) ---- */

typedef enum tl_cuda_dataflow {
    TL_CUDA_IMPLICIT_GEMM = 0,
    TL_CUDA_FETCH_ON_DEMAND = 1,
    TL_CUDA_GATHER_SCATTER = 2
} tl_cuda_dataflow;

/* Device pair lists of the fetch-on-demand dataflow.
 * Rows within a kernel row must be unique (as built by
 * tl_cuda_pairs_build); swap in and out for the input gradient. */
typedef struct tl_cuda_pairs {
    int64_t n_pairs;        /* offsets[k] */
    const int64_t *offsets; /* (k + 1) */
    const int32_t *in;      /* (n_pairs) rows of x */
    const int32_t *out;     /* (n_pairs) rows of y */
} tl_cuda_pairs;

/* Workspace bytes of one tile-GEMM dataflow call (forward when weight_grad
 * is 0): TL_CUDA_IMPLICIT_GEMM or TL_CUDA_FETCH_ON_DEMAND (TL_ERR_INVALID
 * for TL_CUDA_GATHER_SCATTER, which runs through torch; see below).
 * derived != 0: the call will be passed its map-derived data (below), which
 * it then needs no scratch to compute; tl_cuda_conv_derive takes the
 * workspace of derived == 0. */
tl_status tl_cuda_conv_workspace_size(tl_cuda_dataflow df, int weight_grad,
                                      const tl_conv_desc *d, int64_t n_pairs, int derived,
                                      size_t *bytes);

/* Data a dataflow call derives from its map alone before it multiplies:
 * implicit GEMM's order of output rows (a forward of at least 4096 output
 * rows and 2..32 kernel rows: n_out (mask, row) pairs of int32) and
 * fetch-on-demand's per-kernel-row tile starts (k + 1 int64, per direction).
 * Each call computes it in its workspace when passed derived == NULL; a
 * caller that keeps its map can compute it once with tl_cuda_conv_derive
 * (enqueued on ctx->stream, no synchronization; the call's workspace for
 * derived == 0)
 * into tl_cuda_conv_derived_size bytes (0: nothing to derive) and pass it to
 * every later call of the same dataflow, direction, desc and map on the same
 * device. */
tl_status tl_cuda_conv_derived_size(tl_cuda_dataflow df, int weight_grad, const tl_conv_desc *d,
                                    size_t *bytes);
tl_status tl_cuda_conv_derive(const tl_ctx *ctx, tl_cuda_dataflow df, int weight_grad,
                              const tl_conv_desc *d, const int32_t *nbr, const tl_cuda_pairs *p,
                              void *workspace, void *derived);

/* Forward: y (n_out, c_out) = sum_n x[rows of n] @ w[n], overwritten.
 * Weight gradient: dw (k, c_in, c_out) = sum_n x[in]^T dy[out], overwritten.
 * dtype TL_F32, TL_F16 or TL_BF16 (TL_ERR_UNSUPPORTED otherwise), products
 * accumulated in fp32.  opts holds TL_CUDA_* option bits (below); the other
 * bits are ignored.  Map entries outside their row range are skipped. */
/* fp32 products may run on TF32 tensor cores (the user's
 * torch.backends.cuda.matmul.allow_tf32); plain fp32 FMA otherwise. */
#define TL_CUDA_TF32 1
/* Calls may run the multi-stage cp.async kernels where the device (sm_80
 * code), the channel rows (whole 16-byte runs) and the pointers (16-byte
 * aligned) allow, the other kernels otherwise: an fp16, bf16 or TF32
 * implicit-GEMM forward whose rows are sorted (as above;
 * tl_cuda_ig_pipelined.cu), an fp16, bf16 or TF32 fetch-on-demand weight
 * gradient and an fp16, bf16 or TF32 fetch-on-demand forward
 * (tl_cuda_fod_pipelined.cu).  Each waits for a device run before it
 * becomes the default (docs/gpu-validation.md). */
#define TL_CUDA_PIPELINED_FORWARD 2
#define TL_CUDA_PIPELINED_WGRAD 4
#define TL_CUDA_PIPELINED_FOD_FORWARD 8
/* Plain fp32 (no TL_CUDA_TF32) may run the same pipelined kernels (both
 * forwards, the fetch-on-demand weight gradient), multiplied on the CUDA
 * cores (FMA), under the same conditions; pending like the others.  The
 * fetch-on-demand weight gradient's TF32 kernel is TL_CUDA_PIPELINED_WGRAD's. */
#define TL_CUDA_PIPELINED_FP32 16
tl_status tl_cuda_implicit_gemm_forward(const tl_ctx *ctx, const tl_conv_desc *d, int opts,
                                        const void *x, const void *w, const int32_t *nbr,
                                        const void *derived, void *workspace, void *y);
tl_status tl_cuda_implicit_gemm_weight_grad(const tl_ctx *ctx, const tl_conv_desc *d,
                                            int opts, const void *x, const void *dy,
                                            const int32_t *nbr, const void *derived,
                                            void *workspace, void *dw);
tl_status tl_cuda_fetch_on_demand_forward(const tl_ctx *ctx, const tl_conv_desc *d,
                                          int opts, const void *x, const void *w,
                                          const tl_cuda_pairs *p, const void *derived,
                                          void *workspace, void *y);
tl_status tl_cuda_fetch_on_demand_weight_grad(const tl_ctx *ctx, const tl_conv_desc *d,
                                              int opts, const void *x, const void *dy,
                                              const tl_cuda_pairs *p, const void *derived,
                                              void *workspace, void *dw);

/* ---- gather-scatter (tl_cuda_gather_scatter.cu) ----
 *
 * The gather-scatter dataflow is orchestrated by torch_lattice/ops/conv_cuda.py:
 * tl_cuda_gather_rows collects x[pair_in] for every kernel row at once, torch
 * (cuBLAS) multiplies each kernel row's slice by w[n], and
 * tl_cuda_scatter_add_rows adds all products into y[pair_out].  So
 * TL_CUDA_GATHER_SCATTER has no tile-GEMM entry point (and no workspace). */

/* dst (n_rows, c) = src[idx[r]] row by row, in dtype (any tl_dtype: rows are
 * copied as bytes, in 16-byte units when the row size and both pointers
 * allow).  Indices outside [0, n_src) give zero rows.  Enqueued on
 * ctx->stream, no synchronization. */
tl_status tl_cuda_gather_rows(const tl_ctx *ctx, tl_dtype dtype, const void *src, int64_t n_src,
                              int64_t c, const int32_t *idx, int64_t n_rows, void *dst);

/* acc (n_dst, c) fp32 += src (n_rows, c) row r into row idx[r], with fp32
 * atomics (rows may repeat).  src is TL_F32, TL_F16 or TL_BF16
 * (TL_ERR_UNSUPPORTED otherwise); indices outside [0, n_dst) drop their row.
 * The caller zeroes acc and casts it once for half types.  Summation order
 * between rows meeting at one output is not fixed. */
tl_status tl_cuda_scatter_add_rows(const tl_ctx *ctx, tl_dtype dtype, const void *src,
                                   int64_t n_rows, int64_t c, const int32_t *idx, int64_t n_dst,
                                   float *acc);

#ifdef __cplusplus
}
#endif

#endif
