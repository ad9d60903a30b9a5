/* Status codes shared by every C entry point of Torch Lattice.
 *
 * Functions that can fail return enum tl_status; results travel through
 * out-parameters.  The extension module (csrc/python/tl_py_module.c) is the
 * only place that turns a status into a Python exception. */
#ifndef TL_STATUS_H
#define TL_STATUS_H

typedef enum tl_status {
    TL_OK = 0,
    TL_ERR_INVALID = -1,     /* an argument breaks the function's contract */
    TL_ERR_NOMEM = -2,       /* malloc failed */
    TL_ERR_OVERFLOW = -3,    /* a size or coordinate does not fit its type */
    TL_ERR_DUPLICATE = -4,   /* a coordinate row appears twice */
    TL_ERR_CAPACITY = -5,    /* caller's output buffer is too small */
    TL_ERR_UNSUPPORTED = -6, /* dtype or device not built into this binary */
    TL_ERR_CUDA = -7         /* a CUDA runtime call failed */
} tl_status;

/* Static, human-readable description of a status; never NULL. */
const char *tl_status_str(tl_status s);

#endif
