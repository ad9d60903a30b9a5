/* CUDA runtime queries the C core needs before launching anything.  Built
 * only when setup.py compiles csrc/cuda (TL_WITH_CUDA). */
#ifndef TL_CUDA_DEVICE_H
#define TL_CUDA_DEVICE_H

#include "../tl_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices.  A machine without a GPU or driver is not an
 * error: *count is 0 and TL_OK is returned. */
tl_status tl_cuda_device_count(int *count);

#ifdef __cplusplus
}
#endif

#endif
