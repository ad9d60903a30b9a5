#include "tl_norm.h"

#include <stdlib.h>
#include <string.h>

#include "tl_coords.h"
#include "tl_half.h"
#include "tl_mem.h"
#include "tl_simd.h"
#if TL_SIMD_X86
#include "tl_norm_half_v4.h"
#endif

/* Rows summed in float before each addition to the double sums: 16 roundings
 * of float stay far below the data's own (see tl_norm_impl.h). */
#define TL_NORM_SUM_ROWS 16

#define TL_NORM_ISA base
#define TL_NORM_ATTR
#include "tl_norm_impl.h"
#undef TL_NORM_ISA
#undef TL_NORM_ATTR
#if TL_SIMD_X86
#define TL_NORM_ISA v3
#define TL_NORM_ATTR TL_TARGET_V3
#include "tl_norm_impl.h"
#undef TL_NORM_ISA
#undef TL_NORM_ATTR
#define TL_NORM_ISA v4
#define TL_NORM_ATTR TL_TARGET_V4
#include "tl_norm_impl.h"
#undef TL_NORM_ISA
#undef TL_NORM_ATTR
#endif

/* Floats per widened block of half-type rows in the summing passes (stats,
 * reduce): 16 KiB.  The block's rows fix their float partial sums. */
#define TL_NORM_BLOCK 4096
/* Floats per widened block of half-type rows in the passes with no sums
 * (apply, bapply; any block gives the same bits) below AVX-512, which
 * converts them in registers instead (tl_norm_half_v4.h): 4 KiB.  Each block's rows
 * are read, computed and written one after another, so the smaller the
 * block, the sooner its writes overlap the next block's reads (bfloat16
 * normalize + ReLU at C = 32-128: 1.2-1.6x against 16 KiB blocks, 1.15-1.23x
 * against 1 KiB ones, 0.98-1.08x against 2 and 8 KiB). */
#define TL_NORM_ROW_BLOCK 1024
/* Rows of a chunk: at least TL_NORM_CHUNK_MIN, at most TL_NORM_CHUNKS chunks.
 * Chunks depend only on n, which fixes the order of every sum. */
#define TL_NORM_CHUNK_MIN 64
#define TL_NORM_CHUNKS 256

typedef struct tl_norm_loops {
    void (*stats)(const float *, int64_t, int64_t, const float *, double *, double *, float *,
                  float *);
    void (*apply)(const float *, int64_t, int64_t, const float *, const float *, int, float *);
    void (*reduce)(const float *, const float *, int64_t, int64_t, const float *, const float *,
                   int, const float *, double *, double *, float *, float *, float *);
    void (*bapply)(const float *, const float *, int64_t, int64_t, const float *, const float *,
                   int, const float *, const float *, const float *, float *);
} tl_norm_loops;

#define TL_NORM_LOOPS(isa)                                                                  \
    {tl_norm_stats_##isa, tl_norm_apply_##isa, tl_norm_reduce_##isa, tl_norm_bapply_##isa}

static const tl_norm_loops tl_norm_base = TL_NORM_LOOPS(base);
#if TL_SIMD_X86
static const tl_norm_loops tl_norm_v3 = TL_NORM_LOOPS(v3);
static const tl_norm_loops tl_norm_v4 = TL_NORM_LOOPS(v4);
#endif

/* Where one call runs: its loops, the level its half conversions use, and the
 * chunking of its rows. */
typedef struct tl_norm_run {
    const tl_norm_loops *loops;
    tl_simd level;
    int threads;
    int64_t chunk_rows, chunks, block_rows;
} tl_norm_run;

static tl_status tl_norm_begin(const tl_ctx *ctx, const tl_norm_desc *d, tl_norm_run *run) {
    if (!ctx || !d || ctx->threads < 1) return TL_ERR_INVALID;
    if (d->n < 0 || d->c < 0 || (d->relu != 0 && d->relu != 1)) return TL_ERR_INVALID;
    if (!tl_mul_fits(d->n, d->c)) return TL_ERR_OVERFLOW;
    if (d->dtype != TL_F32 && d->dtype != TL_BF16 && d->dtype != TL_F16)
        return TL_ERR_UNSUPPORTED;
    run->level = tl_simd_vector_capped(ctx->simd_cap);
    run->loops = &tl_norm_base;
#if TL_SIMD_X86
    if (run->level >= TL_SIMD_V4)
        run->loops = &tl_norm_v4;
    else if (run->level >= TL_SIMD_V3)
        run->loops = &tl_norm_v3;
#endif
    run->threads = tl_threads_for(ctx, d->n * d->c);
    const int64_t even = (d->n + TL_NORM_CHUNKS - 1) / TL_NORM_CHUNKS;
    run->chunk_rows = even > TL_NORM_CHUNK_MIN ? even : TL_NORM_CHUNK_MIN;
    run->chunks = (d->n + run->chunk_rows - 1) / run->chunk_rows;
    run->block_rows = d->c >= TL_NORM_BLOCK ? 1 : TL_NORM_BLOCK / (d->c ? d->c : 1);
    return TL_OK;
}

/* Asks for the half-type rows of p (c values each) in the block after
 * [r, r + rows), at most rows of them and none from end on, to read or (write)
 * to write, so they stream in while this block is converted, computed and
 * written (read block by block, the rows arrived only at each block's start). */
static inline void tl_norm_ask_next(const void *p, int64_t c, int64_t r, int64_t rows,
                                    int64_t end, int write) {
    const int64_t next = end - r - rows < rows ? end - r - rows : rows;
    const char *at = (const char *)((const uint16_t *)p + (r + rows) * c);
    for (int64_t b = 0; b < next * c * (int64_t)sizeof(uint16_t); b += 64) {
        if (write)
            __builtin_prefetch(at + b, 1, 2);
        else
            __builtin_prefetch(at + b, 0, 2);
    }
}

/* Rows [r, r + rows) of p as floats: in place for float32, else widened into
 * buf, the next block's rows asked for first. */
static const float *tl_norm_rows(const tl_norm_run *run, tl_dtype t, const void *p, int64_t c,
                                 int64_t r, int64_t rows, int64_t end, float *buf) {
    if (t == TL_F32) return (const float *)p + r * c;
    tl_norm_ask_next(p, c, r, rows, end, 0);
    tl_half_row_to_f32(run->level, t, (const uint16_t *)p + r * c, rows * c, buf);
    return buf;
}

/* The passes over the rows; every entry point is one of them. */
typedef enum tl_norm_kind {
    TL_NORM_PASS_STATS,
    TL_NORM_PASS_APPLY,
    TL_NORM_PASS_REDUCE,
    TL_NORM_PASS_BAPPLY
} tl_norm_kind;

/* One pass's operands, NULL where the pass has none: features x, gradient dy
 * (reduce, bapply), the loops' per-channel vectors, the output (y or dx), and
 * the sums (stats, reduce: two rows of c doubles per chunk). */
typedef struct tl_norm_pass {
    tl_norm_kind kind;
    const void *x, *dy;
    const float *scale, *shift, *ref, *a, *b, *k;
    void *out;
    double *partial;
} tl_norm_pass;

#if TL_SIMD_X86
/* Pass p (apply or bapply) over half-type rows converted in registers
 * (tl_norm_half_v4.h), chunk by chunk. */
static void tl_norm_run_half_v4(const tl_norm_run *run, const tl_norm_desc *d,
                                const tl_norm_pass *p) {
    const int64_t n = d->n, c = d->c;
#pragma omp parallel for num_threads(run->threads) schedule(static)
    for (int64_t q = 0; q < run->chunks; q++) {
        const int64_t r = q * run->chunk_rows;
        const int64_t rows = (q + 1) * run->chunk_rows < n ? run->chunk_rows : n - r;
        const uint16_t *x = (const uint16_t *)p->x + r * c;
        uint16_t *out = (uint16_t *)p->out + r * c;
        if (p->kind == TL_NORM_PASS_APPLY)
            tl_norm_apply_half_v4(d->dtype, x, rows, c, p->scale, p->shift, d->relu, out);
        else
            tl_norm_bapply_half_v4(d->dtype, (const uint16_t *)p->dy + r * c, x, rows, c,
                                   p->scale, p->shift, d->relu, p->a, p->b, p->k, out);
    }
}
#endif

/* Runs pass p over the chunks of rows, block by block (TL_NORM_BLOCK values;
 * TL_NORM_ROW_BLOCK in a half type's apply and bapply): half types are
 * widened (with AVX-512, apply and bapply convert in registers instead:
 * tl_norm_run_half_v4) into per-thread blocks (x, dy, the output), sums go
 * through 3 rows of c floats of scratch into the chunk's partial sums. */
static tl_status tl_norm_run_pass(const tl_norm_run *run, const tl_norm_desc *d,
                                  const tl_norm_pass *p) {
    const int64_t n = d->n, c = d->c;
    const int widen = d->dtype != TL_F32; /* float32 rows are read in place */
    const int sums = p->partial != NULL; /* stats, reduce: blocks fix their sums */
#if TL_SIMD_X86
    if (widen && !sums && run->level >= TL_SIMD_V4) {
        tl_norm_run_half_v4(run, d, p);
        return TL_OK;
    }
#endif
    const int64_t step = !widen || sums ? run->block_rows
                         : c >= TL_NORM_ROW_BLOCK ? 1
                                                  : TL_NORM_ROW_BLOCK / c;
    const int64_t blk = widen ? step * c : 0;
    const int64_t blocks = 1 + (p->dy != NULL) + (p->out != NULL);
    const int64_t floats = blocks * blk + (p->partial ? 3 * c : 0);
    int nomem = 0;
#pragma omp parallel num_threads(run->threads) reduction(| : nomem)
    {
        float *buf = tl_mem_aligned((size_t)floats * sizeof(float));
        nomem = !buf;
#pragma omp for schedule(static)
        for (int64_t q = 0; q < run->chunks; q++) {
            if (nomem) continue;
            /* x's block, dy's, the output's (the last), then the float sums */
            float *gbuf = buf + blk, *obuf = buf + (blocks - 1) * blk;
            float *fs = buf + blocks * blk, *fq = fs + c, *cut = fq + c;
            double *s = p->partial ? p->partial + q * 2 * c : NULL, *sq = s ? s + c : NULL;
            const int64_t end = (q + 1) * run->chunk_rows < n ? (q + 1) * run->chunk_rows : n;
            for (int64_t r = q * run->chunk_rows; r < end; r += step) {
                const int64_t rows = end - r < step ? end - r : step;
                const float *x = tl_norm_rows(run, d->dtype, p->x, c, r, rows, end, buf);
                const float *g =
                    p->dy ? tl_norm_rows(run, d->dtype, p->dy, c, r, rows, end, gbuf) : NULL;
                float *out = !p->out ? NULL : blk ? obuf : (float *)p->out + r * c;
                switch (p->kind) {
                case TL_NORM_PASS_STATS:
                    run->loops->stats(x, rows, c, p->ref, s, sq, fs, fq);
                    break;
                case TL_NORM_PASS_APPLY:
                    run->loops->apply(x, rows, c, p->scale, p->shift, d->relu, out);
                    break;
                case TL_NORM_PASS_REDUCE:
                    run->loops->reduce(g, x, rows, c, p->scale, p->shift, d->relu, p->ref, s, sq,
                                       fs, fq, cut);
                    break;
                case TL_NORM_PASS_BAPPLY:
                    run->loops->bapply(g, x, rows, c, p->scale, p->shift, d->relu, p->a, p->b,
                                       p->k, out);
                    break;
                }
                if (out && blk) {
                    tl_norm_ask_next(p->out, c, r, rows, end, 1);
                    tl_f32_row_to_half(run->level, d->dtype, out, rows * c,
                                       (uint16_t *)p->out + r * c);
                }
            }
        }
        free(buf);
    }
    return nomem ? TL_ERR_NOMEM : TL_OK;
}

/* a[j], b[j] = the sums over chunks, in chunk order, of partial's two rows of c
 * per chunk. */
static void tl_norm_add_chunks(const tl_norm_run *run, const double *partial, int64_t c,
                               double *a, double *b) {
    for (int64_t j = 0; j < c; j++) {
        double sa = 0.0, sb = 0.0;
        for (int64_t k = 0; k < run->chunks; k++) {
            sa += partial[k * 2 * c + j];
            sb += partial[k * 2 * c + c + j];
        }
        a[j] = sa;
        b[j] = sb;
    }
}

tl_status tl_norm_stats(const tl_ctx *ctx, const tl_norm_desc *d, const void *x, double *mean,
                        double *var) {
    tl_norm_run run;
    tl_status st = tl_norm_begin(ctx, d, &run);
    if (st != TL_OK) return st;
    const int64_t n = d->n, c = d->c;
    if (n < 1 || !x || (c && (!mean || !var))) return TL_ERR_INVALID;
    if (!c) return TL_OK;
    /* Sums are shifted by the first row (ref). */
    float *ref = malloc((size_t)c * sizeof(float));
    double *partial = calloc((size_t)(run.chunks * 2 * c), sizeof(double));
    if (ref && partial) {
        const float *row0 = tl_norm_rows(&run, d->dtype, x, c, 0, 1, 1, ref);
        if (row0 != ref) memcpy(ref, row0, (size_t)c * sizeof(float));
        const tl_norm_pass p = {.kind = TL_NORM_PASS_STATS, .x = x, .ref = ref, .partial = partial};
        st = tl_norm_run_pass(&run, d, &p);
    } else {
        st = TL_ERR_NOMEM;
    }
    if (st == TL_OK) {
        tl_norm_add_chunks(&run, partial, c, mean, var); /* the shifted sums, then: */
        for (int64_t j = 0; j < c; j++) {
            const double m = mean[j] / (double)n, v = var[j] / (double)n - m * m;
            mean[j] = (double)ref[j] + m;
            var[j] = v > 0.0 ? v : 0.0;
        }
    }
    free(ref);
    free(partial);
    return st;
}

tl_status tl_norm_apply(const tl_ctx *ctx, const tl_norm_desc *d, const void *x,
                        const float *scale, const float *shift, void *y) {
    tl_norm_run run;
    tl_status st = tl_norm_begin(ctx, d, &run);
    if (st != TL_OK) return st;
    if (d->n * d->c == 0) return TL_OK;
    if (!x || !scale || !shift || !y) return TL_ERR_INVALID;
    const tl_norm_pass p = {.kind = TL_NORM_PASS_APPLY, .x = x, .scale = scale, .shift = shift,
                            .out = y};
    return tl_norm_run_pass(&run, d, &p);
}

tl_status tl_norm_backward_reduce(const tl_ctx *ctx, const tl_norm_desc *d, const void *dy,
                                  const void *x, const float *scale, const float *shift,
                                  const double *mean, double *sum_g, double *sum_gx) {
    tl_norm_run run;
    tl_status st = tl_norm_begin(ctx, d, &run);
    if (st != TL_OK) return st;
    const int64_t n = d->n, c = d->c;
    if (!c) return TL_OK;
    if (!scale || !shift || !mean || !sum_g || !sum_gx || (n && (!dy || !x)))
        return TL_ERR_INVALID;
    /* The loops sum g * (x - ref) with ref the mean in float; the end adds back
     * (ref - mean) * sum g, exactly the difference. */
    float *ref = malloc((size_t)c * sizeof(float));
    double *partial = calloc((size_t)((run.chunks ? run.chunks : 1) * 2 * c), sizeof(double));
    if (ref && partial) {
        for (int64_t j = 0; j < c; j++) ref[j] = (float)mean[j];
        const tl_norm_pass p = {.kind = TL_NORM_PASS_REDUCE, .x = x, .dy = dy, .scale = scale,
                                .shift = shift, .ref = ref, .partial = partial};
        st = tl_norm_run_pass(&run, d, &p);
    } else {
        st = TL_ERR_NOMEM;
    }
    if (st == TL_OK) {
        tl_norm_add_chunks(&run, partial, c, sum_g, sum_gx);
        for (int64_t j = 0; j < c; j++) sum_gx[j] += ((double)ref[j] - mean[j]) * sum_g[j];
    }
    free(ref);
    free(partial);
    return st;
}

tl_status tl_norm_backward_apply(const tl_ctx *ctx, const tl_norm_desc *d, const void *dy,
                                 const void *x, const float *scale, const float *shift,
                                 const float *a, const float *b, const float *k, void *dx) {
    tl_norm_run run;
    tl_status st = tl_norm_begin(ctx, d, &run);
    if (st != TL_OK) return st;
    if (d->n * d->c == 0) return TL_OK;
    if (!dy || !x || !scale || !shift || !a || !b != !k || !dx) return TL_ERR_INVALID;
    const tl_norm_pass p = {.kind = TL_NORM_PASS_BAPPLY, .x = x, .dy = dy, .scale = scale,
                            .shift = shift, .a = a, .b = b, .k = k, .out = dx};
    return tl_norm_run_pass(&run, d, &p);
}
