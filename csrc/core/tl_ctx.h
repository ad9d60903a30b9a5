/* Execution context passed to every entry point that does parallel or
 * device work.  It replaces global state: thread count (from
 * torch.get_num_threads()) and the micro-kernels' instruction set on the CPU,
 * and for CUDA the device and stream. */
#ifndef TL_CTX_H
#define TL_CTX_H

#include <stddef.h>

typedef struct tl_ctx {
    int threads;  /* OpenMP threads for this call, >= 1 */
    int device;   /* CUDA device index; unused on CPU */
    void *stream; /* cudaStream_t of torch's current stream; unused on CPU */
    int simd_cap; /* CPU: widest micro-kernel instruction set allowed (a tl_simd
                     value; TL_SIMD_V4_AMX = whatever the CPU has) */
    /* CUDA: the caller's buffer (err_size bytes, starting as "") where the
     * first failing CUDA call of an entry point describes itself: its file
     * and line, the call and the runtime's error name and string.  NULL/0
     * records nothing.  Only the CUDA code reads it. */
    char *err;
    size_t err_size;
} tl_ctx;

#include <stdint.h>

/* Below this much work (roughly multiply-adds or row visits) a parallel
 * region costs more than it saves: waking threads takes microseconds, and
 * much more when the cores are busy with other processes. */
#define TL_PARALLEL_MIN_WORK (1 << 16)

/* Threads to use for a region of `work` units: 1 for small regions. */
static inline int tl_threads_for(const tl_ctx *ctx, int64_t work) {
    return work < TL_PARALLEL_MIN_WORK ? 1 : ctx->threads;
}

#endif
