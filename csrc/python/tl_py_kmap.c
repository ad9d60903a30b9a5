/* Binding of the kernel-map family, CPU and CUDA: duplicate rows, generated
 * and generative output supports, neighbour tables and their transpose, and
 * pair lists and tile lists (core/tl_coords.h, tl_generative.h, tl_kmap.h,
 * tl_pairs.h, tl_tile_lists.h;
 * cuda/tl_cuda.h, tl_cuda_generative.h).
 *
 * The CUDA entry points take device pointers as ints, the device index and
 * torch's current stream handle, and an alloc(nbytes) -> int callable for
 * their workspace (tl_py_workspace); torch allocates every output. */
#include "tl_py.h"

#include "core/tl_coords.h"
#include "core/tl_generative.h"
#include "core/tl_kmap.h"
#include "core/tl_pairs.h"
#include "core/tl_tile_lists.h"

#ifdef TL_WITH_CUDA
#include "cuda/tl_cuda.h"
#include "cuda/tl_cuda_generative.h"
#endif

/* The size rule of the pair-list builders, for TL_ERR_OVERFLOW. */
#define TL_PAIRS_SIZES "n_out and k must be <= 2^31 - 1 (int32 row and kernel-row indices)"

/* out_range of generate / generate_bound: each axis in [0, 2^31], since the
 * generated coordinates q < out_range are int32. */
static int tl_check_out_range(const char *fn, const int64_t r[3]) {
    for (int a = 0; a < 3; a++)
        if (r[a] < 0 || r[a] > (int64_t)TL_COORD_MAX + 1) {
            PyErr_Format(PyExc_ValueError,
                         "torch_lattice._C.%s: out_range[%d] = %lld must lie in [0, 2^31]: "
                         "output coordinates are int32 (a padding or spatial_range this large "
                         "gives outputs beyond 2^31 - 1)",
                         fn, a, (long long)r[a]);
            return 0;
        }
    return 1;
}

PyDoc_STRVAR(find_duplicate_doc,
             "find_duplicate(coords_ptr, n) -> int\n\n"
             "Index of the first repeated (N, 4) int32 row, or -1.");
static PyObject *py_find_duplicate(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long p;
    long long n, dup = -1;
    if (!PyArg_ParseTuple(args, "KL", &p, &n)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st = tl_coords_find_duplicate(tl_ptr(p), n, (int64_t *)&dup);
    Py_END_ALLOW_THREADS if (st != TL_OK) return tl_raise("find_duplicate", st);
    return PyLong_FromLongLong(dup);
}

PyDoc_STRVAR(generate_bound_doc,
             "generate_bound(n_in, geom, out_range, n_batches) -> int\n\n"
             "Safe output capacity for generate().");
static PyObject *py_generate_bound(PyObject *self, PyObject *args) {
    (void)self;
    long long n_in, nb, bound = 0;
    int64_t r[3];
    PyObject *geom;
    tl_geom g;
    if (!PyArg_ParseTuple(args, "LO(LLL)L", &n_in, &geom, &r[0], &r[1], &r[2], &nb))
        return NULL;
    if (!tl_parse_geom("generate_bound", geom, &g)) return NULL;
    if (!tl_check_out_range("generate_bound", r)) return NULL;
    if (n_in < 0 || nb < 0) {
        PyErr_Format(PyExc_ValueError,
                     "torch_lattice._C.generate_bound: n_in (%lld) and n_batches (%lld) must be "
                     ">= 0",
                     n_in, nb);
        return NULL;
    }
    tl_status st = tl_coords_generate_bound(n_in, &g, r, nb, (int64_t *)&bound);
    if (st != TL_OK) return tl_raise("generate_bound", st);
    return PyLong_FromLongLong(bound);
}

PyDoc_STRVAR(generate_doc,
             "generate(in_ptr, n_in, geom, out_range, out_ptr, capacity) -> int\n\n"
             "Writes the sorted generated output support; returns its row count.");
static PyObject *py_generate(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long pin, pout;
    long long n_in, cap, n_out = 0;
    int64_t r[3];
    PyObject *geom;
    tl_geom g;
    if (!PyArg_ParseTuple(args, "KLO(LLL)KL", &pin, &n_in, &geom, &r[0], &r[1], &r[2],
                          &pout, &cap))
        return NULL;
    if (!tl_parse_geom("generate", geom, &g)) return NULL;
    if (!tl_check_out_range("generate", r)) return NULL;
    if (n_in < 0 || cap < 0 || (n_in > 0 && !pin) || (cap > 0 && !pout)) {
        PyErr_Format(PyExc_ValueError,
                     "torch_lattice._C.generate: n_in (%lld) and capacity (%lld) must be >= 0, "
                     "with non-null in_ptr / out_ptr when positive",
                     n_in, cap);
        return NULL;
    }
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st =
        tl_coords_generate(tl_ptr(pin), n_in, &g, r, tl_ptr(pout), cap, (int64_t *)&n_out);
    Py_END_ALLOW_THREADS if (st != TL_OK) return tl_raise("generate", st);
    return PyLong_FromLongLong(n_out);
}

PyDoc_STRVAR(generative_doc,
             "generative(in_ptr, n_in, geom, out_ptr, capacity) -> int\n\n"
             "Writes the sorted generative-transpose support; returns its row count.");
static PyObject *py_generative(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long pin, pout;
    long long n_in, cap, n_out = 0;
    PyObject *geom;
    tl_geom g;
    if (!PyArg_ParseTuple(args, "KLOKL", &pin, &n_in, &geom, &pout, &cap)) return NULL;
    if (!tl_parse_geom("generative", geom, &g)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st =
        tl_generative_support(tl_ptr(pin), n_in, &g, tl_ptr(pout), cap, (int64_t *)&n_out);
    Py_END_ALLOW_THREADS if (st != TL_OK) return tl_raise_generative(st);
    return PyLong_FromLongLong(n_out);
}

PyDoc_STRVAR(kmap_build_doc,
             "kmap_build(in_ptr, n_in, out_ptr, n_out, geom, nbr_ptr, threads)\n\n"
             "Fills the (n_out, K) int32 output-stationary neighbour table.");
static PyObject *py_kmap_build(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    unsigned long long pin, pout, pnbr;
    long long n_in, n_out;
    PyObject *geom;
    tl_geom g;
    if (!tl_py_parse(args, 0, &c, "KLKLOK", &pin, &n_in, &pout, &n_out, &geom, &pnbr))
        return NULL;
    if (!tl_parse_geom("kmap_build", geom, &g)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st =
        tl_kmap_build(&c.ctx, tl_ptr(pin), n_in, tl_ptr(pout), n_out, &g, tl_ptr(pnbr));
    Py_END_ALLOW_THREADS if (st != TL_OK) return tl_py_fail(
        &c, st, "kmap_build", "tl_kmap_build",
        "n_in and n_out must be >= 0 and coordinate rows non-negative",
        "n_in and n_out must be <= 2^31 - 1 (int32 rows)");
    Py_RETURN_NONE;
}

/* kmap_reverse and cuda_kmap_reverse: (nbr_ptr, n_out, k, n_in, rev_ptr). */
static PyObject *tl_kmap_reverse_call(PyObject *args, int cuda) {
    tl_py_call c;
    unsigned long long pnbr, prev;
    long long n_out, k, n_in;
    if (!tl_py_parse(args, cuda, &c, "KLLLK", &pnbr, &n_out, &k, &n_in, &prev)) return NULL;
    tl_status st = TL_ERR_INVALID;
    Py_BEGIN_ALLOW_THREADS
#ifdef TL_WITH_CUDA
    if (cuda) st = tl_cuda_kmap_reverse(&c.ctx, tl_ptr(pnbr), n_out, k, n_in, tl_ptr(prev));
#endif
    if (!cuda) st = tl_kmap_reverse(&c.ctx, tl_ptr(pnbr), n_out, k, n_in, tl_ptr(prev));
    Py_END_ALLOW_THREADS
    if (st != TL_OK)
        return tl_py_fail(&c, st, cuda ? "cuda_kmap_reverse" : "kmap_reverse",
                          "tl_cuda_kmap_reverse",
                          "every nbr entry must be -1 or lie in [0, n_in), sizes >= 0",
                          "n_in, n_out and k must be <= 2^31 - 1 (int32 row indices)");
    Py_RETURN_NONE;
}

PyDoc_STRVAR(kmap_reverse_doc,
             "kmap_reverse(nbr_ptr, n_out, k, n_in, rev_ptr, threads)\n\n"
             "Fills the (n_in, K) int32 input-stationary table from nbr.");
TL_PY_FORWARD(kmap_reverse, tl_kmap_reverse_call(args, 0))

PyDoc_STRVAR(pairs_count_doc,
             "pairs_count(nbr_ptr, n_out, k, offsets_ptr, threads)\n\n"
             "Fills the (k + 1) int64 CSR offsets of the pair lists of nbr.");
static PyObject *py_pairs_count(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    unsigned long long pnbr, poff;
    long long n_out, k;
    if (!tl_py_parse(args, 0, &c, "KLLK", &pnbr, &n_out, &k, &poff)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st = tl_pairs_count(&c.ctx, tl_ptr(pnbr), n_out, k, tl_ptr(poff));
    Py_END_ALLOW_THREADS if (st != TL_OK) return tl_py_fail(
        &c, st, "pairs_count", "tl_pairs_count",
        "every nbr entry must be -1 (no neighbour) or an input row >= 0", TL_PAIRS_SIZES);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(pairs_fill_doc,
             "pairs_fill(nbr_ptr, n_out, k, offsets_ptr, in_ptr, out_ptr, threads)\n\n"
             "Fills the int32 pair lists of nbr (sorted by output per kernel row).");
static PyObject *py_pairs_fill(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    unsigned long long pnbr, poff, pin, pout;
    long long n_out, k;
    if (!tl_py_parse(args, 0, &c, "KLLKKK", &pnbr, &n_out, &k, &poff, &pin, &pout)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st =
        tl_pairs_fill(&c.ctx, tl_ptr(pnbr), n_out, k, tl_ptr(poff), tl_ptr(pin), tl_ptr(pout));
    Py_END_ALLOW_THREADS if (st != TL_OK) return tl_py_fail(&c, st, "pairs_fill", "tl_pairs_fill",
                                                            NULL, TL_PAIRS_SIZES);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(tile_lists_count_doc,
             "tile_lists_count(nbr_ptr, n_out, k, tile_rows, start_ptr, threads) -> int\n\n"
             "Fills the (tiles * k + 1) int64 starts of nbr's tile lists; returns the largest "
             "entry + 1 (tl_tile_lists.h).");
static PyObject *py_tile_lists_count(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    unsigned long long pnbr, pstart;
    long long n_out, k, tile_rows;
    if (!tl_py_parse(args, 0, &c, "KLLLK", &pnbr, &n_out, &k, &tile_rows, &pstart)) return NULL;
    tl_status st;
    int64_t top = 0;
    Py_BEGIN_ALLOW_THREADS st =
        tl_tile_lists_count(&c.ctx, tl_ptr(pnbr), n_out, k, tile_rows, tl_ptr(pstart), &top);
    Py_END_ALLOW_THREADS if (st != TL_OK) return tl_py_fail(
        &c, st, "tile_lists_count", "tl_tile_lists_count",
        "every nbr entry must be >= -1 and tile_rows >= 1", NULL);
    return PyLong_FromLongLong(top);
}

PyDoc_STRVAR(tile_lists_fill_doc,
             "tile_lists_fill(nbr_ptr, n_out, k, tile_rows, start_ptr, top, in_ptr, rows_ptr, "
             "threads)\n\nFills the int32 tile lists of nbr at the starts and below the top "
             "tile_lists_count gave.");
static PyObject *py_tile_lists_fill(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    unsigned long long pnbr, pstart, pin, prows;
    long long n_out, k, tile_rows, top;
    if (!tl_py_parse(args, 0, &c, "KLLLKLKK", &pnbr, &n_out, &k, &tile_rows, &pstart, &top,
                     &pin, &prows))
        return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st =
        tl_tile_lists_fill(&c.ctx, tl_ptr(pnbr), n_out, k, tile_rows, tl_ptr(pstart), top,
                           tl_ptr(pin), tl_ptr(prows));
    Py_END_ALLOW_THREADS if (st != TL_OK) return tl_py_fail(
        &c, st, "tile_lists_fill", "tl_tile_lists_fill",
        "the starts and top must be tile_lists_count's for this table and tile_rows (was the "
        "table changed while it was listed?)",
        NULL);
    Py_RETURN_NONE;
}

#ifdef TL_WITH_CUDA

PyDoc_STRVAR(cuda_kmap_build_doc,
             "cuda_kmap_build(device, stream, in_ptr, n_in, out_ptr, n_out, geom, alloc, "
             "nbr_ptr)\n\nFills the (n_out, K) int32 neighbour table on the GPU.");
static PyObject *py_cuda_kmap_build(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    unsigned long long pin, pout, pnbr;
    long long n_in, n_out;
    PyObject *geom, *alloc;
    tl_geom g;
    size_t bytes = 0;
    void *ws;
    if (!tl_py_parse(args, 1, &c, "KLKLOOK", &pin, &n_in, &pout, &n_out, &geom, &alloc, &pnbr))
        return NULL;
    if (!tl_parse_geom("cuda_kmap_build", geom, &g)) return NULL;
    tl_status st = tl_cuda_kmap_workspace_size(n_in, &bytes);
    if (!tl_py_workspace(&c, "cuda_kmap_build", st, bytes, alloc, &ws)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_kmap_build(&c.ctx, tl_ptr(pin), n_in, tl_ptr(pout), n_out, &g, ws, tl_ptr(pnbr));
    Py_END_ALLOW_THREADS
    if (st != TL_OK) return tl_py_fail(&c, st, "cuda_kmap_build", "tl_cuda_kmap_build", NULL, NULL);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(cuda_kmap_reverse_doc,
             "cuda_kmap_reverse(device, stream, nbr_ptr, n_out, k, n_in, rev_ptr)\n\n"
             "Fills the (n_in, K) transpose of nbr on the GPU.");
TL_PY_FORWARD(cuda_kmap_reverse, tl_kmap_reverse_call(args, 1))

PyDoc_STRVAR(cuda_generate_doc,
             "cuda_generate(device, stream, in_ptr, n_in, geom, out_range, alloc, out_ptr, "
             "capacity) -> int\n\nWrites the sorted generated support; returns its row count.");
static PyObject *py_cuda_generate(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    unsigned long long pin, pout;
    long long n_in, cap;
    int64_t r[3], n_out = 0;
    PyObject *geom, *alloc;
    tl_geom g;
    size_t bytes = 0;
    void *ws;
    if (!tl_py_parse(args, 1, &c, "KLO(LLL)OKL", &pin, &n_in, &geom, &r[0], &r[1], &r[2], &alloc,
                     &pout, &cap))
        return NULL;
    if (!tl_parse_geom("cuda_generate", geom, &g)) return NULL;
    tl_status st = tl_cuda_generate_workspace_size(n_in, &g, r, &bytes);
    if (!tl_py_workspace(&c, "cuda_generate", st, bytes, alloc, &ws)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_generate(&c.ctx, tl_ptr(pin), n_in, &g, r, ws, tl_ptr(pout), cap, &n_out);
    Py_END_ALLOW_THREADS
    if (st != TL_OK) return tl_py_fail(&c, st, "cuda_generate", "tl_cuda_generate", NULL, NULL);
    return PyLong_FromLongLong((long long)n_out);
}

PyDoc_STRVAR(cuda_generative_doc,
             "cuda_generative(device, stream, in_ptr, n_in, geom, alloc, out_ptr, capacity) -> "
             "int\n\nWrites unique{in * stride + r} sorted; returns its row count.");
static PyObject *py_cuda_generative(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    unsigned long long pin, pout;
    long long n_in, cap;
    int64_t n_out = 0;
    PyObject *geom, *alloc;
    tl_geom g;
    size_t bytes = 0;
    void *ws;
    if (!tl_py_parse(args, 1, &c, "KLOOKL", &pin, &n_in, &geom, &alloc, &pout, &cap))
        return NULL;
    if (!tl_parse_geom("generative", geom, &g)) return NULL;
    tl_status st = tl_cuda_generative_workspace_size(n_in, &g, &bytes);
    if (st != TL_OK) return tl_raise("generative", st);
    if (!tl_py_workspace(&c, "generative", st, bytes, alloc, &ws)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_generative_support(&c.ctx, tl_ptr(pin), n_in, &g, ws, tl_ptr(pout), cap, &n_out);
    Py_END_ALLOW_THREADS
    if (st == TL_ERR_CUDA)
        return tl_py_fail(&c, st, "generative", "tl_cuda_generative_support", NULL, NULL);
    if (st != TL_OK) return tl_raise_generative(st);
    return PyLong_FromLongLong((long long)n_out);
}

PyDoc_STRVAR(cuda_pairs_count_doc,
             "cuda_pairs_count(device, stream, nbr_ptr, n_out, k, alloc) -> int\n\n"
             "Number of non-negative entries of nbr.");
static PyObject *py_cuda_pairs_count(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    unsigned long long pnbr;
    long long n_out, k;
    int64_t count = 0;
    PyObject *alloc;
    size_t bytes = 0;
    void *ws;
    if (!tl_py_parse(args, 1, &c, "KLLO", &pnbr, &n_out, &k, &alloc)) return NULL;
    tl_status st = tl_cuda_pairs_workspace_size(n_out, k, &bytes);
    if (!tl_py_workspace(&c, "cuda_pairs_count", st, bytes, alloc, &ws)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_pairs_count(&c.ctx, tl_ptr(pnbr), n_out, k, ws, &count);
    Py_END_ALLOW_THREADS
    if (st != TL_OK)
        return tl_py_fail(&c, st, "cuda_pairs_count", "tl_cuda_pairs_count", NULL, NULL);
    return PyLong_FromLongLong((long long)count);
}

PyDoc_STRVAR(cuda_pairs_build_doc,
             "cuda_pairs_build(device, stream, nbr_ptr, n_out, k, alloc, n_pairs, "
             "offsets_ptr, in_ptr, out_ptr)\n\nFills the CSR pair lists from nbr.");
static PyObject *py_cuda_pairs_build(PyObject *self, PyObject *args) {
    (void)self;
    tl_py_call c;
    unsigned long long pnbr, poff, pin, pout;
    long long n_out, k, n_pairs;
    PyObject *alloc;
    size_t bytes = 0;
    void *ws;
    if (!tl_py_parse(args, 1, &c, "KLLOLKKK", &pnbr, &n_out, &k, &alloc, &n_pairs, &poff, &pin,
                     &pout))
        return NULL;
    tl_status st = tl_cuda_pairs_workspace_size(n_out, k, &bytes);
    if (!tl_py_workspace(&c, "cuda_pairs_build", st, bytes, alloc, &ws)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = tl_cuda_pairs_build(&c.ctx, tl_ptr(pnbr), n_out, k, ws, n_pairs, tl_ptr(poff),
                             tl_ptr(pin), tl_ptr(pout));
    Py_END_ALLOW_THREADS
    if (st != TL_OK)
        return tl_py_fail(&c, st, "cuda_pairs_build", "tl_cuda_pairs_build", NULL, NULL);
    Py_RETURN_NONE;
}

#endif /* TL_WITH_CUDA */

PyMethodDef tl_py_kmap_methods[] = {
    TL_PY_METHOD(find_duplicate),
    TL_PY_METHOD(generate_bound),
    TL_PY_METHOD(generate),
    TL_PY_METHOD(generative),
    TL_PY_METHOD(kmap_build),
    TL_PY_METHOD(kmap_reverse),
    TL_PY_METHOD(pairs_count),
    TL_PY_METHOD(pairs_fill),
    TL_PY_METHOD(tile_lists_count),
    TL_PY_METHOD(tile_lists_fill),
#ifdef TL_WITH_CUDA
    TL_PY_METHOD(cuda_kmap_build),
    TL_PY_METHOD(cuda_kmap_reverse),
    TL_PY_METHOD(cuda_generate),
    TL_PY_METHOD(cuda_generative),
    TL_PY_METHOD(cuda_pairs_count),
    TL_PY_METHOD(cuda_pairs_build),
#endif
    {NULL, NULL, 0, NULL},
};
