/* Voxelization on the GPU, equal to csrc/core/tl_voxel.c.
 *
 * voxelize: quantize every point (first rejected point min-reduced as
 * (index << 2 | code)), deduplicate the rows with the hash table, one
 * read-back (count, field masks, rejected point), radix-sort the unique
 * rows, then look every point's row up in a table over the sorted rows.
 * reduce: a stable radix sort of (voxel, point) pairs gives each voxel's
 * points in point order, so sums add in the CPU's order and max keeps the
 * first point attaining it; no atomics decide an order.
 * devoxel_map / gather: one thread per point, one per (point, channel). */
#include "tl_cuda_voxel.h"
#include "tl_cuda_rows.cuh"

/* ---- quantization ---- */

static bool tl_vx_grid_ok(const tl_voxel_grid *g) {
    for (int a = 0; a < 3; a++) {
        if (!isfinite(g->size[a]) || !(g->size[a] > 0.0) || !isfinite(g->origin[a])) return false;
    }
    return true;
}

/* tl_quantize_one of tl_voxel.c: 0, or the rejection code of point p. */
template <class P>
__device__ __forceinline__ unsigned long long tl_vx_quantize(const P *pts, const int64_t *batch,
                                                             long long p, const tl_voxel_grid &g,
                                                             tl_coord *out) {
    const long long b = batch ? (long long)batch[p] : 0;
    if (b < 0) return TL_ROWS_BAD_INVALID;
    if (b > TL_COORD_MAX) return TL_ROWS_BAD_OVERFLOW;
    int v[3];
    for (int a = 0; a < 3; a++) {
        const double u = ((double)pts[p * 3 + a] - g.origin[a]) / g.size[a];
        if (!isfinite(u) || !(u >= 0.0)) return TL_ROWS_BAD_INVALID;
        const double f = floor(u);
        if (f > (double)TL_COORD_MAX) return TL_ROWS_BAD_OVERFLOW;
        v[a] = (int)f;
    }
    out->b = (int)b;
    out->x = v[0];
    out->y = v[1];
    out->z = v[2];
    return 0;
}

/* rows[p] (when rows != NULL) = voxel of point p, (0, 0, 0, 0) if rejected. */
template <class P>
static __global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_vx_quantize_kernel(const P *pts, const int64_t *batch, long long n, tl_voxel_grid g,
                          tl_coord *rows, tl_rows_info *info) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < n; p += stride) {
        tl_coord r = {0, 0, 0, 0};
        const unsigned long long code = tl_vx_quantize(pts, batch, p, g, &r);
        if (code) atomicMin(&info->bad, ((unsigned long long)p << 2) | code);
        if (rows) rows[p] = r;
    }
}

static tl_status tl_vx_launch_quantize(tl_dtype dtype, const void *pts, const int64_t *batch,
                                       int64_t n, const tl_voxel_grid *g, tl_coord *rows,
                                       tl_rows_info *info, cudaStream_t stream) {
    if (n == 0) return TL_OK;
    if (dtype == TL_F32)
        tl_vx_quantize_kernel<float><<<tl_cuda_blocks(n), TL_CUDA_THREADS, 0, stream>>>(
            (const float *)pts, batch, n, *g, rows, info);
    else
        tl_vx_quantize_kernel<double><<<tl_cuda_blocks(n), TL_CUDA_THREADS, 0, stream>>>(
            (const double *)pts, batch, n, *g, rows, info);
    TL_CUDA_LAUNCHED();
    return TL_OK;
}

/* Argument checks of tl_check_points, in the CPU's order (the points
 * themselves are checked on the device). */
static tl_status tl_vx_check_args(tl_dtype dtype, const void *pts, int64_t n,
                                  const tl_voxel_grid *g) {
    if (!g || n < 0 || (n > 0 && !pts)) return TL_ERR_INVALID;
    if (dtype != TL_F32 && dtype != TL_F64) return TL_ERR_UNSUPPORTED;
    if (!tl_vx_grid_ok(g)) return TL_ERR_INVALID;
    if (n > INT32_MAX) return TL_ERR_OVERFLOW;
    return TL_OK;
}

/* ---- voxelize ---- */

static tl_cuda_ws tl_vx_layout(void *base, int64_t n, tl_rows_unique *u) {
    tl_cuda_ws w = tl_cuda_ws_begin(base);
    tl_rows_unique_layout(&w, n, u);
    return w;
}

extern "C" tl_status tl_cuda_voxelize_workspace_size(int64_t n, size_t *bytes) {
    if (!bytes || n < 0) return TL_ERR_INVALID;
    if (n > INT32_MAX) return TL_ERR_OVERFLOW;
    tl_rows_unique u;
    tl_cuda_ws w = tl_vx_layout(NULL, n, &u);
    if (w.overflow) return TL_ERR_OVERFLOW;
    *bytes = w.used;
    return TL_OK;
}

/* inverse[p] = row of `uniq` equal to rows[p]. */
static __global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_vx_inverse_kernel(const tl_coord *rows, long long n, const int *slots,
                         unsigned long long mask, const tl_coord *uniq, int64_t *inverse) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < n; p += stride)
        inverse[p] = tl_cuda_hash_find(slots, mask, uniq, rows[p]);
}

extern "C" tl_status tl_cuda_voxelize(const tl_ctx *ctx, tl_dtype dtype, const void *pts,
                                      const int64_t *batch, int64_t n,
                                      const tl_voxel_grid *grid, void *workspace,
                                      tl_coord *uniq, int64_t *inverse, int64_t *n_uniq,
                                      int64_t *bad) {
    TL_CUDA_ERRORS_TO(ctx);
    if (bad) *bad = -1;
    if (!n_uniq) return TL_ERR_INVALID;
    *n_uniq = 0;
    TL_CUDA_RETURN_IF(tl_vx_check_args(dtype, pts, n, grid));
    if (n > 0 && (!uniq || !inverse)) return TL_ERR_INVALID;
    tl_rows_unique u;
    tl_cuda_ws w = tl_vx_layout(workspace, n, &u);
    if (w.overflow) return TL_ERR_OVERFLOW;
    if (!tl_cuda_ws_ok(workspace, w.used)) return TL_ERR_INVALID;
    cudaStream_t stream;
    tl_cuda_scope scope;
    TL_CUDA_RETURN_IF(scope.enter(ctx, &stream));
    if (n == 0) return TL_OK;

    TL_CUDA_RETURN_IF(tl_rows_info_clear(u.info, stream));
    TL_CUDA_RETURN_IF(tl_vx_launch_quantize(dtype, pts, batch, n, grid, u.rows, u.info, stream));
    tl_rows_info info;
    TL_CUDA_RETURN_IF(tl_rows_unique_count(&u, stream, &info));
    if (info.bad != TL_ROWS_NO_BAD) return tl_rows_bad_status(info.bad, bad);
    TL_CUDA_RETURN_IF(tl_rows_unique_sort(&u, &info, uniq, stream));

    const unsigned long long mask = (unsigned long long)(u.cap - 1);
    TL_CUDA_TRY(cudaMemsetAsync(u.slots, 0xFF, sizeof(int) * (size_t)u.cap, stream));
    tl_rows_table_kernel<<<tl_cuda_blocks(info.count), TL_CUDA_THREADS, 0, stream>>>(
        uniq, info.count, u.slots, mask, NULL);
    TL_CUDA_LAUNCHED();
    tl_vx_inverse_kernel<<<tl_cuda_blocks(n), TL_CUDA_THREADS, 0, stream>>>(u.rows, n, u.slots,
                                                                            mask, uniq, inverse);
    TL_CUDA_LAUNCHED();
    *n_uniq = info.count;
    return TL_OK;
}

/* ---- voxel_reduce ---- */

struct tl_vx_reduce_layout {
    tl_kv *a, *b;              /* n (voxel, point) pairs, ping-pong */
    long long *count, *offset; /* m each */
    long long *hist, *scratch;
};

static tl_cuda_ws tl_vx_reduce_layout_of(void *base, int64_t n, int64_t m,
                                         tl_vx_reduce_layout *l) {
    tl_cuda_ws w = tl_cuda_ws_begin(base);
    const int64_t hist = tl_radix_hist_len(n);
    int64_t scratch = tl_cuda_scan_scratch(m);
    if (tl_cuda_scan_scratch(hist) > scratch) scratch = tl_cuda_scan_scratch(hist);
    l->a = (tl_kv *)tl_cuda_ws_take(&w, n, sizeof(tl_kv));
    l->b = (tl_kv *)tl_cuda_ws_take(&w, n, sizeof(tl_kv));
    l->count = (long long *)tl_cuda_ws_take(&w, m, sizeof(long long));
    l->offset = (long long *)tl_cuda_ws_take(&w, m, sizeof(long long));
    l->hist = (long long *)tl_cuda_ws_take(&w, hist, sizeof(long long));
    l->scratch = (long long *)tl_cuda_ws_take(&w, scratch, sizeof(long long));
    return w;
}

extern "C" tl_status tl_cuda_voxel_reduce_workspace_size(int64_t n, int64_t m, size_t *bytes) {
    if (!bytes || n < 0 || m < 0) return TL_ERR_INVALID;
    if (n > INT32_MAX || m > INT32_MAX) return TL_ERR_OVERFLOW;
    tl_vx_reduce_layout l;
    tl_cuda_ws w = tl_vx_reduce_layout_of(NULL, n, m, &l);
    if (w.overflow) return TL_ERR_OVERFLOW;
    *bytes = w.used;
    return TL_OK;
}

/* pairs[p] = (voxel of p, p); points outside [0, m) get key m (sorted last,
 * never counted). */
static __global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_vx_pairs_kernel(const int64_t *inverse, long long n, long long m, tl_kv *pairs,
                       long long *count) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < n; p += stride) {
        const long long v = inverse[p];
        const bool ok = v >= 0 && v < m;
        tl_kv e = {(unsigned)(ok ? v : m), (int)p};
        pairs[p] = e;
        if (ok) atomicAdd((unsigned long long *)&count[v], 1ull);
    }
}

/* One thread per (voxel, channel), the voxel's points in point order: the
 * loops of tl_voxel.c's TL_VOXEL_REDUCE. */
template <class T>
static __global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_vx_reduce_kernel(const T *x, long long c, const long long *offset, const long long *count,
                        const tl_kv *order, long long m, int red, T *out, int64_t *arg) {
    typedef typename tl_acc<T>::type A;
    const long long total = m * c, stride = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        const long long v = t / c, j = t - v * c;
        const long long lo = offset[v], hi = lo + count[v];
        if (red == TL_VOXEL_MAX) {
            long long best = -1;
            A top = 0;
            for (long long q = lo; q < hi; q++) {
                const long long p = order[q].val;
                const A val = tl_load(x[p * c + j]);
                if (best < 0 || val > top || (val != val && top == top)) {
                    best = p;
                    top = val;
                }
            }
            out[t] = best < 0 ? tl_store<T>((A)0) : x[best * c + j];
            arg[t] = best;
            continue;
        }
        A acc = 0;
        for (long long q = lo; q < hi; q++) acc += tl_load(x[(long long)order[q].val * c + j]);
        if (red == TL_VOXEL_MEAN && hi > lo) acc /= (A)(hi - lo);
        out[t] = tl_store<T>(acc);
    }
}

template <class T>
static tl_status tl_vx_launch_reduce(const void *x, int64_t c, const tl_vx_reduce_layout &l,
                                     const tl_kv *order, int64_t m, int red, void *out,
                                     int64_t *arg, cudaStream_t stream) {
    tl_vx_reduce_kernel<T><<<tl_cuda_blocks(m * c), TL_CUDA_THREADS, 0, stream>>>(
        (const T *)x, c, l.offset, l.count, order, m, red, (T *)out, arg);
    TL_CUDA_LAUNCHED();
    return TL_OK;
}

/* Sorts l->a by voxel (stable, so points stay in point order); *sorted
 * receives the buffer holding the result. */
static tl_status tl_vx_sort_pairs(tl_vx_reduce_layout *l, int64_t n, int64_t m,
                                  cudaStream_t stream, tl_kv **sorted) {
    return tl_radix_sort_kv(l->a, l->b, n, TL_RADIX_BITS * tl_radix_bytes_of((unsigned)m),
                            l->hist, l->scratch, stream, sorted);
}

extern "C" tl_status tl_cuda_voxel_reduce(const tl_ctx *ctx, tl_dtype dtype,
                                          tl_voxel_reduction red, const void *feats, int64_t n,
                                          int64_t c, const int64_t *inverse, int64_t m,
                                          void *workspace, void *out, int64_t *argmax) {
    TL_CUDA_ERRORS_TO(ctx);
    if (n < 0 || c < 0 || m < 0) return TL_ERR_INVALID;
    if (red != TL_VOXEL_MEAN && red != TL_VOXEL_SUM && red != TL_VOXEL_MAX)
        return TL_ERR_INVALID;
    if (!tl_rows_dtype_ok(dtype)) return TL_ERR_UNSUPPORTED;
    if ((n > 0 && !inverse) || (n * c > 0 && !feats) || (m * c > 0 && !out)) return TL_ERR_INVALID;
    if (red == TL_VOXEL_MAX && m * c > 0 && !argmax) return TL_ERR_INVALID;
    if (n > INT32_MAX || m > INT32_MAX) return TL_ERR_OVERFLOW;
    tl_vx_reduce_layout l;
    tl_cuda_ws w = tl_vx_reduce_layout_of(workspace, n, m, &l);
    if (w.overflow) return TL_ERR_OVERFLOW;
    if (!tl_cuda_ws_ok(workspace, w.used)) return TL_ERR_INVALID;
    cudaStream_t stream;
    tl_cuda_scope scope;
    TL_CUDA_RETURN_IF(scope.enter(ctx, &stream));
    if (m * c == 0) return TL_OK;

    TL_CUDA_TRY(cudaMemsetAsync(l.count, 0, sizeof(long long) * (size_t)m, stream));
    const tl_kv *order = l.a;
    if (n > 0) {
        tl_vx_pairs_kernel<<<tl_cuda_blocks(n), TL_CUDA_THREADS, 0, stream>>>(inverse, n, m, l.a,
                                                                              l.count);
        TL_CUDA_LAUNCHED();
        tl_kv *sorted;
        TL_CUDA_RETURN_IF(tl_vx_sort_pairs(&l, n, m, stream, &sorted));
        order = sorted;
    }
    TL_CUDA_RETURN_IF(tl_cuda_scan(l.count, l.offset, m, l.scratch, NULL, stream));
    switch (dtype) {
    case TL_F32: return tl_vx_launch_reduce<float>(feats, c, l, order, m, red, out, argmax, stream);
    case TL_F64:
        return tl_vx_launch_reduce<double>(feats, c, l, order, m, red, out, argmax, stream);
    case TL_F16:
        return tl_vx_launch_reduce<__half>(feats, c, l, order, m, red, out, argmax, stream);
    default:
        return tl_vx_launch_reduce<__nv_bfloat16>(feats, c, l, order, m, red, out, argmax,
                                                  stream);
    }
}

/* ---- devoxelization ---- */

extern "C" tl_status tl_cuda_devoxel_map_workspace_size(int64_t m, size_t *bytes) {
    if (!bytes || m < 0) return TL_ERR_INVALID;
    if (m > INT32_MAX) return TL_ERR_OVERFLOW;
    tl_cuda_ws w = tl_cuda_ws_begin(NULL);
    (void)tl_cuda_ws_take(&w, 1, sizeof(tl_rows_info));
    (void)tl_cuda_ws_take(&w, tl_cuda_hash_capacity(m), sizeof(int));
    if (w.overflow) return TL_ERR_OVERFLOW;
    *bytes = w.used;
    return TL_OK;
}

/* tl_find_corner: row of (b, v) in the table, -1 when it cannot exist. */
__device__ __forceinline__ long long tl_vx_find(const int *slots, unsigned long long mask,
                                                const tl_coord *vox, int b,
                                                const long long v[3]) {
    for (int a = 0; a < 3; a++) {
        if (v[a] < 0 || v[a] > TL_COORD_MAX) return -1;
    }
    tl_coord key = {b, (int)v[0], (int)v[1], (int)v[2]};
    return tl_cuda_hash_find(slots, mask, vox, key);
}

/* tl_devoxel_point of tl_voxel.c, one thread per point.  The weight
 * products use __dmul_rn so they are never fused (the CPU does not fuse). */
template <class P>
static __global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_vx_devoxel_kernel(const P *pts, const int64_t *batch, long long n, tl_voxel_grid g,
                         const int *slots, unsigned long long mask, const tl_coord *vox,
                         int trilinear, int64_t *idx, double *w) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const int k = trilinear ? 8 : 1;
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < n; p += stride) {
        const int b = (int)(batch ? batch[p] : 0);
        double u[3];
        long long base[3];
        for (int a = 0; a < 3; a++) {
            u[a] = ((double)pts[p * 3 + a] - g.origin[a]) / g.size[a] - (trilinear ? 0.5 : 0.0);
            const double f = floor(u[a]);
            base[a] = f > (double)TL_COORD_MAX ? (long long)TL_COORD_MAX + 1 : (long long)f;
            u[a] -= f;
        }
        for (int j = 0; j < k; j++) {
            const int d[3] = {(j >> 2) & 1, (j >> 1) & 1, j & 1};
            long long v[3];
            double weight = 1.0;
            for (int a = 0; a < 3; a++) {
                v[a] = base[a] + (trilinear ? d[a] : 0);
                if (trilinear) weight = __dmul_rn(weight, d[a] ? u[a] : 1.0 - u[a]);
            }
            const long long r = tl_vx_find(slots, mask, vox, b, v);
            idx[p * k + j] = r;
            w[p * k + j] = r >= 0 ? weight : 0.0;
        }
    }
}

extern "C" tl_status tl_cuda_devoxel_map(const tl_ctx *ctx, tl_dtype dtype, const void *pts,
                                         const int64_t *batch, int64_t n,
                                         const tl_voxel_grid *grid, const tl_coord *vox,
                                         int64_t m, int trilinear, void *workspace, int64_t *idx,
                                         double *w, int64_t *bad) {
    TL_CUDA_ERRORS_TO(ctx);
    if (bad) *bad = -1;
    TL_CUDA_RETURN_IF(tl_vx_check_args(dtype, pts, n, grid));
    if (m < 0 || (m > 0 && !vox) || (n > 0 && (!idx || !w))) return TL_ERR_INVALID;
    if (m > INT32_MAX) return TL_ERR_OVERFLOW;
    const int64_t cap = tl_cuda_hash_capacity(m);
    tl_cuda_ws ws = tl_cuda_ws_begin(workspace);
    tl_rows_info *dinfo = (tl_rows_info *)tl_cuda_ws_take(&ws, 1, sizeof(tl_rows_info));
    int *slots = (int *)tl_cuda_ws_take(&ws, cap, sizeof(int));
    if (ws.overflow) return TL_ERR_OVERFLOW;
    if (!tl_cuda_ws_ok(workspace, ws.used)) return TL_ERR_INVALID;
    cudaStream_t stream;
    tl_cuda_scope scope;
    TL_CUDA_RETURN_IF(scope.enter(ctx, &stream));
    if (n == 0 && m == 0) return TL_OK;

    /* Points first, then duplicate voxel rows: the CPU's order. */
    TL_CUDA_RETURN_IF(tl_rows_info_clear(dinfo, stream));
    TL_CUDA_RETURN_IF(tl_vx_launch_quantize(dtype, pts, batch, n, grid, NULL, dinfo, stream));
    const unsigned long long mask = (unsigned long long)(cap - 1);
    TL_CUDA_TRY(cudaMemsetAsync(slots, 0xFF, sizeof(int) * (size_t)cap, stream));
    if (m > 0) {
        tl_rows_table_kernel<<<tl_cuda_blocks(m), TL_CUDA_THREADS, 0, stream>>>(vox, m, slots, mask,
                                                                               &dinfo->dup);
        TL_CUDA_LAUNCHED();
    }
    tl_rows_info info;
    TL_CUDA_RETURN_IF(tl_cuda_read_back(&info, dinfo, sizeof(info), stream));
    if (info.bad != TL_ROWS_NO_BAD) return tl_rows_bad_status(info.bad, bad);
    if (info.dup) return TL_ERR_DUPLICATE;
    if (n == 0) return TL_OK;
    if (dtype == TL_F32)
        tl_vx_devoxel_kernel<float><<<tl_cuda_blocks(n), TL_CUDA_THREADS, 0, stream>>>(
            (const float *)pts, batch, n, *grid, slots, mask, vox, trilinear, idx, w);
    else
        tl_vx_devoxel_kernel<double><<<tl_cuda_blocks(n), TL_CUDA_THREADS, 0, stream>>>(
            (const double *)pts, batch, n, *grid, slots, mask, vox, trilinear, idx, w);
    TL_CUDA_LAUNCHED();
    return TL_OK;
}

/* acc + a * b: fp32 products may fuse; fp64 ones are rounded separately,
 * as the CPU's double accumulation is. */
__device__ __forceinline__ float tl_vx_madd(float acc, float a, float b) {
    return fmaf(a, b, acc);
}
__device__ __forceinline__ double tl_vx_madd(double acc, double a, double b) {
    return __dadd_rn(acc, __dmul_rn(a, b));
}

template <class T>
static __global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_vx_gather_kernel(const T *x, long long m, long long c, const int64_t *idx,
                        const double *w, long long n, long long k, T *out) {
    typedef typename tl_acc<T>::type A;
    const long long total = n * c, stride = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        const long long p = t / c, j = t - p * c;
        A acc = 0;
        for (long long q = 0; q < k; q++) {
            const long long r = idx[p * k + q];
            if (r >= 0 && r < m) acc = tl_vx_madd(acc, (A)w[p * k + q], tl_load(x[r * c + j]));
        }
        out[t] = tl_store<T>(acc);
    }
}

template <class T>
static tl_status tl_vx_launch_gather(const void *x, int64_t m, int64_t c, const int64_t *idx,
                                     const double *w, int64_t n, int64_t k, void *out,
                                     cudaStream_t stream) {
    tl_vx_gather_kernel<T><<<tl_cuda_blocks(n * c), TL_CUDA_THREADS, 0, stream>>>(
        (const T *)x, m, c, idx, w, n, k, (T *)out);
    TL_CUDA_LAUNCHED();
    return TL_OK;
}

extern "C" tl_status tl_cuda_devoxel_gather(const tl_ctx *ctx, tl_dtype dtype, const void *feats,
                                            int64_t m, int64_t c, const int64_t *idx,
                                            const double *w, int64_t n, int64_t k, void *out) {
    if (m < 0 || c < 0 || n < 0 || k < 1) return TL_ERR_INVALID;
    if (!tl_rows_dtype_ok(dtype)) return TL_ERR_UNSUPPORTED;
    if ((n > 0 && (!idx || !w)) || (m * c > 0 && !feats) || (n * c > 0 && !out))
        return TL_ERR_INVALID;
    cudaStream_t stream;
    tl_cuda_scope scope;
    TL_CUDA_RETURN_IF(scope.enter(ctx, &stream));
    if (n * c == 0) return TL_OK;
    switch (dtype) {
    case TL_F32: return tl_vx_launch_gather<float>(feats, m, c, idx, w, n, k, out, stream);
    case TL_F64: return tl_vx_launch_gather<double>(feats, m, c, idx, w, n, k, out, stream);
    case TL_F16: return tl_vx_launch_gather<__half>(feats, m, c, idx, w, n, k, out, stream);
    default: return tl_vx_launch_gather<__nv_bfloat16>(feats, m, c, idx, w, n, k, out, stream);
    }
}
