/* madvise and sysconf's cache names are not C11: ask for their declarations. */
#define _DEFAULT_SOURCE 1
#include "tl_mem.h"

#include <stdlib.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

void tl_mem_prefer_huge(void *p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)2 << 20;
    if (!p || bytes < TL_MEM_HUGE_MIN) return;
    uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    uintptr_t hi = ((uintptr_t)p + (uintptr_t)bytes) & ~(huge - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p;
    (void)bytes;
#endif
}

int64_t tl_mem_l2_bytes(void) {
#if defined(_SC_LEVEL2_CACHE_SIZE)
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? (int64_t)l2 : 0;
#else
    return 0;
#endif
}

void *tl_mem_aligned(size_t bytes) {
    const size_t size = bytes == 0 ? 64 : (bytes + 63) / 64 * 64; /* aligned_alloc's rule */
    return aligned_alloc(64, size);
}
