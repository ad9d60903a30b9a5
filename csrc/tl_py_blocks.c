/* Binding of the building blocks: voxelize, devoxelize, pooling.
 *
 * Point-wise entry points (quantize, devoxel_map) return (status, bad_point)
 * for rejected points instead of raising, so the Python layer can name the
 * offending point and argument; every other failure raises via tl_raise. */
#include "tl_py.h"

#include "tl_pool.h"
#include "tl_voxel.h"

/* The size rules behind TL_ERR_OVERFLOW of pooling and voxel reductions. */
#define TL_POOL_SIZES                                                                       \
    "n_in, n_out and k must be <= 2^31 - 1 (int32 rows) and rows x channels must fit int64"
#define TL_VOXEL_SIZES "points, voxels and columns times channels must fit int64"

static int tl_parse_grid(PyObject *size, PyObject *origin, tl_voxel_grid *g) {
    return PyArg_ParseTuple(size, "ddd", &g->size[0], &g->size[1], &g->size[2]) &&
           PyArg_ParseTuple(origin, "ddd", &g->origin[0], &g->origin[1], &g->origin[2]);
}

/* (0, -1) on success, (status, first bad point) for rejected points. */
static PyObject *tl_point_result(const char *fn, tl_status st, long long bad) {
    if (st == TL_OK || ((st == TL_ERR_INVALID || st == TL_ERR_OVERFLOW) && bad >= 0))
        return Py_BuildValue("(iL)", (int)st, bad);
    return tl_raise(fn, st);
}

PyDoc_STRVAR(voxel_quantize_doc,
             "voxel_quantize(dtype, pts, batch, n, size, origin, rows, threads) -> (st, bad)\n\n"
             "rows[p] = (batch[p], floor((pts[p] - origin) / size)); batch 0 means all 0.");
static PyObject *py_voxel_quantize(PyObject *self, PyObject *args) {
    (void)self;
    int dtype, threads;
    unsigned long long pp, pb, pr;
    long long n, bad = -1;
    PyObject *size, *origin;
    tl_voxel_grid g;
    if (!PyArg_ParseTuple(args, "iKKLOOKi", &dtype, &pp, &pb, &n, &size, &origin, &pr, &threads))
        return NULL;
    if (!tl_parse_grid(size, origin, &g)) return NULL;
    tl_ctx ctx;
    if (tl_cpu_ctx(threads, &ctx)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st = tl_voxel_quantize(&ctx, (tl_dtype)dtype, tl_ptr(pp), tl_ptr(pb),
                                                  n, &g, tl_ptr(pr), (int64_t *)&bad);
    Py_END_ALLOW_THREADS return tl_point_result("voxel_quantize", st, bad);
}

PyDoc_STRVAR(voxel_unique_doc,
             "voxel_unique(rows, n, uniq, inverse, threads) -> int\n\n"
             "Sorted unique rows into uniq (capacity n) and int64 inverse; returns the count.");
static PyObject *py_voxel_unique(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long pr, pu, pi;
    long long n, m = 0;
    int threads;
    if (!PyArg_ParseTuple(args, "KLKKi", &pr, &n, &pu, &pi, &threads)) return NULL;
    tl_ctx ctx;
    if (tl_cpu_ctx(threads, &ctx)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st =
        tl_voxel_unique(&ctx, tl_ptr(pr), n, tl_ptr(pu), (int64_t *)&m, tl_ptr(pi));
    Py_END_ALLOW_THREADS if (st != TL_OK) return tl_raise("voxel_unique", st);
    return PyLong_FromLongLong(m);
}

PyDoc_STRVAR(voxel_reduce_doc,
             "voxel_reduce(dtype, reduction, feats, n, c, inverse, m, out, argmax, threads)\n\n"
             "Per-voxel mean (0), sum (1) or max (2, with int64 argmax) of point features.");
static PyObject *py_voxel_reduce(PyObject *self, PyObject *args) {
    (void)self;
    int dtype, red, threads;
    unsigned long long pf, pinv, pout, parg;
    long long n, c, m;
    if (!PyArg_ParseTuple(args, "iiKLLKLKKi", &dtype, &red, &pf, &n, &c, &pinv, &m, &pout,
                          &parg, &threads))
        return NULL;
    tl_ctx ctx;
    if (tl_cpu_ctx(threads, &ctx)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st = tl_voxel_reduce(&ctx, (tl_dtype)dtype, (tl_voxel_reduction)red,
                                                tl_ptr(pf), n, c, tl_ptr(pinv), m, tl_ptr(pout),
                                                tl_ptr(parg));
    Py_END_ALLOW_THREADS if (st == TL_ERR_OVERFLOW) return tl_raise_rule("voxel_reduce", st, TL_VOXEL_SIZES);
    if (st != TL_OK) return tl_raise("voxel_reduce", st);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(voxel_devoxel_map_doc,
             "voxel_devoxel_map(dtype, pts, batch, n, size, origin, vox, m, trilinear, idx, w,"
             " threads) -> (st, bad)\n\n"
             "Rows (int64) and float64 weights of each point's voxel (1) or 8 corners.");
static PyObject *py_voxel_devoxel_map(PyObject *self, PyObject *args) {
    (void)self;
    int dtype, tri, threads;
    unsigned long long pp, pb, pv, pi, pw;
    long long n, m, bad = -1;
    PyObject *size, *origin;
    tl_voxel_grid g;
    if (!PyArg_ParseTuple(args, "iKKLOOKLiKKi", &dtype, &pp, &pb, &n, &size, &origin, &pv, &m,
                          &tri, &pi, &pw, &threads))
        return NULL;
    if (!tl_parse_grid(size, origin, &g)) return NULL;
    tl_ctx ctx;
    if (tl_cpu_ctx(threads, &ctx)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st = tl_voxel_devoxel_map(&ctx, (tl_dtype)dtype, tl_ptr(pp), tl_ptr(pb),
                                                     n, &g, tl_ptr(pv), m, tri, tl_ptr(pi),
                                                     tl_ptr(pw), (int64_t *)&bad);
    Py_END_ALLOW_THREADS return tl_point_result("voxel_devoxel_map", st, bad);
}

PyDoc_STRVAR(voxel_gather_doc,
             "voxel_gather(dtype, feats, m, c, idx, w, n, k, out, threads)\n\n"
             "out[p] = sum_j w[p, j] * feats[idx[p, j]] over idx >= 0.");
static PyObject *py_voxel_gather(PyObject *self, PyObject *args) {
    (void)self;
    int dtype, threads;
    unsigned long long pf, pi, pw, pout;
    long long m, c, n, k;
    if (!PyArg_ParseTuple(args, "iKLLKKLLKi", &dtype, &pf, &m, &c, &pi, &pw, &n, &k, &pout,
                          &threads))
        return NULL;
    tl_ctx ctx;
    if (tl_cpu_ctx(threads, &ctx)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st = tl_voxel_gather(&ctx, (tl_dtype)dtype, tl_ptr(pf), m, c,
                                                tl_ptr(pi), tl_ptr(pw), n, k, tl_ptr(pout));
    Py_END_ALLOW_THREADS if (st == TL_ERR_OVERFLOW) return tl_raise_rule("voxel_gather", st, TL_VOXEL_SIZES);
    if (st != TL_OK) return tl_raise("voxel_gather", st);
    Py_RETURN_NONE;
}

/* Shared layout of the pooling entry points:
 * (dtype, n_in, n_out, k, c, a_ptr, table_ptr, flag, out_ptr, aux_ptr, threads). */
static int tl_parse_pool(PyObject *args, tl_pool_desc *d, unsigned long long p[4], int *flag,
                         int *threads) {
    int dtype;
    long long n_in, n_out, k, c;
    if (!PyArg_ParseTuple(args, "iLLLLKKiKKi", &dtype, &n_in, &n_out, &k, &c, &p[0], &p[1], flag,
                          &p[2], &p[3], threads))
        return 0;
    tl_pool_desc desc = {(tl_dtype)dtype, n_in, n_out, k, c};
    *d = desc;
    return 1;
}

PyDoc_STRVAR(pool_sum_doc,
             "pool_sum(dtype, n_in, n_out, k, c, x, nbr, average, y, 0, threads)\n\n"
             "Sum (average=0) or average pooling over the neighbour table nbr.");
static PyObject *py_pool_sum(PyObject *self, PyObject *args) {
    (void)self;
    tl_pool_desc d;
    unsigned long long p[4];
    int avg, threads;
    if (!tl_parse_pool(args, &d, p, &avg, &threads)) return NULL;
    tl_ctx ctx;
    if (tl_cpu_ctx(threads, &ctx)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st = tl_pool_sum(&ctx, &d, tl_ptr(p[0]), tl_ptr(p[1]), avg, tl_ptr(p[2]));
    Py_END_ALLOW_THREADS if (st == TL_ERR_OVERFLOW) return tl_raise_rule("pool_sum", st, TL_POOL_SIZES);
    if (st != TL_OK) return tl_raise("pool_sum", st);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(pool_max_doc,
             "pool_max(dtype, n_in, n_out, k, c, x, nbr, 0, y, argmax, threads)\n\n"
             "Max pooling with int32 argmax (input row, -1 when none).");
static PyObject *py_pool_max(PyObject *self, PyObject *args) {
    (void)self;
    tl_pool_desc d;
    unsigned long long p[4];
    int unused, threads;
    if (!tl_parse_pool(args, &d, p, &unused, &threads)) return NULL;
    tl_ctx ctx;
    if (tl_cpu_ctx(threads, &ctx)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st =
        tl_pool_max(&ctx, &d, tl_ptr(p[0]), tl_ptr(p[1]), tl_ptr(p[2]), tl_ptr(p[3]));
    Py_END_ALLOW_THREADS if (st == TL_ERR_OVERFLOW) return tl_raise_rule("pool_max", st, TL_POOL_SIZES);
    if (st != TL_OK) return tl_raise("pool_max", st);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(pool_max_backward_doc,
             "pool_max_backward(dtype, n_in, n_out, k, c, dy, rev, 0, dx, argmax, threads)\n\n"
             "dx[i, c] = sum of dy[o, c] over outputs o whose argmax[o, c] is i.");
static PyObject *py_pool_max_backward(PyObject *self, PyObject *args) {
    (void)self;
    tl_pool_desc d;
    unsigned long long p[4];
    int unused, threads;
    if (!tl_parse_pool(args, &d, p, &unused, &threads)) return NULL;
    tl_ctx ctx;
    if (tl_cpu_ctx(threads, &ctx)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st =
        tl_pool_max_backward(&ctx, &d, tl_ptr(p[0]), tl_ptr(p[1]), tl_ptr(p[3]), tl_ptr(p[2]));
    Py_END_ALLOW_THREADS if (st == TL_ERR_OVERFLOW) return tl_raise_rule("pool_max_backward", st, TL_POOL_SIZES);
    if (st != TL_OK) return tl_raise("pool_max_backward", st);
    Py_RETURN_NONE;
}

PyMethodDef tl_py_blocks_methods[] = {
    {"voxel_quantize", py_voxel_quantize, METH_VARARGS, voxel_quantize_doc},
    {"voxel_unique", py_voxel_unique, METH_VARARGS, voxel_unique_doc},
    {"voxel_reduce", py_voxel_reduce, METH_VARARGS, voxel_reduce_doc},
    {"voxel_devoxel_map", py_voxel_devoxel_map, METH_VARARGS, voxel_devoxel_map_doc},
    {"voxel_gather", py_voxel_gather, METH_VARARGS, voxel_gather_doc},
    {"pool_sum", py_pool_sum, METH_VARARGS, pool_sum_doc},
    {"pool_max", py_pool_max, METH_VARARGS, pool_max_doc},
    {"pool_max_backward", py_pool_max_backward, METH_VARARGS, pool_max_backward_doc},
    {NULL, NULL, 0, NULL},
};
