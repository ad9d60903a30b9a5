/* Shared helpers of the CPython binding (tl_module.c and tl_py_*.c).
 *
 * Each area of the C core binds its functions in its own tl_py_<area>.c and
 * exports one method table here; PyInit__C adds every table to the module. */
#ifndef TL_PY_H
#define TL_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "tl_coords.h"
#include "tl_ctx.h"
#include "tl_status.h"

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

/* Method tables, one per area, NULL-terminated. */
extern PyMethodDef tl_py_core_methods[];  /* tl_module.c: coords, kernel maps, implicit GEMM */
extern PyMethodDef tl_py_dataflow_methods[]; /* tl_py_dataflow.c: pair maps, other dataflows */
extern PyMethodDef tl_py_blocks_methods[];    /* tl_py_blocks.c: voxelize, devoxelize, pooling */
extern PyMethodDef tl_py_cuda_methods[];     /* tl_py_cuda.c: CUDA entry points */
extern PyMethodDef tl_py_cuda_blocks_methods[]; /* tl_py_cuda_blocks.c: CUDA building blocks */

#endif
