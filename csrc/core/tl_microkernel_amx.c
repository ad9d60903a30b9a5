/* syscall() (Linux asks a process to request the tile registers). */
#define _DEFAULT_SOURCE
#include "tl_microkernel_amx.h"

#include <string.h>

#if TL_SIMD_X86
#include <immintrin.h>
#endif
#if TL_SIMD_X86 && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

int64_t tl_amx_panel_elems(const tl_conv_desc *d) {
    return d->k * tl_amx_depth(d->c_in) * ((d->c_out + 15) / 16 * 16);
}

void tl_amx_pack(const tl_conv_desc *d, const uint16_t *w, uint16_t *pw) {
    const int64_t cin = d->c_in, cout = d->c_out, kp = tl_amx_depth(cin), nb = (cout + 15) / 16;
    for (int64_t n = 0; n < d->k; n++)
        for (int64_t b = 0; b < nb; b++)
            for (int64_t p = 0; p < kp / 2; p++) {
                uint16_t *dst = pw + ((n * nb + b) * (kp / 2) + p) * 32;
                for (int64_t j = 0; j < 16; j++)
                    for (int64_t u = 0; u < 2; u++) {
                        const int64_t c = 2 * p + u, col = 16 * b + j;
                        dst[2 * j + u] = c < cin && col < cout ? w[(n * cin + c) * cout + col] : 0;
                    }
            }
}

/* Linux's arch_prctl requests: the extended states this process may use, and
 * the tile data state's number. */
#define TL_ARCH_REQ_XCOMP_PERM 0x1023
#define TL_XFEATURE_XTILEDATA 18

int tl_amx_usable(void) {
#if TL_SIMD_X86 && defined(__linux__) && defined(SYS_arch_prctl)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16")) return 0;
    return syscall(SYS_arch_prctl, TL_ARCH_REQ_XCOMP_PERM, TL_XFEATURE_XTILEDATA) == 0;
#else
    return 0;
#endif
}

#if TL_SIMD_X86
#define TL_TARGET_AMX __attribute__((target("arch=x86-64-v4,avx512bf16,amx-tile,amx-bf16")))

/* The tile configuration (palette 1): eight tiles of 16 rows x 64 bytes.
 * Tiles 0-3 hold float sums (16 x 16), 4 the x rows (16 x 32 bfloat16), 5
 * and 6 weight blocks (16 channel pairs x 16 columns), so one weight block
 * loads while the other multiplies. */
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
    .colsb = {64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16},
};

TL_TARGET_AMX void tl_amx_start(void) { _tile_loadconfig(&tl_amx_tiles); }

TL_TARGET_AMX void tl_amx_stop(void) { _tile_release(); }

/* The group's rows a[0..rows) into abuf (stride kp values), channels past
 * c_in and rows past `rows` zero. */
static inline __attribute__((always_inline)) TL_TARGET_AMX void tl_amx_gather(
    int64_t rows, int64_t cin, int64_t kp, const uint16_t *const *a, uint16_t *abuf) {
    for (int64_t r = 0; r < 16; r++) {
        uint16_t *dst = abuf + r * kp;
        for (int64_t c = 0; c < kp; c += 32) {
            const int64_t left = r < rows ? cin - c : 0;
            const __mmask32 m = (__mmask32)(left >= 32 ? 0xffffffffu
                                            : left <= 0 ? 0u
                                                        : (1u << left) - 1u);
            _mm512_store_si512(dst + c, _mm512_maskz_loadu_epi16(m, r < rows ? a[r] + c : a[0]));
        }
    }
}

/* NV (1 to 4) column blocks from block b: sums over every 32-channel step
 * into tiles 0..NV-1, then stored into cbuf (row stride 64 floats). */
#define TL_AMX_STEP(T, B)                                                                  \
    do {                                                                                   \
        _tile_loadd(B, wb + (int64_t)(T) * blk, 64);                                       \
        _tile_dpbf16ps(T, 4, B);                                                           \
    } while (0)

static inline __attribute__((always_inline)) TL_TARGET_AMX void tl_amx_blocks(
    int NV, int64_t kp, const uint16_t *abuf, const uint16_t *pw_b, float *cbuf) {
    const int64_t blk = kp / 2 * 32; /* values per packed column block */
    _tile_zero(0);
    if (NV > 1) _tile_zero(1);
    if (NV > 2) _tile_zero(2);
    if (NV > 3) _tile_zero(3);
    for (int64_t c = 0; c < kp; c += 32) {
        const uint16_t *wb = pw_b + c / 2 * 32;
        _tile_loadd(4, abuf + c, kp * 2);
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

TL_TARGET_AMX void tl_amx_rows(int64_t c, int64_t cin, int64_t co0, int64_t cw, int64_t cout,
                               const uint16_t *const *a, const uint16_t *pw_n,
                               float *const *out, uint16_t *abuf, float *cbuf) {
    const int64_t kp = tl_amx_depth(cin), blk = kp / 2 * 32;
    (void)cout;
    for (int64_t g = 0; g < c; g += 16) {
        const int64_t rows = c - g < 16 ? c - g : 16;
        tl_amx_gather(rows, cin, kp, a + g, abuf);
        for (int64_t j = 0; j < cw; j += 64) {
            const int64_t w = cw - j < 64 ? cw - j : 64;
            const int nv = (int)((w + 15) / 16);
            const uint16_t *pw_b = pw_n + (co0 + j) / 16 * blk;
            switch (nv) {
            case 1: tl_amx_blocks(1, kp, abuf, pw_b, cbuf); break;
            case 2: tl_amx_blocks(2, kp, abuf, pw_b, cbuf); break;
            case 3: tl_amx_blocks(3, kp, abuf, pw_b, cbuf); break;
            default: tl_amx_blocks(4, kp, abuf, pw_b, cbuf); break;
            }
            for (int64_t r = 0; r < rows; r++) {
                float *o = out[g + r] + j;
                for (int64_t v = 0; v < w; v += 16) {
                    const int64_t left = w - v;
                    const __mmask16 m = (__mmask16)(left >= 16 ? 0xffffu : (1u << left) - 1u);
                    _mm512_mask_storeu_ps(o + v, m,
                                          _mm512_add_ps(_mm512_maskz_loadu_ps(m, o + v),
                                                        _mm512_load_ps(cbuf + r * 64 + v)));
                }
            }
        }
    }
}
#endif
