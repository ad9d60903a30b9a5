/* Pipelined fetch-on-demand kernels (issue 23, item 4), used where the
 * caller asks for them until a device run has verified them: the forward
 * (fp16, bf16, TF32; TL_CUDA_PIPELINED_FOD_FORWARD) and the weight gradient
 * (fp16, bf16; TL_CUDA_PIPELINED_WGRAD).
 *
 * Plain fp32 forwards run the same tile on the CUDA cores where
 * TL_CUDA_PIPELINED_FP32 asks for it (tl_pipe_fma_multiply).
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
 * fp32 accumulator of dw[n].  The chunk runs as slices of 32 pairs, 3 of
 * them in flight while the tensor cores multiply the oldest: each pair's x
 * row (through pair_in) and dy row (through pair_out) are copied into shared
 * memory by cp.async, 16 bytes a copy, pairs past the chunk and channels
 * past C_in / C_out zero-filled by the copy; fragments are loaded with
 * ldmatrix (X^T transposed on the way, from the pair-major slice) and
 * multiplied with mma.m16n8k16.  One barrier per slice, where the previous
 * kernel had two and fetched one slice ahead into registers.
 *
 * Requires sm_80 code, C_in and C_out multiples of 8 and x and dy 16-byte
 * aligned; tl_fod_pipelined_ok says whether a call qualifies. */
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
           tl_pipe_rows_ok(d->dtype, d, x, w, NULL) &&
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

#define TL_FODP_BK 32
#define TL_FODP_STAGES 4

static_assert(TL_CUDA_THREADS == 256 && TL_BM == 64 && TL_BN == 64, "8 warps of 32 x 16");
static_assert(TL_FODP_BK * TL_BM / 8 == TL_CUDA_THREADS, "one x copy and one dy copy a thread");

/* One slice: the pairs' x rows a[kk][m] (channel ci0 + m of pair kk) and dy
 * rows b[kk][j], rows skewed by 16 bytes (144 bytes apart: the 8 rows an
 * ldmatrix phase reads fall in different banks). */
template <typename T> struct tl_fodp_smem {
    static constexpr int LD = 64 + 8, LDC = 64 + 4;
    struct stage {
        T a[TL_FODP_BK][LD];
        T b[TL_FODP_BK][LD];
    };
    union {
        stage s[TL_FODP_STAGES];
        float c[TL_BM][LDC];
    } u;
};

template <typename T>
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_fod_pipelined_wgrad_kernel(const T *xs, const T *dys, tl_pairs_wgrad_args p) {
#ifdef TL_PIPE_DEVICE
    typedef tl_fodp_smem<T> sm;
    constexpr int STAGES = TL_FODP_STAGES, BK = TL_FODP_BK;
    __shared__ __align__(128) sm s;
    tl_pairs_wgrad_block k;
    if (!tl_pairs_wgrad_block_of(p, blockIdx.x, &k)) return; /* the whole block */
    const int steps = (int)((k.end - k.begin + BK - 1) / BK);

    /* This thread copies 8 channels from `col` of pair kk's x and dy rows. */
    const int t = threadIdx.x, kk = t / 8, col = (t % 8) * 8;
    auto issue = [&](int step, int st) {
        long long a, c;
        tl_pairs_wgrad_pair<true>(p, k, k.begin + (long long)step * BK + kk, &a, &c);
        const bool av = a >= 0 && k.ci0 + col < p.c_in, bv = c >= 0 && k.co0 + col < p.c_out;
        tl_cp_async16(&s.u.s[st].a[kk][col], av ? xs + a * p.c_in + k.ci0 + col : xs, av);
        tl_cp_async16(&s.u.s[st].b[kk][col], bv ? dys + c * p.c_out + k.co0 + col : dys, bv);
    };

    /* Warp (wm, wn) owns input channels wm * 32 .. + 32 and output channels
     * wn * 16 .. + 16: 2 x 2 mma tiles of 16 x 8. */
    const int warp = t / 32, wm = warp / 4, wn = warp % 4, lane = t % 32;
    float acc[2][2][4];
    tl_pipe_zero(acc);
    /* ldmatrix rows of this lane, both transposed: X^T's matrix lane / 8 is
     * pairs ((lane / 16) * 8 ..) x channels (((lane / 8) % 2) * 8 ..), so
     * matrices 0..3 are the a0..a3 registers of mma; DY's are pairs
     * (((lane / 8) % 2) * 8 ..) x channels ((lane / 16) * 8 ..), the b
     * registers of two 8-column blocks. */
    const int a_row = lane % 8 + (lane / 16) * 8, a_col = ((lane / 8) % 2) * 8;
    const int b_row = lane % 8 + ((lane / 8) % 2) * 8, b_col = (lane / 16) * 8;
    auto multiply = [&](int st) {
        const typename sm::stage &g = s.u.s[st];
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
    };
    tl_pipe_loop<STAGES>(steps, issue, [](int) {}, multiply);
    /* The stages are free: the finished tile (input channel, output channel)
     * takes their place. */
    tl_pipe_store(s.u.c, acc, wm, wn * 16, lane);
    __syncthreads();
    tl_pairs_wgrad_add(s.u.c, p, k);
#else
    (void)xs, (void)dys, (void)p;
    __trap(); /* never launched: tl_fod_pipelined_ok asks for sm_80 code */
#endif
}

bool tl_fod_pipelined_ok(const tl_conv_desc *d, const void *x, const void *dy) {
    if (d->dtype != TL_F16 && d->dtype != TL_BF16) return false;
    if (!tl_vec_ok(x, d->c_in, 2) || !tl_vec_ok(dy, d->c_out, 2)) return false;
    return tl_pipe_code_ok((const void *)tl_fod_pipelined_wgrad_kernel<__half>);
}

namespace {

struct tl_fodp_wgrad_call { /* for tl_dispatch_dtype */
    const void *x, *dy;
    const tl_pairs_wgrad_args &args;
    int64_t blocks;
    cudaStream_t stream;

    template <typename T, bool TF32> tl_status run() {
        if constexpr (std::is_same<T, float>::value) {
            return TL_ERR_UNSUPPORTED; /* tl_fod_pipelined_ok rules fp32 out */
        } else {
            unsigned grid;
            TL_CUDA_RETURN_IF(tl_tile_grid(blocks, &grid));
            tl_fod_pipelined_wgrad_kernel<T>
                <<<grid, TL_CUDA_THREADS, 0, stream>>>((const T *)x, (const T *)dy, args);
            TL_CUDA_LAUNCHED();
            return TL_OK;
        }
    }
};

} // namespace

tl_status tl_fod_pipelined_wgrad(tl_dtype dtype, const void *x, const void *dy,
                                 const tl_pairs_wgrad_args &args, int64_t blocks,
                                 cudaStream_t stream) {
    tl_fodp_wgrad_call call = {x, dy, args, blocks, stream};
    return tl_dispatch_dtype(dtype, false, call);
}
