/* Aligned scratch for the CPU kernels, and the cache size that sizes their
 * tiles.  Outputs get no huge-page hint (MADV_HUGEPAGE): where Linux
 * defragments on demand for hinted memory (transparent_hugepage/defrag
 * "madvise", the kernel's default) a hinted fault can compact memory on the
 * spot, and SparseResUNet42 ran 1.1-1.3x faster without the hint
 * (docs/benchmarks, round fourteen). */
#ifndef TL_MEM_H
#define TL_MEM_H

#include <stddef.h>
#include <stdint.h>

/* malloc for buffers the kernels read and write as whole vectors: at least
 * `bytes` (0 counts as 1), 64-byte aligned, released with free().  A
 * 64-byte vector at a 16-byte offset spans two cache lines, and an Intel
 * core spends two load slots on it: packed weight panels aligned ran the
 * forward 1.10-1.21x faster there (docs/benchmarks, round thirteen). */
void *tl_mem_aligned(size_t bytes);

/* Bytes of one core's L2 cache as the C library reports it (glibc's
 * sysconf(_SC_LEVEL2_CACHE_SIZE)), or 0 where it reports none. */
int64_t tl_mem_l2_bytes(void);

#endif
