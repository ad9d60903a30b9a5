/* sysconf's cache names are not C11: ask for their declarations. */
#define _DEFAULT_SOURCE 1
#include "tl_mem.h"

#include <stdlib.h>
#include <unistd.h>

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
