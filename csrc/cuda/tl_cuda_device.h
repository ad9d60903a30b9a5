/* CUDA runtime queries the C core needs before launching anything, and the
 * description of a failed CUDA call.  Built only when setup.py compiles
 * csrc/cuda (TL_WITH_CUDA). */
#ifndef TL_CUDA_DEVICE_H
#define TL_CUDA_DEVICE_H

#include <stddef.h>

#include "../core/tl_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices.  A machine without a GPU or driver is not an
 * error: *count is 0 and TL_OK is returned. */
tl_status tl_cuda_device_count(int *count);

/* Compute capability (major, minor) of device `index`.  TL_ERR_INVALID for
 * an index outside [0, count), TL_ERR_CUDA when the runtime fails. */
tl_status tl_cuda_device_capability(int index, int *major, int *minor);

/* Completes the description of an entry point that returned TL_ERR_CUDA.
 * buf (size bytes) holds what the failing check recorded through
 * tl_ctx.err, or "" when the failure happened where no context was in
 * scope; then the runtime's last error is written instead ("cudaErrorName
 * (description)", or a note that the runtime reports none).  Always clears
 * the runtime's last error, so a non-sticky error does not fail the next
 * call as well. */
void tl_cuda_error_describe(char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif
