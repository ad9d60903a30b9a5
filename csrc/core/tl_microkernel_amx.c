/* syscall() (Linux asks a process to request the tile registers). */
#define _DEFAULT_SOURCE
#include "tl_microkernel_amx.h"

#include <stdlib.h>

#include "tl_half.h"
#include "tl_microkernel_bf16.h"

#if TL_SIMD_AMX
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tl_transpose.h"
#endif

/* The weight gradient's tile shapes: pairs rounded up to 32 (one tile's
 * depth), channels and columns to 16. */
static int64_t tl_amx_units(int64_t pairs) { return (pairs + 31) / 32 * 16; }
static int64_t tl_amx_round16(int64_t n) { return (n + 15) / 16 * 16; }

static uint32_t tl_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

int64_t tl_amx_wgrad_x_units(int64_t pairs, int64_t cin) {
    return tl_amx_units(pairs) * tl_amx_round16(cin);
}

int64_t tl_amx_wgrad_dy_elems(int64_t pairs, int64_t cout) {
    return tl_amx_units(pairs) * 2 * tl_amx_round16(cout);
}

/* tl_amx_pack with kernel row n at pw + n * stride: each 32 values are two
 * channels' 16 columns interleaved (tl_bf16_interleave; the packing is only
 * asked for where the tiles run, so the CPU has AVX512_BF16).  One value at a
 * time cost a C = 256 layer about 1 ms a call, half of a forward on a level
 * of 457 rows. */
static void tl_amx_pack_rows(const tl_conv_desc *d, const uint16_t *w, uint16_t *pw,
                             int64_t stride) {
    const int64_t cin = d->c_in, cout = d->c_out, kp = tl_amx_depth(cin);
    const int64_t nb = tl_amx_round16(cout) / 16;
    for (int64_t n = 0; n < d->k; n++)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t cols = cout - 16 * b < 16 ? cout - 16 * b : 16;
            for (int64_t p = 0; p < kp / 2; p++) {
                uint16_t *dst = pw + n * stride + (b * (kp / 2) + p) * 32;
                const int64_t c = 2 * p;
                const uint16_t *a = w + (n * cin + (c < cin ? c : 0)) * cout + 16 * b;
#if TL_SIMD_X86
                tl_bf16_interleave(a, c + 1 < cin ? a + cout : NULL, c < cin ? cols : 0, 16, dst);
#else
                for (int64_t j = 0; j < 16; j++) {
                    dst[2 * j] = c < cin && j < cols ? a[j] : 0;
                    dst[2 * j + 1] = c + 1 < cin && j < cols ? a[cout + j] : 0;
                }
#endif
            }
        }
}

void tl_amx_pack(const tl_conv_desc *d, const uint16_t *w, uint16_t *pw) {
    tl_amx_pack_rows(d, w, pw, tl_amx_row_elems(d->c_in, d->c_out));
}

tl_status tl_amx_pack_f16(tl_simd level, const tl_conv_desc *d, const uint16_t *w, uint16_t *pw,
                          int *finite) {
    /* One kernel row at a time, so the scratch is one row's (fresh memory of
     * the whole layer's size cost a C = 256 layer about 5 ms in page faults). */
    const int64_t mat = d->c_in * d->c_out, elems = tl_amx_row_elems(d->c_in, d->c_out);
    float *f = malloc(sizeof(float) * (size_t)(mat + 1));
    uint16_t *hi = malloc(sizeof(uint16_t) * (size_t)(2 * mat + 1));
    if (!f || !hi) {
        free(f);
        free(hi);
        return TL_ERR_NOMEM;
    }
    uint16_t *lo = hi + mat;
    tl_conv_desc row = *d;
    row.k = 1;
    int bad = 0;
    for (int64_t n = 0; n < d->k; n++) {
        const uint16_t *wn = w + n * mat;
        tl_half_row_to_f32(level, TL_F16, wn, mat, f); /* vector conversions */
        for (int64_t i = 0; i < mat; i++) {
            const uint32_t u = tl_f32_bits(f[i]) & 0xffff0000u;
            float h;
            memcpy(&h, &u, sizeof h);
            bad |= (wn[i] & 0x7c00u) == 0x7c00u;
            hi[i] = (uint16_t)(u >> 16);
            lo[i] = (uint16_t)(tl_f32_bits(f[i] - h) >> 16);
        }
        tl_amx_pack_rows(&row, hi, pw + 2 * n * elems, elems);
        tl_amx_pack_rows(&row, lo, pw + (2 * n + 1) * elems, elems);
    }
    free(f);
    free(hi);
    *finite = !bad;
    return TL_OK;
}

/* Linux's arch_prctl requests: the extended states this process may use, and
 * the tile data state's number. */
#define TL_ARCH_REQ_XCOMP_PERM 0x1023
#define TL_XFEATURE_XTILEDATA 18

int tl_amx_usable(void) {
#if TL_SIMD_AMX && defined(SYS_arch_prctl)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16")) return 0;
    return syscall(SYS_arch_prctl, TL_ARCH_REQ_XCOMP_PERM, TL_XFEATURE_XTILEDATA) == 0;
#else
    return 0;
#endif
}

#if TL_SIMD_AMX
#define TL_TARGET_AMX __attribute__((target("arch=x86-64-v4,avx512bf16,amx-tile,amx-bf16")))

/* The tile configuration (palette 1): eight tiles of 16 rows x 64 bytes.
 * Tiles 0-3 hold float sums (16 x 16); the others x rows (16 x 32 bfloat16)
 * or weight blocks (16 channel pairs x 16 columns): one group of x rows in 4
 * against weight blocks alternating in 5 and 6 (tl_amx_blocks, the weight
 * gradient), or two groups in 4 and 5 against 6 and 7 (tl_amx_pair). */
typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tl_amx_config;

/* A constant: GCC does not see ldtilecfg read its operand, and dropped the
 * stores that built a copy on the stack. */
static const tl_amx_config tl_amx_tiles = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

TL_TARGET_AMX void tl_amx_start(void) { _tile_loadconfig(&tl_amx_tiles); }

TL_TARGET_AMX void tl_amx_stop(void) { _tile_release(); }

/* Where a tile product's operands lie, in bytes: the left operand's rows at
 * a, `as` apart, each 32-deep step `ak` further; the right operand's rows at
 * b, `bs` apart, each step `bk` further and each block of 16 columns `bj`
 * further; `steps` steps.  Split float16 operands (tl_amx_pack_f16) hold their
 * low parts a_lo and b_lo bytes after the high ones. */
typedef struct {
    const char *a;
    int64_t as, ak;
    const char *b;
    int64_t bs, bk, bj, steps;
    int64_t a_lo, b_lo;
} tl_amx_operands;

/* Products a tile sum takes: one, or for split float16 operands four (high
 * and low parts of each side, largest first), so every float16 product is
 * summed exactly (tl_amx_pack_f16). */
#define TL_AMX_PASSES(split) ((split) ? 4 : 1)
#define TL_AMX_PASS_A(o, p) (((p) >> 1) * (o)->a_lo)
#define TL_AMX_PASS_B(o, p) (((p) & 1) * (o)->b_lo)

/* One left operand x NV (1 to 4) column blocks: sums over every step in
 * tiles 0..NV-1 (the left operand in tile 4, the column blocks alternating in
 * 5 and 6), stored into cbuf (16 rows of 64 floats, block v at column 16v). */
#define TL_AMX_STEP(T, B)                                                                  \
    do {                                                                                   \
        _tile_loadd(B, b + (T) * o->bj, o->bs);                                            \
        _tile_dpbf16ps(T, 4, B);                                                           \
    } while (0)

static inline __attribute__((always_inline)) TL_TARGET_AMX void tl_amx_blocks(
    int split, int NV, const tl_amx_operands *o, float *cbuf) {
    _tile_zero(0);
    if (NV > 1) _tile_zero(1);
    if (NV > 2) _tile_zero(2);
    if (NV > 3) _tile_zero(3);
    for (int p = 0; p < TL_AMX_PASSES(split); p++)
        for (int64_t s = 0; s < o->steps; s++) {
            const char *b = o->b + TL_AMX_PASS_B(o, p) + s * o->bk;
            _tile_loadd(4, o->a + TL_AMX_PASS_A(o, p) + s * o->ak, o->as);
            TL_AMX_STEP(0, 5);
            if (NV > 1) TL_AMX_STEP(1, 6);
            if (NV > 2) TL_AMX_STEP(2, 5);
            if (NV > 3) TL_AMX_STEP(3, 6);
        }
    _tile_stored(0, cbuf, 256);
    if (NV > 1) _tile_stored(1, cbuf + 16, 256);
    if (NV > 2) _tile_stored(2, cbuf + 32, 256);
    if (NV > 3) _tile_stored(3, cbuf + 48, 256);
}
#undef TL_AMX_STEP

/* tl_amx_blocks for NV up to 4, chosen at run time. */
static inline __attribute__((always_inline)) TL_TARGET_AMX void tl_amx_blocks_n(
    int split, int64_t nv, const tl_amx_operands *o, float *cbuf) {
    switch (nv) {
    case 1: tl_amx_blocks(split, 1, o, cbuf); break;
    case 2: tl_amx_blocks(split, 2, o, cbuf); break;
    case 3: tl_amx_blocks(split, 3, o, cbuf); break;
    default: tl_amx_blocks(split, 4, o, cbuf); break;
    }
}

/* Two left operands (the second at o->a + a1 bytes) x NV (1 or 2) column
 * blocks: tiles 0-1 sum the first, 2-3 the second, so each right block
 * loaded feeds two products (the forward's weights come from L2 at C >= 64,
 * and loading them per group of 16 rows cost as much as the products).
 * Stored into cbuf: the first at columns 0-31, the second at 32-63. */
static inline __attribute__((always_inline)) TL_TARGET_AMX void tl_amx_pair(
    int split, int NV, const tl_amx_operands *o, int64_t a1, float *cbuf) {
    _tile_zero(0);
    _tile_zero(2);
    if (NV > 1) {
        _tile_zero(1);
        _tile_zero(3);
    }
    for (int p = 0; p < TL_AMX_PASSES(split); p++)
        for (int64_t s = 0; s < o->steps; s++) {
            const char *a = o->a + TL_AMX_PASS_A(o, p) + s * o->ak;
            const char *b = o->b + TL_AMX_PASS_B(o, p) + s * o->bk;
            _tile_loadd(4, a, o->as);
            _tile_loadd(5, a + a1, o->as);
            _tile_loadd(6, b, o->bs);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(2, 5, 6);
            if (NV > 1) {
                _tile_loadd(7, b + o->bj, o->bs);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(3, 5, 7);
            }
        }
    _tile_stored(0, cbuf, 256);
    _tile_stored(2, cbuf + 32, 256);
    if (NV > 1) {
        _tile_stored(1, cbuf + 16, 256);
        _tile_stored(3, cbuf + 48, 256);
    }
}

/* Row r's output: out[r] + j, or (out NULL) o + r * ldo. */
#define TL_AMX_ROW(out, j, o, ldo, r) ((out) ? (out)[r] + (j) : (o) + (r) * (ldo))

/* Row r's sums of NV vectors (the last partial: w < 16 NV) into registers. */
static inline __attribute__((always_inline)) TL_TARGET_AMX void tl_amx_sum_row(
    int NV, int set, __mmask16 last, const float *row, const float *src, __m512 *sum) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++) {
        const __mmask16 m = v == NV - 1 ? last : (__mmask16)0xffffu;
        const __m512 old = set ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, row + 16 * v);
        sum[v] = _mm512_add_ps(old, _mm512_load_ps(src + 16 * v));
    }
}

/* tl_amx_add_rows_of where the last of NV vectors is partial: row r + 1 is
 * read before row r is written. */
static inline __attribute__((always_inline)) TL_TARGET_AMX void tl_amx_add_piped(
    int NV, int set, int64_t rows, int64_t w, const float *src, float *const *out, int64_t j,
    float *o, int64_t ldo) {
    const __mmask16 last = (__mmask16)((1u << (w - 16 * (NV - 1))) - 1u);
    __m512 held[4], sum[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                              _mm512_setzero_ps()};
    if (rows <= 0) return;
    tl_amx_sum_row(NV, set, last, TL_AMX_ROW(out, j, o, ldo, 0), src, held);
    for (int64_t r = 1; r <= rows; r++) {
        if (r < rows)
            tl_amx_sum_row(NV, set, last, TL_AMX_ROW(out, j, o, ldo, r), src + r * 64, sum);
        float *prev = TL_AMX_ROW(out, j, o, ldo, r - 1);
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            _mm512_mask_storeu_ps(prev + 16 * v, v == NV - 1 ? last : (__mmask16)0xffffu, held[v]);
            held[v] = sum[v];
        }
    }
}

/* A group's stored sums (src, rows 64 apart) added to the rows' outputs, w <= 64
 * columns, at most 16 rows (a tile's); where `set`, each output is src + 0, what
 * adding to a zeroed row gives, and is not read.  A masked store of a row's
 * partial last vector spans the next row's first columns, and a load after it
 * waits for it to reach the cache (bfloat16 C = 24 forwards spent 59% of their
 * time in the two loads after such stores, 0.55x the time of C = 32 per
 * product), so where the block's partial vector follows a whole one each row
 * is read before the previous one is written (tl_amx_add_piped). */
static inline __attribute__((always_inline)) TL_TARGET_AMX void tl_amx_add_rows_of(
    int set, int64_t rows, int64_t w, const float *src, float *const *out, int64_t j, float *o,
    int64_t ldo) {
    if (w % 16 == 0 || w < 16) {
        /* Whole vectors, or one partial one, whose store reaches the next row
         * only where rows are narrower than 16 columns: row by row (the
         * pipelined loop ran 0.85x and 0.95x here). */
        for (int64_t r = 0; r < rows; r++) {
            float *row = TL_AMX_ROW(out, j, o, ldo, r);
            const float *sr = src + r * 64;
            for (int64_t v = 0; v < w; v += 16) {
                const int64_t left = w - v;
                const __mmask16 m = (__mmask16)(left >= 16 ? 0xffffu : (1u << left) - 1u);
                const __m512 old = set ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, row + v);
                _mm512_mask_storeu_ps(row + v, m, _mm512_add_ps(old, _mm512_load_ps(sr + v)));
            }
        }
        return;
    }
    switch ((w + 15) / 16) {
    case 2: tl_amx_add_piped(2, set, rows, w, src, out, j, o, ldo); break;
    case 3: tl_amx_add_piped(3, set, rows, w, src, out, j, o, ldo); break;
    default: tl_amx_add_piped(4, set, rows, w, src, out, j, o, ldo); break;
    }
}

/* out[r][j + :w) += src[r * 64 + :w) for r < rows (a group's stored sums). */
static inline __attribute__((always_inline)) TL_TARGET_AMX void tl_amx_add(
    int set, int64_t rows, int64_t w, const float *src, float *const *out, int64_t j) {
    tl_amx_add_rows_of(set, rows, w, src, out, j, NULL, 0);
}

/* float16 values h (32 lanes) as bfloat16 high and low parts, as
 * tl_amx_pack_f16 splits weights: the high part keeps the top 8 of the 11
 * significant bits, the low part, h minus that, the other 3; both exact in
 * bfloat16. */
static inline __attribute__((always_inline)) TL_TARGET_AMX void tl_amx_split32(
    __m512i h, __m512i *hi, __m512i *lo) {
    const __m512 top = _mm512_castsi512_ps(_mm512_set1_epi32((int)0xffff0000u));
    const __m512 f0 = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    const __m512 f1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
    const __m512 h0 = _mm512_and_ps(f0, top), h1 = _mm512_and_ps(f1, top);
    *hi = (__m512i)_mm512_cvtne2ps_pbh(h1, h0);
    *lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(f1, h1), _mm512_sub_ps(f0, h0));
}

/* The lanes of 32 float16 values that are infinite or NaN (all exponent bits set). */
static inline __attribute__((always_inline)) TL_TARGET_AMX __mmask32 tl_amx_nonfinite(__m512i h) {
    const __m512i expo = _mm512_set1_epi16(0x7c00);
    return _mm512_cmpeq_epi16_mask(_mm512_and_si512(h, expo), expo);
}

/* The group's rows a[0..rows) into abuf, channels past c_in and rows past
 * `rows` zero: bfloat16 as they are (rows kp values apart), or float16 split,
 * each row's high parts then its low parts (rows 2 kp apart).  Returns the
 * lanes that held an infinity or NaN (split only: their parts do not sum back
 * to them). */
static inline __attribute__((always_inline)) TL_TARGET_AMX __mmask32 tl_amx_gather(
    int split, int64_t rows, int64_t cin, int64_t kp, const uint16_t *const *a, uint16_t *abuf) {
    __mmask32 bad = 0;
    for (int64_t r = 0; r < 16; r++) {
        uint16_t *dst = abuf + r * (split ? 2 * kp : kp);
        for (int64_t c = 0; c < kp; c += 32) {
            const int64_t left = r < rows ? cin - c : 0;
            const __mmask32 m = (__mmask32)(left >= 32 ? 0xffffffffu
                                            : left <= 0 ? 0u
                                                        : (1u << left) - 1u);
            const __m512i h = _mm512_maskz_loadu_epi16(m, r < rows ? a[r] + c : a[0]);
            if (!split) {
                _mm512_store_si512(dst + c, h);
                continue;
            }
            bad |= tl_amx_nonfinite(h);
            __m512i hi, lo;
            tl_amx_split32(h, &hi, &lo);
            _mm512_store_si512(dst + c, hi);
            _mm512_store_si512(dst + kp + c, lo);
        }
    }
    return bad;
}

static inline __attribute__((always_inline)) TL_TARGET_AMX __mmask32 tl_amx_rows_body(
    int set, int split, int64_t c, int64_t cin, int64_t co0, int64_t cw, const uint16_t *const *a,
    const uint16_t *pw_n, int64_t pw_lo, float *const *out, uint16_t *abuf, float *cbuf) {
    const int64_t kp = tl_amx_depth(cin), blk = kp / 2 * 32, row = split ? 2 * kp : kp;
    /* x rows `row` values apart, 32 channels a step; weight blocks of kp / 2
     * pair rows of 64 bytes, 16 pair rows a step; split: the low parts kp
     * values after the high ones, the weights' pw_lo values after theirs. */
    tl_amx_operands o = {.a = (const char *)abuf, .as = row * 2, .ak = 64,
                         .bs = 64, .bk = 16 * 64, .bj = blk * 2, .steps = kp / 32,
                         .a_lo = kp * 2, .b_lo = pw_lo * 2};
    __mmask32 bad = 0;
    int64_t g = 0;
    for (; g + 16 < c; g += 32) { /* two groups, the second possibly short */
        const int64_t rows = c - g - 16 < 16 ? c - g - 16 : 16;
        bad |= tl_amx_gather(split, 16, cin, kp, a + g, abuf);
        bad |= tl_amx_gather(split, rows, cin, kp, a + g + 16, abuf + 16 * row);
        for (int64_t j = 0; j < cw; j += 32) {
            const int64_t w = cw - j < 32 ? cw - j : 32;
            o.b = (const char *)(pw_n + (co0 + j) / 16 * blk);
            if (w > 16)
                tl_amx_pair(split, 2, &o, 16 * row * 2, cbuf);
            else
                tl_amx_pair(split, 1, &o, 16 * row * 2, cbuf);
            tl_amx_add(set, 16, w, cbuf, out + g, j);
            tl_amx_add(set, rows, w, cbuf + 32, out + g + 16, j);
        }
    }
    if (g < c) { /* one group left */
        const int64_t rows = c - g;
        bad |= tl_amx_gather(split, rows, cin, kp, a + g, abuf);
        for (int64_t j = 0; j < cw; j += 64) {
            const int64_t w = cw - j < 64 ? cw - j : 64;
            o.b = (const char *)(pw_n + (co0 + j) / 16 * blk);
            tl_amx_blocks_n(split, (w + 15) / 16, &o, cbuf);
            tl_amx_add(set, rows, w, cbuf, out + g, j);
        }
    }
    return bad;
}

/* One body per `set`, so no output row tests it. */
TL_TARGET_AMX void tl_amx_rows(int set, int64_t c, int64_t cin, int64_t co0, int64_t cw,
                               const uint16_t *const *a, const uint16_t *pw_n,
                               float *const *out, uint16_t *abuf, float *cbuf) {
    if (set)
        tl_amx_rows_body(1, 0, c, cin, co0, cw, a, pw_n, 0, out, abuf, cbuf);
    else
        tl_amx_rows_body(0, 0, c, cin, co0, cw, a, pw_n, 0, out, abuf, cbuf);
}

TL_TARGET_AMX int tl_amx_rows_f16(int set, int64_t c, int64_t cin, int64_t cout, int64_t co0,
                                  int64_t cw, const uint16_t *const *a, const uint16_t *pw_n,
                                  float *const *out, uint16_t *abuf, float *cbuf) {
    const int64_t lo = tl_amx_row_elems(cin, cout);
    if (set) return tl_amx_rows_body(1, 1, c, cin, co0, cw, a, pw_n, lo, out, abuf, cbuf) != 0;
    return tl_amx_rows_body(0, 1, c, cin, co0, cw, a, pw_n, lo, out, abuf, cbuf) != 0;
}

/* The 16 x 16 32-bit units r[t][c] stored transposed: dst[c * ld + t]. */
static inline __attribute__((always_inline)) TL_TARGET_AMX void tl_amx_transpose16(
    __m512i r[16], uint32_t *dst, int64_t ld) {
    tl_transpose16_epi32(r);
    for (int j = 0; j < 16; j++) _mm512_storeu_si512(dst + j * ld, r[j]);
}

/* o[r * ldo + :w) += src[r * 64 + :w) for r < rows. */
static inline __attribute__((always_inline)) TL_TARGET_AMX void tl_amx_add_rows(
    int64_t rows, int64_t w, const float *src, float *o, int64_t ldo) {
    tl_amx_add_rows_of(0, rows, w, src, NULL, 0, o, ldo);
}

/* 16 channels [c0, c0 + width) of x rows q and q + 1 (zeros past c), as
 * 16 pair units. */
static inline __attribute__((always_inline)) TL_TARGET_AMX __m512i tl_amx_x_units(
    const uint16_t *const *xq, int64_t q, int64_t c, int64_t c0, int64_t width) {
    const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                         40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                         32, 0);
    const __mmask32 m = q < c ? (__mmask32)((1u << width) - 1u) : 0u;
    const __mmask32 m1 = q + 1 < c ? m : 0u;
    const __m512i va = _mm512_maskz_loadu_epi16(m, xq[q < c ? q : 0] + c0);
    const __m512i vb = _mm512_maskz_loadu_epi16(m1, xq[q + 1 < c ? q + 1 : 0] + c0);
    return _mm512_permutex2var_epi16(va, idx, vb);
}

/* n float16 values (a multiple of 32) split in place: the high parts stay,
 * the low parts go to lo.  Returns the lanes that held an infinity or NaN. */
static inline __attribute__((always_inline)) TL_TARGET_AMX __mmask32 tl_amx_split_run(
    uint16_t *v, int64_t n, uint16_t *lo) {
    __mmask32 bad = 0;
    for (int64_t i = 0; i < n; i += 32) {
        const __m512i h = _mm512_loadu_si512(v + i);
        bad |= tl_amx_nonfinite(h);
        __m512i hi, low;
        tl_amx_split32(h, &hi, &low);
        _mm512_storeu_si512(v + i, hi);
        _mm512_storeu_si512(lo + i, low);
    }
    return bad;
}

static inline __attribute__((always_inline)) TL_TARGET_AMX __mmask32 tl_amx_wgrad_body(
    int split, int64_t c, int64_t cin, int64_t cout, const uint16_t *const *xq,
    const uint16_t *const *dq, uint32_t *xt, uint16_t *dt, float *cbuf, float *out, int64_t ldo) {
    const int64_t units = tl_amx_units(c), cinp = tl_amx_round16(cin);
    const int64_t coutp = tl_amx_round16(cout);
    __mmask32 bad = 0;
    /* dy: unit row t holds pairs 2t and 2t + 1 side by side (split: as
     * float16, then split where they lie, the low parts' rows after). */
    for (int64_t t = 0; t < units; t++) {
        const int64_t q = 2 * t;
        tl_bf16_interleave(dq[q < c ? q : 0], q + 1 < c ? dq[q + 1] : NULL, q < c ? cout : 0,
                           coutp, dt + t * 2 * coutp);
    }
    if (split) bad |= tl_amx_split_run(dt, units * 2 * coutp, dt + units * 2 * coutp);
    /* x: the same units, 16 unit rows x 16 channels at a time, interleaved
     * (as tl_bf16_interleave, in registers) and transposed into xt (a row per
     * channel, `units` apart).  Split: transposed as float16, then each value
     * split where it lies, the low parts' cinp rows after (the split is per
     * value, so it commutes with the transposition, which runs once). */
    for (int64_t t0 = 0; t0 < units; t0 += 16)
        for (int64_t c0 = 0; c0 < cinp; c0 += 16) {
            const int64_t width = cin - c0 < 16 ? cin - c0 : 16;
            __m512i r[16];
            for (int64_t t = 0; t < 16; t++) r[t] = tl_amx_x_units(xq, 2 * (t0 + t), c, c0, width);
            tl_amx_transpose16(r, xt + c0 * units + t0, units);
        }
    if (split)
        bad |= tl_amx_split_run((uint16_t *)xt, cinp * units * 2, (uint16_t *)(xt + cinp * units));
    /* Two channel blocks x two column blocks at a time (tl_amx_pair), so each
     * x and dy block loaded feeds two products; a last lone channel block takes
     * up to four column blocks (tl_amx_blocks).  x: a row per channel, units
     * apart, 16 units a step; dy: unit rows of coutp pairs, 16 a step. */
    tl_amx_operands o = {.as = units * 4, .ak = 64, .bs = coutp * 4, .bk = 16 * coutp * 4,
                         .bj = 64, .steps = units / 16, .a_lo = cinp * units * 4,
                         .b_lo = units * coutp * 4};
    int64_t c0 = 0;
    for (; c0 + 16 < cinp; c0 += 32) {
        const int64_t rows1 = cin - c0 - 16 < 16 ? cin - c0 - 16 : 16;
        o.a = (const char *)(xt + c0 * units);
        for (int64_t j = 0; j < coutp; j += 32) {
            const int64_t w = cout - j < 32 ? cout - j : 32;
            o.b = (const char *)(dt + 2 * j);
            if (coutp - j > 16)
                tl_amx_pair(split, 2, &o, 16 * units * 4, cbuf);
            else
                tl_amx_pair(split, 1, &o, 16 * units * 4, cbuf);
            tl_amx_add_rows(16, w, cbuf, out + c0 * ldo + j, ldo);
            tl_amx_add_rows(rows1, w, cbuf + 32, out + (c0 + 16) * ldo + j, ldo);
        }
    }
    if (c0 < cinp) {
        o.a = (const char *)(xt + c0 * units);
        for (int64_t j = 0; j < coutp; j += 64) {
            o.b = (const char *)(dt + 2 * j);
            tl_amx_blocks_n(split, (coutp - j < 64 ? coutp - j : 64) / 16, &o, cbuf);
            tl_amx_add_rows(cin - c0, cout - j < 64 ? cout - j : 64, cbuf, out + c0 * ldo + j, ldo);
        }
    }
    return bad;
}

TL_TARGET_AMX void tl_amx_wgrad(int64_t c, int64_t cin, int64_t cout, const uint16_t *const *xq,
                                const uint16_t *const *dq, uint32_t *xt, uint16_t *dt,
                                float *cbuf, float *out, int64_t ldo) {
    tl_amx_wgrad_body(0, c, cin, cout, xq, dq, xt, dt, cbuf, out, ldo);
}

TL_TARGET_AMX int tl_amx_wgrad_f16(int64_t c, int64_t cin, int64_t cout,
                                   const uint16_t *const *xq, const uint16_t *const *dq,
                                   uint32_t *xt, uint16_t *dt, float *cbuf, float *out,
                                   int64_t ldo) {
    return tl_amx_wgrad_body(1, c, cin, cout, xq, dq, xt, dt, cbuf, out, ldo) != 0;
}
#endif
