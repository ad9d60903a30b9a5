/* Tile core shared by the three CUDA dataflows.
 *
 * One block of TL_CUDA_THREADS threads computes a TL_BM x TL_BN tile of
 * C = sum A B with the reduction staged through shared memory TL_BK at a
 * time.  The dataflows differ only in how they fill the staged tiles (which
 * rows of x / w / dy they read, through nbr or pair lists) and where the
 * finished tile goes (overwrite, add, atomicAdd), so this header holds:
 *   - dtype conversion (fp32, fp16, bf16 storage),
 *   - the staged-tile loaders (tl_tile_load), with 16-byte global loads where
 *     a row's channel count and base pointer allow it (checked on the host,
 *     passed as TL_VEC_* flags) and masked scalar loads otherwise; a slice is
 *     fetched into registers first, so the next one is in flight while the
 *     current one is multiplied,
 *   - three accumulators over the staged tiles, picked by tl_core<T, TF32, AK>:
 *     fp32 FMA (fp32 storage), TF32 tensor cores (WMMA m16n16k8, fp32 only
 *     when the caller allows TF32) and fp16 / bf16 tensor cores (WMMA
 *     m16n16k16, fp32 accumulation).  Tensor cores need sm_80; older
 *     devices compile the FMA accumulator in their place.  Each leaves the
 *     finished tile in shared memory (fp32) for the epilogue.
 * Staged operands keep the storage type (the tensor cores read fp16 / bf16
 * as they are; TF32 rounds fp32 as it loads a fragment). */
#ifndef TL_CUDA_GEMM_CUH
#define TL_CUDA_GEMM_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include "tl_cuda_common.cuh"
#include "tl_cuda_radix.cuh"

#define TL_BM 64
#define TL_BN 64
#define TL_BK 32

/* Target resident blocks per SM when a reduction is split over blocks. */
#define TL_SPLIT_BLOCKS_PER_SM 8
/* A split reduction gives each block at least this many rows. */
#define TL_SPLIT_MIN_ROWS 256

/* Bits of a kernel's `vec` argument: which sources may be read 16 bytes at
 * a time (base 16-byte aligned and row length a multiple of 16 bytes). */
#define TL_VEC_A 1 /* x, or the gather buffer / x of a weight gradient */
#define TL_VEC_B 2 /* w, or dy of a weight gradient */
#define TL_VEC_C 4 /* the fp32 accumulator (vector atomics, sm_90) */

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

/* Host side: may rows of `ld` elements of `elem` bytes starting at `base`
 * be read 16 bytes at a time? */
static inline bool tl_vec_ok(const void *base, int64_t ld, int64_t elem) {
    return base != NULL && (uintptr_t)base % 16 == 0 && (ld * elem) % 16 == 0;
}

/* Elements of S per 16 bytes: one vector load, and the skew added to every
 * staged row so that the 8 rows one ldmatrix phase reads fall in different
 * banks. */
template <typename S> struct tl_vec_width {
    static constexpr int value = 16 / (int)sizeof(S);
};

/* Staged operands and the finished tile, all rows skewed by 16 bytes; 128-byte
 * aligned, so every WMMA fragment pointer is 32-byte aligned.  A is either
 * row-major, a[m][kk] (AK = false: the forward, whose gathered rows run
 * along the reduction), or k-major, a[kk][m] (AK = true: the weight
 * gradient, X^T).  b[kk][j] = B(k0 + kk, j).  The staged type is the
 * storage type (fp16 / bf16 for tensor cores, fp32 otherwise). */
template <typename S, bool AK> struct __align__(128) tl_tile_smem {
    static constexpr int PAD = tl_vec_width<S>::value;
    static constexpr int LDA = (AK ? TL_BM : TL_BK) + PAD;
    static constexpr int LDB = TL_BN + PAD;
    static constexpr int LDC = TL_BN + 4;
    S a[AK ? TL_BK : TL_BM][LDA];
    S b[TL_BK][LDB];
    float c[TL_BM][LDC];
    __device__ __forceinline__ const S &at(int m, int kk) const {
        return AK ? a[kk][m] : a[m][kk];
    }
};

/* Raw bits of one element of S (the loaders copy bits, never convert). */
template <int BYTES> struct tl_bits;
template <> struct tl_bits<2> {
    typedef unsigned short type;
};
template <> struct tl_bits<4> {
    typedef unsigned int type;
};

/* The 16 bytes at p, elements at index >= avail read as 0 (+0.0 in every
 * dtype); one 16-byte load when `vec` and the whole run is in range (then p
 * is 16-byte aligned).  p is not dereferenced when avail <= 0. */
template <typename S>
__device__ __forceinline__ uint4 tl_load16(const S *p, long long avail, bool vec) {
    constexpr int V = tl_vec_width<S>::value;
    typedef typename tl_bits<sizeof(S)>::type U;
    if (vec && avail >= V) return __ldg(reinterpret_cast<const uint4 *>(p));
    union {
        uint4 u;
        U e[V];
    } r;
    const U *q = reinterpret_cast<const U *>(p);
#pragma unroll
    for (int i = 0; i < V; i++) r.e[i] = i < avail ? q[i] : (U)0;
    return r.u;
}

/* One staged NR x NC block of S, fetched from global memory into registers
 * (so the next block's loads are in flight while the current one is
 * multiplied) and then committed to shared memory.  Row i of the block is
 * source row rows[i] (rows != NULL; < 0: a zero row) or else rbase + i while
 * below rlim (a dense block); its columns are col0 .. col0 + NC - 1, those
 * at or past ncols read as 0.  col0 is a multiple of 16 bytes; `vec`
 * requires tl_vec_ok(src, ld). */
template <typename S, int NR, int NC> struct tl_tile_load {
    static constexpr int V = tl_vec_width<S>::value, RUNS = NC / V;
    static constexpr int ITERS = NR * RUNS / TL_CUDA_THREADS;
    static_assert(NC % V == 0 && (NR * RUNS) % TL_CUDA_THREADS == 0, "whole passes");
    uint4 r[ITERS];

    __device__ __forceinline__ void fetch(const S *src, long long ld, const long long *rows,
                                          long long rbase, long long rlim, long long col0,
                                          long long ncols, bool vec) {
#pragma unroll
        for (int it = 0; it < ITERS; it++) {
            const int e = threadIdx.x + it * TL_CUDA_THREADS, i = e / RUNS, j = (e % RUNS) * V;
            const long long row = rows ? rows[i] : (rbase + i < rlim ? rbase + i : -1);
            const long long col = col0 + j, avail = row >= 0 ? ncols - col : 0;
            r[it] = tl_load16(avail > 0 ? src + row * ld + col : src, avail, vec);
        }
    }
    template <int LD> __device__ __forceinline__ void commit(S (*dst)[LD]) const {
#pragma unroll
        for (int it = 0; it < ITERS; it++) {
            const int e = threadIdx.x + it * TL_CUDA_THREADS, i = e / RUNS, j = (e % RUNS) * V;
            *reinterpret_cast<uint4 *>(&dst[i][j]) = r[it];
        }
    }
};

/* fp32 FMA accumulator: thread (ty, tx) owns rows ty*4.. and columns tx*4.. */
template <typename S, bool AK> struct tl_acc_fma {
    float v[4][4];
    __device__ __forceinline__ void zero() {
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) v[i][j] = 0.0f;
    }
    __device__ __forceinline__ void step(const tl_tile_smem<S, AK> &s) {
        const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
        for (int kk = 0; kk < TL_BK; kk++) {
            float a[4], b[4];
            for (int i = 0; i < 4; i++) a[i] = tl_to_f32<S>(s.at(ty * 4 + i, kk));
            for (int j = 0; j < 4; j++) b[j] = tl_to_f32<S>(s.b[kk][tx * 4 + j]);
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) v[i][j] = fmaf(a[i], b[j], v[i][j]);
        }
    }
    __device__ __forceinline__ void store(tl_tile_smem<S, AK> &s) const {
        const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) s.c[ty * 4 + i][tx * 4 + j] = v[i][j];
    }
};

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
template <bool AK> struct tl_a_layout {
    typedef nvcuda::wmma::row_major type;
};
template <> struct tl_a_layout<true> {
    typedef nvcuda::wmma::col_major type;
};

/* TF32 fragments are rounded from the fp32 values they were loaded with. */
template <typename FS> struct tl_round {
    template <typename F> static __device__ __forceinline__ void run(F &) {}
};
template <> struct tl_round<nvcuda::wmma::precision::tf32> {
    template <typename F> static __device__ __forceinline__ void run(F &f) {
        for (int e = 0; e < f.num_elements; e++) f.x[e] = nvcuda::wmma::__float_to_tf32(f.x[e]);
    }
};

/* Tensor-core accumulator over operands staged as S: warp w owns rows
 * (w/2)*16.. and columns (w%2)*32.., two 16x16 fp32 accumulator fragments.
 * FS is the fragment element type (precision::tf32 for fp32 storage, whose
 * inputs are rounded to TF32 as they are loaded; else S itself) and KF the
 * fragment depth (8 for TF32, 16 for fp16 / bf16). */
template <typename S, typename FS, int KF, bool AK> struct tl_acc_wmma {
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, KF, float> c[2];
    __device__ __forceinline__ void zero() {
        nvcuda::wmma::fill_fragment(c[0], 0.0f);
        nvcuda::wmma::fill_fragment(c[1], 0.0f);
    }
    __device__ __forceinline__ void step(const tl_tile_smem<S, AK> &s) {
        using namespace nvcuda;
        typedef tl_tile_smem<S, AK> sm;
        const int warp = threadIdx.x / 32, m0 = (warp / 2) * 16, n0 = (warp % 2) * 32;
#pragma unroll
        for (int kk = 0; kk < TL_BK; kk += KF) {
            wmma::fragment<wmma::matrix_a, 16, 16, KF, FS, typename tl_a_layout<AK>::type> a;
            wmma::load_matrix_sync(a, AK ? &s.a[kk][m0] : &s.a[m0][kk], sm::LDA);
            tl_round<FS>::run(a);
#pragma unroll
            for (int f = 0; f < 2; f++) {
                wmma::fragment<wmma::matrix_b, 16, 16, KF, FS, wmma::row_major> b;
                wmma::load_matrix_sync(b, &s.b[kk][n0 + 16 * f], sm::LDB);
                tl_round<FS>::run(b);
                wmma::mma_sync(c[f], a, b, c[f]);
            }
        }
    }
    __device__ __forceinline__ void store(tl_tile_smem<S, AK> &s) const {
        const int warp = threadIdx.x / 32, m0 = (warp / 2) * 16, n0 = (warp % 2) * 32;
        for (int f = 0; f < 2; f++)
            nvcuda::wmma::store_matrix_sync(&s.c[m0][n0 + 16 * f], c[f],
                                            tl_tile_smem<S, AK>::LDC,
                                            nvcuda::wmma::mem_row_major);
    }
};

template <bool AK>
using tl_acc_tf32 = tl_acc_wmma<float, nvcuda::wmma::precision::tf32, 8, AK>;
template <typename T, bool AK> using tl_acc_hmma = tl_acc_wmma<T, T, 16, AK>;
#else
/* Before sm_80 (no TF32 or bf16 tensor cores): fp32 FMA in their place. */
template <bool AK> using tl_acc_tf32 = tl_acc_fma<float, AK>;
template <typename T, bool AK> using tl_acc_hmma = tl_acc_fma<T, AK>;
#endif

/* The tile core of one call: accumulator over tl_tile_smem<T, AK>. */
template <typename T, bool TF32, bool AK> struct tl_core {
    typedef tl_acc_hmma<T, AK> acc; /* fp16, bf16 */
};
template <bool AK> struct tl_core<float, false, AK> {
    typedef tl_acc_fma<float, AK> acc;
};
template <bool AK> struct tl_core<float, true, AK> {
    typedef tl_acc_tf32<AK> acc;
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
static inline tl_status tl_dispatch_dtype(tl_dtype dtype, bool allow_tf32, F &f) {
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

/* Implicit-GEMM forward: output rows are reordered by their neighbour
 * bitmask (bit n: a neighbour through kernel row n) when there are enough of
 * them to fill many tiles and the mask fits 32 bits: the order is n_out
 * tl_kv items (mask, output row), sorted by mask. */
#define TL_IG_SORT_MIN_ROWS 4096

static inline bool tl_ig_sorted(tl_cuda_dataflow df, bool weight_grad, const tl_conv_desc *d) {
    return df == TL_CUDA_IMPLICIT_GEMM && !weight_grad && d->n_out >= TL_IG_SORT_MIN_ROWS &&
           d->n_out <= INT32_MAX && d->k > 1 && d->k <= 32;
}

/* The output rows of implicit-GEMM forward tile o0 (TL_BM of them): outs[i]
 * = order[o0 + i].val (sorted) or o0 + i (order NULL), -1 past n_out, written
 * by threads < TL_BM (whole warps); returns to every thread, after a
 * barrier, the union of their neighbour masks (0 unsorted).  parts: TL_BM /
 * 32 shared words. */
__device__ __forceinline__ unsigned tl_ig_tile_rows(const tl_kv *order, long long n_out,
                                                    long long o0, long long *outs,
                                                    unsigned *parts) {
    if (threadIdx.x < TL_BM) { /* whole warps: the warp reduction has every lane */
        const long long j = o0 + threadIdx.x;
        long long o = -1;
        unsigned m = 0;
        if (j < n_out) {
            o = order ? (long long)order[j].val : j;
            if (order) m = order[j].key;
        }
        outs[threadIdx.x] = o;
        m = tl_warp_or(m);
        if ((threadIdx.x & 31) == 0) parts[threadIdx.x / 32] = m;
    }
    __syncthreads();
    unsigned used = 0;
    for (int i = 0; i < TL_BM / 32; i++) used |= parts[i];
    return used;
}

/* Workspace of one dataflow call.  fp32 calls accumulate straight into their
 * output (acc == NULL here); half calls accumulate in fp32 and cast once.
 * A call given its map-derived data (`kept`: tl_cuda_conv_derive) needs no
 * scratch to derive it. */
struct tl_conv_layout {
    float *acc;       /* (n_out, c_out) or (k, c_in, c_out) fp32, half dtypes only */
    void *gather_x;   /* gather-scatter: (rows_cap, c_in) */
    void *gather_y;   /* gather-scatter weight gradient: (rows_cap, c_out) */
    int64_t rows_cap; /* most pairs one kernel row can hold: min(n_in, n_out, P) */
    long long *tiles; /* fetch-on-demand: (k + 1) tile starts per kernel row */
    long long *scan;  /* fetch-on-demand: tl_cuda_scan scratch for k values */
    /* Sorted implicit-GEMM forward (tl_ig_sorted): the order's items,
     * double-buffered by the radix passes, their per-block digit counts
     * (tl_radix_hist_len) and the counts' tl_cuda_scan scratch. */
    tl_kv *sort_items[2];
    long long *sort_hist, *sort_scan;
};

static inline tl_cuda_ws tl_conv_layout_of(void *base, tl_cuda_dataflow df, bool weight_grad,
                                           const tl_conv_desc *d, int64_t n_pairs, bool kept,
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
    l->tiles = l->scan = NULL;
    if (df == TL_CUDA_FETCH_ON_DEMAND && !kept) {
        l->tiles = (long long *)tl_cuda_ws_take(&w, d->k + 1, sizeof(long long));
        l->scan = (long long *)tl_cuda_ws_take(&w, tl_cuda_scan_scratch(d->k), sizeof(long long));
    }
    if (df == TL_CUDA_GATHER_SCATTER) {
        const size_t es = (size_t)tl_dtype_bytes(d->dtype);
        l->gather_x = tl_cuda_ws_take(&w, l->rows_cap * d->c_in, es);
        if (weight_grad) l->gather_y = tl_cuda_ws_take(&w, l->rows_cap * d->c_out, es);
    }
    l->sort_items[0] = l->sort_items[1] = NULL;
    l->sort_hist = l->sort_scan = NULL;
    if (tl_ig_sorted(df, weight_grad, d) && !kept) {
        const int64_t hist = tl_radix_hist_len(d->n_out);
        for (int b = 0; b < 2; b++)
            l->sort_items[b] = (tl_kv *)tl_cuda_ws_take(&w, d->n_out, sizeof(tl_kv));
        l->sort_hist = (long long *)tl_cuda_ws_take(&w, hist, sizeof(long long));
        l->sort_scan =
            (long long *)tl_cuda_ws_take(&w, tl_cuda_scan_scratch(hist), sizeof(long long));
    }
    return w;
}

/* Data derived from a map (tl_cuda_conv_derive): implicit GEMM's order of
 * output rows (tl_cuda_implicit_gemm.cu), fetch-on-demand's tile prefix
 * (tl_cuda_fetch_on_demand.cu), computed into `derived` on ctx's stream. */
tl_status tl_ig_derive(const tl_ctx *ctx, const tl_conv_desc *d, const int32_t *nbr,
                       void *workspace, void *derived);
tl_status tl_fod_derive(const tl_ctx *ctx, bool weight_grad, const tl_conv_desc *d,
                        const tl_cuda_pairs *p, void *workspace, void *derived);

/* The pipelined forward (tl_cuda_ig_pipelined.cu): whether option bits
 * `opts` ask for it and a sorted implicit-GEMM forward qualifies on the
 * current device (fp16, bf16 or TF32 by TL_CUDA_PIPELINED_FORWARD, plain
 * fp32 by TL_CUDA_PIPELINED_FP32; sm_80 code for it; channel counts and
 * pointers 16-byte aligned), and the call itself, given the order of its
 * output rows. */
bool tl_ig_pipelined_ok(const tl_conv_desc *d, int opts, const void *x, const void *w,
                        const void *y);
tl_status tl_ig_pipelined_forward(const tl_conv_desc *d, int opts, const void *x, const void *w,
                                  const int32_t *nbr, const tl_kv *order, void *y,
                                  cudaStream_t stream);

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
                    const tl_conv_desc *d, int64_t n_pairs, bool kept, void *workspace,
                    void *out_) {
        tl_cuda_ws ws = tl_conv_layout_of(workspace, df, weight_grad, d, n_pairs, kept, &l);
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
