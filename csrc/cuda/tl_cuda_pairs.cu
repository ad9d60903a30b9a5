/* Pair lists (CSR by kernel row) from the (n_out, K) neighbour table.
 *
 * Column n of nbr is cut into tiles of TL_CUDA_SCAN_TILE output rows.  A
 * first pass counts each tile's non-negative entries; the counts, laid out
 * column-major (n, tile), are scanned once, which gives every tile its first
 * pair index and every kernel row its offset; a second pass compacts each
 * tile with a block scan.  Tiles and the rows inside them stay in order, so
 * pairs within a kernel row are sorted by output row. */
#include "tl_cuda_common.cuh"

#define TL_PAIRS_ITEMS (TL_CUDA_SCAN_TILE / TL_CUDA_THREADS)

struct tl_pairs_layout {
    long long *total;
    long long *tile_base; /* (k * tiles): counts, then their exclusive scan */
    long long *scratch;
    int64_t tiles;        /* per column */
};

static tl_cuda_ws tl_pairs_layout_of(void *base, int64_t n_out, int64_t k, tl_pairs_layout *l) {
    tl_cuda_ws w = tl_cuda_ws_begin(base);
    l->tiles = tl_cuda_ceil_div(n_out, TL_CUDA_SCAN_TILE);
    const int64_t n_tiles = k * l->tiles;
    l->total = (long long *)tl_cuda_ws_take(&w, 1, sizeof(long long));
    l->tile_base = (long long *)tl_cuda_ws_take(&w, n_tiles, sizeof(long long));
    l->scratch = (long long *)tl_cuda_ws_take(&w, tl_cuda_scan_scratch(n_tiles), sizeof(long long));
    return w;
}

/* Sizes only; one block per (kernel row, tile) must fit a 1-D grid. */
static tl_status tl_pairs_check_sizes(int64_t n_out, int64_t k) {
    if (n_out < 0 || k < 1) return TL_ERR_INVALID;
    if (n_out > TL_ROW_MAX || k > TL_ROW_MAX) return TL_ERR_OVERFLOW;
    if (tl_cuda_ceil_div(n_out, TL_CUDA_SCAN_TILE) * k > INT32_MAX) return TL_ERR_OVERFLOW;
    return TL_OK;
}

static tl_status tl_pairs_check_args(const int32_t *nbr, int64_t n_out, int64_t k) {
    TL_CUDA_RETURN_IF(tl_pairs_check_sizes(n_out, k));
    return n_out && !nbr ? TL_ERR_INVALID : TL_OK;
}

extern "C" tl_status tl_cuda_pairs_workspace_size(int64_t n_out, int64_t k, size_t *bytes) {
    if (!bytes) return TL_ERR_INVALID;
    TL_CUDA_RETURN_IF(tl_pairs_check_sizes(n_out, k));
    tl_pairs_layout l;
    tl_cuda_ws w = tl_pairs_layout_of(NULL, n_out, k, &l);
    if (w.overflow) return TL_ERR_OVERFLOW;
    *bytes = w.used;
    return TL_OK;
}

/* Rows of this thread: TL_PAIRS_ITEMS consecutive rows of one tile. */
__device__ __forceinline__ long long tl_pairs_first_row(long long tile) {
    return tile * TL_CUDA_SCAN_TILE + (long long)threadIdx.x * TL_PAIRS_ITEMS;
}

/* Block (n, tile) -> counts[n * tiles + tile]. */
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_pairs_count_kernel(const int *nbr, long long n_out, long long k, long long tiles,
                          long long *counts) {
    const long long n = blockIdx.x / tiles, tile = blockIdx.x % tiles;
    const long long first = tl_pairs_first_row(tile);
    long long c = 0;
    for (int q = 0; q < TL_PAIRS_ITEMS; q++)
        if (first + q < n_out && nbr[(first + q) * k + n] >= 0) c++;
    long long total;
    (void)tl_block_exclusive_scan(c, &total);
    if (threadIdx.x == 0) counts[blockIdx.x] = total;
}

__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_pairs_fill_kernel(const int *nbr, long long n_out, long long k, long long tiles,
                         const long long *tile_base, long long n_pairs, int *pair_in,
                         int *pair_out) {
    const long long n = blockIdx.x / tiles, tile = blockIdx.x % tiles;
    const long long first = tl_pairs_first_row(tile);
    int rows[TL_PAIRS_ITEMS];
    long long c = 0;
    for (int q = 0; q < TL_PAIRS_ITEMS; q++) {
        rows[q] = first + q < n_out ? nbr[(first + q) * k + n] : -1;
        c += rows[q] >= 0;
    }
    long long total;
    long long at = tile_base[blockIdx.x] + tl_block_exclusive_scan(c, &total);
    for (int q = 0; q < TL_PAIRS_ITEMS; q++) {
        if (rows[q] < 0) continue;
        if (at < n_pairs) {
            pair_in[at] = rows[q];
            pair_out[at] = (int)(first + q);
        }
        at++;
    }
}

/* offsets[n] = first pair of kernel row n; offsets[k] = total. */
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_pairs_offsets_kernel(const long long *tile_base, const long long *total, long long k,
                            long long tiles, long long *offsets) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x; n <= k; n += stride)
        offsets[n] = n < k ? tile_base[n * tiles] : *total;
}

/* Counts and scans the tiles; the total lands in l->total on the device. */
static tl_status tl_pairs_scan(const int32_t *nbr, int64_t n_out, int64_t k,
                               const tl_pairs_layout &l, cudaStream_t stream) {
    const int64_t n_tiles = k * l.tiles;
    tl_pairs_count_kernel<<<(unsigned)n_tiles, TL_CUDA_THREADS, 0, stream>>>(nbr, n_out, k,
                                                                              l.tiles, l.tile_base);
    TL_CUDA_LAUNCHED();
    return tl_cuda_scan(l.tile_base, l.tile_base, n_tiles, l.scratch, l.total, stream);
}

extern "C" tl_status tl_cuda_pairs_count(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out,
                                         int64_t k, void *workspace, int64_t *n_pairs) {
    if (!n_pairs) return TL_ERR_INVALID;
    *n_pairs = 0;
    TL_CUDA_RETURN_IF(tl_pairs_check_args(nbr, n_out, k));
    tl_pairs_layout l;
    tl_cuda_ws w = tl_pairs_layout_of(workspace, n_out, k, &l);
    if (w.overflow) return TL_ERR_OVERFLOW;
    if (!tl_cuda_ws_ok(workspace, w.used)) return TL_ERR_INVALID;
    cudaStream_t stream;
    tl_cuda_scope scope;
    TL_CUDA_RETURN_IF(scope.enter(ctx, &stream));
    if (n_out == 0) return TL_OK;
    TL_CUDA_RETURN_IF(tl_pairs_scan(nbr, n_out, k, l, stream));
    long long total = 0;
    TL_CUDA_RETURN_IF(tl_cuda_read_back(&total, l.total, sizeof(total), stream));
    *n_pairs = total;
    return TL_OK;
}

extern "C" tl_status tl_cuda_pairs_build(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out,
                                         int64_t k, void *workspace, int64_t n_pairs,
                                         int64_t *offsets, int32_t *pair_in, int32_t *pair_out) {
    TL_CUDA_RETURN_IF(tl_pairs_check_args(nbr, n_out, k));
    if (n_pairs < 0 || !offsets || (n_pairs && (!pair_in || !pair_out))) return TL_ERR_INVALID;
    tl_pairs_layout l;
    tl_cuda_ws w = tl_pairs_layout_of(workspace, n_out, k, &l);
    if (w.overflow) return TL_ERR_OVERFLOW;
    if (!tl_cuda_ws_ok(workspace, w.used)) return TL_ERR_INVALID;
    cudaStream_t stream;
    tl_cuda_scope scope;
    TL_CUDA_RETURN_IF(scope.enter(ctx, &stream));
    if (n_out == 0) {
        TL_CUDA_TRY(cudaMemsetAsync(offsets, 0, sizeof(int64_t) * (size_t)(k + 1), stream));
        return TL_OK;
    }
    TL_CUDA_RETURN_IF(tl_pairs_scan(nbr, n_out, k, l, stream));
    tl_pairs_fill_kernel<<<(unsigned)(k * l.tiles), TL_CUDA_THREADS, 0, stream>>>(
        nbr, n_out, k, l.tiles, l.tile_base, n_pairs, pair_in, pair_out);
    TL_CUDA_LAUNCHED();
    tl_pairs_offsets_kernel<<<tl_cuda_blocks(k + 1), TL_CUDA_THREADS, 0, stream>>>(
        l.tile_base, l.total, k, l.tiles, (long long *)offsets);
    TL_CUDA_LAUNCHED();
    return TL_OK;
}
