/* Fetch-on-demand dataflow on the GPU, over per-kernel-row pair lists.
 *
 * One launch covers every kernel row: block (n, 64 pairs, 64 channels) reads
 * its input rows straight from x through pair_in, multiplies by w[n] and adds
 * the tile into the fp32 accumulator rows pair_out with atomics (different
 * kernel rows hit the same output rows concurrently).  The grid is sized by
 * the largest possible kernel row, min(n_in, n_out, P) pairs, because the
 * offsets stay on the device; blocks past their row's end exit at once. */
#include "tl_cuda_pair_gemm.cuh"

namespace {

struct tl_fod_forward_call {
    const void *x, *w;
    tl_pairs_fwd_args args;
    int64_t blocks;
    cudaStream_t stream;

    template <typename T, bool TF32> tl_status run() {
        unsigned grid;
        TL_CUDA_RETURN_IF(tl_tile_grid(blocks, &grid));
        tl_pairs_forward_kernel<T, TF32, true>
            <<<grid, TL_CUDA_THREADS, 0, stream>>>((const T *)x, (const T *)w, args);
        TL_CUDA_LAUNCHED();
        return TL_OK;
    }
};

struct tl_fod_wgrad_call {
    const void *x, *dy;
    tl_pairs_wgrad_args args;
    int64_t blocks;
    cudaStream_t stream;

    template <typename T, bool TF32> tl_status run() {
        unsigned grid;
        TL_CUDA_RETURN_IF(tl_tile_grid(blocks, &grid));
        tl_pairs_wgrad_kernel<T, TF32, true>
            <<<grid, TL_CUDA_THREADS, 0, stream>>>((const T *)x, (const T *)dy, args);
        TL_CUDA_LAUNCHED();
        return TL_OK;
    }
};

} // namespace

extern "C" tl_status tl_cuda_fetch_on_demand_forward(const tl_ctx *ctx, const tl_conv_desc *d,
                                                     int allow_tf32, const void *x, const void *w,
                                                     const tl_cuda_pairs *p, void *workspace,
                                                     void *y) {
    TL_CUDA_RETURN_IF(tl_conv_check(d, x, w, y, false));
    TL_CUDA_RETURN_IF(tl_pairs_args_check(d, p));
    tl_conv_frame f;
    TL_CUDA_RETURN_IF(f.begin(ctx, TL_CUDA_FETCH_ON_DEMAND, false, d, p->n_pairs, workspace, y));
    if (f.size == 0) return TL_OK;
    if (f.l.rows_cap > 0 && d->c_in > 0) {
        tl_fod_forward_call call;
        call.x = x;
        call.w = w;
        call.stream = f.stream;
        const int64_t row_tiles = tl_cuda_ceil_div(f.l.rows_cap, TL_BM);
        const int64_t col_tiles = tl_cuda_ceil_div(d->c_out, TL_BN);
        call.args = {(const long long *)p->offsets, p->in, p->out, f.acc, d->n_in, d->n_out,
                     d->c_in, d->c_out, row_tiles, col_tiles, 0};
        if (row_tiles > INT32_MAX / col_tiles / d->k) return TL_ERR_OVERFLOW;
        call.blocks = d->k * row_tiles * col_tiles;
        TL_CUDA_RETURN_IF(tl_dispatch_dtype(d->dtype, allow_tf32, call));
    }
    return f.finish();
}

extern "C" tl_status tl_cuda_fetch_on_demand_weight_grad(const tl_ctx *ctx,
                                                         const tl_conv_desc *d, int allow_tf32,
                                                         const void *x, const void *dy,
                                                         const tl_cuda_pairs *p, void *workspace,
                                                         void *dw) {
    TL_CUDA_RETURN_IF(tl_conv_check(d, x, dy, dw, true));
    TL_CUDA_RETURN_IF(tl_pairs_args_check(d, p));
    tl_conv_frame f;
    TL_CUDA_RETURN_IF(f.begin(ctx, TL_CUDA_FETCH_ON_DEMAND, true, d, p->n_pairs, workspace, dw));
    if (f.size == 0) return TL_OK;
    if (f.l.rows_cap > 0) {
        tl_fod_wgrad_call call;
        call.x = x;
        call.dy = dy;
        call.stream = f.stream;
        tl_pairs_wgrad_args &a = call.args;
        a = {(const long long *)p->offsets, p->in, p->out, f.acc, d->n_in, d->n_out,
             d->c_in, d->c_out, 0, 0, 0, 0, 0};
        a.ci_tiles = tl_cuda_ceil_div(d->c_in, TL_BM);
        a.co_tiles = tl_cuda_ceil_div(d->c_out, TL_BN);
        int64_t chunk_rows, chunks;
        TL_CUDA_RETURN_IF(tl_split_chunks(ctx->device, f.l.rows_cap,
                                          d->k * a.ci_tiles * a.co_tiles, &chunk_rows, &chunks));
        a.chunks = chunks;
        a.chunk_rows = chunk_rows;
        if (d->k > INT32_MAX / chunks / a.ci_tiles / a.co_tiles) return TL_ERR_OVERFLOW;
        call.blocks = d->k * chunks * a.ci_tiles * a.co_tiles;
        TL_CUDA_RETURN_IF(tl_dispatch_dtype(d->dtype, allow_tf32, call));
    }
    return f.finish();
}
