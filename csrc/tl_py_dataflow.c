/* Binding of pair-list kernel maps and the fetch-on-demand and
 * gather-scatter dataflows (tl_pairs.h, tl_dataflow_pairs.h). */
#include "tl_py.h"

#include "tl_dataflow_pairs.h"

/* The size rule of tl_conv_desc_check, for TL_ERR_OVERFLOW. */
#define TL_CONV_SIZES                                                                       \
    "n_in, n_out and k must be <= 2^31 - 1 (int32 rows) and rows x channels and "          \
    "k x c_in x c_out must fit int64"

PyDoc_STRVAR(pairs_count_doc,
             "pairs_count(nbr_ptr, n_out, k, offsets_ptr, threads)\n\n"
             "Fills the (k + 1) int64 CSR offsets of the pair lists of nbr.");
static PyObject *py_pairs_count(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long pnbr, poff;
    long long n_out, k;
    int threads;
    if (!PyArg_ParseTuple(args, "KLLKi", &pnbr, &n_out, &k, &poff, &threads)) return NULL;
    tl_ctx ctx;
    if (tl_cpu_ctx(threads, &ctx)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st = tl_pairs_count(&ctx, tl_ptr(pnbr), n_out, k, tl_ptr(poff));
    Py_END_ALLOW_THREADS if (st == TL_ERR_OVERFLOW) return tl_raise_rule("pairs_count", st, "n_out and k must be <= 2^31 - 1 (int32 row and kernel-row indices)");
    if (st != TL_OK) return tl_raise("pairs_count", st);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(pairs_fill_doc,
             "pairs_fill(nbr_ptr, n_out, k, offsets_ptr, in_ptr, out_ptr, threads)\n\n"
             "Fills the int32 pair lists of nbr (sorted by output per kernel row).");
static PyObject *py_pairs_fill(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long pnbr, poff, pin, pout;
    long long n_out, k;
    int threads;
    if (!PyArg_ParseTuple(args, "KLLKKKi", &pnbr, &n_out, &k, &poff, &pin, &pout, &threads))
        return NULL;
    tl_ctx ctx;
    if (tl_cpu_ctx(threads, &ctx)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st =
        tl_pairs_fill(&ctx, tl_ptr(pnbr), n_out, k, tl_ptr(poff), tl_ptr(pin), tl_ptr(pout));
    Py_END_ALLOW_THREADS if (st == TL_ERR_OVERFLOW) return tl_raise_rule("pairs_fill", st, "n_out and k must be <= 2^31 - 1 (int32 row and kernel-row indices)");
    if (st != TL_OK) return tl_raise("pairs_fill", st);
    Py_RETURN_NONE;
}

typedef tl_status (*tl_pairs_fn)(const tl_ctx *, tl_pairs_mode, const tl_conv_desc *,
                                 const void *, const void *, const tl_pairs *, void *);

/* (mode, dtype, n_in, n_out, k, c_in, c_out, a, b, offsets, in, out, result, threads) */
static PyObject *tl_call_pairs(const char *name, tl_pairs_fn fn, PyObject *args) {
    int mode, dtype, threads;
    long long n_in, n_out, k, cin, cout;
    unsigned long long pa, pb, poff, pin, pout, pres;
    if (!PyArg_ParseTuple(args, "iiLLLLLKKKKKKi", &mode, &dtype, &n_in, &n_out, &k, &cin, &cout,
                          &pa, &pb, &poff, &pin, &pout, &pres, &threads))
        return NULL;
    tl_conv_desc d = {(tl_dtype)dtype, n_in, n_out, k, cin, cout};
    tl_pairs p = {k, tl_ptr(poff), tl_ptr(pin), tl_ptr(pout)};
    tl_ctx ctx;
    if (tl_cpu_ctx(threads, &ctx)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st =
        fn(&ctx, (tl_pairs_mode)mode, &d, tl_ptr(pa), tl_ptr(pb), &p, tl_ptr(pres));
    Py_END_ALLOW_THREADS if (st == TL_ERR_OVERFLOW) return tl_raise_rule(name, st, TL_CONV_SIZES);
    if (st != TL_OK) return tl_raise(name, st);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(pairs_forward_doc,
             "pairs_forward(mode, dtype, n_in, n_out, k, c_in, c_out, x, w, offsets, in, out,"
             " y, threads)\n\nmode 0: fetch-on-demand, 1: gather-scatter.");
static PyObject *py_pairs_forward(PyObject *self, PyObject *args) {
    (void)self;
    return tl_call_pairs("pairs_forward", tl_pairs_forward, args);
}

PyDoc_STRVAR(pairs_weight_grad_doc,
             "pairs_weight_grad(mode, dtype, n_in, n_out, k, c_in, c_out, x, dy, offsets, in,"
             " out, dw, threads)\n\nWeight gradient over pair lists.");
static PyObject *py_pairs_weight_grad(PyObject *self, PyObject *args) {
    (void)self;
    return tl_call_pairs("pairs_weight_grad", tl_pairs_weight_grad, args);
}

PyMethodDef tl_py_dataflow_methods[] = {
    {"pairs_count", py_pairs_count, METH_VARARGS, pairs_count_doc},
    {"pairs_fill", py_pairs_fill, METH_VARARGS, pairs_fill_doc},
    {"pairs_forward", py_pairs_forward, METH_VARARGS, pairs_forward_doc},
    {"pairs_weight_grad", py_pairs_weight_grad, METH_VARARGS, pairs_weight_grad_doc},
    {NULL, NULL, 0, NULL},
};
