/* Tile kernels over per-kernel-row pair lists, shared by fetch-on-demand
 * (GATHER = true: rows are read from x / dy through pair_in / pair_out, and
 * results are added with atomics) and gather-scatter (GATHER = false: rows
 * are read from dense gather buffers, one kernel row per launch, and results
 * are added without atomics because no output row repeats within a kernel
 * row).  Each file instantiates only its own GATHER value. */
#ifndef TL_CUDA_PAIR_GEMM_CUH
#define TL_CUDA_PAIR_GEMM_CUH

#include "tl_cuda_gemm.cuh"

/* Arguments of tl_pairs_forward_kernel, by value. */
struct tl_pairs_fwd_args {
    const long long *offsets;
    const int *pair_in, *pair_out;
    float *acc;         /* (n_out, c_out) fp32 accumulator */
    long long n_src;    /* rows of the A source (x, or the gather buffer) */
    long long n_out, c_in, c_out;
    long long row_tiles, col_tiles;
    long long n_first;  /* kernel row of block 0 */
};

/* acc[pair_out[j]] += A(j) @ w[n] for the pairs j of kernel row n, where
 * A(j) = src[pair_in[j]] (GATHER) or src[j - offsets[n]] (gather buffer). */
template <typename T, bool TF32, bool GATHER>
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_pairs_forward_kernel(const T *src, const T *w, tl_pairs_fwd_args p) {
    __shared__ tl_tile_smem s;
    __shared__ long long rows[TL_BM], outs[TL_BM];
    long long b = blockIdx.x;
    const long long c0 = (b % p.col_tiles) * TL_BN;
    b /= p.col_tiles;
    const long long j0 = (b % p.row_tiles) * TL_BM;
    const long long n = p.n_first + b / p.row_tiles;
    const long long off = p.offsets[n], count = p.offsets[n + 1] - off;
    if (j0 >= count) return; /* the whole block: no barrier passed yet */
    if (threadIdx.x < TL_BM) {
        const long long j = j0 + threadIdx.x;
        long long r = -1, o = -1;
        if (j < count) {
            r = GATHER ? p.pair_in[off + j] : j;
            o = p.pair_out[off + j];
            if (r < 0 || r >= p.n_src || o < 0 || o >= p.n_out) r = o = -1;
        }
        rows[threadIdx.x] = r;
        outs[threadIdx.x] = o;
    }
    __syncthreads();
    typename tl_acc_select<TF32>::type acc;
    acc.zero();
    const T *wn = w + n * p.c_in * p.c_out;
    for (long long k0 = 0; k0 < p.c_in; k0 += TL_BK) {
        tl_stage_rows(s, src, p.c_in, rows, k0, p.c_in);
        tl_stage_weight(s, wn, p.c_out, k0, p.c_in, c0, p.c_out);
        __syncthreads();
        acc.step(s);
        __syncthreads();
    }
    acc.store(s);
    __syncthreads();
    for (int e = threadIdx.x; e < TL_BM * TL_BN; e += TL_CUDA_THREADS) {
        const int m = e / TL_BN, jj = e % TL_BN;
        const long long o = outs[m], col = c0 + jj;
        if (o < 0 || col >= p.c_out) continue;
        if (GATHER)
            atomicAdd(&p.acc[o * p.c_out + col], s.c[m][jj]);
        else
            p.acc[o * p.c_out + col] += s.c[m][jj];
    }
}

/* Arguments of tl_pairs_wgrad_kernel, by value. */
struct tl_pairs_wgrad_args {
    const long long *offsets;
    const int *pair_in, *pair_out;
    float *dw;          /* (k, c_in, c_out) fp32 accumulator */
    long long n_x, n_y; /* rows of the x and dy sources */
    long long c_in, c_out;
    long long ci_tiles, co_tiles, chunks, chunk_rows;
    long long n_first;
};

/* dw[n] += X(j)^T DY(j) over one chunk of kernel row n's pairs, where
 * X(j) = x[pair_in[j]], DY(j) = dy[pair_out[j]] (GATHER) or the j-th rows of
 * the gather buffers.  Chunks of the same tile meet in fp32 atomics. */
template <typename T, bool TF32, bool GATHER>
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_pairs_wgrad_kernel(const T *xs, const T *dys, tl_pairs_wgrad_args p) {
    __shared__ tl_tile_smem s;
    __shared__ long long ra[TL_BK], rb[TL_BK];
    long long b = blockIdx.x;
    const long long co0 = (b % p.co_tiles) * TL_BN;
    b /= p.co_tiles;
    const long long ci0 = (b % p.ci_tiles) * TL_BM;
    b /= p.ci_tiles;
    const long long begin = (b % p.chunks) * p.chunk_rows;
    const long long n = p.n_first + b / p.chunks;
    const long long off = p.offsets[n], count = p.offsets[n + 1] - off;
    if (begin >= count) return; /* the whole block: no barrier passed yet */
    const long long end = begin + p.chunk_rows < count ? begin + p.chunk_rows : count;
    typename tl_acc_select<TF32>::type acc;
    acc.zero();
    for (long long r0 = begin; r0 < end; r0 += TL_BK) {
        if (threadIdx.x < TL_BK) {
            const long long r = r0 + threadIdx.x;
            long long a = -1, c = -1;
            if (r < end) {
                /* Gather buffers hold kernel row n's pairs from row 0. */
                a = GATHER ? p.pair_in[off + r] : r;
                c = GATHER ? p.pair_out[off + r] : r;
                if (a < 0 || a >= p.n_x || c < 0 || c >= p.n_y) a = c = -1;
            }
            ra[threadIdx.x] = a;
            rb[threadIdx.x] = c;
        }
        __syncthreads();
        tl_stage_cols(s.a, xs, p.c_in, ra, ci0, p.c_in);
        tl_stage_cols(s.b, dys, p.c_out, rb, co0, p.c_out);
        __syncthreads();
        acc.step(s);
        __syncthreads();
    }
    acc.store(s);
    __syncthreads();
    for (int e = threadIdx.x; e < TL_BM * TL_BN; e += TL_CUDA_THREADS) {
        const int m = e / TL_BN, jj = e % TL_BN;
        const long long ci = ci0 + m, co = co0 + jj;
        if (ci < p.c_in && co < p.c_out)
            atomicAdd(&p.dw[(n * p.c_in + ci) * p.c_out + co], s.c[m][jj]);
    }
}

/* Shared checks of the pair-list entry points. */
static inline tl_status tl_pairs_args_check(const tl_conv_desc *d, const tl_cuda_pairs *p) {
    if (!p || p->n_pairs < 0 || !p->offsets) return TL_ERR_INVALID;
    if (p->n_pairs > 0 && (!p->in || !p->out)) return TL_ERR_INVALID;
    return d->k > INT32_MAX ? TL_ERR_OVERFLOW : TL_OK;
}

#endif
