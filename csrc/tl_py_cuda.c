/* Binding of the CUDA entry points (csrc/cuda/tl_cuda.h).  Compiled in every
 * build; without TL_WITH_CUDA only the two queries exist and report that
 * CUDA is absent.  Python (torch_lattice/ops/_cuda.py) passes device
 * pointers as ints, the device index and torch's current stream handle, and
 * allocates every output and workspace with torch. */
#include "tl_py.h"

#ifdef TL_WITH_CUDA
#include "cuda/tl_cuda.h"
#include "tl_py_cuda.h"
#endif

PyDoc_STRVAR(cuda_compiled_doc, "cuda_compiled() -> bool\n\nWhether CUDA kernels are built in.");
static PyObject *py_cuda_compiled(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
#ifdef TL_WITH_CUDA
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

PyDoc_STRVAR(cuda_device_count_doc,
             "cuda_device_count() -> int\n\n"
             "Usable CUDA devices; 0 without a GPU, a driver or a CUDA build.");
static PyObject *py_cuda_device_count(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    int count = 0;
#ifdef TL_WITH_CUDA
    tl_status st = tl_cuda_device_count(&count);
    if (st != TL_OK) return tl_raise("cuda_device_count", st);
#endif
    return PyLong_FromLong(count);
}

/* The SM architectures the kernels were compiled for, as setup.py's
 * TORCH_LATTICE_CUDA_ARCHS ("80;86;89;90"); "" in a CPU-only build. */
#ifndef TL_CUDA_ARCHS
#define TL_CUDA_ARCHS ""
#endif

PyDoc_STRVAR(cuda_archs_doc,
             "cuda_archs() -> str\n\n"
             "';'-separated SM architectures the CUDA kernels were built for ('' without "
             "CUDA); the newest is also embedded as PTX.");
static PyObject *py_cuda_archs(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
#ifdef TL_WITH_CUDA
    return PyUnicode_FromString(TL_CUDA_ARCHS);
#else
    return PyUnicode_FromString("");
#endif
}

#ifdef TL_WITH_CUDA

PyDoc_STRVAR(cuda_kmap_workspace_size_doc,
             "cuda_kmap_workspace_size(n_in) -> int\n\nWorkspace bytes of cuda_kmap_build.");
static PyObject *py_cuda_kmap_workspace_size(PyObject *self, PyObject *args) {
    (void)self;
    long long n_in;
    size_t bytes = 0;
    if (!PyArg_ParseTuple(args, "L", &n_in)) return NULL;
    tl_status st = tl_cuda_kmap_workspace_size(n_in, &bytes);
    return tl_size_result("cuda_kmap_workspace_size", st, bytes);
}

PyDoc_STRVAR(cuda_kmap_build_doc,
             "cuda_kmap_build(device, stream, in_ptr, n_in, out_ptr, n_out, geom, ws_ptr, "
             "nbr_ptr)\n\nFills the (n_out, K) int32 neighbour table on the GPU.");
static PyObject *py_cuda_kmap_build(PyObject *self, PyObject *args) {
    (void)self;
    int device;
    unsigned long long stream, pin, pout, pws, pnbr;
    long long n_in, n_out;
    PyObject *geom;
    tl_geom g;
    if (!PyArg_ParseTuple(args, "iKKLKLOKK", &device, &stream, &pin, &n_in, &pout, &n_out,
                          &geom, &pws, &pnbr))
        return NULL;
    if (!tl_parse_geom("cuda_kmap_build", geom, &g)) return NULL;
    char err[TL_CUDA_ERR_BYTES];
    tl_ctx ctx = tl_cuda_ctx(device, stream, err);
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_kmap_build(&ctx, tl_ptr(pin), n_in, tl_ptr(pout), n_out, &g, tl_ptr(pws),
                            tl_ptr(pnbr));
    Py_END_ALLOW_THREADS
    if (st != TL_OK) return tl_cuda_raise("cuda_kmap_build", "tl_cuda_kmap_build", st, &ctx);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cuda_kmap_reverse_doc,
             "cuda_kmap_reverse(device, stream, nbr_ptr, n_out, k, n_in, rev_ptr)\n\n"
             "Fills the (n_in, K) transpose of nbr on the GPU.");
static PyObject *py_cuda_kmap_reverse(PyObject *self, PyObject *args) {
    (void)self;
    int device;
    unsigned long long stream, pnbr, prev;
    long long n_out, k, n_in;
    if (!PyArg_ParseTuple(args, "iKKLLLK", &device, &stream, &pnbr, &n_out, &k, &n_in, &prev))
        return NULL;
    char err[TL_CUDA_ERR_BYTES];
    tl_ctx ctx = tl_cuda_ctx(device, stream, err);
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_kmap_reverse(&ctx, tl_ptr(pnbr), n_out, k, n_in, tl_ptr(prev));
    Py_END_ALLOW_THREADS
    if (st != TL_OK) return tl_cuda_raise("cuda_kmap_reverse", "tl_cuda_kmap_reverse", st, &ctx);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cuda_generate_workspace_size_doc,
             "cuda_generate_workspace_size(n_in, geom, out_range) -> int\n\n"
             "Workspace bytes of cuda_generate.");
static PyObject *py_cuda_generate_workspace_size(PyObject *self, PyObject *args) {
    (void)self;
    long long n_in;
    int64_t r[3];
    PyObject *geom;
    tl_geom g;
    size_t bytes = 0;
    if (!PyArg_ParseTuple(args, "LO(LLL)", &n_in, &geom, &r[0], &r[1], &r[2])) return NULL;
    if (!tl_parse_geom("cuda_generate_workspace_size", geom, &g)) return NULL;
    tl_status st = tl_cuda_generate_workspace_size(n_in, &g, r, &bytes);
    return tl_size_result("cuda_generate_workspace_size", st, bytes);
}

PyDoc_STRVAR(cuda_generate_doc,
             "cuda_generate(device, stream, in_ptr, n_in, geom, out_range, ws_ptr, out_ptr, "
             "capacity) -> int\n\nWrites the sorted generated support; returns its row count.");
static PyObject *py_cuda_generate(PyObject *self, PyObject *args) {
    (void)self;
    int device;
    unsigned long long stream, pin, pws, pout;
    long long n_in, cap;
    int64_t r[3], n_out = 0;
    PyObject *geom;
    tl_geom g;
    if (!PyArg_ParseTuple(args, "iKKLO(LLL)KKL", &device, &stream, &pin, &n_in, &geom, &r[0],
                          &r[1], &r[2], &pws, &pout, &cap))
        return NULL;
    if (!tl_parse_geom("cuda_generate", geom, &g)) return NULL;
    char err[TL_CUDA_ERR_BYTES];
    tl_ctx ctx = tl_cuda_ctx(device, stream, err);
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_generate(&ctx, tl_ptr(pin), n_in, &g, r, tl_ptr(pws), tl_ptr(pout), cap,
                          &n_out);
    Py_END_ALLOW_THREADS
    if (st != TL_OK) return tl_cuda_raise("cuda_generate", "tl_cuda_generate", st, &ctx);
    return PyLong_FromLongLong((long long)n_out);
}

PyDoc_STRVAR(cuda_pairs_workspace_size_doc,
             "cuda_pairs_workspace_size(n_out, k) -> int\n\n"
             "Workspace bytes of cuda_pairs_count and cuda_pairs_build.");
static PyObject *py_cuda_pairs_workspace_size(PyObject *self, PyObject *args) {
    (void)self;
    long long n_out, k;
    size_t bytes = 0;
    if (!PyArg_ParseTuple(args, "LL", &n_out, &k)) return NULL;
    tl_status st = tl_cuda_pairs_workspace_size(n_out, k, &bytes);
    return tl_size_result("cuda_pairs_workspace_size", st, bytes);
}

PyDoc_STRVAR(cuda_pairs_count_doc,
             "cuda_pairs_count(device, stream, nbr_ptr, n_out, k, ws_ptr) -> int\n\n"
             "Number of non-negative entries of nbr.");
static PyObject *py_cuda_pairs_count(PyObject *self, PyObject *args) {
    (void)self;
    int device;
    unsigned long long stream, pnbr, pws;
    long long n_out, k;
    int64_t count = 0;
    if (!PyArg_ParseTuple(args, "iKKLLK", &device, &stream, &pnbr, &n_out, &k, &pws))
        return NULL;
    char err[TL_CUDA_ERR_BYTES];
    tl_ctx ctx = tl_cuda_ctx(device, stream, err);
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_pairs_count(&ctx, tl_ptr(pnbr), n_out, k, tl_ptr(pws), &count);
    Py_END_ALLOW_THREADS
    if (st != TL_OK) return tl_cuda_raise("cuda_pairs_count", "tl_cuda_pairs_count", st, &ctx);
    return PyLong_FromLongLong((long long)count);
}

PyDoc_STRVAR(cuda_pairs_build_doc,
             "cuda_pairs_build(device, stream, nbr_ptr, n_out, k, ws_ptr, n_pairs, "
             "offsets_ptr, in_ptr, out_ptr)\n\nFills the CSR pair lists from nbr.");
static PyObject *py_cuda_pairs_build(PyObject *self, PyObject *args) {
    (void)self;
    int device;
    unsigned long long stream, pnbr, pws, poff, pin, pout;
    long long n_out, k, n_pairs;
    if (!PyArg_ParseTuple(args, "iKKLLKLKKK", &device, &stream, &pnbr, &n_out, &k, &pws,
                          &n_pairs, &poff, &pin, &pout))
        return NULL;
    char err[TL_CUDA_ERR_BYTES];
    tl_ctx ctx = tl_cuda_ctx(device, stream, err);
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_pairs_build(&ctx, tl_ptr(pnbr), n_out, k, tl_ptr(pws), n_pairs, tl_ptr(poff),
                             tl_ptr(pin), tl_ptr(pout));
    Py_END_ALLOW_THREADS
    if (st != TL_OK) return tl_cuda_raise("cuda_pairs_build", "tl_cuda_pairs_build", st, &ctx);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cuda_conv_workspace_size_doc,
             "cuda_conv_workspace_size(dataflow, weight_grad, dtype, n_in, n_out, k, c_in, "
             "c_out, n_pairs) -> int\n\nWorkspace bytes of one cuda_conv call.");
static PyObject *py_cuda_conv_workspace_size(PyObject *self, PyObject *args) {
    (void)self;
    int df, wgrad, dtype;
    long long n_in, n_out, k, cin, cout, n_pairs;
    size_t bytes = 0;
    if (!PyArg_ParseTuple(args, "iiiLLLLLL", &df, &wgrad, &dtype, &n_in, &n_out, &k, &cin,
                          &cout, &n_pairs))
        return NULL;
    tl_conv_desc d = {(tl_dtype)dtype, n_in, n_out, k, cin, cout};
    tl_status st = tl_cuda_conv_workspace_size((tl_cuda_dataflow)df, wgrad, &d, n_pairs, &bytes);
    return tl_size_result("cuda_conv_workspace_size", st, bytes);
}

/* Name of the entry point tl_cuda_conv_call runs, for error messages. */
static const char *tl_cuda_conv_entry(int df, int wgrad) {
    switch (df) {
    case TL_CUDA_IMPLICIT_GEMM:
        return wgrad ? "tl_cuda_implicit_gemm_weight_grad" : "tl_cuda_implicit_gemm_forward";
    case TL_CUDA_FETCH_ON_DEMAND:
        return wgrad ? "tl_cuda_fetch_on_demand_weight_grad" : "tl_cuda_fetch_on_demand_forward";
    default: return "cuda_conv";
    }
}

/* One tile-GEMM dataflow call; a and b are (x, w) for the forward, (x, dy)
 * for the weight gradient.  Gather-scatter is not one (see cuda_gather_rows). */
static tl_status tl_cuda_conv_call(int df, int wgrad, const tl_ctx *ctx, const tl_conv_desc *d,
                                   int tf32, const void *a, const void *b, const int32_t *nbr,
                                   const tl_cuda_pairs *p, void *ws, void *out) {
    switch (df) {
    case TL_CUDA_IMPLICIT_GEMM:
        return wgrad ? tl_cuda_implicit_gemm_weight_grad(ctx, d, tf32, a, b, nbr, ws, out)
                     : tl_cuda_implicit_gemm_forward(ctx, d, tf32, a, b, nbr, ws, out);
    case TL_CUDA_FETCH_ON_DEMAND:
        return wgrad ? tl_cuda_fetch_on_demand_weight_grad(ctx, d, tf32, a, b, p, ws, out)
                     : tl_cuda_fetch_on_demand_forward(ctx, d, tf32, a, b, p, ws, out);
    default: return TL_ERR_INVALID;
    }
}

PyDoc_STRVAR(cuda_conv_doc,
             "cuda_conv(device, stream, dataflow, weight_grad, dtype, n_in, n_out, k, c_in, "
             "c_out, allow_tf32, a_ptr, b_ptr, nbr_ptr, offsets_ptr, pair_in_ptr, "
             "pair_out_ptr, n_pairs, ws_ptr, out_ptr)\n\n"
             "Forward (a = x, b = w) or weight gradient (a = x, b = dy) of one dataflow; "
             "dataflow 0 implicit GEMM (nbr), 1 fetch-on-demand (pairs).");
static PyObject *py_cuda_conv(PyObject *self, PyObject *args) {
    (void)self;
    int device, df, wgrad, dtype, tf32;
    unsigned long long stream, pa, pb, pnbr, poff, ppin, ppout, pws, pout;
    long long n_in, n_out, k, cin, cout, n_pairs;
    if (!PyArg_ParseTuple(args, "iKiiiLLLLLpKKKKKKLKK", &device, &stream, &df, &wgrad, &dtype,
                          &n_in, &n_out, &k, &cin, &cout, &tf32, &pa, &pb, &pnbr, &poff, &ppin,
                          &ppout, &n_pairs, &pws, &pout))
        return NULL;
    tl_conv_desc d = {(tl_dtype)dtype, n_in, n_out, k, cin, cout};
    tl_cuda_pairs p = {n_pairs, tl_ptr(poff), tl_ptr(ppin), tl_ptr(ppout)};
    char err[TL_CUDA_ERR_BYTES];
    tl_ctx ctx = tl_cuda_ctx(device, stream, err);
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_conv_call(df, wgrad, &ctx, &d, tf32, tl_ptr(pa), tl_ptr(pb), tl_ptr(pnbr), &p,
                           tl_ptr(pws), tl_ptr(pout));
    Py_END_ALLOW_THREADS
    if (st != TL_OK) return tl_cuda_raise("cuda_conv", tl_cuda_conv_entry(df, wgrad), st, &ctx);
    Py_RETURN_NONE;
}

/* The arguments gather_rows and scatter_add_rows share: (device, stream, dtype, src,
 * n0, c, idx, n1, dst) with pointers p[0..2] = src, idx, dst and sizes n[0..2] = n0, c,
 * n1. Returns 0 with a Python exception set when they do not parse. */
static int tl_parse_rows(PyObject *args, tl_ctx *ctx, char *err, tl_dtype *dtype,
                         unsigned long long p[3], long long n[3]) {
    int device, dt;
    unsigned long long stream;
    if (!PyArg_ParseTuple(args, "iKiKLLKLK", &device, &stream, &dt, &p[0], &n[0], &n[1], &p[1],
                          &n[2], &p[2]))
        return 0;
    *dtype = (tl_dtype)dt;
    *ctx = tl_cuda_ctx(device, stream, err);
    return 1;
}

PyDoc_STRVAR(cuda_gather_rows_doc,
             "cuda_gather_rows(device, stream, dtype, src_ptr, n_src, c, idx_ptr, n_rows, "
             "dst_ptr)\n\ndst[r] = src[idx[r]] for the (n_rows, c) rows of dst.");
static PyObject *py_cuda_gather_rows(PyObject *self, PyObject *args) {
    (void)self;
    tl_ctx ctx;
    char err[TL_CUDA_ERR_BYTES];
    tl_dtype dtype;
    unsigned long long p[3]; /* src, idx, dst */
    long long n[3];          /* n_src, c, n_rows */
    if (!tl_parse_rows(args, &ctx, err, &dtype, p, n)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_gather_rows(&ctx, dtype, tl_ptr(p[0]), n[0], n[1], tl_ptr(p[1]), n[2],
                             tl_ptr(p[2]));
    Py_END_ALLOW_THREADS
    if (st != TL_OK) return tl_cuda_raise("cuda_gather_rows", "tl_cuda_gather_rows", st, &ctx);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cuda_scatter_add_rows_doc,
             "cuda_scatter_add_rows(device, stream, dtype, src_ptr, n_rows, c, idx_ptr, n_dst, "
             "acc_ptr)\n\nacc[idx[r]] += src[r] in fp32 (atomics).");
static PyObject *py_cuda_scatter_add_rows(PyObject *self, PyObject *args) {
    (void)self;
    tl_ctx ctx;
    char err[TL_CUDA_ERR_BYTES];
    tl_dtype dtype;
    unsigned long long p[3]; /* src, idx, acc */
    long long n[3];          /* n_rows, c, n_dst */
    if (!tl_parse_rows(args, &ctx, err, &dtype, p, n)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_scatter_add_rows(&ctx, dtype, tl_ptr(p[0]), n[0], n[1], tl_ptr(p[1]), n[2],
                                  tl_ptr(p[2]));
    Py_END_ALLOW_THREADS
    if (st != TL_OK)
        return tl_cuda_raise("cuda_scatter_add_rows", "tl_cuda_scatter_add_rows", st, &ctx);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cuda_device_capability_doc,
             "cuda_device_capability(index) -> (major, minor)\n\n"
             "Compute capability of CUDA device `index`.");
static PyObject *py_cuda_device_capability(PyObject *self, PyObject *args) {
    (void)self;
    int index, major = 0, minor = 0;
    if (!PyArg_ParseTuple(args, "i", &index)) return NULL;
    tl_status st = tl_cuda_device_capability(index, &major, &minor);
    if (st == TL_ERR_INVALID) {
        PyErr_Format(PyExc_ValueError,
                     "torch_lattice._C.cuda_device_capability: no CUDA device with index %d",
                     index);
        return NULL;
    }
    if (st != TL_OK) return tl_raise("cuda_device_capability", st);
    return Py_BuildValue("(ii)", major, minor);
}

#define TL_CUDA_METHOD(name) {#name, py_##name, METH_VARARGS, name##_doc}

#endif /* TL_WITH_CUDA */

PyMethodDef tl_py_cuda_methods[] = {
    {"cuda_compiled", py_cuda_compiled, METH_NOARGS, cuda_compiled_doc},
    {"cuda_device_count", py_cuda_device_count, METH_NOARGS, cuda_device_count_doc},
    {"cuda_archs", py_cuda_archs, METH_NOARGS, cuda_archs_doc},
#ifdef TL_WITH_CUDA
    TL_CUDA_METHOD(cuda_kmap_workspace_size),
    TL_CUDA_METHOD(cuda_kmap_build),
    TL_CUDA_METHOD(cuda_kmap_reverse),
    TL_CUDA_METHOD(cuda_generate_workspace_size),
    TL_CUDA_METHOD(cuda_generate),
    TL_CUDA_METHOD(cuda_pairs_workspace_size),
    TL_CUDA_METHOD(cuda_pairs_count),
    TL_CUDA_METHOD(cuda_pairs_build),
    TL_CUDA_METHOD(cuda_conv_workspace_size),
    TL_CUDA_METHOD(cuda_conv),
    TL_CUDA_METHOD(cuda_gather_rows),
    TL_CUDA_METHOD(cuda_scatter_add_rows),
    TL_CUDA_METHOD(cuda_device_capability),
#endif
    {NULL, NULL, 0, NULL},
};
