/* Pipelined implicit-GEMM forward for fp16, bf16 and TF32 (issue 23, item
 * 4), used where the caller asks for it (TL_CUDA_PIPELINED_FORWARD) until a device
 * run has verified it; plain fp32 runs the same tile on the CUDA cores
 * (TL_CUDA_PIPELINED_FP32, tl_pipe_fma_multiply).
 *
 * Same tiles and row order as tl_ig_forward_kernel (tl_cuda_implicit_gemm.cu):
 * a block computes TL_PIPE_BM output rows of the mask-sorted order times BN
 * output channels and runs only the kernel rows in the union of its rows'
 * masks; every output row is written once.  What differs is how the
 * reduction is fed.  The (used kernel row, 64-byte C_in slice) steps form
 * one sequence, and TL_PIPE_STAGES - 1 slices of it are in flight while the
 * tensor cores multiply the oldest (mma.m16n8k16, or m16n8k8 in TF32, on
 * fragments loaded by ldmatrix): each slice is copied from global to shared
 * memory by cp.async, 16 bytes a copy, with absent neighbours and channels
 * past C_in zero-filled by the copy itself (no registers hold the data on
 * the way, no branch around a load, no refill at a kernel row's start).  One
 * barrier per slice.  TF32 inputs are rounded once, in shared memory, by the
 * thread that copied them.  The tiles are 64 rows by 64 or 128 channels (128
 * where C_out > 64: each warp then multiplies 32 x 32, twice the work per
 * fragment load of the 64-wide tile), on 8 warps.  (WMMA's bf16 fragment
 * loads from shared memory compile to generic loads and shuffles, its fp16
 * ones to ldmatrix; hence the explicit instructions.)
 *
 * Requires sm_80 code, channel rows of whole 16-byte runs (C_in and C_out
 * multiples of 8 halves or 4 floats) and x, w and y 16-byte aligned (every
 * copy is a whole 16-byte run, in or out of range);
 * tl_ig_pipelined_ok says whether a call qualifies. */
#include "tl_cuda_pipe_tile.cuh"

static_assert(TL_PIPE_BM == TL_BM, "tiles of TL_BM rows (tl_ig_tile_rows)");

struct tl_pipe_args {
    const int *nbr;
    const tl_kv *order; /* mask-sorted rows (tl_ig_sort / tl_ig_derive) */
    long long n_in, n_out, k, cin, cout, col_tiles;
};

template <typename T, int BN, bool FMA>
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_ig_pipelined_kernel(const T *x, const T *w, T *y, tl_pipe_args p) {
#ifdef TL_PIPE_DEVICE
    typedef tl_pipe_shape<T> sh;
    constexpr int V = sh::V, BK = sh::BK;
    __shared__ __align__(128) tl_pipe_smem<T, BN> s;
    __shared__ long long outs[TL_PIPE_BM];
    __shared__ unsigned used_part[TL_PIPE_BM / 32];
    __shared__ int used_n[32];
    const int t = threadIdx.x;
    const long long o0 = (blockIdx.x / p.col_tiles) * TL_PIPE_BM;
    const long long c0 = (blockIdx.x % p.col_tiles) * BN;
    const unsigned used = tl_ig_tile_rows(p.order, p.n_out, o0, outs, used_part);
    if (t == 0)
        for (int n = 0, u = 0; n < 32; n++)
            if ((used >> n) & 1u) used_n[u++] = n;
    __syncthreads();
    const int slices = (int)((p.cin + BK - 1) / BK);
    /* This thread's A row (tl_pipe_issue) is output row a_out's neighbour. */
    const long long a_out = outs[t / (BK / V)];
    tl_pipe_run<T, BN, FMA>(s, __popc(used) * slices, [&](int step, int st) {
        const int n = used_n[step / slices];
        long long i = a_out >= 0 ? p.nbr[a_out * p.k + n] : -1;
        if (i >= p.n_in) i = -1;
        tl_pipe_issue<T, BN>(s.u.s[st], t, x, i, p.cin, w + n * p.cin * p.cout, p.cout,
                             (long long)(step % slices) * BK, c0);
    });
    /* V channels (16 bytes) of one output row per store; each row once. */
    for (int e = t; e < TL_PIPE_BM * BN / V; e += TL_CUDA_THREADS) {
        const int m = e / (BN / V), j = (e % (BN / V)) * V;
        const long long o = outs[m], col = c0 + j;
        if (o < 0 || col >= p.cout) continue;
        union {
            uint4 u;
            T h[V];
        } v;
#pragma unroll
        for (int q = 0; q < V; q++) v.h[q] = tl_from_f32<T>(s.u.c[m][j + q]);
        *reinterpret_cast<uint4 *>(y + o * p.cout + col) = v.u;
    }
#else
    (void)x, (void)w, (void)y, (void)p;
    __trap(); /* never launched: tl_ig_pipelined_ok asks for sm_80 code */
#endif
}

bool tl_ig_pipelined_ok(const tl_conv_desc *d, int opts, const void *x, const void *w,
                        const void *y) {
    return tl_pipe_asked(opts, TL_CUDA_PIPELINED_FORWARD, d->dtype) &&
           tl_ig_sorted(TL_CUDA_IMPLICIT_GEMM, false, d) && tl_pipe_rows_ok(d, x, w, y) &&
           tl_pipe_code_ok((const void *)tl_ig_pipelined_kernel<__half, 64, false>);
}

namespace {

struct tl_pipe_call { /* for tl_dispatch_dtype */
    const tl_conv_desc *d;
    const void *x, *w;
    void *y;
    tl_pipe_args p;
    cudaStream_t stream;

    template <typename T, int BN, bool FMA> tl_status launch() {
        p.col_tiles = tl_cuda_ceil_div(d->c_out, BN);
        unsigned grid;
        TL_CUDA_RETURN_IF(
            tl_tile_grid(tl_cuda_ceil_div(d->n_out, TL_PIPE_BM) * p.col_tiles, &grid));
        tl_ig_pipelined_kernel<T, BN, FMA>
            <<<grid, TL_CUDA_THREADS, 0, stream>>>((const T *)x, (const T *)w, (T *)y, p);
        TL_CUDA_LAUNCHED();
        return TL_OK;
    }
    template <typename T, bool TF32> tl_status run() {
        return tl_pipe_by_width<T, TF32>(*this, d->c_out);
    }
};

} // namespace

tl_status tl_ig_pipelined_forward(const tl_conv_desc *d, int opts, const void *x, const void *w,
                                  const int32_t *nbr, const tl_kv *order, void *y,
                                  cudaStream_t stream) {
    tl_pipe_call call = {d, x, w, y, {nbr, order, d->n_in, d->n_out, d->k, d->c_in, d->c_out, 0},
                         stream};
    return tl_dispatch_dtype(d->dtype, (opts & TL_CUDA_TF32) != 0, call);
}
