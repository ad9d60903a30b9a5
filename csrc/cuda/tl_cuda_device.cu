#include "tl_cuda_device.h"

#include <cuda_runtime.h>
#include <stdio.h>

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

extern "C" tl_status tl_cuda_device_capability(int index, int *major, int *minor) {
    if (!major || !minor) return TL_ERR_INVALID;
    *major = *minor = 0;
    int count = 0;
    const tl_status st = tl_cuda_device_count(&count);
    if (st != TL_OK) return st;
    if (index < 0 || index >= count) return TL_ERR_INVALID;
    if (cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, index) != cudaSuccess ||
        cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, index) != cudaSuccess) {
        (void)cudaGetLastError();
        return TL_ERR_CUDA;
    }
    return TL_OK;
}

extern "C" void tl_cuda_error_describe(char *buf, size_t size) {
    const cudaError_t e = cudaGetLastError();
    if (!buf || size == 0 || buf[0] != '\0') return;
    if (e == cudaSuccess)
        (void)snprintf(buf, size, "the CUDA runtime reports no error (cudaSuccess)");
    else
        (void)snprintf(buf, size, "%s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
}
