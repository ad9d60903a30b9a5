/* Helpers shared by every .cu file of csrc/cuda (host side and device side).
 *
 * The .cu files are compiled without relocatable device code, so device
 * functions used by more than one file live in headers like this one; host
 * launchers that other files call are declared here and defined once. */
#ifndef TL_CUDA_COMMON_CUH
#define TL_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tl_cuda.h"

/* Threads per block of every kernel in csrc/cuda (block scans assume it). */
#define TL_CUDA_THREADS 256
#define TL_CUDA_WARPS (TL_CUDA_THREADS / 32)
/* Alignment of every sub-buffer carved out of a caller's workspace. */
#define TL_CUDA_WS_ALIGN 256
/* Grid-stride kernels use at most this many blocks. */
#define TL_CUDA_MAX_BLOCKS (1 << 20)

/* Records a failed CUDA call in ctx->err (the first failure of an entry
 * point wins; later ones keep it) and returns TL_ERR_CUDA.  The text is
 * "csrc/cuda/FILE.cu:LINE: CALL: cudaErrorName (description)". */
static inline tl_status tl_cuda_fail(const tl_ctx *ctx, cudaError_t e, const char *call,
                                     const char *file, int line) {
    if (ctx && ctx->err && ctx->err_size > 0 && ctx->err[0] == '\0') {
        const char *rel = strstr(file, "csrc/");
        (void)snprintf(ctx->err, ctx->err_size, "%s:%d: %s: %s (%s)", rel ? rel : file, line,
                       call, cudaGetErrorName(e), cudaGetErrorString(e));
    }
    return TL_ERR_CUDA;
}

/* The context the check macros below record into.  A function that has one
 * declares TL_CUDA_ERRORS_TO(ctx), which shadows this null constant; in
 * helpers without a context only the status travels, and the binding
 * describes the failure from cudaGetLastError() and the entry point's name
 * (tl_cuda_error_describe in tl_cuda_device.h). */
static const tl_ctx *const tl_cuda_err_ctx = NULL;
#define TL_CUDA_ERRORS_TO(ctx) const tl_ctx *const tl_cuda_err_ctx = (ctx)

/* Returns TL_ERR_CUDA from the enclosing function when a runtime call fails. */
#define TL_CUDA_TRY(call)                                                                     \
    do {                                                                                      \
        cudaError_t tl_e_ = (call);                                                           \
        if (tl_e_ != cudaSuccess)                                                             \
            return tl_cuda_fail(tl_cuda_err_ctx, tl_e_, #call, __FILE__, __LINE__);          \
    } while (0)

/* Checks the launch just made (bad configuration, missing kernel image).  It
 * peeks rather than clears, so that where no context is in scope the
 * binding can still read the error; the binding clears it. */
#define TL_CUDA_LAUNCHED() TL_CUDA_TRY(cudaPeekAtLastError())

#define TL_CUDA_RETURN_IF(...)                                                                \
    do {                                                                                      \
        tl_status tl_st_ = (__VA_ARGS__);                                                     \
        if (tl_st_ != TL_OK) return tl_st_;                                                   \
    } while (0)

/* Makes ctx->device current for one entry point and restores the caller's
 * device on scope exit: torch's runtime and ours share the thread's current
 * context, so leaving it changed would move torch's current device. */
class tl_cuda_scope {
  public:
    tl_cuda_scope() : prev_(-1), restore_(false) {}
    ~tl_cuda_scope() {
        if (restore_) (void)cudaSetDevice(prev_);
    }
    tl_status enter(const tl_ctx *ctx, cudaStream_t *stream) {
        if (!ctx || ctx->device < 0) return TL_ERR_INVALID;
        TL_CUDA_ERRORS_TO(ctx);
        /* Launch checks peek at the runtime's last error, so a non-sticky
         * error left by earlier work (not ours) is cleared here rather than
         * reported as this call's. */
        (void)cudaGetLastError();
        TL_CUDA_TRY(cudaGetDevice(&prev_));
        if (prev_ != ctx->device) {
            TL_CUDA_TRY(cudaSetDevice(ctx->device));
            restore_ = true;
        }
        *stream = (cudaStream_t)ctx->stream;
        return TL_OK;
    }

  private:
    tl_cuda_scope(const tl_cuda_scope &) = delete;
    tl_cuda_scope &operator=(const tl_cuda_scope &) = delete;
    int prev_;
    bool restore_;
};

/* Workspace layout: sub-buffers are laid out in call order, each aligned, so
 * the size function and the entry point share one layout routine. */
struct tl_cuda_ws {
    size_t used;
    char *base; /* NULL while only measuring */
    bool overflow;
};

static inline tl_cuda_ws tl_cuda_ws_begin(void *base) {
    tl_cuda_ws w = {0, (char *)base, false};
    return w;
}

/* Reserves count * elem bytes; returns the sub-buffer (NULL when measuring). */
static inline void *tl_cuda_ws_take(tl_cuda_ws *w, int64_t count, size_t elem) {
    if (count < 0 || (uint64_t)count > (SIZE_MAX / 4) / elem) {
        w->overflow = true;
        return NULL;
    }
    size_t bytes = ((size_t)count * elem + TL_CUDA_WS_ALIGN - 1) & ~(size_t)(TL_CUDA_WS_ALIGN - 1);
    if (w->used > SIZE_MAX / 4 - bytes) {
        w->overflow = true;
        return NULL;
    }
    void *p = w->base ? (void *)(w->base + w->used) : NULL;
    w->used += bytes;
    return p;
}

/* A workspace must be aligned like torch's allocations (>= 256 bytes). */
static inline bool tl_cuda_ws_ok(const void *base, size_t bytes) {
    if (bytes == 0) return true;
    return base != NULL && ((uintptr_t)base % TL_CUDA_WS_ALIGN) == 0;
}

/* Blocks for a grid-stride loop over n items. */
static inline unsigned tl_cuda_blocks(int64_t n) {
    int64_t b = (n + TL_CUDA_THREADS - 1) / TL_CUDA_THREADS;
    if (b < 1) b = 1;
    if (b > TL_CUDA_MAX_BLOCKS) b = TL_CUDA_MAX_BLOCKS;
    return (unsigned)b;
}

static inline int64_t tl_cuda_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Copies n bytes from the device to the host and waits for the stream: the
 * only synchronizations in csrc/cuda, used where a count or an error flag
 * must reach the host. */
static inline tl_status tl_cuda_read_back(void *host, const void *dev, size_t n,
                                          cudaStream_t stream) {
    TL_CUDA_TRY(cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, stream));
    TL_CUDA_TRY(cudaStreamSynchronize(stream));
    return TL_OK;
}

/* ---- device-wide exclusive scan of int64 values (tl_cuda_scan.cu) ---- */

/* Elements per block of the scan kernels: 256 threads x 4 items. */
#define TL_CUDA_SCAN_TILE 1024

/* long long scratch elements tl_cuda_scan needs for n values. */
int64_t tl_cuda_scan_scratch(int64_t n);

/* out[j] = in[0] + ... + in[j-1] for j < n (in == out allowed); *total (a
 * device pointer, may be NULL) receives the sum of all n values.  Enqueued
 * on `stream`, no synchronization. */
tl_status tl_cuda_scan(const long long *in, long long *out, int64_t n, long long *scratch,
                       long long *total, cudaStream_t stream);

/* The OR of v over the 32 lanes of a full warp, in every lane. */
__device__ __forceinline__ unsigned tl_warp_or(unsigned v) {
    for (int d = 16; d > 0; d >>= 1) v |= __shfl_xor_sync(0xffffffffu, v, d);
    return v;
}

/* Exclusive scan across one block of TL_CUDA_THREADS threads; every thread
 * must call it.  Returns the thread's exclusive prefix; *total receives the
 * block total in every thread. */
__device__ __forceinline__ long long tl_block_exclusive_scan(long long v, long long *total) {
    __shared__ long long warp_sums[TL_CUDA_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    long long incl = v;
    for (int d = 1; d < 32; d <<= 1) {
        long long u = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += u;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        long long s = lane < TL_CUDA_WARPS ? warp_sums[lane] : 0;
        for (int d = 1; d < TL_CUDA_WARPS; d <<= 1) {
            long long u = __shfl_up_sync(0xffffffffu, s, d);
            if (lane >= d) s += u;
        }
        if (lane < TL_CUDA_WARPS) warp_sums[lane] = s; /* now inclusive over warps */
    }
    __syncthreads();
    long long base = warp ? warp_sums[warp - 1] : 0;
    *total = warp_sums[TL_CUDA_WARPS - 1];
    __syncthreads(); /* warp_sums may be reused by the caller's next scan */
    return base + incl - v;
}

#endif
