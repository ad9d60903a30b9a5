/* Pair lists (CSR by kernel row) from the (n_out, K) neighbour table.
 *
 * nbr is read row-major, as it lies in memory: one block per tile of
 * consecutive output rows stages the tile's rows * K entries in shared
 * memory with coalesced loads.  Each warp then owns a set of kernel rows n
 * and walks the tile's rows 32 at a time: a ballot over "nbr[o, n] >= 0"
 * gives every valid entry its rank among the tile's valid entries of column
 * n, in output-row order.
 *
 *   1. count: per (kernel row n, tile) the number of valid entries, stored
 *      column-major (n, tile);
 *   2. one exclusive scan of those counts gives every (n, tile) its first
 *      pair index and every kernel row its offset;
 *   3. fill: the same walk writes pair (nbr[o, n], o) at first + rank.
 *
 * Tiles and the rows inside them stay in order, so pairs within a kernel row
 * are sorted by output row, exactly as the CPU's tl_pairs_fill. */
#include "tl_cuda_common.cuh"

/* Shared memory of one staged tile: at most 48 KiB, the limit without an
 * opt-in.  Tables wider than that (K > 384) are walked in global memory. */
#define TL_PAIRS_SMEM_INTS (48 * 1024 / 4)
/* Largest tile, in output rows. */
#define TL_PAIRS_MAX_TILE 256

/* Rows per tile for K kernel rows: a multiple of 32 in [32, 256] whose
 * entries fill about 32 KiB. */
static int64_t tl_pairs_tile_rows(int64_t k) {
    int64_t rows = (8192 / k) / 32 * 32;
    if (rows > TL_PAIRS_MAX_TILE) rows = TL_PAIRS_MAX_TILE;
    return rows < 32 ? 32 : rows;
}

struct tl_pairs_layout {
    long long *total;
    long long *tile_base; /* (k * tiles): counts, then their exclusive scan */
    long long *scratch;
    int64_t tile_rows;
    int64_t tiles;
};

static tl_cuda_ws tl_pairs_layout_of(void *base, int64_t n_out, int64_t k, tl_pairs_layout *l) {
    tl_cuda_ws w = tl_cuda_ws_begin(base);
    l->tile_rows = tl_pairs_tile_rows(k);
    l->tiles = tl_cuda_ceil_div(n_out, l->tile_rows);
    const int64_t n_tiles = k * l->tiles;
    l->total = (long long *)tl_cuda_ws_take(&w, 1, sizeof(long long));
    l->tile_base = (long long *)tl_cuda_ws_take(&w, n_tiles, sizeof(long long));
    l->scratch = (long long *)tl_cuda_ws_take(&w, tl_cuda_scan_scratch(n_tiles), sizeof(long long));
    return w;
}

/* Sizes only; one block per tile must fit a 1-D grid, and the (n, tile)
 * counts must be indexable. */
static tl_status tl_pairs_check_sizes(int64_t n_out, int64_t k) {
    if (n_out < 0 || k < 1) return TL_ERR_INVALID;
    if (n_out > TL_ROW_MAX || k > TL_ROW_MAX) return TL_ERR_OVERFLOW;
    if (tl_cuda_ceil_div(n_out, 32) > INT32_MAX / k) return TL_ERR_OVERFLOW;
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

/* One tile of nbr: rows [first, first + rows) and where its entries are read
 * from (shared memory when staged, else global memory). */
struct tl_pairs_tile {
    const int *at; /* entry (r, n) of the tile is at[r * k + n] */
    long long first, rows, k;
};

/* Stages the block's tile in shared memory (coalesced: the tile's entries
 * are contiguous in nbr) or points into nbr when it does not fit. */
template <bool STAGED>
__device__ __forceinline__ tl_pairs_tile tl_pairs_load(const int *nbr, long long n_out,
                                                       long long k, long long tile_rows,
                                                       int *smem) {
    tl_pairs_tile t;
    t.first = (long long)blockIdx.x * tile_rows;
    t.rows = n_out - t.first < tile_rows ? n_out - t.first : tile_rows;
    t.k = k;
    const int *src = nbr + t.first * k;
    if (STAGED) {
        const long long n = t.rows * k;
        for (long long e = threadIdx.x; e < n; e += TL_CUDA_THREADS) smem[e] = src[e];
        __syncthreads();
        t.at = smem;
    } else {
        t.at = src;
    }
    return t;
}

/* Walks column n of a tile 32 rows at a time; calls visit(row, value, rank)
 * for each valid entry (rank among the tile's valid entries of column n, in
 * row order) and returns the column's count.  Called by a whole warp. */
template <typename Visit>
__device__ __forceinline__ long long tl_pairs_walk(const tl_pairs_tile &t, long long n,
                                                   Visit visit) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned below = (1u << lane) - 1u;
    long long seen = 0;
    for (long long r0 = 0; r0 < t.rows; r0 += 32) {
        const long long r = r0 + lane;
        const int v = r < t.rows ? t.at[r * t.k + n] : -1;
        const unsigned valid = __ballot_sync(0xffffffffu, v >= 0);
        if (v >= 0) visit(t.first + r, v, seen + __popc(valid & below));
        seen += __popc(valid);
    }
    return seen;
}

struct tl_pairs_no_visit {
    __device__ void operator()(long long, int, long long) const {}
};

/* Block `tile` -> counts[n * tiles + tile] for every kernel row n. */
template <bool STAGED>
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_pairs_count_kernel(const int *nbr, long long n_out, long long k, long long tile_rows,
                          long long tiles, long long *counts) {
    extern __shared__ int tl_pairs_smem[];
    const tl_pairs_tile t = tl_pairs_load<STAGED>(nbr, n_out, k, tile_rows, tl_pairs_smem);
    const long long warp = threadIdx.x >> 5;
    for (long long n = warp; n < k; n += TL_CUDA_WARPS) {
        const long long c = tl_pairs_walk(t, n, tl_pairs_no_visit());
        if ((threadIdx.x & 31) == 0) counts[n * tiles + blockIdx.x] = c;
    }
}

/* Writes the tile's pairs at their scanned positions (never at or past
 * n_pairs). */
struct tl_pairs_writer {
    long long base, n_pairs;
    int *pair_in, *pair_out;
    __device__ void operator()(long long row, int value, long long rank) const {
        const long long at = base + rank;
        if (at < n_pairs) {
            pair_in[at] = value;
            pair_out[at] = (int)row;
        }
    }
};

template <bool STAGED>
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_pairs_fill_kernel(const int *nbr, long long n_out, long long k, long long tile_rows,
                         long long tiles, const long long *tile_base, long long n_pairs,
                         int *pair_in, int *pair_out) {
    extern __shared__ int tl_pairs_smem[];
    const tl_pairs_tile t = tl_pairs_load<STAGED>(nbr, n_out, k, tile_rows, tl_pairs_smem);
    const long long warp = threadIdx.x >> 5;
    for (long long n = warp; n < k; n += TL_CUDA_WARPS) {
        const tl_pairs_writer w = {tile_base[n * tiles + blockIdx.x], n_pairs, pair_in, pair_out};
        (void)tl_pairs_walk(t, n, w);
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

/* Grid of the count and fill kernels: one block per tile, with the tile in
 * dynamic shared memory when it fits. */
struct tl_pairs_launch {
    unsigned blocks;
    size_t smem;
    bool staged;
};

static tl_pairs_launch tl_pairs_launch_of(int64_t k, const tl_pairs_layout &l) {
    tl_pairs_launch g;
    g.blocks = (unsigned)l.tiles;
    g.staged = l.tile_rows * k <= TL_PAIRS_SMEM_INTS;
    g.smem = g.staged ? sizeof(int) * (size_t)(l.tile_rows * k) : 0;
    return g;
}

/* Counts and scans the tiles; the total lands in l->total on the device. */
static tl_status tl_pairs_scan(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out, int64_t k,
                               const tl_pairs_layout &l, cudaStream_t stream) {
    TL_CUDA_ERRORS_TO(ctx);
    const tl_pairs_launch g = tl_pairs_launch_of(k, l);
    if (g.staged)
        tl_pairs_count_kernel<true><<<g.blocks, TL_CUDA_THREADS, g.smem, stream>>>(
            nbr, n_out, k, l.tile_rows, l.tiles, l.tile_base);
    else
        tl_pairs_count_kernel<false><<<g.blocks, TL_CUDA_THREADS, 0, stream>>>(
            nbr, n_out, k, l.tile_rows, l.tiles, l.tile_base);
    TL_CUDA_LAUNCHED();
    return tl_cuda_scan(l.tile_base, l.tile_base, k * l.tiles, l.scratch, l.total, stream);
}

extern "C" tl_status tl_cuda_pairs_count(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out,
                                         int64_t k, void *workspace, int64_t *n_pairs) {
    TL_CUDA_ERRORS_TO(ctx);
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
    TL_CUDA_RETURN_IF(tl_pairs_scan(ctx, nbr, n_out, k, l, stream));
    long long total = 0;
    TL_CUDA_TRY(cudaMemcpyAsync(&total, l.total, sizeof(total), cudaMemcpyDeviceToHost, stream));
    TL_CUDA_TRY(cudaStreamSynchronize(stream));
    *n_pairs = total;
    return TL_OK;
}

extern "C" tl_status tl_cuda_pairs_build(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out,
                                         int64_t k, void *workspace, int64_t n_pairs,
                                         int64_t *offsets, int32_t *pair_in, int32_t *pair_out) {
    TL_CUDA_ERRORS_TO(ctx);
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
    TL_CUDA_RETURN_IF(tl_pairs_scan(ctx, nbr, n_out, k, l, stream));
    const tl_pairs_launch g = tl_pairs_launch_of(k, l);
    if (g.staged)
        tl_pairs_fill_kernel<true><<<g.blocks, TL_CUDA_THREADS, g.smem, stream>>>(
            nbr, n_out, k, l.tile_rows, l.tiles, l.tile_base, n_pairs, pair_in, pair_out);
    else
        tl_pairs_fill_kernel<false><<<g.blocks, TL_CUDA_THREADS, 0, stream>>>(
            nbr, n_out, k, l.tile_rows, l.tiles, l.tile_base, n_pairs, pair_in, pair_out);
    TL_CUDA_LAUNCHED();
    tl_pairs_offsets_kernel<<<tl_cuda_blocks(k + 1), TL_CUDA_THREADS, 0, stream>>>(
        l.tile_base, l.total, k, l.tiles, (long long *)offsets);
    TL_CUDA_LAUNCHED();
    return TL_OK;
}
