/* The stable LSD radix sort of csrc/cuda, one template over the item type:
 * coordinate rows (generated supports, deduplicated rows), and 32-bit keys
 * with a 32-bit payload (voxel reduction, implicit GEMM's order of output
 * rows by neighbour mask).  8 bits per pass; per-block digit counts scanned
 * digit-major across blocks (tl_cuda_scan); ranks within a warp from
 * __match_any_sync, so a pass is stable and needs no atomics on the order. */
#ifndef TL_CUDA_RADIX_CUH
#define TL_CUDA_RADIX_CUH

#include "tl_cuda_common.cuh"

#define TL_RADIX_BITS 8
#define TL_RADIX_DIGITS (1 << TL_RADIX_BITS)
static_assert(TL_RADIX_DIGITS == TL_CUDA_THREADS, "one digit per thread of a block");

/* A 32-bit key with its payload: (voxel, point) in tl_cuda_voxel_reduce,
 * (neighbour mask, output row) in the implicit GEMM forward. */
struct tl_kv {
    unsigned key;
    int val;
};

__device__ __forceinline__ int tl_radix_digit(const tl_coord &c, int field, int shift) {
    const int v = field == 0 ? c.b : field == 1 ? c.x : field == 2 ? c.y : c.z;
    return (int)(((unsigned)v >> shift) & (TL_RADIX_DIGITS - 1));
}

__device__ __forceinline__ int tl_radix_digit(const tl_kv &e, int field, int shift) {
    (void)field;
    return (int)((e.key >> shift) & (TL_RADIX_DIGITS - 1));
}

/* hist[d * blocks + block] = items of digit d in the block's tile. */
template <class Item>
static __global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_radix_hist_kernel(const Item *src, long long n, int field, int shift, long long *hist) {
    __shared__ int count[TL_RADIX_DIGITS];
    count[threadIdx.x] = 0; /* TL_CUDA_THREADS == TL_RADIX_DIGITS */
    __syncthreads();
    const long long j = (long long)blockIdx.x * TL_CUDA_THREADS + threadIdx.x;
    if (j < n) atomicAdd(&count[tl_radix_digit(src[j], field, shift)], 1);
    __syncthreads();
    hist[(long long)threadIdx.x * gridDim.x + blockIdx.x] = count[threadIdx.x];
}

/* Stable scatter: scanned offset of the digit for this block, plus items of
 * that digit in earlier warps, plus earlier lanes with the same digit. */
template <class Item>
static __global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_radix_scatter_kernel(const Item *src, Item *dst, long long n, int field, int shift,
                            const long long *offsets) {
    __shared__ int warp_count[TL_CUDA_WARPS][TL_RADIX_DIGITS];
    for (int w = 0; w < TL_CUDA_WARPS; w++) warp_count[w][threadIdx.x] = 0;
    __syncthreads();
    const long long j = (long long)blockIdx.x * TL_CUDA_THREADS + threadIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    Item c;
    int d = TL_RADIX_DIGITS; /* past the end: matches only other lanes past the end */
    if (j < n) {
        c = src[j];
        d = tl_radix_digit(c, field, shift);
    }
    const unsigned peers = __match_any_sync(0xffffffffu, d);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    if (j < n && lane == __ffs(peers) - 1) warp_count[warp][d] = __popc(peers);
    __syncthreads();
    if (j < n) {
        long long at = offsets[(long long)d * gridDim.x + blockIdx.x] + rank;
        for (int w = 0; w < warp; w++) at += warp_count[w][d];
        dst[at] = c;
    }
}

/* Histogram entries (and so scan length) of a sort of n items. */
static inline int64_t tl_radix_hist_len(int64_t n) {
    return TL_RADIX_DIGITS * tl_cuda_ceil_div(n, TL_CUDA_THREADS);
}

static inline int tl_radix_bytes_of(unsigned mask) {
    int b = 0;
    while (mask) {
        b++;
        mask >>= TL_RADIX_BITS;
    }
    return b;
}

/* One stable pass on digit (field, shift) from src to dst. */
template <class Item>
static tl_status tl_radix_pass(const Item *src, Item *dst, int64_t n, int field, int shift,
                               long long *hist, long long *scratch, cudaStream_t stream) {
    const int64_t blocks = tl_cuda_ceil_div(n, TL_CUDA_THREADS);
    if (blocks > INT32_MAX) return TL_ERR_OVERFLOW;
    tl_radix_hist_kernel<Item><<<(unsigned)blocks, TL_CUDA_THREADS, 0, stream>>>(src, n, field,
                                                                                shift, hist);
    TL_CUDA_LAUNCHED();
    TL_CUDA_RETURN_IF(tl_cuda_scan(hist, hist, tl_radix_hist_len(n), scratch, NULL, stream));
    tl_radix_scatter_kernel<Item><<<(unsigned)blocks, TL_CUDA_THREADS, 0, stream>>>(
        src, dst, n, field, shift, hist);
    TL_CUDA_LAUNCHED();
    return TL_OK;
}

/* Sorts the items a[0, n) by the low `bits` bits of their keys (higher bits
 * must be 0), ping-ponging with b; *sorted receives the buffer holding the
 * result. */
static inline tl_status tl_radix_sort_kv(tl_kv *a, tl_kv *b, int64_t n, int bits,
                                         long long *hist, long long *scratch,
                                         cudaStream_t stream, tl_kv **sorted) {
    tl_kv *src = a, *dst = b;
    for (int shift = 0; shift < bits; shift += TL_RADIX_BITS) {
        TL_CUDA_RETURN_IF(tl_radix_pass<tl_kv>(src, dst, n, 0, shift, hist, scratch, stream));
        tl_kv *t = src;
        src = dst;
        dst = t;
    }
    *sorted = src;
    return TL_OK;
}

/* Sorts rows a[0, n) by (b, x, y, z) over the bytes that carry bits (mask:
 * OR of each field, all rows non-negative), ping-ponging with b; *sorted
 * receives the buffer holding the result. */
static inline tl_status tl_radix_sort_coords(tl_coord *a, tl_coord *b, int64_t n,
                                            const unsigned mask[4], long long *hist,
                                            long long *scratch, cudaStream_t stream,
                                            tl_coord **sorted) {
    tl_coord *src = a, *dst = b;
    for (int field = 3; field >= 0; field--) { /* z is the least significant */
        const int bytes = tl_radix_bytes_of(mask[field]);
        for (int byte = 0; byte < bytes; byte++) {
            TL_CUDA_RETURN_IF(tl_radix_pass<tl_coord>(src, dst, n, field, byte * TL_RADIX_BITS,
                                                      hist, scratch, stream));
            tl_coord *t = src;
            src = dst;
            dst = t;
        }
    }
    *sorted = src;
    return TL_OK;
}

#endif
