/* torch_lattice._C: the CPython extension over the C core.
 *
 * Limited API (abi3), no torch: the Python layer validates tensors and
 * passes raw data pointers (as ints), sizes and a thread count (CPU) or a
 * device, a stream and a workspace allocator (CUDA).  Every function releases
 * the GIL around C work and turns a tl_status into a Python exception in
 * exactly one place, tl_raise().  This file holds the module, its error type,
 * the CPU context and the device queries; the op families bind themselves in
 * tl_py_kmap.c, tl_py_conv.c, tl_py_pool.c, tl_py_norm.c and tl_py_voxel.c. */
#include "tl_py.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "core/tl_simd.h"

#ifdef TL_WITH_CUDA
#include "cuda/tl_cuda_device.h"
#endif

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
} tl_isa_names[] = {{"amx_bf16", TL_SIMD_V4_AMX}, {"avx512_bf16", TL_SIMD_V4_BF16},
                    {"avx512", TL_SIMD_V4},         {"avx2", TL_SIMD_V3},
                    {"baseline", TL_SIMD_BASE},     {"auto", TL_SIMD_V4_AMX},
                    {"", TL_SIMD_V4_AMX}};
#define TL_ISA_NAMES (sizeof tl_isa_names / sizeof tl_isa_names[0])

int tl_cpu_ctx(int threads, tl_ctx *ctx) {
    const char *want = getenv("TORCH_LATTICE_CPU_ISA");
    ctx->threads = threads < 1 ? 1 : threads;
    ctx->device = -1;
    ctx->stream = NULL;
    ctx->simd_cap = TL_SIMD_V4_AMX;
    if (!want) return 0;
    for (size_t i = 0; i < TL_ISA_NAMES; i++)
        if (strcmp(want, tl_isa_names[i].name) == 0) {
            ctx->simd_cap = tl_isa_names[i].level;
            return 0;
        }
    PyErr_Format(PyExc_ValueError,
                 "TORCH_LATTICE_CPU_ISA must be auto, amx_bf16, avx512_bf16, avx512, avx2 or baseline "
                 "(or unset); "
                 "got '%s'",
                 want);
    return -1;
}

PyDoc_STRVAR(cpu_isa_doc,
             "cpu_isa() -> str\n\n"
             "Instruction set the CPU micro-kernels run with now: 'amx_bf16',\n"
             "'avx512_bf16', 'avx512', 'avx2' or 'baseline' (this CPU's widest, capped by\n"
             "TORCH_LATTICE_CPU_ISA).");
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

PyDoc_STRVAR(malloc_reuse_doc,
             "malloc_reuse(max_block: int) -> bool\n\n"
             "glibc malloc: serve blocks up to max_block bytes from the heap and keep up\n"
             "to max_block bytes of freed memory at its top (M_MMAP_THRESHOLD and\n"
             "M_TRIM_THRESHOLD); max_block < 0 restores glibc's default values (128 KiB).\n"
             "False where the C library is not glibc or refused (nothing changed).\n"
             "torch_lattice.reuse_cpu_memory checks the argument.");
static PyObject *py_malloc_reuse(PyObject *self, PyObject *arg) {
    (void)self;
    const long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred()) return NULL;
    if (v > 0x7fffffffLL) {
        PyErr_SetString(PyExc_OverflowError, "max_block must fit a C int");
        return NULL;
    }
#if defined(__GLIBC__)
    const int bytes = v < 0 ? 128 * 1024 : (int)v;
    /* Both or neither: glibc checks the value before it changes anything. */
    if (!mallopt(M_MMAP_THRESHOLD, bytes)) Py_RETURN_FALSE;
    return PyBool_FromLong(mallopt(M_TRIM_THRESHOLD, bytes));
#else
    Py_RETURN_FALSE;
#endif
}

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
#endif

/* The module's own functions; the op families add theirs in PyInit__C. */
static PyMethodDef tl_py_module_methods[] = {
    {"cpu_isa", py_cpu_isa, METH_NOARGS, cpu_isa_doc},
    {"malloc_reuse", py_malloc_reuse, METH_O, malloc_reuse_doc},
    {"cuda_compiled", py_cuda_compiled, METH_NOARGS, cuda_compiled_doc},
    {"cuda_device_count", py_cuda_device_count, METH_NOARGS, cuda_device_count_doc},
    {"cuda_archs", py_cuda_archs, METH_NOARGS, cuda_archs_doc},
#ifdef TL_WITH_CUDA
    TL_PY_METHOD(cuda_device_capability),
#endif
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
    PyMethodDef *tables[] = {tl_py_module_methods, tl_py_kmap_methods, tl_py_conv_methods,
                             tl_py_pool_methods, tl_py_norm_methods, tl_py_voxel_methods};
    for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]); i++) {
        if (PyModule_AddFunctions(m, tables[i]) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
