/* Sparse pooling on the GPU, equal to csrc/core/tl_pool.c.
 *
 * One thread per (output row, channel) for the forwards and per (input row,
 * channel) for the max backward, each walking its kernel rows in order with
 * the CPU's loop body, so sums add in the same order (bit-identical in fp32
 * and fp64; half types accumulate in fp32 as the CPU's float path does), max
 * ties go to the first kernel row, and no atomics are used.  Table entries
 * outside [0, rows of the other side) are skipped. */
#include "tl_cuda_pool.h"
#include "tl_cuda_rows.cuh"

template <class T>
static __global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_pool_sum_kernel(const T *x, long long n_in, long long n_out, long long k, long long c,
                       const int32_t *nbr, int average, T *y) {
    typedef typename tl_acc<T>::type A;
    const long long total = n_out * c, stride = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        const long long o = t / c, j = t - o * c;
        A acc = 0;
        long long count = 0;
        for (long long n = 0; n < k; n++) {
            const int32_t i = nbr[o * k + n];
            if (i < 0 || i >= n_in) continue;
            count++;
            acc += tl_load(x[(long long)i * c + j]);
        }
        if (average && count > 1) acc /= (A)count;
        y[t] = tl_store<T>(acc);
    }
}

template <class T>
static __global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_pool_max_kernel(const T *x, long long n_in, long long n_out, long long k, long long c,
                       const int32_t *nbr, T *y, int32_t *arg) {
    typedef typename tl_acc<T>::type A;
    const long long total = n_out * c, stride = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        const long long o = t / c, j = t - o * c;
        A top = 0;
        int32_t best = -1;
        for (long long n = 0; n < k; n++) {
            const int32_t i = nbr[o * k + n];
            if (i < 0 || i >= n_in) continue;
            const A v = tl_load(x[(long long)i * c + j]);
            if (best < 0 || v > top || (v != v && top == top)) {
                top = v;
                best = i;
            }
        }
        y[t] = best < 0 ? tl_store<T>((A)0) : x[(long long)best * c + j];
        arg[t] = best;
    }
}

template <class T>
static __global__ void __launch_bounds__(TL_CUDA_THREADS)
    tl_pool_max_bwd_kernel(const T *dy, long long n_in, long long n_out, long long k,
                           long long c, const int32_t *rev, const int32_t *arg, T *dx) {
    typedef typename tl_acc<T>::type A;
    const long long total = n_in * c, stride = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        const long long i = t / c, j = t - i * c;
        A acc = 0;
        for (long long n = 0; n < k; n++) {
            const int32_t o = rev[i * k + n];
            if (o < 0 || o >= n_out) continue;
            if (arg[(long long)o * c + j] == i) acc += tl_load(dy[(long long)o * c + j]);
        }
        dx[t] = tl_store<T>(acc);
    }
}

/* tl_pool_check of tl_pool.c, with the half types added. */
static tl_status tl_cuda_pool_check(const tl_pool_desc *d) {
    if (!d) return TL_ERR_INVALID;
    if (d->n_in < 0 || d->n_out < 0 || d->k < 1 || d->c < 0) return TL_ERR_INVALID;
    if (d->n_in > TL_ROW_MAX || d->n_out > TL_ROW_MAX) return TL_ERR_OVERFLOW;
    if (!tl_rows_dtype_ok(d->dtype)) return TL_ERR_UNSUPPORTED;
    return TL_OK;
}

enum tl_pool_kind { TL_POOL_SUM, TL_POOL_MAX, TL_POOL_MAX_BWD };

/* One launch of `kind` for element type T; a is x (forwards) or dy. */
template <class T>
static tl_status tl_pool_launch(tl_pool_kind kind, const tl_pool_desc *d, const void *a,
                                const int32_t *table, int average, const int32_t *arg_in,
                                void *out, int32_t *arg_out, cudaStream_t stream) {
    const int64_t rows = kind == TL_POOL_MAX_BWD ? d->n_in : d->n_out;
    const unsigned blocks = tl_cuda_blocks(rows * d->c);
    switch (kind) {
    case TL_POOL_SUM:
        tl_pool_sum_kernel<T><<<blocks, TL_CUDA_THREADS, 0, stream>>>(
            (const T *)a, d->n_in, d->n_out, d->k, d->c, table, average, (T *)out);
        break;
    case TL_POOL_MAX:
        tl_pool_max_kernel<T><<<blocks, TL_CUDA_THREADS, 0, stream>>>(
            (const T *)a, d->n_in, d->n_out, d->k, d->c, table, (T *)out, arg_out);
        break;
    default:
        tl_pool_max_bwd_kernel<T><<<blocks, TL_CUDA_THREADS, 0, stream>>>(
            (const T *)a, d->n_in, d->n_out, d->k, d->c, table, arg_in, (T *)out);
        break;
    }
    TL_CUDA_LAUNCHED();
    return TL_OK;
}

static tl_status tl_pool_run(const tl_ctx *ctx, tl_pool_kind kind, const tl_pool_desc *d,
                             const void *a, const int32_t *table, int average,
                             const int32_t *arg_in, void *out, int32_t *arg_out) {
    cudaStream_t stream;
    tl_cuda_scope scope;
    TL_CUDA_RETURN_IF(scope.enter(ctx, &stream));
    const int64_t rows = kind == TL_POOL_MAX_BWD ? d->n_in : d->n_out;
    if (rows * d->c == 0) return TL_OK;
    switch (d->dtype) {
    case TL_F32:
        return tl_pool_launch<float>(kind, d, a, table, average, arg_in, out, arg_out, stream);
    case TL_F64:
        return tl_pool_launch<double>(kind, d, a, table, average, arg_in, out, arg_out, stream);
    case TL_F16:
        return tl_pool_launch<__half>(kind, d, a, table, average, arg_in, out, arg_out, stream);
    default:
        return tl_pool_launch<__nv_bfloat16>(kind, d, a, table, average, arg_in, out, arg_out,
                                             stream);
    }
}

extern "C" tl_status tl_cuda_pool_sum(const tl_ctx *ctx, const tl_pool_desc *d, const void *x,
                                      const int32_t *nbr, int average, void *y) {
    TL_CUDA_RETURN_IF(tl_cuda_pool_check(d));
    if ((d->n_in * d->c > 0 && !x) || (d->n_out * d->c > 0 && !y)) return TL_ERR_INVALID;
    if (d->n_out * d->k > 0 && !nbr) return TL_ERR_INVALID;
    return tl_pool_run(ctx, TL_POOL_SUM, d, x, nbr, average, NULL, y, NULL);
}

extern "C" tl_status tl_cuda_pool_max(const tl_ctx *ctx, const tl_pool_desc *d, const void *x,
                                      const int32_t *nbr, void *y, int32_t *argmax) {
    TL_CUDA_RETURN_IF(tl_cuda_pool_check(d));
    if ((d->n_in * d->c > 0 && !x) || (d->n_out * d->c > 0 && (!y || !argmax)))
        return TL_ERR_INVALID;
    if (d->n_out * d->k > 0 && !nbr) return TL_ERR_INVALID;
    return tl_pool_run(ctx, TL_POOL_MAX, d, x, nbr, 0, NULL, y, argmax);
}

extern "C" tl_status tl_cuda_pool_max_backward(const tl_ctx *ctx, const tl_pool_desc *d,
                                               const void *dy, const int32_t *rev,
                                               const int32_t *argmax, void *dx) {
    TL_CUDA_RETURN_IF(tl_cuda_pool_check(d));
    if ((d->n_out * d->c > 0 && (!dy || !argmax)) || (d->n_in * d->c > 0 && !dx))
        return TL_ERR_INVALID;
    if (d->n_in * d->k > 0 && !rev) return TL_ERR_INVALID;
    return tl_pool_run(ctx, TL_POOL_MAX_BWD, d, dy, rev, 0, argmax, dx, NULL);
}
