/* Memory hints for large output buffers, and the cache size that sizes the
 * CPU kernels' tiles. */
#ifndef TL_MEM_H
#define TL_MEM_H

#include <stddef.h>
#include <stdint.h>

/* Asks the OS to back the 2 MiB-aligned interior of [p, p + bytes) with huge
 * pages when it is first touched (Linux MADV_HUGEPAGE; nothing elsewhere).
 * A large output tensor is usually a fresh mapping, and a 4 KiB page fault
 * per 4 KiB of it costs as much as a fifth of a convolution's arithmetic;
 * huge pages cut the faults 512-fold.  Only a hint: it cannot fail, changes
 * no data, and is skipped for buffers under TL_MEM_HUGE_MIN bytes. */
void tl_mem_prefer_huge(void *p, int64_t bytes);

#define TL_MEM_HUGE_MIN (8 << 20)

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
