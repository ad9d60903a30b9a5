/* Standalone test of the C core (no Python): hash table, kernel maps of every
 * family, generated supports, pair lists, convolution forward and weight
 * gradient (fp32; the forward also in bf16 and fp16), the tiles' neighbour
 * lists (scalar and AVX-512), pooling over kernel maps and voxelization, each checked
 * against a brute-force reference, plus the failure paths that must free
 * what they allocated.  scripts/sanitize.sh builds it with ASan + UBSan (and
 * LeakSanitizer) and without sanitizers under valgrind.
 *
 * Build: gcc -std=c11 -fopenmp -Icsrc/core tests/c/test_core.c csrc/core/tl_*.c -lm
 * Exit status 0 when every check passes; each failure prints its line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tl_conv.h"
#include "tl_coords.h"
#include "tl_dataflow_implicit_gemm.h"
#include "tl_dataflow_pairs.h"
#include "tl_generative.h"
#include "tl_half.h"
#include "tl_hash.h"
#include "tl_kmap.h"
#include "tl_list.h"
#include "tl_mem.h"
#include "tl_norm.h"
#include "tl_pairs.h"
#include "tl_pool.h"
#include "tl_simd.h"
#include "tl_tile_lists.h"
#include "tl_voxel.h"

static int failures = 0;
static const char *current = "-"; /* the case under test, for failure messages */

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d [%s]: check failed: %s\n", __FILE__, __LINE__,    \
                    current, #cond);                                                 \
            failures++;                                                              \
        }                                                                            \
    } while (0)

/* ---- small helpers ------------------------------------------------------- */

static uint64_t rng_state = 0x2545F4914F6CDD1DULL;

static uint32_t rnd(uint32_t bound) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % bound);
}

static float rndf(void) { return (float)rnd(2001) / 1000.0f - 1.0f; }

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static int coord_eq(tl_coord a, tl_coord b) {
    return a.b == b.b && a.x == b.x && a.y == b.y && a.z == b.z;
}

static int coord_cmp(const void *pa, const void *pb) {
    const tl_coord *a = pa, *b = pb;
    const int32_t ka[4] = {a->b, a->x, a->y, a->z}, kb[4] = {b->b, b->x, b->y, b->z};
    for (int i = 0; i < 4; i++)
        if (ka[i] != kb[i]) return ka[i] < kb[i] ? -1 : 1;
    return 0;
}

static int64_t linear_find(const tl_coord *rows, int64_t n, tl_coord key) {
    for (int64_t i = 0; i < n; i++)
        if (coord_eq(rows[i], key)) return i;
    return -1;
}

/* n unique random rows with batch < nb and coordinates base + [0, span). */
static tl_coord *random_rows(int64_t n, int nb, int32_t base, uint32_t span) {
    tl_coord *rows = xmalloc(sizeof(tl_coord) * (size_t)n);
    for (int64_t i = 0; i < n;) {
        tl_coord c = {(int32_t)rnd((uint32_t)nb), base + (int32_t)rnd(span),
                      base + (int32_t)rnd(span), base + (int32_t)rnd(span)};
        if (linear_find(rows, i, c) < 0) rows[i++] = c;
    }
    return rows;
}

static tl_geom geom(int k0, int k1, int k2, int s, int p, int d) {
    tl_geom g = {{k0, k1, k2}, {s, s, s}, {p, p, p}, {d, d, d}};
    return g;
}

static tl_ctx make_ctx(int threads, int simd) {
    tl_ctx c = {threads, 0, NULL, simd, NULL, 0};
    return c;
}

/* ---- hash table ---------------------------------------------------------- */

static void test_hash(void) {
    current = "hash";
    tl_coord keys[200];
    for (int i = 0; i < 200; i++) {
        tl_coord c = {(int32_t)rnd(3), (int32_t)rnd(50), (int32_t)rnd(50), (int32_t)rnd(50)};
        if (i % 17 == 0) c.x = TL_COORD_MAX - (int32_t)rnd(3); /* full int32 range */
        if (i % 23 == 0) c.b = TL_COORD_MAX;
        keys[i] = c;
    }
    tl_hash h;
    CHECK(tl_hash_init(&h, 4) == TL_OK);
    int64_t inserted = 0;
    for (int i = 0; i < 200; i++) {
        CHECK(tl_hash_reserve(&h, h.size + 1) == TL_OK);
        int64_t existing;
        CHECK(tl_hash_insert(&h, keys[i], i, &existing) == TL_OK);
        int64_t first = linear_find(keys, i, keys[i]);
        CHECK(existing == first);
        if (first < 0) inserted++;
    }
    CHECK(h.size == inserted);
    for (int i = 0; i < 200; i++) CHECK(tl_hash_find(&h, keys[i]) == linear_find(keys, 200, keys[i]));
    tl_coord absent = {1, 1000, 1000, 1000};
    CHECK(tl_hash_find(&h, absent) == -1);
    tl_hash_free(&h);

    /* tl_hash_build: unique rows map to their index; a repeat is reported. */
    tl_coord *rows = random_rows(64, 2, 0, 8);
    CHECK(tl_hash_build(&h, rows, 64, NULL) == TL_OK);
    for (int64_t i = 0; i < 64; i++) CHECK(tl_hash_find(&h, rows[i]) == i);
    tl_hash_free(&h);
    rows[40] = rows[7];
    int64_t dup = -1;
    CHECK(tl_hash_build(&h, rows, 64, &dup) == TL_ERR_DUPLICATE);
    CHECK(dup == 40);
    tl_hash_free(&h); /* must be safe after a failed build */
    free(rows);
}

/* ---- kernel maps ----------------------------------------------------------- */

/* nbr[o*K + n] by definition: in[i] == out[o]*s - p + r_n*d, same batch. */
static int check_kmap_brute(const tl_coord *in, int64_t n_in, const tl_coord *out,
                            int64_t n_out, const tl_geom *g, const int32_t *nbr) {
    int64_t k;
    if (tl_geom_check(g, &k) != TL_OK) return 0;
    for (int64_t o = 0; o < n_out; o++)
        for (int64_t n = 0; n < k; n++) {
            int32_t r[3];
            tl_geom_position(g, n, r);
            int64_t c[3] = {out[o].x, out[o].y, out[o].z}, v[3];
            int ok = 1;
            for (int a = 0; a < 3; a++) {
                v[a] = c[a] * g->stride[a] - g->padding[a] + (int64_t)r[a] * g->dilation[a];
                ok = ok && v[a] >= 0 && v[a] <= TL_COORD_MAX;
            }
            int64_t want = -1;
            if (ok) {
                tl_coord key = {out[o].b, (int32_t)v[0], (int32_t)v[1], (int32_t)v[2]};
                want = linear_find(in, n_in, key);
            }
            if (nbr[o * k + n] != want) return 0;
        }
    return 1;
}

/* Builds nbr and rev for in -> out under g with 1 and 2 threads, checks both
 * against the definition; returns nbr (caller frees) with *k set. */
static int32_t *kmap_checked(const tl_coord *in, int64_t n_in, const tl_coord *out,
                             int64_t n_out, const tl_geom *g, int64_t *k_out) {
    int64_t k;
    CHECK(tl_geom_check(g, &k) == TL_OK);
    *k_out = k;
    int32_t *nbr = xmalloc(sizeof(int32_t) * (size_t)(n_out * k));
    int32_t *nbr2 = xmalloc(sizeof(int32_t) * (size_t)(n_out * k));
    int32_t *rev = xmalloc(sizeof(int32_t) * (size_t)(n_in * k));
    tl_ctx c1 = make_ctx(1, TL_SIMD_V4), c2 = make_ctx(2, TL_SIMD_V4);
    CHECK(tl_kmap_build(&c1, in, n_in, out, n_out, g, nbr) == TL_OK);
    CHECK(tl_kmap_build(&c2, in, n_in, out, n_out, g, nbr2) == TL_OK);
    CHECK(memcmp(nbr, nbr2, sizeof(int32_t) * (size_t)(n_out * k)) == 0);
    CHECK(check_kmap_brute(in, n_in, out, n_out, g, nbr));
    CHECK(tl_kmap_reverse(&c2, nbr, n_out, k, n_in, rev) == TL_OK);
    for (int64_t i = 0; i < n_in; i++)
        for (int64_t n = 0; n < k; n++) {
            int32_t o = rev[i * k + n];
            int64_t want = -1;
            for (int64_t q = 0; q < n_out; q++)
                if (nbr[q * k + n] == i) want = q;
            CHECK(o == want);
        }
    free(nbr2);
    free(rev);
    return nbr;
}

/* The output support of a strided relation: tl_coords_generate into a buffer of
 * tl_coords_generate_bound rows, both checked to succeed; the caller frees it. */
static tl_coord *generated_support(const tl_coord *in, int64_t n_in, const tl_geom *g,
                                   const int64_t range[3], int64_t nb, int64_t *n_out) {
    int64_t bound;
    CHECK(tl_coords_generate_bound(n_in, g, range, nb, &bound) == TL_OK);
    tl_coord *out = xmalloc(sizeof(tl_coord) * (size_t)bound);
    CHECK(tl_coords_generate(in, n_in, g, range, out, bound, n_out) == TL_OK);
    return out;
}

/* Support of a strided conv by definition: every q in [0, range) per axis
 * (per batch present in `in`) that some kernel row maps onto an input row. */
static int64_t generate_brute(const tl_coord *in, int64_t n_in, const tl_geom *g,
                              const int64_t range[3], int nb, tl_coord *out) {
    int64_t m = 0, k;
    if (tl_geom_check(g, &k) != TL_OK) return -1;
    for (int32_t b = 0; b < nb; b++)
        for (int32_t x = 0; x < range[0]; x++)
            for (int32_t y = 0; y < range[1]; y++)
                for (int32_t z = 0; z < range[2]; z++) {
                    tl_coord q = {b, x, y, z};
                    int hit = 0;
                    for (int64_t n = 0; n < k && !hit; n++) {
                        int32_t r[3];
                        tl_geom_position(g, n, r);
                        tl_coord key = {b, x * g->stride[0] - g->padding[0] + r[0] * g->dilation[0],
                                        y * g->stride[1] - g->padding[1] + r[1] * g->dilation[1],
                                        z * g->stride[2] - g->padding[2] + r[2] * g->dilation[2]};
                        hit = key.x >= 0 && key.y >= 0 && key.z >= 0 &&
                              linear_find(in, n_in, key) >= 0;
                    }
                    if (hit) out[m++] = q;
                }
    return m;
}

static void test_kmap_family(const char *name, const tl_coord *in, int64_t n_in,
                             const tl_geom *g, int nb, int64_t span) {
    int64_t range[3] = {span, span, span}, n_out;
    current = name;
    tl_coord *out = generated_support(in, n_in, g, range, nb, &n_out);
    tl_coord *want = xmalloc(sizeof(tl_coord) * (size_t)(nb * span * span * span));
    int64_t n_want = generate_brute(in, n_in, g, range, nb, want);
    CHECK(n_out == n_want);
    if (n_out == n_want) CHECK(memcmp(out, want, sizeof(tl_coord) * (size_t)n_out) == 0);
    if (n_out > 0) {
        /* Too small a buffer: TL_ERR_CAPACITY, nothing leaked. */
        int64_t n_small;
        CHECK(tl_coords_generate(in, n_in, g, range, out, n_out - 1, &n_small) ==
              TL_ERR_CAPACITY);
    }
    int64_t k;
    free(kmap_checked(in, n_in, out, n_out, g, &k));
    free(out);
    free(want);
}

static void test_kmaps(void) {
    current = "kmaps";
    tl_coord *in = random_rows(120, 2, 0, 10);
    int64_t k;
    /* Submanifold (self map, odd kernel), dilated submanifold, asymmetric. */
    tl_geom subm = geom(3, 3, 3, 1, 1, 1), subm_d = geom(3, 3, 3, 1, 2, 2);
    free(kmap_checked(in, 120, in, 120, &subm, &k));
    free(kmap_checked(in, 120, in, 120, &subm_d, &k));
    tl_geom odd = {{3, 1, 2}, {1, 1, 1}, {1, 0, 0}, {1, 1, 1}};
    free(kmap_checked(in, 120, in, 120, &odd, &k));
    /* Downsampling convolutions and pooling maps with generated supports. */
    tl_geom s2k2 = geom(2, 2, 2, 2, 0, 1), s2k3 = geom(3, 3, 3, 2, 1, 1);
    tl_geom s3k3d2 = geom(3, 3, 3, 3, 2, 2);
    tl_geom aniso = {{2, 3, 1}, {2, 1, 3}, {0, 1, 0}, {1, 1, 1}};
    test_kmap_family("s2k2", in, 120, &s2k2, 2, 5);
    test_kmap_family("s2k3", in, 120, &s2k3, 2, 6);
    test_kmap_family("s3k3d2", in, 120, &s3k3d2, 2, 5);
    test_kmap_family("aniso", in, 120, &aniso, 2, 10);

    current = "generative";
    /* Generative transposed: fine = coarse*s + r; map fine (input side of the
     * conv relation) against coarse, reversed for the transposed direction. */
    tl_coord *coarse = random_rows(40, 2, 0, 6);
    tl_geom gen = geom(2, 2, 2, 2, 0, 1);
    int64_t cap = 40 * 8, n_fine;
    tl_coord *fine = xmalloc(sizeof(tl_coord) * (size_t)cap);
    CHECK(tl_generative_support(coarse, 40, &gen, fine, cap, &n_fine) == TL_OK);
    tl_coord *want = xmalloc(sizeof(tl_coord) * (size_t)cap);
    for (int64_t i = 0; i < 40; i++)
        for (int64_t n = 0; n < 8; n++) {
            int32_t r[3];
            tl_geom_position(&gen, n, r);
            tl_coord q = {coarse[i].b, coarse[i].x * 2 + r[0], coarse[i].y * 2 + r[1],
                          coarse[i].z * 2 + r[2]};
            want[i * 8 + n] = q;
        }
    qsort(want, (size_t)cap, sizeof(tl_coord), coord_cmp);
    int64_t m = 0;
    for (int64_t i = 0; i < cap; i++)
        if (m == 0 || !coord_eq(want[m - 1], want[i])) want[m++] = want[i];
    CHECK(n_fine == m);
    if (n_fine == m) CHECK(memcmp(fine, want, sizeof(tl_coord) * (size_t)m) == 0);
    int64_t n_small;
    tl_coord *scratch = xmalloc(sizeof(tl_coord) * (size_t)cap);
    CHECK(tl_generative_support(coarse, 40, &gen, scratch, n_fine - 1, &n_small) ==
          TL_ERR_CAPACITY);
    tl_geom bad_gen = geom(2, 2, 2, 2, 1, 1);
    CHECK(tl_generative_support(coarse, 40, &bad_gen, scratch, cap, &n_small) ==
          TL_ERR_INVALID);
    free(scratch);
    free(kmap_checked(fine, n_fine, coarse, 40, &gen, &k));
    free(fine);
    free(want);
    free(coarse);

    current = "near 2^31";
    /* Coordinates near 2^31 - 1 (the wide path: no packing). */
    tl_coord *wide = random_rows(60, 2, TL_COORD_MAX - 6, 7);
    wide[0].b = TL_COORD_MAX - 1;
    free(kmap_checked(wide, 60, wide, 60, &subm, &k));
    tl_coord *mixed = random_rows(60, 3, 0, 6);
    mixed[5].x = TL_COORD_MAX;
    mixed[9].z = TL_COORD_MAX - 1;
    free(kmap_checked(mixed, 60, mixed, 60, &subm, &k));
    free(kmap_checked(mixed, 60, mixed, 60, &s2k3, &k));
    free(wide);
    free(mixed);

    current = "kmap failures";
    /* Failure paths: duplicate input rows, negative rows, a corrupt map. */
    tl_ctx c1 = make_ctx(1, TL_SIMD_V4);
    int32_t *nbr = xmalloc(sizeof(int32_t) * 120 * 27);
    tl_coord saved = in[3];
    in[3] = in[50];
    CHECK(tl_kmap_build(&c1, in, 120, in, 120, &subm, nbr) == TL_ERR_DUPLICATE);
    in[3] = saved;
    in[4].y = -1;
    CHECK(tl_kmap_build(&c1, in, 120, in, 120, &subm, nbr) == TL_ERR_INVALID);
    in[4].y = 0;
    int32_t corrupt[4] = {0, 0, 0, 5};
    int32_t rev[8];
    CHECK(tl_kmap_reverse(&c1, corrupt, 2, 2, 4, rev) == TL_ERR_INVALID);
    free(nbr);
    free(in);
}

/* ---- pair lists and convolution ----------------------------------------- */

static void test_conv(void) {
    current = "conv";
    tl_coord *in = random_rows(90, 2, 0, 8);
    tl_geom s2k3 = geom(3, 3, 3, 2, 1, 1);
    int64_t range[3] = {4, 4, 4}, n_out, k;
    tl_coord *out = generated_support(in, 90, &s2k3, range, 2, &n_out);
    int32_t *nbr = kmap_checked(in, 90, out, n_out, &s2k3, &k);

    /* Pair lists by definition: kernel row n, outputs ascending. */
    tl_ctx c2 = make_ctx(2, TL_SIMD_V4);
    int64_t *offsets = xmalloc(sizeof(int64_t) * (size_t)(k + 1));
    CHECK(tl_pairs_count(&c2, nbr, n_out, k, offsets) == TL_OK);
    int64_t np = offsets[k];
    int32_t *pin = xmalloc(sizeof(int32_t) * (size_t)np), *pout = xmalloc(sizeof(int32_t) * (size_t)np);
    CHECK(tl_pairs_fill(&c2, nbr, n_out, k, offsets, pin, pout) == TL_OK);
    int64_t j = 0;
    for (int64_t n = 0; n < k; n++) {
        CHECK(offsets[n] == j);
        for (int64_t o = 0; o < n_out; o++)
            if (nbr[o * k + n] >= 0) {
                CHECK(j < np && pin[j] == nbr[o * k + n] && pout[j] == o);
                j++;
            }
    }
    CHECK(j == np);
    tl_pairs pairs = {k, offsets, pin, pout};
    CHECK(tl_pairs_check(&c2, &pairs, 90, n_out) == TL_OK);

    /* Forward and weight gradient, fp32, against a double reference. */
    const int64_t ci = 5, co = 7;
    float *x = xmalloc(sizeof(float) * (size_t)(90 * ci));
    float *w = xmalloc(sizeof(float) * (size_t)(k * ci * co));
    float *dy = xmalloc(sizeof(float) * (size_t)(n_out * co));
    float *y = xmalloc(sizeof(float) * (size_t)(n_out * co));
    float *dw = xmalloc(sizeof(float) * (size_t)(k * ci * co));
    double *y_ref = xmalloc(sizeof(double) * (size_t)(n_out * co));
    double *dw_ref = xmalloc(sizeof(double) * (size_t)(k * ci * co));
    for (int64_t i = 0; i < 90 * ci; i++) x[i] = rndf();
    for (int64_t i = 0; i < k * ci * co; i++) w[i] = rndf();
    for (int64_t i = 0; i < n_out * co; i++) dy[i] = rndf();
    memset(y_ref, 0, sizeof(double) * (size_t)(n_out * co));
    memset(dw_ref, 0, sizeof(double) * (size_t)(k * ci * co));
    for (int64_t o = 0; o < n_out; o++)
        for (int64_t n = 0; n < k; n++) {
            int32_t i = nbr[o * k + n];
            if (i < 0) continue;
            for (int64_t a = 0; a < ci; a++)
                for (int64_t b = 0; b < co; b++) {
                    y_ref[o * co + b] += (double)x[i * ci + a] * w[(n * ci + a) * co + b];
                    dw_ref[(n * ci + a) * co + b] += (double)x[i * ci + a] * dy[o * co + b];
                }
        }
    tl_conv_desc d = {TL_F32, 90, n_out, k, ci, co};
    for (int variant = 0; variant < 6; variant++) {
        tl_ctx ctx = make_ctx(1 + variant % 2, variant < 2 ? TL_SIMD_BASE : TL_SIMD_V4);
        int flow = variant / 2; /* 0 implicit GEMM, 1 fetch-on-demand, 2 gather-scatter */
        memset(y, 0xff, sizeof(float) * (size_t)(n_out * co));
        memset(dw, 0xff, sizeof(float) * (size_t)(k * ci * co));
        if (variant < 2 || flow == 0) {
            CHECK(tl_implicit_gemm_forward(&ctx, &d, x, w, nbr, y) == TL_OK);
            CHECK(tl_implicit_gemm_weight_grad(&ctx, &d, x, dy, nbr, dw) == TL_OK);
        } else {
            tl_pairs_mode mode = flow == 1 ? TL_PAIRS_FETCH_ON_DEMAND : TL_PAIRS_GATHER_SCATTER;
            CHECK(tl_pairs_forward(&ctx, mode, &d, x, w, &pairs, y) == TL_OK);
            CHECK(tl_pairs_weight_grad(&ctx, mode, &d, x, dy, &pairs, dw) == TL_OK);
        }
        for (int64_t i = 0; i < n_out * co; i++) CHECK(fabs(y[i] - y_ref[i]) < 1e-4);
        for (int64_t i = 0; i < k * ci * co; i++) CHECK(fabs(dw[i] - dw_ref[i]) < 1e-4);
    }
    /* Missing buffers are refused. */
    tl_ctx c1 = make_ctx(1, TL_SIMD_V4);
    CHECK(tl_conv_check_buffers(&d, 0, x, NULL, y) == TL_ERR_INVALID);
    tl_conv_desc bad = d;
    bad.dtype = TL_F16;
    CHECK(tl_conv_check_cpu(&c1, &bad, 0) == TL_ERR_UNSUPPORTED);

    free(x), free(w), free(dy), free(y), free(dw), free(y_ref), free(dw_ref);
    free(offsets), free(pin), free(pout), free(nbr), free(out), free(in);
}

/* The row conversions at every level this CPU runs (vector bodies and their
 * tails) against the scalar ones, bit for bit: float bit patterns of every
 * kind (ties, subnormals, infinities, NaN; a NaN to fp16 need only stay a
 * NaN, as F16C chooses its payload), and every half pattern back to float. */
static void test_half_rows(void) {
    enum { N = 65536 + 13 };
    float *src = xmalloc(sizeof(float) * N), *back = xmalloc(sizeof(float) * N);
    uint16_t *half = xmalloc(sizeof(uint16_t) * N), *all = xmalloc(sizeof(uint16_t) * N);
    for (int i = 0; i < N; i++) {
        uint32_t u = (rnd(65536) << 16) | rnd(65536);
        if (i % 4 == 1) u = (u & 0xffff0000u) | 0x8000u;  /* a bf16 tie */
        if (i % 4 == 2) u &= 0x807fffffu;                 /* a subnormal */
        memcpy(&src[i], &u, sizeof u);
        all[i] = (uint16_t)i;
    }
    const tl_simd levels[] = {TL_SIMD_BASE, TL_SIMD_V3, TL_SIMD_V4};
    for (size_t l = 0; l < sizeof(levels) / sizeof(levels[0]); l++) {
        if (levels[l] > tl_simd_level()) continue;
        for (int bf = 0; bf < 2; bf++) {
            const tl_dtype t = bf ? TL_BF16 : TL_F16;
            tl_f32_row_to_half(levels[l], t, src, N, half);
            for (int i = 0; i < N; i++) {
                if (bf) {
                    CHECK(half[i] == tl_f32_to_bf16(src[i]));
                } else if (src[i] != src[i]) {
                    CHECK((half[i] & 0x7c00u) == 0x7c00u && (half[i] & 0x3ffu) != 0);
                } else {
                    CHECK(half[i] == tl_f32_to_f16(src[i]));
                }
            }
            tl_half_row_to_f32(levels[l], t, all, N, back);
            for (int i = 0; i < N; i++) {
                const float want = bf ? tl_bf16_to_f32(all[i]) : tl_f16_to_f32(all[i]);
                CHECK(memcmp(&back[i], &want, sizeof want) == 0 || (want != want && back[i] != back[i]));
            }
            /* Gathered rows of 37 values, converted 40 apart with zeros after. */
            const uint16_t *rows[3] = {all + 1000, all + 7, all + 50000};
            for (int i = 0; i < 120; i++) back[i] = -1;
            tl_half_rows_to_f32(levels[l], t, rows, 3, 37, 40, back);
            for (int r = 0; r < 3; r++)
                for (int i = 0; i < 40; i++) {
                    const float got = back[r * 40 + i];
                    const float want = i >= 37 ? 0.0f
                                       : bf    ? tl_bf16_to_f32(rows[r][i])
                                               : tl_f16_to_f32(rows[r][i]);
                    CHECK(memcmp(&got, &want, sizeof want) == 0 || (want != want && got != got));
                }
        }
    }
    free(src), free(back), free(half), free(all);
}

/* Every bf16 and fp16 bit pattern survives the trip to float and back (NaN
 * as a NaN); float values between two halves round to the nearer, ties to
 * the even one. */
static void test_half_conversions(void) {
    current = "half conversions";
    for (uint32_t b = 0; b < 65536; b++) {
        uint16_t h = (uint16_t)b;
        float f = tl_bf16_to_f32(h), g = tl_f16_to_f32(h);
        if (f != f)
            CHECK(tl_f32_to_bf16(f) == (h | 0x40));
        else
            CHECK(tl_f32_to_bf16(f) == h);
        if (g != g)
            CHECK(tl_f16_to_f32(tl_f32_to_f16(g)) != tl_f16_to_f32(tl_f32_to_f16(g)));
        else
            CHECK(tl_f32_to_f16(g) == h);
    }
    CHECK(tl_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00);            /* tie: to even (1.0) */
    CHECK(tl_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02);        /* tie: to even (up) */
    CHECK(tl_f32_to_f16(65520.0f) == 0x7c00);                   /* past the largest: inf */
    CHECK(tl_f32_to_f16(65519.0f) == 0x7bff);
    CHECK(tl_f32_to_f16(0x1p-25f) == 0x0000);                   /* tie below the smallest */
    CHECK(tl_f32_to_f16(0x1.8p-25f) == 0x0001);
    CHECK(tl_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);            /* tie: to even (1.0) */
    CHECK(tl_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);
    test_half_rows();
}

/* The float value of a bf16 or fp16 pattern, and a float rounded to one. */
static double half_value(tl_dtype t, uint16_t h) {
    return t == TL_BF16 ? tl_bf16_to_f32(h) : tl_f16_to_f32(h);
}

static uint16_t half_of(tl_dtype t, float f) {
    return t == TL_BF16 ? tl_f32_to_bf16(f) : tl_f32_to_f16(f);
}

/* The bf16 and fp16 forward and weight gradient, every instruction-set level
 * and thread count,
 * against a double reference of the same half-valued inputs: within one
 * rounding of the half type; and a bad neighbour entry is refused. */
static void test_half_conv_shape(int64_t ci, int64_t co) {
    const int64_t n_in = 60, n_out = 50, k = 5;
    uint16_t *x = xmalloc(sizeof(uint16_t) * (size_t)(n_in * ci));
    uint16_t *w = xmalloc(sizeof(uint16_t) * (size_t)(k * ci * co));
    uint16_t *y = xmalloc(sizeof(uint16_t) * (size_t)(n_out * co));
    int32_t *nbr = xmalloc(sizeof(int32_t) * (size_t)(n_out * k));
    double *ref = xmalloc(sizeof(double) * (size_t)(k * ci * co + n_out * co));
    for (int64_t i = 0; i < n_out * k; i++) nbr[i] = (int32_t)rnd((uint32_t)n_in + 1) - 1;
    const tl_dtype types[2] = {TL_BF16, TL_F16};
    const int levels[5] = {TL_SIMD_V4_AMX, TL_SIMD_V4_BF16, TL_SIMD_V4, TL_SIMD_V3, TL_SIMD_BASE};
    for (int t = 0; t < 2; t++) {
        const tl_dtype type = types[t];
        const double unit = type == TL_BF16 ? 0x1p-8 : 0x1p-11;
        for (int64_t i = 0; i < n_in * ci; i++)
            x[i] = half_of(type, rndf());
        for (int64_t i = 0; i < k * ci * co; i++)
            w[i] = half_of(type, rndf());
        memset(ref, 0, sizeof(double) * (size_t)(n_out * co));
        for (int64_t o = 0; o < n_out; o++)
            for (int64_t n = 0; n < k; n++) {
                int32_t i = nbr[o * k + n];
                for (int64_t a = 0; i >= 0 && a < ci; a++)
                    for (int64_t b = 0; b < co; b++)
                        ref[o * co + b] += half_value(type, x[i * ci + a]) *
                                           half_value(type, w[(n * ci + a) * co + b]);
            }
        tl_conv_desc d = {type, n_in, n_out, k, ci, co};
        for (int v = 0; v < 10; v++) {
            tl_ctx ctx = make_ctx(1 + v % 2, levels[v / 2]);
            memset(y, 0xff, sizeof(uint16_t) * (size_t)(n_out * co));
            CHECK(tl_implicit_gemm_forward(&ctx, &d, x, w, nbr, y) == TL_OK);
            for (int64_t i = 0; i < n_out * co; i++) {
                CHECK(fabs(half_value(type, y[i]) - ref[i]) <= unit * fabs(ref[i]) + 1e-5);
            }
        }
        /* Weight gradient: dw[n] = sum_o x[nbr[o, n]]^T dy[o], dy = the y above. */
        for (int64_t i = 0; i < k * ci * co; i++) ref[i] = 0;
        for (int64_t o = 0; o < n_out; o++)
            for (int64_t n = 0; n < k; n++) {
                int32_t i = nbr[o * k + n];
                for (int64_t a = 0; i >= 0 && a < ci; a++)
                    for (int64_t b = 0; b < co; b++)
                        ref[(n * ci + a) * co + b] +=
                            half_value(type, x[i * ci + a]) * half_value(type, y[o * co + b]);
            }
        uint16_t *dw = xmalloc(sizeof(uint16_t) * (size_t)(k * ci * co));
        for (int v = 0; v < 10; v++) {
            tl_ctx ctx = make_ctx(1 + v % 2, levels[v / 2]);
            CHECK(tl_implicit_gemm_weight_grad(&ctx, &d, x, y, nbr, dw) == TL_OK);
            for (int64_t i = 0; i < k * ci * co; i++) {
                CHECK(fabs(half_value(type, dw[i]) - ref[i]) <= unit * fabs(ref[i]) + 1e-3);
            }
        }
        free(dw);
        tl_ctx c1 = make_ctx(1, TL_SIMD_V4_AMX);
        nbr[7] = (int32_t)n_in;
        CHECK(tl_implicit_gemm_forward(&c1, &d, x, w, nbr, y) == TL_ERR_INVALID);
        nbr[7] = -1;
    }
    free(x), free(w), free(y), free(nbr), free(ref);
}

/* C_in 19: the staged weight gradient's in-place passes; 27: its panel over
 * converted rows zero-padded to 28. */
static void test_half_conv(void) {
    current = "half conv";
    test_half_conv_shape(19, 37);
    test_half_conv_shape(27, 37);
}

/* Maps whose output rows each have at most one neighbour (an inverse
 * transposed map), where the forward writes each listed row once instead of
 * adding to a zeroed one: against a double reference, the rows no kernel row
 * lists zero although y starts as NaN bytes, and, against the same map with
 * one row given a second neighbour (narrow tiles: the zeroing and adding
 * path; wide ones: split lists), bit for bit the same on every other row.
 * Widths: 8-row groups (16, 32), 4-row groups and scalar columns (37),
 * several panels (300). */
/* Variant v < 6 of a kernel check: 1 or 2 threads (v % 2) at AVX-512, AVX2
 * and the baseline (v / 2). */
static tl_ctx level_ctx(int v) {
    const int levels[3] = {TL_SIMD_V4, TL_SIMD_V3, TL_SIMD_BASE};
    return make_ctx(1 + v % 2, levels[v / 2]);
}

/* Fills f[0..n) with rndf() values; returns them as doubles (freed by the
 * caller), for the double references. */
static double *rnd_fill(float *f, int64_t n) {
    double *d = xmalloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) d[i] = f[i] = rndf();
    return d;
}

/* ref = the convolution of x by w over the table nbr, in double. */
static void single_ref(const int32_t *nbr, int64_t n_out, int64_t k, int64_t ci, int64_t co,
                       const double *x, const double *w, double *ref) {
    for (int64_t o = 0; o < n_out; o++)
        for (int64_t b = 0; b < co; b++) {
            double want = 0;
            for (int64_t n = 0; n < k; n++) {
                const int32_t i = nbr[o * k + n];
                for (int64_t a = 0; i >= 0 && a < ci; a++)
                    want += x[i * ci + a] * w[(n * ci + a) * co + b];
            }
            ref[o * co + b] = want;
        }
}

/* The half forwards of x and w (float values, rounded to each half type) over
 * the table nbr at every level (AMX tiles, dot products, float staging; 1
 * and 2 threads): within one rounding of the half type (plus tol) of the
 * double sums of the rounded operands. */
static void check_half_forwards(const int32_t *nbr, int64_t n_in, int64_t n_out, int64_t k,
                                int64_t ci, int64_t co, const float *x, const float *w,
                                double tol) {
    uint16_t *xh = xmalloc(sizeof(uint16_t) * (size_t)(n_in * ci));
    uint16_t *wh = xmalloc(sizeof(uint16_t) * (size_t)(k * ci * co));
    uint16_t *yh = xmalloc(sizeof(uint16_t) * (size_t)(n_out * co));
    double *xd = xmalloc(sizeof(double) * (size_t)(n_in * ci));
    double *wd = xmalloc(sizeof(double) * (size_t)(k * ci * co));
    double *ref = xmalloc(sizeof(double) * (size_t)(n_out * co));
    const int levels[5] = {TL_SIMD_V4_AMX, TL_SIMD_V4_BF16, TL_SIMD_V4, TL_SIMD_V3,
                           TL_SIMD_BASE};
    for (int bf = 0; bf < 2; bf++) {
        const tl_dtype type = bf ? TL_BF16 : TL_F16;
        const double unit = bf ? 0x1p-8 : 0x1p-11;
        for (int64_t i = 0; i < n_in * ci; i++) xh[i] = half_of(type, x[i]);
        for (int64_t i = 0; i < k * ci * co; i++) wh[i] = half_of(type, w[i]);
        for (int64_t i = 0; i < n_in * ci; i++) xd[i] = half_value(type, xh[i]);
        for (int64_t i = 0; i < k * ci * co; i++) wd[i] = half_value(type, wh[i]);
        single_ref(nbr, n_out, k, ci, co, xd, wd, ref);
        tl_conv_desc dh = {type, n_in, n_out, k, ci, co};
        for (int v = 0; v < 5; v++) {
            tl_ctx ctx = make_ctx(1 + v % 2, levels[v]);
            memset(yh, 0xff, sizeof(uint16_t) * (size_t)(n_out * co));
            CHECK(tl_implicit_gemm_forward(&ctx, &dh, xh, wh, nbr, yh) == TL_OK);
            for (int64_t e = 0; e < n_out * co; e++)
                CHECK(fabs(half_value(type, yh[e]) - ref[e]) <= unit * fabs(ref[e]) + tol);
        }
    }
    free(xh), free(wh), free(yh), free(xd), free(wd), free(ref);
}

static void test_conv_single(void) {
    current = "conv single";
    const int64_t n_in = 40, n_out = 301, k = 8, ci = 6;
    const int64_t widths[4] = {16, 32, 37, 300};
    int32_t *nbr = xmalloc(sizeof(int32_t) * (size_t)(n_out * k));
    for (int64_t o = 0; o < n_out; o++) {
        for (int64_t n = 0; n < k; n++) nbr[o * k + n] = -1;
        if (o % 7 != 3) nbr[o * k + (int64_t)rnd((uint32_t)k)] = (int32_t)rnd((uint32_t)n_in);
    }
    for (int wi = 0; wi < 4; wi++) {
        const int64_t co = widths[wi];
        float *x = xmalloc(sizeof(float) * (size_t)(n_in * ci));
        float *w = xmalloc(sizeof(float) * (size_t)(k * ci * co));
        float *y = xmalloc(sizeof(float) * (size_t)(n_out * co));
        float *y2 = xmalloc(sizeof(float) * (size_t)(n_out * co));
        for (int64_t i = 0; i < n_in * ci; i++) x[i] = rndf();
        for (int64_t i = 0; i < k * ci * co; i++) w[i] = rndf();
        double *xd = xmalloc(sizeof(double) * (size_t)(n_in * ci));
        double *wd = xmalloc(sizeof(double) * (size_t)(k * ci * co));
        double *ref = xmalloc(sizeof(double) * (size_t)(n_out * co));
        for (int64_t i = 0; i < n_in * ci; i++) xd[i] = x[i];
        for (int64_t i = 0; i < k * ci * co; i++) wd[i] = w[i];
        single_ref(nbr, n_out, k, ci, co, xd, wd, ref);
        tl_conv_desc d = {TL_F32, n_in, n_out, k, ci, co};
        for (int variant = 0; variant < 6; variant++) {
            tl_ctx ctx = make_ctx(1 + variant % 2, variant < 2   ? TL_SIMD_BASE
                                                   : variant < 4 ? TL_SIMD_V3
                                                                 : TL_SIMD_V4);
            memset(y, 0xff, sizeof(float) * (size_t)(n_out * co));
            CHECK(tl_implicit_gemm_forward(&ctx, &d, x, w, nbr, y) == TL_OK);
            for (int64_t e = 0; e < n_out * co; e++) CHECK(fabs(y[e] - ref[e]) < 1e-4);
            /* Row 1 given a second neighbour: its tile lists a row twice, so
             * it takes the path that zeroes and adds (narrow tiles) or
             * splits its lists (wide ones); the other rows must not change. */
            int64_t second = 0;
            while (nbr[1 * k + second] >= 0) second++;
            nbr[1 * k + second] = 5;
            memset(y2, 0xff, sizeof(float) * (size_t)(n_out * co));
            CHECK(tl_implicit_gemm_forward(&ctx, &d, x, w, nbr, y2) == TL_OK);
            nbr[1 * k + second] = -1;
            for (int64_t o = 0; o < n_out; o++)
                if (o != 1)
                    CHECK(memcmp(y + o * co, y2 + o * co, sizeof(float) * (size_t)co) == 0);
            for (int64_t b = 0; b < co; b++) { /* and row 1 has both */
                double want = 0;
                for (int64_t a = 0; a < ci; a++)
                    want += (double)x[5 * ci + a] * w[(second * ci + a) * co + b];
                CHECK(fabs(y2[co + b] - y[co + b] - want) < 1e-4);
            }
        }
        /* The half forwards on the same map (unlisted rows 0). */
        check_half_forwards(nbr, n_in, n_out, k, ci, co, x, w, 1e-5);
        free(xd), free(wd), free(ref);
        free(x), free(w), free(y), free(y2);
    }
    free(nbr);
}

/* Forwards with more input channels than one L1 weight panel holds
 * (TL_FWD_CIN_BLOCK): each kernel row's sums run over the input channels in
 * blocks added to the row one after another.  Against a double reference,
 * and bit for bit the same at every thread count and FMA instruction set
 * (AVX2 and AVX-512 cut the output columns differently, never the input
 * channels); c_out = 130 gives every tile several panels, whose x rows must
 * start again at channel 0.  On a map with many neighbours per row and on
 * one with at most one (whose rows are written by their first block, not
 * added to); the half forwards too. */
static void test_conv_wide_cin(void) {
    current = "conv wide c_in";
    const int64_t n_in = 50, n_out = 70, k = 27;
    /* the last two: groups of 8 rows on a 32-column last panel (C_out = 96)
     * and on a 48-column tile (8 rows of 3 vectors) */
    const int64_t shapes[5][2] = {{129, 130}, {300, 17}, {256, 64}, {60, 96}, {50, 48}};
    int32_t *nbr = xmalloc(sizeof(int32_t) * (size_t)(n_out * k));
    /* map 0: about 11 of 27 entries per row; map 1: at most one (rows that
     * write their sums instead of adding them, tl_tile_single) */
    for (int si = 0; si < 10; si++) {
        if (si % 5 == 0)
            for (int64_t o = 0; o < n_out; o++)
                for (int64_t n = 0; n < k; n++)
                    nbr[o * k + n] = (si < 5 ? rnd(5) < 2 : n == o % k && o % 5 != 2)
                                         ? (int32_t)rnd((uint32_t)n_in)
                                         : -1;
        const int64_t ci = shapes[si % 5][0], co = shapes[si % 5][1];
        float *x = xmalloc(sizeof(float) * (size_t)(n_in * ci));
        float *w = xmalloc(sizeof(float) * (size_t)(k * ci * co));
        float *y = xmalloc(sizeof(float) * (size_t)(n_out * co));
        float *y4 = xmalloc(sizeof(float) * (size_t)(n_out * co));
        double *ref = xmalloc(sizeof(double) * (size_t)(n_out * co));
        double *xd = rnd_fill(x, n_in * ci), *wd = rnd_fill(w, k * ci * co);
        single_ref(nbr, n_out, k, ci, co, xd, wd, ref);
        tl_conv_desc d = {TL_F32, n_in, n_out, k, ci, co};
        for (int v = 0; v < 6; v++) {
            tl_ctx ctx = level_ctx(v);
            float *out = v == 0 ? y4 : y;
            memset(out, 0xff, sizeof(float) * (size_t)(n_out * co));
            CHECK(tl_implicit_gemm_forward(&ctx, &d, x, w, nbr, out) == TL_OK);
            for (int64_t e = 0; e < n_out * co; e++)
                CHECK(fabs(out[e] - ref[e]) < 1e-3 * (1 + fabs(ref[e])));
            if (v > 0 && v < 4)
                CHECK(memcmp(y, y4, sizeof(float) * (size_t)(n_out * co)) == 0);
        }
        /* The half forwards (the float-staged ones block the input channels
         * as the float forward does). */
        check_half_forwards(nbr, n_in, n_out, k, ci, co, x, w, 1e-3);
        free(x), free(w), free(y), free(y4), free(ref), free(xd), free(wd);
    }
    free(nbr);
}

/* ref = the weight gradient of x and dy over the table nbr, in double. */
static void wgrad_ref(const int32_t *nbr, int64_t n_out, int64_t k, int64_t ci, int64_t co,
                      const double *x, const double *dy, double *ref) {
    memset(ref, 0, sizeof(double) * (size_t)(k * ci * co));
    for (int64_t o = 0; o < n_out; o++)
        for (int64_t n = 0; n < k; n++) {
            const int32_t i = nbr[o * k + n];
            for (int64_t a = 0; i >= 0 && a < ci; a++)
                for (int64_t b = 0; b < co; b++)
                    ref[(n * ci + a) * co + b] += x[i * ci + a] * dy[o * co + b];
        }
}

/* Weight gradients wide enough for the packed panel (C_in >= 64, or 40 with
 * wide C_out), with more pairs per kernel row than one chunk of the panel
 * packs (tl_mk_panel_pairs), C_in not a multiple of 4 (padded packed rows);
 * C_out of 3 and 5 vectors (blocks of 3 with AVX-512); and one vector wide
 * (C_out = 16: 16 input channels a pass with AVX-512, then 8, 4 and 1): against a double reference, bit for bit the same at
 * every thread count, and at both FMA instruction sets where both take the
 * same path (C_in = 45, C_out = 16 runs the panel with AVX2, whose passes
 * are 8 columns wide, and the 8-row passes with AVX-512). */
static void test_wgrad_panel(void) {
    current = "wgrad panel";
    const int64_t n_in = 300, n_out = 400, k = 27;
    /* c_in, c_out, whether AVX2 and AVX-512 add in the same order */
    const int64_t shapes[7][3] = {{66, 70, 1},  {129, 20, 1}, {44, 100, 1}, {16, 16, 1},
                                  {45, 16, 0},  {64, 48, 1},  {70, 80, 1}};
    int32_t *nbr = xmalloc(sizeof(int32_t) * (size_t)(n_out * k));
    for (int64_t e = 0; e < n_out * k; e++)
        nbr[e] = rnd(5) < 2 ? (int32_t)rnd((uint32_t)n_in) : -1;
    for (int si = 0; si < 7; si++) {
        const int64_t ci = shapes[si][0], co = shapes[si][1];
        float *x = xmalloc(sizeof(float) * (size_t)(n_in * ci));
        float *dy = xmalloc(sizeof(float) * (size_t)(n_out * co));
        float *dw = xmalloc(sizeof(float) * (size_t)(k * ci * co));
        float *dw4 = xmalloc(sizeof(float) * (size_t)(k * ci * co));
        double *ref = xmalloc(sizeof(double) * (size_t)(k * ci * co));
        double *xd = rnd_fill(x, n_in * ci), *dyd = rnd_fill(dy, n_out * co);
        wgrad_ref(nbr, n_out, k, ci, co, xd, dyd, ref);
        tl_conv_desc d = {TL_F32, n_in, n_out, k, ci, co};
        for (int v = 0; v < 6; v++) {
            tl_ctx ctx = level_ctx(v);
            float *out = v == 0 ? dw4 : dw;
            memset(out, 0xff, sizeof(float) * (size_t)(k * ci * co));
            CHECK(tl_implicit_gemm_weight_grad(&ctx, &d, x, dy, nbr, out) == TL_OK);
            for (int64_t e = 0; e < k * ci * co; e++)
                CHECK(fabs(out[e] - ref[e]) < 1e-3 * (1 + fabs(ref[e])));
            /* v 1: AVX-512 at 2 threads against 1; v 2: AVX2 against AVX-512
             * (then kept); v 3: AVX2 at 2 threads against 1. */
            if (v == 1 || v == 3 || (v == 2 && shapes[si][2]))
                CHECK(memcmp(dw, dw4, sizeof(float) * (size_t)(k * ci * co)) == 0);
            if (v == 2) memcpy(dw4, dw, sizeof(float) * (size_t)(k * ci * co));
        }
        free(x), free(dy), free(dw), free(dw4), free(ref), free(xd), free(dyd);
    }
    free(nbr);
}

/* The float64 weight gradient one vector wide (C_out = 8 doubles: the
 * 16-row passes of AVX-512), against a double reference of the same sums. */
static void test_wgrad_f64(void) {
    current = "wgrad f64";
    const int64_t n_in = 120, n_out = 150, k = 27, ci = 21, co = 8;
    int32_t *nbr = xmalloc(sizeof(int32_t) * (size_t)(n_out * k));
    for (int64_t e = 0; e < n_out * k; e++)
        nbr[e] = rnd(3) == 0 ? (int32_t)rnd((uint32_t)n_in) : -1;
    double *x = xmalloc(sizeof(double) * (size_t)(n_in * ci));
    double *dy = xmalloc(sizeof(double) * (size_t)(n_out * co));
    double *dw = xmalloc(sizeof(double) * (size_t)(k * ci * co));
    double *ref = xmalloc(sizeof(double) * (size_t)(k * ci * co));
    for (int64_t i = 0; i < n_in * ci; i++) x[i] = rndf();
    for (int64_t i = 0; i < n_out * co; i++) dy[i] = rndf();
    wgrad_ref(nbr, n_out, k, ci, co, x, dy, ref);
    tl_conv_desc d = {TL_F64, n_in, n_out, k, ci, co};
    for (int v = 0; v < 4; v++) {
        tl_ctx ctx = make_ctx(1 + v % 2, v < 2 ? TL_SIMD_V4 : TL_SIMD_V3);
        memset(dw, 0xff, sizeof(double) * (size_t)(k * ci * co));
        CHECK(tl_implicit_gemm_weight_grad(&ctx, &d, x, dy, nbr, dw) == TL_OK);
        for (int64_t e = 0; e < k * ci * co; e++) CHECK(fabs(dw[e] - ref[e]) < 1e-9);
    }
    free(x), free(dy), free(dw), free(ref), free(nbr);
}

/* ---- pooling --------------------------------------------------------------- */

static void test_pool(void) {
    current = "pool";
    tl_coord *in = random_rows(70, 2, 0, 8);
    tl_geom g = geom(2, 2, 2, 2, 0, 1);
    int64_t range[3] = {4, 4, 4}, n_out, k;
    tl_coord *out = generated_support(in, 70, &g, range, 2, &n_out);
    int32_t *nbr = kmap_checked(in, 70, out, n_out, &g, &k);
    int32_t *rev = xmalloc(sizeof(int32_t) * (size_t)(70 * k));
    tl_ctx ctx = make_ctx(2, TL_SIMD_V4);
    CHECK(tl_kmap_reverse(&ctx, nbr, n_out, k, 70, rev) == TL_OK);
    const int64_t c = 3;
    float *x = xmalloc(sizeof(float) * (size_t)(70 * c)), *y = xmalloc(sizeof(float) * (size_t)(n_out * c));
    float *dy = xmalloc(sizeof(float) * (size_t)(n_out * c)), *dx = xmalloc(sizeof(float) * (size_t)(70 * c));
    int32_t *arg = xmalloc(sizeof(int32_t) * (size_t)(n_out * c));
    for (int64_t i = 0; i < 70 * c; i++) x[i] = rndf();
    for (int64_t i = 0; i < n_out * c; i++) dy[i] = rndf();
    tl_pool_desc d = {TL_F32, 70, n_out, k, c};
    for (int avg = 0; avg < 2; avg++) {
        CHECK(tl_pool_sum(&ctx, &d, x, nbr, avg, y) == TL_OK);
        for (int64_t o = 0; o < n_out; o++)
            for (int64_t ch = 0; ch < c; ch++) {
                double s = 0;
                int cnt = 0;
                for (int64_t n = 0; n < k; n++)
                    if (nbr[o * k + n] >= 0) s += x[nbr[o * k + n] * c + ch], cnt++;
                if (avg) s = cnt ? s / cnt : 0;
                CHECK(fabs(y[o * c + ch] - s) < 1e-5);
            }
    }
    CHECK(tl_pool_max(&ctx, &d, x, nbr, y, arg) == TL_OK);
    for (int64_t o = 0; o < n_out; o++)
        for (int64_t ch = 0; ch < c; ch++) {
            int32_t best = -1;
            for (int64_t n = 0; n < k; n++) {
                int32_t i = nbr[o * k + n];
                if (i >= 0 && (best < 0 || x[i * c + ch] > x[best * c + ch])) best = i;
            }
            CHECK(arg[o * c + ch] == best);
            CHECK(y[o * c + ch] == (best >= 0 ? x[best * c + ch] : 0.0f));
        }
    tl_pool_desc db = {TL_F32, 70, n_out, k, c};
    CHECK(tl_pool_max_backward(&ctx, &db, dy, rev, arg, dx) == TL_OK);
    for (int64_t i = 0; i < 70; i++)
        for (int64_t ch = 0; ch < c; ch++) {
            double s = 0;
            for (int64_t o = 0; o < n_out; o++)
                if (arg[o * c + ch] == i) s += dy[o * c + ch];
            CHECK(fabs(dx[i * c + ch] - s) < 1e-5);
        }
    /* A table entry out of range is refused. */
    int32_t saved = nbr[0];
    nbr[0] = 70;
    CHECK(tl_pool_sum(&ctx, &d, x, nbr, 0, y) == TL_ERR_INVALID);
    nbr[0] = saved;
    free(x), free(y), free(dy), free(dx), free(arg), free(rev), free(nbr), free(out), free(in);
}

/* ---- voxelization ----------------------------------------------------------- */

static void test_voxel(void) {
    current = "voxel";
    enum { N = 300, C = 2 };
    tl_ctx ctx = make_ctx(2, TL_SIMD_V4);
    tl_voxel_grid grid = {{0.5, 0.25, 1.0}, {-1.0, 0.0, 2.0}};
    float pts[N * 3], feats[N * C];
    int64_t batch[N];
    for (int p = 0; p < N; p++) {
        pts[p * 3 + 0] = -1.0f + (float)rnd(400) / 100.0f;
        pts[p * 3 + 1] = (float)rnd(100) / 100.0f;
        pts[p * 3 + 2] = 2.0f + (float)rnd(300) / 100.0f;
        batch[p] = rnd(2);
        for (int ch = 0; ch < C; ch++) feats[p * C + ch] = rndf();
    }
    tl_coord rows[N], uniq[N];
    int64_t bad, inverse[N], m;
    CHECK(tl_voxel_quantize(&ctx, TL_F32, pts, batch, N, &grid, rows, &bad) == TL_OK);
    for (int p = 0; p < N; p++) {
        tl_coord want = {(int32_t)batch[p],
                         (int32_t)floor(((double)pts[p * 3] - grid.origin[0]) / grid.size[0]),
                         (int32_t)floor(((double)pts[p * 3 + 1] - grid.origin[1]) / grid.size[1]),
                         (int32_t)floor(((double)pts[p * 3 + 2] - grid.origin[2]) / grid.size[2])};
        CHECK(coord_eq(rows[p], want));
    }
    CHECK(tl_voxel_unique(&ctx, rows, N, uniq, &m, inverse) == TL_OK);
    for (int64_t i = 1; i < m; i++) CHECK(coord_cmp(&uniq[i - 1], &uniq[i]) < 0);
    for (int p = 0; p < N; p++) CHECK(inverse[p] >= 0 && inverse[p] < m && coord_eq(uniq[inverse[p]], rows[p]));
    for (int64_t i = 0; i < m; i++) CHECK(linear_find(rows, N, uniq[i]) >= 0);

    float *out = xmalloc(sizeof(float) * (size_t)(m * C));
    int64_t *arg = xmalloc(sizeof(int64_t) * (size_t)(m * C));
    for (int red = 0; red < 3; red++) {
        CHECK(tl_voxel_reduce(&ctx, TL_F32, (tl_voxel_reduction)red, feats, N, C, inverse, m, out,
                              arg) == TL_OK);
        for (int64_t v = 0; v < m; v++)
            for (int ch = 0; ch < C; ch++) {
                double s = 0, best = -INFINITY;
                int cnt = 0;
                int64_t first = -1;
                for (int p = 0; p < N; p++)
                    if (inverse[p] == v) {
                        s += feats[p * C + ch], cnt++;
                        if (feats[p * C + ch] > best) best = feats[p * C + ch], first = p;
                    }
                double want = red == TL_VOXEL_MEAN ? s / cnt : red == TL_VOXEL_SUM ? s : best;
                CHECK(fabs(out[v * C + ch] - want) < 1e-5);
                if (red == TL_VOXEL_MAX) CHECK(arg[v * C + ch] == first);
            }
    }
    /* Devoxelization maps: nearest is the point's own voxel; trilinear weights
     * of present corners match the formula. */
    int64_t idx[N * 8];
    double w[N * 8];
    CHECK(tl_voxel_devoxel_map(&ctx, TL_F32, pts, batch, N, &grid, uniq, m, 0, idx, w, &bad) ==
          TL_OK);
    for (int p = 0; p < N; p++) CHECK(idx[p] == inverse[p] && w[p] == 1.0);
    CHECK(tl_voxel_devoxel_map(&ctx, TL_F32, pts, batch, N, &grid, uniq, m, 1, idx, w, &bad) ==
          TL_OK);
    for (int p = 0; p < N; p++)
        for (int j = 0; j < 8; j++) {
            double weight = 1;
            tl_coord corner = {(int32_t)batch[p], 0, 0, 0};
            int32_t *cc[3] = {&corner.x, &corner.y, &corner.z};
            int neg = 0;
            for (int a = 0; a < 3; a++) {
                double u = ((double)pts[p * 3 + a] - grid.origin[a]) / grid.size[a] - 0.5;
                double f = floor(u);
                int dd = (j >> (2 - a)) & 1;
                weight *= dd ? u - f : 1 - (u - f);
                *cc[a] = (int32_t)f + dd;
                neg |= *cc[a] < 0;
            }
            int64_t want = neg ? -1 : linear_find(uniq, m, corner);
            CHECK(idx[p * 8 + j] == want);
            CHECK(fabs(w[p * 8 + j] - (want >= 0 ? weight : 0.0)) < 1e-9);
        }
    float *back = xmalloc(sizeof(float) * N * C);
    CHECK(tl_voxel_gather(&ctx, TL_F32, out, m, C, idx, w, N, 8, back) == TL_OK);
    for (int p = 0; p < N; p++)
        for (int ch = 0; ch < C; ch++) {
            double s = 0;
            for (int j = 0; j < 8; j++)
                if (idx[p * 8 + j] >= 0) s += w[p * 8 + j] * out[idx[p * 8 + j] * C + ch];
            CHECK(fabs(back[p * C + ch] - s) < 1e-5);
        }
    /* Failure paths: a point below the origin, a negative batch. */
    pts[3 * 17] = -5.0f;
    CHECK(tl_voxel_quantize(&ctx, TL_F32, pts, batch, N, &grid, rows, &bad) == TL_ERR_INVALID);
    CHECK(bad == 17);
    pts[3 * 17] = 0.0f;
    batch[5] = -1;
    CHECK(tl_voxel_quantize(&ctx, TL_F32, pts, batch, N, &grid, rows, &bad) == TL_ERR_INVALID);
    CHECK(bad == 5);
    free(out), free(arg), free(back);
}

/* Integer limits: every coordinate sum and size product that would leave its
 * type is refused with TL_ERR_OVERFLOW (or TL_ERR_INVALID for a range the
 * contract excludes), never wrapped into a wrong row or an out-of-bounds
 * index.  No buffer is touched: sizes are checked before any access. */
static void test_int_limits(void) {
    current = "int limits";
    tl_ctx ctx = {.threads = 2, .device = -1};
    /* Generative support: c * s + K - 1 must fit int32 (2^30 * 2 + 1 does not). */
    tl_geom gen = {{2, 2, 2}, {2, 2, 2}, {0, 0, 0}, {1, 1, 1}};
    tl_coord far[1] = {{0, 1 << 30, 0, 0}}, near[1] = {{0, (1 << 30) - 1, 0, 0}};
    tl_coord out[8];
    int64_t m = -1;
    CHECK(tl_generative_support(far, 1, &gen, out, 8, &m) == TL_ERR_OVERFLOW && m == 0);
    CHECK(tl_generative_support(near, 1, &gen, out, 8, &m) == TL_OK && m == 8);
    CHECK(out[7].x == INT32_MAX); /* the largest row, exact */
    /* A huge stride alone: 1 * 2^30 * ... with stride INT32_MAX overflows. */
    tl_geom wide = {{1, 1, 1}, {INT32_MAX, 1, 1}, {0, 0, 0}, {1, 1, 1}};
    tl_coord two[1] = {{0, 2, 0, 0}};
    CHECK(tl_generative_support(two, 1, &wide, out, 8, &m) == TL_ERR_OVERFLOW);
    /* Kernel maps: o * s - p + r * d is formed in int64, so an output row
     * whose physical position passes 2^31 - 1 finds no input (it must not
     * wrap onto row 0 or a negative coordinate). */
    tl_geom s2 = {{2, 1, 1}, {2, 1, 1}, {0, 0, 0}, {1, 1, 1}};
    tl_coord in[2] = {{0, 0, 0, 0}, {0, INT32_MAX - 1, 0, 0}};
    tl_coord q[2] = {{0, 0, 0, 0}, {0, 1 << 30, 0, 0}}; /* 2^30 * 2 = 2^31: beyond int32 */
    int32_t nbr[4], rev[4];
    CHECK(tl_kmap_build(&ctx, in, 2, q, 2, &s2, nbr) == TL_OK);
    CHECK(nbr[0] == 0 && nbr[1] == TL_NO_ROW && nbr[2] == TL_NO_ROW && nbr[3] == TL_NO_ROW);
    tl_coord q2[1] = {{0, (1 << 30) - 1, 0, 0}}; /* 2^31 - 2 (+1): the input row exists */
    CHECK(tl_kmap_build(&ctx, in, 2, q2, 1, &s2, nbr) == TL_OK);
    CHECK(nbr[0] == 1 && nbr[1] == TL_NO_ROW);
    /* Strided support generation: out_range beyond 2^31 is refused. */
    int64_t big_range[3] = {(int64_t)INT32_MAX + 2, 1, 1}, n_out = -1;
    CHECK(tl_coords_generate(in, 2, &s2, big_range, out, 8, &n_out) == TL_ERR_INVALID);
    int64_t bound = -1, full[3] = {(int64_t)INT32_MAX + 1, INT32_MAX, INT32_MAX};
    CHECK(tl_coords_generate_bound(INT32_MAX, &s2, full, INT32_MAX, &bound) == TL_OK);
    CHECK(bound > 0); /* saturates rather than wrapping negative */
    /* Tables: rows and kernel rows beyond int32 (rows * k would leave int64). */
    int64_t offsets[2];
    CHECK(tl_pairs_count(&ctx, nbr, (int64_t)TL_ROW_MAX + 1, 1, offsets) == TL_ERR_OVERFLOW);
    CHECK(tl_pairs_count(&ctx, nbr, 1, (int64_t)1 << 40, offsets) == TL_ERR_OVERFLOW);
    CHECK(tl_kmap_reverse(&ctx, nbr, 1, (int64_t)1 << 40, 1, rev) == TL_ERR_OVERFLOW);
    tl_pool_desc pd = {TL_F32, 1, 1, (int64_t)1 << 40, 1};
    float x[1] = {1}, y[1];
    int32_t arg[1];
    CHECK(tl_pool_sum(&ctx, &pd, x, nbr, 0, y) == TL_ERR_OVERFLOW);
    tl_pool_desc pc = {TL_F32, 1 << 20, 1, 1, (int64_t)1 << 50}; /* rows x channels > 2^63 */
    CHECK(tl_pool_max(&ctx, &pc, x, nbr, y, arg) == TL_ERR_OVERFLOW);
    CHECK(tl_pool_max_backward(&ctx, &pc, y, rev, arg, x) == TL_ERR_OVERFLOW);
    /* Voxel reductions and gathers: points x channels. */
    int64_t inv[1] = {0}, idx[1] = {0};
    double w[1] = {1};
    CHECK(tl_voxel_reduce(&ctx, TL_F32, TL_VOXEL_SUM, x, (int64_t)1 << 40, (int64_t)1 << 30,
                          inv, 1, y, NULL) == TL_ERR_OVERFLOW);
    CHECK(tl_voxel_gather(&ctx, TL_F32, x, 1, (int64_t)1 << 40, idx, w, (int64_t)1 << 40, 1,
                          y) == TL_ERR_OVERFLOW);
    /* Convolution sizes (tl_conv_desc_check). */
    tl_conv_desc cd = {TL_F32, 1, 1, 1, (int64_t)1 << 40, (int64_t)1 << 40};
    CHECK(tl_conv_desc_check(&cd) == TL_ERR_OVERFLOW);
    /* Voxel coordinates beyond int32 and batch indices beyond int32. */
    tl_voxel_grid grid = {{1, 1, 1}, {0, 0, 0}};
    float pt[3] = {3e9f, 0, 0};
    int64_t batch[1] = {(int64_t)INT32_MAX + 1}, bad = -1;
    tl_coord row[1];
    CHECK(tl_voxel_quantize(&ctx, TL_F32, pt, NULL, 1, &grid, row, &bad) == TL_ERR_OVERFLOW);
    CHECK(bad == 0);
    pt[0] = 0;
    CHECK(tl_voxel_quantize(&ctx, TL_F32, pt, batch, 1, &grid, row, &bad) == TL_ERR_OVERFLOW);
}

/* ---- the implicit GEMM's per-tile neighbour lists ------------------------ */

/* The vector levels this CPU runs, lowest first (baseline, then AVX2, then
 * AVX-512 where it has them): the listing's paths.  Returns their count. */
/* An (n_out, k) table with about a quarter of its entries present, each a
 * random row below n_in. */
static int32_t *random_table(int64_t n_out, int64_t k, int64_t n_in) {
    int32_t *nbr = xmalloc(sizeof(int32_t) * (size_t)(n_out * k));
    for (int64_t e = 0; e < n_out * k; e++)
        nbr[e] = rnd(4) == 0 ? (int32_t)rnd((uint32_t)n_in) : -1;
    return nbr;
}

static int cpu_levels(int levels[3]) {
    levels[0] = TL_SIMD_BASE;
    levels[1] = TL_SIMD_V3;
    levels[2] = TL_SIMD_V4;
    return tl_simd_level() >= TL_SIMD_V4 ? 3 : tl_simd_level() >= TL_SIMD_V3 ? 2 : 1;
}

/* tl_point_rows by every path the CPU has against x + idx * x_bytes and
 * y + rows * y_bytes, for 0 to 20 rows (whole vector steps and tails). */
static void test_point_rows(void) {
    int levels[3];
    const int paths = cpu_levels(levels);
    static char xbase[1], ybase[1];
    current = "point_rows";
    for (int path = 0; path < paths; path++)
        for (int64_t c = 0; c <= 20; c++) {
            int32_t idx[20] = {0}, rows[20] = {0};
            const char *xr[21], *yr[21];
            for (int64_t q = 0; q < c; q++) {
                idx[q] = (int32_t)rnd(1 << 30);
                rows[q] = (int32_t)rnd(4096);
            }
            xr[c] = yr[c] = NULL; /* past the rows: untouched */
            tl_point_rows(levels[path], idx, rows, c, xbase, 136, (void *)xr, ybase, 4100,
                          (void *)yr);
            for (int64_t q = 0; q < c; q++)
                CHECK((uintptr_t)xr[q] == (uintptr_t)xbase + (uintptr_t)idx[q] * 136u &&
                      (uintptr_t)yr[q] == (uintptr_t)ybase + (uintptr_t)rows[q] * 4100u);
            CHECK(xr[c] == NULL && yr[c] == NULL);
        }
}

/* tl_list_tile (and over a range of kernel rows, tl_list_tile_range) against
 * a direct reading of the table, by every path the CPU has (AVX-512:
 * transposed 16 x 16, AVX2: 8 x 8, for k >= 4): every kernel row's present
 * entries in row order, and the largest entry + 1 (wrapping for entries below
 * -1).  A table with every entry present fills each list to its end, where
 * the vector paths' stores must stop; m and k not multiples of 16 or 8 leave
 * partial steps. */
/* Lists nbr for d's forward tiles (tl_implicit_gemm_list_rows): *lists owns
 * its three arrays (free_lists). */
static void build_lists(const tl_ctx *ctx, const tl_conv_desc *d, const int32_t *nbr,
                        tl_tile_lists *lists) {
    const int64_t rows = tl_implicit_gemm_list_rows(ctx, d);
    CHECK(rows >= 1);
    const int64_t nt = tl_tile_lists_tiles(d->n_out, rows > 0 ? rows : 1);
    int64_t *st = xmalloc(sizeof(int64_t) * (size_t)(nt * d->k + 1)), top = 0;
    CHECK(tl_tile_lists_count(ctx, nbr, d->n_out, d->k, rows > 0 ? rows : 1, st, &top) == TL_OK);
    int32_t *in = xmalloc(sizeof(int32_t) * (size_t)(st[nt * d->k] + 1));
    int32_t *lr = xmalloc(sizeof(int32_t) * (size_t)(st[nt * d->k] + 1));
    CHECK(tl_tile_lists_fill(ctx, nbr, d->n_out, d->k, rows > 0 ? rows : 1, st, top, in, lr) ==
          TL_OK);
    *lists = (tl_tile_lists){rows, top, st, in, lr};
}

static void free_lists(tl_tile_lists *lists) {
    free((void *)lists->start);
    free((void *)lists->in);
    free((void *)lists->rows);
}

/* n random values of dtype t at p. */
static void fill_random(tl_dtype t, void *p, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float v = rndf();
        if (t == TL_F32) ((float *)p)[i] = v;
        if (t == TL_F64) ((double *)p)[i] = v;
        if (t == TL_BF16 || t == TL_F16) ((uint16_t *)p)[i] = half_of(t, v);
    }
}

/* d's forward over nbr's lists is bitwise its forward over nbr. */
static void check_listed_forward(const tl_ctx *ctx, const tl_conv_desc *d, const int32_t *nbr,
                                 const tl_tile_lists *lists) {
    const size_t es = d->dtype == TL_F64 ? 8 : d->dtype == TL_F32 ? 4 : 2;
    char *x = xmalloc(es * (size_t)(d->n_in * d->c_in));
    char *w = xmalloc(es * (size_t)(d->k * d->c_in * d->c_out));
    char *y = xmalloc(es * (size_t)(d->n_out * d->c_out));
    char *y2 = xmalloc(es * (size_t)(d->n_out * d->c_out));
    fill_random(d->dtype, x, d->n_in * d->c_in);
    fill_random(d->dtype, w, d->k * d->c_in * d->c_out);
    memset(y2, 0xff, es * (size_t)(d->n_out * d->c_out));
    CHECK(tl_implicit_gemm_forward(ctx, d, x, w, nbr, y) == TL_OK);
    CHECK(tl_implicit_gemm_forward_listed(ctx, d, x, w, nbr, lists, y2) == TL_OK);
    CHECK(memcmp(y, y2, es * (size_t)(d->n_out * d->c_out)) == 0);
    /* Lists for other tiles, or naming a row past n_in, are refused. */
    tl_tile_lists other = *lists;
    other.tile_rows = lists->tile_rows + 1;
    CHECK(tl_implicit_gemm_forward_listed(ctx, d, x, w, nbr, &other, y2) == TL_ERR_INVALID);
    tl_conv_desc fewer = *d;
    fewer.n_in = lists->top - 1;
    if (lists->top > 0)
        CHECK(tl_implicit_gemm_forward_listed(ctx, &fewer, x, w, nbr, lists, y2) ==
              TL_ERR_INVALID);
    free(x);
    free(w);
    free(y);
    free(y2);
}

/* Every dtype at a width with lists (float32 and float64 at 128 and 256 bytes
 * an output row: tiles whose rows are zeroed or written first); float32 and
 * float64 wider than 256 bytes a row have none (their tiles split). */
static void check_forward_over_lists(const tl_ctx *ctx, const int32_t *nbr, int64_t n_in,
                                     int64_t n_out, int64_t k) {
    static const tl_dtype types[] = {TL_F32, TL_F64, TL_BF16, TL_F16, TL_F32, TL_F64};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        const int64_t row = i < 4 ? 128 : 256; /* bytes an fp32 or fp64 output row */
        const int64_t cin = 3 + 5 * (int64_t)(i % 4);
        const int64_t cout = types[i] == TL_F32 ? row / 4 : types[i] == TL_F64 ? row / 8 : 16;
        tl_conv_desc d = {types[i], n_in, n_out, k, cin, cout};
        tl_tile_lists lists;
        build_lists(ctx, &d, nbr, &lists);
        if (lists.tile_rows >= 1) check_listed_forward(ctx, &d, nbr, &lists);
        if (row == 256) {
            tl_conv_desc wide = d;
            wide.c_out = cout + 1;
            CHECK(tl_implicit_gemm_list_rows(ctx, &wide) == 0);
            double *x = xmalloc(sizeof(double) * (size_t)(n_in * cin));
            double *w = xmalloc(sizeof(double) * (size_t)(k * cin * wide.c_out));
            double *y = xmalloc(sizeof(double) * (size_t)(n_out * wide.c_out));
            CHECK(tl_implicit_gemm_forward_listed(ctx, &wide, x, w, nbr, &lists, y) ==
                  TL_ERR_INVALID);
            free(x);
            free(w);
            free(y);
        }
        free_lists(&lists);
    }
}

/* A half type at 72 columns: lists at any width. */
static void check_half_over_lists(const tl_ctx *ctx, tl_dtype t, const int32_t *nbr,
                                  int64_t n_in, int64_t n_out, int64_t k) {
    tl_conv_desc d = {t, n_in, n_out, k, 8, 72};
    tl_tile_lists lists;
    build_lists(ctx, &d, nbr, &lists);
    if (lists.tile_rows >= 1) check_listed_forward(ctx, &d, nbr, &lists);
    free_lists(&lists);
}

/* The weight gradient over lists of its blocks' rows is bitwise its gradient
 * over nbr (float32, float64); lists of other tiles run over nbr; the half
 * types and lists naming a row past n_in are refused.  Blocks of several
 * tiles (tl_wgrad_block_rows): C_out = 7 four, 24 two in float32 and one in
 * float64. */
static void check_wgrad_over_lists(const tl_ctx *ctx, const int32_t *nbr, int64_t n_in,
                                   int64_t n_out, int64_t k) {
    static const tl_dtype types[] = {TL_F32, TL_F64};
    for (size_t i = 0; i < 4; i++) {
        const int64_t cout = i < 2 ? 7 : 24;
        tl_conv_desc d = {types[i % 2], n_in, n_out, k, 5, cout};
        const size_t es = d.dtype == TL_F64 ? 8 : 4, wn = (size_t)(k * 5 * cout);
        for (int own = 0; own < 2; own++) { /* the blocks' tiles, or others */
            const int64_t rows = own ? tl_implicit_gemm_weight_grad_list_rows(ctx, &d) : 32;
            CHECK(rows >= 1);
            const int64_t nt = tl_tile_lists_tiles(n_out, rows > 0 ? rows : 1);
            int64_t *st = xmalloc(sizeof(int64_t) * (size_t)(nt * k + 1)), top = 0;
            CHECK(tl_tile_lists_count(ctx, nbr, n_out, k, rows, st, &top) == TL_OK);
            int32_t *in = xmalloc(sizeof(int32_t) * (size_t)(st[nt * k] + 1));
            int32_t *lr = xmalloc(sizeof(int32_t) * (size_t)(st[nt * k] + 1));
            CHECK(tl_tile_lists_fill(ctx, nbr, n_out, k, rows, st, top, in, lr) == TL_OK);
            tl_tile_lists lists = {rows, top, st, in, lr};
            char *x = xmalloc(es * (size_t)(n_in * 5));
            char *dy = xmalloc(es * (size_t)(n_out * cout));
            char *dw = xmalloc(es * wn), *dw2 = xmalloc(es * wn);
            fill_random(d.dtype, x, n_in * 5);
            fill_random(d.dtype, dy, n_out * cout);
            CHECK(tl_implicit_gemm_weight_grad(ctx, &d, x, dy, nbr, dw) == TL_OK);
            CHECK(tl_implicit_gemm_weight_grad_listed(ctx, &d, x, dy, nbr, &lists, dw2) == TL_OK);
            CHECK(memcmp(dw, dw2, es * wn) == 0);
            tl_conv_desc fewer = d, half = d;
            fewer.n_in = top - 1;
            half.dtype = TL_BF16;
            if (top > 0)
                CHECK(tl_implicit_gemm_weight_grad_listed(ctx, &fewer, x, dy, nbr, &lists, dw2) ==
                      TL_ERR_INVALID);
            CHECK(tl_implicit_gemm_weight_grad_listed(ctx, &half, x, dy, nbr, &lists, dw2) ==
                  TL_ERR_INVALID);
            free(st);
            free(in);
            free(lr);
            free(x);
            free(dy);
            free(dw);
            free(dw2);
        }
    }
}

/* A weight gradient of several blocks (9,000 output rows: blocks of 4,096
 * rows at C_out = 7, tl_wgrad_block_rows, and of 2,048 at 24) against a
 * double reference, over the table and over its tile lists, on 1 and 2
 * threads and every instruction set the CPU has. */
static void check_wgrad_blocks(void) {
    current = "wgrad_blocks";
    const int64_t k = 27, n_out = 9000, n_in = 3000, ci = 5;
    int levels[3];
    const int paths = cpu_levels(levels);
    int32_t *nbr = random_table(n_out, k, n_in);
    for (int64_t co = 7; co <= 24; co += 17) {
        float *x = xmalloc(sizeof(float) * (size_t)(n_in * ci));
        float *dy = xmalloc(sizeof(float) * (size_t)(n_out * co));
        float *dw = xmalloc(sizeof(float) * (size_t)(k * ci * co));
        double *ref = xmalloc(sizeof(double) * (size_t)(k * ci * co));
        double *mag = xmalloc(sizeof(double) * (size_t)(k * ci * co));
        for (int64_t i = 0; i < n_in * ci; i++) x[i] = rndf();
        for (int64_t i = 0; i < n_out * co; i++) dy[i] = rndf();
        memset(ref, 0, sizeof(double) * (size_t)(k * ci * co));
        memset(mag, 0, sizeof(double) * (size_t)(k * ci * co));
        for (int64_t o = 0; o < n_out; o++)
            for (int64_t n = 0; n < k; n++) {
                const int32_t i = nbr[o * k + n];
                if (i < 0) continue;
                for (int64_t a = 0; a < ci; a++)
                    for (int64_t b = 0; b < co; b++) {
                        const double p = (double)x[i * ci + a] * dy[o * co + b];
                        ref[(n * ci + a) * co + b] += p;
                        mag[(n * ci + a) * co + b] += fabs(p);
                    }
            }
        tl_conv_desc d = {TL_F32, n_in, n_out, k, ci, co};
        for (int path = 0; path < paths; path++) {
            tl_ctx ctx = make_ctx(1 + path % 2, levels[path]);
            memset(dw, 0xff, sizeof(float) * (size_t)(k * ci * co));
            CHECK(tl_implicit_gemm_weight_grad(&ctx, &d, x, dy, nbr, dw) == TL_OK);
            for (int64_t i = 0; i < k * ci * co; i++)
                CHECK(fabs(dw[i] - ref[i]) <= 2e-5 * mag[i] + 1e-6);
        }
        free(x);
        free(dy);
        free(dw);
        free(ref);
        free(mag);
    }
    for (int path = 0; path < paths; path++) {
        tl_ctx ctx = make_ctx(2 - path % 2, levels[path]);
        check_wgrad_over_lists(&ctx, nbr, n_in, n_out, k);
    }
    free(nbr);
}

/* Gather-scatter over kernel rows of hundreds of pairs (blocks of 128 and a
 * partial last one; each block's rows read in place and asked for a step
 * ahead, the weight gradient's next chunk listed before the current one
 * runs): its forward is bitwise fetch-on-demand's, both near a double
 * reference, and its weight gradient near the reference too, on every
 * instruction set and 1-2 threads. */
static void check_gather_scatter_blocks(void) {
    current = "gather_scatter_blocks";
    static const int64_t widths[][2] = {{16, 16}, {24, 40}, {64, 64}};
    const int64_t k = 27, n_out = 3000, n_in = 2000;
    int levels[3];
    const int paths = cpu_levels(levels);
    int32_t *nbr = random_table(n_out, k, n_in);
    tl_ctx c2 = make_ctx(2, TL_SIMD_V4);
    int64_t *offsets = xmalloc(sizeof(int64_t) * (size_t)(k + 1));
    CHECK(tl_pairs_count(&c2, nbr, n_out, k, offsets) == TL_OK);
    const int64_t np = offsets[k];
    int32_t *pin = xmalloc(sizeof(int32_t) * (size_t)np), *pout = xmalloc(sizeof(int32_t) * (size_t)np);
    CHECK(tl_pairs_fill(&c2, nbr, n_out, k, offsets, pin, pout) == TL_OK);
    CHECK(offsets[1] - offsets[0] > 600 && (offsets[1] - offsets[0]) % 128 != 0);
    tl_pairs pairs = {k, offsets, pin, pout};
    for (size_t wi = 0; wi < sizeof(widths) / sizeof(widths[0]); wi++) {
        const int64_t ci = widths[wi][0], co = widths[wi][1];
        float *x = xmalloc(sizeof(float) * (size_t)(n_in * ci));
        float *w = xmalloc(sizeof(float) * (size_t)(k * ci * co));
        float *dy = xmalloc(sizeof(float) * (size_t)(n_out * co));
        float *y = xmalloc(sizeof(float) * (size_t)(n_out * co));
        float *fod = xmalloc(sizeof(float) * (size_t)(n_out * co));
        float *dw = xmalloc(sizeof(float) * (size_t)(k * ci * co));
        double *y_ref = xmalloc(sizeof(double) * (size_t)(n_out * co));
        double *dw_ref = xmalloc(sizeof(double) * (size_t)(k * ci * co));
        for (int64_t i = 0; i < n_in * ci; i++) x[i] = rndf();
        for (int64_t i = 0; i < k * ci * co; i++) w[i] = rndf();
        for (int64_t i = 0; i < n_out * co; i++) dy[i] = rndf();
        memset(y_ref, 0, sizeof(double) * (size_t)(n_out * co));
        memset(dw_ref, 0, sizeof(double) * (size_t)(k * ci * co));
        for (int64_t j = 0, n = 0; j < np; j++) {
            while (j >= offsets[n + 1]) n++;
            const int64_t i = pin[j], o = pout[j];
            for (int64_t a = 0; a < ci; a++)
                for (int64_t b = 0; b < co; b++) {
                    y_ref[o * co + b] += (double)x[i * ci + a] * w[(n * ci + a) * co + b];
                    dw_ref[(n * ci + a) * co + b] += (double)x[i * ci + a] * dy[o * co + b];
                }
        }
        tl_conv_desc d = {TL_F32, n_in, n_out, k, ci, co};
        for (int path = 0; path < 2 * paths; path++) {
            tl_ctx ctx = make_ctx(1 + path % 2, levels[path / 2]);
            memset(y, 0xff, sizeof(float) * (size_t)(n_out * co));
            memset(dw, 0xff, sizeof(float) * (size_t)(k * ci * co));
            CHECK(tl_pairs_forward(&ctx, TL_PAIRS_GATHER_SCATTER, &d, x, w, &pairs, y) == TL_OK);
            CHECK(tl_pairs_forward(&ctx, TL_PAIRS_FETCH_ON_DEMAND, &d, x, w, &pairs, fod) ==
                  TL_OK);
            CHECK(tl_pairs_weight_grad(&ctx, TL_PAIRS_GATHER_SCATTER, &d, x, dy, &pairs, dw) ==
                  TL_OK);
            CHECK(memcmp(y, fod, sizeof(float) * (size_t)(n_out * co)) == 0);
            for (int64_t i = 0; i < n_out * co; i++) CHECK(fabs(y[i] - y_ref[i]) < 1e-4);
            for (int64_t i = 0; i < k * ci * co; i++) CHECK(fabs(dw[i] - dw_ref[i]) < 1e-3);
        }
        free(x), free(w), free(dy), free(y), free(fod), free(dw), free(y_ref), free(dw_ref);
    }
    free(nbr), free(offsets), free(pin), free(pout);
}

/* Tile lists (tl_tile_lists.h): each tile's lists are tl_list_tile's, and
 * the forward over them is bitwise the forward over the table, in fp32,
 * fp64, bf16 and fp16, on 1 and 2 threads, on every listing path; bad
 * tables, bad starts and lists built for other tiles are refused. */
static void test_tile_lists(void) {
    static const int64_t ks[] = {1, 5, 27};
    static const int64_t outs[] = {1, 31, 300, 2050};
    int levels[3];
    const int paths = cpu_levels(levels);
    current = "tile_lists";
    for (size_t a = 0; a < sizeof(ks) / sizeof(ks[0]); a++)
        for (size_t b = 0; b < sizeof(outs) / sizeof(outs[0]); b++) {
            const int64_t k = ks[a], n_out = outs[b], n_in = 500;
            int32_t *nbr = random_table(n_out, k, n_in);
            for (int path = 0; path < paths; path++) {
                const int64_t tile_rows = path == 0 ? 7 : 32 * path;
                tl_ctx ctx = make_ctx(1 + path % 2, levels[path]);
                const int64_t tiles = tl_tile_lists_tiles(n_out, tile_rows);
                int64_t *start = xmalloc(sizeof(int64_t) * (size_t)(tiles * k + 1)), top = -5;
                CHECK(tl_tile_lists_count(&ctx, nbr, n_out, k, tile_rows, start, &top) == TL_OK);
                const int64_t all = start[tiles * k];
                int32_t *in = xmalloc(sizeof(int32_t) * (size_t)(all + 1));
                int32_t *rows = xmalloc(sizeof(int32_t) * (size_t)(all + 1));
                CHECK(tl_tile_lists_fill(&ctx, nbr, n_out, k, tile_rows, start, top, in, rows) ==
                      TL_OK);
                int64_t want_top = 0, seen = 0;
                for (int64_t t = 0; t < tiles; t++)
                    for (int64_t n = 0; n < k; n++) {
                        int64_t j = start[t * k + n];
                        for (int64_t o = t * tile_rows; o < n_out && o < (t + 1) * tile_rows; o++) {
                            const int32_t i = nbr[o * k + n];
                            if (i < 0) continue;
                            CHECK(j < start[t * k + n + 1] && in[j] == i &&
                                  rows[j] == o - t * tile_rows);
                            if (i + 1 > want_top) want_top = i + 1;
                            j++;
                            seen++;
                        }
                        CHECK(j == start[t * k + n + 1]);
                    }
                CHECK(seen == all && top == want_top);
                /* A tile whose start does not match its lists: refused,
                 * nothing written. */
                if (all > 0) {
                    int64_t *bad = xmalloc(sizeof(int64_t) * (size_t)(tiles * k + 1));
                    memcpy(bad, start, sizeof(int64_t) * (size_t)(tiles * k + 1));
                    for (int64_t j = 1; j < tiles * k; j++)
                        if (bad[j + 1] > bad[j]) {
                            bad[j]++;
                            break;
                        }
                    CHECK(tl_tile_lists_fill(&ctx, nbr, n_out, k, tile_rows, bad, top, in, rows) ==
                          (memcmp(bad, start, sizeof(int64_t) * (size_t)(tiles * k + 1))
                               ? TL_ERR_INVALID
                               : TL_OK));
                    free(bad);
                    /* A table that names a row at or above the counted top
                     * (changed between the two passes): refused. */
                    CHECK(tl_tile_lists_fill(&ctx, nbr, n_out, k, tile_rows, start, top - 1, in,
                                             rows) == TL_ERR_INVALID);
                }
                free(start);
                free(in);
                free(rows);
                /* The forward over lists of its own tiles, every dtype, and
                 * the weight gradient over lists of its blocks. */
                check_forward_over_lists(&ctx, nbr, n_in, n_out, k);
                check_wgrad_over_lists(&ctx, nbr, n_in, n_out, k);
            }
            for (int h = 0; h < 2; h++) { /* half types at a wider layer too, 2 threads */
                tl_ctx ctx = make_ctx(2, levels[0]);
                check_half_over_lists(&ctx, h ? TL_F16 : TL_BF16, nbr, n_in, n_out, k);
            }
            /* No kernel rows: no entries, nothing read. */
            {
                tl_ctx c1 = make_ctx(1, TL_SIMD_BASE);
                int64_t st[1] = {-1}, tp = -1;
                CHECK(tl_tile_lists_count(&c1, NULL, n_out, 0, 7, st, &tp) == TL_OK);
                CHECK(st[0] == 0 && tp == 0);
                CHECK(tl_tile_lists_fill(&c1, NULL, n_out, 0, 7, st, tp, NULL, NULL) == TL_OK);
            }
            /* An entry below -1 is refused. */
            if (n_out * k > 1) {
                tl_ctx c1 = make_ctx(1, TL_SIMD_BASE);
                int64_t st[64], tp = 0;
                nbr[n_out * k - 1] = -2;
                CHECK(tl_tile_lists_count(&c1, nbr, n_out, k, n_out, st, &tp) == TL_ERR_INVALID);
            }
            free(nbr);
        }
}

static void test_list_tile(void) {
    static const int64_t ks[] = {1, 2, 3, 4, 8, 15, 16, 17, 27, 32, 33, 125};
    static const int64_t ms[] = {1, 5, 16, 17, 100, 256, 1000};
    int levels[3];
    const int paths = cpu_levels(levels);
    current = "list_tile";
    for (size_t a = 0; a < sizeof(ks) / sizeof(ks[0]); a++)
        for (size_t b = 0; b < sizeof(ms) / sizeof(ms[0]); b++)
            for (int bad = 0; bad < 3; bad++) {
                const int64_t k = ks[a], m = ms[b], o0 = 3, n_out = o0 + m + 2;
                const int full = bad == 2;
                int32_t *nbr = xmalloc(sizeof(int32_t) * (size_t)(n_out * k));
                for (int64_t e = 0; e < n_out * k; e++)
                    nbr[e] = full || (rnd(3) == 0 && (e / k) % 5 != 2) ? (int32_t)rnd(1000) : -1;
                if (bad == 1) nbr[(o0 + m - 1) * k + k / 2] = -7; /* wraps above any count */
                uint32_t want_worst = 0;
                for (int64_t e = o0 * k; e < (o0 + m) * k; e++) {
                    uint32_t u = (uint32_t)nbr[e] + 1u;
                    if (u > want_worst) want_worst = u;
                }
                int32_t *idx = xmalloc(sizeof(int32_t) * (size_t)(m * k));
                int32_t *rows = xmalloc(sizeof(int32_t) * (size_t)(m * k));
                int64_t *cnt = xmalloc(sizeof(int64_t) * (size_t)k);
                int64_t *fc = xmalloc(sizeof(int64_t) * (size_t)k), nz = 0;
                int32_t *zr = xmalloc(sizeof(int32_t) * (size_t)m);
                for (int path = 0; path < paths; path++) {
                    const int vec = levels[path];
                    /* A range of kernel rows (tl_list_tile_range): theirs
                     * listed as below, the others' counts 0, the return over
                     * their entries only. */
                    const int64_t los[3] = {0, k / 3, k - 1}, his[3] = {1, k - k / 4, k};
                    for (int g = 0; g < 3; g++) {
                        const int64_t lo = los[g], hi = his[g];
                        uint32_t want = 0;
                        for (int64_t r = 0; r < m; r++)
                            for (int64_t n = lo; n < hi; n++) {
                                const uint32_t u = (uint32_t)nbr[(o0 + r) * k + n] + 1u;
                                if (u > want) want = u;
                            }
                        CHECK(tl_list_tile_range(vec, nbr, o0, m, k, lo, hi, idx, rows, cnt) ==
                              want);
                        if (bad == 1) continue;
                        for (int64_t n = 0; n < k; n++) {
                            int64_t c = 0;
                            for (int64_t r = 0; n >= lo && n < hi && r < m; r++) {
                                const int32_t e = nbr[(o0 + r) * k + n];
                                if (e < 0) continue;
                                CHECK(c < cnt[n] && idx[n * m + c] == e && rows[n * m + c] == r);
                                c++;
                            }
                            CHECK(c == cnt[n]);
                        }
                    }
                    CHECK(tl_list_tile(vec, nbr, o0, m, k, idx, rows, cnt) == want_worst);
                    if (bad == 1) continue;
                    for (int64_t n = 0; n < k; n++) {
                        int64_t c = 0;
                        for (int64_t r = 0; r < m; r++) {
                            const int32_t e = nbr[(o0 + r) * k + n];
                            if (e < 0) continue;
                            CHECK(c < cnt[n] && idx[n * m + c] == e && rows[n * m + c] == r);
                            c++;
                        }
                        CHECK(c == cnt[n]);
                    }
                    /* Split: each row's first entry (its entry in kernel
                     * row `lead` where it has one, else its lowest) at the
                     * back of its kernel row's slot (any order), the rest in
                     * order at the front, the rows with none in zr, in
                     * order; for no lead, the first, the middle and the last
                     * kernel row. */
                    const int64_t leads[4] = {-1, 0, k / 2, k - 1};
                    for (int li = 0; li < 4; li++) {
                        const int64_t lead = leads[li];
                        CHECK(tl_list_tile_split(vec, nbr, o0, m, k, lead, idx, rows, cnt, fc, zr,
                                                 &nz) == want_worst);
                        for (int64_t n = 0; n < k; n++) {
                            int64_t c = 0, f = 0;
                            for (int64_t r = 0; r < m; r++) {
                                const int32_t *row = nbr + (o0 + r) * k, e = row[n];
                                if (e < 0) continue;
                                int first = n == lead || lead < 0 || row[lead] < 0;
                                for (int64_t p = 0; p < n && n != lead && first; p++)
                                    first = row[p] < 0;
                                if (!first) {
                                    CHECK(c < cnt[n] && idx[n * m + c] == e &&
                                          rows[n * m + c] == r);
                                    c++;
                                    continue;
                                }
                                int found = 0;
                                for (int64_t q = m - fc[n]; q < m; q++)
                                    found |= rows[n * m + q] == r && idx[n * m + q] == e;
                                CHECK(found);
                                f++;
                            }
                            CHECK(c == cnt[n] && f == fc[n]);
                        }
                        int64_t z = 0;
                        for (int64_t r = 0; r < m; r++) {
                            int none = 1;
                            for (int64_t n = 0; n < k; n++) none &= nbr[(o0 + r) * k + n] < 0;
                            if (none) {
                                CHECK(z < nz && zr[z] == r);
                                z++;
                            }
                        }
                        CHECK(z == nz);
                    }
                }
                free(nbr);
                free(idx);
                free(rows);
                free(cnt);
                free(fc);
                free(zr);
            }
}

/* tl_mem_aligned: 64-byte aligned, usable to the last byte asked for, for
 * sizes that are not multiples of 64 (aligned_alloc's rule) and for 0. */
static void test_mem_aligned(void) {
    current = "mem aligned";
    const size_t sizes[5] = {0, 1, 63, 65, 4097};
    for (int i = 0; i < 5; i++) {
        unsigned char *p = tl_mem_aligned(sizes[i]);
        CHECK(p != NULL && (uintptr_t)p % 64 == 0);
        if (p && sizes[i]) memset(p, 0xab, sizes[i]);
        free(p);
    }
}

/* Batch norm's passes against float64 loops, at every level, both thread
 * counts, float32 and bfloat16; sums equal bit for bit across thread counts. */
enum { NORM_N = 3000, NORM_C = 37 };

/* One test's data: features as float and as their bf16 patterns (the values
 * are bf16-exact, so both dtypes see the same numbers), coefficients, and the
 * float64 mean and biased variance. */
typedef struct norm_data {
    float *x, *dy;
    uint16_t *xh, *dyh;
    float scale[NORM_C], shift[NORM_C], a[NORM_C], b[NORM_C], k[NORM_C];
    double mean[NORM_C], var[NORM_C];
} norm_data;

/* The pre-activation and the ReLU-cut gradient of element i, as the passes define them. */
static float norm_pre(const norm_data *t, int64_t i) {
    const int64_t j = i % NORM_C;
    return t->x[i] * t->scale[j] + t->shift[j];
}

static double norm_g(const norm_data *t, int64_t i, int relu) {
    return relu && !(norm_pre(t, i) > 0) ? 0 : t->dy[i];
}

/* Checks one call of each pass; mean_first holds the first thread count's
 * statistics (filled when threads == 1). */
static void norm_case(const norm_data *t, int threads, tl_simd level, int half, int relu,
                      double *mean_first) {
    enum { N = NORM_N, C = NORM_C };
    tl_ctx ctx = make_ctx(threads, level);
    tl_norm_desc d = {half ? TL_BF16 : TL_F32, N, C, relu};
    const void *xs = half ? (const void *)t->xh : t->x, *dys = half ? (const void *)t->dyh : t->dy;
    double mean[C], var[C], sg[C], sgx[C];
    float *y = xmalloc(sizeof(float) * N * C);
    uint16_t *yh = xmalloc(2 * N * C);
    void *out = half ? (void *)yh : y;
    CHECK(tl_norm_stats(&ctx, &d, xs, mean, var) == TL_OK);
    if (threads == 1) memcpy(mean_first, mean, sizeof mean);
    CHECK(memcmp(mean, mean_first, sizeof mean) == 0);
    for (int j = 0; j < C; j++) {
        CHECK(fabs(mean[j] - t->mean[j]) < 1e-9 * (1 + fabs(t->mean[j])));
        CHECK(fabs(var[j] - t->var[j]) < 2e-6 * (1 + t->var[j])); /* float partial sums */
    }
    const double tol = half ? 8e-3 : 1e-6;
    CHECK(tl_norm_apply(&ctx, &d, xs, t->scale, t->shift, out) == TL_OK);
    for (int64_t i = 0; i < N * C; i++) {
        const int64_t j = i % C;
        const float pre = norm_pre(t, i);
        const double want = relu && pre < 0 ? 0 : (double)t->x[i] * t->scale[j] + t->shift[j];
        const double got = half ? tl_bf16_to_f32(yh[i]) : y[i];
        /* float rounds x * scale before shift cancels it */
        CHECK(fabs(got - want) <= tol * (1 + fabs(t->x[i] * t->scale[j]) + fabs(t->shift[j])));
    }
    CHECK(tl_norm_backward_reduce(&ctx, &d, dys, xs, t->scale, t->shift, mean, sg, sgx) == TL_OK);
    for (int j = 0; j < C; j++) {
        double s = 0, sx = 0, abs_s = 0, abs_sx = 0;
        for (int64_t i = j; i < N * C; i += C) {
            const double g = norm_g(t, i, relu), gx = g * (t->x[i] - mean[j]);
            s += g, sx += gx, abs_s += fabs(g), abs_sx += fabs(gx);
        }
        /* float sums of 16 rows: about 16 float roundings of the terms */
        CHECK(fabs(sg[j] - s) < 2e-6 * abs_s && fabs(sgx[j] - sx) < 2e-6 * abs_sx);
    }
    for (int eval = 0; eval < 2; eval++) {
        const float *b = eval ? NULL : t->b, *k = eval ? NULL : t->k;
        CHECK(tl_norm_backward_apply(&ctx, &d, dys, xs, t->scale, t->shift, t->a, b, k, out) ==
              TL_OK);
        for (int64_t i = 0; i < N * C; i++) {
            const int64_t j = i % C;
            const double xb = eval ? 0 : (double)t->x[i] * t->b[j] + t->k[j];
            const double want = norm_g(t, i, relu) * t->a[j] + xb;
            const double got = half ? tl_bf16_to_f32(yh[i]) : y[i];
            CHECK(fabs(got - want) <= tol * (1 + fabs(want) + 2 * fabs(xb)));
        }
    }
    free(y), free(yh);
}

static void test_norm(void) {
    current = "norm";
    enum { N = NORM_N, C = NORM_C };
    norm_data t;
    t.x = xmalloc(sizeof(float) * N * C), t.dy = xmalloc(sizeof(float) * N * C);
    t.xh = xmalloc(2 * N * C), t.dyh = xmalloc(2 * N * C);
    for (int64_t i = 0; i < N * C; i++) {
        t.xh[i] = tl_f32_to_bf16(rndf() * 4.0f + (float)(i % C) * 8.0f);
        t.dyh[i] = tl_f32_to_bf16(rndf());
        t.x[i] = tl_bf16_to_f32(t.xh[i]);
        t.dy[i] = tl_bf16_to_f32(t.dyh[i]);
    }
    for (int j = 0; j < C; j++) {
        double s = 0, q = 0;
        for (int i = 0; i < N; i++) s += t.x[i * C + j];
        t.mean[j] = s / N;
        for (int i = 0; i < N; i++) {
            const double v = t.x[i * C + j] - t.mean[j];
            q += v * v;
        }
        t.var[j] = q / N;
        t.scale[j] = 0.5f + (float)j / C;
        t.shift[j] = (float)(-t.mean[j] * t.scale[j]) + rndf(); /* the ReLU cuts about half */
        t.a[j] = t.scale[j];
        t.b[j] = rndf();
        t.k[j] = rndf();
    }
    const tl_simd levels[3] = {TL_SIMD_BASE, TL_SIMD_V3, TL_SIMD_V4};
    double mean_first[C];
    for (int li = 0; li < 3; li++)
        for (int half = 0; half < 2; half++)
            for (int relu = 0; relu < 2; relu++)
                for (int threads = 1; threads <= 2; threads++)
                    norm_case(&t, threads, levels[li], half, relu, mean_first);
    tl_ctx ctx = make_ctx(1, TL_SIMD_V4);
    float *y = xmalloc(sizeof(float) * N * C);
    double mean[C], var[C];
    tl_norm_desc bad = {TL_F64, N, C, 0};
    CHECK(tl_norm_apply(&ctx, &bad, t.x, t.scale, t.shift, y) == TL_ERR_UNSUPPORTED);
    bad.dtype = TL_F32;
    bad.relu = 2;
    CHECK(tl_norm_apply(&ctx, &bad, t.x, t.scale, t.shift, y) == TL_ERR_INVALID);
    bad.relu = 0;
    bad.n = 0;
    CHECK(tl_norm_stats(&ctx, &bad, t.x, mean, var) == TL_ERR_INVALID);
    bad.n = N;
    CHECK(tl_norm_backward_apply(&ctx, &bad, t.dy, t.x, t.scale, t.shift, t.a, NULL, t.k, y) ==
          TL_ERR_INVALID);
    bad.n = INT64_MAX;
    CHECK(tl_norm_apply(&ctx, &bad, t.x, t.scale, t.shift, y) == TL_ERR_OVERFLOW);
    free(y), free(t.x), free(t.dy), free(t.xh), free(t.dyh);
}

/* tl_pairs_check: valid lists pass; each kind of bad entry (an input or an
 * output outside its range, an output repeated or lower than the one before)
 * fails wherever it sits (the first pair, a vector's lanes and tail, the
 * last), on every instruction set level. */
static void test_pairs_check(void) {
    current = "pairs_check";
    static const int64_t lens[] = {0, 1, 15, 16, 17, 40, 100};
    const int levels[] = {TL_SIMD_BASE, TL_SIMD_V3, TL_SIMD_V4};
    for (size_t a = 0; a < sizeof(lens) / sizeof(lens[0]); a++) {
        const int64_t len = lens[a], k = 3, n_in = 50, n_out = 3 * len + 5, np = k * len;
        int64_t offsets[4] = {0, len, 2 * len, 3 * len};
        int32_t *in = xmalloc(sizeof(int32_t) * (size_t)(np + 1));
        int32_t *out = xmalloc(sizeof(int32_t) * (size_t)(np + 1));
        for (int64_t n = 0; n < k; n++)
            for (int64_t j = 0; j < len; j++) { /* rising by 1 to 3 */
                in[n * len + j] = (int32_t)rnd((uint32_t)n_in);
                const int32_t step = (int32_t)rnd(3);
                out[n * len + j] = j == 0 ? step : out[n * len + j - 1] + 1 + step;
            }
        for (size_t l = 0; l < sizeof(levels) / sizeof(levels[0]); l++) {
            tl_ctx c = make_ctx(2, levels[l]);
            const tl_pairs p = {k, offsets, in, out};
            CHECK(tl_pairs_check(&c, &p, n_in, n_out) == TL_OK);
            for (int64_t j = 0; j < np; j++) {
                const int64_t first = j % len == 0;
                const int32_t keep_in = in[j], keep_out = out[j];
                const int32_t bad_in[] = {-1, (int32_t)n_in, INT32_MIN};
                for (int b = 0; b < 3; b++) {
                    in[j] = bad_in[b];
                    CHECK(tl_pairs_check(&c, &p, n_in, n_out) == TL_ERR_INVALID);
                }
                in[j] = keep_in;
                const int32_t bad_out[] = {-1, (int32_t)n_out, INT32_MIN,
                                           first ? -5 : out[j - 1], first ? -5 : out[j - 1] - 1};
                for (int b = 0; b < 5; b++) {
                    out[j] = bad_out[b];
                    CHECK(tl_pairs_check(&c, &p, n_in, n_out) == TL_ERR_INVALID);
                }
                out[j] = keep_out;
            }
            CHECK(tl_pairs_check(&c, &p, n_in, n_out) == TL_OK);
        }
        free(in);
        free(out);
    }
}

int main(void) {
    test_mem_aligned();
    test_hash();
    test_kmaps();
    test_list_tile();
    test_tile_lists();
    check_wgrad_blocks();
    check_gather_scatter_blocks();
    test_point_rows();
    test_pairs_check();
    test_conv();
    test_conv_single();
    test_conv_wide_cin();
    test_wgrad_panel();
    test_wgrad_f64();
    test_half_conversions();
    test_half_conv();
    test_pool();
    test_norm();
    test_voxel();
    test_int_limits();
    if (failures) {
        fprintf(stderr, "test_core: %d check(s) failed\n", failures);
        return 1;
    }
    printf("test_core: all checks passed\n");
    return 0;
}
