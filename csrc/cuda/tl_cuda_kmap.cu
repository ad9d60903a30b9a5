/* Kernel maps on the GPU: the (n_out, K) neighbour table and its transpose,
 * with the same contents as the CPU tl_kmap_build / tl_kmap_reverse. */
#include "tl_cuda_hash.cuh"

/* Bits of the error flag set by the insert kernel. */
#define TL_KMAP_NEGATIVE 1
#define TL_KMAP_DUPLICATE 2

struct tl_kmap_layout {
    int *slots;
    int *flag;
    int64_t cap;
};

static tl_cuda_ws tl_kmap_layout_of(void *base, int64_t n_in, tl_kmap_layout *l) {
    tl_cuda_ws w = tl_cuda_ws_begin(base);
    l->cap = tl_cuda_hash_capacity(n_in);
    l->slots = (int *)tl_cuda_ws_take(&w, l->cap, sizeof(int));
    l->flag = (int *)tl_cuda_ws_take(&w, 1, sizeof(int));
    return w;
}

extern "C" tl_status tl_cuda_kmap_workspace_size(int64_t n_in, size_t *bytes) {
    if (!bytes || n_in < 0) return TL_ERR_INVALID;
    if (n_in > TL_ROW_MAX) return TL_ERR_OVERFLOW;
    tl_kmap_layout l;
    tl_cuda_ws w = tl_kmap_layout_of(NULL, n_in, &l);
    if (w.overflow) return TL_ERR_OVERFLOW;
    *bytes = w.used;
    return TL_OK;
}

__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_kmap_insert_kernel(const tl_coord *in, long long n_in, int *slots,
                          unsigned long long mask, int *flag) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_in; i += stride) {
        tl_coord c = in[i];
        if ((c.b | c.x | c.y | c.z) < 0) {
            atomicOr(flag, TL_KMAP_NEGATIVE);
            continue;
        }
        if (!tl_cuda_hash_insert(slots, mask, in, (int)i)) atomicOr(flag, TL_KMAP_DUPLICATE);
    }
}

/* One thread per (o, n) entry of nbr. */
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_kmap_lookup_kernel(const tl_coord *in, const tl_coord *out, long long n_out, int k,
                          tl_geom g, const int *slots, unsigned long long mask, int *nbr) {
    const long long total = n_out * k;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const long long o = e / k;
        int n = (int)(e % k);
        const tl_coord q = out[o];
        int r[3];
        r[2] = n % g.kernel_size[2];
        n /= g.kernel_size[2];
        r[1] = n % g.kernel_size[1];
        r[0] = n / g.kernel_size[1];
        const long long c[3] = {q.x, q.y, q.z};
        int p[3];
        bool inside = q.b >= 0;
        for (int a = 0; a < 3; a++) {
            long long v = c[a] * g.stride[a] - g.padding[a] + (long long)r[a] * g.dilation[a];
            inside = inside && v >= TL_COORD_MIN && v <= TL_COORD_MAX;
            p[a] = (int)v;
        }
        int row = -1;
        if (inside) {
            tl_coord key = {q.b, p[0], p[1], p[2]};
            row = tl_cuda_hash_find(slots, mask, in, key);
        }
        nbr[e] = row;
    }
}

extern "C" tl_status tl_cuda_kmap_build(const tl_ctx *ctx, const tl_coord *in, int64_t n_in,
                                        const tl_coord *out, int64_t n_out, const tl_geom *g,
                                        void *workspace, int32_t *nbr) {
    int64_t k;
    if (!g) return TL_ERR_INVALID;
    TL_CUDA_RETURN_IF(tl_geom_check(g, &k));
    if (n_in < 0 || n_out < 0 || (n_in && !in) || (n_out && (!out || !nbr)))
        return TL_ERR_INVALID;
    if (n_in > TL_ROW_MAX || n_out > TL_ROW_MAX) return TL_ERR_OVERFLOW;
    if (n_out > INT64_MAX / k) return TL_ERR_OVERFLOW;
    tl_kmap_layout l;
    tl_cuda_ws w = tl_kmap_layout_of(workspace, n_in, &l);
    if (w.overflow) return TL_ERR_OVERFLOW;
    if (!tl_cuda_ws_ok(workspace, w.used)) return TL_ERR_INVALID;
    cudaStream_t stream;
    tl_cuda_scope scope;
    TL_CUDA_RETURN_IF(scope.enter(ctx, &stream));

    const unsigned long long mask = (unsigned long long)(l.cap - 1);
    TL_CUDA_TRY(cudaMemsetAsync(l.slots, 0xFF, sizeof(int) * (size_t)l.cap, stream));
    TL_CUDA_TRY(cudaMemsetAsync(l.flag, 0, sizeof(int), stream));
    if (n_in > 0) {
        tl_kmap_insert_kernel<<<tl_cuda_blocks(n_in), TL_CUDA_THREADS, 0, stream>>>(
            in, n_in, l.slots, mask, l.flag);
        TL_CUDA_LAUNCHED();
    }
    int flag = 0;
    TL_CUDA_RETURN_IF(tl_cuda_read_back(&flag, l.flag, sizeof(int), stream));
    /* Same precedence as the CPU: negative rows are checked before duplicates. */
    if (flag & TL_KMAP_NEGATIVE) return TL_ERR_INVALID;
    if (flag & TL_KMAP_DUPLICATE) return TL_ERR_DUPLICATE;
    if (n_out == 0) return TL_OK;
    tl_kmap_lookup_kernel<<<tl_cuda_blocks(n_out * k), TL_CUDA_THREADS, 0, stream>>>(
        in, out, n_out, (int)k, *g, l.slots, mask, nbr);
    TL_CUDA_LAUNCHED();
    return TL_OK;
}

/* One thread per (o, n): writes rev[i, n] = o.  Each (i, n) has one writer
 * in a valid map; atomicCAS keeps a corrupt map from racing. */
__global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_kmap_reverse_kernel(const int *nbr, long long n_out, long long k, long long n_in,
                           int *rev) {
    const long long total = n_out * k;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const int i = nbr[e];
        if (i < 0 || i >= n_in) continue;
        const long long o = e / k, n = e % k;
        (void)atomicCAS(&rev[i * k + n], -1, (int)o);
    }
}

extern "C" tl_status tl_cuda_kmap_reverse(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out,
                                          int64_t k, int64_t n_in, int32_t *rev) {
    if (n_out < 0 || n_in < 0 || k < 1 || (n_out && !nbr) || (n_in && !rev))
        return TL_ERR_INVALID;
    if (n_in > TL_ROW_MAX || n_out > TL_ROW_MAX) return TL_ERR_OVERFLOW;
    if (n_in > INT64_MAX / k || n_out > INT64_MAX / k) return TL_ERR_OVERFLOW;
    cudaStream_t stream;
    tl_cuda_scope scope;
    TL_CUDA_RETURN_IF(scope.enter(ctx, &stream));
    if (n_in == 0) return TL_OK;
    TL_CUDA_TRY(cudaMemsetAsync(rev, 0xFF, sizeof(int32_t) * (size_t)(n_in * k), stream));
    if (n_out == 0) return TL_OK;
    tl_kmap_reverse_kernel<<<tl_cuda_blocks(n_out * k), TL_CUDA_THREADS, 0, stream>>>(
        nbr, n_out, k, n_in, rev);
    TL_CUDA_LAUNCHED();
    return TL_OK;
}
