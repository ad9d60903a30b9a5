/* Generated output support on the GPU, equal to the CPU tl_coords_generate.
 *
 * 1. candidates: every input row gets a fixed number of candidate slots,
 *    the product over axes of the most outputs one coordinate can reach
 *    (ceil(K / (s / gcd(s, d))), capped by the range, as in
 *    tl_coords_generate_bound); unused slots are marked with x = -1;
 * 2. dedup: valid candidates are inserted into the hash set of
 *    tl_cuda_hash.cuh; the thread that claims a slot flags its candidate;
 * 3. compaction: exclusive scan of the flags, one readback (count, bit masks,
 *    error flag), then the unique rows are written densely;
 * 4. sort: LSD radix sort over the bytes of z, y, x, b that carry bits,
 *    8 bits per pass, stable (warp match ranks within a block, block order
 *    across blocks), so any coordinate range works without packing. */
#include "tl_cuda_hash.cuh"
#include "tl_cuda_radix.cuh"

/* Per-axis candidate layout, passed by value to the kernels. */
struct tl_gen_axes {
    int kernel[3], stride[3], padding[3], dilation[3];
    long long range[3];
    int caps[3]; /* candidate slots per axis */
};

/* Results the host reads back once. */
struct tl_gen_info {
    long long count;
    unsigned mask[4]; /* OR of b, x, y, z over the candidates */
    int error;        /* a generated row with a negative batch */
    int pad;
};

struct tl_gen_layout {
    tl_gen_info *info;
    tl_coord *cand, *keys;
    int *slots;
    long long *pos, *hist, *scratch;
    int64_t n_cand, cap, hist_len;
};

static int64_t tl_gcd64(int64_t a, int64_t b) {
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Candidate slots per input row; TL_ERR_OVERFLOW when the total does not fit
 * the int32 rows of the hash set. */
static tl_status tl_gen_axes_of(const tl_geom *g, const int64_t out_range[3], int64_t n_in,
                                tl_gen_axes *ax, int64_t *n_cand) {
    int64_t k;
    TL_CUDA_RETURN_IF(tl_geom_check(g, &k));
    if (n_in < 0) return TL_ERR_INVALID;
    int64_t per_in = 1;
    for (int a = 0; a < 3; a++) {
        if (out_range[a] < 0 || out_range[a] > (int64_t)TL_COORD_MAX + 1) return TL_ERR_INVALID;
        int64_t period = g->stride[a] / tl_gcd64(g->stride[a], g->dilation[a]);
        int64_t c = tl_cuda_ceil_div(g->kernel_size[a], period);
        if (c > out_range[a]) c = out_range[a];
        ax->kernel[a] = g->kernel_size[a];
        ax->stride[a] = g->stride[a];
        ax->padding[a] = g->padding[a];
        ax->dilation[a] = g->dilation[a];
        ax->range[a] = out_range[a];
        ax->caps[a] = (int)c;
        per_in *= c; /* each factor <= kernel_size, product <= K <= INT32_MAX */
    }
    if (per_in > 0 && n_in > INT32_MAX / per_in) return TL_ERR_OVERFLOW;
    *n_cand = n_in * per_in;
    return TL_OK;
}

static tl_cuda_ws tl_gen_layout_of(void *base, int64_t n_cand, tl_gen_layout *l) {
    tl_cuda_ws w = tl_cuda_ws_begin(base);
    l->n_cand = n_cand;
    l->cap = tl_cuda_hash_capacity(n_cand);
    l->hist_len = tl_radix_hist_len(n_cand);
    int64_t scratch = tl_cuda_scan_scratch(n_cand);
    int64_t scratch_hist = tl_cuda_scan_scratch(l->hist_len);
    if (scratch_hist > scratch) scratch = scratch_hist;
    l->info = (tl_gen_info *)tl_cuda_ws_take(&w, 1, sizeof(tl_gen_info));
    l->cand = (tl_coord *)tl_cuda_ws_take(&w, n_cand, sizeof(tl_coord));
    l->keys = (tl_coord *)tl_cuda_ws_take(&w, n_cand, sizeof(tl_coord));
    l->slots = (int *)tl_cuda_ws_take(&w, l->cap, sizeof(int));
    l->pos = (long long *)tl_cuda_ws_take(&w, n_cand, sizeof(long long));
    l->hist = (long long *)tl_cuda_ws_take(&w, l->hist_len, sizeof(long long));
    l->scratch = (long long *)tl_cuda_ws_take(&w, scratch, sizeof(long long));
    return w;
}

extern "C" tl_status tl_cuda_generate_workspace_size(int64_t n_in, const tl_geom *g,
                                                     const int64_t out_range[3], size_t *bytes) {
    if (!g || !out_range || !bytes) return TL_ERR_INVALID;
    tl_gen_axes ax;
    int64_t n_cand;
    TL_CUDA_RETURN_IF(tl_gen_axes_of(g, out_range, n_in, &ax, &n_cand));
    tl_gen_layout l;
    tl_cuda_ws w = tl_gen_layout_of(NULL, n_cand, &l);
    if (w.overflow) return TL_ERR_OVERFLOW;
    *bytes = w.used;
    return TL_OK;
}

/* The slot-th output position (0-based) that coordinate c reaches along
 * axis a, or -1.  Targets t = (c + p - r*d) / s decrease with r. */
__device__ __forceinline__ int tl_gen_target(long long c, const tl_gen_axes &ax, int a,
                                             int slot) {
    int seen = 0;
    for (int r = 0; r < ax.kernel[a]; r++) {
        long long t = c + ax.padding[a] - (long long)r * ax.dilation[a];
        if (t < 0) break;
        if (t % ax.stride[a] != 0) continue;
        t /= ax.stride[a];
        if (t >= ax.range[a]) continue;
        if (seen++ == slot) return (int)t;
    }
    return -1;
}

__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_gen_candidates_kernel(const tl_coord *in, long long n_cand, tl_gen_axes ax,
                             tl_coord *cand, tl_gen_info *info) {
    const long long per_in = (long long)ax.caps[0] * ax.caps[1] * ax.caps[2];
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n_cand;
         j += stride) {
        const tl_coord c = in[j / per_in];
        int l = (int)(j % per_in);
        const int lz = l % ax.caps[2];
        l /= ax.caps[2];
        const int ly = l % ax.caps[1], lx = l / ax.caps[1];
        tl_coord q = {c.b, tl_gen_target(c.x, ax, 0, lx), tl_gen_target(c.y, ax, 1, ly),
                      tl_gen_target(c.z, ax, 2, lz)};
        if (q.x < 0 || q.y < 0 || q.z < 0) {
            q.x = -1; /* unused slot */
        } else if (q.b < 0) {
            info->error = 1;
        }
        cand[j] = q;
    }
}

/* flag[j] = 1 for the one candidate of each distinct row that claims a
 * slot; also ORs every field into info->mask for the radix passes. */
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_gen_insert_kernel(const tl_coord *cand, long long n_cand, int *slots,
                         unsigned long long mask, long long *flag, tl_gen_info *info) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    /* Every lane runs the same number of iterations, so the warp reduction
     * below always has the full warp. */
    const long long rounds = (n_cand + stride - 1) / stride;
    for (long long round = 0; round < rounds; round++) {
        const long long j = round * stride + (long long)blockIdx.x * blockDim.x + threadIdx.x;
        unsigned m[4] = {0, 0, 0, 0};
        if (j < n_cand) {
            const tl_coord q = cand[j];
            long long f = 0;
            if (q.x >= 0) {
                f = tl_cuda_hash_insert(slots, mask, cand, (int)j) ? 1 : 0;
                m[0] = (unsigned)q.b;
                m[1] = (unsigned)q.x;
                m[2] = (unsigned)q.y;
                m[3] = (unsigned)q.z;
            }
            flag[j] = f;
        }
        for (int a = 0; a < 4; a++) {
            unsigned v = tl_warp_or(m[a]);
            if ((threadIdx.x & 31) == 0 && v) atomicOr(&info->mask[a], v);
        }
    }
}

/* Unique rows, densely: candidate j is kept iff its flag was 1, i.e. the
 * exclusive scan steps after it. */
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_gen_compact_kernel(const tl_coord *cand, const long long *pos, long long n_cand,
                          long long count, tl_coord *keys) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n_cand;
         j += stride) {
        const long long next = j + 1 < n_cand ? pos[j + 1] : count;
        if (next > pos[j]) keys[pos[j]] = cand[j];
    }
}

/* Steps 1-3; *info receives the read-back results. */
static tl_status tl_gen_unique(const tl_coord *in, const tl_gen_axes &ax, tl_gen_layout *l,
                               cudaStream_t stream, tl_gen_info *info) {
    const int64_t n = l->n_cand;
    TL_CUDA_TRY(cudaMemsetAsync(l->info, 0, sizeof(tl_gen_info), stream));
    TL_CUDA_TRY(cudaMemsetAsync(l->slots, 0xFF, sizeof(int) * (size_t)l->cap, stream));
    tl_gen_candidates_kernel<<<tl_cuda_blocks(n), TL_CUDA_THREADS, 0, stream>>>(in, n, ax,
                                                                                l->cand, l->info);
    TL_CUDA_LAUNCHED();
    tl_gen_insert_kernel<<<tl_cuda_blocks(n), TL_CUDA_THREADS, 0, stream>>>(
        l->cand, n, l->slots, (unsigned long long)(l->cap - 1), l->pos, l->info);
    TL_CUDA_LAUNCHED();
    TL_CUDA_RETURN_IF(tl_cuda_scan(l->pos, l->pos, n, l->scratch, &l->info->count, stream));
    return tl_cuda_read_back(info, l->info, sizeof(tl_gen_info), stream);
}

extern "C" tl_status tl_cuda_generate(const tl_ctx *ctx, const tl_coord *in, int64_t n_in,
                                      const tl_geom *g, const int64_t out_range[3],
                                      void *workspace, tl_coord *out, int64_t capacity,
                                      int64_t *n_out) {
    if (!n_out || !g || !out_range) return TL_ERR_INVALID;
    *n_out = 0;
    tl_gen_axes ax;
    int64_t n_cand;
    TL_CUDA_RETURN_IF(tl_gen_axes_of(g, out_range, n_in, &ax, &n_cand));
    if (capacity < 0 || (n_in > 0 && !in) || (capacity > 0 && !out)) return TL_ERR_INVALID;
    tl_gen_layout l;
    tl_cuda_ws w = tl_gen_layout_of(workspace, n_cand, &l);
    if (w.overflow) return TL_ERR_OVERFLOW;
    if (!tl_cuda_ws_ok(workspace, w.used)) return TL_ERR_INVALID;
    cudaStream_t stream;
    tl_cuda_scope scope;
    TL_CUDA_RETURN_IF(scope.enter(ctx, &stream));
    if (n_cand == 0) return TL_OK;

    tl_gen_info info;
    TL_CUDA_RETURN_IF(tl_gen_unique(in, ax, &l, stream, &info));
    /* Same precedence as the CPU: capacity, then invalid rows. */
    if (info.count > capacity) return TL_ERR_CAPACITY;
    if (info.error) return TL_ERR_INVALID;
    if (info.count == 0) return TL_OK;
    tl_gen_compact_kernel<<<tl_cuda_blocks(n_cand), TL_CUDA_THREADS, 0, stream>>>(
        l.cand, l.pos, n_cand, info.count, l.keys);
    TL_CUDA_LAUNCHED();
    tl_coord *sorted;
    TL_CUDA_RETURN_IF(tl_radix_sort_coords(l.keys, l.cand, info.count, info.mask, l.hist,
                                           l.scratch, stream, &sorted));
    TL_CUDA_TRY(cudaMemcpyAsync(out, sorted, sizeof(tl_coord) * (size_t)info.count,
                                cudaMemcpyDeviceToDevice, stream));
    *n_out = info.count;
    return TL_OK;
}
