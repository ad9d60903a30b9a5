/* Row gather and scatter-add of the gather-scatter dataflow.
 *
 * The dataflow itself runs in torch_lattice/ops/conv_cuda.py: one gather of
 * x[pair_in] for every kernel row at once, one library GEMM (cuBLAS through
 * torch) per non-empty kernel row, and one scatter-add of all products into
 * y[pair_out].  These two kernels are the memory-bound half; the GEMMs run at
 * library speed.
 *
 * Gather copies bytes: each row is moved in the widest unit (16, 8, 4 or 2
 * bytes) that divides the row's byte size and both pointers' alignment, so
 * rows need no masked tail.  Scatter-add converts each product to fp32 and
 * adds it with atomicAdd, because pairs of different kernel rows meet at the
 * same output row. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tl_cuda_common.cuh"

/* dst[r] = src[idx[r]] for r < n_rows, each row row_units units of V; an
 * index outside [0, n_src) gives a zero row. */
template <typename V>
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_gather_rows_kernel(const V *__restrict__ src, long long n_src, long long row_units,
                          const int *__restrict__ idx, long long n_rows, V *__restrict__ dst) {
    const long long total = n_rows * row_units;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const long long r = e / row_units, u = e - r * row_units;
        const long long s = idx[r];
        V v{};
        if (s >= 0 && s < n_src) v = src[s * row_units + u];
        dst[e] = v;
    }
}

template <typename T> __device__ __forceinline__ float tl_gs_to_f32(T v);
template <> __device__ __forceinline__ float tl_gs_to_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float tl_gs_to_f32<__half>(__half v) {
    return __half2float(v);
}
template <> __device__ __forceinline__ float tl_gs_to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}

/* acc[idx[r], :] += src[r, :] in fp32 for r < n_rows; an index outside
 * [0, n_dst) drops its row. */
template <typename T>
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_scatter_add_rows_kernel(const T *__restrict__ src, long long n_rows, long long c,
                               const int *__restrict__ idx, long long n_dst, float *acc) {
    const long long total = n_rows * c;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const long long r = e / c, col = e - r * c;
        const long long o = idx[r];
        if (o >= 0 && o < n_dst) atomicAdd(acc + o * c + col, tl_gs_to_f32<T>(src[e]));
    }
}

/* Widest copy unit (16, 8, 4 or 2 bytes, else 1) dividing the row size and
 * both addresses. */
static int tl_gather_unit(const void *src, const void *dst, int64_t row_bytes) {
    const uintptr_t bits = (uintptr_t)src | (uintptr_t)dst | (uintptr_t)row_bytes;
    for (int unit = 16; unit > 1; unit >>= 1)
        if ((bits & (uintptr_t)(unit - 1)) == 0) return unit;
    return 1;
}

template <typename V>
static tl_status tl_gather_launch(const tl_ctx *ctx, const void *src, int64_t n_src,
                                  int64_t row_bytes, const int32_t *idx, int64_t n_rows,
                                  void *dst, cudaStream_t stream) {
    TL_CUDA_ERRORS_TO(ctx);
    const int64_t units = row_bytes / (int64_t)sizeof(V);
    tl_gather_rows_kernel<V><<<tl_cuda_blocks(n_rows * units), TL_CUDA_THREADS, 0, stream>>>(
        (const V *)src, n_src, units, idx, n_rows, (V *)dst);
    TL_CUDA_LAUNCHED();
    return TL_OK;
}

/* Sizes shared by both entry points: rows and channels fit, and
 * rows * channels * 8 bytes does not overflow. */
static tl_status tl_gs_check_sizes(int64_t n_rows, int64_t n_other, int64_t c) {
    if (n_rows < 0 || n_other < 0 || c < 0) return TL_ERR_INVALID;
    if (n_other > TL_ROW_MAX) return TL_ERR_OVERFLOW;
    if (c > 0 && n_rows > INT64_MAX / 8 / c) return TL_ERR_OVERFLOW;
    return TL_OK;
}

extern "C" tl_status tl_cuda_gather_rows(const tl_ctx *ctx, tl_dtype dtype, const void *src,
                                         int64_t n_src, int64_t c, const int32_t *idx,
                                         int64_t n_rows, void *dst) {
    if (!ctx) return TL_ERR_INVALID;
    TL_CUDA_RETURN_IF(tl_gs_check_sizes(n_rows, n_src, c));
    if (dtype != TL_F32 && dtype != TL_F64 && dtype != TL_F16 && dtype != TL_BF16)
        return TL_ERR_UNSUPPORTED;
    const int64_t row_bytes = c * tl_dtype_bytes(dtype);
    if (n_rows * row_bytes == 0) return TL_OK;
    if (!idx || !dst || (n_src > 0 && !src)) return TL_ERR_INVALID;
    cudaStream_t stream;
    tl_cuda_scope scope;
    TL_CUDA_RETURN_IF(scope.enter(ctx, &stream));
    switch (tl_gather_unit(src, dst, row_bytes)) {
    case 16: return tl_gather_launch<uint4>(ctx, src, n_src, row_bytes, idx, n_rows, dst, stream);
    case 8: return tl_gather_launch<uint2>(ctx, src, n_src, row_bytes, idx, n_rows, dst, stream);
    case 4:
        return tl_gather_launch<unsigned>(ctx, src, n_src, row_bytes, idx, n_rows, dst, stream);
    case 2:
        return tl_gather_launch<unsigned short>(ctx, src, n_src, row_bytes, idx, n_rows, dst,
                                                stream);
    default:
        return tl_gather_launch<unsigned char>(ctx, src, n_src, row_bytes, idx, n_rows, dst,
                                               stream);
    }
}

template <typename T>
static tl_status tl_scatter_launch(const tl_ctx *ctx, const void *src, int64_t n_rows, int64_t c,
                                   const int32_t *idx, int64_t n_dst, float *acc,
                                   cudaStream_t stream) {
    TL_CUDA_ERRORS_TO(ctx);
    tl_scatter_add_rows_kernel<T><<<tl_cuda_blocks(n_rows * c), TL_CUDA_THREADS, 0, stream>>>(
        (const T *)src, n_rows, c, idx, n_dst, acc);
    TL_CUDA_LAUNCHED();
    return TL_OK;
}

extern "C" tl_status tl_cuda_scatter_add_rows(const tl_ctx *ctx, tl_dtype dtype, const void *src,
                                              int64_t n_rows, int64_t c, const int32_t *idx,
                                              int64_t n_dst, float *acc) {
    if (!ctx) return TL_ERR_INVALID;
    TL_CUDA_RETURN_IF(tl_gs_check_sizes(n_rows, n_dst, c));
    if (dtype != TL_F32 && dtype != TL_F16 && dtype != TL_BF16) return TL_ERR_UNSUPPORTED;
    if (n_rows * c == 0) return TL_OK;
    if (!src || !idx || (n_dst > 0 && !acc)) return TL_ERR_INVALID;
    cudaStream_t stream;
    tl_cuda_scope scope;
    TL_CUDA_RETURN_IF(scope.enter(ctx, &stream));
    switch (dtype) {
    case TL_F16:
        return tl_scatter_launch<__half>(ctx, src, n_rows, c, idx, n_dst, acc, stream);
    case TL_BF16:
        return tl_scatter_launch<__nv_bfloat16>(ctx, src, n_rows, c, idx, n_dst, acc, stream);
    default: return tl_scatter_launch<float>(ctx, src, n_rows, c, idx, n_dst, acc, stream);
    }
}
