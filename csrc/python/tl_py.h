/* Shared helpers of the CPython binding (csrc/python).
 *
 * One file per op family binds its CPU and CUDA entry points together
 * (tl_py_kmap.c, tl_py_conv.c, tl_py_pool.c, tl_py_voxel.c) and exports one
 * method table; tl_py_module.c adds every table to the module.  Every binding
 * parses its call through tl_py_parse, fails through tl_py_fail, and a CUDA
 * binding gets its workspace through tl_py_workspace. */
#ifndef TL_PY_H
#define TL_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "core/tl_coords.h"
#include "core/tl_ctx.h"
#include "core/tl_status.h"

/* Sets the Python exception for a failed status and returns NULL.  The only
 * place a tl_status becomes an exception:
 *   TL_ERR_INVALID, TL_ERR_DUPLICATE -> ValueError, TL_ERR_OVERFLOW ->
 *   torch_lattice._C.OutOfRangeError (a ValueError and an OverflowError),
 *   TL_ERR_NOMEM -> MemoryError, others -> RuntimeError. */
PyObject *tl_raise(const char *fn, tl_status st);

/* tl_raise with the rule the arguments broke appended ("fn: status: rule"),
 * for entry points that know which argument a status is about. */
PyObject *tl_raise_rule(const char *fn, tl_status st, const char *rule);

/* tl_raise for a generative-support status, with the rule the arguments broke.
 * The CPU and CUDA bindings both raise through it, so they say the same. */
PyObject *tl_raise_generative(tl_status st);

/* Pointer passed from Python as an int (tensor.data_ptr()). */
static inline void *tl_ptr(unsigned long long p) { return (void *)(uintptr_t)p; }

/* Fills the CPU context for `threads` OpenMP threads (at least one), with the
 * micro-kernels limited by the environment variable TORCH_LATTICE_CPU_ISA
 * (auto, avx512, avx2 or baseline; unset or empty is auto).  Returns 0, or
 * -1 with a ValueError set for any other value. */
int tl_cpu_ctx(int threads, tl_ctx *ctx);

/* Parses a geometry tuple ((kx,ky,kz), (sx,sy,sz), (px,py,pz), (dx,dy,dz)) and
 * checks it with errors that name `fn`, the field and the rule (the core's
 * tl_geom_check returns only a status).  Returns 1, or 0 with an exception set. */
int tl_parse_geom(const char *fn, PyObject *tuple, tl_geom *g);

/* Bytes of the description a failing CUDA call leaves in tl_ctx.err. */
#define TL_PY_ERR_BYTES 512

/* Where one call runs.  Filled by tl_py_parse and never copied afterwards:
 * ctx.err points into err. */
typedef struct tl_py_call {
    tl_ctx ctx;
    int cuda;
    char err[TL_PY_ERR_BYTES];
} tl_py_call;

/* Parses a binding's arguments into `c` and the pointers after `fmt` (a
 * PyArg_ParseTuple format of the op's own arguments).  A CPU call (cuda 0)
 * ends with its OpenMP thread count; a CUDA call (cuda 1) starts with the
 * device index and torch's current stream handle.  Returns 1, or 0 with an
 * exception set. */
int tl_py_parse(PyObject *args, int cuda, tl_py_call *c, const char *fmt, ...);

/* Raises for the failed status st of `fn` (the name Python sees) and returns
 * NULL.  On the CPU the rules, where given, are appended to TL_ERR_INVALID
 * and TL_ERR_OVERFLOW.  For CUDA, TL_ERR_OVERFLOW gets the CUDA kernels' size
 * rule and TL_ERR_CUDA becomes a RuntimeError that names `entry` (the C
 * function), the failing CUDA call with its file and line when recorded, and
 * the runtime's error name and string; the runtime's last error is cleared,
 * since a non-sticky error left set would fail torch's next kernel launch. */
PyObject *tl_py_fail(const tl_py_call *c, tl_status st, const char *fn, const char *entry,
                     const char *invalid_rule, const char *overflow_rule);

/* The workspace of a CUDA entry point, which has just measured it: `sized` is
 * the status of its *_workspace_size call and `bytes` the size.  Calls the
 * Python callable alloc(bytes) -> int once (not for 0 bytes, which leaves
 * *ws NULL): torch allocates a buffer on the call's device and returns its
 * pointer, and the caller keeps the buffer alive until the entry point
 * returns.  Returns 1, or 0 with an exception set (alloc's own, e.g. torch's
 * out-of-memory error, propagates). */
int tl_py_workspace(const tl_py_call *c, const char *fn, tl_status sized, size_t bytes,
                    PyObject *alloc, void **ws);

/* Method tables of the op families, NULL-terminated; CUDA entry points only
 * in TL_WITH_CUDA builds. */
extern PyMethodDef tl_py_kmap_methods[];  /* tl_py_kmap.c: supports, kernel maps, pairs */
extern PyMethodDef tl_py_conv_methods[];  /* tl_py_conv.c: convolution dataflows */
extern PyMethodDef tl_py_pool_methods[];  /* tl_py_pool.c: pooling */
extern PyMethodDef tl_py_norm_methods[];  /* tl_py_norm.c: batch normalization */
extern PyMethodDef tl_py_voxel_methods[]; /* tl_py_voxel.c: voxelize, devoxelize */

#define TL_PY_METHOD(name) {#name, py_##name, METH_VARARGS, name##_doc}

/* py_<name>, an entry point that is one call of its family's shared binding:
 * `call` is an expression in the entry point's `args`. */
#define TL_PY_FORWARD(name, call)                                                           \
    static PyObject *py_##name(PyObject *self, PyObject *args) {                            \
        (void)self;                                                                         \
        return call;                                                                        \
    }

#endif
