/* Implicit-GEMM dataflow on the GPU, over the (n_out, K) neighbour table.
 *
 * Forward: one block per (64 output rows, 64 output channels) tile; it loops
 * over kernel rows n (skipping n when no row of the tile has a neighbour)
 * and over C_in in steps of TL_BK, gathering x[nbr[o, n]] and w[n] into
 * shared memory.  Each tile is written once, so y needs no atomics and no
 * clearing.  Weight gradient: one block per (n, chunk of output rows, C_in
 * tile, C_out tile); chunks of one tile meet in fp32 atomics.
 *
 * Row reordering (tl_ig_sorted): a tile in output-row order computes every
 * kernel row that any of its 64 rows uses, several times the useful work on
 * sparse surfaces.  So the forward orders the output rows by their
 * neighbour bitmask (bit n: nbr[o, n] names an input row; the stable radix
 * sort of tl_cuda_radix.cuh, on the device, no host synchronization) and
 * lets tile t cover rows order[64 t .. 64 t + 63]: rows with equal masks
 * share tiles, and a tile runs only the kernel rows in the union of its
 * rows' masks.  Each output row is still written exactly once.  The order
 * depends on the map alone: a caller that keeps the map computes it once
 * (tl_ig_derive) and passes it to later calls. */
#include "tl_cuda_gemm.cuh"

static_assert(TL_BM % 32 == 0, "tile rows are whole warps");

/* items[o] = (neighbour bitmask of output row o, o): bit n iff
 * 0 <= nbr[o, n] < n_in, the same test the forward uses to skip an entry. */
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_ig_mask_kernel(const int *nbr, long long n_out, long long k, long long n_in,
                      tl_kv *items) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < n_out;
         o += stride) {
        const int *r = nbr + o * k;
        unsigned m = 0;
        for (int n = 0; n < (int)k; n++) {
            const int i = r[n];
            if (i >= 0 && i < n_in) m |= 1u << n;
        }
        items[o] = {m, (int)o};
    }
}

/* Sorts the output rows by neighbour mask in l's buffers; *order receives
 * the buffer holding the result.  Enqueued on `stream`, no synchronization. */
static tl_status tl_ig_sort(const tl_conv_layout &l, const tl_conv_desc *d, const int32_t *nbr,
                            cudaStream_t stream, const tl_kv **order) {
    const long long n = d->n_out;
    tl_ig_mask_kernel<<<tl_cuda_blocks(n), TL_CUDA_THREADS, 0, stream>>>(nbr, n, d->k, d->n_in,
                                                                       l.sort_items[0]);
    TL_CUDA_LAUNCHED();
    tl_kv *sorted;
    TL_CUDA_RETURN_IF(tl_radix_sort_kv(l.sort_items[0], l.sort_items[1], n, (int)d->k,
                                       l.sort_hist, l.sort_scan, stream, &sorted));
    *order = sorted;
    return TL_OK;
}

/* order == NULL: tile t covers output rows 64 t .. 64 t + 63.  Otherwise it
 * covers rows order[64 t + i].val, whose masks are order[64 t + i].key
 * (k <= 32), and runs only the kernel rows in their union. */
template <typename T, bool TF32>
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_ig_forward_kernel(const T *x, const T *w, const int *nbr, const tl_kv *order, T *y,
                         long long n_in, long long n_out, long long k, long long cin,
                         long long cout, long long col_tiles, int vec) {
    __shared__ tl_tile_smem<T, false> s;
    __shared__ long long rows[TL_BM], outs[TL_BM];
    __shared__ unsigned used_part[TL_BM / 32];
    const long long o0 = (blockIdx.x / col_tiles) * TL_BM;
    const long long c0 = (blockIdx.x % col_tiles) * TL_BN;
    const bool va = vec & TL_VEC_A, vb = vec & TL_VEC_B;
    const unsigned used = tl_ig_tile_rows(order, n_out, o0, outs, used_part);
    typename tl_core<T, TF32, false>::acc acc;
    acc.zero();
    tl_tile_load<T, TL_BM, TL_BK> la;
    tl_tile_load<T, TL_BK, TL_BN> lb;
    for (long long n = 0; n < k; n++) {
        if (order && !((used >> (int)n) & 1u)) continue; /* uniform across the block */
        int valid = 0;
        if (threadIdx.x < TL_BM) {
            const long long o = outs[threadIdx.x];
            long long i = o >= 0 ? nbr[o * k + n] : -1;
            if (i >= n_in) i = -1;
            rows[threadIdx.x] = i;
            valid = i >= 0;
        }
        /* Also the barrier that publishes rows[]; the previous n's readers
         * passed the trailing barrier of its C_in loop. */
        if (!__syncthreads_or(valid)) continue;
        const T *wn = w + n * cin * cout;
        la.fetch(x, cin, rows, 0, 0, 0, cin, va);
        lb.fetch(wn, cout, NULL, 0, cin, c0, cout, vb);
        for (long long k0 = 0; k0 < cin; k0 += TL_BK) {
            la.commit(s.a);
            lb.commit(s.b);
            __syncthreads();
            if (k0 + TL_BK < cin) { /* next slice in flight during this one */
                la.fetch(x, cin, rows, 0, 0, k0 + TL_BK, cin, va);
                lb.fetch(wn, cout, NULL, k0 + TL_BK, cin, c0, cout, vb);
            }
            acc.step(s);
            __syncthreads();
        }
    }
    acc.store(s);
    __syncthreads();
    for (int e = threadIdx.x; e < TL_BM * TL_BN; e += TL_CUDA_THREADS) {
        const int m = e / TL_BN, j = e % TL_BN;
        const long long o = outs[m], col = c0 + j;
        if (o >= 0 && col < cout) y[o * cout + col] = tl_from_f32<T>(s.c[m][j]);
    }
}

struct tl_ig_wgrad_args {
    const int *nbr;
    float *dw;
    long long n_in, n_out, k, c_in, c_out;
    long long ci_tiles, co_tiles, chunks, chunk_rows;
    int vec; /* TL_VEC_A: x rows, TL_VEC_B: dy rows */
};

/* ra[t], rb[t] = x row nbr[o, n] and dy row o for o = r0 + t below end (-1
 * where there is no neighbour); threads < TL_BK write; *any |= a row found. */
__device__ __forceinline__ void tl_ig_wgrad_rows(const tl_ig_wgrad_args &p, long long n,
                                                 long long r0, long long end, long long *ra,
                                                 long long *rb, int *any) {
    if (threadIdx.x < TL_BK) {
        const long long o = r0 + threadIdx.x;
        long long i = o < end ? p.nbr[o * p.k + n] : -1;
        if (i >= p.n_in) i = -1;
        ra[threadIdx.x] = i;
        rb[threadIdx.x] = i >= 0 ? o : -1;
        if (i >= 0) *any = 1; /* benign race: every writer stores 1 */
    }
}

template <typename T, bool TF32>
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_ig_wgrad_kernel(const T *x, const T *dy, tl_ig_wgrad_args p) {
    __shared__ tl_tile_smem<T, true> s;
    __shared__ long long ra[2][TL_BK], rb[2][TL_BK];
    __shared__ int any;
    long long b = blockIdx.x;
    const long long co0 = (b % p.co_tiles) * TL_BN;
    b /= p.co_tiles;
    const long long ci0 = (b % p.ci_tiles) * TL_BM;
    b /= p.ci_tiles;
    const long long begin = (b % p.chunks) * p.chunk_rows;
    const long long n = b / p.chunks;
    const long long end = begin + p.chunk_rows < p.n_out ? begin + p.chunk_rows : p.n_out;
    if (begin >= end) return; /* the whole block: no barrier passed yet */
    const bool va = p.vec & TL_VEC_A, vb = p.vec & TL_VEC_B;
    typename tl_core<T, TF32, true>::acc acc;
    acc.zero();
    tl_tile_load<T, TL_BK, TL_BM> la;
    tl_tile_load<T, TL_BK, TL_BN> lb;
    if (threadIdx.x == 0) any = 0;
    __syncthreads();
    tl_ig_wgrad_rows(p, n, begin, end, ra[0], rb[0], &any);
    __syncthreads();
    la.fetch(x, p.c_in, ra[0], 0, 0, ci0, p.c_in, va);
    lb.fetch(dy, p.c_out, rb[0], 0, 0, co0, p.c_out, vb);
    int buf = 0;
    for (long long r0 = begin; r0 < end; r0 += TL_BK, buf ^= 1) {
        la.commit(s.a);
        lb.commit(s.b);
        const bool more = r0 + TL_BK < end;
        /* ra[buf ^ 1] was last read two slices ago, before two barriers. */
        if (more) tl_ig_wgrad_rows(p, n, r0 + TL_BK, end, ra[buf ^ 1], rb[buf ^ 1], &any);
        __syncthreads();
        if (more) {
            la.fetch(x, p.c_in, ra[buf ^ 1], 0, 0, ci0, p.c_in, va);
            lb.fetch(dy, p.c_out, rb[buf ^ 1], 0, 0, co0, p.c_out, vb);
        }
        acc.step(s);
        __syncthreads();
    }
    if (!any) return; /* read after the last barrier: the same in every thread */
    acc.store(s);
    __syncthreads();
    for (int e = threadIdx.x; e < TL_BM * TL_BN; e += TL_CUDA_THREADS) {
        const int m = e / TL_BN, j = e % TL_BN;
        const long long ci = ci0 + m, co = co0 + j;
        if (ci < p.c_in && co < p.c_out)
            atomicAdd(&p.dw[(n * p.c_in + ci) * p.c_out + co], s.c[m][j]);
    }
}

namespace {

struct tl_ig_forward_call {
    const tl_conv_desc *d;
    const void *x, *w;
    const int32_t *nbr;
    const tl_kv *order; /* NULL when unsorted */
    void *y;
    cudaStream_t stream;
    int vec;

    template <typename T, bool TF32> tl_status run() {
        const int64_t col_tiles = tl_cuda_ceil_div(d->c_out, TL_BN);
        unsigned grid;
        TL_CUDA_RETURN_IF(tl_tile_grid(tl_cuda_ceil_div(d->n_out, TL_BM) * col_tiles, &grid));
        tl_ig_forward_kernel<T, TF32><<<grid, TL_CUDA_THREADS, 0, stream>>>(
            (const T *)x, (const T *)w, nbr, order, (T *)y, d->n_in, d->n_out, d->k, d->c_in,
            d->c_out, col_tiles, vec);
        TL_CUDA_LAUNCHED();
        return TL_OK;
    }
};

struct tl_ig_wgrad_call {
    const void *x, *dy;
    tl_ig_wgrad_args args;
    int64_t blocks;
    cudaStream_t stream;

    template <typename T, bool TF32> tl_status run() {
        unsigned grid;
        TL_CUDA_RETURN_IF(tl_tile_grid(blocks, &grid));
        tl_ig_wgrad_kernel<T, TF32>
            <<<grid, TL_CUDA_THREADS, 0, stream>>>((const T *)x, (const T *)dy, args);
        TL_CUDA_LAUNCHED();
        return TL_OK;
    }
};

} // namespace

/* The forward's workspace (scratch only for the row sort, none when the order
 * is kept: the forward writes each tile once), checked, and the call's device
 * made current. */
static tl_status tl_ig_enter(const tl_ctx *ctx, const tl_conv_desc *d, bool kept,
                             void *workspace, tl_conv_layout *l, tl_cuda_scope &scope,
                             cudaStream_t *stream) {
    tl_cuda_ws ws = tl_conv_layout_of(workspace, TL_CUDA_IMPLICIT_GEMM, false, d, 0, kept, l);
    if (ws.overflow) return TL_ERR_OVERFLOW;
    if (!tl_cuda_ws_ok(workspace, ws.used)) return TL_ERR_INVALID;
    return scope.enter(ctx, stream);
}

tl_status tl_ig_derive(const tl_ctx *ctx, const tl_conv_desc *d, const int32_t *nbr,
                       void *workspace, void *derived) {
    if (!tl_ig_sorted(TL_CUDA_IMPLICIT_GEMM, false, d)) return TL_OK; /* nothing derived */
    if (!nbr || !derived) return TL_ERR_INVALID;
    tl_conv_layout l;
    cudaStream_t stream;
    tl_cuda_scope scope;
    TL_CUDA_RETURN_IF(tl_ig_enter(ctx, d, false, workspace, &l, scope, &stream));
    const tl_kv *order;
    TL_CUDA_RETURN_IF(tl_ig_sort(l, d, nbr, stream, &order));
    TL_CUDA_TRY(cudaMemcpyAsync(derived, order, sizeof(tl_kv) * (size_t)d->n_out,
                                cudaMemcpyDeviceToDevice, stream));
    return TL_OK;
}

extern "C" tl_status tl_cuda_implicit_gemm_forward(const tl_ctx *ctx, const tl_conv_desc *d,
                                                   int opts, const void *x, const void *w,
                                                   const int32_t *nbr, const void *derived,
                                                   void *workspace, void *y) {
    TL_CUDA_RETURN_IF(tl_conv_check(d, x, w, y, false));
    if (!nbr && d->n_out > 0) return TL_ERR_INVALID;
    tl_conv_layout l;
    cudaStream_t stream;
    tl_cuda_scope scope;
    TL_CUDA_RETURN_IF(tl_ig_enter(ctx, d, derived != NULL, workspace, &l, scope, &stream));
    if (d->n_out == 0 || d->c_out == 0) return TL_OK;
    const tl_kv *order = NULL;
    if (tl_ig_sorted(TL_CUDA_IMPLICIT_GEMM, false, d)) {
        if (derived)
            order = (const tl_kv *)derived;
        else
            TL_CUDA_RETURN_IF(tl_ig_sort(l, d, nbr, stream, &order));
    }
    if (order && tl_ig_pipelined_ok(d, opts, x, w, y))
        return tl_ig_pipelined_forward(d, opts, x, w, nbr, order, y, stream);
    const int64_t es = tl_dtype_bytes(d->dtype);
    const int vec = (tl_vec_ok(x, d->c_in, es) ? TL_VEC_A : 0) |
                    (tl_vec_ok(w, d->c_out, es) ? TL_VEC_B : 0);
    tl_ig_forward_call call = {d, x, w, nbr, order, y, stream, vec};
    return tl_dispatch_dtype(d->dtype, opts & TL_CUDA_TF32, call);
}

extern "C" tl_status tl_cuda_implicit_gemm_weight_grad(const tl_ctx *ctx, const tl_conv_desc *d,
                                                       int opts, const void *x,
                                                       const void *dy, const int32_t *nbr,
                                                       const void *derived, void *workspace,
                                                       void *dw) {
    (void)derived; /* nothing derived: the weight gradient runs in row order */
    TL_CUDA_RETURN_IF(tl_conv_check(d, x, dy, dw, true));
    if (!nbr && d->n_out > 0) return TL_ERR_INVALID;
    tl_conv_frame f;
    TL_CUDA_RETURN_IF(f.begin(ctx, TL_CUDA_IMPLICIT_GEMM, true, d, 0, false, workspace, dw));
    if (f.size == 0) return TL_OK;
    if (d->n_out > 0 && d->n_in > 0) {
        tl_ig_wgrad_call call;
        call.x = x;
        call.dy = dy;
        call.stream = f.stream;
        tl_ig_wgrad_args &a = call.args;
        const int64_t es = tl_dtype_bytes(d->dtype);
        a = {nbr, f.acc, d->n_in, d->n_out, d->k, d->c_in, d->c_out, 0, 0, 0, 0, 0};
        a.vec = (tl_vec_ok(x, d->c_in, es) ? TL_VEC_A : 0) |
                (tl_vec_ok(dy, d->c_out, es) ? TL_VEC_B : 0);
        a.ci_tiles = tl_cuda_ceil_div(d->c_in, TL_BM);
        a.co_tiles = tl_cuda_ceil_div(d->c_out, TL_BN);
        int64_t chunk_rows, chunks;
        TL_CUDA_RETURN_IF(tl_split_chunks(ctx->device, d->n_out, d->k * a.ci_tiles * a.co_tiles,
                                          &chunk_rows, &chunks));
        a.chunks = chunks;
        a.chunk_rows = chunk_rows;
        if (d->k > INT32_MAX / chunks / a.ci_tiles / a.co_tiles) return TL_ERR_OVERFLOW;
        call.blocks = d->k * chunks * a.ci_tiles * a.co_tiles;
        TL_CUDA_RETURN_IF(tl_dispatch_dtype(d->dtype, opts & TL_CUDA_TF32, call));
    }
    return f.finish();
}
