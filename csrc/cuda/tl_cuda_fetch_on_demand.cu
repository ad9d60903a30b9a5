/* Fetch-on-demand dataflow on the GPU, over per-kernel-row pair lists.
 *
 * Block (kernel row n, 64 pairs, 64 channels) reads its input rows straight
 * from x through pair_in, multiplies by w[n] and adds the tile into the fp32
 * accumulator rows pair_out with atomics (different kernel rows hit the same
 * output rows concurrently).  The pair counts stay on the device, so the
 * per-kernel-row tile counts are turned into a prefix on the device (a tiny
 * kernel and tl_cuda_scan) and one flat grid covers those tiles.  Its size
 * is the tight bound sum_n ceil(P_n / B) <= P / B + K, known on the host
 * without a synchronization; blocks past the real total exit at once.  The
 * weight gradient does the same over chunks of a kernel row's pairs.  The
 * prefix depends on the pair lists alone: a caller that keeps them computes
 * it once (tl_fod_derive) and passes it to later calls.  The forward
 * and the fp16 / bf16 / TF32 weight gradient have pipelined kernels
 * (tl_cuda_fod_pipelined.cu) that callers may ask for
 * (TL_CUDA_PIPELINED_FOD_FORWARD, TL_CUDA_PIPELINED_WGRAD; plain fp32 through
 * them with TL_CUDA_PIPELINED_FP32). */
#include "tl_cuda_pair_gemm.cuh"

/* tiles[n] = ceil(P_n / per) for kernel row n < k (P_n from offsets). */
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_fod_tile_counts_kernel(const long long *offsets, long long k, long long per,
                              long long *tiles) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x; n < k; n += stride) {
        const long long count = offsets[n + 1] - offsets[n];
        tiles[n] = count > 0 ? (count + per - 1) / per : 0;
    }
}

/* Pairs per tile of one call: TL_BM for the forward; for the weight
 * gradient, chunks sized over all P pairs for about TL_SPLIT_BLOCKS_PER_SM
 * blocks per SM (each kernel row is cut into chunks of that size). */
static tl_status tl_fod_per(const tl_ctx *ctx, bool weight_grad, const tl_conv_desc *d,
                            int64_t n_pairs, int64_t *per) {
    if (!weight_grad) {
        *per = TL_BM;
        return TL_OK;
    }
    int64_t chunks;
    return tl_split_chunks(ctx->device, n_pairs,
                           tl_cuda_ceil_div(d->c_in, TL_BM) * tl_cuda_ceil_div(d->c_out, TL_BN),
                           per, &chunks);
}

/* Enqueues tiles[0..k] = the exclusive prefix of per-row tile counts (units
 * of `per` pairs), tiles[k] the total; scan: tl_cuda_scan scratch for k. */
static tl_status tl_fod_tile_starts(const tl_conv_desc *d, const tl_cuda_pairs *p, int64_t per,
                                    long long *tiles, long long *scan, cudaStream_t stream) {
    tl_fod_tile_counts_kernel<<<tl_cuda_blocks(d->k), TL_CUDA_THREADS, 0, stream>>>(
        (const long long *)p->offsets, d->k, per, tiles);
    TL_CUDA_LAUNCHED();
    return tl_cuda_scan(tiles, tiles, d->k, scan, tiles + d->k, stream);
}

/* A host-side upper bound of the tile total: min(P / per + k,
 * k * ceil(rows_cap / per)). */
static int64_t tl_fod_tile_bound(const tl_conv_layout &l, const tl_conv_desc *d,
                                 const tl_cuda_pairs *p, int64_t per) {
    int64_t b = p->n_pairs / per + d->k;
    const int64_t per_row = tl_cuda_ceil_div(l.rows_cap, per);
    if (per_row <= INT64_MAX / d->k && per_row * d->k < b) b = per_row * d->k;
    return b;
}

/* The tile prefix of a call: `derived` where the caller kept it, else
 * computed into the workspace. */
static tl_status tl_fod_tiles(const tl_conv_layout &l, const tl_conv_desc *d,
                              const tl_cuda_pairs *p, int64_t per, const void *derived,
                              cudaStream_t stream, const long long **tiles) {
    if (derived) {
        *tiles = (const long long *)derived;
        return TL_OK;
    }
    *tiles = l.tiles;
    return tl_fod_tile_starts(d, p, per, l.tiles, l.scan, stream);
}

tl_status tl_fod_derive(const tl_ctx *ctx, bool weight_grad, const tl_conv_desc *d,
                        const tl_cuda_pairs *p, void *workspace, void *derived) {
    TL_CUDA_RETURN_IF(tl_pairs_args_check(d, p));
    if (!derived) return TL_ERR_INVALID;
    tl_conv_layout l;
    tl_cuda_ws ws = tl_conv_layout_of(workspace, TL_CUDA_FETCH_ON_DEMAND, weight_grad, d,
                                      p->n_pairs, false, &l);
    if (ws.overflow) return TL_ERR_OVERFLOW;
    if (!tl_cuda_ws_ok(workspace, ws.used)) return TL_ERR_INVALID;
    cudaStream_t stream;
    tl_cuda_scope scope;
    TL_CUDA_RETURN_IF(scope.enter(ctx, &stream));
    int64_t per;
    TL_CUDA_RETURN_IF(tl_fod_per(ctx, weight_grad, d, p->n_pairs, &per));
    return tl_fod_tile_starts(d, p, per, (long long *)derived, l.scan, stream);
}

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
                                                     int opts, const void *x, const void *w,
                                                     const tl_cuda_pairs *p,
                                                     const void *derived, void *workspace,
                                                     void *y) {
    TL_CUDA_RETURN_IF(tl_conv_check(d, x, w, y, false));
    TL_CUDA_RETURN_IF(tl_pairs_args_check(d, p));
    tl_conv_frame f;
    TL_CUDA_RETURN_IF(f.begin(ctx, TL_CUDA_FETCH_ON_DEMAND, false, d, p->n_pairs, derived != NULL,
                              workspace, y));
    if (f.size == 0) return TL_OK;
    if (f.l.rows_cap > 0 && d->c_in > 0) {
        tl_fod_forward_call call;
        call.x = x;
        call.w = w;
        call.stream = f.stream;
        const long long *starts;
        TL_CUDA_RETURN_IF(tl_fod_tiles(f.l, d, p, TL_BM, derived, f.stream, &starts));
        const int64_t tiles = tl_fod_tile_bound(f.l, d, p, TL_BM);
        const int64_t col_tiles = tl_cuda_ceil_div(d->c_out, TL_BN);
        const int64_t es = tl_dtype_bytes(d->dtype);
        call.args = {(const long long *)p->offsets, p->in, p->out, f.acc, d->n_in, d->n_out,
                     d->c_in, d->c_out, 0, col_tiles, 0, starts, d->k, 0};
        call.args.vec = (tl_vec_ok(x, d->c_in, es) ? TL_VEC_A : 0) |
                        (tl_vec_ok(w, d->c_out, es) ? TL_VEC_B : 0) |
                        (tl_vec_ok(f.acc, d->c_out, sizeof(float)) ? TL_VEC_C : 0);
        if (tl_fod_pipelined_forward_ok(d, opts, x, w)) {
            TL_CUDA_RETURN_IF(
                tl_fod_pipelined_forward(d->dtype, opts, x, w, call.args, tiles, f.stream));
        } else {
            if (tiles > INT32_MAX / col_tiles) return TL_ERR_OVERFLOW;
            call.blocks = tiles * col_tiles;
            TL_CUDA_RETURN_IF(tl_dispatch_dtype(d->dtype, opts & TL_CUDA_TF32, call));
        }
    }
    return f.finish();
}

extern "C" tl_status tl_cuda_fetch_on_demand_weight_grad(const tl_ctx *ctx,
                                                         const tl_conv_desc *d, int opts,
                                                         const void *x, const void *dy,
                                                         const tl_cuda_pairs *p,
                                                         const void *derived, void *workspace,
                                                         void *dw) {
    TL_CUDA_RETURN_IF(tl_conv_check(d, x, dy, dw, true));
    TL_CUDA_RETURN_IF(tl_pairs_args_check(d, p));
    tl_conv_frame f;
    TL_CUDA_RETURN_IF(f.begin(ctx, TL_CUDA_FETCH_ON_DEMAND, true, d, p->n_pairs, derived != NULL,
                              workspace, dw));
    if (f.size == 0) return TL_OK;
    if (f.l.rows_cap > 0) {
        tl_fod_wgrad_call call;
        call.x = x;
        call.dy = dy;
        call.stream = f.stream;
        tl_pairs_wgrad_args &a = call.args;
        const int64_t es = tl_dtype_bytes(d->dtype);
        int64_t chunk_rows;
        TL_CUDA_RETURN_IF(tl_fod_per(ctx, true, d, p->n_pairs, &chunk_rows));
        const long long *starts;
        TL_CUDA_RETURN_IF(tl_fod_tiles(f.l, d, p, chunk_rows, derived, f.stream, &starts));
        a = {(const long long *)p->offsets, p->in, p->out, f.acc, d->n_in, d->n_out,
             d->c_in, d->c_out, 0, 0, 0, 0, 0, starts, d->k, 0};
        a.vec = (tl_vec_ok(x, d->c_in, es) ? TL_VEC_A : 0) |
                (tl_vec_ok(dy, d->c_out, es) ? TL_VEC_B : 0);
        a.ci_tiles = tl_cuda_ceil_div(d->c_in, TL_BM);
        a.co_tiles = tl_cuda_ceil_div(d->c_out, TL_BN);
        a.chunk_rows = chunk_rows;
        const int64_t tiles = tl_fod_tile_bound(f.l, d, p, chunk_rows);
        a.chunks = tiles;
        if (tiles > INT32_MAX / a.ci_tiles / a.co_tiles) return TL_ERR_OVERFLOW;
        call.blocks = tiles * a.ci_tiles * a.co_tiles;
        if (tl_fod_pipelined_ok(d, opts, x, dy))
            TL_CUDA_RETURN_IF(
                tl_fod_pipelined_wgrad(d->dtype, opts, x, dy, a, call.blocks, f.stream));
        else
            TL_CUDA_RETURN_IF(tl_dispatch_dtype(d->dtype, opts & TL_CUDA_TF32, call));
    }
    return f.finish();
}
