/* Binding of the pooling family, CPU and CUDA (core/tl_pool.h,
 * cuda/tl_cuda_pool.h).  Both devices take the same arguments between their
 * context ones and raise under the CPU function's name, so a bad argument
 * reads the same on either; CUDA runtime failures also name the C entry
 * point. */
#include "tl_py.h"

#include "core/tl_pool.h"

#ifdef TL_WITH_CUDA
#include "cuda/tl_cuda_pool.h"
#endif

/* The size rule behind TL_ERR_OVERFLOW of pooling. */
#define TL_POOL_SIZES                                                                       \
    "n_in, n_out and k must be <= 2^31 - 1 (int32 rows) and rows x channels must fit int64"

typedef enum tl_pool_op { TL_POOL_SUM, TL_POOL_MAX, TL_POOL_MAX_BACKWARD } tl_pool_op;

/* The rules behind TL_ERR_INVALID of pooling: the table's entries (the forward reads nbr,
 * whose entries are input rows; the sum's gradient passes rev as nbr, the sides swapped),
 * then the sizes and pointers every entry point checks. */
#define TL_POOL_VALID "; sizes must be >= 0 (k >= 1) and pointers valid"
#define TL_POOL_TABLE_RULE                                                                  \
    "every nbr entry must be -1 (no neighbour) or an input row in [0, n_in) (in the "      \
    "backward, rev's entries are output rows in [0, n_out))" TL_POOL_VALID

static const struct {
    const char *name, *entry, *invalid;
} tl_pool_names[] = {{"pool_sum", "tl_cuda_pool_sum", TL_POOL_TABLE_RULE},
                     {"pool_max", "tl_cuda_pool_max", TL_POOL_TABLE_RULE},
                     {"pool_max_backward", "tl_cuda_pool_max_backward",
                      "every rev entry must be -1 (no neighbour) or an output row in [0, n_out) "
                      "and every argmax entry -1 or an input row in [0, n_in)" TL_POOL_VALID}};

/* The three kernels of one device; CPU and CUDA share their signatures. */
typedef struct tl_pool_kernels {
    tl_status (*sum)(const tl_ctx *, const tl_pool_desc *, const void *, const int32_t *, int,
                     void *);
    tl_status (*max)(const tl_ctx *, const tl_pool_desc *, const void *, const int32_t *, void *,
                     int32_t *);
    tl_status (*max_backward)(const tl_ctx *, const tl_pool_desc *, const void *,
                              const int32_t *, const int32_t *, void *);
} tl_pool_kernels;

static const tl_pool_kernels tl_pool_cpu = {tl_pool_sum, tl_pool_max, tl_pool_max_backward};
#ifdef TL_WITH_CUDA
static const tl_pool_kernels tl_pool_cuda = {tl_cuda_pool_sum, tl_cuda_pool_max,
                                             tl_cuda_pool_max_backward};
#endif

/* Every pooling entry point: (dtype, n_in, n_out, k, c, a, table, flag, out, aux), with
 * threads last on the CPU and (device, stream) first on CUDA.  a is x (dy for the max
 * backward), table nbr (rev), flag average for the sum, aux the argmax. */
static PyObject *tl_pool_call(tl_pool_op op, int cuda, PyObject *args) {
    tl_py_call c;
    int dtype, flag;
    long long n_in, n_out, k, ch;
    unsigned long long pa, ptab, pout, paux;
    if (!tl_py_parse(args, cuda, &c, "iLLLLKKiKK", &dtype, &n_in, &n_out, &k, &ch, &pa, &ptab,
                     &flag, &pout, &paux))
        return NULL;
    const tl_pool_kernels *f = &tl_pool_cpu;
#ifdef TL_WITH_CUDA
    if (cuda) f = &tl_pool_cuda;
#endif
    const tl_pool_desc d = {(tl_dtype)dtype, n_in, n_out, k, ch};
    const void *a = tl_ptr(pa);
    const int32_t *table = tl_ptr(ptab);
    tl_status st = TL_ERR_INVALID;
    Py_BEGIN_ALLOW_THREADS
    switch (op) {
    case TL_POOL_SUM: st = f->sum(&c.ctx, &d, a, table, flag, tl_ptr(pout)); break;
    case TL_POOL_MAX: st = f->max(&c.ctx, &d, a, table, tl_ptr(pout), tl_ptr(paux)); break;
    case TL_POOL_MAX_BACKWARD:
        st = f->max_backward(&c.ctx, &d, a, table, tl_ptr(paux), tl_ptr(pout));
        break;
    }
    Py_END_ALLOW_THREADS
    if (st != TL_OK)
        return tl_py_fail(&c, st, tl_pool_names[op].name, tl_pool_names[op].entry,
                          tl_pool_names[op].invalid, TL_POOL_SIZES);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(pool_sum_doc,
             "pool_sum(dtype, n_in, n_out, k, c, x, nbr, average, y, 0, threads)\n\n"
             "Sum (average=0) or average pooling over the neighbour table nbr.");
TL_PY_FORWARD(pool_sum, tl_pool_call(TL_POOL_SUM, 0, args))

PyDoc_STRVAR(pool_max_doc,
             "pool_max(dtype, n_in, n_out, k, c, x, nbr, 0, y, argmax, threads)\n\n"
             "Max pooling with int32 argmax (input row, -1 when none).");
TL_PY_FORWARD(pool_max, tl_pool_call(TL_POOL_MAX, 0, args))

PyDoc_STRVAR(pool_max_backward_doc,
             "pool_max_backward(dtype, n_in, n_out, k, c, dy, rev, 0, dx, argmax, threads)\n\n"
             "dx[i, c] = sum of dy[o, c] over outputs o whose argmax[o, c] is i.");
TL_PY_FORWARD(pool_max_backward, tl_pool_call(TL_POOL_MAX_BACKWARD, 0, args))

#ifdef TL_WITH_CUDA

PyDoc_STRVAR(cuda_pool_sum_doc,
             "cuda_pool_sum(device, stream, dtype, n_in, n_out, k, c, x, nbr, average, y, 0)\n\n"
             "Sum (average=0) or average pooling over the neighbour table nbr.");
TL_PY_FORWARD(cuda_pool_sum, tl_pool_call(TL_POOL_SUM, 1, args))

PyDoc_STRVAR(cuda_pool_max_doc,
             "cuda_pool_max(device, stream, dtype, n_in, n_out, k, c, x, nbr, 0, y, argmax)\n\n"
             "Max pooling with int32 argmax (input row, -1 when none).");
TL_PY_FORWARD(cuda_pool_max, tl_pool_call(TL_POOL_MAX, 1, args))

PyDoc_STRVAR(cuda_pool_max_backward_doc,
             "cuda_pool_max_backward(device, stream, dtype, n_in, n_out, k, c, dy, rev, 0, dx, "
             "argmax)\n\ndx[i, c] = sum of dy[o, c] over outputs o whose argmax[o, c] is i.");
TL_PY_FORWARD(cuda_pool_max_backward, tl_pool_call(TL_POOL_MAX_BACKWARD, 1, args))

#endif /* TL_WITH_CUDA */

PyMethodDef tl_py_pool_methods[] = {
    TL_PY_METHOD(pool_sum),
    TL_PY_METHOD(pool_max),
    TL_PY_METHOD(pool_max_backward),
#ifdef TL_WITH_CUDA
    TL_PY_METHOD(cuda_pool_sum),
    TL_PY_METHOD(cuda_pool_max),
    TL_PY_METHOD(cuda_pool_max_backward),
#endif
    {NULL, NULL, 0, NULL},
};
