/* The tile of the pipelined forward kernels (tl_cuda_ig_pipelined.cu,
 * tl_cuda_fod_pipelined.cu): a block of TL_CUDA_THREADS threads multiplies
 * TL_PIPE_BM gathered x rows by BN output channels of one weight matrix per
 * step, a step being one 64-byte slice of C_in (32 halves, 16 floats), with
 * TL_PIPE_STAGES(BN) - 1 slices in flight (cp.async) while the tensor cores
 * multiply the oldest (mma.m16n8k16, m16n8k8 in TF32, fragments by ldmatrix),
 * or, in plain fp32, the CUDA cores (FMA, float4 shared-memory reads).
 * The kernels differ in where a step's x rows and weights come from (one
 * `issue` each) and where the finished tile goes. */
#ifndef TL_CUDA_PIPE_TILE_CUH
#define TL_CUDA_PIPE_TILE_CUH

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

/* One slice's copies by thread t: the A row ar = t / (BK / V), V channels
 * from k0 + ac of x row `row` (< 0: zeros), and the B rows k0 .. k0 + BK of
 * the (cin, cout) weights wn, columns c0 .. c0 + BN (past cin or cout:
 * zeros).  Every copy is a whole 16-byte run (cin, cout multiples of V;
 * x and wn 16-byte aligned), or zeros without a read. */
template <typename T, int BN>
__device__ __forceinline__ void tl_pipe_issue(typename tl_pipe_smem<T, BN>::stage &g, int t,
                                              const T *x, long long row, long long cin,
                                              const T *wn, long long cout, long long k0,
                                              long long c0) {
    typedef tl_pipe_shape<T> sh;
    constexpr int V = sh::V, BK = sh::BK, BCOPIES = BK * BN / V / TL_CUDA_THREADS;
    static_assert(BCOPIES >= 1 && BK * BN / V % TL_CUDA_THREADS == 0, "whole passes");
    const int ar = t / (BK / V), ac = (t % (BK / V)) * V;
    const bool av = row >= 0 && k0 + ac < cin;
    tl_cp_async16(&g.a[ar][ac], av ? x + row * cin + k0 + ac : x, av);
#pragma unroll
    for (int c = 0; c < BCOPIES; c++) {
        const int e = t + c * TL_CUDA_THREADS, kk = e / (BN / V), j = (e % (BN / V)) * V;
        const bool bv = k0 + kk < cin && c0 + j < cout;
        tl_cp_async16(&g.b[kk][j], bv ? wn + (k0 + kk) * cout + c0 + j : wn, bv);
    }
}

/* Plain fp32 (FMA: no TF32) on the CUDA cores, the same per-warp 32 x BN / 4
 * tile and accumulator count as the tensor-core path: lane (lane / LC,
 * lane % LC) owns rows wm * 32 + lane / LC + LR i (i < RM) and the 4
 * columns n0 + 4 (lane % LC) ..; per 4 steps of C_in it reads a float4 of
 * each of its rows (the LR rows a warp reads start 80 bytes apart: 20 floats,
 * so their 16-byte runs fall in different banks) and a float4 of columns per
 * step (a warp's LC lanes read one contiguous run), for RM x 16
 * multiply-adds. */
template <int BN> struct tl_pipe_fma_shape {
    static constexpr int LC = BN / 16, LR = 32 / LC, RM = 32 / LR;
    static_assert(LC * LR == 32 && RM == 2 * (BN / 32), "the tensor-core path's accumulators");
};

/* acc[i / NB][i % NB][q] holds row i, column q of the lane's FMA tile. */
template <int BN>
__device__ __forceinline__ void tl_pipe_fma_multiply(
    const typename tl_pipe_smem<float, BN>::stage &g, int wm, int n0, int lane,
    float (&acc)[2][BN / 32][4]) {
    typedef tl_pipe_fma_shape<BN> f;
    constexpr int NB = BN / 32, BK = tl_pipe_shape<float>::BK;
    const int row = wm * 32 + lane / f::LC, col = n0 + 4 * (lane % f::LC);
#pragma unroll
    for (int kk = 0; kk < BK; kk += 4) {
        float4 a[f::RM];
#pragma unroll
        for (int i = 0; i < f::RM; i++)
            a[i] = *reinterpret_cast<const float4 *>(&g.a[row + f::LR * i][kk]);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const float4 b = *reinterpret_cast<const float4 *>(&g.b[kk + q][col]);
#pragma unroll
            for (int i = 0; i < f::RM; i++) {
                const float v = q == 0 ? a[i].x : q == 1 ? a[i].y : q == 2 ? a[i].z : a[i].w;
                float *r = acc[i / NB][i % NB];
                r[0] = fmaf(v, b.x, r[0]);
                r[1] = fmaf(v, b.y, r[1]);
                r[2] = fmaf(v, b.z, r[2]);
                r[3] = fmaf(v, b.w, r[3]);
            }
        }
    }
}

/* TF32: thread t's copies of a slice (tl_pipe_issue) rounded in place, once,
 * after they landed and before the barrier that shows them to the others;
 * nothing for halves and plain fp32 (FMA). */
template <typename T, int BN, bool FMA>
__device__ __forceinline__ void tl_pipe_round(typename tl_pipe_smem<T, BN>::stage &g, int t) {
    if constexpr (sizeof(T) == 4 && !FMA) {
        typedef tl_pipe_shape<T> sh;
        constexpr int V = sh::V, BK = sh::BK, BCOPIES = BK * BN / V / TL_CUDA_THREADS;
        tl_round_tf32x4(&g.a[t / (BK / V)][(t % (BK / V)) * V]);
#pragma unroll
        for (int c = 0; c < BCOPIES; c++) {
            const int e = t + c * TL_CUDA_THREADS;
            tl_round_tf32x4(&g.b[e / (BN / V)][(e % (BN / V)) * V]);
        }
    } else {
        (void)g, (void)t;
    }
}

/* acc[...] = 0 for a per-warp accumulator array of any shape. */
template <typename A> __device__ __forceinline__ void tl_pipe_zero(A &acc) {
    float *f = &acc[0][0][0];
#pragma unroll
    for (int e = 0; e < (int)(sizeof(A) / sizeof(float)); e++) f[e] = 0.0f;
}

/* The pipeline over `steps` slices in STAGES stages: issue(step, stage)
 * starts a slice's copies (cp.async), called for steps 0, 1, 2, ... in
 * order, once each; landed(stage) runs once this thread's
 * copies of a slice have landed and before the barrier that shows them to
 * the others, multiply(stage) consumes it.  Returns with every copy landed
 * and the block past a barrier, so the stages may be reused. */
template <int STAGES, typename Issue, typename Landed, typename Multiply>
__device__ __forceinline__ void tl_pipe_loop(int steps, Issue issue, Landed landed,
                                             Multiply multiply) {
#pragma unroll
    for (int st = 0; st < STAGES - 1; st++) {
        if (st < steps) issue(st, st);
        tl_cp_commit(); /* one group per stage, empty or not, so the count below holds */
    }
    for (int step = 0; step < steps; step++) {
        tl_cp_wait<STAGES - 2>(); /* this thread's copies of `step` have landed */
        landed(step % STAGES);
        /* Everyone's have, and everyone has finished multiplying step - 1,
         * whose stage the next issue overwrites. */
        __syncthreads();
        const int next = step + STAGES - 1;
        if (next < steps) issue(next, next % STAGES);
        tl_cp_commit();
        multiply(step % STAGES);
    }
    tl_cp_wait<0>();
    __syncthreads();
}

/* A warp's accumulators (rows wm * 32 .., columns n0 ..) into the fp32 tile
 * c: accumulator e of mma tile (i, j) is row wm * 32 + 16 i + lane / 4 (+ 8
 * for e >= 2), column n0 + 8 j + 2 (lane % 4) + e % 2. */
template <int NB, int LDC>
__device__ __forceinline__ void tl_pipe_store(float (*c)[LDC], const float (&acc)[2][NB][4],
                                              int wm, int n0, int lane) {
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < NB; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int m = wm * 32 + i * 16 + lane / 4 + h * 8;
                const int col = n0 + j * 8 + (lane % 4) * 2;
                *reinterpret_cast<float2 *>(&c[m][col]) =
                    make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
            }
}

/* The FMA tile's accumulators (tl_pipe_fma_multiply) into the fp32 tile c. */
template <int BN, int LDC>
__device__ __forceinline__ void tl_pipe_fma_store(float (*c)[LDC],
                                                  const float (&acc)[2][BN / 32][4], int wm,
                                                  int n0, int lane) {
    typedef tl_pipe_fma_shape<BN> f;
    constexpr int NB = BN / 32;
    const int row = wm * 32 + lane / f::LC, col = n0 + 4 * (lane % f::LC);
#pragma unroll
    for (int i = 0; i < f::RM; i++) {
        const float *r = acc[i / NB][i % NB];
        *reinterpret_cast<float4 *>(&c[row + f::LR * i][col]) = make_float4(r[0], r[1], r[2], r[3]);
    }
}

/* The forward tile: `steps` slices, issue(step, stage) copying each (with
 * tl_pipe_issue), multiplied into per-warp accumulators; then the finished
 * fp32 tile in s.u.c[m][j] (m < TL_PIPE_BM, j < BN), visible to the whole
 * block.  Warp (wm, wn) owns rows wm * 32 .. + 32 and columns wn * BN / 4 ..,
 * as 2 x BN / 32 mma tiles of 16 x 8, or with FMA (plain fp32) as
 * tl_pipe_fma_multiply's lane tiles. */
template <typename T, int BN, bool FMA, typename Issue>
__device__ __forceinline__ void tl_pipe_run(tl_pipe_smem<T, BN> &s, int steps, Issue issue) {
    static_assert(!FMA || std::is_same<T, float>::value, "FMA tiles are plain fp32");
    constexpr int NB = BN / 32;
    const int t = threadIdx.x, warp = t / 32, wm = warp / 4, wn = warp % 4, lane = t % 32;
    float acc[2][NB][4];
    tl_pipe_zero(acc);
    tl_pipe_loop<tl_pipe_smem<T, BN>::STAGES>(
        steps, issue, [&](int st) { tl_pipe_round<T, BN, FMA>(s.u.s[st], t); },
        [&](int st) {
            if constexpr (FMA)
                tl_pipe_fma_multiply<BN>(s.u.s[st], wm, wn * (BN / 4), lane, acc);
            else
                tl_pipe_multiply<T, BN>(s.u.s[st], wm, wn * (BN / 4), lane, acc);
        });
    /* the stages are free */
    if constexpr (FMA)
        tl_pipe_fma_store<BN>(s.u.c, acc, wm, wn * (BN / 4), lane);
    else
        tl_pipe_store(s.u.c, acc, wm, wn * (BN / 4), lane);
    __syncthreads();
}

/* For a dtype dispatch's run<T, TF32>() (tl_dispatch_dtype): the caller's
 * f.launch<T, BN, FMA>() at the tile width for c_out, 128 columns where c_out
 * > 64, else 64; FMA for plain fp32 (no TF32). */
template <typename T, bool TF32, typename F>
static inline tl_status tl_pipe_by_width(F &f, int64_t c_out) {
    constexpr bool FMA = std::is_same<T, float>::value && !TF32;
    return c_out > 64 ? f.template launch<T, 128, FMA>() : f.template launch<T, 64, FMA>();
}

/* Host side: whether option bits `opts` ask for a pipelined kernel (the
 * forwards here, the fetch-on-demand weight gradient) in `dtype`: plain fp32
 * (no TL_CUDA_TF32) by TL_CUDA_PIPELINED_FP32, the tensor-core types (fp16,
 * bf16, TF32) by the kernel's own bit. */
static inline bool tl_pipe_asked(int opts, int bit, tl_dtype dtype) {
    const bool fma = dtype == TL_F32 && !(opts & TL_CUDA_TF32);
    return (opts & (fma ? TL_CUDA_PIPELINED_FP32 : bit)) != 0;
}

/* Host side: whether x (c_in), w (c_out) and y (c_out; NULL: not read as
 * rows here) qualify for the pipelined tiles in d's dtype (fp16, bf16, fp32),
 * with rows of whole 16-byte runs, 16-byte aligned. */
static inline bool tl_pipe_rows_ok(const tl_conv_desc *d, const void *x, const void *w,
                                   const void *y) {
    if (d->dtype != TL_F16 && d->dtype != TL_BF16 && d->dtype != TL_F32) return false;
    const int64_t es = tl_dtype_bytes(d->dtype);
    return tl_vec_ok(x, d->c_in, es) && tl_vec_ok(w, d->c_out, es) &&
           (!y || tl_vec_ok(y, d->c_out, es));
}

#endif
