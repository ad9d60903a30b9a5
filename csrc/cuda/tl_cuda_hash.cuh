/* GPU hash table of coordinate rows.
 *
 * Design: open addressing with linear probing over int32 slots.  A slot
 * holds the *row index* of its key in a coordinate array that stays in
 * device memory while the table is used (-1: empty); the key itself is read
 * from that array.  So keys keep the full int32 range of b, x, y and z (no
 * packing, no span limit) and a slot is claimed by one 32-bit atomicCAS
 * (-1 -> row): a claimed slot never changes, and the row it points to is
 * immutable, so no lock and no partially written key can be observed.
 *
 * Insert (one thread per row, all concurrently): probe from hash(key); CAS
 * the slot; on success done; otherwise compare the key of the row found
 * there: equal means a duplicate, else probe on.  Two threads inserting the
 * same key walk the same probe sequence, so the loser always meets the
 * winner's row and reports the duplicate.  Lookups run in a later kernel
 * (stream order makes every insert visible) and are read-only.  Capacity is
 * a power of two >= 2 * rows, so probe sequences end at an empty slot. */
#ifndef TL_CUDA_HASH_CUH
#define TL_CUDA_HASH_CUH

#include "tl_cuda_common.cuh"

/* Odd 64-bit multipliers of the key mix (golden ratio, splitmix64); the
 * device table is independent of the CPU one, only its contents matter. */
#define TL_CUDA_HASH_M0 0x9E3779B97F4A7C15ULL
#define TL_CUDA_HASH_M1 0xBF58476D1CE4E5B9ULL
#define TL_CUDA_HASH_M2 0x94D049BB133111EBULL
#define TL_CUDA_HASH_EMPTY (-1)

/* Slots for n keys: a power of two >= 2n and >= 16 (load factor <= 1/2). */
static inline int64_t tl_cuda_hash_capacity(int64_t n) {
    int64_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    return cap;
}

__device__ __forceinline__ unsigned long long tl_cuda_hash_mix(tl_coord k) {
    unsigned long long a = ((unsigned long long)(unsigned)k.b << 32) | (unsigned)k.x;
    unsigned long long c = ((unsigned long long)(unsigned)k.y << 32) | (unsigned)k.z;
    unsigned long long h = a * TL_CUDA_HASH_M0 ^ c * TL_CUDA_HASH_M1;
    h ^= h >> 31;
    h *= TL_CUDA_HASH_M2;
    h ^= h >> 29;
    return h;
}

__device__ __forceinline__ bool tl_cuda_coord_eq(tl_coord a, tl_coord b) {
    return a.b == b.b && a.x == b.x && a.y == b.y && a.z == b.z;
}

/* Inserts row `row` of `keys`.  Returns true when it claimed a slot, false
 * when an equal key was already present. */
__device__ __forceinline__ bool tl_cuda_hash_insert(int *slots, unsigned long long mask,
                                                    const tl_coord *keys, int row) {
    const tl_coord key = keys[row];
    unsigned long long s = tl_cuda_hash_mix(key) & mask;
    for (;;) {
        int prev = atomicCAS(&slots[s], TL_CUDA_HASH_EMPTY, row);
        if (prev == TL_CUDA_HASH_EMPTY) return true;
        if (tl_cuda_coord_eq(keys[prev], key)) return false;
        s = (s + 1) & mask;
    }
}

/* Row of `keys` equal to key, or -1. */
__device__ __forceinline__ int tl_cuda_hash_find(const int *slots, unsigned long long mask,
                                                 const tl_coord *keys, tl_coord key) {
    unsigned long long s = tl_cuda_hash_mix(key) & mask;
    for (;;) {
        int row = slots[s];
        if (row == TL_CUDA_HASH_EMPTY) return -1;
        if (tl_cuda_coord_eq(keys[row], key)) return row;
        s = (s + 1) & mask;
    }
}

#endif
