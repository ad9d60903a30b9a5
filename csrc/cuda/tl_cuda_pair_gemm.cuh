/* Tile kernels over per-kernel-row pair lists, shared by fetch-on-demand
 * (GATHER = true: rows are read from x / dy through pair_in / pair_out, and
 * results are added with atomics) and gather-scatter (GATHER = false: rows
 * are read from dense gather buffers, one kernel row per launch, and results
 * are added without atomics because no output row repeats within a kernel
 * row).  Each file instantiates only its own GATHER value.
 *
 * Block -> work: with `tiles` set (fetch-on-demand), one flat grid covers
 * the real work of every kernel row: tiles[n] is the exclusive prefix of the
 * tile counts of kernel rows < n (tiles[k] the total), and a block finds its
 * kernel row by binary search.  Without it (gather-scatter), the grid is
 * (kernel rows from n_first) x (row_tiles or chunks) x column tiles. */
#ifndef TL_CUDA_PAIR_GEMM_CUH
#define TL_CUDA_PAIR_GEMM_CUH

#include "tl_cuda_gemm.cuh"

/* Kernel row of flat tile t: the last n < k with tiles[n] <= t.  Requires
 * tiles[0] == 0 <= t < tiles[k]; then kernel row n has a tile t - tiles[n]. */
__device__ __forceinline__ long long tl_pair_tile_row(const long long *tiles, long long k,
                                                      long long t) {
    long long lo = 0, hi = k;
    while (hi - lo > 1) {
        const long long mid = lo + (hi - lo) / 2;
        if (tiles[mid] <= t)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Arguments of tl_pairs_forward_kernel, by value. */
struct tl_pairs_fwd_args {
    const long long *offsets;
    const int *pair_in, *pair_out;
    float *acc;         /* (n_out, c_out) fp32 accumulator */
    long long n_src;    /* rows of the A source (x, or the gather buffer) */
    long long n_out, c_in, c_out;
    long long row_tiles, col_tiles;
    long long n_first;  /* kernel row of block 0 (without tiles) */
    const long long *tiles; /* (k + 1) tile prefix of TL_BM pairs, or NULL */
    long long k;
    int vec;            /* TL_VEC_A: src rows, TL_VEC_B: w rows, TL_VEC_C: acc rows */
};

/* acc[o * c_out + c0 + jj] += c[m][jj] (m < TL_BM, jj < BN) for the tile's
 * output rows outs[m] (skipped where < 0): fp32 atomics (ATOMIC; 16-byte
 * vector atomics on sm_90 where `vec4`) or plain adds. */
template <bool ATOMIC, int BN, int LDC>
__device__ __forceinline__ void tl_pairs_add_tile(const float (*c)[LDC], const long long *outs,
                                                  float *acc, long long c0, long long c_out,
                                                  bool vec4) {
    for (int e = threadIdx.x; e < TL_BM * BN / 4; e += TL_CUDA_THREADS) {
        const int m = e / (BN / 4), jj = (e % (BN / 4)) * 4;
        const long long o = outs[m], col = c0 + jj;
        if (o < 0 || col >= c_out) continue;
        float *dst = acc + o * c_out + col;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (ATOMIC && vec4 && col + 4 <= c_out) {
            atomicAdd(reinterpret_cast<float4 *>(dst),
                      make_float4(c[m][jj], c[m][jj + 1], c[m][jj + 2], c[m][jj + 3]));
            continue;
        }
#else
        (void)vec4;
#endif
        for (int q = 0; q < 4 && col + q < c_out; q++) {
            if (ATOMIC)
                atomicAdd(dst + q, c[m][jj + q]);
            else
                dst[q] += c[m][jj + q];
        }
    }
}

/* Forward block b (after its column tile is taken out): its kernel row *n
 * and first pair *j0 (within the row); false when it has no pairs (every
 * thread of the block agrees, so it may return before any barrier). */
__device__ __forceinline__ bool tl_pairs_fwd_block(const tl_pairs_fwd_args &p, long long b,
                                                   long long *n, long long *j0) {
    if (p.tiles) {
        if (b >= p.tiles[p.k]) return false; /* past the real work */
        *n = tl_pair_tile_row(p.tiles, p.k, b);
        *j0 = (b - p.tiles[*n]) * TL_BM;
    } else {
        *j0 = (b % p.row_tiles) * TL_BM;
        *n = p.n_first + b / p.row_tiles;
    }
    return *j0 < p.offsets[*n + 1] - p.offsets[*n];
}

/* rows[t], outs[t] (t < TL_BM, written by those threads) = source row and
 * output row of pair j0 + t of kernel row n: pair_in (GATHER) or the pair's
 * place in the gather buffer, and pair_out; -1 past the row's pairs or out
 * of range.  The caller's barrier publishes them. */
template <bool GATHER>
__device__ __forceinline__ void tl_pairs_tile_rows(const tl_pairs_fwd_args &p, long long n,
                                                   long long j0, long long *rows,
                                                   long long *outs) {
    if (threadIdx.x >= TL_BM) return;
    const long long off = p.offsets[n], count = p.offsets[n + 1] - off;
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

/* acc[pair_out[j]] += A(j) @ w[n] for the pairs j of kernel row n, where
 * A(j) = src[pair_in[j]] (GATHER) or src[j - offsets[n]] (gather buffer).
 * The next TL_BK slice of A and w is fetched into registers while the
 * current one is multiplied. */
template <typename T, bool TF32, bool GATHER>
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_pairs_forward_kernel(const T *src, const T *w, tl_pairs_fwd_args p) {
    __shared__ tl_tile_smem<T, false> s;
    __shared__ long long rows[TL_BM], outs[TL_BM];
    const long long c0 = (blockIdx.x % p.col_tiles) * TL_BN;
    long long n, j0;
    if (!tl_pairs_fwd_block(p, blockIdx.x / p.col_tiles, &n, &j0)) return; /* whole block */
    tl_pairs_tile_rows<GATHER>(p, n, j0, rows, outs);
    __syncthreads();
    typename tl_core<T, TF32, false>::acc acc;
    acc.zero();
    const T *wn = w + n * p.c_in * p.c_out;
    const bool va = p.vec & TL_VEC_A, vb = p.vec & TL_VEC_B;
    tl_tile_load<T, TL_BM, TL_BK> la;
    tl_tile_load<T, TL_BK, TL_BN> lb;
    la.fetch(src, p.c_in, rows, 0, 0, 0, p.c_in, va);
    lb.fetch(wn, p.c_out, NULL, 0, p.c_in, c0, p.c_out, vb);
    for (long long k0 = 0; k0 < p.c_in; k0 += TL_BK) {
        la.commit(s.a);
        lb.commit(s.b);
        __syncthreads();
        if (k0 + TL_BK < p.c_in) {
            la.fetch(src, p.c_in, rows, 0, 0, k0 + TL_BK, p.c_in, va);
            lb.fetch(wn, p.c_out, NULL, k0 + TL_BK, p.c_in, c0, p.c_out, vb);
        }
        acc.step(s);
        __syncthreads();
    }
    acc.store(s);
    __syncthreads();
    tl_pairs_add_tile<GATHER, TL_BN>(s.c, outs, p.acc, c0, p.c_out, p.vec & TL_VEC_C);
}

/* Arguments of tl_pairs_wgrad_kernel, by value. */
struct tl_pairs_wgrad_args {
    const long long *offsets;
    const int *pair_in, *pair_out;
    float *dw;          /* (k, c_in, c_out) fp32 accumulator */
    long long n_x, n_y; /* rows of the x and dy sources */
    long long c_in, c_out;
    long long ci_tiles, co_tiles, chunks, chunk_rows;
    long long n_first;      /* kernel row of block 0 (without tiles) */
    const long long *tiles; /* (k + 1) prefix of chunks of chunk_rows pairs, or NULL */
    long long k;
    int vec;                /* TL_VEC_A: x rows, TL_VEC_B: dy rows */
};

/* One block of a weight gradient: kernel row n, the input and output
 * channel tiles from ci0 and co0, and its chunk [begin, end) of the kernel
 * row's pairs, which start at off. */
struct tl_pairs_wgrad_block {
    long long n, ci0, co0, off, begin, end;
};

/* Block b's part (above); false when its chunk holds no pairs (every thread
 * of the block agrees, so it may return before any barrier). */
__device__ __forceinline__ bool tl_pairs_wgrad_block_of(const tl_pairs_wgrad_args &p, long long b,
                                                        tl_pairs_wgrad_block *k) {
    k->co0 = (b % p.co_tiles) * TL_BN;
    b /= p.co_tiles;
    k->ci0 = (b % p.ci_tiles) * TL_BM;
    b /= p.ci_tiles;
    if (p.tiles) {
        if (b >= p.tiles[p.k]) return false; /* past the real work */
        k->n = tl_pair_tile_row(p.tiles, p.k, b);
        k->begin = (b - p.tiles[k->n]) * p.chunk_rows;
    } else {
        k->begin = (b % p.chunks) * p.chunk_rows;
        k->n = p.n_first + b / p.chunks;
    }
    k->off = p.offsets[k->n];
    const long long count = p.offsets[k->n + 1] - k->off;
    k->end = k->begin + p.chunk_rows < count ? k->begin + p.chunk_rows : count;
    return k->begin < count;
}

/* *a, *c = the x and dy rows of pair r of the block's kernel row as stored,
 * unchecked (tl_pairs_wgrad_check); -1 at or past its chunk's end. */
template <bool GATHER>
__device__ __forceinline__ void tl_pairs_wgrad_load(const tl_pairs_wgrad_args &p,
                                                    const tl_pairs_wgrad_block &k, long long r,
                                                    long long *a, long long *c) {
    *a = *c = -1;
    if (r >= k.end) return;
    /* Gather buffers hold kernel row n's pairs from row 0. */
    *a = GATHER ? p.pair_in[k.off + r] : r;
    *c = GATHER ? p.pair_out[k.off + r] : r;
}

/* Both rows -1 where either is outside x or dy. */
__device__ __forceinline__ void tl_pairs_wgrad_check(const tl_pairs_wgrad_args &p, long long *a,
                                                     long long *c) {
    if (*a < 0 || *a >= p.n_x || *c < 0 || *c >= p.n_y) *a = *c = -1;
}

/* *a, *c = the x and dy rows of pair r of the block's kernel row (-1 at or
 * past its chunk's end or out of range). */
template <bool GATHER>
__device__ __forceinline__ void tl_pairs_wgrad_pair(const tl_pairs_wgrad_args &p,
                                                    const tl_pairs_wgrad_block &k, long long r,
                                                    long long *a, long long *c) {
    tl_pairs_wgrad_load<GATHER>(p, k, r, a, c);
    tl_pairs_wgrad_check(p, a, c);
}

/* ra[t], rb[t] = the x and dy rows of pair r0 + t (tl_pairs_wgrad_pair);
 * threads < TL_BK write. */
template <bool GATHER>
__device__ __forceinline__ void tl_pairs_wgrad_rows(const tl_pairs_wgrad_args &p,
                                                    const tl_pairs_wgrad_block &k, long long r0,
                                                    long long *ra, long long *rb) {
    if (threadIdx.x < TL_BK)
        tl_pairs_wgrad_pair<GATHER>(p, k, r0 + threadIdx.x, &ra[threadIdx.x], &rb[threadIdx.x]);
}

/* dw[n] += c[m][jj] (the block's TL_BM x TL_BN tile of input x output
 * channels) with fp32 atomics: chunks of one tile meet there. */
template <int LDC>
__device__ __forceinline__ void tl_pairs_wgrad_add(const float (*c)[LDC],
                                                   const tl_pairs_wgrad_args &p,
                                                   const tl_pairs_wgrad_block &k) {
    for (int e = threadIdx.x; e < TL_BM * TL_BN; e += TL_CUDA_THREADS) {
        const int m = e / TL_BN, jj = e % TL_BN;
        const long long ci = k.ci0 + m, co = k.co0 + jj;
        if (ci < p.c_in && co < p.c_out)
            atomicAdd(&p.dw[(k.n * p.c_in + ci) * p.c_out + co], c[m][jj]);
    }
}

/* dw[n] += X(j)^T DY(j) over one chunk of kernel row n's pairs, where
 * X(j) = x[pair_in[j]], DY(j) = dy[pair_out[j]] (GATHER) or the j-th rows of
 * the gather buffers.  Chunks of the same tile meet in fp32 atomics.  Row
 * indices and operands of the next TL_BK pairs are fetched while the
 * current ones are multiplied (row indices double-buffered). */
template <typename T, bool TF32, bool GATHER>
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_pairs_wgrad_kernel(const T *xs, const T *dys, tl_pairs_wgrad_args p) {
    __shared__ tl_tile_smem<T, true> s;
    __shared__ long long ra[2][TL_BK], rb[2][TL_BK];
    tl_pairs_wgrad_block k;
    if (!tl_pairs_wgrad_block_of(p, blockIdx.x, &k)) return; /* the whole block */
    const long long ci0 = k.ci0, co0 = k.co0, end = k.end;
    const bool va = p.vec & TL_VEC_A, vb = p.vec & TL_VEC_B;
    typename tl_core<T, TF32, true>::acc acc;
    acc.zero();
    tl_tile_load<T, TL_BK, TL_BM> la;
    tl_tile_load<T, TL_BK, TL_BN> lb;
    tl_pairs_wgrad_rows<GATHER>(p, k, k.begin, ra[0], rb[0]);
    __syncthreads();
    la.fetch(xs, p.c_in, ra[0], 0, 0, ci0, p.c_in, va);
    lb.fetch(dys, p.c_out, rb[0], 0, 0, co0, p.c_out, vb);
    int buf = 0;
    for (long long r0 = k.begin; r0 < end; r0 += TL_BK, buf ^= 1) {
        la.commit(s.a);
        lb.commit(s.b);
        const bool more = r0 + TL_BK < end;
        /* ra[buf ^ 1] was last read two slices ago, before two barriers. */
        if (more) tl_pairs_wgrad_rows<GATHER>(p, k, r0 + TL_BK, ra[buf ^ 1], rb[buf ^ 1]);
        __syncthreads();
        if (more) {
            la.fetch(xs, p.c_in, ra[buf ^ 1], 0, 0, ci0, p.c_in, va);
            lb.fetch(dys, p.c_out, rb[buf ^ 1], 0, 0, co0, p.c_out, vb);
        }
        acc.step(s);
        __syncthreads();
    }
    acc.store(s);
    __syncthreads();
    tl_pairs_wgrad_add(s.c, p, k);
}

/* The pipelined fetch-on-demand forward (tl_cuda_fod_pipelined.cu): whether
 * option bits `opts` ask for it and a call qualifies (fp16, bf16 or TF32 by
 * TL_CUDA_PIPELINED_FOD_FORWARD, plain fp32 by TL_CUDA_PIPELINED_FP32; sm_80
 * code on the current device; x and w rows of whole 16-byte runs, 16-byte
 * aligned), and the call itself: tl_pairs_forward_kernel's
 * arguments (with the tile prefix; col_tiles is its own) and the host's bound
 * of the tile total. */
bool tl_fod_pipelined_forward_ok(const tl_conv_desc *d, int opts, const void *x,
                                 const void *w);
tl_status tl_fod_pipelined_forward(tl_dtype dtype, int opts, const void *x, const void *w,
                                   const tl_pairs_fwd_args &args, int64_t tile_bound,
                                   cudaStream_t stream);

/* The pipelined fetch-on-demand weight gradient (tl_cuda_fod_pipelined.cu):
 * whether option bits `opts` ask for it and a call qualifies (fp16, bf16 or
 * TF32 by TL_CUDA_PIPELINED_WGRAD, plain fp32 by TL_CUDA_PIPELINED_FP32;
 * sm_80 code on the current device; channel counts and pointers 16-byte
 * aligned), and the call itself: tl_pairs_wgrad_kernel's grid and arguments
 * (with the tile prefix) in its place. */
bool tl_fod_pipelined_ok(const tl_conv_desc *d, int opts, const void *x, const void *dy);
tl_status tl_fod_pipelined_wgrad(tl_dtype dtype, int opts, const void *x, const void *dy,
                                 const tl_pairs_wgrad_args &args, int64_t blocks,
                                 cudaStream_t stream);

/* Shared checks of the pair-list entry points. */
static inline tl_status tl_pairs_args_check(const tl_conv_desc *d, const tl_cuda_pairs *p) {
    if (!p || p->n_pairs < 0 || !p->offsets) return TL_ERR_INVALID;
    if (p->n_pairs > 0 && (!p->in || !p->out)) return TL_ERR_INVALID;
    return d->k > INT32_MAX ? TL_ERR_OVERFLOW : TL_OK;
}

#endif
