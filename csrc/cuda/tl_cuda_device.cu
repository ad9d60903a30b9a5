#include "tl_cuda_device.h"

#include <cuda_runtime.h>

extern "C" tl_status tl_cuda_device_count(int *count) {
    *count = 0;
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
        (void)cudaGetLastError(); /* clear the sticky-free error state */
        return TL_OK;
    }
    if (err != cudaSuccess) return TL_ERR_CUDA;
    *count = n;
    return TL_OK;
}
