/* Binding of the convolution family, CPU and CUDA: forward and weight
 * gradient of every dataflow (core/tl_dataflow_implicit_gemm.h,
 * tl_dataflow_pairs.h; cuda/tl_cuda.h), and the row gather / scatter-add the
 * CUDA gather-scatter dataflow runs between torch's GEMMs. */
#include "tl_py.h"

#include "core/tl_dataflow_implicit_gemm.h"
#include "core/tl_dataflow_pairs.h"

#ifdef TL_WITH_CUDA
#include "cuda/tl_cuda.h"
#endif

/* The rules of tl_conv_desc_check, for TL_ERR_INVALID and TL_ERR_OVERFLOW. */
#define TL_CONV_INVALID                                                                     \
    "every nbr entry must be -1 or lie in [0, rows of the gathered side); dtype, sizes "    \
    "(>= 0) and pointers must be valid"
#define TL_CONV_SIZES                                                                       \
    "n_in, n_out and k must be <= 2^31 - 1 (int32 rows) and rows x channels and "          \
    "k x c_in x c_out must fit int64"

/* The sizes every convolution entry point takes, in this order. */
#define TL_CONV_DESC_FMT "iLLLLL"

typedef tl_status (*tl_conv_fn)(const tl_ctx *, const tl_conv_desc *, const void *,
                                const void *, const int32_t *, void *);

/* conv_forward / conv_weight_grad: (dtype, n_in, n_out, k, c_in, c_out, a, b, nbr, out,
 * threads). */
static PyObject *tl_conv_call(const char *name, tl_conv_fn fn, PyObject *args) {
    tl_py_call c;
    int dtype;
    long long n_in, n_out, k, cin, cout;
    unsigned long long pa, pb, pnbr, pout;
    if (!tl_py_parse(args, 0, &c, TL_CONV_DESC_FMT "KKKK", &dtype, &n_in, &n_out, &k, &cin,
                     &cout, &pa, &pb, &pnbr, &pout))
        return NULL;
    tl_conv_desc d = {(tl_dtype)dtype, n_in, n_out, k, cin, cout};
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st = fn(&c.ctx, &d, tl_ptr(pa), tl_ptr(pb), tl_ptr(pnbr), tl_ptr(pout));
    Py_END_ALLOW_THREADS if (st != TL_OK) return tl_py_fail(&c, st, name, name, TL_CONV_INVALID,
                                                            TL_CONV_SIZES);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(conv_forward_doc,
             "conv_forward(dtype, n_in, n_out, k, c_in, c_out, x, w, nbr, y, threads)\n\n"
             "y = sum_n x[nbr[:, n]] @ w[n] (implicit-GEMM dataflow, CPU).");
TL_PY_FORWARD(conv_forward, tl_conv_call("conv_forward", tl_implicit_gemm_forward, args))

PyDoc_STRVAR(conv_weight_grad_doc,
             "conv_weight_grad(dtype, n_in, n_out, k, c_in, c_out, x, dy, nbr, dw, threads)\n\n"
             "dw[n] = x[nbr[:, n]]^T dy (implicit-GEMM dataflow, CPU).");
TL_PY_FORWARD(conv_weight_grad,
              tl_conv_call("conv_weight_grad", tl_implicit_gemm_weight_grad, args))

typedef int64_t (*tl_list_rows_fn)(const tl_ctx *, const tl_conv_desc *);

/* conv_list_rows / conv_weight_grad_list_rows: (dtype, n_in, n_out, k, c_in, c_out,
 * threads) -> the rows per tile of the tile lists the listed call runs over. */
static PyObject *tl_list_rows_call(tl_list_rows_fn fn, PyObject *args) {
    tl_py_call c;
    int dtype;
    long long n_in, n_out, k, cin, cout;
    if (!tl_py_parse(args, 0, &c, TL_CONV_DESC_FMT, &dtype, &n_in, &n_out, &k, &cin, &cout))
        return NULL;
    tl_conv_desc d = {(tl_dtype)dtype, n_in, n_out, k, cin, cout};
    return PyLong_FromLongLong(fn(&c.ctx, &d));
}

typedef tl_status (*tl_conv_listed_fn)(const tl_ctx *, const tl_conv_desc *, const void *,
                                       const void *, const int32_t *, const tl_tile_lists *,
                                       void *);

/* The rules of the listed calls, for TL_ERR_INVALID. */
#define TL_CONV_LISTED_INVALID                                                              \
    "the tile lists must be built for this call's tile rows (conv_list_rows, "              \
    "conv_weight_grad_list_rows) and name only rows in [0, n_in); dtype, sizes (>= 0), "     \
    "nbr and pointers must be valid"

/* conv_forward_listed / conv_weight_grad_listed: (dtype, n_in, n_out, k, c_in, c_out, a,
 * b, nbr, tile_rows, top, start, in, rows, out, threads). */
static PyObject *tl_conv_listed_call(const char *name, const char *entry, tl_conv_listed_fn fn,
                                     PyObject *args) {
    tl_py_call c;
    int dtype;
    long long n_in, n_out, k, cin, cout, tile_rows, top;
    unsigned long long pa, pb, pnbr, pstart, pin, prows, pout;
    if (!tl_py_parse(args, 0, &c, TL_CONV_DESC_FMT "KKKLLKKKK", &dtype, &n_in, &n_out, &k, &cin,
                     &cout, &pa, &pb, &pnbr, &tile_rows, &top, &pstart, &pin, &prows, &pout))
        return NULL;
    tl_conv_desc d = {(tl_dtype)dtype, n_in, n_out, k, cin, cout};
    tl_tile_lists lists = {tile_rows, top, tl_ptr(pstart), tl_ptr(pin), tl_ptr(prows)};
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st =
        fn(&c.ctx, &d, tl_ptr(pa), tl_ptr(pb), tl_ptr(pnbr), &lists, tl_ptr(pout));
    Py_END_ALLOW_THREADS if (st != TL_OK) return tl_py_fail(&c, st, name, entry,
                                                            TL_CONV_LISTED_INVALID,
                                                            TL_CONV_SIZES);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(conv_list_rows_doc,
             "conv_list_rows(dtype, n_in, n_out, k, c_in, c_out, threads) -> int\n\n"
             "Rows per tile of tile lists conv_forward_listed runs over for this call "
             "(0: none; tl_implicit_gemm_list_rows).");
TL_PY_FORWARD(conv_list_rows, tl_list_rows_call(tl_implicit_gemm_list_rows, args))

PyDoc_STRVAR(conv_forward_listed_doc,
             "conv_forward_listed(dtype, n_in, n_out, k, c_in, c_out, x, w, nbr, tile_rows, "
             "top, start, in, rows, y, threads)\n\nconv_forward over the table's tile lists "
             "(tile_lists_count, tile_lists_fill).");
TL_PY_FORWARD(conv_forward_listed,
              tl_conv_listed_call("conv_forward_listed", "tl_implicit_gemm_forward_listed",
                                  tl_implicit_gemm_forward_listed, args))

PyDoc_STRVAR(conv_weight_grad_list_rows_doc,
             "conv_weight_grad_list_rows(dtype, n_in, n_out, k, c_in, c_out, threads) -> int\n\n"
             "Rows per block of conv_weight_grad_listed: it runs over tile lists whose tile "
             "rows divide this (0: none).");
TL_PY_FORWARD(conv_weight_grad_list_rows,
              tl_list_rows_call(tl_implicit_gemm_weight_grad_list_rows, args))

PyDoc_STRVAR(conv_weight_grad_listed_doc,
             "conv_weight_grad_listed(dtype, n_in, n_out, k, c_in, c_out, x, dy, nbr, "
             "tile_rows, top, start, in, rows, dw, threads)\n\nconv_weight_grad over nbr's "
             "tile lists where each of its blocks is whole tiles, else over nbr.");
TL_PY_FORWARD(conv_weight_grad_listed,
              tl_conv_listed_call("conv_weight_grad_listed",
                                  "tl_implicit_gemm_weight_grad_listed",
                                  tl_implicit_gemm_weight_grad_listed, args))

typedef tl_status (*tl_pairs_fn)(const tl_ctx *, tl_pairs_mode, const tl_conv_desc *,
                                 const void *, const void *, const tl_pairs *, void *);

/* (mode, dtype, n_in, n_out, k, c_in, c_out, a, b, offsets, in, out, result, threads) */
static PyObject *tl_pairs_call(const char *name, tl_pairs_fn fn, PyObject *args) {
    tl_py_call c;
    int mode, dtype;
    long long n_in, n_out, k, cin, cout;
    unsigned long long pa, pb, poff, pin, pout, pres;
    if (!tl_py_parse(args, 0, &c, "i" TL_CONV_DESC_FMT "KKKKKK", &mode, &dtype, &n_in, &n_out,
                     &k, &cin, &cout, &pa, &pb, &poff, &pin, &pout, &pres))
        return NULL;
    tl_conv_desc d = {(tl_dtype)dtype, n_in, n_out, k, cin, cout};
    tl_pairs p = {k, tl_ptr(poff), tl_ptr(pin), tl_ptr(pout)};
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st =
        fn(&c.ctx, (tl_pairs_mode)mode, &d, tl_ptr(pa), tl_ptr(pb), &p, tl_ptr(pres));
    Py_END_ALLOW_THREADS if (st != TL_OK) return tl_py_fail(&c, st, name, name, NULL,
                                                            TL_CONV_SIZES);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(pairs_forward_doc,
             "pairs_forward(mode, dtype, n_in, n_out, k, c_in, c_out, x, w, offsets, in, out,"
             " y, threads)\n\nmode 0: fetch-on-demand, 1: gather-scatter.");
TL_PY_FORWARD(pairs_forward, tl_pairs_call("pairs_forward", tl_pairs_forward, args))

PyDoc_STRVAR(pairs_weight_grad_doc,
             "pairs_weight_grad(mode, dtype, n_in, n_out, k, c_in, c_out, x, dy, offsets, in,"
             " out, dw, threads)\n\nWeight gradient over pair lists.");
TL_PY_FORWARD(pairs_weight_grad,
              tl_pairs_call("pairs_weight_grad", tl_pairs_weight_grad, args))

#ifdef TL_WITH_CUDA

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
                                   int opts, const void *a, const void *b, const int32_t *nbr,
                                   const tl_cuda_pairs *p, const void *der, void *ws, void *out) {
    switch (df) {
    case TL_CUDA_IMPLICIT_GEMM:
        return wgrad ? tl_cuda_implicit_gemm_weight_grad(ctx, d, opts, a, b, nbr, der, ws, out)
                     : tl_cuda_implicit_gemm_forward(ctx, d, opts, a, b, nbr, der, ws, out);
    case TL_CUDA_FETCH_ON_DEMAND:
        return wgrad ? tl_cuda_fetch_on_demand_weight_grad(ctx, d, opts, a, b, p, der, ws, out)
                     : tl_cuda_fetch_on_demand_forward(ctx, d, opts, a, b, p, der, ws, out);
    default: return TL_ERR_INVALID;
    }
}

/* The workspace of one cuda_conv call (derived: it is passed its map-derived
 * data) or cuda_conv_derive call (derived 0: deriving runs the part of the
 * call that derives). */
static int tl_cuda_conv_workspace(const tl_py_call *c, const char *fn, int df, int wgrad,
                                  const tl_conv_desc *d, long long n_pairs, int derived,
                                  PyObject *alloc, void **ws) {
    size_t bytes = 0;
    tl_status st =
        tl_cuda_conv_workspace_size((tl_cuda_dataflow)df, wgrad, d, n_pairs, derived, &bytes);
    return tl_py_workspace(c, fn, st, bytes, alloc, ws);
}

PyDoc_STRVAR(cuda_conv_doc,
             "cuda_conv(device, stream, dataflow, weight_grad, dtype, n_in, n_out, k, c_in, "
             "c_out, opts, a_ptr, b_ptr, nbr_ptr, offsets_ptr, pair_in_ptr, "
             "pair_out_ptr, n_pairs, derived_ptr, alloc, out_ptr)\n\n"
             "Forward (a = x, b = w) or weight gradient (a = x, b = dy) of one dataflow; "
             "dataflow 0 implicit GEMM (nbr), 1 fetch-on-demand (pairs).  opts: bit 1 TF32 for "
             "float32, 2 the pipelined implicit-GEMM forward, 4 the pipelined weight gradient, "
             "8 the pipelined fetch-on-demand forward (see tl_cuda.h).  derived_ptr: what "
             "cuda_conv_derive computed for this call's map, or 0 to compute it here.  "
             "alloc(nbytes) -> int gives the workspace.");
static PyObject *py_cuda_conv(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    int df, wgrad, dtype, opts;
    unsigned long long pa, pb, pnbr, poff, ppin, ppout, pder, pout;
    long long n_in, n_out, k, cin, cout, n_pairs;
    PyObject *alloc;
    void *ws;
    if (!tl_py_parse(args, 1, &c, "ii" TL_CONV_DESC_FMT "iKKKKKKLKOK", &df, &wgrad, &dtype,
                     &n_in, &n_out, &k, &cin, &cout, &opts, &pa, &pb, &pnbr, &poff, &ppin,
                     &ppout, &n_pairs, &pder, &alloc, &pout))
        return NULL;
    tl_conv_desc d = {(tl_dtype)dtype, n_in, n_out, k, cin, cout};
    tl_cuda_pairs p = {n_pairs, tl_ptr(poff), tl_ptr(ppin), tl_ptr(ppout)};
    if (!tl_cuda_conv_workspace(&c, "cuda_conv", df, wgrad, &d, n_pairs, pder != 0, alloc, &ws))
        return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_conv_call(df, wgrad, &c.ctx, &d, opts, tl_ptr(pa), tl_ptr(pb), tl_ptr(pnbr), &p,
                           tl_ptr(pder), ws, tl_ptr(pout));
    Py_END_ALLOW_THREADS
    if (st != TL_OK)
        return tl_py_fail(&c, st, "cuda_conv", tl_cuda_conv_entry(df, wgrad), NULL, NULL);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cuda_conv_derived_size_doc,
             "cuda_conv_derived_size(dataflow, weight_grad, dtype, n_in, n_out, k, c_in, c_out)"
             " -> int\n\nBytes of the data a cuda_conv call derives from its map alone "
             "(0: none).");
static PyObject *py_cuda_conv_derived_size(PyObject *self, PyObject *args) {
    (void)self;
    int df, wgrad, dtype;
    long long n_in, n_out, k, cin, cout;
    if (!PyArg_ParseTuple(args, "ii" TL_CONV_DESC_FMT, &df, &wgrad, &dtype, &n_in, &n_out, &k,
                          &cin, &cout))
        return NULL;
    tl_conv_desc d = {(tl_dtype)dtype, n_in, n_out, k, cin, cout};
    size_t bytes = 0;
    tl_status st = tl_cuda_conv_derived_size((tl_cuda_dataflow)df, wgrad, &d, &bytes);
    if (st != TL_OK) return tl_raise("cuda_conv_derived_size", st);
    return PyLong_FromSize_t(bytes);
}

PyDoc_STRVAR(cuda_conv_derive_doc,
             "cuda_conv_derive(device, stream, dataflow, weight_grad, dtype, n_in, n_out, k, "
             "c_in, c_out, nbr_ptr, offsets_ptr, pair_in_ptr, pair_out_ptr, n_pairs, alloc, "
             "derived_ptr)\n\nComputes what cuda_conv would derive from the map into "
             "derived_ptr (cuda_conv_derived_size bytes), for later calls to pass.");
static PyObject *py_cuda_conv_derive(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    int df, wgrad, dtype;
    unsigned long long pnbr, poff, ppin, ppout, pder;
    long long n_in, n_out, k, cin, cout, n_pairs;
    PyObject *alloc;
    void *ws;
    if (!tl_py_parse(args, 1, &c, "ii" TL_CONV_DESC_FMT "KKKKLOK", &df, &wgrad, &dtype, &n_in,
                     &n_out, &k, &cin, &cout, &pnbr, &poff, &ppin, &ppout, &n_pairs, &alloc,
                     &pder))
        return NULL;
    tl_conv_desc d = {(tl_dtype)dtype, n_in, n_out, k, cin, cout};
    tl_cuda_pairs p = {n_pairs, tl_ptr(poff), tl_ptr(ppin), tl_ptr(ppout)};
    if (!tl_cuda_conv_workspace(&c, "cuda_conv_derive", df, wgrad, &d, n_pairs, 0, alloc, &ws))
        return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_conv_derive(&c.ctx, (tl_cuda_dataflow)df, wgrad, &d, tl_ptr(pnbr), &p, ws,
                             tl_ptr(pder));
    Py_END_ALLOW_THREADS
    if (st != TL_OK)
        return tl_py_fail(&c, st, "cuda_conv_derive", "tl_cuda_conv_derive", NULL, NULL);
    Py_RETURN_NONE;
}

typedef tl_status (*tl_rows_fn)(const tl_ctx *, tl_dtype, const void *, int64_t, int64_t,
                                const int32_t *, int64_t, void *);

/* cuda_gather_rows and cuda_scatter_add_rows: (device, stream, dtype, src, n0, c, idx, n1,
 * dst); the scatter's dst is its fp32 accumulator. */
static tl_status tl_cuda_scatter_add_any(const tl_ctx *ctx, tl_dtype dtype, const void *src,
                                         int64_t n_rows, int64_t c, const int32_t *idx,
                                         int64_t n_dst, void *acc) {
    return tl_cuda_scatter_add_rows(ctx, dtype, src, n_rows, c, idx, n_dst, acc);
}

static PyObject *tl_rows_call(const char *name, const char *entry, tl_rows_fn fn,
                              PyObject *args) {
    tl_py_call c;
    int dtype;
    unsigned long long psrc, pidx, pdst;
    long long n0, ch, n1;
    if (!tl_py_parse(args, 1, &c, "iKLLKLK", &dtype, &psrc, &n0, &ch, &pidx, &n1, &pdst))
        return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS
    st = fn(&c.ctx, (tl_dtype)dtype, tl_ptr(psrc), n0, ch, tl_ptr(pidx), n1, tl_ptr(pdst));
    Py_END_ALLOW_THREADS
    if (st != TL_OK) return tl_py_fail(&c, st, name, entry, NULL, NULL);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cuda_gather_rows_doc,
             "cuda_gather_rows(device, stream, dtype, src_ptr, n_src, c, idx_ptr, n_rows, "
             "dst_ptr)\n\ndst[r] = src[idx[r]] for the (n_rows, c) rows of dst.");
TL_PY_FORWARD(cuda_gather_rows, tl_rows_call("cuda_gather_rows", "tl_cuda_gather_rows",
                                              tl_cuda_gather_rows, args))

PyDoc_STRVAR(cuda_scatter_add_rows_doc,
             "cuda_scatter_add_rows(device, stream, dtype, src_ptr, n_rows, c, idx_ptr, n_dst, "
             "acc_ptr)\n\nacc[idx[r]] += src[r] in fp32 (atomics).");
TL_PY_FORWARD(cuda_scatter_add_rows,
              tl_rows_call("cuda_scatter_add_rows", "tl_cuda_scatter_add_rows",
                           tl_cuda_scatter_add_any, args))

#endif /* TL_WITH_CUDA */

PyMethodDef tl_py_conv_methods[] = {
    TL_PY_METHOD(conv_forward),
    TL_PY_METHOD(conv_weight_grad),
    TL_PY_METHOD(conv_list_rows),
    TL_PY_METHOD(conv_forward_listed),
    TL_PY_METHOD(conv_weight_grad_list_rows),
    TL_PY_METHOD(conv_weight_grad_listed),
    TL_PY_METHOD(pairs_forward),
    TL_PY_METHOD(pairs_weight_grad),
#ifdef TL_WITH_CUDA
    TL_PY_METHOD(cuda_conv),
    TL_PY_METHOD(cuda_conv_derived_size),
    TL_PY_METHOD(cuda_conv_derive),
    TL_PY_METHOD(cuda_gather_rows),
    TL_PY_METHOD(cuda_scatter_add_rows),
#endif
    {NULL, NULL, 0, NULL},
};
