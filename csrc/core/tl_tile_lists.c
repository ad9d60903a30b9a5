#include "tl_tile_lists.h"

#include <stdlib.h>
#include <string.h>

#include "tl_list.h"
#include "tl_simd.h"

tl_status tl_tile_lists_count(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out, int64_t k,
                              int64_t tile_rows, int64_t *start, int64_t *top) {
    if (tile_rows < 1 || n_out < 0 || k < 0 || (!nbr && n_out * k > 0) || !start || !top)
        return TL_ERR_INVALID;
    const int64_t tiles = tl_tile_lists_tiles(n_out, tile_rows);
    int32_t lo = 0, hi = -1;
    int failed = 0;
    start[0] = 0;
    *top = 0;
    if (k == 0) return TL_OK; /* no entries: start is its one 0 */
#pragma omp parallel num_threads(tl_threads_for(ctx, n_out * k)) reduction(min : lo) \
    reduction(max : hi) reduction(| : failed)
    {
        /* Blocks of 16 rows, counted as 16 x k entries side by side: entry i
         * of every block adds into acc[i], one contiguous loop the compiler
         * vectorizes (a loop over a row's k entries did not: 3x slower), and
         * acc[i] belongs to kernel row i % k. */
        const size_t span = (size_t)(16 * (k > 0 ? k : 1));
        int32_t *acc = malloc(sizeof(int32_t) * span);
        failed |= !acc;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            if (!acc) continue;
            const int64_t o0 = t * tile_rows;
            const int64_t o1 = o0 + tile_rows < n_out ? o0 + tile_rows : n_out;
            const int64_t whole = o0 + (o1 - o0) / 16 * 16;
            int32_t tlo = 0, thi = -1;
            memset(acc, 0, sizeof(int32_t) * span);
            for (int64_t o = o0; o < whole; o += 16) {
                const int32_t *b = nbr + o * k;
                for (size_t i = 0; i < span; i++) {
                    acc[i] += b[i] >= 0;
                    tlo = b[i] < tlo ? b[i] : tlo;
                    thi = b[i] > thi ? b[i] : thi;
                }
            }
            int64_t *cnt = start + t * k + 1;
            for (int64_t n = 0; n < k; n++) cnt[n] = 0;
            for (size_t i = 0; i < span; i++) cnt[i % (size_t)k] += acc[i];
            for (const int32_t *r = nbr + whole * k; r < nbr + o1 * k; r += k)
                for (int64_t n = 0; n < k; n++) {
                    cnt[n] += r[n] >= 0;
                    tlo = r[n] < tlo ? r[n] : tlo;
                    thi = r[n] > thi ? r[n] : thi;
                }
            lo = tlo < lo ? tlo : lo;
            hi = thi > hi ? thi : hi;
        }
        free(acc);
    }
    if (failed) return TL_ERR_NOMEM;
    if (lo < -1) return TL_ERR_INVALID;
    for (int64_t j = 1; j <= tiles * k; j++) start[j] += start[j - 1];
    *top = (int64_t)hi + 1;
    return TL_OK;
}

tl_status tl_tile_lists_fill(const tl_ctx *ctx, const int32_t *nbr, int64_t n_out, int64_t k,
                             int64_t tile_rows, const int64_t *start, int64_t top, int32_t *in,
                             int32_t *rows) {
    if (tile_rows < 1 || n_out < 0 || k < 0 || (!nbr && n_out * k > 0) || !start)
        return TL_ERR_INVALID;
    const int64_t tiles = tl_tile_lists_tiles(n_out, tile_rows);
    if (start[0] != 0 || (start[tiles * k] > 0 && (!in || !rows))) return TL_ERR_INVALID;
    if (k == 0) return TL_OK;
    const int level = tl_simd_vector_capped(ctx->simd_cap);
    int failed = 0, invalid = 0;
#pragma omp parallel num_threads(tl_threads_for(ctx, n_out * k)) reduction(| : failed, invalid)
    {
        const size_t slots = (size_t)(tile_rows * (k > 0 ? k : 1));
        int32_t *li = malloc(sizeof(int32_t) * slots), *lr = malloc(sizeof(int32_t) * slots);
        int64_t *lc = malloc(sizeof(int64_t) * (size_t)(k > 0 ? k : 1));
        const int ok = li && lr && lc;
        failed |= !ok;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            if (!ok || invalid) continue;
            const int64_t o0 = t * tile_rows, m = n_out - o0 < tile_rows ? n_out - o0 : tile_rows;
            /* (entries below -1 wrap above any top) */
            invalid |= (int64_t)tl_list_tile(level, nbr, o0, m, k, li, lr, lc) > top;
            const int64_t *at = start + t * k;
            for (int64_t n = 0; n < k && !invalid; n++)
                invalid |= at[n + 1] - at[n] != lc[n] || at[n] < 0;
            if (invalid) continue;
            for (int64_t n = 0; n < k; n++) {
                memcpy(in + at[n], li + n * m, sizeof(int32_t) * (size_t)lc[n]);
                memcpy(rows + at[n], lr + n * m, sizeof(int32_t) * (size_t)lc[n]);
            }
        }
        free(li);
        free(lr);
        free(lc);
    }
    return failed ? TL_ERR_NOMEM : invalid ? TL_ERR_INVALID : TL_OK;
}
