/* Gather-scatter dataflow on the GPU, over per-kernel-row pair lists.
 *
 * Kernel rows are processed one after the other on the stream.  For row n:
 * gather x[pair_in] into a dense (P_n, C_in) buffer, run the tiled GEMM of
 * tl_cuda_pair_gemm.cuh with w[n], and add each result row into the fp32
 * accumulator at pair_out.  Within one kernel row no output row repeats and
 * the rows follow each other in stream order, so the adds need no atomics.
 * Weight gradient: gather x[pair_in] and dy[pair_out] into dense buffers,
 * dw[n] = X^T DY split over chunks of pairs (fp32 atomics between chunks).
 * P_n lives on the device; every launch is sized for the largest possible
 * kernel row, min(n_in, n_out, P), and idle blocks exit at once. */
#include "tl_cuda_pair_gemm.cuh"

/* dst[r] = src[idx[offsets[n] + r]] for the pairs r of kernel row n
 * (at most rows_cap of them; rows outside [0, n_src) read as 0). */
template <typename T>
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_gather_kernel(const T *src, long long n_src, long long c, const long long *offsets,
                     const int *idx, long long n, long long rows_cap, T *dst) {
    const long long off = offsets[n];
    long long count = offsets[n + 1] - off;
    if (count > rows_cap) count = rows_cap;
    const long long total = count * c;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const long long r = e / c, col = e % c;
        const long long s = idx[off + r];
        dst[e] = (s >= 0 && s < n_src) ? src[s * c + col] : tl_from_f32<T>(0.0f);
    }
}

namespace {

/* Gathers rows of one kernel row into a dense buffer. */
struct tl_gather_call {
    const void *src;
    long long n_src, c;
    const long long *offsets;
    const int *idx;
    long long n, rows_cap;
    void *dst;
    cudaStream_t stream;

    template <typename T, bool TF32> tl_status run() {
        tl_gather_kernel<T><<<tl_cuda_blocks(rows_cap * c), TL_CUDA_THREADS, 0, stream>>>(
            (const T *)src, n_src, c, offsets, idx, n, rows_cap, (T *)dst);
        TL_CUDA_LAUNCHED();
        return TL_OK;
    }
};

struct tl_gs_forward_call {
    tl_gather_call gather;
    const void *w;
    tl_pairs_fwd_args args;
    int64_t blocks, k;

    template <typename T, bool TF32> tl_status run() {
        unsigned grid;
        TL_CUDA_RETURN_IF(tl_tile_grid(blocks, &grid));
        for (int64_t n = 0; n < k; n++) {
            gather.n = n;
            args.n_first = n;
            TL_CUDA_RETURN_IF(gather.template run<T, TF32>());
            tl_pairs_forward_kernel<T, TF32, false><<<grid, TL_CUDA_THREADS, 0, gather.stream>>>(
                (const T *)gather.dst, (const T *)w, args);
            TL_CUDA_LAUNCHED();
        }
        return TL_OK;
    }
};

struct tl_gs_wgrad_call {
    tl_gather_call gx, gy;
    tl_pairs_wgrad_args args;
    int64_t blocks, k;

    template <typename T, bool TF32> tl_status run() {
        unsigned grid;
        TL_CUDA_RETURN_IF(tl_tile_grid(blocks, &grid));
        for (int64_t n = 0; n < k; n++) {
            gx.n = gy.n = n;
            args.n_first = n;
            TL_CUDA_RETURN_IF(gx.template run<T, TF32>());
            TL_CUDA_RETURN_IF(gy.template run<T, TF32>());
            tl_pairs_wgrad_kernel<T, TF32, false><<<grid, TL_CUDA_THREADS, 0, gx.stream>>>(
                (const T *)gx.dst, (const T *)gy.dst, args);
            TL_CUDA_LAUNCHED();
        }
        return TL_OK;
    }
};

} // namespace

extern "C" tl_status tl_cuda_gather_scatter_forward(const tl_ctx *ctx, const tl_conv_desc *d,
                                                    int allow_tf32, const void *x, const void *w,
                                                    const tl_cuda_pairs *p, void *workspace,
                                                    void *y) {
    TL_CUDA_RETURN_IF(tl_conv_check(d, x, w, y, false));
    TL_CUDA_RETURN_IF(tl_pairs_args_check(d, p));
    tl_conv_frame f;
    TL_CUDA_RETURN_IF(f.begin(ctx, TL_CUDA_GATHER_SCATTER, false, d, p->n_pairs, workspace, y));
    if (f.size == 0) return TL_OK;
    if (f.l.rows_cap > 0 && d->c_in > 0) {
        const long long *offsets = (const long long *)p->offsets;
        const int64_t row_tiles = tl_cuda_ceil_div(f.l.rows_cap, TL_BM);
        const int64_t col_tiles = tl_cuda_ceil_div(d->c_out, TL_BN);
        tl_gs_forward_call call;
        call.gather = {x, d->n_in, d->c_in, offsets, p->in,
                       0, f.l.rows_cap, f.l.gather_x, f.stream};
        call.w = w;
        call.args = {offsets, p->in, p->out, f.acc, f.l.rows_cap, d->n_out, d->c_in, d->c_out,
                     row_tiles, col_tiles, 0};
        if (row_tiles > INT32_MAX / col_tiles) return TL_ERR_OVERFLOW;
        call.blocks = row_tiles * col_tiles;
        call.k = d->k;
        TL_CUDA_RETURN_IF(tl_dispatch_dtype(d->dtype, allow_tf32, call));
    }
    return f.finish();
}

extern "C" tl_status tl_cuda_gather_scatter_weight_grad(const tl_ctx *ctx, const tl_conv_desc *d,
                                                        int allow_tf32, const void *x,
                                                        const void *dy, const tl_cuda_pairs *p,
                                                        void *workspace, void *dw) {
    TL_CUDA_RETURN_IF(tl_conv_check(d, x, dy, dw, true));
    TL_CUDA_RETURN_IF(tl_pairs_args_check(d, p));
    tl_conv_frame f;
    TL_CUDA_RETURN_IF(f.begin(ctx, TL_CUDA_GATHER_SCATTER, true, d, p->n_pairs, workspace, dw));
    if (f.size == 0) return TL_OK;
    if (f.l.rows_cap > 0) {
        const long long *offsets = (const long long *)p->offsets;
        tl_gs_wgrad_call call;
        call.gx = {x, d->n_in, d->c_in, offsets, p->in, 0, f.l.rows_cap, f.l.gather_x, f.stream};
        call.gy = {dy, d->n_out, d->c_out, offsets, p->out,
                   0, f.l.rows_cap, f.l.gather_y, f.stream};
        tl_pairs_wgrad_args &a = call.args;
        a = {offsets, p->in, p->out, f.acc, f.l.rows_cap, f.l.rows_cap, d->c_in, d->c_out,
             0, 0, 0, 0, 0};
        a.ci_tiles = tl_cuda_ceil_div(d->c_in, TL_BM);
        a.co_tiles = tl_cuda_ceil_div(d->c_out, TL_BN);
        int64_t chunk_rows, chunks;
        TL_CUDA_RETURN_IF(tl_split_chunks(ctx->device, f.l.rows_cap, a.ci_tiles * a.co_tiles,
                                          &chunk_rows, &chunks));
        a.chunks = chunks;
        a.chunk_rows = chunk_rows;
        if (chunks > INT32_MAX / a.ci_tiles / a.co_tiles) return TL_ERR_OVERFLOW;
        call.blocks = chunks * a.ci_tiles * a.co_tiles;
        call.k = d->k;
        TL_CUDA_RETURN_IF(tl_dispatch_dtype(d->dtype, allow_tf32, call));
    }
    return f.finish();
}
