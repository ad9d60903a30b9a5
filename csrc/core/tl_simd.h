/* Instruction sets the CPU micro-kernels are compiled for, and which one this
 * CPU runs.  On x86-64 with GCC the kernels exist three times: AVX-512
 * (x86-64-v4), AVX2 + FMA (x86-64-v3) and the baseline; each is compiled
 * with its own target attribute, so the rest of the library stays baseline
 * x86-64.  AVX-512 CPUs with AVX512_BF16 (a level of its own) also run the
 * bfloat16 dot-product kernels (tl_microkernel_bf16.c), and those with AMX
 * tiles too (the level above) the bfloat16 tile kernels
 * (tl_microkernel_amx.c).  Other targets and compilers get the baseline
 * kernels only. */
#ifndef TL_SIMD_H
#define TL_SIMD_H

/* TL_SIMD_PORTABLE compiles the baseline alone on x86 too, as other targets
 * and compilers build it (tests/ops/test_c_core.py keeps that build
 * compiling and passing). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(TL_SIMD_PORTABLE)
#define TL_SIMD_X86 1
#define TL_TARGET_V4 __attribute__((target("arch=x86-64-v4")))
#define TL_TARGET_V3 __attribute__((target("arch=x86-64-v3")))
#define TL_TARGET_BF16 __attribute__((target("arch=x86-64-v4,avx512bf16")))
#else
#define TL_SIMD_X86 0
#endif

/* The AMX tile kernels: GCC 11 and later know the instructions, and only
 * Linux is asked for the tile state (tl_amx_usable). */
#if TL_SIMD_X86 && __GNUC__ >= 11 && defined(__linux__)
#define TL_SIMD_AMX 1
#else
#define TL_SIMD_AMX 0
#endif

typedef enum tl_simd {
    TL_SIMD_BASE = 0,
    TL_SIMD_V3 = 3,
    TL_SIMD_V4 = 4,
    TL_SIMD_V4_BF16 = 5,
    TL_SIMD_V4_AMX = 6
} tl_simd;

/* Whether this process may use the AMX tile registers: the CPU has AMX-TILE
 * and AMX-BF16 and the operating system grants the tile data state (Linux
 * asks each process to request it; asking again is harmless).
 * tl_microkernel_amx.c. */
int tl_amx_usable(void);

/* The widest vector instruction set of this CPU, tiles aside (libgcc reads
 * CPUID once). */
static inline tl_simd tl_simd_vector_level(void) {
#if TL_SIMD_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4"))
        return __builtin_cpu_supports("avx512bf16") ? TL_SIMD_V4_BF16 : TL_SIMD_V4;
    if (__builtin_cpu_supports("x86-64-v3")) return TL_SIMD_V3;
#endif
    return TL_SIMD_BASE;
}

/* The widest instruction set of this CPU, AMX tiles included (which asks the
 * operating system, a system call). */
static inline tl_simd tl_simd_level(void) {
    const tl_simd level = tl_simd_vector_level();
    return level == TL_SIMD_V4_BF16 && tl_amx_usable() ? TL_SIMD_V4_AMX : level;
}

/* Asks for the cache lines of the rows ROWS[0..N), ROW_BYTES each: the
 * kernels ask for the next group's input rows while a group computes. */
#define TL_PREFETCH_ROWS(ROWS, N, ROW_BYTES)                                                \
    do {                                                                                    \
        for (int r_ = 0; r_ < (N); r_++)                                                    \
            for (int64_t b_ = 0; b_ < (ROW_BYTES); b_ += 64)                                \
                __builtin_prefetch((const char *)(ROWS)[r_] + b_);                          \
    } while (0)

/* The same for rows named by index: the first ROW_BYTES of rows IDX[0..N) of
 * BASE, STRIDE bytes apart. */
#define TL_PREFETCH_LISTED(BASE, IDX, N, STRIDE, ROW_BYTES)                                 \
    do {                                                                                    \
        for (int64_t t_ = 0; t_ < (N); t_++)                                                \
            for (int64_t b_ = 0; b_ < (ROW_BYTES); b_ += 64)                                \
                __builtin_prefetch((const char *)(BASE) + (int64_t)(IDX)[t_] * (STRIDE) + b_); \
    } while (0)

/* In a pass over rows [P0, C) in groups of GROUP (C - P0 a multiple of GROUP),
 * at the group starting at P: asks for the rows of the group AHEAD rows on,
 * and at the first group also for those of the groups in between (AHEAD 0:
 * nothing; AHEAD = GROUP: the next group's, as it computes). */
#define TL_PREFETCH_AHEAD(ROWS, P, P0, C, GROUP, AHEAD, ROW_BYTES)                         \
    do {                                                                                    \
        if ((P) == (P0))                                                                    \
            for (int64_t q_ = (P) + (GROUP); q_ < (P) + (AHEAD) && q_ < (C); q_ += (GROUP)) \
                TL_PREFETCH_ROWS((ROWS) + q_, (GROUP), (ROW_BYTES));                        \
        if ((AHEAD) && (P) + (AHEAD) < (C))                                                 \
            TL_PREFETCH_ROWS((ROWS) + (P) + (AHEAD), (GROUP), (ROW_BYTES));                 \
    } while (0)

/* Rows ahead that the forward's groups of 4 ask for x rows (TL_RUN_GROUPS),
 * for groups of `work` multiply-adds per row (input channels x panel columns,
 * halved for the bf16 dot products, which do two per lane): two groups where
 * a group is short (C = 64 with fp32: 1.08-1.12x on k2 s2 maps of both
 * scenes, 1.02-1.08x on their inverses; three ahead gained nothing more), one
 * where it is long enough to hide the latency alone (C = 128: two ran
 * 0.97-1.00x). */
#define TL_AHEAD_LONG_WORK 8192
static inline int64_t tl_rows_ahead(int64_t work) { return work < TL_AHEAD_LONG_WORK ? 8 : 4; }

/* Groups of 8 ahead that the 8-row forward kernels ask for x rows, `work` as
 * above: a group of a narrow layer computes too briefly to hide a row's trip
 * from memory, so 4 ahead up to C = 32 (fp32 C = 16-32: 1.02-1.31x on the
 * LiDAR scan's maps and 0.95-1.19x on the surface's against one ahead; 8 ran
 * 0.93-1.01x of 4; C = 48 at 4 ran 0.96-1.05x and C = 40 at 2 0.96-1.01x, so
 * one there). */
static inline int64_t tl_rows8_ahead(int64_t work) { return work <= 1024 ? 4 : 1; }

/* The set the kernels run with: the CPU's widest, at most `cap` (tl_ctx's
 * simd_cap); the operating system is asked about tiles only where the cap
 * allows them. */
static inline tl_simd tl_simd_capped(int cap) {
    const tl_simd level = cap >= TL_SIMD_V4_AMX ? tl_simd_level() : tl_simd_vector_level();
    return (int)level < cap ? level : (tl_simd)cap;
}

/* The same for kernels that never use tiles (the float micro-kernels, the
 * listing): no system call on their every call. */
static inline tl_simd tl_simd_vector_capped(int cap) {
    return tl_simd_capped(cap < TL_SIMD_V4_BF16 ? cap : TL_SIMD_V4_BF16);
}

#endif
