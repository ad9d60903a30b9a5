/* Binding of batch normalization with its fused ReLU, CPU only
 * (core/tl_norm.h); on CUDA the Python layer calls torch's own kernels. */
#include "tl_py.h"

#include "core/tl_norm.h"

/* The size rule behind TL_ERR_OVERFLOW of batch normalization. */
#define TL_NORM_SIZES "rows x channels must fit int64"

typedef enum tl_norm_op {
    TL_NORM_STATS,
    TL_NORM_APPLY,
    TL_NORM_BACKWARD_REDUCE,
    TL_NORM_BACKWARD_APPLY
} tl_norm_op;

static const char *const tl_norm_names[] = {"batch_norm_stats", "batch_norm_apply",
                                            "batch_norm_backward_reduce",
                                            "batch_norm_backward_apply"};

/* Every entry point: (dtype, n, c, relu, p0 .. p8, threads); the pointers are
 * the C function's own arguments in order, unused ones 0. */
static PyObject *tl_norm_call(tl_norm_op op, PyObject *args) {
    tl_py_call c;
    int dtype, relu;
    long long n, ch;
    unsigned long long p[9];
    if (!tl_py_parse(args, 0, &c, "iLLiKKKKKKKKK", &dtype, &n, &ch, &relu, &p[0], &p[1], &p[2],
                     &p[3], &p[4], &p[5], &p[6], &p[7], &p[8]))
        return NULL;
    const tl_norm_desc d = {(tl_dtype)dtype, n, ch, relu};
    tl_status st = TL_ERR_INVALID;
    Py_BEGIN_ALLOW_THREADS
    switch (op) {
    case TL_NORM_STATS:
        st = tl_norm_stats(&c.ctx, &d, tl_ptr(p[0]), tl_ptr(p[1]), tl_ptr(p[2]));
        break;
    case TL_NORM_APPLY:
        st = tl_norm_apply(&c.ctx, &d, tl_ptr(p[0]), tl_ptr(p[1]), tl_ptr(p[2]), tl_ptr(p[3]));
        break;
    case TL_NORM_BACKWARD_REDUCE:
        st = tl_norm_backward_reduce(&c.ctx, &d, tl_ptr(p[0]), tl_ptr(p[1]), tl_ptr(p[2]),
                                     tl_ptr(p[3]), tl_ptr(p[4]), tl_ptr(p[5]), tl_ptr(p[6]));
        break;
    case TL_NORM_BACKWARD_APPLY:
        st = tl_norm_backward_apply(&c.ctx, &d, tl_ptr(p[0]), tl_ptr(p[1]), tl_ptr(p[2]),
                                    tl_ptr(p[3]), tl_ptr(p[4]), tl_ptr(p[5]), tl_ptr(p[6]),
                                    tl_ptr(p[7]));
        break;
    }
    Py_END_ALLOW_THREADS
    if (st != TL_OK) return tl_py_fail(&c, st, tl_norm_names[op], NULL, NULL, TL_NORM_SIZES);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(batch_norm_stats_doc,
             "batch_norm_stats(dtype, n, c, 0, x, mean, var, 0, 0, 0, 0, 0, 0, threads)\n\n"
             "float64 mean and biased variance of the (n, c) rows of x, per channel.");
TL_PY_FORWARD(batch_norm_stats, tl_norm_call(TL_NORM_STATS, args))

PyDoc_STRVAR(batch_norm_apply_doc,
             "batch_norm_apply(dtype, n, c, relu, x, scale, shift, y, 0, 0, 0, 0, 0, threads)\n\n"
             "y = x * scale + shift per channel (float32 scale and shift), then max(., 0) "
             "when relu.");
TL_PY_FORWARD(batch_norm_apply, tl_norm_call(TL_NORM_APPLY, args))

PyDoc_STRVAR(batch_norm_backward_reduce_doc,
             "batch_norm_backward_reduce(dtype, n, c, relu, dy, x, scale, shift, mean, sum_g, "
             "sum_gx, 0, 0, threads)\n\n"
             "float64 sums of g and g * (x - mean) per channel, g = dy cut by the fused ReLU.");
TL_PY_FORWARD(batch_norm_backward_reduce, tl_norm_call(TL_NORM_BACKWARD_REDUCE, args))

PyDoc_STRVAR(batch_norm_backward_apply_doc,
             "batch_norm_backward_apply(dtype, n, c, relu, dy, x, scale, shift, a, b, k, dx, 0, "
             "threads)\n\n"
             "dx = g * a + x * b + k per channel, g = dy cut by the fused ReLU.");
TL_PY_FORWARD(batch_norm_backward_apply, tl_norm_call(TL_NORM_BACKWARD_APPLY, args))

PyMethodDef tl_py_norm_methods[] = {
    TL_PY_METHOD(batch_norm_stats),
    TL_PY_METHOD(batch_norm_apply),
    TL_PY_METHOD(batch_norm_backward_reduce),
    TL_PY_METHOD(batch_norm_backward_apply),
    {NULL, NULL, 0, NULL},
};
