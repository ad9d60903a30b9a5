/* Pipelined fetch-on-demand kernels (issue 23, item 4), used where the
 * caller asks for them until a device run has verified them: the forward
 * (fp16, bf16, TF32; TL_CUDA_PIPELINED_FOD_FORWARD) and the weight gradient
 * (fp16, bf16, TF32; TL_CUDA_PIPELINED_WGRAD).
 *
 * Plain fp32 runs both on the CUDA cores where TL_CUDA_PIPELINED_FP32 asks
 * for it (tl_pipe_fma_multiply, tl_fodp_multiply).
 *
 * Forward: the blocks and atomics of tl_pairs_forward_kernel
 * (tl_cuda_pair_gemm.cuh), block (kernel row n, 64 pairs, 64 or 128 output
 * channels), with the slices of C_in run through the pipelined tile of
 * tl_cuda_pipe_tile.cuh: x rows through pair_in and w[n]'s rows copied by
 * cp.async, multiplied with mma, the tile added into the fp32 accumulator
 * rows pair_out with atomics.
 *
 * Weight gradient:
 * Same blocks, chunks and atomics as tl_pairs_wgrad_kernel
 * (tl_cuda_pair_gemm.cuh): block (kernel row n, chunk of its pairs, 64 input
 * channels, 64 output channels) adds X^T DY over the chunk's pairs into the
 * fp32 accumulator of dw[n].  The chunk runs as slices of 32 pairs (16 in
 * fp32), 3 of them in flight while the oldest is multiplied: each pair's x
 * row (through pair_in) and dy row (through pair_out) are copied into shared
 * memory by cp.async, 16 bytes a copy, pairs past the chunk and channels
 * past C_in / C_out zero-filled by the copy.  Halves: fragments loaded with
 * ldmatrix (X^T transposed on the way, from the pair-major slice),
 * mma.m16n8k16; TF32: fragments read word by word, mma.m16n8k8, the inputs
 * rounded once when staged; plain fp32: float4 reads, FMA.  One barrier per
 * slice, where the previous kernel had two and fetched one slice ahead into
 * registers.
 *
 * Requires sm_80 code, channel rows of whole 16-byte runs (C_in and C_out
 * multiples of 8 halves or 4 floats) and x and dy 16-byte aligned;
 * tl_fod_pipelined_ok says whether a call qualifies. */
#include "tl_cuda_pair_gemm.cuh"
#include "tl_cuda_pipe_tile.cuh"

static_assert(TL_PIPE_BM == TL_BM, "the forward's tiles are the tile prefix's (TL_BM pairs)");

template <typename T, int BN, bool FMA>
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_fod_pipelined_forward_kernel(const T *x, const T *w, tl_pairs_fwd_args p) {
#ifdef TL_PIPE_DEVICE
    typedef tl_pipe_shape<T> sh;
    constexpr int V = sh::V, BK = sh::BK;
    __shared__ __align__(128) tl_pipe_smem<T, BN> s;
    __shared__ long long rows[TL_PIPE_BM], outs[TL_PIPE_BM];
    const int t = threadIdx.x;
    const long long c0 = (blockIdx.x % p.col_tiles) * BN;
    long long n, j0;
    if (!tl_pairs_fwd_block(p, blockIdx.x / p.col_tiles, &n, &j0)) return; /* whole block */
    tl_pairs_tile_rows<true>(p, n, j0, rows, outs);
    __syncthreads();
    const long long a_row = rows[t / (BK / V)]; /* this thread's A row (tl_pipe_issue) */
    const T *wn = w + n * p.c_in * p.c_out;
    tl_pipe_run<T, BN, FMA>(s, (int)((p.c_in + BK - 1) / BK), [&](int step, int st) {
        tl_pipe_issue<T, BN>(s.u.s[st], t, x, a_row, p.c_in, wn, p.c_out, (long long)step * BK,
                             c0);
    });
    /* Other kernel rows' blocks add into the same output rows concurrently. */
    tl_pairs_add_tile<true, BN>(s.u.c, outs, p.acc, c0, p.c_out, p.vec & TL_VEC_C);
#else
    (void)x, (void)w, (void)p;
    __trap(); /* never launched: tl_fod_pipelined_forward_ok asks for sm_80 code */
#endif
}

bool tl_fod_pipelined_forward_ok(const tl_conv_desc *d, int opts, const void *x,
                                 const void *w) {
    return tl_pipe_asked(opts, TL_CUDA_PIPELINED_FOD_FORWARD, d->dtype) &&
           tl_pipe_rows_ok(d, x, w, NULL) &&
           tl_pipe_code_ok((const void *)tl_fod_pipelined_forward_kernel<__half, 64, false>);
}

namespace {

struct tl_fodp_fwd_call { /* for tl_dispatch_dtype */
    const void *x, *w;
    tl_pairs_fwd_args p;
    int64_t tiles; /* the host's bound of the tile total (tl_fod_tile_bound) */
    cudaStream_t stream;

    template <typename T, int BN, bool FMA> tl_status launch() {
        p.col_tiles = tl_cuda_ceil_div(p.c_out, BN);
        if (tiles > INT32_MAX / p.col_tiles) return TL_ERR_OVERFLOW;
        unsigned grid;
        TL_CUDA_RETURN_IF(tl_tile_grid(tiles * p.col_tiles, &grid));
        tl_fod_pipelined_forward_kernel<T, BN, FMA>
            <<<grid, TL_CUDA_THREADS, 0, stream>>>((const T *)x, (const T *)w, p);
        TL_CUDA_LAUNCHED();
        return TL_OK;
    }
    template <typename T, bool TF32> tl_status run() {
        return tl_pipe_by_width<T, TF32>(*this, p.c_out);
    }
};

} // namespace

tl_status tl_fod_pipelined_forward(tl_dtype dtype, int opts, const void *x, const void *w,
                                   const tl_pairs_fwd_args &args, int64_t tile_bound,
                                   cudaStream_t stream) {
    tl_fodp_fwd_call call = {x, w, args, tile_bound, stream};
    return tl_dispatch_dtype(dtype, (opts & TL_CUDA_TF32) != 0, call);
}

#define TL_FODP_STAGES 4

static_assert(TL_CUDA_THREADS == 256 && TL_BM == 64 && TL_BN == 64, "8 warps of 32 x 16");

/* One slice: BK pairs' x rows a[kk][m] (channel ci0 + m of pair kk) and dy
 * rows b[kk][j], BK = 64 bytes of values (32 halves, 16 floats) so that one
 * 16-byte copy of x and one of dy a thread fill it; rows skewed by 8 values
 * (144 bytes apart in halves: the 8 rows an ldmatrix phase reads fall in
 * different banks; 72 words in floats: TF32 fragments, read word by word at
 * rows kk + lane % 4 and columns + lane / 4, hit 32 banks). */
template <typename T> struct tl_fodp_smem {
    static constexpr int V = 16 / (int)sizeof(T), BK = 4 * V, LD = 64 + 8, LDC = 64 + 4;
    static_assert(BK * 64 / V == TL_CUDA_THREADS, "one x copy and one dy copy a thread");
    struct stage {
        T a[BK][LD];
        T b[BK][LD];
    };
    union {
        stage s[TL_FODP_STAGES];
        float c[TL_BM][LDC];
    } u;
};

/* Warp (wm, wn) owns input channels wm * 32 .. + 32 and output channels
 * wn * 16 .. + 16 of the tile, as 2 x 2 mma tiles of 16 x 8 (acc[i][j]),
 * or, in plain fp32 (FMA), lane (lane / 4, lane % 4) owns input channels
 * wm * 32 + 4 (lane / 4) + r and output channels wn * 16 + 4 (lane % 4) + q
 * in acc[r / 2][r % 2][q]: per pair a float4 of x and one of dy (a warp
 * reads one 128-byte and one 64-byte run), 16 multiply-adds. */
template <typename T, bool TF32>
__device__ __forceinline__ void tl_fodp_multiply(const typename tl_fodp_smem<T>::stage &g,
                                                 int wm, int wn, int lane,
                                                 float (&acc)[2][2][4]) {
    constexpr int BK = tl_fodp_smem<T>::BK;
    if constexpr (sizeof(T) == 2) {
        /* ldmatrix rows of this lane, both transposed: X^T's matrix lane / 8
         * is pairs ((lane / 16) * 8 ..) x channels (((lane / 8) % 2) * 8 ..),
         * so matrices 0..3 are the a0..a3 registers of mma; DY's are pairs
         * (((lane / 8) % 2) * 8 ..) x channels ((lane / 16) * 8 ..), the b
         * registers of two 8-column blocks. */
        const int a_row = lane % 8 + (lane / 16) * 8, a_col = ((lane / 8) % 2) * 8;
        const int b_row = lane % 8 + ((lane / 8) % 2) * 8, b_col = (lane / 16) * 8;
#pragma unroll
        for (int k0 = 0; k0 < BK; k0 += 16) {
            unsigned a[2][4], bf[2][2], r[4];
#pragma unroll
            for (int i = 0; i < 2; i++)
                tl_ldmatrix4<true>(a[i], &g.a[k0 + a_row][wm * 32 + i * 16 + a_col]);
            tl_ldmatrix4<true>(r, &g.b[k0 + b_row][wn * 16 + b_col]);
            bf[0][0] = r[0], bf[0][1] = r[1], bf[1][0] = r[2], bf[1][1] = r[3];
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) tl_mma16816<T>(acc[i][j], a[i], bf[j]);
        }
    } else if constexpr (TF32) {
        /* m16n8k8: a0..a3 = X^T (channel g (+ 8), pair t (+ 4)), b0, b1 = DY
         * (pair t (+ 4), channel g), g = lane / 4, t = lane % 4; rounded to
         * TF32 when staged. */
        const int g4 = lane / 4, t4 = lane % 4;
#pragma unroll
        for (int k0 = 0; k0 < BK; k0 += 8) {
            unsigned a[2][4], bf[2][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int m = wm * 32 + i * 16 + g4;
                a[i][0] = __float_as_uint(g.a[k0 + t4][m]);
                a[i][1] = __float_as_uint(g.a[k0 + t4][m + 8]);
                a[i][2] = __float_as_uint(g.a[k0 + t4 + 4][m]);
                a[i][3] = __float_as_uint(g.a[k0 + t4 + 4][m + 8]);
            }
#pragma unroll
            for (int j = 0; j < 2; j++) {
                bf[j][0] = __float_as_uint(g.b[k0 + t4][wn * 16 + j * 8 + g4]);
                bf[j][1] = __float_as_uint(g.b[k0 + t4 + 4][wn * 16 + j * 8 + g4]);
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) tl_mma1688_tf32(acc[i][j], a[i], bf[j]);
        }
    } else {
        const int ci = wm * 32 + 4 * (lane / 4), co = wn * 16 + 4 * (lane % 4);
#pragma unroll
        for (int kk = 0; kk < BK; kk++) {
            const float4 a = *reinterpret_cast<const float4 *>(&g.a[kk][ci]);
            const float4 b = *reinterpret_cast<const float4 *>(&g.b[kk][co]);
            const float av[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (int r = 0; r < 4; r++) {
                float *c = acc[r / 2][r % 2];
                c[0] = fmaf(av[r], b.x, c[0]);
                c[1] = fmaf(av[r], b.y, c[1]);
                c[2] = fmaf(av[r], b.z, c[2]);
                c[3] = fmaf(av[r], b.w, c[3]);
            }
        }
    }
}

template <typename T, bool TF32>
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_fod_pipelined_wgrad_kernel(const T *xs, const T *dys, tl_pairs_wgrad_args p) {
#ifdef TL_PIPE_DEVICE
    typedef tl_fodp_smem<T> sm;
    constexpr int V = sm::V, BK = sm::BK;
    constexpr bool FMA = sizeof(T) == 4 && !TF32;
    __shared__ __align__(128) sm s;
    tl_pairs_wgrad_block k;
    if (!tl_pairs_wgrad_block_of(p, blockIdx.x, &k)) return; /* the whole block */
    const int steps = (int)((k.end - k.begin + BK - 1) / BK);

    /* This thread copies V channels from `col` of pair kk's x and dy rows. */
    const int t = threadIdx.x, kk = t / (64 / V), col = (t % (64 / V)) * V;
    /* The rows of this thread's pair in the next slice to issue, loaded one
     * issue ahead and checked at their turn, so the global loads of the
     * pair lists run under the multiply between (checked at once, every
     * step waited on them after the barrier).  Slices are issued in order,
     * 0, 1, 2, ... (tl_pipe_loop). */
    long long na, nc;
    tl_pairs_wgrad_load<true>(p, k, k.begin + kk, &na, &nc);
    auto issue = [&](int step, int st) {
        long long a = na, c = nc;
        tl_pairs_wgrad_check(p, &a, &c);
        if (step + 1 < steps)
            tl_pairs_wgrad_load<true>(p, k, k.begin + (long long)(step + 1) * BK + kk, &na, &nc);
        const bool av = a >= 0 && k.ci0 + col < p.c_in, bv = c >= 0 && k.co0 + col < p.c_out;
        tl_cp_async16(&s.u.s[st].a[kk][col], av ? xs + a * p.c_in + k.ci0 + col : xs, av);
        tl_cp_async16(&s.u.s[st].b[kk][col], bv ? dys + c * p.c_out + k.co0 + col : dys, bv);
    };
    /* TF32: this thread's two copies rounded once, after they landed. */
    auto landed = [&](int st) {
        if constexpr (sizeof(T) == 4 && TF32) {
            tl_round_tf32x4(&s.u.s[st].a[kk][col]);
            tl_round_tf32x4(&s.u.s[st].b[kk][col]);
        } else {
            (void)st;
        }
    };
    const int warp = t / 32, wm = warp / 4, wn = warp % 4, lane = t % 32;
    float acc[2][2][4];
    tl_pipe_zero(acc);
    tl_pipe_loop<TL_FODP_STAGES>(steps, issue, landed, [&](int st) {
        tl_fodp_multiply<T, TF32>(s.u.s[st], wm, wn, lane, acc);
    });
    /* The stages are free: the finished tile (input channel, output channel)
     * takes their place. */
    if constexpr (FMA) {
        const int ci = wm * 32 + 4 * (lane / 4), co = wn * 16 + 4 * (lane % 4);
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const float *c = acc[r / 2][r % 2];
            *reinterpret_cast<float4 *>(&s.u.c[ci + r][co]) = make_float4(c[0], c[1], c[2], c[3]);
        }
    } else {
        tl_pipe_store(s.u.c, acc, wm, wn * 16, lane);
    }
    __syncthreads();
    tl_pairs_wgrad_add(s.u.c, p, k);
#else
    (void)xs, (void)dys, (void)p;
    __trap(); /* never launched: tl_fod_pipelined_ok asks for sm_80 code */
#endif
}

bool tl_fod_pipelined_ok(const tl_conv_desc *d, int opts, const void *x, const void *dy) {
    /* dy's rows are C_out wide, as the forward's weight rows (tl_pipe_rows_ok's w). */
    return tl_pipe_asked(opts, TL_CUDA_PIPELINED_WGRAD, d->dtype) &&
           tl_pipe_rows_ok(d, x, dy, NULL) &&
           tl_pipe_code_ok((const void *)tl_fod_pipelined_wgrad_kernel<__half, false>);
}

namespace {

struct tl_fodp_wgrad_call { /* for tl_dispatch_dtype */
    const void *x, *dy;
    const tl_pairs_wgrad_args &args;
    int64_t blocks;
    cudaStream_t stream;

    template <typename T, bool TF32> tl_status run() {
        unsigned grid;
        TL_CUDA_RETURN_IF(tl_tile_grid(blocks, &grid));
        tl_fod_pipelined_wgrad_kernel<T, TF32>
            <<<grid, TL_CUDA_THREADS, 0, stream>>>((const T *)x, (const T *)dy, args);
        TL_CUDA_LAUNCHED();
        return TL_OK;
    }
};

} // namespace

tl_status tl_fod_pipelined_wgrad(tl_dtype dtype, int opts, const void *x, const void *dy,
                                 const tl_pairs_wgrad_args &args, int64_t blocks,
                                 cudaStream_t stream) {
    tl_fodp_wgrad_call call = {x, dy, args, blocks, stream};
    return tl_dispatch_dtype(dtype, (opts & TL_CUDA_TF32) != 0, call);
}
