/* Execution context passed to every entry point that does parallel or
 * device work.  It replaces global state: thread count (from
 * torch.get_num_threads()), and for CUDA the device and stream. */
#ifndef TL_CTX_H
#define TL_CTX_H

typedef struct tl_ctx {
    int threads;  /* OpenMP threads for this call, >= 1 */
    int device;   /* CUDA device index; unused on CPU */
    void *stream; /* cudaStream_t of torch's current stream; unused on CPU */
} tl_ctx;

#endif
