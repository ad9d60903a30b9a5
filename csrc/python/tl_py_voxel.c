/* Binding of the voxel family, CPU and CUDA: voxelize, voxel reduction,
 * devoxel map and gather (core/tl_voxel.h, cuda/tl_cuda_voxel.h).
 *
 * Point-wise entry points (quantize, voxelize, devoxel map) return
 * (status, bad_point, ...) for rejected points instead of raising, so the
 * Python layer can name the offending point and argument; every other
 * failure raises, on either device under the CPU function's name (CUDA
 * runtime failures also name the C entry point).  A CUDA entry point gets its
 * workspace from an alloc(nbytes) -> int callable (tl_py_workspace). */
#include "tl_py.h"

#include "core/tl_voxel.h"

#ifdef TL_WITH_CUDA
#include "cuda/tl_cuda_voxel.h"
#endif

/* The size rule behind TL_ERR_OVERFLOW of the voxel reductions. */
#define TL_VOXEL_SIZES "points, voxels and columns times channels must fit int64"

/* The rules behind TL_ERR_INVALID of the reduction and the gather: the index entries
 * (core/tl_voxel.c checks every one before reading), then the sizes and pointers. */
#define TL_VOXEL_REDUCE_RULE                                                                \
    "every inverse entry must be a voxel row in [0, num_voxels); sizes must be >= 0, the "  \
    "reduction known and pointers valid"
#define TL_VOXEL_GATHER_RULE                                                                \
    "every idx entry must be -1 (no voxel) or a voxel row in [0, M), M = feats' rows; "    \
    "sizes must be >= 0 (k >= 1) and pointers valid"

static int tl_parse_grid(PyObject *size, PyObject *origin, tl_voxel_grid *g) {
    return PyArg_ParseTuple(size, "ddd", &g->size[0], &g->size[1], &g->size[2]) &&
           PyArg_ParseTuple(origin, "ddd", &g->origin[0], &g->origin[1], &g->origin[2]);
}

/* A rejected point is a result, not an exception. */
static int tl_point_rejected(tl_status st, long long bad) {
    return (st == TL_ERR_INVALID || st == TL_ERR_OVERFLOW) && bad >= 0;
}

/* (0, -1) on success, (status, first bad point) for rejected points; raises otherwise. */
static PyObject *tl_point_result(const tl_py_call *c, tl_status st, long long bad,
                                 const char *fn, const char *entry) {
    if (st != TL_OK && !tl_point_rejected(st, bad)) return tl_py_fail(c, st, fn, entry, NULL, NULL);
    return Py_BuildValue("(iL)", (int)st, bad);
}

PyDoc_STRVAR(voxel_quantize_doc,
             "voxel_quantize(dtype, pts, batch, n, size, origin, rows, threads) -> (st, bad)\n\n"
             "rows[p] = (batch[p], floor((pts[p] - origin) / size)); batch 0 means all 0.");
static PyObject *py_voxel_quantize(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    int dtype;
    unsigned long long pp, pb, pr;
    long long n, bad = -1;
    PyObject *size, *origin;
    tl_voxel_grid g;
    if (!tl_py_parse(args, 0, &c, "iKKLOOK", &dtype, &pp, &pb, &n, &size, &origin, &pr))
        return NULL;
    if (!tl_parse_grid(size, origin, &g)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st = tl_voxel_quantize(&c.ctx, (tl_dtype)dtype, tl_ptr(pp), tl_ptr(pb),
                                                  n, &g, tl_ptr(pr), (int64_t *)&bad);
    Py_END_ALLOW_THREADS return tl_point_result(&c, st, bad, "voxel_quantize", "tl_voxel_quantize");
}

PyDoc_STRVAR(voxel_unique_doc,
             "voxel_unique(rows, n, uniq, inverse, threads) -> int\n\n"
             "Sorted unique rows into uniq (capacity n) and int64 inverse; returns the count.");
static PyObject *py_voxel_unique(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    unsigned long long pr, pu, pi;
    long long n, m = 0;
    if (!tl_py_parse(args, 0, &c, "KLKK", &pr, &n, &pu, &pi)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st =
        tl_voxel_unique(&c.ctx, tl_ptr(pr), n, tl_ptr(pu), (int64_t *)&m, tl_ptr(pi));
    Py_END_ALLOW_THREADS if (st != TL_OK) return tl_raise("voxel_unique", st);
    return PyLong_FromLongLong(m);
}

PyDoc_STRVAR(voxel_reduce_doc,
             "voxel_reduce(dtype, reduction, feats, n, c, inverse, m, out, argmax, threads)\n\n"
             "Per-voxel mean (0), sum (1) or max (2, with int64 argmax) of point features.");
static PyObject *py_voxel_reduce(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    int dtype, red;
    unsigned long long pf, pinv, pout, parg;
    long long n, ch, m;
    if (!tl_py_parse(args, 0, &c, "iiKLLKLKK", &dtype, &red, &pf, &n, &ch, &pinv, &m, &pout,
                     &parg))
        return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st = tl_voxel_reduce(&c.ctx, (tl_dtype)dtype, (tl_voxel_reduction)red,
                                                tl_ptr(pf), n, ch, tl_ptr(pinv), m, tl_ptr(pout),
                                                tl_ptr(parg));
    Py_END_ALLOW_THREADS if (st != TL_OK) return tl_py_fail(&c, st, "voxel_reduce",
                                                            "tl_voxel_reduce",
                                                            TL_VOXEL_REDUCE_RULE,
                                                            TL_VOXEL_SIZES);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(voxel_devoxel_map_doc,
             "voxel_devoxel_map(dtype, pts, batch, n, size, origin, vox, m, trilinear, idx, w,"
             " threads) -> (st, bad)\n\n"
             "Rows (int64) and float64 weights of each point's voxel (1) or 8 corners.");
static PyObject *py_voxel_devoxel_map(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    int dtype, tri;
    unsigned long long pp, pb, pv, pi, pw;
    long long n, m, bad = -1;
    PyObject *size, *origin;
    tl_voxel_grid g;
    if (!tl_py_parse(args, 0, &c, "iKKLOOKLiKK", &dtype, &pp, &pb, &n, &size, &origin, &pv, &m,
                     &tri, &pi, &pw))
        return NULL;
    if (!tl_parse_grid(size, origin, &g)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st = tl_voxel_devoxel_map(&c.ctx, (tl_dtype)dtype, tl_ptr(pp),
                                                     tl_ptr(pb), n, &g, tl_ptr(pv), m, tri,
                                                     tl_ptr(pi), tl_ptr(pw), (int64_t *)&bad);
    Py_END_ALLOW_THREADS return tl_point_result(&c, st, bad, "voxel_devoxel_map",
                                                "tl_voxel_devoxel_map");
}

typedef tl_status (*tl_gather_fn)(const tl_ctx *, tl_dtype, const void *, int64_t, int64_t,
                                  const int64_t *, const double *, int64_t, int64_t, void *);

/* voxel_gather and cuda_devoxel_gather: (dtype, feats, m, c, idx, w, n, k, out), threads
 * last on the CPU, (device, stream) first on CUDA. */
static PyObject *tl_gather_call(int cuda, PyObject *args) {
    tl_py_call c;
    int dtype;
    unsigned long long pf, pi, pw, pout;
    long long m, ch, n, k;
    if (!tl_py_parse(args, cuda, &c, "iKLLKKLLK", &dtype, &pf, &m, &ch, &pi, &pw, &n, &k, &pout))
        return NULL;
    tl_gather_fn fn = tl_voxel_gather;
#ifdef TL_WITH_CUDA
    if (cuda) fn = tl_cuda_devoxel_gather;
#endif
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st = fn(&c.ctx, (tl_dtype)dtype, tl_ptr(pf), m, ch, tl_ptr(pi),
                                   tl_ptr(pw), n, k, tl_ptr(pout));
    Py_END_ALLOW_THREADS if (st != TL_OK) return tl_py_fail(&c, st, "voxel_gather",
                                                            "tl_cuda_devoxel_gather",
                                                            TL_VOXEL_GATHER_RULE,
                                                            TL_VOXEL_SIZES);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(voxel_gather_doc,
             "voxel_gather(dtype, feats, m, c, idx, w, n, k, out, threads)\n\n"
             "out[p] = sum_j w[p, j] * feats[idx[p, j]] over idx >= 0.");
TL_PY_FORWARD(voxel_gather, tl_gather_call(0, args))

#ifdef TL_WITH_CUDA

PyDoc_STRVAR(cuda_voxelize_doc,
             "cuda_voxelize(device, stream, dtype, pts, batch, n, size, origin, alloc, uniq, "
             "inverse) -> (st, bad, m)\n\n"
             "Sorted unique voxel rows into uniq (capacity n), int64 inverse, count m; "
             "st != 0 names the first rejected point bad.");
static PyObject *py_cuda_voxelize(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    int dtype;
    unsigned long long pp, pb, pu, pi;
    long long n, bad = -1;
    int64_t m = 0;
    PyObject *size, *origin, *alloc;
    tl_voxel_grid g;
    size_t bytes = 0;
    void *ws;
    if (!tl_py_parse(args, 1, &c, "iKKLOOOKK", &dtype, &pp, &pb, &n, &size, &origin, &alloc, &pu,
                     &pi))
        return NULL;
    if (!tl_parse_grid(size, origin, &g)) return NULL;
    tl_status st = tl_cuda_voxelize_workspace_size(n, &bytes);
    if (!tl_py_workspace(&c, "voxel_quantize", st, bytes, alloc, &ws)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_voxelize(&c.ctx, (tl_dtype)dtype, tl_ptr(pp), tl_ptr(pb), n, &g, ws, tl_ptr(pu),
                          tl_ptr(pi), &m, (int64_t *)&bad);
    Py_END_ALLOW_THREADS
    if (st != TL_OK && !tl_point_rejected(st, bad))
        return tl_py_fail(&c, st, "voxel_quantize", "tl_cuda_voxelize", NULL, NULL);
    return Py_BuildValue("(iLL)", (int)st, bad, (long long)m);
}

PyDoc_STRVAR(cuda_voxel_reduce_doc,
             "cuda_voxel_reduce(device, stream, dtype, reduction, feats, n, c, inverse, m, "
             "alloc, out, argmax)\n\nPer-voxel mean (0), sum (1) or max (2, int64 argmax).");
static PyObject *py_cuda_voxel_reduce(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    int dtype, red;
    unsigned long long pf, pinv, pout, parg;
    long long n, ch, m;
    PyObject *alloc;
    size_t bytes = 0;
    void *ws;
    if (!tl_py_parse(args, 1, &c, "iiKLLKLOKK", &dtype, &red, &pf, &n, &ch, &pinv, &m, &alloc,
                     &pout, &parg))
        return NULL;
    tl_status st = tl_cuda_voxel_reduce_workspace_size(n, m, &bytes);
    if (!tl_py_workspace(&c, "voxel_reduce", st, bytes, alloc, &ws)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_voxel_reduce(&c.ctx, (tl_dtype)dtype, (tl_voxel_reduction)red, tl_ptr(pf), n, ch,
                              tl_ptr(pinv), m, ws, tl_ptr(pout), tl_ptr(parg));
    Py_END_ALLOW_THREADS
    if (st != TL_OK)
        return tl_py_fail(&c, st, "voxel_reduce", "tl_cuda_voxel_reduce", TL_VOXEL_REDUCE_RULE,
                          TL_VOXEL_SIZES);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cuda_devoxel_map_doc,
             "cuda_devoxel_map(device, stream, dtype, pts, batch, n, size, origin, vox, m, "
             "trilinear, alloc, idx, w) -> (st, bad)\n\n"
             "Rows (int64) and float64 weights of each point's voxel (1) or 8 corners.");
static PyObject *py_cuda_devoxel_map(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    int dtype, tri;
    unsigned long long pp, pb, pv, pi, pw;
    long long n, m, bad = -1;
    PyObject *size, *origin, *alloc;
    tl_voxel_grid g;
    size_t bytes = 0;
    void *ws;
    if (!tl_py_parse(args, 1, &c, "iKKLOOKLiOKK", &dtype, &pp, &pb, &n, &size, &origin, &pv, &m,
                     &tri, &alloc, &pi, &pw))
        return NULL;
    if (!tl_parse_grid(size, origin, &g)) return NULL;
    tl_status st = tl_cuda_devoxel_map_workspace_size(m, &bytes);
    if (!tl_py_workspace(&c, "voxel_devoxel_map", st, bytes, alloc, &ws)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_devoxel_map(&c.ctx, (tl_dtype)dtype, tl_ptr(pp), tl_ptr(pb), n, &g, tl_ptr(pv),
                             m, tri, ws, tl_ptr(pi), tl_ptr(pw), (int64_t *)&bad);
    Py_END_ALLOW_THREADS
    return tl_point_result(&c, st, bad, "voxel_devoxel_map", "tl_cuda_devoxel_map");
}

PyDoc_STRVAR(cuda_devoxel_gather_doc,
             "cuda_devoxel_gather(device, stream, dtype, feats, m, c, idx, w, n, k, out)\n\n"
             "out[p] = sum_j w[p, j] * feats[idx[p, j]] over idx >= 0.");
TL_PY_FORWARD(cuda_devoxel_gather, tl_gather_call(1, args))

#endif /* TL_WITH_CUDA */

PyMethodDef tl_py_voxel_methods[] = {
    TL_PY_METHOD(voxel_quantize),
    TL_PY_METHOD(voxel_unique),
    TL_PY_METHOD(voxel_reduce),
    TL_PY_METHOD(voxel_devoxel_map),
    TL_PY_METHOD(voxel_gather),
#ifdef TL_WITH_CUDA
    TL_PY_METHOD(cuda_voxelize),
    TL_PY_METHOD(cuda_voxel_reduce),
    TL_PY_METHOD(cuda_devoxel_map),
    TL_PY_METHOD(cuda_devoxel_gather),
#endif
    {NULL, NULL, 0, NULL},
};
