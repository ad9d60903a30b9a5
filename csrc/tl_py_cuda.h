/* Helpers shared by the CUDA bindings (tl_py_cuda.c, tl_py_cuda_blocks.c):
 * the call context, and a status turned into an exception.  Only for
 * TL_WITH_CUDA builds. */
#ifndef TL_PY_CUDA_H
#define TL_PY_CUDA_H

#include "cuda/tl_cuda_device.h"
#include "tl_py.h"

/* Bytes of the description a failing CUDA call leaves in tl_ctx.err. */
#define TL_CUDA_ERR_BYTES 512

/* Context of one call: device index and stream handle from Python, and the
 * caller's buffer (err, TL_CUDA_ERR_BYTES) for a failure's description. */
static inline tl_ctx tl_cuda_ctx(int device, unsigned long long stream, char *err) {
    err[0] = '\0';
    tl_ctx ctx = {.threads = 1,
                  .device = device,
                  .stream = tl_ptr(stream),
                  .simd_cap = 0,
                  .err = err,
                  .err_size = TL_CUDA_ERR_BYTES};
    return ctx;
}

/* tl_raise for a CUDA entry point: TL_ERR_OVERFLOW gets its rule (the size
 * limits of the CUDA kernels); TL_ERR_CUDA becomes a RuntimeError that
 * names `fn`, the entry point, the failing CUDA call with its file and line
 * when recorded, and the runtime's error name and string.  It also clears the
 * runtime's last error: launch checks only peek at it, and a non-sticky error
 * left set would fail torch's next kernel launch in this process. */
static inline PyObject *tl_cuda_raise(const char *fn, const char *entry, tl_status st,
                                      const tl_ctx *ctx) {
    if (st == TL_ERR_OVERFLOW)
        return tl_raise_rule(fn, st,
                             "rows and kernel rows must be <= 2^31 - 1 (int32 indices) and "
                             "every size product, workspace and launch grid must fit its type");
    if (st != TL_ERR_CUDA) return tl_raise(fn, st);
    tl_cuda_error_describe(ctx->err, ctx->err_size);
    PyErr_Format(PyExc_RuntimeError, "torch_lattice._C.%s: CUDA error in %s: %s", fn, entry,
                 ctx->err);
    return NULL;
}

/* Result of a *_workspace_size call.  The size function must have run before
 * this call: passing its call and `bytes` as two arguments of one call leaves
 * their order unspecified (gcc read bytes, still 0, first). */
static inline PyObject *tl_size_result(const char *fn, tl_status st, size_t bytes) {
    if (st != TL_OK) return tl_raise(fn, st);
    return PyLong_FromSize_t(bytes);
}

#endif
