/* torch_lattice._C: the CPython extension over the C core.
 *
 * Limited API (abi3), no torch: the Python layer validates tensors and
 * passes raw data pointers (as ints), sizes and a thread count.  Every
 * function releases the GIL around C work and turns a tl_status into a
 * Python exception in exactly one place, tl_raise(). */
#include "tl_py.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "tl_coords.h"
#include "tl_dataflow_implicit_gemm.h"
#include "tl_generative.h"
#include "tl_kmap.h"
#include "tl_simd.h"

#define TL_GEOM_FMT "(iii)(iii)(iii)(iii)"

#define TL_RANGE_ERROR "OutOfRangeError"

static struct PyModuleDef tl_module;

/* The module's OutOfRangeError (a ValueError and an OverflowError), found
 * through the interpreter's module state rather than a C static: no global
 * state.  New reference; ValueError if the module is somehow not attached. */
static PyObject *tl_range_error_type(void) {
    PyObject *m = PyState_FindModule(&tl_module); /* borrowed */
    PyObject *t = m ? PyObject_GetAttrString(m, TL_RANGE_ERROR) : NULL;
    if (!t) {
        PyErr_Clear();
        Py_INCREF(PyExc_ValueError);
        return PyExc_ValueError;
    }
    return t;
}

/* Exception type of a status (new reference). */
static PyObject *tl_status_type(tl_status st) {
    PyObject *type = PyExc_RuntimeError;
    switch (st) {
    case TL_ERR_INVALID:
    case TL_ERR_DUPLICATE: type = PyExc_ValueError; break;
    case TL_ERR_OVERFLOW: return tl_range_error_type();
    case TL_ERR_NOMEM: type = PyExc_MemoryError; break;
    default: break;
    }
    Py_INCREF(type);
    return type;
}

PyObject *tl_raise(const char *fn, tl_status st) {
    PyObject *type = tl_status_type(st);
    PyErr_Format(type, "torch_lattice._C.%s: %s", fn, tl_status_str(st));
    Py_DECREF(type);
    return NULL;
}

/* See tl_py.h. */
PyObject *tl_raise_rule(const char *fn, tl_status st, const char *rule) {
    PyObject *type = tl_status_type(st);
    PyErr_Format(type, "torch_lattice._C.%s: %s: %s", fn, tl_status_str(st), rule);
    Py_DECREF(type);
    return NULL;
}

PyObject *tl_raise_generative(tl_status st) {
    if (st == TL_ERR_OVERFLOW)
        return tl_raise_rule("generative", st,
                             "coords * stride + kernel_size - 1 must fit int32 on every axis");
    if (st == TL_ERR_INVALID)
        return tl_raise_rule("generative", st,
                             "coords must be non-negative, padding 0 and dilation 1");
    return tl_raise("generative", st);
}

/* Values of TORCH_LATTICE_CPU_ISA; the first name of each level is the one
 * cpu_isa() reports. */
static const struct {
    const char *name;
    tl_simd level;
} tl_isa_names[] = {{"avx512", TL_SIMD_V4}, {"avx2", TL_SIMD_V3}, {"baseline", TL_SIMD_BASE},
                    {"auto", TL_SIMD_V4},   {"", TL_SIMD_V4}};
#define TL_ISA_NAMES (sizeof tl_isa_names / sizeof tl_isa_names[0])

int tl_cpu_ctx(int threads, tl_ctx *ctx) {
    const char *want = getenv("TORCH_LATTICE_CPU_ISA");
    ctx->threads = threads < 1 ? 1 : threads;
    ctx->device = -1;
    ctx->stream = NULL;
    ctx->simd_cap = TL_SIMD_V4;
    if (!want) return 0;
    for (size_t i = 0; i < TL_ISA_NAMES; i++)
        if (strcmp(want, tl_isa_names[i].name) == 0) {
            ctx->simd_cap = tl_isa_names[i].level;
            return 0;
        }
    PyErr_Format(PyExc_ValueError,
                 "TORCH_LATTICE_CPU_ISA must be auto, avx512, avx2 or baseline (or unset); "
                 "got '%s'",
                 want);
    return -1;
}

/* See tl_py.h. */
int tl_parse_geom(const char *fn, PyObject *tuple, tl_geom *g) {
    if (!PyArg_ParseTuple(tuple, TL_GEOM_FMT, &g->kernel_size[0], &g->kernel_size[1],
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
    unsigned long long pin, pout, pnbr;
    long long n_in, n_out;
    int threads;
    PyObject *geom;
    tl_geom g;
    if (!PyArg_ParseTuple(args, "KLKLOKi", &pin, &n_in, &pout, &n_out, &geom, &pnbr,
                          &threads))
        return NULL;
    if (!tl_parse_geom("kmap_build", geom, &g)) return NULL;
    tl_ctx ctx;
    if (tl_cpu_ctx(threads, &ctx)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st =
        tl_kmap_build(&ctx, tl_ptr(pin), n_in, tl_ptr(pout), n_out, &g, tl_ptr(pnbr));
    Py_END_ALLOW_THREADS if (st == TL_ERR_INVALID) return tl_raise_rule(
        "kmap_build", st, "n_in and n_out must be >= 0 and coordinate rows non-negative");
    if (st == TL_ERR_OVERFLOW)
        return tl_raise_rule("kmap_build", st, "n_in and n_out must be <= 2^31 - 1 (int32 rows)");
    if (st != TL_OK) return tl_raise("kmap_build", st);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(kmap_reverse_doc,
             "kmap_reverse(nbr_ptr, n_out, k, n_in, rev_ptr, threads)\n\n"
             "Fills the (n_in, K) int32 input-stationary table from nbr.");
static PyObject *py_kmap_reverse(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long pnbr, prev;
    long long n_out, k, n_in;
    int threads;
    if (!PyArg_ParseTuple(args, "KLLLKi", &pnbr, &n_out, &k, &n_in, &prev, &threads))
        return NULL;
    tl_ctx ctx;
    if (tl_cpu_ctx(threads, &ctx)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st = tl_kmap_reverse(&ctx, tl_ptr(pnbr), n_out, k, n_in, tl_ptr(prev));
    Py_END_ALLOW_THREADS if (st == TL_ERR_INVALID) return tl_raise_rule(
        "kmap_reverse", st, "every nbr entry must be -1 or lie in [0, n_in), sizes >= 0");
    if (st == TL_ERR_OVERFLOW)
        return tl_raise_rule("kmap_reverse", st,
                             "n_in, n_out and k must be <= 2^31 - 1 (int32 row indices)");
    if (st != TL_OK) return tl_raise("kmap_reverse", st);
    Py_RETURN_NONE;
}

/* Shared argument layout of the two convolution entry points:
 * (dtype, n_in, n_out, k, c_in, c_out, a_ptr, b_ptr, nbr_ptr, out_ptr, threads). */
typedef tl_status (*tl_conv_fn)(const tl_ctx *, const tl_conv_desc *, const void *,
                                const void *, const int32_t *, void *);

static PyObject *tl_call_conv(const char *name, tl_conv_fn fn, PyObject *args) {
    int dtype, threads;
    long long n_in, n_out, k, cin, cout;
    unsigned long long pa, pb, pnbr, pout;
    if (!PyArg_ParseTuple(args, "iLLLLLKKKKi", &dtype, &n_in, &n_out, &k, &cin, &cout,
                          &pa, &pb, &pnbr, &pout, &threads))
        return NULL;
    tl_conv_desc d = {(tl_dtype)dtype, n_in, n_out, k, cin, cout};
    tl_ctx ctx;
    if (tl_cpu_ctx(threads, &ctx)) return NULL;
    tl_status st;
    Py_BEGIN_ALLOW_THREADS st = fn(&ctx, &d, tl_ptr(pa), tl_ptr(pb), tl_ptr(pnbr), tl_ptr(pout));
    Py_END_ALLOW_THREADS if (st == TL_ERR_INVALID) return tl_raise_rule(
        name, st,
        "every nbr entry must be -1 or lie in [0, rows of the gathered side); dtype, sizes "
        "(>= 0) and pointers must be valid");
    if (st == TL_ERR_OVERFLOW)
        return tl_raise_rule(name, st,
                             "n_in, n_out and k must be <= 2^31 - 1 (int32 rows) and rows x "
                             "channels and k x c_in x c_out must fit int64");
    if (st != TL_OK) return tl_raise(name, st);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(conv_forward_doc,
             "conv_forward(dtype, n_in, n_out, k, c_in, c_out, x, w, nbr, y, threads)\n\n"
             "y = sum_n x[nbr[:, n]] @ w[n] (implicit-GEMM dataflow, CPU).");
static PyObject *py_conv_forward(PyObject *self, PyObject *args) {
    (void)self;
    return tl_call_conv("conv_forward", tl_implicit_gemm_forward, args);
}

PyDoc_STRVAR(conv_weight_grad_doc,
             "conv_weight_grad(dtype, n_in, n_out, k, c_in, c_out, x, dy, nbr, dw, threads)\n\n"
             "dw[n] = x[nbr[:, n]]^T dy (implicit-GEMM dataflow, CPU).");
static PyObject *py_conv_weight_grad(PyObject *self, PyObject *args) {
    (void)self;
    return tl_call_conv("conv_weight_grad", tl_implicit_gemm_weight_grad, args);
}

PyDoc_STRVAR(cpu_isa_doc,
             "cpu_isa() -> str\n\n"
             "Instruction set the CPU micro-kernels run with now: 'avx512', 'avx2' or\n"
             "'baseline' (this CPU's widest, capped by TORCH_LATTICE_CPU_ISA).");
static PyObject *py_cpu_isa(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    tl_ctx ctx;
    if (tl_cpu_ctx(1, &ctx)) return NULL;
    tl_simd level = tl_simd_capped(ctx.simd_cap);
    size_t i = 0;
    while (tl_isa_names[i].level != level) i++; /* every level has a name */
    return PyUnicode_FromString(tl_isa_names[i].name);
}

PyMethodDef tl_py_core_methods[] = {
    {"cpu_isa", py_cpu_isa, METH_NOARGS, cpu_isa_doc},
    {"find_duplicate", py_find_duplicate, METH_VARARGS, find_duplicate_doc},
    {"generate_bound", py_generate_bound, METH_VARARGS, generate_bound_doc},
    {"generate", py_generate, METH_VARARGS, generate_doc},
    {"generative", py_generative, METH_VARARGS, generative_doc},
    {"kmap_build", py_kmap_build, METH_VARARGS, kmap_build_doc},
    {"kmap_reverse", py_kmap_reverse, METH_VARARGS, kmap_reverse_doc},
    {"conv_forward", py_conv_forward, METH_VARARGS, conv_forward_doc},
    {"conv_weight_grad", py_conv_weight_grad, METH_VARARGS, conv_weight_grad_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef tl_module = {
    PyModuleDef_HEAD_INIT, "_C", "Torch Lattice C core (torch-free, abi3).", 0,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__C(void) {
    PyObject *m = PyModule_Create(&tl_module);
    if (!m) return NULL;
    /* TL_ERR_OVERFLOW: a size or coordinate beyond its type is a bad argument
     * (ValueError) that older callers caught as OverflowError; it is both. */
    PyObject *bases = PyTuple_Pack(2, PyExc_ValueError, PyExc_OverflowError);
    PyObject *range_error =
        bases ? PyErr_NewExceptionWithDoc("torch_lattice._C." TL_RANGE_ERROR,
                                          "A size or coordinate leaves its integer range "
                                          "(int32 coordinates and rows, int64 sizes).",
                                          bases, NULL)
              : NULL;
    Py_XDECREF(bases);
    if (!range_error || PyModule_AddObject(m, TL_RANGE_ERROR, range_error) < 0) {
        Py_XDECREF(range_error);
        Py_DECREF(m);
        return NULL;
    }
    /* What tl_range_error_type finds (a second load of the file, as the
     * fuzzers' sanitizer override does, re-attaches the newest module). */
    if (PyState_AddModule(m, &tl_module) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyMethodDef *tables[] = {tl_py_core_methods, tl_py_dataflow_methods, tl_py_blocks_methods,
                             tl_py_cuda_methods, tl_py_cuda_blocks_methods};
    for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]); i++) {
        if (PyModule_AddFunctions(m, tables[i]) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
