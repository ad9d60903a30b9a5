/* Binding of the CUDA building blocks (csrc/cuda/tl_cuda_blocks.h):
 * voxelize, voxel_reduce, devoxel map / gather, pooling, generative support.
 * Compiled in every build; without TL_WITH_CUDA the table is empty and
 * torch_lattice/ops/_cuda_blocks.py raises before calling it.
 *
 * Python passes device pointers as ints, the device index and torch's
 * current stream handle, and allocates every output and workspace.  Failures
 * raise under the name of the matching CPU function (voxel_quantize,
 * voxel_reduce, ...), so a bad argument reads the same on either device;
 * CUDA runtime failures also name the C entry point.  As on the CPU, rejected
 * points come back as (status, bad_point) so the op layer can name them. */
#include "tl_py.h"

#ifdef TL_WITH_CUDA

#include "cuda/tl_cuda_blocks.h"
#include "tl_py_cuda.h"

static int tl_blk_grid(PyObject *size, PyObject *origin, tl_voxel_grid *g) {
    return PyArg_ParseTuple(size, "ddd", &g->size[0], &g->size[1], &g->size[2]) &&
           PyArg_ParseTuple(origin, "ddd", &g->origin[0], &g->origin[1], &g->origin[2]);
}

/* A rejected point is a result, not an exception (see tl_py_blocks.c). */
static int tl_blk_point_rejected(tl_status st, long long bad) {
    return (st == TL_ERR_INVALID || st == TL_ERR_OVERFLOW) && bad >= 0;
}

PyDoc_STRVAR(cuda_voxelize_workspace_size_doc,
             "cuda_voxelize_workspace_size(n) -> int\n\nWorkspace bytes of cuda_voxelize.");
static PyObject *py_cuda_voxelize_workspace_size(PyObject *self, PyObject *args) {
    (void)self;
    long long n;
    size_t bytes = 0;
    if (!PyArg_ParseTuple(args, "L", &n)) return NULL;
    const tl_status st = tl_cuda_voxelize_workspace_size(n, &bytes);
    return tl_size_result("cuda_voxelize_workspace_size", st, bytes);
}

PyDoc_STRVAR(cuda_voxelize_doc,
             "cuda_voxelize(device, stream, dtype, pts, batch, n, size, origin, ws, uniq, "
             "inverse) -> (st, bad, m)\n\n"
             "Sorted unique voxel rows into uniq (capacity n), int64 inverse, count m; "
             "st != 0 names the first rejected point bad.");
static PyObject *py_cuda_voxelize(PyObject *self, PyObject *args) {
    (void)self;
    int device, dtype;
    unsigned long long stream, pp, pb, pws, pu, pi;
    long long n, bad = -1;
    int64_t m = 0;
    PyObject *size, *origin;
    tl_voxel_grid g;
    if (!PyArg_ParseTuple(args, "iKiKKLOOKKK", &device, &stream, &dtype, &pp, &pb, &n, &size,
                          &origin, &pws, &pu, &pi))
        return NULL;
    if (!tl_blk_grid(size, origin, &g)) return NULL;
    char err[TL_CUDA_ERR_BYTES];
    tl_ctx ctx = tl_cuda_ctx(device, stream, err);
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_voxelize(&ctx, (tl_dtype)dtype, tl_ptr(pp), tl_ptr(pb), n, &g, tl_ptr(pws),
                          tl_ptr(pu), tl_ptr(pi), &m, (int64_t *)&bad);
    Py_END_ALLOW_THREADS
    if (st != TL_OK && !tl_blk_point_rejected(st, bad))
        return tl_cuda_raise("voxel_quantize", "tl_cuda_voxelize", st, &ctx);
    return Py_BuildValue("(iLL)", (int)st, bad, (long long)m);
}

PyDoc_STRVAR(cuda_voxel_reduce_workspace_size_doc,
             "cuda_voxel_reduce_workspace_size(n, m) -> int\n\n"
             "Workspace bytes of cuda_voxel_reduce.");
static PyObject *py_cuda_voxel_reduce_workspace_size(PyObject *self, PyObject *args) {
    (void)self;
    long long n, m;
    size_t bytes = 0;
    if (!PyArg_ParseTuple(args, "LL", &n, &m)) return NULL;
    const tl_status st = tl_cuda_voxel_reduce_workspace_size(n, m, &bytes);
    return tl_size_result("cuda_voxel_reduce_workspace_size", st, bytes);
}

PyDoc_STRVAR(cuda_voxel_reduce_doc,
             "cuda_voxel_reduce(device, stream, dtype, reduction, feats, n, c, inverse, m, ws, "
             "out, argmax)\n\nPer-voxel mean (0), sum (1) or max (2, int64 argmax).");
static PyObject *py_cuda_voxel_reduce(PyObject *self, PyObject *args) {
    (void)self;
    int device, dtype, red;
    unsigned long long stream, pf, pinv, pws, pout, parg;
    long long n, c, m;
    if (!PyArg_ParseTuple(args, "iKiiKLLKLKKK", &device, &stream, &dtype, &red, &pf, &n, &c,
                          &pinv, &m, &pws, &pout, &parg))
        return NULL;
    char err[TL_CUDA_ERR_BYTES];
    tl_ctx ctx = tl_cuda_ctx(device, stream, err);
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_voxel_reduce(&ctx, (tl_dtype)dtype, (tl_voxel_reduction)red, tl_ptr(pf), n, c,
                              tl_ptr(pinv), m, tl_ptr(pws), tl_ptr(pout), tl_ptr(parg));
    Py_END_ALLOW_THREADS
    if (st != TL_OK) return tl_cuda_raise("voxel_reduce", "tl_cuda_voxel_reduce", st, &ctx);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cuda_devoxel_map_workspace_size_doc,
             "cuda_devoxel_map_workspace_size(m) -> int\n\nWorkspace bytes of cuda_devoxel_map.");
static PyObject *py_cuda_devoxel_map_workspace_size(PyObject *self, PyObject *args) {
    (void)self;
    long long m;
    size_t bytes = 0;
    if (!PyArg_ParseTuple(args, "L", &m)) return NULL;
    const tl_status st = tl_cuda_devoxel_map_workspace_size(m, &bytes);
    return tl_size_result("cuda_devoxel_map_workspace_size", st, bytes);
}

PyDoc_STRVAR(cuda_devoxel_map_doc,
             "cuda_devoxel_map(device, stream, dtype, pts, batch, n, size, origin, vox, m, "
             "trilinear, ws, idx, w) -> (st, bad)\n\n"
             "Rows (int64) and float64 weights of each point's voxel (1) or 8 corners.");
static PyObject *py_cuda_devoxel_map(PyObject *self, PyObject *args) {
    (void)self;
    int device, dtype, tri;
    unsigned long long stream, pp, pb, pv, pws, pi, pw;
    long long n, m, bad = -1;
    PyObject *size, *origin;
    tl_voxel_grid g;
    if (!PyArg_ParseTuple(args, "iKiKKLOOKLiKKK", &device, &stream, &dtype, &pp, &pb, &n, &size,
                          &origin, &pv, &m, &tri, &pws, &pi, &pw))
        return NULL;
    if (!tl_blk_grid(size, origin, &g)) return NULL;
    char err[TL_CUDA_ERR_BYTES];
    tl_ctx ctx = tl_cuda_ctx(device, stream, err);
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_devoxel_map(&ctx, (tl_dtype)dtype, tl_ptr(pp), tl_ptr(pb), n, &g, tl_ptr(pv), m,
                             tri, tl_ptr(pws), tl_ptr(pi), tl_ptr(pw), (int64_t *)&bad);
    Py_END_ALLOW_THREADS
    if (st != TL_OK && !tl_blk_point_rejected(st, bad))
        return tl_cuda_raise("voxel_devoxel_map", "tl_cuda_devoxel_map", st, &ctx);
    return Py_BuildValue("(iL)", (int)st, bad);
}

PyDoc_STRVAR(cuda_devoxel_gather_doc,
             "cuda_devoxel_gather(device, stream, dtype, feats, m, c, idx, w, n, k, out)\n\n"
             "out[p] = sum_j w[p, j] * feats[idx[p, j]] over idx >= 0.");
static PyObject *py_cuda_devoxel_gather(PyObject *self, PyObject *args) {
    (void)self;
    int device, dtype;
    unsigned long long stream, pf, pi, pw, pout;
    long long m, c, n, k;
    if (!PyArg_ParseTuple(args, "iKiKLLKKLLK", &device, &stream, &dtype, &pf, &m, &c, &pi, &pw,
                          &n, &k, &pout))
        return NULL;
    char err[TL_CUDA_ERR_BYTES];
    tl_ctx ctx = tl_cuda_ctx(device, stream, err);
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_devoxel_gather(&ctx, (tl_dtype)dtype, tl_ptr(pf), m, c, tl_ptr(pi), tl_ptr(pw),
                                n, k, tl_ptr(pout));
    Py_END_ALLOW_THREADS
    if (st != TL_OK) return tl_cuda_raise("voxel_gather", "tl_cuda_devoxel_gather", st, &ctx);
    Py_RETURN_NONE;
}

/* Shared layout of the pooling entry points: (device, stream, dtype, n_in,
 * n_out, k, c, a_ptr, table_ptr, flag, out_ptr, aux_ptr). */
static int tl_blk_parse_pool(PyObject *args, tl_ctx *ctx, char *err, tl_pool_desc *d,
                             unsigned long long p[4], int *flag) {
    int device, dtype;
    unsigned long long stream;
    long long n_in, n_out, k, c;
    if (!PyArg_ParseTuple(args, "iKiLLLLKKiKK", &device, &stream, &dtype, &n_in, &n_out, &k, &c,
                          &p[0], &p[1], flag, &p[2], &p[3]))
        return 0;
    tl_pool_desc desc = {(tl_dtype)dtype, n_in, n_out, k, c};
    *d = desc;
    *ctx = tl_cuda_ctx(device, stream, err);
    return 1;
}

PyDoc_STRVAR(cuda_pool_sum_doc,
             "cuda_pool_sum(device, stream, dtype, n_in, n_out, k, c, x, nbr, average, y, 0)\n\n"
             "Sum (average=0) or average pooling over the neighbour table nbr.");
static PyObject *py_cuda_pool_sum(PyObject *self, PyObject *args) {
    (void)self;
    tl_ctx ctx;
    char err[TL_CUDA_ERR_BYTES];
    tl_pool_desc d;
    unsigned long long p[4];
    int avg;
    if (!tl_blk_parse_pool(args, &ctx, err, &d, p, &avg)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_pool_sum(&ctx, &d, tl_ptr(p[0]), tl_ptr(p[1]), avg, tl_ptr(p[2]));
    Py_END_ALLOW_THREADS
    if (st != TL_OK) return tl_cuda_raise("pool_sum", "tl_cuda_pool_sum", st, &ctx);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cuda_pool_max_doc,
             "cuda_pool_max(device, stream, dtype, n_in, n_out, k, c, x, nbr, 0, y, argmax)\n\n"
             "Max pooling with int32 argmax (input row, -1 when none).");
static PyObject *py_cuda_pool_max(PyObject *self, PyObject *args) {
    (void)self;
    tl_ctx ctx;
    char err[TL_CUDA_ERR_BYTES];
    tl_pool_desc d;
    unsigned long long p[4];
    int unused;
    if (!tl_blk_parse_pool(args, &ctx, err, &d, p, &unused)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_pool_max(&ctx, &d, tl_ptr(p[0]), tl_ptr(p[1]), tl_ptr(p[2]), tl_ptr(p[3]));
    Py_END_ALLOW_THREADS
    if (st != TL_OK) return tl_cuda_raise("pool_max", "tl_cuda_pool_max", st, &ctx);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cuda_pool_max_backward_doc,
             "cuda_pool_max_backward(device, stream, dtype, n_in, n_out, k, c, dy, rev, 0, dx, "
             "argmax)\n\ndx[i, c] = sum of dy[o, c] over outputs o whose argmax[o, c] is i.");
static PyObject *py_cuda_pool_max_backward(PyObject *self, PyObject *args) {
    (void)self;
    tl_ctx ctx;
    char err[TL_CUDA_ERR_BYTES];
    tl_pool_desc d;
    unsigned long long p[4];
    int unused;
    if (!tl_blk_parse_pool(args, &ctx, err, &d, p, &unused)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_pool_max_backward(&ctx, &d, tl_ptr(p[0]), tl_ptr(p[1]), tl_ptr(p[3]),
                                   tl_ptr(p[2]));
    Py_END_ALLOW_THREADS
    if (st != TL_OK)
        return tl_cuda_raise("pool_max_backward", "tl_cuda_pool_max_backward", st, &ctx);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cuda_generative_workspace_size_doc,
             "cuda_generative_workspace_size(n_in, geom) -> int\n\n"
             "Workspace bytes of cuda_generative.");
static PyObject *py_cuda_generative_workspace_size(PyObject *self, PyObject *args) {
    (void)self;
    long long n_in;
    PyObject *geom;
    tl_geom g;
    size_t bytes = 0;
    if (!PyArg_ParseTuple(args, "LO", &n_in, &geom)) return NULL;
    if (!tl_parse_geom("generative", geom, &g)) return NULL;
    tl_status st = tl_cuda_generative_workspace_size(n_in, &g, &bytes);
    if (st != TL_OK) return tl_raise("generative", st);
    return PyLong_FromSize_t(bytes);
}

PyDoc_STRVAR(cuda_generative_doc,
             "cuda_generative(device, stream, in_ptr, n_in, geom, ws, out_ptr, capacity) -> int\n\n"
             "Writes unique{in * stride + r} sorted; returns its row count.");
static PyObject *py_cuda_generative(PyObject *self, PyObject *args) {
    (void)self;
    int device;
    unsigned long long stream, pin, pws, pout;
    long long n_in, cap;
    int64_t n_out = 0;
    PyObject *geom;
    tl_geom g;
    if (!PyArg_ParseTuple(args, "iKKLOKKL", &device, &stream, &pin, &n_in, &geom, &pws, &pout,
                          &cap))
        return NULL;
    if (!tl_parse_geom("generative", geom, &g)) return NULL;
    char err[TL_CUDA_ERR_BYTES];
    tl_ctx ctx = tl_cuda_ctx(device, stream, err);
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_generative_support(&ctx, tl_ptr(pin), n_in, &g, tl_ptr(pws), tl_ptr(pout), cap,
                                    &n_out);
    Py_END_ALLOW_THREADS
    if (st == TL_ERR_CUDA)
        return tl_cuda_raise("generative", "tl_cuda_generative_support", st, &ctx);
    if (st != TL_OK) return tl_raise_generative(st);
    return PyLong_FromLongLong((long long)n_out);
}

#define TL_BLK_METHOD(name) {#name, py_##name, METH_VARARGS, name##_doc}

#endif /* TL_WITH_CUDA */

PyMethodDef tl_py_cuda_blocks_methods[] = {
#ifdef TL_WITH_CUDA
    TL_BLK_METHOD(cuda_voxelize_workspace_size),
    TL_BLK_METHOD(cuda_voxelize),
    TL_BLK_METHOD(cuda_voxel_reduce_workspace_size),
    TL_BLK_METHOD(cuda_voxel_reduce),
    TL_BLK_METHOD(cuda_devoxel_map_workspace_size),
    TL_BLK_METHOD(cuda_devoxel_map),
    TL_BLK_METHOD(cuda_devoxel_gather),
    TL_BLK_METHOD(cuda_pool_sum),
    TL_BLK_METHOD(cuda_pool_max),
    TL_BLK_METHOD(cuda_pool_max_backward),
    TL_BLK_METHOD(cuda_generative_workspace_size),
    TL_BLK_METHOD(cuda_generative),
#endif
    {NULL, NULL, 0, NULL},
};
