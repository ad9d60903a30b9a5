/* One call of a binding: its context and arguments (tl_py_parse), its
 * geometry (tl_parse_geom), its CUDA workspace (tl_py_workspace) and its
 * failure (tl_py_fail).  See tl_py.h. */
#include "tl_py.h"

#include <stdarg.h>
#include <stddef.h>

#ifdef TL_WITH_CUDA
#include "cuda/tl_cuda_device.h"
#endif

/* The context of a CUDA call: device index and stream handle from Python,
 * failures described into c->err. */
static void tl_py_cuda_ctx(tl_py_call *c, int device, unsigned long long stream) {
    c->err[0] = '\0';
    tl_ctx ctx = {.threads = 1,
                  .device = device,
                  .stream = tl_ptr(stream),
                  .simd_cap = 0,
                  .err = c->err,
                  .err_size = TL_PY_ERR_BYTES};
    c->ctx = ctx;
}

int tl_py_parse(PyObject *args, int cuda, tl_py_call *c, const char *fmt, ...) {
    /* The context arguments: the last one on the CPU, the first two on CUDA. */
    const Py_ssize_t n = PyTuple_Size(args), n_ctx = cuda ? 2 : 1;
    if (n < 0) return 0;
    if (n < n_ctx) {
        PyErr_Format(PyExc_TypeError, "torch_lattice._C: %s call needs %s",
                     cuda ? "a CUDA" : "a CPU", cuda ? "device and stream first" : "threads last");
        return 0;
    }
    c->cuda = cuda;
    PyObject *own = cuda ? PyTuple_GetSlice(args, 2, n) : PyTuple_GetSlice(args, 0, n - 1);
    if (!own) return 0;
    va_list va;
    va_start(va, fmt);
    int ok = PyArg_VaParse(own, fmt, va);
    va_end(va);
    Py_DECREF(own);
    if (!ok) return 0;
    int device = -1, threads = 1;
    unsigned long long stream = 0;
    PyObject *ctx_args = cuda ? PyTuple_GetSlice(args, 0, 2) : PyTuple_GetSlice(args, n - 1, n);
    ok = ctx_args && (cuda ? PyArg_ParseTuple(ctx_args, "iK", &device, &stream)
                           : PyArg_ParseTuple(ctx_args, "i", &threads));
    Py_XDECREF(ctx_args);
    if (!ok) return 0;
    if (cuda) {
        tl_py_cuda_ctx(c, device, stream);
        return 1;
    }
    return tl_cpu_ctx(threads, &c->ctx) == 0;
}

PyObject *tl_py_fail(const tl_py_call *c, tl_status st, const char *fn, const char *entry,
                     const char *invalid_rule, const char *overflow_rule) {
    if (c->cuda) {
        if (st == TL_ERR_OVERFLOW)
            return tl_raise_rule(fn, st,
                                 "rows and kernel rows must be <= 2^31 - 1 (int32 indices) and "
                                 "every size product, workspace and launch grid must fit its "
                                 "type");
#ifdef TL_WITH_CUDA
        if (st == TL_ERR_CUDA) {
            tl_cuda_error_describe(c->ctx.err, c->ctx.err_size);
            PyErr_Format(PyExc_RuntimeError, "torch_lattice._C.%s: CUDA error in %s: %s", fn,
                         entry, c->ctx.err);
            return NULL;
        }
#else
        (void)entry; /* a CPU-only build has no CUDA errors to name it in */
#endif
        return tl_raise(fn, st);
    }
    if (st == TL_ERR_INVALID && invalid_rule) return tl_raise_rule(fn, st, invalid_rule);
    if (st == TL_ERR_OVERFLOW && overflow_rule) return tl_raise_rule(fn, st, overflow_rule);
    return tl_raise(fn, st);
}

int tl_py_workspace(const tl_py_call *c, const char *fn, tl_status sized, size_t bytes,
                    PyObject *alloc, void **ws) {
    *ws = NULL;
    if (sized != TL_OK) {
        tl_py_fail(c, sized, fn, "", NULL, NULL);
        return 0;
    }
    if (bytes == 0) return 1;
    PyObject *r = PyObject_CallFunction(alloc, "K", (unsigned long long)bytes);
    if (!r) return 0;
    const unsigned long long p = PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    if (p == (unsigned long long)-1 && PyErr_Occurred()) return 0;
    if (p == 0) {
        PyErr_Format(PyExc_ValueError, "torch_lattice._C.%s: alloc(%zu) returned a null pointer",
                     fn, bytes);
        return 0;
    }
    *ws = tl_ptr(p);
    return 1;
}

int tl_parse_geom(const char *fn, PyObject *tuple, tl_geom *g) {
    if (!PyArg_ParseTuple(tuple, "(iii)(iii)(iii)(iii)", &g->kernel_size[0], &g->kernel_size[1],
                          &g->kernel_size[2], &g->stride[0], &g->stride[1], &g->stride[2],
                          &g->padding[0], &g->padding[1], &g->padding[2], &g->dilation[0],
                          &g->dilation[1], &g->dilation[2]))
        return 0;
    static const struct {
        const char *name;
        size_t offset;
        int minimum;
    } fields[] = {{"kernel_size", offsetof(tl_geom, kernel_size), 1},
                  {"stride", offsetof(tl_geom, stride), 1},
                  {"padding", offsetof(tl_geom, padding), 0},
                  {"dilation", offsetof(tl_geom, dilation), 1}};
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
        const int32_t *v = (const int32_t *)((const char *)g + fields[f].offset);
        for (int a = 0; a < 3; a++)
            if (v[a] < fields[f].minimum) {
                PyErr_Format(PyExc_ValueError,
                             "torch_lattice._C.%s: %s must be >= %d on every axis, got %d on "
                             "axis %d",
                             fn, fields[f].name, fields[f].minimum, (int)v[a], a);
                return 0;
            }
    }
    int64_t volume = (int64_t)g->kernel_size[0] * g->kernel_size[1] * g->kernel_size[2];
    if (volume > TL_ROW_MAX) {
        PyErr_Format(PyExc_OverflowError,
                     "torch_lattice._C.%s: kernel_size volume %lld exceeds the int32 kernel-row "
                     "limit %d",
                     fn, (long long)volume, (int)TL_ROW_MAX);
        return 0;
    }
    return 1;
}
