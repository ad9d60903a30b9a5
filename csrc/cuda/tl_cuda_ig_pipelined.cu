/* Pipelined implicit-GEMM forward for fp16, bf16 and TF32 (issue 23, item
 * 4), used where the caller asks for it (TL_CUDA_PIPELINED_FORWARD) until a device
 * run has verified it.
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
#include "tl_cuda_gemm.cuh"
#include "tl_cuda_mma.cuh"

#define TL_PIPE_BM 64
/* Shared memory of one block stays under the 48 KiB that needs no opt-in:
 * 3 stages of 64-row x 64-byte and 64-byte-deep x 128-column slices
 * (41 KiB in halves), or 4 at 64 columns. */
#define TL_PIPE_STAGES(BN) ((BN) > 64 ? 3 : 4)

static_assert(TL_CUDA_THREADS == 256, "8 warps: 2 x 4 warp tiles");

/* Slice shape of a storage type: V values per 16-byte copy, BK values of
 * C_in per slice (64 bytes: 32 halves, 16 floats; one A copy per thread),
 * KF the depth of one mma (16 for fp16 / bf16, 8 for TF32). */
template <typename T> struct tl_pipe_shape {
    static constexpr int V = 16 / (int)sizeof(T), BK = 64 / (int)sizeof(T);
    static constexpr int KF = sizeof(T) == 2 ? 16 : 8;
    static_assert(TL_PIPE_BM * BK / V == TL_CUDA_THREADS, "one A copy per thread");
};

/* The stages of slices and, after the last one, the finished fp32 tile.
 * A's rows are skewed by 16 bytes so the 8 rows an ldmatrix phase reads fall
 * in different banks (80 bytes apart); B's by 8 values: 272 or 144 bytes in
 * halves (ldmatrix), 8 words modulo 32 in floats, where the 4 rows of one
 * TF32 fragment load are read word by word.  Every row starts 16-byte
 * aligned, as ldmatrix and cp.async need. */
template <typename T, int BN> struct tl_pipe_smem {
    typedef tl_pipe_shape<T> sh;
    static constexpr int STAGES = TL_PIPE_STAGES(BN);
    static constexpr int LDA = sh::BK + sh::V, LDB = BN + 8, LDC = BN + 4;
    struct stage {
        T a[TL_PIPE_BM][LDA]; /* gathered x rows: a[m][kk] */
        T b[sh::BK][LDB];     /* w[n] rows k0 + kk, columns c0 .. c0 + BN */
    };
    union {
        stage s[STAGES];
        float c[TL_PIPE_BM][LDC];
    } u;
    static_assert(sizeof(stage) % 16 == 0, "stages keep 16-byte rows aligned");
};

struct tl_pipe_args {
    const int *nbr;
    const tl_kv *order; /* mask-sorted rows (tl_ig_sort / tl_ig_derive) */
    long long n_in, n_out, k, cin, cout, col_tiles;
};

/* fp16 / bf16 (T) or TF32 (T = float) tensor cores: acc[i][j] += the warp's
 * rows wm * 32 + 16 i .. and columns n0 + 8 j .. of the stage's slice. */
template <typename T, int BN>
__device__ __forceinline__ void tl_pipe_multiply(const typename tl_pipe_smem<T, BN>::stage &g,
                                                 int wm, int n0, int lane,
                                                 float (&acc)[2][BN / 32][4]) {
    typedef tl_pipe_shape<T> sh;
    constexpr int NB = BN / 32;
    /* A: lane gives row lane % 16 at column (lane / 16) * V, 16 bytes on:
     * matrices 0..3 are the a0..a3 registers of either mma (in floats each
     * 8 x 8 matrix of 16-bit values is 8 rows of 4 floats). */
    const int a_row = lane % 16, a_col = (lane / 16) * sh::V;
#pragma unroll
    for (int kk = 0; kk < sh::BK; kk += sh::KF) {
        unsigned a[2][4], b[NB][2];
#pragma unroll
        for (int i = 0; i < 2; i++)
            tl_ldmatrix4<false>(a[i], &g.a[wm * 32 + i * 16 + a_row][kk + a_col]);
        if constexpr (sizeof(T) == 2) {
            /* B (k) row lane % 8 + ((lane / 8) % 2) * 8 at column (lane / 16) * 8,
             * transposed: matrices 0, 1 are k 0-7 and 8-15 of one 8-column block,
             * 2, 3 of the next. */
            const int b_row = lane % 8 + ((lane / 8) % 2) * 8, b_col = (lane / 16) * 8;
#pragma unroll
            for (int j = 0; j < NB; j += 2) {
                unsigned r[4];
                tl_ldmatrix4<true>(r, &g.b[kk + b_row][n0 + j * 8 + b_col]);
                b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < NB; j++) tl_mma16816<T>(acc[i][j], a[i], b[j]);
        } else {
            /* TF32's b0, b1: k = lane % 4 (+ 4), column lane / 4, rounded when
             * staged. */
#pragma unroll
            for (int j = 0; j < NB; j++) {
                b[j][0] = __float_as_uint(g.b[kk + lane % 4][n0 + j * 8 + lane / 4]);
                b[j][1] = __float_as_uint(g.b[kk + lane % 4 + 4][n0 + j * 8 + lane / 4]);
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < NB; j++) tl_mma1688_tf32(acc[i][j], a[i], b[j]);
        }
    }
}

template <typename T, int BN>
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_ig_pipelined_kernel(const T *x, const T *w, T *y, tl_pipe_args p) {
#ifdef TL_PIPE_DEVICE
    typedef tl_pipe_smem<T, BN> sm;
    typedef tl_pipe_shape<T> sh;
    constexpr int STAGES = sm::STAGES, V = sh::V, BK = sh::BK;
    constexpr int BCOPIES = BK * BN / V / TL_CUDA_THREADS;
    constexpr int NB = BN / 32; /* 8-column mma blocks per warp: 2 or 4 */
    constexpr bool TF32 = sizeof(T) == 4;
    static_assert(BCOPIES >= 1 && BK * BN / V % TL_CUDA_THREADS == 0, "whole passes");
    __shared__ __align__(128) sm s;
    __shared__ long long outs[TL_PIPE_BM];
    __shared__ unsigned used_part[TL_PIPE_BM / 32];
    __shared__ int used_n[32];
    const int t = threadIdx.x, warp = t / 32;
    const long long o0 = (blockIdx.x / p.col_tiles) * TL_PIPE_BM;
    const long long c0 = (blockIdx.x % p.col_tiles) * BN;
    if (t < TL_PIPE_BM) { /* whole warps: the OR has every lane */
        const long long j = o0 + t;
        unsigned m = 0;
        long long o = -1;
        if (j < p.n_out) {
            o = p.order[j].val;
            m = p.order[j].key;
        }
        outs[t] = o;
        for (int d = 16; d > 0; d >>= 1) m |= __shfl_xor_sync(0xffffffffu, m, d);
        if ((t & 31) == 0) used_part[t / 32] = m;
    }
    __syncthreads();
    unsigned used = 0;
    for (int i = 0; i < TL_PIPE_BM / 32; i++) used |= used_part[i];
    if (t == 0)
        for (int n = 0, u = 0; n < 32; n++)
            if ((used >> n) & 1u) used_n[u++] = n;
    __syncthreads();
    const int slices = (int)((p.cin + BK - 1) / BK);
    const int steps = __popc(used) * slices;

    /* This thread's copies: A row ar, V channels from ac; B (row, column)
     * pairs e = t + i * threads. */
    const int ar = t / (BK / V), ac = (t % (BK / V)) * V;
    const long long a_out = outs[ar];
    auto issue = [&](int step, int st) {
        const int n = used_n[step / slices];
        const long long k0 = (long long)(step % slices) * BK;
        long long i = a_out >= 0 ? p.nbr[a_out * p.k + n] : -1;
        const bool av = i >= 0 && i < p.n_in && k0 + ac < p.cin;
        tl_cp_async16(&s.u.s[st].a[ar][ac], av ? x + i * p.cin + k0 + ac : x, av);
        const T *wrow = w + n * p.cin * p.cout;
#pragma unroll
        for (int c = 0; c < BCOPIES; c++) {
            const int e = t + c * TL_CUDA_THREADS, kk = e / (BN / V), j = (e % (BN / V)) * V;
            const bool bv = k0 + kk < p.cin && c0 + j < p.cout;
            tl_cp_async16(&s.u.s[st].b[kk][j], bv ? wrow + (k0 + kk) * p.cout + c0 + j : w, bv);
        }
    };
    /* TF32: this thread's copies of stage st rounded in place, once, after
     * they landed and before the barrier that shows them to the others. */
    auto round = [&](int st) {
        if constexpr (TF32) {
            tl_round_tf32x4(&s.u.s[st].a[ar][ac]);
#pragma unroll
            for (int c = 0; c < BCOPIES; c++) {
                const int e = t + c * TL_CUDA_THREADS, kk = e / (BN / V), j = (e % (BN / V)) * V;
                tl_round_tf32x4(&s.u.s[st].b[kk][j]);
            }
        } else {
            (void)st;
        }
    };

    /* Warp (wm, wn) owns rows wm * 32 .. + 32 and columns wn * BN / 4 ..,
     * as 2 x NB mma tiles of 16 x 8. */
    const int wm = warp / 4, wn = warp % 4, lane = t % 32;
    float acc[2][NB][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < NB; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        if (st < steps) issue(st, st);
        tl_cp_commit(); /* one group per stage, empty or not, so the count below holds */
    }
    for (int step = 0; step < steps; step++) {
        tl_cp_wait<STAGES - 2>(); /* this thread's copies of `step` have landed */
        round(step % STAGES);
        /* Everyone's have, and everyone has finished multiplying step - 1,
         * whose stage the next issue overwrites. */
        __syncthreads();
        const int next = step + STAGES - 1;
        if (next < steps) issue(next, next % STAGES);
        tl_cp_commit();
        tl_pipe_multiply<T, BN>(s.u.s[step % STAGES], wm, wn * (BN / 4), lane, acc);
    }
    tl_cp_wait<0>();
    __syncthreads(); /* the stages are free: the finished tile takes their place */
    /* Accumulator e of tile (i, j): row lane / 4 (+ 8 for e >= 2), column
     * 2 (lane % 4) + e % 2. */
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < NB; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int m = wm * 32 + i * 16 + lane / 4 + h * 8;
                const int col = wn * (BN / 4) + j * 8 + (lane % 4) * 2;
                *reinterpret_cast<float2 *>(&s.u.c[m][col]) =
                    make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
            }
    __syncthreads();
    /* V channels (16 bytes) of one output row per store. */
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
    const bool tf32 = d->dtype == TL_F32 && (opts & TL_CUDA_TF32);
    if (d->dtype != TL_F16 && d->dtype != TL_BF16 && !tf32) return false;
    if (!tl_ig_sorted(TL_CUDA_IMPLICIT_GEMM, false, d)) return false;
    const int64_t es = tl_dtype_bytes(d->dtype);
    if (!tl_vec_ok(x, d->c_in, es) || !tl_vec_ok(w, d->c_out, es) || !tl_vec_ok(y, d->c_out, es))
        return false;
    return tl_pipe_code_ok((const void *)tl_ig_pipelined_kernel<__half, 64>);
}

namespace {

template <typename T, int BN>
tl_status tl_pipe_launch(const tl_conv_desc *d, const void *x, const void *w, void *y,
                         tl_pipe_args p, cudaStream_t stream) {
    p.col_tiles = tl_cuda_ceil_div(d->c_out, BN);
    unsigned grid;
    TL_CUDA_RETURN_IF(tl_tile_grid(tl_cuda_ceil_div(d->n_out, TL_PIPE_BM) * p.col_tiles, &grid));
    tl_ig_pipelined_kernel<T, BN>
        <<<grid, TL_CUDA_THREADS, 0, stream>>>((const T *)x, (const T *)w, (T *)y, p);
    TL_CUDA_LAUNCHED();
    return TL_OK;
}

struct tl_pipe_call { /* for tl_dispatch_dtype */
    const tl_conv_desc *d;
    const void *x, *w;
    void *y;
    tl_pipe_args p;
    cudaStream_t stream;

    template <typename T, bool TF32> tl_status run() {
        if constexpr (std::is_same<T, float>::value && !TF32) {
            return TL_ERR_UNSUPPORTED; /* tl_ig_pipelined_ok rules plain fp32 out */
        } else {
            return d->c_out > 64 ? tl_pipe_launch<T, 128>(d, x, w, y, p, stream)
                                 : tl_pipe_launch<T, 64>(d, x, w, y, p, stream);
        }
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
