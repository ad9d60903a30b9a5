/* Pipelined fetch-on-demand weight gradient for fp16 and bf16 (issue 23,
 * item 4), used where the caller asks for it (TL_CUDA_PIPELINED_WGRAD) until a
 * device run has verified it.
 *
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
#include "tl_cuda_mma.cuh"

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
    long long b = blockIdx.x;
    const long long co0 = (b % p.co_tiles) * TL_BN;
    b /= p.co_tiles;
    const long long ci0 = (b % p.ci_tiles) * TL_BM;
    b /= p.ci_tiles;
    if (b >= p.tiles[p.k]) return; /* past the real work: whole block */
    const long long n = tl_pair_tile_row(p.tiles, p.k, b);
    const long long begin = (b - p.tiles[n]) * p.chunk_rows;
    const long long off = p.offsets[n], count = p.offsets[n + 1] - off;
    if (begin >= count) return; /* the whole block: no barrier passed yet */
    const long long end = begin + p.chunk_rows < count ? begin + p.chunk_rows : count;
    const int steps = (int)((end - begin + BK - 1) / BK);

    /* This thread copies 8 channels from `col` of pair kk's x and dy rows. */
    const int t = threadIdx.x, kk = t / 8, col = (t % 8) * 8;
    auto issue = [&](int step, int st) {
        const long long r = begin + (long long)step * BK + kk;
        long long a = -1, c = -1;
        if (r < end) {
            a = p.pair_in[off + r];
            c = p.pair_out[off + r];
            if (a < 0 || a >= p.n_x || c < 0 || c >= p.n_y) a = c = -1;
        }
        const bool av = a >= 0 && ci0 + col < p.c_in, bv = c >= 0 && co0 + col < p.c_out;
        tl_cp_async16(&s.u.s[st].a[kk][col], av ? xs + a * p.c_in + ci0 + col : xs, av);
        tl_cp_async16(&s.u.s[st].b[kk][col], bv ? dys + c * p.c_out + co0 + col : dys, bv);
    };

    /* Warp (wm, wn) owns input channels wm * 32 .. + 32 and output channels
     * wn * 16 .. + 16: 2 x 2 mma tiles of 16 x 8. */
    const int warp = t / 32, wm = warp / 4, wn = warp % 4, lane = t % 32;
    float acc[2][2][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        if (st < steps) issue(st, st);
        tl_cp_commit(); /* one group per stage, empty or not, so the count below holds */
    }
    /* ldmatrix rows of this lane, both transposed: X^T's matrix lane / 8 is
     * pairs ((lane / 16) * 8 ..) x channels (((lane / 8) % 2) * 8 ..), so
     * matrices 0..3 are the a0..a3 registers of mma; DY's are pairs
     * (((lane / 8) % 2) * 8 ..) x channels ((lane / 16) * 8 ..), the b
     * registers of two 8-column blocks. */
    const int a_row = lane % 8 + (lane / 16) * 8, a_col = ((lane / 8) % 2) * 8;
    const int b_row = lane % 8 + ((lane / 8) % 2) * 8, b_col = (lane / 16) * 8;
    for (int step = 0; step < steps; step++) {
        tl_cp_wait<STAGES - 2>(); /* this thread's copies of `step` have landed */
        /* Everyone's have, and everyone has finished multiplying step - 1,
         * whose stage the next issue overwrites. */
        __syncthreads();
        const int next = step + STAGES - 1;
        if (next < steps) issue(next, next % STAGES);
        tl_cp_commit();
        const typename sm::stage &g = s.u.s[step % STAGES];
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
    }
    tl_cp_wait<0>();
    __syncthreads(); /* the stages are free: the finished tile takes their place */
    /* Accumulator e of tile (i, j): input channel lane / 4 (+ 8 for e >= 2),
     * output channel 2 (lane % 4) + e % 2. */
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int m = wm * 32 + i * 16 + lane / 4 + h * 8;
                const int jj = wn * 16 + j * 8 + (lane % 4) * 2;
                *reinterpret_cast<float2 *>(&s.u.c[m][jj]) =
                    make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
            }
    __syncthreads();
    for (int e = t; e < TL_BM * TL_BN; e += TL_CUDA_THREADS) {
        const int m = e / TL_BN, jj = e % TL_BN;
        const long long ci = ci0 + m, co = co0 + jj;
        if (ci < p.c_in && co < p.c_out)
            atomicAdd(&p.dw[(n * p.c_in + ci) * p.c_out + co], s.u.c[m][jj]);
    }
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

tl_status tl_fod_pipelined_wgrad(tl_dtype dtype, const void *x, const void *dy,
                                 const tl_pairs_wgrad_args &args, int64_t blocks,
                                 cudaStream_t stream) {
    unsigned grid;
    TL_CUDA_RETURN_IF(tl_tile_grid(blocks, &grid));
    if (dtype == TL_F16)
        tl_fod_pipelined_wgrad_kernel<__half><<<grid, TL_CUDA_THREADS, 0, stream>>>(
            (const __half *)x, (const __half *)dy, args);
    else if (dtype == TL_BF16)
        tl_fod_pipelined_wgrad_kernel<__nv_bfloat16><<<grid, TL_CUDA_THREADS, 0, stream>>>(
            (const __nv_bfloat16 *)x, (const __nv_bfloat16 *)dy, args);
    else
        return TL_ERR_UNSUPPORTED;
    TL_CUDA_LAUNCHED();
    return TL_OK;
}
