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
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

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

/* Which loops this CPU runs: bit 0 AVX2+FMA, bit 1 AVX-512F, bit 2 AVX512_BF16. */
int tl_probe_isa(void) {
    __builtin_cpu_init();
    int isa = 0;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        isa |= 1;
    if (__builtin_cpu_supports("avx512f"))
        isa |= 2;
    if ((isa & 2) && __builtin_cpu_supports("avx512bf16"))
        isa |= 4;
    return isa;
}
#else
double tl_probe_fma_avx2(int64_t iters) { (void)iters; return 0.0; }
double tl_probe_fma_avx512(int64_t iters) { (void)iters; return 0.0; }
double tl_probe_dpbf16_avx512(int64_t iters) { (void)iters; return 0.0; }
int tl_probe_isa(void) { return 0; }
#endif
