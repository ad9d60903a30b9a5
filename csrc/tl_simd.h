/* Vectorized clones of hot loops for AVX-512, AVX2 and baseline x86-64,
 * chosen once at load time by the dynamic linker (ifunc).  Other targets and
 * compilers get one generic version. */
#ifndef TL_SIMD_H
#define TL_SIMD_H

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TL_HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TL_HOT
#endif

/* Bytes per vector of the register-blocked micro-kernels: one AVX-512
 * register, two AVX2 registers (each clone splits it as it must). */
#define TL_VBYTES 64

#endif
