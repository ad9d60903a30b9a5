#include "tl_hash.h"

#include <stdlib.h>

/* Multipliers of the key mix: odd 64-bit constants with well-spread bits
 * (golden ratio and two splitmix64 constants).  Defined here only. */
#define TL_HASH_M0 0x9E3779B97F4A7C15ULL
#define TL_HASH_M1 0xBF58476D1CE4E5B9ULL
#define TL_HASH_M2 0x94D049BB133111EBULL

static uint64_t tl_hash_mix(tl_coord k) {
    uint64_t a = ((uint64_t)(uint32_t)k.b << 32) | (uint32_t)k.x;
    uint64_t c = ((uint64_t)(uint32_t)k.y << 32) | (uint32_t)k.z;
    uint64_t h = a * TL_HASH_M0 ^ c * TL_HASH_M1;
    h ^= h >> 31;
    h *= TL_HASH_M2;
    h ^= h >> 29;
    return h;
}

static int tl_coord_eq(tl_coord a, tl_coord b) {
    return a.b == b.b && a.x == b.x && a.y == b.y && a.z == b.z;
}

tl_status tl_hash_init(tl_hash *h, int64_t expected) {
    h->slots = NULL;
    h->mask = 0;
    h->size = 0;
    if (expected < 0) return TL_ERR_INVALID;
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)expected) {
        if (cap > (SIZE_MAX / sizeof(tl_hash_slot)) / 2) return TL_ERR_OVERFLOW;
        cap *= 2;
    }
    h->slots = malloc(cap * sizeof(tl_hash_slot));
    if (!h->slots) return TL_ERR_NOMEM;
    for (uint64_t i = 0; i < cap; i++) h->slots[i].value = -1;
    h->mask = cap - 1;
    return TL_OK;
}

void tl_hash_free(tl_hash *h) {
    free(h->slots);
    h->slots = NULL;
    h->mask = 0;
    h->size = 0;
}

tl_status tl_hash_insert(tl_hash *h, tl_coord key, int64_t value,
                         int64_t *existing) {
    if (existing) *existing = -1;
    if (value < 0) return TL_ERR_INVALID;
    /* Keep the load factor <= 1/2 so probes stay short. */
    if ((uint64_t)(h->size + 1) * 2 > h->mask + 1) return TL_ERR_CAPACITY;
    uint64_t i = tl_hash_mix(key) & h->mask;
    for (;;) {
        tl_hash_slot *s = &h->slots[i];
        if (s->value < 0) {
            s->key = key;
            s->value = value;
            h->size++;
            return TL_OK;
        }
        if (tl_coord_eq(s->key, key)) {
            if (existing) *existing = s->value;
            return TL_OK;
        }
        i = (i + 1) & h->mask;
    }
}

tl_status tl_hash_reserve(tl_hash *h, int64_t expected) {
    if ((uint64_t)expected * 2 <= h->mask + 1) return TL_OK;
    tl_hash bigger;
    tl_status st = tl_hash_init(&bigger, expected);
    if (st != TL_OK) return st;
    for (uint64_t i = 0; i <= h->mask; i++) {
        if (h->slots[i].value >= 0)
            (void)tl_hash_insert(&bigger, h->slots[i].key, h->slots[i].value, NULL);
    }
    tl_hash_free(h);
    *h = bigger;
    return TL_OK;
}

int64_t tl_hash_find(const tl_hash *h, tl_coord key) {
    uint64_t i = tl_hash_mix(key) & h->mask;
    for (;;) {
        const tl_hash_slot *s = &h->slots[i];
        if (s->value < 0) return -1;
        if (tl_coord_eq(s->key, key)) return s->value;
        i = (i + 1) & h->mask;
    }
}

tl_status tl_hash_build(tl_hash *h, const tl_coord *rows, int64_t n,
                        int64_t *dup_row) {
    if (dup_row) *dup_row = -1;
    tl_status st = tl_hash_init(h, n);
    if (st != TL_OK) return st;
    for (int64_t i = 0; i < n; i++) {
        int64_t prev;
        st = tl_hash_insert(h, rows[i], i, &prev);
        if (st != TL_OK) goto fail;
        if (prev >= 0) {
            if (dup_row) *dup_row = i;
            st = TL_ERR_DUPLICATE;
            goto fail;
        }
    }
    return TL_OK;
fail:
    tl_hash_free(h);
    return st;
}
