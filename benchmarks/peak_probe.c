/* Register-only arithmetic loops that measure what one core can compute at most.
 *
 * Each loop keeps independent accumulator chains in vector registers (enough of
 * them to cover the FMA latency on every FMA port) and touches no memory, so its
 * rate is the core's arithmetic peak for that instruction. benchmarks/peak.py
 * compiles this file at run time, calls one loop per thread and turns the
 * counts into GFLOP/s; every "% of peak" in the benchmark reports divides by it.
 *
 * Each function returns the sum of its accumulators so the compiler cannot drop
 * the work; flops per iteration are documented beside each loop. */
#define _DEFAULT_SOURCE 1 /* syscall(): Linux grants the AMX tile state on request */
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* AMX tiles: GCC 11 / clang 12 know the instructions; only Linux is asked for
 * the tile state. */
#if defined(__linux__) && defined(__x86_64__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define TL_PROBE_AMX 1
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define TL_PROBE_AMX 0
#endif

/* 12 ymm chains x 8 lanes x 2 flops = 192 flops per iteration. */
__attribute__((target("avx2,fma"))) double tl_probe_fma_avx2(int64_t iters) {
    __m256 acc[12];
    for (int c = 0; c < 12; c++)
        acc[c] = _mm256_set1_ps(1.0f + 0.001f * (float)c);
    const __m256 a = _mm256_set1_ps(0.9999999f), b = _mm256_set1_ps(1e-7f);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int c = 0; c < 12; c++)
            acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    }
    float out[8];
    __m256 sum = acc[0];
    for (int c = 1; c < 12; c++)
        sum = _mm256_add_ps(sum, acc[c]);
    _mm256_storeu_ps(out, sum);
    return (double)out[0] + out[7];
}

/* 24 zmm chains x 16 lanes x 2 flops = 768 flops per iteration. */
__attribute__((target("avx512f"))) double tl_probe_fma_avx512(int64_t iters) {
    __m512 acc[24];
    for (int c = 0; c < 24; c++)
        acc[c] = _mm512_set1_ps(1.0f + 0.001f * (float)c);
    const __m512 a = _mm512_set1_ps(0.9999999f), b = _mm512_set1_ps(1e-7f);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 24
        for (int c = 0; c < 24; c++)
            acc[c] = _mm512_fmadd_ps(acc[c], a, b);
    }
    __m512 sum = acc[0];
    for (int c = 1; c < 24; c++)
        sum = _mm512_add_ps(sum, acc[c]);
    return (double)_mm512_reduce_add_ps(sum);
}

/* vdpbf16ps: each lane adds two bf16 products, 16 lanes x 2 x 2 = 64 flops an
 * instruction; 24 chains = 1536 flops per iteration. */
__attribute__((target("avx512f,avx512bf16"))) double tl_probe_dpbf16_avx512(int64_t iters) {
    __m512 acc[24];
    for (int c = 0; c < 24; c++)
        acc[c] = _mm512_set1_ps(0.001f * (float)c);
    const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-6f), _mm512_set1_ps(2e-6f));
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 24
        for (int c = 0; c < 24; c++)
            acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    }
    __m512 sum = acc[0];
    for (int c = 1; c < 24; c++)
        sum = _mm512_add_ps(sum, acc[c]);
    return (double)_mm512_reduce_add_ps(sum);
}

#if TL_PROBE_AMX
/* tdpbf16ps: a 16 x 32 bf16 tile times a 32 x 16 one into 16 x 16 float sums,
 * 16 x 16 x 32 x 2 = 16384 flops; 4 accumulator tiles = 65536 flops per
 * iteration.  The operands stay in tiles 4 and 5. */
__attribute__((target("amx-tile,amx-bf16"))) double tl_probe_tdpbf16(int64_t iters) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 6; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    static uint16_t ab[16 * 32];
    static float out[16 * 16];
    for (int i = 0; i < 16 * 32; i++)
        ab[i] = 0x3a83; /* about 1e-3 */
    __asm__ volatile("" : : "r"(&cfg) : "memory"); /* ldtilecfg reads cfg */
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ab, 64);
    _tile_loadd(5, ab, 64);
    for (int64_t i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 4, 5);
        _tile_dpbf16ps(2, 4, 5);
        _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    return (double)out[0];
}

/* Whether the CPU has AMX-BF16 and Linux grants this process the tile state. */
static int tl_probe_amx(void) {
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16"))
        return 0;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}
#else
double tl_probe_tdpbf16(int64_t iters) { (void)iters; return 0.0; }
static int tl_probe_amx(void) { return 0; }
#endif

/* Which loops this CPU runs: bit 0 AVX2+FMA, bit 1 AVX-512F, bit 2 AVX512_BF16,
 * bit 3 AMX-BF16 tiles. */
int tl_probe_isa(void) {
    __builtin_cpu_init();
    int isa = 0;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        isa |= 1;
    if (__builtin_cpu_supports("avx512f"))
        isa |= 2;
    if ((isa & 2) && __builtin_cpu_supports("avx512bf16"))
        isa |= 4;
    if ((isa & 4) && tl_probe_amx())
        isa |= 8;
    return isa;
}
#else
double tl_probe_fma_avx2(int64_t iters) { (void)iters; return 0.0; }
double tl_probe_fma_avx512(int64_t iters) { (void)iters; return 0.0; }
double tl_probe_dpbf16_avx512(int64_t iters) { (void)iters; return 0.0; }
double tl_probe_tdpbf16(int64_t iters) { (void)iters; return 0.0; }
int tl_probe_isa(void) { return 0; }
#endif
