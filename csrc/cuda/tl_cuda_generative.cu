/* Generative support on the GPU, equal to csrc/core/tl_generative.c.
 *
 * Candidate j = i * K + n is in[i] * stride + r_n; the first rejected input
 * row (negative field, or a row beyond INT32_MAX) is min-reduced as
 * (i << 2 | code).  The candidates are deduplicated with the hash table, one
 * read-back brings the count, the field masks and the rejected row, then the
 * unique rows are compacted and radix-sorted by (b, x, y, z). */
#include "tl_cuda_generative.h"
#include "tl_cuda_rows.cuh"

struct tl_gv_geom {
    int kernel[3], stride[3];
};

/* Checks of tl_generative_check that need no data; *n_cand = n_in * K. */
static tl_status tl_gv_check(const tl_geom *g, int64_t n_in, tl_gv_geom *gv,
                             int64_t *n_cand) {
    if (!g || n_in < 0) return TL_ERR_INVALID;
    int64_t k;
    TL_CUDA_RETURN_IF(tl_geom_check(g, &k));
    for (int a = 0; a < 3; a++) {
        if (g->padding[a] != 0 || g->dilation[a] != 1) return TL_ERR_INVALID;
        gv->kernel[a] = g->kernel_size[a];
        gv->stride[a] = g->stride[a];
    }
    if (k > 0 && n_in > INT32_MAX / k) return TL_ERR_OVERFLOW;
    *n_cand = n_in * k;
    return TL_OK;
}

static tl_cuda_ws tl_gv_layout(void *base, int64_t n_cand, tl_rows_unique *u) {
    tl_cuda_ws w = tl_cuda_ws_begin(base);
    tl_rows_unique_layout(&w, n_cand, u);
    return w;
}

extern "C" tl_status tl_cuda_generative_workspace_size(int64_t n_in, const tl_geom *g,
                                                       size_t *bytes) {
    if (!bytes) return TL_ERR_INVALID;
    tl_gv_geom gv;
    int64_t n_cand;
    TL_CUDA_RETURN_IF(tl_gv_check(g, n_in, &gv, &n_cand));
    tl_rows_unique u;
    tl_cuda_ws w = tl_gv_layout(NULL, n_cand, &u);
    if (w.overflow) return TL_ERR_OVERFLOW;
    *bytes = w.used;
    return TL_OK;
}

static __global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_gv_candidates_kernel(const tl_coord *in, long long n_cand, tl_gv_geom g, tl_coord *cand,
                            tl_rows_info *info) {
    const long long k = (long long)g.kernel[0] * g.kernel[1] * g.kernel[2];
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n_cand;
         j += stride) {
        const long long i = j / k;
        const int n = (int)(j - i * k);
        const tl_coord c = in[i];
        const int r[3] = {n / (g.kernel[1] * g.kernel[2]), (n / g.kernel[2]) % g.kernel[1],
                          n % g.kernel[2]};
        const int f[3] = {c.x, c.y, c.z};
        long long q[3];
        unsigned long long code = 0;
        if ((c.b | c.x | c.y | c.z) < 0) code = TL_ROWS_BAD_INVALID;
        for (int a = 0; a < 3; a++) {
            q[a] = (long long)f[a] * g.stride[a] + r[a];
            if (!code && (long long)f[a] * g.stride[a] + g.kernel[a] - 1 > TL_COORD_MAX)
                code = TL_ROWS_BAD_OVERFLOW;
        }
        tl_coord out = {0, 0, 0, 0};
        if (code) {
            if (n == 0) atomicMin(&info->bad, ((unsigned long long)i << 2) | code);
        } else {
            out.b = c.b;
            out.x = (int)q[0];
            out.y = (int)q[1];
            out.z = (int)q[2];
        }
        cand[j] = out;
    }
}

extern "C" tl_status tl_cuda_generative_support(const tl_ctx *ctx, const tl_coord *in,
                                                int64_t n_in, const tl_geom *g, void *workspace,
                                                tl_coord *out, int64_t capacity,
                                                int64_t *n_out) {
    if (!n_out) return TL_ERR_INVALID;
    *n_out = 0;
    if (n_in < 0 || capacity < 0 || (n_in && !in) || (capacity && !out)) return TL_ERR_INVALID;
    tl_gv_geom gv;
    int64_t n_cand;
    TL_CUDA_RETURN_IF(tl_gv_check(g, n_in, &gv, &n_cand));
    tl_rows_unique u;
    tl_cuda_ws w = tl_gv_layout(workspace, n_cand, &u);
    if (w.overflow) return TL_ERR_OVERFLOW;
    if (!tl_cuda_ws_ok(workspace, w.used)) return TL_ERR_INVALID;
    cudaStream_t stream;
    tl_cuda_scope scope;
    TL_CUDA_RETURN_IF(scope.enter(ctx, &stream));
    if (n_cand == 0) return TL_OK;

    TL_CUDA_RETURN_IF(tl_rows_info_clear(u.info, stream));
    tl_gv_candidates_kernel<<<tl_cuda_blocks(n_cand), TL_CUDA_THREADS, 0, stream>>>(
        in, n_cand, gv, u.rows, u.info);
    TL_CUDA_LAUNCHED();
    tl_rows_info info;
    TL_CUDA_RETURN_IF(tl_rows_unique_count(&u, stream, &info));
    /* The CPU checks every row before it counts: errors, then capacity. */
    if (info.bad != TL_ROWS_NO_BAD) return tl_rows_bad_status(info.bad, NULL);
    if (info.count > capacity) return TL_ERR_CAPACITY;
    TL_CUDA_RETURN_IF(tl_rows_unique_sort(&u, &info, out, stream));
    *n_out = info.count;
    return TL_OK;
}
