#include "tl_microkernel_bf16.h"

#include <string.h>

#include "tl_simd.h"

#if TL_SIMD_X86
#include <immintrin.h>
#endif

int64_t tl_bf16_panel_elems(const tl_conv_desc *d) {
    return d->k * ((d->c_in + 1) / 2 * 2) * d->c_out;
}

void tl_bf16_pack_panels(const tl_conv_desc *d, int64_t width, const uint16_t *w, uint16_t *pw) {
    const int64_t cin = d->c_in, cout = d->c_out, cp = (cin + 1) / 2 * 2;
    for (int64_t n = 0; n < d->k; n++)
        for (int64_t j = 0; j < cout; j += width) {
            const int64_t wb = cout - j < width ? cout - j : width;
            uint16_t *panel = pw + n * cp * cout + j * cp;
            for (int64_t c = 0; c < cp; c++) {
                const uint16_t *src = w + (n * cin + c) * cout + j;
                uint16_t *dst = panel + (c / 2) * 2 * wb + c % 2;
                for (int64_t jj = 0; jj < wb; jj++) dst[2 * jj] = c < cin ? src[jj] : 0;
            }
        }
}

#if TL_SIMD_X86
TL_TARGET_BF16 void tl_bf16_interleave(const uint16_t *a, const uint16_t *b, int64_t n, int64_t m,
                                       uint16_t *out) {
    static const uint16_t lo_idx[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                        37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                        11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i lo = _mm512_loadu_si512(lo_idx);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int64_t i = 0; i < m; i += 32) {
        const int64_t read = n - i < 0 ? 0 : n - i < 32 ? n - i : 32;
        const int64_t left = m - i < 32 ? m - i : 32; /* values of each written */
        const __mmask32 mr = (__mmask32)(read == 32 ? 0xffffffffu : (1u << read) - 1u);
        const __m512i va = _mm512_maskz_loadu_epi16(mr, a + i);
        const __m512i vb = b ? _mm512_maskz_loadu_epi16(mr, b + i) : _mm512_setzero_si512();
        const __mmask32 m0 = (__mmask32)(left >= 16 ? 0xffffffffu : (1u << (2 * left)) - 1u);
        const __mmask32 m1 =
            (__mmask32)(left >= 32 ? 0xffffffffu : left <= 16 ? 0u : (1u << (2 * (left - 16))) - 1u);
        _mm512_mask_storeu_epi16(out + 2 * i, m0, _mm512_permutex2var_epi16(va, lo, vb));
        _mm512_mask_storeu_epi16(out + 2 * i + 32, m1, _mm512_permutex2var_epi16(va, hi, vb));
    }
}

TL_TARGET_BF16 void tl_bf16_wgrad_pack(int64_t c, int64_t cin, int64_t cout,
                                       const uint16_t *const *xq, const uint16_t *const *dq,
                                       uint32_t *xp, uint16_t *dp, uint16_t *tmp) {
    const int64_t tp = (c + 1) / 2, strips = (cin + 3) / 4;
    for (int64_t t = 0; t < tp; t++) {
        const int pair = 2 * t + 1 < c;
        tl_bf16_interleave(dq[2 * t], pair ? dq[2 * t + 1] : NULL, cout, cout, dp + t * cout * 2);
        /* The x pair interleaved, then cut into strips of 4 channels (the
         * last one padded with zeros). */
        tl_bf16_interleave(xq[2 * t], pair ? xq[2 * t + 1] : NULL, cin, cin, tmp);
        memset(tmp + 2 * cin, 0, sizeof(uint16_t) * (size_t)(2 * (strips * 4 - cin)));
        for (int64_t st = 0; st < strips; st++)
            memcpy(xp + (st * tp + t) * 4, tmp + 8 * st, 4 * sizeof(uint32_t));
    }
}

/* acc[r][v] += the dot products of x pair xp[r] (two bfloat16 channels as
 * one 32-bit value) with NV weight vectors at wp (16 columns x the same two
 * channels each; the last vector's columns limited by mask). */
static inline __attribute__((always_inline)) TL_TARGET_BF16 void tl_bf16_step(
    int R, int NV, __mmask16 mask, const uint16_t *wp, const uint32_t *xp, __m512 acc[8][4]) {
    __m512i wv[4];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++)
        wv[v] = v == NV - 1 && mask != 0xffff ? _mm512_maskz_loadu_epi32(mask, wp + 32 * v)
                                              : _mm512_loadu_si512(wp + 32 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        const __m512i xb = _mm512_set1_epi32((int)xp[r]);
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++)
            acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)xb, (__m512bh)wv[v]);
    }
}

/* One register block: R rows x NV vectors of 16 float columns from column
 * j of a panel wb columns wide, the last vector's columns limited by `mask`
 * (a partial vector when wb is not a multiple of 16).  acc[][] stays in
 * registers (16 of the 32) over all channel pairs; each weight vector feeds R
 * dot products and each broadcast x pair NV. */
static inline __attribute__((always_inline)) TL_TARGET_BF16 void tl_bf16_block(
    int set, int R, int NV, __mmask16 mask, int64_t j, int64_t cin, const uint16_t *const *a,
    const uint16_t *panel, int64_t wb, float *const *out) {
    __m512 acc[8][4];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    const int64_t pairs = cin / 2;
    const uint16_t *wp = panel + 2 * j;
    uint32_t xp[8];
#pragma GCC unroll 2
    for (int64_t p = 0; p < pairs; p++, wp += 2 * wb) {
        for (int r = 0; r < R; r++) memcpy(&xp[r], a[r] + 2 * p, sizeof xp[r]);
        tl_bf16_step(R, NV, mask, wp, xp, acc);
    }
    if (cin % 2) { /* the last channel alone: its panel partner weights are 0 */
        for (int r = 0; r < R; r++) xp[r] = a[r][cin - 1];
        tl_bf16_step(R, NV, mask, wp, xp, acc);
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) {
            float *o = out[r] + j + 16 * v;
            const __mmask16 m = v == NV - 1 ? mask : 0xffff;
            /* set: the sums plus zero, what adding them to a zeroed row gives */
            const __m512 old = set ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, o);
            _mm512_mask_storeu_ps(o, m, _mm512_add_ps(old, acc[r][v]));
        }
}

/* All cw columns: blocks of 4 vectors, then 2, then 1, then one partial. */
static inline __attribute__((always_inline)) TL_TARGET_BF16 void tl_bf16_columns(
    int set, int R, int64_t cw, int64_t cin, const uint16_t *const *a, const uint16_t *panel,
    float *const *out) {
    int64_t j = 0, vecs = cw / 16;
    for (; vecs >= 4; vecs -= 4, j += 64)
        tl_bf16_block(set, R, 4, 0xffff, j, cin, a, panel, cw, out);
    if (vecs >= 2) {
        tl_bf16_block(set, R, 2, 0xffff, j, cin, a, panel, cw, out);
        vecs -= 2;
        j += 32;
    }
    if (vecs) {
        tl_bf16_block(set, R, 1, 0xffff, j, cin, a, panel, cw, out);
        j += 16;
    }
    if (j < cw)
        tl_bf16_block(set, R, 1, (__mmask16)((1u << (cw - j)) - 1u), j, cin, a, panel, cw, out);
}

/* 8 rows x at most 2 vectors (16 accumulators): narrow layers, where 4 rows of
 * one or two vectors leave the dot products' latency exposed. */
static inline __attribute__((always_inline)) TL_TARGET_BF16 void tl_bf16_group_8(
    int set, int64_t cw, int64_t cin, const uint16_t *const *a, const uint16_t *panel,
    float *const *out) {
    int64_t j = 0, vecs = cw / 16;
    if (vecs >= 2) {
        tl_bf16_block(set, 8, 2, 0xffff, j, cin, a, panel, cw, out);
        vecs -= 2;
        j += 32;
    }
    if (vecs) {
        tl_bf16_block(set, 8, 1, 0xffff, j, cin, a, panel, cw, out);
        j += 16;
    }
    if (j < cw)
        tl_bf16_block(set, 8, 1, (__mmask16)((1u << (cw - j)) - 1u), j, cin, a, panel, cw, out);
}

#define TL_BF16_ROWS(NAME, R, SET)                                                          \
    static TL_TARGET_BF16 void NAME(int64_t cw, int64_t cin, const uint16_t *const *a,        \
                                    const uint16_t *panel, float *const *out) {               \
        tl_bf16_columns(SET, R, cw, cin, a, panel, out);                                      \
    }
TL_BF16_ROWS(tl_bf16_rows_4, 4, 0)
TL_BF16_ROWS(tl_bf16_rows_2, 2, 0)
TL_BF16_ROWS(tl_bf16_rows_4_set, 4, 1)
TL_BF16_ROWS(tl_bf16_rows_2_set, 2, 1)
#undef TL_BF16_ROWS

/* One weight-gradient block: input channels 4s..4s+3 (rows < valid
 * written) x NV vectors of 16 columns from column j, over all tp pair pairs;
 * each dy vector feeds 4 dot products, each x pair NV. */
static inline __attribute__((always_inline)) TL_TARGET_BF16 void tl_bf16_wgrad_block(
    int NV, __mmask16 mask, int64_t j, int64_t cout, int64_t tp, const uint32_t *xs,
    const uint16_t *dp, float *out, int64_t ldo, int64_t valid) {
    __m512 acc[8][4];
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int64_t t = 0; t < tp; t++)
        tl_bf16_step(4, NV, mask, dp + (t * cout + j) * 2, xs + 4 * t, acc);
    for (int r = 0; r < 4 && r < valid; r++)
        for (int v = 0; v < NV; v++) {
            float *o = out + r * ldo + j + 16 * v;
            const __mmask16 m = v == NV - 1 ? mask : 0xffff;
            _mm512_mask_storeu_ps(o, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, o), acc[r][v]));
        }
}

/* Every strip of 4 input channels for one block of columns, so the block's
 * dy vectors stay in L1 while the x strips stream past them. */
static inline __attribute__((always_inline)) TL_TARGET_BF16 void tl_bf16_wgrad_strips(
    int NV, __mmask16 mask, int64_t j, int64_t cin, int64_t cout, int64_t tp,
    const uint32_t *xp, const uint16_t *dp, float *out, int64_t ldo) {
    for (int64_t s = 0; s < (cin + 3) / 4; s++)
        tl_bf16_wgrad_block(NV, mask, j, cout, tp, xp + s * tp * 4, dp, out + 4 * s * ldo, ldo,
                            cin - 4 * s);
}

TL_TARGET_BF16 void tl_bf16_wgrad_panel(int64_t cin, int64_t cout, int64_t tp,
                                        const uint32_t *xp, const uint16_t *dp, float *out,
                                        int64_t ldo) {
    int64_t j = 0, vecs = cout / 16;
    for (; vecs >= 4; vecs -= 4, j += 64)
        tl_bf16_wgrad_strips(4, 0xffff, j, cin, cout, tp, xp, dp, out, ldo);
    if (vecs >= 2) {
        tl_bf16_wgrad_strips(2, 0xffff, j, cin, cout, tp, xp, dp, out, ldo);
        vecs -= 2;
        j += 32;
    }
    if (vecs) {
        tl_bf16_wgrad_strips(1, 0xffff, j, cin, cout, tp, xp, dp, out, ldo);
        j += 16;
    }
    if (j < cout)
        tl_bf16_wgrad_strips(1, (__mmask16)((1u << (cout - j)) - 1u), j, cin, cout, tp, xp, dp,
                             out, ldo);
}

/* One body per (R, set), so no output vector tests `set`. */
void tl_bf16_rows(int set, int R, int64_t cw, int64_t cin, const uint16_t *const *a,
                  const uint16_t *panel, float *const *out) {
    if (R == 4)
        (set ? tl_bf16_rows_4_set : tl_bf16_rows_4)(cw, cin, a, panel, out);
    else
        (set ? tl_bf16_rows_2_set : tl_bf16_rows_2)(cw, cin, a, panel, out);
}

static inline __attribute__((always_inline)) TL_TARGET_BF16 void tl_bf16_rows_8_body(
    int set, int64_t cw, int64_t cin, int64_t c, const uint16_t *const *a,
    const uint16_t *panel, float *const *out, int64_t oc) {
    const int64_t ahead = oc == 0 ? 8 * tl_rows8_ahead(cin * cw / 2) : 0;
    for (int64_t p = 0; p < c; p += 8) {
        TL_PREFETCH_AHEAD(a, p, 0, c, 8, ahead, cin * 2);
        float *o[8];
        for (int r = 0; r < 8; r++) o[r] = out[p + r] + oc;
        tl_bf16_group_8(set, cw, cin, a + p, panel, o);
    }
}

/* One body per `set`, as tl_bf16_rows. */
TL_TARGET_BF16 void tl_bf16_rows_8(int set, int64_t cw, int64_t cin, int64_t c,
                                   const uint16_t *const *a, const uint16_t *panel,
                                   float *const *out, int64_t oc) {
    if (set)
        tl_bf16_rows_8_body(1, cw, cin, c, a, panel, out, oc);
    else
        tl_bf16_rows_8_body(0, cw, cin, c, a, panel, out, oc);
}
#endif
