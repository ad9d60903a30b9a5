#include "tl_norm.h"

#include <stdlib.h>
#include <string.h>

#include "tl_coords.h"
#include "tl_half.h"
#include "tl_mem.h"
#include "tl_simd.h"

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

/* Floats per widened block of half-type rows: 16 KiB, so the three blocks of
 * the backward (dy, x, dx) stay in L1 together. */
#define TL_NORM_BLOCK 4096
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

/* Rows [r, r + rows) of p as floats: in place for float32, else widened into buf. */
static const float *tl_norm_rows(const tl_norm_run *run, tl_dtype t, const void *p, int64_t c,
                                 int64_t r, int64_t rows, float *buf) {
    if (t == TL_F32) return (const float *)p + r * c;
    tl_half_row_to_f32(run->level, t, (const uint16_t *)p + r * c, rows * c, buf);
    return buf;
}

/* Where rows [r, r + rows) of an output are computed: the output itself for
 * float32, else buf, stored by tl_norm_store. */
static float *tl_norm_out(tl_dtype t, void *p, int64_t c, int64_t r, float *buf) {
    return t == TL_F32 ? (float *)p + r * c : buf;
}

static void tl_norm_store(const tl_norm_run *run, tl_dtype t, void *p, int64_t c, int64_t r,
                          int64_t rows, const float *buf) {
    if (t != TL_F32)
        tl_f32_row_to_half(run->level, t, buf, rows * c, (uint16_t *)p + r * c);
}

/* Per-thread scratch: `blocks` widened blocks (none for float32), then
 * `sums` rows of c floats for the float partial sums. */
static float *tl_norm_scratch(const tl_norm_run *run, const tl_norm_desc *d, int blocks,
                              int sums) {
    const int64_t c = d->c ? d->c : 1;
    const int64_t floats = (d->dtype == TL_F32 ? 0 : blocks * run->block_rows * c) + sums * c;
    return floats ? tl_mem_aligned((size_t)floats * sizeof(float)) : NULL;
}

/* Where the sums' scratch starts in a tl_norm_scratch of `blocks` blocks. */
static float *tl_norm_sums(const tl_norm_run *run, const tl_norm_desc *d, float *scratch,
                           int blocks) {
    return scratch + (d->dtype == TL_F32 ? 0 : blocks * run->block_rows * d->c);
}

/* The row after chunk k, and the rows of the block at row r of a chunk ending at end. */
static int64_t tl_norm_chunk_end(const tl_norm_run *run, int64_t k, int64_t n) {
    return (k + 1) * run->chunk_rows < n ? (k + 1) * run->chunk_rows : n;
}

static int64_t tl_norm_block(const tl_norm_run *run, int64_t r, int64_t end) {
    return end - r < run->block_rows ? end - r : run->block_rows;
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
    /* Sums are shifted by the first row (ref); partial[chunk] holds (s, q). */
    float *ref = malloc((size_t)c * sizeof(float));
    double *partial = calloc((size_t)(run.chunks * 2 * c), sizeof(double));
    if (!ref || !partial) {
        free(ref);
        free(partial);
        return TL_ERR_NOMEM;
    }
    const float *row0 = tl_norm_rows(&run, d->dtype, x, c, 0, 1, ref);
    if (row0 != ref) memcpy(ref, row0, (size_t)c * sizeof(float));
    int nomem = 0;
#pragma omp parallel num_threads(run.threads) reduction(| : nomem)
    {
        float *buf = tl_norm_scratch(&run, d, 1, 2);
        nomem = !buf;
        float *fs = buf ? tl_norm_sums(&run, d, buf, 1) : NULL, *fq = fs ? fs + c : NULL;
#pragma omp for schedule(static)
        for (int64_t k = 0; k < run.chunks; k++) {
            if (nomem) continue;
            double *s = partial + k * 2 * c, *q = s + c;
            const int64_t end = tl_norm_chunk_end(&run, k, n);
            for (int64_t r = k * run.chunk_rows; r < end; r += run.block_rows) {
                const int64_t rows = tl_norm_block(&run, r, end);
                run.loops->stats(tl_norm_rows(&run, d->dtype, x, c, r, rows, buf), rows, c, ref,
                                 s, q, fs, fq);
            }
        }
        free(buf);
    }
    if (!nomem) {
        tl_norm_add_chunks(&run, partial, c, mean, var); /* the shifted sums, then: */
        for (int64_t j = 0; j < c; j++) {
            const double m = mean[j] / (double)n, v = var[j] / (double)n - m * m;
            mean[j] = (double)ref[j] + m;
            var[j] = v > 0.0 ? v : 0.0;
        }
    }
    free(ref);
    free(partial);
    return nomem ? TL_ERR_NOMEM : TL_OK;
}

tl_status tl_norm_apply(const tl_ctx *ctx, const tl_norm_desc *d, const void *x,
                        const float *scale, const float *shift, void *y) {
    tl_norm_run run;
    tl_status st = tl_norm_begin(ctx, d, &run);
    if (st != TL_OK) return st;
    const int64_t n = d->n, c = d->c;
    if (n * c == 0) return TL_OK;
    if (!x || !scale || !shift || !y) return TL_ERR_INVALID;
    int nomem = 0;
#pragma omp parallel num_threads(run.threads) reduction(| : nomem)
    {
        float *buf = tl_norm_scratch(&run, d, 2, 0);
        nomem = d->dtype != TL_F32 && !buf;
        float *out_buf = buf ? buf + run.block_rows * c : NULL;
#pragma omp for schedule(static)
        for (int64_t k = 0; k < run.chunks; k++) {
            if (nomem) continue;
            const int64_t end = tl_norm_chunk_end(&run, k, n);
            for (int64_t r = k * run.chunk_rows; r < end; r += run.block_rows) {
                const int64_t rows = tl_norm_block(&run, r, end);
                float *out = tl_norm_out(d->dtype, y, c, r, out_buf);
                run.loops->apply(tl_norm_rows(&run, d->dtype, x, c, r, rows, buf), rows, c, scale,
                                 shift, d->relu, out);
                tl_norm_store(&run, d->dtype, y, c, r, rows, out);
            }
        }
        free(buf);
    }
    return nomem ? TL_ERR_NOMEM : TL_OK;
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
    if (!ref || !partial) {
        free(ref);
        free(partial);
        return TL_ERR_NOMEM;
    }
    for (int64_t j = 0; j < c; j++) ref[j] = (float)mean[j];
    int nomem = 0;
#pragma omp parallel num_threads(run.threads) reduction(| : nomem)
    {
        float *buf = tl_norm_scratch(&run, d, 2, 3);
        nomem = !buf;
        float *xbuf = buf && d->dtype != TL_F32 ? buf + run.block_rows * c : NULL;
        float *fg = buf ? tl_norm_sums(&run, d, buf, 2) : NULL, *fgx = fg ? fg + c : NULL;
#pragma omp for schedule(static)
        for (int64_t k = 0; k < run.chunks; k++) {
            if (nomem) continue;
            double *sg = partial + k * 2 * c, *sgx = sg + c;
            const int64_t end = tl_norm_chunk_end(&run, k, n);
            for (int64_t r = k * run.chunk_rows; r < end; r += run.block_rows) {
                const int64_t rows = tl_norm_block(&run, r, end);
                run.loops->reduce(tl_norm_rows(&run, d->dtype, dy, c, r, rows, buf),
                                  tl_norm_rows(&run, d->dtype, x, c, r, rows, xbuf), rows, c,
                                  scale, shift, d->relu, ref, sg, sgx, fg, fgx, fgx + c);
            }
        }
        free(buf);
    }
    if (!nomem) {
        tl_norm_add_chunks(&run, partial, c, sum_g, sum_gx);
        for (int64_t j = 0; j < c; j++) sum_gx[j] += ((double)ref[j] - mean[j]) * sum_g[j];
    }
    free(ref);
    free(partial);
    return nomem ? TL_ERR_NOMEM : TL_OK;
}

tl_status tl_norm_backward_apply(const tl_ctx *ctx, const tl_norm_desc *d, const void *dy,
                                 const void *x, const float *scale, const float *shift,
                                 const float *a, const float *b, const float *k, void *dx) {
    tl_norm_run run;
    tl_status st = tl_norm_begin(ctx, d, &run);
    if (st != TL_OK) return st;
    const int64_t n = d->n, c = d->c;
    if (n * c == 0) return TL_OK;
    if (!dy || !x || !scale || !shift || !a || !b != !k || !dx) return TL_ERR_INVALID;
    int nomem = 0;
#pragma omp parallel num_threads(run.threads) reduction(| : nomem)
    {
        float *buf = tl_norm_scratch(&run, d, 3, 0);
        nomem = d->dtype != TL_F32 && !buf;
        float *xbuf = buf ? buf + run.block_rows * c : NULL;
        float *out_buf = buf ? buf + 2 * run.block_rows * c : NULL;
#pragma omp for schedule(static)
        for (int64_t q = 0; q < run.chunks; q++) {
            if (nomem) continue;
            const int64_t end = tl_norm_chunk_end(&run, q, n);
            for (int64_t r = q * run.chunk_rows; r < end; r += run.block_rows) {
                const int64_t rows = tl_norm_block(&run, r, end);
                float *out = tl_norm_out(d->dtype, dx, c, r, out_buf);
                run.loops->bapply(tl_norm_rows(&run, d->dtype, dy, c, r, rows, buf),
                                  tl_norm_rows(&run, d->dtype, x, c, r, rows, xbuf), rows, c,
                                  scale, shift, d->relu, a, b, k, out);
                tl_norm_store(&run, d->dtype, dx, c, r, rows, out);
            }
        }
        free(buf);
    }
    return nomem ? TL_ERR_NOMEM : TL_OK;
}
