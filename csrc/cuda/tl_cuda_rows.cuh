/* Device helpers for coordinate rows and features, shared by tl_cuda_voxel.cu,
 * tl_cuda_pool.cu, tl_cuda_generative.cu: feature loads and stores in fp32
 * (fp64 for double), a stable LSD radix sort (coordinate rows or 32-bit keys
 * with a payload), and deduplication of coordinate rows through the hash
 * table of tl_cuda_hash.cuh.
 *
 * The sort is the one of tl_cuda_coords.cu (whose kernels are file-static),
 * written as templates over the item type: 8 bits per pass, block histograms
 * scanned digit-major across blocks, ranks within a warp from
 * __match_any_sync, so it is stable and needs no atomics on the order. */
#ifndef TL_CUDA_ROWS_CUH
#define TL_CUDA_ROWS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tl_cuda_hash.cuh"

#define TL_ROWS_RADIX_BITS 8
#define TL_ROWS_DIGITS (1 << TL_ROWS_RADIX_BITS)
/* Codes of rejected items, packed as (index << 2 | code) and min-reduced,
 * so the first rejected index wins whatever the thread order. */
#define TL_ROWS_BAD_INVALID 1ull
#define TL_ROWS_BAD_OVERFLOW 2ull
#define TL_ROWS_NO_BAD (~0ull)

/* ---- feature types ---- */

template <class T> struct tl_acc { typedef float type; };
template <> struct tl_acc<double> { typedef double type; };

__device__ __forceinline__ float tl_load(float v) { return v; }
__device__ __forceinline__ double tl_load(double v) { return v; }
__device__ __forceinline__ float tl_load(__half v) { return __half2float(v); }
__device__ __forceinline__ float tl_load(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T> __device__ __forceinline__ T tl_store(typename tl_acc<T>::type v);
template <> __device__ __forceinline__ float tl_store<float>(float v) { return v; }
template <> __device__ __forceinline__ double tl_store<double>(double v) { return v; }
template <> __device__ __forceinline__ __half tl_store<__half>(float v) {
    return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 tl_store<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

/* True for the dtypes the block kernels are built for. */
static inline bool tl_rows_dtype_ok(tl_dtype t) {
    return t == TL_F32 || t == TL_F64 || t == TL_F16 || t == TL_BF16;
}

/* ---- read-back record ---- */

/* What the host reads back once per call. */
struct tl_rows_info {
    long long count;        /* unique rows after deduplication */
    unsigned long long bad; /* min of (index << 2 | code) over rejected items */
    unsigned mask[4];       /* OR of b, x, y, z over the deduplicated rows */
    int dup;                /* a duplicate row met while building a lookup table */
    int pad;
};

/* Clears info (count, mask, dup 0; bad none). */
static inline tl_status tl_rows_info_clear(tl_rows_info *info, cudaStream_t stream) {
    TL_CUDA_TRY(cudaMemsetAsync(info, 0, sizeof(tl_rows_info), stream));
    TL_CUDA_TRY(cudaMemsetAsync(&info->bad, 0xFF, sizeof(unsigned long long), stream));
    return TL_OK;
}

/* ---- radix sort ---- */

/* A 32-bit key with its payload (the sort of tl_cuda_voxel_reduce). */
struct tl_kv {
    unsigned key;
    int val;
};

__device__ __forceinline__ int tl_rows_digit(const tl_coord &c, int field, int shift) {
    const int v = field == 0 ? c.b : field == 1 ? c.x : field == 2 ? c.y : c.z;
    return (int)(((unsigned)v >> shift) & (TL_ROWS_DIGITS - 1));
}

__device__ __forceinline__ int tl_rows_digit(const tl_kv &e, int field, int shift) {
    (void)field;
    return (int)((e.key >> shift) & (TL_ROWS_DIGITS - 1));
}

/* hist[d * blocks + block] = items of digit d in the block's tile. */
template <class Item>
static __global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_rows_hist_kernel(const Item *src, long long n, int field, int shift, long long *hist) {
    __shared__ int count[TL_ROWS_DIGITS];
    count[threadIdx.x] = 0; /* TL_CUDA_THREADS == TL_ROWS_DIGITS */
    __syncthreads();
    const long long j = (long long)blockIdx.x * TL_CUDA_THREADS + threadIdx.x;
    if (j < n) atomicAdd(&count[tl_rows_digit(src[j], field, shift)], 1);
    __syncthreads();
    hist[(long long)threadIdx.x * gridDim.x + blockIdx.x] = count[threadIdx.x];
}

/* Stable scatter: scanned offset of the digit for this block, plus items of
 * that digit in earlier warps, plus earlier lanes with the same digit. */
template <class Item>
static __global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_rows_scatter_kernel(const Item *src, Item *dst, long long n, int field, int shift,
                          const long long *offsets) {
    __shared__ int warp_count[TL_CUDA_WARPS][TL_ROWS_DIGITS];
    for (int w = 0; w < TL_CUDA_WARPS; w++) warp_count[w][threadIdx.x] = 0;
    __syncthreads();
    const long long j = (long long)blockIdx.x * TL_CUDA_THREADS + threadIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    Item c;
    int d = TL_ROWS_DIGITS; /* past the end: matches only other lanes past the end */
    if (j < n) {
        c = src[j];
        d = tl_rows_digit(c, field, shift);
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
static inline int64_t tl_rows_hist_len(int64_t n) {
    return TL_ROWS_DIGITS * tl_cuda_ceil_div(n, TL_CUDA_THREADS);
}

static inline int tl_rows_bytes_of(unsigned mask) {
    int b = 0;
    while (mask) {
        b++;
        mask >>= TL_ROWS_RADIX_BITS;
    }
    return b;
}

/* One stable pass on digit (field, shift) from src to dst. */
template <class Item>
static tl_status tl_rows_radix_pass(const Item *src, Item *dst, int64_t n, int field, int shift,
                                   long long *hist, long long *scratch, cudaStream_t stream) {
    const int64_t blocks = tl_cuda_ceil_div(n, TL_CUDA_THREADS);
    if (blocks > INT32_MAX) return TL_ERR_OVERFLOW;
    tl_rows_hist_kernel<Item><<<(unsigned)blocks, TL_CUDA_THREADS, 0, stream>>>(src, n, field,
                                                                               shift, hist);
    TL_CUDA_LAUNCHED();
    TL_CUDA_RETURN_IF(
        tl_cuda_scan(hist, hist, TL_ROWS_DIGITS * blocks, scratch, NULL, stream));
    tl_rows_scatter_kernel<Item><<<(unsigned)blocks, TL_CUDA_THREADS, 0, stream>>>(
        src, dst, n, field, shift, hist);
    TL_CUDA_LAUNCHED();
    return TL_OK;
}

/* Sorts rows a[0, n) by (b, x, y, z) over the bytes that carry bits (mask:
 * OR of each field, all rows non-negative), ping-ponging with b; *sorted
 * receives the buffer holding the result. */
static inline tl_status tl_rows_sort_coords(tl_coord *a, tl_coord *b, int64_t n,
                                           const unsigned mask[4], long long *hist,
                                           long long *scratch, cudaStream_t stream,
                                           tl_coord **sorted) {
    tl_coord *src = a, *dst = b;
    for (int field = 3; field >= 0; field--) { /* z is the least significant */
        const int bytes = tl_rows_bytes_of(mask[field]);
        for (int byte = 0; byte < bytes; byte++) {
            TL_CUDA_RETURN_IF(tl_rows_radix_pass<tl_coord>(src, dst, n, field,
                                                          byte * TL_ROWS_RADIX_BITS, hist,
                                                          scratch, stream));
            tl_coord *t = src;
            src = dst;
            dst = t;
        }
    }
    *sorted = src;
    return TL_OK;
}

/* ---- deduplication ---- */

__device__ __forceinline__ unsigned tl_rows_warp_or(unsigned v) {
    for (int d = 16; d > 0; d >>= 1) v |= __shfl_xor_sync(0xffffffffu, v, d);
    return v;
}

/* flag[j] = 1 for the one row of each distinct value that claims a slot;
 * ORs every field into info->mask (rows must be non-negative). */
static __global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_rows_dedup_kernel(const tl_coord *rows, long long n, int *slots, unsigned long long mask,
                        long long *flag, tl_rows_info *info) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    /* Every lane runs the same number of rounds: full warps for the OR. */
    const long long rounds = (n + stride - 1) / stride;
    for (long long round = 0; round < rounds; round++) {
        const long long j = round * stride + (long long)blockIdx.x * blockDim.x + threadIdx.x;
        unsigned m[4] = {0, 0, 0, 0};
        if (j < n) {
            const tl_coord q = rows[j];
            flag[j] = tl_cuda_hash_insert(slots, mask, rows, (int)j) ? 1 : 0;
            m[0] = (unsigned)q.b;
            m[1] = (unsigned)q.x;
            m[2] = (unsigned)q.y;
            m[3] = (unsigned)q.z;
        }
        for (int a = 0; a < 4; a++) {
            unsigned v = tl_rows_warp_or(m[a]);
            if ((threadIdx.x & 31) == 0 && v) atomicOr(&info->mask[a], v);
        }
    }
}

/* Kept rows, densely in row order: row j is kept iff the scan steps after it. */
static __global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_rows_compact_kernel(const tl_coord *rows, const long long *pos, long long n,
                          long long count, tl_coord *keys) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride) {
        const long long next = j + 1 < n ? pos[j + 1] : count;
        if (next > pos[j]) keys[pos[j]] = rows[j];
    }
}

/* Lookup table over keys[0, n): every row inserted; *dup (may be NULL) set
 * when a row repeats. */
static __global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_rows_table_kernel(const tl_coord *keys, long long n, int *slots, unsigned long long mask,
                        int *dup) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride) {
        if (!tl_cuda_hash_insert(slots, mask, keys, (int)j) && dup) *dup = 1;
    }
}

/* Workspace of a deduplicate-and-sort over n rows. */
struct tl_rows_unique {
    tl_rows_info *info;
    tl_coord *rows, *keys, *tmp; /* n rows each */
    int *slots;                  /* cap */
    long long *pos, *hist, *scratch;
    int64_t n, cap;
};

static inline void tl_rows_unique_layout(tl_cuda_ws *w, int64_t n, tl_rows_unique *u) {
    u->n = n;
    u->cap = tl_cuda_hash_capacity(n);
    const int64_t hist = tl_rows_hist_len(n);
    int64_t scratch = tl_cuda_scan_scratch(n);
    if (tl_cuda_scan_scratch(hist) > scratch) scratch = tl_cuda_scan_scratch(hist);
    u->info = (tl_rows_info *)tl_cuda_ws_take(w, 1, sizeof(tl_rows_info));
    u->rows = (tl_coord *)tl_cuda_ws_take(w, n, sizeof(tl_coord));
    u->keys = (tl_coord *)tl_cuda_ws_take(w, n, sizeof(tl_coord));
    u->tmp = (tl_coord *)tl_cuda_ws_take(w, n, sizeof(tl_coord));
    u->slots = (int *)tl_cuda_ws_take(w, u->cap, sizeof(int));
    u->pos = (long long *)tl_cuda_ws_take(w, n, sizeof(long long));
    u->hist = (long long *)tl_cuda_ws_take(w, hist, sizeof(long long));
    u->scratch = (long long *)tl_cuda_ws_take(w, scratch, sizeof(long long));
}

/* Deduplicates u->rows (filled by the caller's earlier kernels on the same
 * stream, info cleared before them) and reads info back: the one
 * synchronization of a unique. */
static inline tl_status tl_rows_unique_count(tl_rows_unique *u, cudaStream_t stream,
                                            tl_rows_info *info) {
    TL_CUDA_TRY(cudaMemsetAsync(u->slots, 0xFF, sizeof(int) * (size_t)u->cap, stream));
    tl_rows_dedup_kernel<<<tl_cuda_blocks(u->n), TL_CUDA_THREADS, 0, stream>>>(
        u->rows, u->n, u->slots, (unsigned long long)(u->cap - 1), u->pos, u->info);
    TL_CUDA_LAUNCHED();
    TL_CUDA_RETURN_IF(tl_cuda_scan(u->pos, u->pos, u->n, u->scratch, &u->info->count, stream));
    return tl_cuda_read_back(info, u->info, sizeof(tl_rows_info), stream);
}

/* Compacts the count unique rows and sorts them into out (count rows). */
static inline tl_status tl_rows_unique_sort(tl_rows_unique *u, const tl_rows_info *info,
                                           tl_coord *out, cudaStream_t stream) {
    if (info->count == 0) return TL_OK;
    tl_rows_compact_kernel<<<tl_cuda_blocks(u->n), TL_CUDA_THREADS, 0, stream>>>(
        u->rows, u->pos, u->n, info->count, u->keys);
    TL_CUDA_LAUNCHED();
    tl_coord *sorted;
    TL_CUDA_RETURN_IF(tl_rows_sort_coords(u->keys, u->tmp, info->count, info->mask, u->hist,
                                         u->scratch, stream, &sorted));
    TL_CUDA_TRY(cudaMemcpyAsync(out, sorted, sizeof(tl_coord) * (size_t)info->count,
                                cudaMemcpyDeviceToDevice, stream));
    return TL_OK;
}

/* Status of a packed rejected item, with its index in *bad. */
static inline tl_status tl_rows_bad_status(unsigned long long key, int64_t *bad) {
    if (bad) *bad = (int64_t)(key >> 2);
    return (key & 3ull) == TL_ROWS_BAD_OVERFLOW ? TL_ERR_OVERFLOW : TL_ERR_INVALID;
}

#endif
