/* Device-wide exclusive scan of int64 values: tiles of TL_CUDA_SCAN_TILE
 * values are scanned by one block each, the tile totals are scanned
 * recursively, then added back.  Used for compaction offsets (generated
 * support, pair lists) and radix-sort digit offsets.  No CUB: the module
 * links no C++ runtime. */
#include "tl_cuda_common.cuh"

#define TL_SCAN_ITEMS (TL_CUDA_SCAN_TILE / TL_CUDA_THREADS)

/* out = exclusive scan of in within each tile; tile_sums[tile] = its total. */
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_scan_tiles_kernel(const long long *in, long long *out, long long n, long long *tile_sums) {
    const long long first = (long long)blockIdx.x * TL_CUDA_SCAN_TILE +
                            (long long)threadIdx.x * TL_SCAN_ITEMS;
    long long v[TL_SCAN_ITEMS];
    long long sum = 0;
    for (int q = 0; q < TL_SCAN_ITEMS; q++) {
        v[q] = first + q < n ? in[first + q] : 0;
        sum += v[q];
    }
    long long total;
    /* The block scan holds barriers, so every read of `in` above happens
     * before any write below: in == out is safe. */
    long long ex = tl_block_exclusive_scan(sum, &total);
    for (int q = 0; q < TL_SCAN_ITEMS; q++) {
        if (first + q < n) out[first + q] = ex;
        ex += v[q];
    }
    if (threadIdx.x == 0) tile_sums[blockIdx.x] = total;
}

/* out[j] += tile_base[tile of j] for tiles 1.. (tile 0 has base 0). */
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_scan_add_kernel(long long *out, long long n, const long long *tile_base) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long j = TL_CUDA_SCAN_TILE + (long long)blockIdx.x * blockDim.x + threadIdx.x;
         j < n; j += stride)
        out[j] += tile_base[j / TL_CUDA_SCAN_TILE];
}

int64_t tl_cuda_scan_scratch(int64_t n) {
    int64_t total = 0;
    while (n > 0) {
        int64_t tiles = tl_cuda_ceil_div(n, TL_CUDA_SCAN_TILE);
        total += tiles;
        if (tiles == 1) break;
        n = tiles;
    }
    return total;
}

tl_status tl_cuda_scan(const long long *in, long long *out, int64_t n, long long *scratch,
                       long long *total, cudaStream_t stream) {
    if (n < 0) return TL_ERR_INVALID;
    if (n == 0) {
        if (total) TL_CUDA_TRY(cudaMemsetAsync(total, 0, sizeof(long long), stream));
        return TL_OK;
    }
    const int64_t tiles = tl_cuda_ceil_div(n, TL_CUDA_SCAN_TILE);
    if (tiles > INT32_MAX) return TL_ERR_OVERFLOW;
    long long *sums = scratch;
    tl_scan_tiles_kernel<<<(unsigned)tiles, TL_CUDA_THREADS, 0, stream>>>(in, out, n, sums);
    TL_CUDA_LAUNCHED();
    if (tiles == 1) {
        if (total)
            TL_CUDA_TRY(cudaMemcpyAsync(total, sums, sizeof(long long),
                                        cudaMemcpyDeviceToDevice, stream));
        return TL_OK;
    }
    /* Depth is log_1024(n): at most 4 levels for any int64 count that fits memory. */
    TL_CUDA_RETURN_IF(tl_cuda_scan(sums, sums, tiles, scratch + tiles, total, stream));
    tl_scan_add_kernel<<<tl_cuda_blocks(n - TL_CUDA_SCAN_TILE), TL_CUDA_THREADS, 0, stream>>>(
        out, n, sums);
    TL_CUDA_LAUNCHED();
    return TL_OK;
}
