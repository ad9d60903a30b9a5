/* Open-addressing hash table from a coordinate row (b, x, y, z) to a row
 * index.  Keys use the full int32 range of each field: there is no packing
 * and so no span limit.  Lookups are read-only and safe from many threads;
 * insertions are single-threaded. */
#ifndef TL_HASH_H
#define TL_HASH_H

#include "tl_coords.h"

typedef struct tl_hash_slot {
    tl_coord key;
    int64_t value; /* < 0: empty slot */
} tl_hash_slot;

typedef struct tl_hash {
    tl_hash_slot *slots;
    uint64_t mask; /* capacity - 1; capacity is a power of two */
    int64_t size;
} tl_hash;

/* Allocates a table for at least `expected` keys (load factor <= 1/2). */
tl_status tl_hash_init(tl_hash *h, int64_t expected);
void tl_hash_free(tl_hash *h);

/* Inserts key -> value (value >= 0).  When the key is already present the
 * table is unchanged and *existing receives its value; otherwise *existing
 * is -1.  `existing` may be NULL. */
tl_status tl_hash_insert(tl_hash *h, tl_coord key, int64_t value,
                         int64_t *existing);

/* Grows the table so that `expected` keys fit; keeps every entry. */
tl_status tl_hash_reserve(tl_hash *h, int64_t expected);

/* Value stored for key, or -1. */
int64_t tl_hash_find(const tl_hash *h, tl_coord key);

/* Builds a table mapping rows[i] -> i.  TL_ERR_DUPLICATE on repeated rows,
 * with *dup_row (if not NULL) set to the second occurrence. */
tl_status tl_hash_build(tl_hash *h, const tl_coord *rows, int64_t n,
                        int64_t *dup_row);

#endif
