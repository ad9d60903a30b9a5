/* Tile core shared by the three CUDA dataflows.
 *
 * One block of TL_CUDA_THREADS threads computes a TL_BM x TL_BN tile of
 * C = sum A B with the reduction staged through shared memory TL_BK at a
 * time.  The dataflows differ only in how they fill the staged tiles (which
 * rows of x / w / dy they read, through nbr or pair lists) and where the
 * finished tile goes (overwrite, add, atomicAdd), so this header holds:
 *   - dtype conversion (fp32, fp16, bf16 storage; fp32 in shared memory),
 *   - the staged-tile loaders,
 *   - two accumulators over the staged tiles: fp32 FMA, and TF32 tensor cores
 *     (WMMA m16n16k8, only when the caller allows TF32 and the device is
 *     sm_80 or newer); both leave the tile in shared memory for the epilogue.
 */
#ifndef TL_CUDA_GEMM_CUH
#define TL_CUDA_GEMM_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include "tl_cuda_common.cuh"

#define TL_BM 64
#define TL_BN 64
#define TL_BK 16

/* Target resident blocks per SM when a reduction is split over blocks. */
#define TL_SPLIT_BLOCKS_PER_SM 8
/* A split reduction gives each block at least this many rows. */
#define TL_SPLIT_MIN_ROWS 256

template <typename T> __device__ __forceinline__ float tl_to_f32(T v);
template <> __device__ __forceinline__ float tl_to_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float tl_to_f32<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float tl_to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}

template <typename T> __device__ __forceinline__ T tl_from_f32(float v);
template <> __device__ __forceinline__ float tl_from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half tl_from_f32<__half>(float v) {
    return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 tl_from_f32<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

/* Staged operands and the finished tile; 32-byte aligned for WMMA. */
struct __align__(128) tl_tile_smem {
    float a[TL_BK][TL_BM]; /* a[kk][m] = A(m, k0 + kk) */
    float b[TL_BK][TL_BN]; /* b[kk][j] = B(k0 + kk, j) */
    float c[TL_BM][TL_BN];
};

/* a[kk][m] = src[rows[m] * ld + k0 + kk] (0 where rows[m] < 0 or k0 + kk >= kdim):
 * TL_BM gathered rows, TL_BK consecutive columns of each. */
template <typename T>
__device__ __forceinline__ void tl_stage_rows(tl_tile_smem &s, const T *src, long long ld,
                                              const long long *rows, long long k0,
                                              long long kdim) {
    const int m = threadIdx.x / 4, kq = (threadIdx.x % 4) * 4;
    const long long r = rows[m];
    for (int q = 0; q < 4; q++) {
        const long long col = k0 + kq + q;
        s.a[kq + q][m] = (r >= 0 && col < kdim) ? tl_to_f32(src[r * ld + col]) : 0.0f;
    }
}

/* dst[kk][j] = src[rows[kk] * ld + c0 + j] (0 where rows[kk] < 0 or c0 + j >= ncols):
 * TL_BK gathered rows, TL_BN (= TL_BM) consecutive columns of each. */
template <typename T>
__device__ __forceinline__ void tl_stage_cols(float (*dst)[TL_BN], const T *src, long long ld,
                                              const long long *rows, long long c0,
                                              long long ncols) {
    const int kk = threadIdx.x / 16, jq = (threadIdx.x % 16) * 4;
    const long long r = rows[kk];
    for (int q = 0; q < 4; q++) {
        const long long col = c0 + jq + q;
        dst[kk][jq + q] = (r >= 0 && col < ncols) ? tl_to_f32(src[r * ld + col]) : 0.0f;
    }
}

/* b[kk][j] = w[(k0 + kk) * ld + c0 + j]: a dense row-major weight block. */
template <typename T>
__device__ __forceinline__ void tl_stage_weight(tl_tile_smem &s, const T *w, long long ld,
                                                long long k0, long long kdim, long long c0,
                                                long long ncols) {
    const int kk = threadIdx.x / 16, jq = (threadIdx.x % 16) * 4;
    const long long row = k0 + kk;
    for (int q = 0; q < 4; q++) {
        const long long col = c0 + jq + q;
        s.b[kk][jq + q] = (row < kdim && col < ncols) ? tl_to_f32(w[row * ld + col]) : 0.0f;
    }
}

/* fp32 FMA accumulator: thread (ty, tx) owns rows ty*4.. and columns tx*4.. */
struct tl_acc_fma {
    float v[4][4];
    __device__ __forceinline__ void zero() {
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) v[i][j] = 0.0f;
    }
    __device__ __forceinline__ void step(const tl_tile_smem &s) {
        const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
        for (int kk = 0; kk < TL_BK; kk++) {
            float a[4], b[4];
            for (int i = 0; i < 4; i++) a[i] = s.a[kk][ty * 4 + i];
            for (int j = 0; j < 4; j++) b[j] = s.b[kk][tx * 4 + j];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) v[i][j] = fmaf(a[i], b[j], v[i][j]);
        }
    }
    __device__ __forceinline__ void store(tl_tile_smem &s) const {
        const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) s.c[ty * 4 + i][tx * 4 + j] = v[i][j];
    }
};

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
/* TF32 tensor-core accumulator: warp w owns rows (w/2)*16.. and columns
 * (w%2)*32.., two 16x16 fp32 accumulator fragments; inputs are rounded to
 * TF32 as they are loaded from shared memory. */
struct tl_acc_tf32 {
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 8, float> c[2];
    __device__ __forceinline__ void zero() {
        nvcuda::wmma::fill_fragment(c[0], 0.0f);
        nvcuda::wmma::fill_fragment(c[1], 0.0f);
    }
    __device__ __forceinline__ void step(const tl_tile_smem &s) {
        using namespace nvcuda;
        const int warp = threadIdx.x / 32, m0 = (warp / 2) * 16, n0 = (warp % 2) * 32;
        for (int kk = 0; kk < TL_BK; kk += 8) {
            wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major> a;
            wmma::load_matrix_sync(a, &s.a[kk][m0], TL_BM);
            for (int e = 0; e < a.num_elements; e++) a.x[e] = wmma::__float_to_tf32(a.x[e]);
            for (int f = 0; f < 2; f++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major>
                    b;
                wmma::load_matrix_sync(b, &s.b[kk][n0 + 16 * f], TL_BN);
                for (int e = 0; e < b.num_elements; e++) b.x[e] = wmma::__float_to_tf32(b.x[e]);
                wmma::mma_sync(c[f], a, b, c[f]);
            }
        }
    }
    __device__ __forceinline__ void store(tl_tile_smem &s) const {
        const int warp = threadIdx.x / 32, m0 = (warp / 2) * 16, n0 = (warp % 2) * 32;
        for (int f = 0; f < 2; f++)
            nvcuda::wmma::store_matrix_sync(&s.c[m0][n0 + 16 * f], c[f], TL_BN,
                                            nvcuda::wmma::mem_row_major);
    }
};
#else
/* Before sm_80 there are no TF32 tensor cores: fall back to fp32 FMA. */
typedef tl_acc_fma tl_acc_tf32;
#endif

template <bool TF32> struct tl_acc_select {
    typedef tl_acc_fma type;
};
template <> struct tl_acc_select<true> {
    typedef tl_acc_tf32 type;
};

/* fp32 accumulator -> output dtype (y or dw of a half-precision call). */
template <typename T>
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_cast_kernel(const float *src, T *dst, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride)
        dst[e] = tl_from_f32<T>(src[e]);
}

/* fp32 accumulator of a half-precision call -> its output. */
struct tl_cast_call { /* for tl_dispatch_dtype */
    const float *src;
    void *dst;
    int64_t n;
    cudaStream_t stream;

    template <typename T, bool TF32> tl_status run() {
        tl_cast_kernel<T><<<tl_cuda_blocks(n), TL_CUDA_THREADS, 0, stream>>>(src, (T *)dst, n);
        TL_CUDA_LAUNCHED();
        return TL_OK;
    }
};

/* Blocks a split reduction over `rows` rows is cut into, so that about
 * TL_SPLIT_BLOCKS_PER_SM blocks per SM run when `tiles` output tiles exist. */
static inline tl_status tl_split_chunks(int device, int64_t rows, int64_t tiles,
                                        int64_t *chunk_rows, int64_t *chunks) {
    int sms = 1;
    TL_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    int64_t want = tl_cuda_ceil_div((int64_t)sms * TL_SPLIT_BLOCKS_PER_SM, tiles > 0 ? tiles : 1);
    int64_t most = tl_cuda_ceil_div(rows, TL_SPLIT_MIN_ROWS);
    if (want > most) want = most;
    if (want < 1) want = 1;
    int64_t per = tl_cuda_ceil_div(rows, want);
    per = tl_cuda_ceil_div(per, TL_BK) * TL_BK;
    if (per < TL_BK) per = TL_BK;
    *chunk_rows = per;
    *chunks = tl_cuda_ceil_div(rows, per);
    if (*chunks < 1) *chunks = 1;
    return TL_OK;
}

/* Dtype of a conv call as a template argument: F is a functor template whose
 * run<T, TF32>() does the work. */
template <typename F>
static inline tl_status tl_dispatch_dtype(tl_dtype dtype, int allow_tf32, F &f) {
    switch (dtype) {
    case TL_F32: return allow_tf32 ? f.template run<float, true>() : f.template run<float, false>();
    case TL_F16: return f.template run<__half, false>();
    case TL_BF16: return f.template run<__nv_bfloat16, false>();
    default: return TL_ERR_UNSUPPORTED;
    }
}

/* Checks shared by every dataflow entry point (host side, no device reads). */
static inline tl_status tl_conv_check(const tl_conv_desc *d, const void *a, const void *b,
                                      const void *out, bool weight_grad) {
    if (!d) return TL_ERR_INVALID;
    TL_CUDA_RETURN_IF(tl_conv_desc_check(d));
    if (d->dtype != TL_F32 && d->dtype != TL_F16 && d->dtype != TL_BF16)
        return TL_ERR_UNSUPPORTED;
    const bool x_empty = d->n_in == 0 || d->c_in == 0;
    const bool w_empty = d->c_in == 0 || d->c_out == 0;
    const bool y_empty = d->n_out == 0 || d->c_out == 0;
    if (!a && !x_empty) return TL_ERR_INVALID;
    if (!b && !(weight_grad ? y_empty : w_empty)) return TL_ERR_INVALID;
    if (!out && !(weight_grad ? w_empty : y_empty)) return TL_ERR_INVALID;
    return TL_OK;
}

/* Workspace of one dataflow call.  fp32 calls accumulate straight into their
 * output (acc == NULL here); half calls accumulate in fp32 and cast once. */
struct tl_conv_layout {
    float *acc;       /* (n_out, c_out) or (k, c_in, c_out) fp32, half dtypes only */
    void *gather_x;   /* gather-scatter: (rows_cap, c_in) */
    void *gather_y;   /* gather-scatter weight gradient: (rows_cap, c_out) */
    int64_t rows_cap; /* most pairs one kernel row can hold: min(n_in, n_out, P) */
};

static inline tl_cuda_ws tl_conv_layout_of(void *base, tl_cuda_dataflow df, bool weight_grad,
                                           const tl_conv_desc *d, int64_t n_pairs,
                                           tl_conv_layout *l) {
    tl_cuda_ws w = tl_cuda_ws_begin(base);
    int64_t cap = d->n_in < d->n_out ? d->n_in : d->n_out;
    if (df != TL_CUDA_IMPLICIT_GEMM && n_pairs < cap) cap = n_pairs;
    l->rows_cap = cap < 0 ? 0 : cap;
    int64_t acc = 0;
    if (d->dtype != TL_F32)
        acc = weight_grad ? d->k * d->c_in * d->c_out
                          : (df == TL_CUDA_IMPLICIT_GEMM ? 0 : d->n_out * d->c_out);
    l->acc = acc ? (float *)tl_cuda_ws_take(&w, acc, sizeof(float)) : NULL;
    l->gather_x = l->gather_y = NULL;
    if (df == TL_CUDA_GATHER_SCATTER) {
        const size_t es = (size_t)tl_dtype_bytes(d->dtype);
        l->gather_x = tl_cuda_ws_take(&w, l->rows_cap * d->c_in, es);
        if (weight_grad) l->gather_y = tl_cuda_ws_take(&w, l->rows_cap * d->c_out, es);
    }
    return w;
}

/* Launch of a 1-D grid of `blocks` tile blocks (at most INT32_MAX). */
static inline tl_status tl_tile_grid(int64_t blocks, unsigned *grid) {
    if (blocks < 1 || blocks > INT32_MAX) return TL_ERR_OVERFLOW;
    *grid = (unsigned)blocks;
    return TL_OK;
}

/* The frame shared by every dataflow call that accumulates in fp32: begin()
 * lays out the workspace and checks it is big enough, makes the device
 * current, and zeroes the accumulator (the fp32 output itself, or fp32
 * scratch for half types); finish() casts that scratch into the half output.
 * size == 0 after begin(): the output is empty, nothing more to do.  Lives
 * on the entry point's stack: its scope restores the caller's device. */
struct tl_conv_frame {
    tl_cuda_scope scope;
    tl_conv_layout l;
    cudaStream_t stream;
    float *acc;
    int64_t size;
    void *out;
    tl_dtype dtype;

    tl_status begin(const tl_ctx *ctx, tl_cuda_dataflow df, bool weight_grad,
                    const tl_conv_desc *d, int64_t n_pairs, void *workspace, void *out_) {
        tl_cuda_ws ws = tl_conv_layout_of(workspace, df, weight_grad, d, n_pairs, &l);
        if (ws.overflow) return TL_ERR_OVERFLOW;
        if (!tl_cuda_ws_ok(workspace, ws.used)) return TL_ERR_INVALID;
        TL_CUDA_RETURN_IF(scope.enter(ctx, &stream));
        out = out_;
        dtype = d->dtype;
        size = weight_grad ? d->k * d->c_in * d->c_out : d->n_out * d->c_out;
        acc = l.acc ? l.acc : (float *)out;
        if (size > 0) TL_CUDA_TRY(cudaMemsetAsync(acc, 0, sizeof(float) * (size_t)size, stream));
        return TL_OK;
    }

    tl_status finish() {
        if (!l.acc) return TL_OK;
        tl_cast_call cast = {l.acc, out, size, stream};
        return tl_dispatch_dtype(dtype, 0, cast);
    }
};

#endif
