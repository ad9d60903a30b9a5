#include "tl_coords.h"

#include <stdlib.h>
#include <string.h>

#include "tl_hash.h"

tl_status tl_geom_check(const tl_geom *g, int64_t *volume) {
    int64_t k = 1;
    for (int a = 0; a < 3; a++) {
        if (g->kernel_size[a] < 1 || g->stride[a] < 1 || g->dilation[a] < 1 ||
            g->padding[a] < 0)
            return TL_ERR_INVALID;
        k *= g->kernel_size[a];
        if (k > TL_ROW_MAX) return TL_ERR_OVERFLOW;
    }
    *volume = k;
    return TL_OK;
}

void tl_geom_position(const tl_geom *g, int64_t n, int32_t r[3]) {
    r[2] = (int32_t)(n % g->kernel_size[2]);
    n /= g->kernel_size[2];
    r[1] = (int32_t)(n % g->kernel_size[1]);
    r[0] = (int32_t)(n / g->kernel_size[1]);
}

static int64_t tl_gcd(int64_t a, int64_t b) {
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Along one axis, r*d hits a fixed residue mod s once every s/gcd(s,d)
 * rows, so an input reaches at most ceil(K*gcd/s) outputs per axis (and no
 * more than the axis has). */
static int64_t tl_axis_reach(const tl_geom *g, int a, int64_t range) {
    const int64_t period = g->stride[a] / tl_gcd(g->stride[a], g->dilation[a]);
    const int64_t c = (g->kernel_size[a] + period - 1) / period;
    return c < range ? c : range;
}

tl_status tl_coords_generate_bound(int64_t n_in, const tl_geom *g,
                                   const int64_t out_range[3], int64_t n_batches,
                                   int64_t *bound) {
    int64_t k;
    tl_status st = tl_geom_check(g, &k);
    if (st != TL_OK) return st;
    if (n_in < 0 || n_batches < 0) return TL_ERR_INVALID;
    int64_t per_in = 1, grid = n_batches;
    for (int a = 0; a < 3; a++) {
        if (out_range[a] < 0) return TL_ERR_INVALID;
        per_in *= tl_axis_reach(g, a, out_range[a]);
        grid = (grid > 0 && out_range[a] > INT64_MAX / grid) ? INT64_MAX
                                                              : grid * out_range[a];
    }
    int64_t b = (per_in > 0 && n_in > INT64_MAX / per_in) ? INT64_MAX : n_in * per_in;
    *bound = b < grid ? b : grid;
    return TL_OK;
}

static int tl_bits(uint32_t v) {
    int n = 0;
    while (v) {
        n++;
        v >>= 1;
    }
    return n;
}

static int tl_coord_cmp(const void *pa, const void *pb) {
    const tl_coord *a = pa, *b = pb;
    if (a->b != b->b) return a->b < b->b ? -1 : 1;
    if (a->x != b->x) return a->x < b->x ? -1 : 1;
    if (a->y != b->y) return a->y < b->y ? -1 : 1;
    if (a->z != b->z) return a->z < b->z ? -1 : 1;
    return 0;
}

/* LSD radix sort of 64-bit keys, only over the bytes that carry bits. */
static tl_status tl_radix_sort_u64(uint64_t *keys, int64_t n, int bits) {
    uint64_t *tmp = malloc(sizeof(uint64_t) * (size_t)n);
    if (!tmp) return TL_ERR_NOMEM;
    uint64_t *src = keys, *dst = tmp;
    for (int shift = 0; shift < bits; shift += 8) {
        int64_t count[257] = {0};
        for (int64_t i = 0; i < n; i++) count[((src[i] >> shift) & 0xFF) + 1]++;
        for (int d = 0; d < 256; d++) count[d + 1] += count[d];
        for (int64_t i = 0; i < n; i++) dst[count[(src[i] >> shift) & 0xFF]++] = src[i];
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != keys) memcpy(keys, src, sizeof(uint64_t) * (size_t)n);
    free(tmp);
    return TL_OK;
}

/* Bits each field of non-negative rows needs (b, x, y, z: the OR of all
 * rows); returns their sum. */
static int tl_key_bits(const tl_coord *rows, int64_t n, int bits[4]) {
    uint32_t m[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < n; i++) {
        m[0] |= (uint32_t)rows[i].b;
        m[1] |= (uint32_t)rows[i].x;
        m[2] |= (uint32_t)rows[i].y;
        m[3] |= (uint32_t)rows[i].z;
    }
    int total = 0;
    for (int a = 0; a < 4; a++) total += bits[a] = tl_bits(m[a]);
    return total;
}

/* Each row as one key, b in the high bits down to z (sum of bits <= 64), so
 * keys order like the rows and are equal exactly when the rows are. */
static void tl_pack_keys(const tl_coord *rows, int64_t n, const int bits[4], uint64_t *keys) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t k = (uint64_t)(uint32_t)rows[i].b;
        k = (bits[1] ? k << bits[1] : k) | (uint32_t)rows[i].x;
        k = (bits[2] ? k << bits[2] : k) | (uint32_t)rows[i].y;
        k = (bits[3] ? k << bits[3] : k) | (uint32_t)rows[i].z;
        keys[i] = k;
    }
}

/* The row a packed key (tl_pack_keys, bits per field) stands for. */
static tl_coord tl_unpack_key(uint64_t k, const int bits[4]) {
    int32_t f[4];
    for (int a = 3; a >= 0; a--) {
        f[a] = (int32_t)(k & ((1ULL << bits[a]) - 1)); /* each field < 2^31 */
        k = bits[a] ? k >> bits[a] : k;
    }
    return (tl_coord){f[0], f[1], f[2], f[3]};
}

/* Non-negative rows[0..n) (n >= 1) as packed keys, sorted: *keys (the
 * caller frees it) and their layout bits[4]; TL_ERR_UNSUPPORTED (nothing
 * allocated) where the fields need more than 64 bits. */
static tl_status tl_sorted_packed(const tl_coord *rows, int64_t n, int bits[4], uint64_t **keys) {
    const int total = tl_key_bits(rows, n, bits);
    *keys = NULL;
    if (total > 64) return TL_ERR_UNSUPPORTED;
    *keys = malloc(sizeof(uint64_t) * (size_t)n);
    if (!*keys) return TL_ERR_NOMEM;
    tl_pack_keys(rows, n, bits, *keys);
    return tl_radix_sort_u64(*keys, n, total);
}

/* Output positions one input coordinate reaches along one axis. */
static int tl_axis_targets(int64_t c, const tl_geom *g, int a, int64_t range,
                           int32_t *q) {
    int m = 0;
    for (int32_t r = 0; r < g->kernel_size[a]; r++) {
        int64_t t = c + g->padding[a] - (int64_t)r * g->dilation[a];
        if (t < 0 || t % g->stride[a] != 0) continue;
        t /= g->stride[a];
        if (t < range) q[m++] = (int32_t)t;
    }
    return m;
}

tl_status tl_axis_plan_init(tl_axis_plan *pl, const tl_geom *g, int a, int64_t range) {
    *pl = (tl_axis_plan){g->stride[a], g->padding[a], range, 0, -1, NULL, NULL};
    if (pl->s > TL_PLAN_MAX_STRIDE || g->kernel_size[a] > TL_PLAN_MAX_W) return TL_OK;
    for (int b = 0; b < 7; b++)
        if (pl->s == (int64_t)1 << b) pl->shift = b;
    const int k = g->kernel_size[a];
    pl->dq = malloc(sizeof(int64_t) * (size_t)(pl->s * k));
    pl->r = malloc(sizeof(int32_t) * (size_t)(pl->s * k));
    if (!pl->dq || !pl->r) {
        tl_axis_plan_free(pl);
        return TL_ERR_NOMEM;
    }
    for (int64_t rho = 0; rho < pl->s; rho++) {
        int n = 0;
        for (int32_t r = 0; r < k; r++) {
            const int64_t v = rho - (int64_t)r * g->dilation[a];
            if (v % pl->s) continue;
            pl->dq[rho * k + n] = v / pl->s;
            pl->r[rho * k + n++] = r;
        }
        for (int j = n; j < k; j++) {
            pl->dq[rho * k + j] = TL_PLAN_NONE;
            pl->r[rho * k + j] = 0;
        }
        pl->w = n > pl->w ? n : pl->w;
    }
    /* Rows of w: the table is read with stride w (each row moves down). */
    for (int64_t rho = 0; rho < pl->s; rho++)
        for (int j = 0; j < pl->w; j++) {
            pl->dq[rho * pl->w + j] = pl->dq[rho * k + j];
            pl->r[rho * pl->w + j] = pl->r[rho * k + j];
        }
    return TL_OK;
}

void tl_axis_plan_free(tl_axis_plan *pl) {
    free(pl->dq);
    free(pl->r);
    pl->dq = NULL;
    pl->r = NULL;
}

/* tl_axis_targets through the axis's plan where it has one: the same
 * targets in the same order (q holds at least the plan's w entries). */
static inline __attribute__((always_inline)) int tl_axis_hits(const tl_axis_plan *pl,
                                                              const tl_geom *g, int a,
                                                              int64_t c, int32_t *q) {
    if (!pl->dq || c + pl->p < 0) return tl_axis_targets(c, g, a, pl->range, q);
    int32_t r[TL_PLAN_MAX_W];
    return tl_axis_plan_hits(pl, c, q, r);
}

static tl_status tl_generate_into(const tl_coord *in, int64_t n_in, const tl_geom *g,
                                  const tl_axis_plan plan[3], tl_hash *seen,
                                  int32_t *qbuf) {
    int32_t *qx = qbuf, *qy = qbuf + g->kernel_size[0],
            *qz = qy + g->kernel_size[1];
    for (int64_t i = 0; i < n_in; i++) {
        int mx = tl_axis_hits(&plan[0], g, 0, in[i].x, qx);
        int my = tl_axis_hits(&plan[1], g, 1, in[i].y, qy);
        int mz = tl_axis_hits(&plan[2], g, 2, in[i].z, qz);
        for (int a = 0; a < mx; a++)
            for (int b = 0; b < my; b++)
                for (int c = 0; c < mz; c++) {
                    tl_coord q = {in[i].b, qx[a], qy[b], qz[c]};
                    if ((uint64_t)(seen->size + 1) * 2 > seen->mask + 1) {
                        tl_status st = tl_hash_reserve(seen, 2 * seen->size + 1);
                        if (st != TL_OK) return st;
                    }
                    tl_status st = tl_hash_insert(seen, q, seen->size, NULL);
                    if (st != TL_OK) return st;
                }
    }
    return TL_OK;
}

/* Inputs reaching at most this many outputs each (a 2x2x2 or 3x3x3 kernel
 * at stride 2: 1 or 8) are generated through their candidates' packed keys,
 * 8 bytes a candidate and as many again for the sort; kernels reaching more
 * (5x5x5 at stride 2: 27) use the hash table, whose size follows the
 * outputs instead of the candidates. */
#define TL_GENERATE_SORT_MAX_REACH 8

/* Candidates recently kept, by a hash of their key: neighbouring inputs
 * reach mostly the same outputs (a surface's k3 s2 p1 support: 7 inputs an
 * output), so most repeats are dropped here, before the sort, instead of
 * after it.  Keys stay below 2^63 (tl_generate_sorted), so the empty value
 * UINT64_MAX matches none. */
#define TL_RECENT_KEYS 256

typedef struct tl_recent {
    uint64_t key[TL_RECENT_KEYS];
} tl_recent;

static void tl_recent_init(tl_recent *r) {
    for (int j = 0; j < TL_RECENT_KEYS; j++) r->key[j] = UINT64_MAX;
}

/* 1 if key was not among the recent ones (it is now), else 0. */
static inline int tl_recent_new(tl_recent *r, uint64_t key) {
    uint64_t *slot = &r->key[(key * 0x9E3779B97F4A7C15ULL) >> 56];
    const int fresh = *slot != key;
    *slot = key;
    return fresh;
}

/* The candidates of tl_generate_sorted as packed keys (bits per field) into
 * keys, recent repeats skipped (tl_recent); returns their count.
 * Branch-free: a skipped key is written and then overwritten. */
static int64_t tl_candidates_any(const tl_coord *in, int64_t n_in, const tl_geom *g,
                                 const tl_axis_plan plan[3], const int bits[4], uint64_t *keys) {
    int32_t q[3][TL_GENERATE_SORT_MAX_REACH];
    int64_t c = 0;
    tl_recent recent;
    tl_recent_init(&recent);
    for (int64_t i = 0; i < n_in; i++) {
        const int mx = tl_axis_hits(&plan[0], g, 0, in[i].x, q[0]);
        const int my = tl_axis_hits(&plan[1], g, 1, in[i].y, q[1]);
        const int mz = tl_axis_hits(&plan[2], g, 2, in[i].z, q[2]);
        for (int x = 0; x < mx; x++)
            for (int y = 0; y < my; y++)
                for (int z = 0; z < mz; z++) {
                    const tl_coord r = {in[i].b, q[0][x], q[1][y], q[2][z]};
                    tl_pack_keys(&r, 1, bits, &keys[c]);
                    c += tl_recent_new(&recent, keys[c]);
                }
    }
    return c;
}

/* tl_candidates_any where every axis plan has one target per residue (a
 * kernel no larger than its stride, as k2 s2) and no coordinate is
 * negative: one candidate or none per input, no loop over targets
 * (1.27-1.36x on k2 s2 supports). */
static int64_t tl_candidates_single(const tl_coord *in, int64_t n_in, const tl_axis_plan plan[3],
                                    const int bits[4], uint64_t *keys) {
    int64_t c = 0;
    tl_recent recent;
    tl_recent_init(&recent);
    for (int64_t i = 0; i < n_in; i++) {
        const int32_t f[3] = {in[i].x, in[i].y, in[i].z};
        uint64_t key = (uint64_t)(uint32_t)in[i].b;
        int ok = 1;
        for (int a = 0; a < 3; a++) {
            const tl_axis_plan *pl = &plan[a];
            const int64_t v = (int64_t)f[a] + pl->p;
            const int64_t Q = pl->shift >= 0 ? v >> pl->shift : v / pl->s;
            const int64_t t = Q + pl->dq[v - Q * pl->s];
            ok &= (t >= 0) & (t < pl->range);
            key = (bits[a + 1] ? key << bits[a + 1] : key) | (uint64_t)(t & 0x7FFFFFFF);
        }
        keys[c] = key;
        c += ok && tl_recent_new(&recent, key);
    }
    return c;
}

/* The generated support through packed keys: each input's candidates as
 * keys (b, qx, qy, qz high to low; recent repeats skipped, as neighbouring
 * inputs often share theirs: tl_recent), sorted, unique ones
 * unpacked into out.  On a 1M-voxel height field (before the axis plans and
 * tl_recent) 4.5x (k2 s2) and 1.7x (k3 s2 p1) faster than inserting each
 * candidate into tl_hash (48 bytes a slot probed at random).
 * TL_ERR_UNSUPPORTED (nothing written) where the rows do not suit it: a
 * negative batch (tl_coords_sort decides those), keys wider than 63 bits or
 * kernels reaching more than TL_GENERATE_SORT_MAX_REACH outputs. */
static tl_status tl_generate_sorted(const tl_coord *in, int64_t n_in, const tl_geom *g,
                                    const tl_axis_plan plan[3], const int64_t out_range[3],
                                    tl_coord *out,
                                    int64_t capacity, int64_t *n_out) {
    int64_t reach = 1;
    for (int a = 0; a < 3; a++) { /* each axis too: q holds its targets */
        const int64_t r = tl_axis_reach(g, a, out_range[a]);
        if (r > TL_GENERATE_SORT_MAX_REACH || plan[a].w > TL_GENERATE_SORT_MAX_REACH)
            return TL_ERR_UNSUPPORTED;
        reach *= r;
    }
    if (reach > TL_GENERATE_SORT_MAX_REACH) return TL_ERR_UNSUPPORTED;
    uint32_t mb = 0;
    int32_t xyz = 0;
    for (int64_t i = 0; i < n_in; i++) {
        if (in[i].b < 0) return TL_ERR_UNSUPPORTED;
        mb |= (uint32_t)in[i].b;
        xyz |= in[i].x | in[i].y | in[i].z;
    }
    int bits[4] = {tl_bits(mb), 0, 0, 0}, total = bits[0];
    for (int a = 0; a < 3; a++)
        total += bits[a + 1] = out_range[a] > 0 ? tl_bits((uint32_t)(out_range[a] - 1)) : 0;
    if (total > 63) return TL_ERR_UNSUPPORTED; /* UINT64_MAX: tl_recent's empty slot */
    uint64_t *keys = malloc(sizeof(uint64_t) * (size_t)(n_in * reach > 0 ? n_in * reach : 1));
    if (!keys) return TL_ERR_NOMEM;
    const int64_t c = xyz >= 0 && plan[0].w == 1 && plan[1].w == 1 && plan[2].w == 1
                          ? tl_candidates_single(in, n_in, plan, bits, keys)
                          : tl_candidates_any(in, n_in, g, plan, bits, keys);
    tl_status st = tl_radix_sort_u64(keys, c, total);
    int64_t m = 0;
    for (int64_t j = 0; st == TL_OK && j < c; j++)
        if (j == 0 || keys[j] != keys[j - 1]) keys[m++] = keys[j];
    if (st == TL_OK && m > capacity) st = TL_ERR_CAPACITY;
    for (int64_t j = 0; st == TL_OK && j < m; j++) out[j] = tl_unpack_key(keys[j], bits);
    if (st == TL_OK) *n_out = m;
    free(keys);
    return st;
}

tl_status tl_coords_generate(const tl_coord *in, int64_t n_in, const tl_geom *g,
                             const int64_t out_range[3], tl_coord *out,
                             int64_t capacity, int64_t *n_out) {
    int64_t k;
    *n_out = 0;
    tl_status st = tl_geom_check(g, &k);
    if (st != TL_OK) return st;
    if (n_in < 0 || capacity < 0 || (n_in > 0 && !in) || (capacity > 0 && !out))
        return TL_ERR_INVALID;
    for (int a = 0; a < 3; a++)
        if (out_range[a] < 0 || out_range[a] > (int64_t)TL_COORD_MAX + 1)
            return TL_ERR_INVALID;
    tl_axis_plan plan[3] = {{0}, {0}, {0}};
    tl_hash seen = {0};
    int32_t *qbuf = NULL;
    for (int a = 0; a < 3 && st == TL_OK; a++) st = tl_axis_plan_init(&plan[a], g, a, out_range[a]);
    if (st != TL_OK) goto done;
    st = tl_generate_sorted(in, n_in, g, plan, out_range, out, capacity, n_out);
    if (st != TL_ERR_UNSUPPORTED) goto done;
    qbuf = malloc(sizeof(int32_t) * ((size_t)g->kernel_size[0] + g->kernel_size[1] +
                                     g->kernel_size[2]));
    st = qbuf ? tl_hash_init(&seen, n_in) : TL_ERR_NOMEM;
    if (st != TL_OK) goto done;
    st = tl_generate_into(in, n_in, g, plan, &seen, qbuf);
    if (st != TL_OK) goto done;
    if (seen.size > capacity) {
        st = TL_ERR_CAPACITY;
        goto done;
    }
    int64_t m = 0;
    for (uint64_t i = 0; i <= seen.mask; i++)
        if (seen.slots[i].value >= 0) out[m++] = seen.slots[i].key;
    *n_out = m;
    st = tl_coords_sort(out, m);
done:
    tl_hash_free(&seen);
    free(qbuf);
    for (int a = 0; a < 3; a++) tl_axis_plan_free(&plan[a]);
    return st;
}

tl_status tl_coords_sort(tl_coord *rows, int64_t n) {
    /* Negative rows are refused for any n: a single generated row with a
     * negative batch must fail like many (found by fuzz/fuzz_generate.py). */
    for (int64_t i = 0; i < n; i++)
        if ((rows[i].b | rows[i].x | rows[i].y | rows[i].z) < 0) return TL_ERR_INVALID;
    if (n < 2) return TL_OK;
    int bits[4];
    uint64_t *keys;
    tl_status st = tl_sorted_packed(rows, n, bits, &keys);
    if (st == TL_ERR_UNSUPPORTED) {
        /* Wide coordinates do not pack into one word: plain comparison sort. */
        qsort(rows, (size_t)n, sizeof(tl_coord), tl_coord_cmp);
        return TL_OK;
    }
    for (int64_t i = 0; st == TL_OK && i < n; i++) rows[i] = tl_unpack_key(keys[i], bits);
    free(keys);
    return st;
}

int tl_coords_ascending(const tl_coord *rows, int64_t n, int strict) {
    for (int64_t i = 1; i < n; i++) {
        const int c = tl_coord_cmp(&rows[i - 1], &rows[i]);
        if (c > 0 || (strict && c == 0)) return 0;
    }
    return 1;
}

/* Whether non-negative rows repeat, from their packed keys sorted (equal
 * rows become neighbours): *repeats 0 or 1; TL_ERR_UNSUPPORTED where the
 * fields need more than 64 bits. */
static tl_status tl_coords_repeat(const tl_coord *rows, int64_t n, int *repeats) {
    *repeats = 0;
    int bits[4];
    uint64_t *keys;
    tl_status st = tl_sorted_packed(rows, n, bits, &keys);
    for (int64_t i = 1; st == TL_OK && i < n && !*repeats; i++) *repeats = keys[i] == keys[i - 1];
    free(keys);
    return st;
}

tl_status tl_coords_find_duplicate(const tl_coord *rows, int64_t n,
                                   int64_t *first_dup) {
    *first_dup = -1;
    if (n < 0 || (n > 0 && !rows)) return TL_ERR_INVALID;
    for (int64_t i = 0; i < n; i++)
        if ((rows[i].b | rows[i].x | rows[i].y | rows[i].z) < 0) return TL_ERR_INVALID;
    /* Voxelization and generated supports list rows strictly ascending, so
     * unique: one pass.  Other orders sort their packed keys (sequential
     * passes, 8 bytes a row, where the hash table probes 48 bytes a row at
     * random: 114 ns a row at 1M rows); only rows that do repeat, or do not
     * pack, go through the hash, which names the first repeat. */
    if (tl_coords_ascending(rows, n, 1)) return TL_OK;
    int repeats = 1;
    tl_status st = tl_coords_repeat(rows, n, &repeats);
    if (st != TL_OK && st != TL_ERR_UNSUPPORTED) return st;
    if (st == TL_OK && !repeats) return TL_OK;
    tl_hash h;
    int64_t dup;
    st = tl_hash_build(&h, rows, n, &dup);
    if (st == TL_ERR_DUPLICATE) {
        *first_dup = dup;
        return TL_OK;
    }
    if (st == TL_OK) tl_hash_free(&h);
    return st;
}
