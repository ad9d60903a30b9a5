#include "tl_kmap.h"

#include <omp.h>
#include <stdlib.h>

#include "tl_hash.h"

/* Input row feeding out through kernel position r, or -1. */
static int32_t tl_kmap_lookup(const tl_hash *h, tl_coord out, const tl_geom *g,
                              const int32_t r[3]) {
    int64_t c[3] = {out.x, out.y, out.z};
    int32_t p[3];
    for (int a = 0; a < 3; a++) {
        int64_t v = c[a] * g->stride[a] - g->padding[a] + (int64_t)r[a] * g->dilation[a];
        if (v < TL_COORD_MIN || v > TL_COORD_MAX) return TL_NO_ROW;
        p[a] = (int32_t)v;
    }
    tl_coord key = {out.b, p[0], p[1], p[2]};
    return (int32_t)tl_hash_find(h, key);
}

/* ---- Packed table: the fast path when (b, x, y, z) fit in 63 bits ---------
 *
 * Each axis gets as many bits as its largest input value needs.  When they
 * add up to at most 32 the key packs into the high half of a 64-bit slot and
 * the row index into the low half: a slot is 8 bytes instead of tl_hash's
 * 24, so the table of a 100k-row scene (256k slots, 2 MiB) stays in cache.
 * Up to 63 bits the slot holds the key alone and the row index sits in a
 * parallel int32 array.  A query beyond an axis's bits cannot be an input row
 * and is rejected without a probe.  Wider coordinates use tl_hash. */

#define TL_PK_EMPTY UINT64_MAX
#define TL_PK_MUL 0x9E3779B97F4A7C15ULL /* Fibonacci hashing multiplier */
#define TL_PK_NARROW_BITS 32
#define TL_PK_MAX_BITS 63

typedef struct tl_pk {
    uint64_t *slots;  /* narrow: key << 32 | row; wide: key */
    int32_t *rows;    /* wide only: row of each slot */
    uint64_t mask;
    int shift;        /* 64 - log2(capacity) */
    int bits[4];      /* b, x, y, z */
    uint32_t lim[4];  /* per-axis exclusive upper bound, 2^bits */
} tl_pk;

static int tl_bit_len(uint32_t v) {
    int n = 0;
    for (; v; v >>= 1) n++;
    return n;
}

static uint64_t tl_pk_key(const tl_pk *t, uint32_t b, uint32_t x, uint32_t y, uint32_t z) {
    uint64_t k = b;
    k = (k << t->bits[1]) | x;
    k = (k << t->bits[2]) | y;
    return (k << t->bits[3]) | z;
}

static uint64_t tl_pk_slot(const tl_pk *t, uint64_t key) {
    return (key * TL_PK_MUL) >> t->shift;
}

/* Chooses the layout from the OR of all input rows; TL_ERR_UNSUPPORTED when
 * the key does not fit 63 bits (the caller then uses tl_hash). */
static tl_status tl_pk_layout(tl_pk *t, const tl_coord *in, int64_t n_in) {
    uint32_t m[4] = {0, 0, 0, 0};
    int32_t neg = 0;
    for (int64_t i = 0; i < n_in; i++) {
        neg |= in[i].b | in[i].x | in[i].y | in[i].z;
        m[0] |= (uint32_t)in[i].b;
        m[1] |= (uint32_t)in[i].x;
        m[2] |= (uint32_t)in[i].y;
        m[3] |= (uint32_t)in[i].z;
    }
    if (neg < 0) return TL_ERR_INVALID;
    int total = 0;
    for (int a = 0; a < 4; a++) {
        t->bits[a] = tl_bit_len(m[a]);
        t->lim[a] = t->bits[a] >= 32 ? UINT32_MAX : (1u << t->bits[a]);
        total += t->bits[a];
    }
    return total > TL_PK_MAX_BITS ? TL_ERR_UNSUPPORTED : TL_OK;
}

/* Allocates the table of a layout (tl_pk_layout) for n_in rows. */
static tl_status tl_pk_alloc(tl_pk *t, int64_t n_in) {
    int total = t->bits[0] + t->bits[1] + t->bits[2] + t->bits[3];
    uint64_t cap = 16;
    int log2cap = 4;
    while (cap < 2 * (uint64_t)n_in) {
        cap *= 2;
        log2cap++;
    }
    t->slots = malloc(cap * sizeof(uint64_t));
    if (total > TL_PK_NARROW_BITS) t->rows = malloc(cap * sizeof(int32_t));
    if (!t->slots || (total > TL_PK_NARROW_BITS && !t->rows)) return TL_ERR_NOMEM;
    t->mask = cap - 1;
    t->shift = 64 - log2cap;
    return TL_OK;
}

/* Claims a slot for key with compare-and-swap; returns 1 on a repeated key. */
static int tl_pk_insert(tl_pk *t, uint64_t key, int32_t row) {
    uint64_t entry = t->rows ? key : (key << 32) | (uint64_t)(uint32_t)row;
    for (uint64_t s = tl_pk_slot(t, key);; s = (s + 1) & t->mask) {
        uint64_t cur = __atomic_load_n(&t->slots[s], __ATOMIC_RELAXED);
        if (cur == TL_PK_EMPTY &&
            __atomic_compare_exchange_n(&t->slots[s], &cur, entry, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            if (t->rows) t->rows[s] = row;
            return 0;
        }
        /* cur now holds the slot's key, also after a lost race. */
        if ((t->rows ? cur : cur >> 32) == key) return 1;
    }
}

/* Inserts every input row in parallel.  Slot positions depend on thread
 * timing but the key -> row contents do not, so lookups are deterministic.
 * Returns TL_ERR_DUPLICATE when a row repeats. */
static tl_status tl_pk_fill(const tl_ctx *ctx, tl_pk *t, const tl_coord *in, int64_t n_in) {
    int dup = 0;
#pragma omp parallel num_threads(ctx->threads) reduction(| : dup)
    {
#pragma omp for schedule(static)
        for (uint64_t s = 0; s <= t->mask; s++) t->slots[s] = TL_PK_EMPTY;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n_in; i++) {
            uint64_t key = tl_pk_key(t, (uint32_t)in[i].b, (uint32_t)in[i].x,
                                     (uint32_t)in[i].y, (uint32_t)in[i].z);
            dup |= tl_pk_insert(t, key, (int32_t)i);
        }
    }
    return dup ? TL_ERR_DUPLICATE : TL_OK;
}

static int32_t tl_pk_find(const tl_pk *t, uint64_t key, uint64_t s) {
    if (t->rows) {
        for (;; s = (s + 1) & t->mask) {
            uint64_t e = t->slots[s];
            if (e == TL_PK_EMPTY) return TL_NO_ROW;
            if (e == key) return t->rows[s];
        }
    }
    for (;; s = (s + 1) & t->mask) {
        uint64_t e = t->slots[s];
        if (e == TL_PK_EMPTY) return TL_NO_ROW;
        if (e >> 32 == key) return (int32_t)(uint32_t)e;
    }
}

/* Query key of out through kernel offset off, or TL_PK_EMPTY when the point is
 * outside every input row's bit range (so it cannot be an input row). */
static uint64_t tl_pk_query(const tl_pk *t, const int64_t base[3], const int64_t off[3],
                            uint32_t b) {
    uint32_t c[3];
    for (int a = 0; a < 3; a++) {
        int64_t v = base[a] + off[a];
        if (v < 0 || v >= (int64_t)t->lim[a + 1]) return TL_PK_EMPTY;
        c[a] = (uint32_t)v;
    }
    if (b >= t->lim[0]) return TL_PK_EMPTY;
    return tl_pk_key(t, b, c[0], c[1], c[2]);
}

/* Looks up kernel rows [n0, n1) of output row o into row[]: all slots are
 * computed and prefetched first, so the cache misses overlap. */
static void tl_pk_row(const tl_pk *t, const tl_coord *o, const tl_geom *g,
                      const int64_t *off, int64_t n0, int64_t n1, int32_t *row,
                      uint64_t *keys) {
    int64_t base[3] = {(int64_t)o->x * g->stride[0] - g->padding[0],
                       (int64_t)o->y * g->stride[1] - g->padding[1],
                       (int64_t)o->z * g->stride[2] - g->padding[2]};
    for (int64_t n = n0; n < n1; n++) {
        keys[n] = tl_pk_query(t, base, off + 3 * n, (uint32_t)o->b);
        if (keys[n] != TL_PK_EMPTY) __builtin_prefetch(&t->slots[tl_pk_slot(t, keys[n])]);
    }
    for (int64_t n = n0; n < n1; n++)
        row[n] = keys[n] == TL_PK_EMPTY ? TL_NO_ROW
                                        : tl_pk_find(t, keys[n], tl_pk_slot(t, keys[n]));
}

/* Submanifold relation of a support with itself: stride 1, an odd kernel
 * size and every kernel offset's mirror is its negation ((K-1)*d == 2p per
 * axis).  Then nbr[o, n] = i  iff  nbr[i, K-1-n] = o, and nbr[o, (K-1)/2] = o.
 * An even kernel size has no centre row (offset 0), so it takes the general
 * path. */
static int tl_is_self_subm(const tl_coord *in, int64_t n_in, const tl_coord *out,
                           int64_t n_out, const tl_geom *g) {
    if (in != out || n_in != n_out) return 0;
    for (int a = 0; a < 3; a++)
        if (g->stride[a] != 1 || g->kernel_size[a] % 2 == 0 ||
            (int64_t)(g->kernel_size[a] - 1) * g->dilation[a] != 2 * (int64_t)g->padding[a])
            return 0;
    return 1;
}

/* Fills nbr through the packed table.  In the self-submanifold case only the
 * first half of the kernel rows is looked up; each hit also fills its mirror
 * entry in the neighbour's row (a cell no other (o, n) writes). */
static void tl_pk_fill_nbr(const tl_ctx *ctx, const tl_pk *t, const tl_coord *out,
                           int64_t n_out, const tl_geom *g, const int64_t *off, int64_t k,
                           int self, int32_t *nbr, uint64_t *keys_all) {
    const int64_t half = self ? (k - 1) / 2 : k;
#pragma omp parallel num_threads(ctx->threads)
    {
        uint64_t *keys = keys_all + (int64_t)omp_get_thread_num() * k;
        if (self) {
#pragma omp for schedule(static)
            for (int64_t j = 0; j < n_out * k; j++) nbr[j] = TL_NO_ROW;
        }
#pragma omp for schedule(static)
        for (int64_t o = 0; o < n_out; o++) {
            int32_t *row = nbr + o * k;
            tl_pk_row(t, &out[o], g, off, 0, half, row, keys);
            if (!self) continue;
            row[half] = (int32_t)o;
            for (int64_t n = 0; n < half; n++)
                if (row[n] >= 0) nbr[(int64_t)row[n] * k + (k - 1 - n)] = (int32_t)o;
        }
    }
}

/* ---- Sorted path: a merge instead of a table, when rows come sorted -------
 *
 * Voxelization and the library's own generated supports list rows in
 * ascending (b, x, y, z) order.  Then, for one kernel offset, the packed
 * query keys of ascending output rows ascend too (each field is an increasing
 * function of the output's field, and the packed key orders like the
 * fields), so each kernel row's neighbours are found by walking a cursor
 * forward through the sorted input keys: sequential reads, no table, no
 * random probe.  Strictly ascending input rows are also unique. */

/* The packed keys (layout t) of ascending rows[0..n), and at keys[n] a
 * sentinel above every query (queries fit 63 bits) that stops a merge's
 * cursors; NULL when out of memory. */
static uint64_t *tl_sorted_keys(const tl_ctx *ctx, const tl_pk *t, const tl_coord *rows,
                                int64_t n) {
    uint64_t *keys = malloc(sizeof(uint64_t) * (size_t)(n + 1));
    if (!keys) return NULL;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
    for (int64_t i = 0; i < n; i++)
        keys[i] = tl_pk_key(t, (uint32_t)rows[i].b, (uint32_t)rows[i].x, (uint32_t)rows[i].y,
                            (uint32_t)rows[i].z);
    keys[n] = UINT64_MAX;
    return keys;
}

/* First index in keys[0..n) whose key is >= q. */
static int64_t tl_lower_bound(const uint64_t *keys, int64_t n, uint64_t q) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (keys[mid] < q) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Fills nbr by merging: every thread takes a contiguous range of output
 * rows and keeps one cursor per kernel row into the sorted input keys,
 * placed by binary search at its first query and moved only forward.  In the
 * self-submanifold case only the first half of the kernel rows is merged;
 * each hit also fills its mirror entry, in a row near o for sorted rows. */
static tl_status tl_merge_fill_nbr(const tl_ctx *ctx, const tl_pk *t, const tl_coord *in,
                                   int64_t n_in, const tl_coord *out, int64_t n_out,
                                   const tl_geom *g, const int64_t *off, int64_t k, int self,
                                   int32_t *nbr) {
    const int64_t half = self ? (k - 1) / 2 : k;
    uint64_t *keys = tl_sorted_keys(ctx, t, in, n_in);
    int64_t *cursors = malloc(sizeof(int64_t) * (size_t)(k * ctx->threads));
    if (!keys || !cursors) {
        free(keys);
        free(cursors);
        return TL_ERR_NOMEM;
    }
#pragma omp parallel num_threads(ctx->threads)
    {
        if (self) {
#pragma omp for schedule(static)
            for (int64_t j = 0; j < n_out * k; j++) nbr[j] = TL_NO_ROW;
        }
        int64_t *cur = cursors + (int64_t)omp_get_thread_num() * k;
        for (int64_t n = 0; n < k; n++) cur[n] = -1; /* not placed yet */
#pragma omp for schedule(static)
        for (int64_t o = 0; o < n_out; o++) {
            const int64_t base[3] = {(int64_t)out[o].x * g->stride[0] - g->padding[0],
                                     (int64_t)out[o].y * g->stride[1] - g->padding[1],
                                     (int64_t)out[o].z * g->stride[2] - g->padding[2]};
            int32_t *row = nbr + o * k;
            for (int64_t n = 0; n < half; n++) {
                uint64_t q = tl_pk_query(t, base, off + 3 * n, (uint32_t)out[o].b);
                if (q == TL_PK_EMPTY) {
                    row[n] = TL_NO_ROW;
                    continue;
                }
                int64_t j = cur[n] < 0 ? tl_lower_bound(keys, n_in, q) : cur[n];
                while (keys[j] < q) j++;
                cur[n] = j;
                row[n] = keys[j] == q ? (int32_t)j : TL_NO_ROW;
                if (self && row[n] >= 0) nbr[j * k + (k - 1 - n)] = (int32_t)o;
            }
            if (self) row[half] = (int32_t)o;
        }
    }
    free(keys);
    free(cursors);
    return TL_OK;
}

/* ---- Strided maps from the inputs' side -----------------------------------
 *
 * With a stride above 1 each input reaches a few of the K kernel rows (a
 * 2x2x2 kernel at stride 2: one of 8), which the axis plans
 * (tl_axis_plan_hits) list without a search.  For a fixed kernel row the
 * outputs that ascending inputs reach ascend too (q = (c + p - r d) / s
 * grows with c on every axis), so one cursor per kernel row walks the sorted
 * output keys forward: the pairs plus K walks over the outputs, where the
 * output-side merge makes K queries per output and K walks over the inputs
 * (k2 s2: about a third of the steps).  Each (output, kernel row) has at
 * most one input, so threads, each given a contiguous range of inputs,
 * never write the same entry. */

/* Whether tl_fill_by_input should serve a map: a stride above 1 and at
 * least 2 outputs per 5 inputs (its axes also need plans).  Measured against
 * the output-side merge (1 and 2 threads, interleaved): 1.06-1.82x where
 * outputs are 0.45-1.16 of the inputs (a LiDAR scan's and a surface's
 * k3 s2 p1 map, the scan's k2 s2), 0.72-0.85x at 0.29 (a dense surface's
 * k2 s2 map, where each output's 8 queries find most of their inputs in
 * order). */
static int tl_by_input_wanted(const tl_geom *g, int64_t n_in, int64_t n_out) {
    const int strided = g->stride[0] > 1 || g->stride[1] > 1 || g->stride[2] > 1;
    return strided && 5 * n_out >= 2 * n_in;
}

/* Plans for every axis (tl_axis_plan_init, targets below 2^31) into plan;
 * *all: whether each axis got one.  TL_ERR_NOMEM if one could not be
 * allocated. */
static tl_status tl_plan_axes(const tl_geom *g, tl_axis_plan plan[3], int *all) {
    tl_status st = TL_OK;
    for (int a = 0; a < 3 && st == TL_OK; a++)
        st = tl_axis_plan_init(&plan[a], g, a, (int64_t)TL_COORD_MAX + 1);
    *all = st == TL_OK && plan[0].dq && plan[1].dq && plan[2].dq;
    return st;
}

/* Fills nbr (n_out x k) from strictly ascending non-negative inputs and
 * ascending outputs (repeated output rows each get the entry), t the packed
 * layout of the outputs. */
static tl_status tl_fill_by_input(const tl_ctx *ctx, const tl_pk *t, const tl_axis_plan plan[3],
                                  const tl_coord *in, int64_t n_in, const tl_coord *out,
                                  int64_t n_out, const tl_geom *g, int64_t k, int32_t *nbr) {
    uint64_t *keys = tl_sorted_keys(ctx, t, out, n_out);
    int64_t *cursors = malloc(sizeof(int64_t) * (size_t)(k * ctx->threads));
    if (!keys || !cursors) {
        free(keys);
        free(cursors);
        return TL_ERR_NOMEM;
    }
    const int64_t ky = g->kernel_size[1], kz = g->kernel_size[2];
#pragma omp parallel num_threads(ctx->threads)
    {
#pragma omp for schedule(static)
        for (int64_t j = 0; j < n_out * k; j++) nbr[j] = TL_NO_ROW;
        int64_t *cur = cursors + (int64_t)omp_get_thread_num() * k;
        for (int64_t n = 0; n < k; n++) cur[n] = -1; /* not placed yet */
        int32_t q[3][TL_PLAN_MAX_W], r[3][TL_PLAN_MAX_W];
        /* Static: each thread's inputs are one contiguous ascending run. */
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n_in; i++) {
            if ((uint32_t)in[i].b >= t->lim[0]) continue;
            const int mx = tl_axis_plan_hits(&plan[0], in[i].x, q[0], r[0]);
            const int my = tl_axis_plan_hits(&plan[1], in[i].y, q[1], r[1]);
            const int mz = tl_axis_plan_hits(&plan[2], in[i].z, q[2], r[2]);
            for (int a = 0; a < mx; a++)
                for (int b = 0; b < my; b++)
                    for (int c = 0; c < mz; c++) {
                        const uint32_t f[3] = {(uint32_t)q[0][a], (uint32_t)q[1][b],
                                               (uint32_t)q[2][c]};
                        if (f[0] >= t->lim[1] || f[1] >= t->lim[2] || f[2] >= t->lim[3])
                            continue; /* past every output row's bits */
                        const uint64_t key = tl_pk_key(t, (uint32_t)in[i].b, f[0], f[1], f[2]);
                        const int64_t n = (r[0][a] * ky + r[1][b]) * kz + r[2][c];
                        int64_t j = cur[n] < 0 ? tl_lower_bound(keys, n_out, key) : cur[n];
                        while (keys[j] < key) j++;
                        cur[n] = j;
                        for (; keys[j] == key; j++) nbr[j * k + n] = (int32_t)i;
                    }
        }
    }
    free(keys);
    free(cursors);
    return TL_OK;
}

/* ---- Generic path: tl_hash, for coordinates wider than 32 key bits -------- */

static tl_status tl_kmap_build_wide(const tl_ctx *ctx, const tl_coord *in, int64_t n_in,
                                    const tl_coord *out, int64_t n_out, const tl_geom *g,
                                    int64_t k, const int32_t *pos, int32_t *nbr) {
    tl_hash h;
    tl_status st = tl_hash_build(&h, in, n_in, NULL);
    if (st != TL_OK) return st;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
    for (int64_t o = 0; o < n_out; o++) {
        int32_t *row = nbr + o * k;
        if (out[o].b < 0) {
            for (int64_t n = 0; n < k; n++) row[n] = TL_NO_ROW;
            continue;
        }
        for (int64_t n = 0; n < k; n++) row[n] = tl_kmap_lookup(&h, out[o], g, pos + 3 * n);
    }
    tl_hash_free(&h);
    return TL_OK;
}

/* Kernel offsets r_n * dilation (int64, 3 per row) and positions (int32). */
static tl_status tl_kmap_offsets(const tl_geom *g, int64_t k, int32_t **pos, int64_t **off) {
    *pos = malloc(sizeof(int32_t) * 3 * (size_t)k);
    *off = malloc(sizeof(int64_t) * 3 * (size_t)k);
    if (!*pos || !*off) {
        free(*pos);
        free(*off);
        return TL_ERR_NOMEM;
    }
    for (int64_t n = 0; n < k; n++) {
        tl_geom_position(g, n, *pos + 3 * n);
        for (int a = 0; a < 3; a++) (*off)[3 * n + a] = (int64_t)(*pos)[3 * n + a] * g->dilation[a];
    }
    return TL_OK;
}

/* Output rows with a negative field match no input: the packed path needs
 * them gone, so such a call goes the generic way. */
static int tl_rows_nonneg(const tl_coord *rows, int64_t n) {
    int32_t acc = 0;
    for (int64_t i = 0; i < n; i++) acc |= rows[i].b | rows[i].x | rows[i].y | rows[i].z;
    return acc >= 0;
}

tl_status tl_kmap_build(const tl_ctx *ctx, const tl_coord *in, int64_t n_in,
                        const tl_coord *out, int64_t n_out, const tl_geom *g,
                        int32_t *nbr) {
    int64_t k;
    tl_status st = tl_geom_check(g, &k);
    if (st != TL_OK) return st;
    if (!ctx || ctx->threads < 1) return TL_ERR_INVALID;
    if (n_in < 0 || n_out < 0 || (n_in && !in) || (n_out && (!out || !nbr)))
        return TL_ERR_INVALID;
    if (n_in > TL_ROW_MAX || n_out > TL_ROW_MAX) return TL_ERR_OVERFLOW;
    int32_t *pos;
    int64_t *off;
    st = tl_kmap_offsets(g, k, &pos, &off);
    if (st != TL_OK) return st;
    tl_pk t = {0};
    st = tl_pk_layout(&t, in, n_in);
    const int packed = st == TL_OK && tl_rows_nonneg(out, n_out);
    const int merge =
        packed && tl_coords_ascending(in, n_in, 1) && tl_coords_ascending(out, n_out, 0);
    /* Only strided maps are planned: submanifold ones (most maps) skip it. */
    tl_axis_plan plan[3] = {{0}, {0}, {0}};
    int planned = 0;
    const tl_status plan_st =
        merge && tl_by_input_wanted(g, n_in, n_out) ? tl_plan_axes(g, plan, &planned) : TL_OK;
    tl_pk outs = {0};
    if (plan_st != TL_OK) {
        st = plan_st; /* no memory for the plans */
    } else if (planned && tl_pk_layout(&outs, out, n_out) == TL_OK) {
        st = tl_fill_by_input(ctx, &outs, plan, in, n_in, out, n_out, g, k, nbr);
    } else if (merge) {
        st = tl_merge_fill_nbr(ctx, &t, in, n_in, out, n_out, g, off, k,
                               tl_is_self_subm(in, n_in, out, n_out, g), nbr);
    } else if (packed) {
        st = tl_pk_alloc(&t, n_in);
        if (st == TL_OK) st = tl_pk_fill(ctx, &t, in, n_in);
        uint64_t *keys = st == TL_OK ? malloc(sizeof(uint64_t) * (size_t)(k * ctx->threads))
                                     : NULL;
        if (st == TL_OK && !keys) st = TL_ERR_NOMEM;
        if (st == TL_OK)
            tl_pk_fill_nbr(ctx, &t, out, n_out, g, off, k,
                           tl_is_self_subm(in, n_in, out, n_out, g), nbr, keys);
        free(keys);
    } else if (st == TL_OK || st == TL_ERR_UNSUPPORTED) {
        st = tl_kmap_build_wide(ctx, in, n_in, out, n_out, g, k, pos, nbr);
    }
    for (int a = 0; a < 3; a++) tl_axis_plan_free(&plan[a]);
    free(t.slots);
    free(t.rows);
    free(pos);
    free(off);
    return st;
}

tl_status tl_kmap_reverse(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out,
                          int64_t k, int64_t n_in, int32_t *rev) {
    if (n_out < 0 || n_in < 0 || k < 1 || (n_out && !nbr) || (n_in && !rev))
        return TL_ERR_INVALID;
    if (n_in > TL_ROW_MAX || n_out > TL_ROW_MAX || k > TL_ROW_MAX) return TL_ERR_OVERFLOW;
    int bad = 0;
    /* Each (i, n) slot has at most one writer, so the kernel rows are split
     * into one contiguous group per thread; every thread walks nbr row by row
     * (one pass over memory) and writes only its own columns.  A second
     * writer of a slot means the map is corrupt. */
#pragma omp parallel num_threads(ctx->threads) reduction(| : bad)
    {
#pragma omp for schedule(static)
        for (int64_t j = 0; j < n_in * k; j++) rev[j] = TL_NO_ROW;
        int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t n0 = k * t / nt, n1 = k * (t + 1) / nt;
        for (int64_t o = 0; o < n_out && n0 < n1; o++) {
            const int32_t *row = nbr + o * k;
            for (int64_t n = n0; n < n1; n++) {
                int32_t i = row[n];
                if (i == TL_NO_ROW) continue;
                if (i < 0 || i >= n_in || rev[i * k + n] != TL_NO_ROW) {
                    bad = 1;
                    continue;
                }
                rev[i * k + n] = (int32_t)o;
            }
        }
    }
    return bad ? TL_ERR_INVALID : TL_OK;
}
