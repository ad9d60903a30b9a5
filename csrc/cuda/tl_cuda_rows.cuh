/* Device helpers for coordinate rows and features, shared by tl_cuda_voxel.cu,
 * tl_cuda_pool.cu, tl_cuda_generative.cu: feature loads and stores in fp32
 * (fp64 for double), the read-back record, and deduplication of coordinate
 * rows through the hash table of tl_cuda_hash.cuh, sorted by the radix sort
 * of tl_cuda_radix.cuh. */
#ifndef TL_CUDA_ROWS_CUH
#define TL_CUDA_ROWS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tl_cuda_hash.cuh"
#include "tl_cuda_radix.cuh"

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

/* ---- deduplication ---- */

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
            unsigned v = tl_warp_or(m[a]);
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
    const int64_t hist = tl_radix_hist_len(n);
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
    TL_CUDA_RETURN_IF(tl_radix_sort_coords(u->keys, u->tmp, info->count, info->mask, u->hist,
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
