/* The row loops of batch normalization (tl_norm.h) for one instruction set.
 * tl_norm.c includes this once per set with TL_NORM_ISA (name suffix) and
 * TL_NORM_ATTR (the functions' target attribute) defined; the compiler
 * vectorizes each loop over the channels at that set's width.  Every loop
 * reads float rows: tl_norm.c widens half types into a block first. */
#if !defined(TL_NORM_ISA) || !defined(TL_NORM_ATTR)
#error "define TL_NORM_ISA and TL_NORM_ATTR first"
#endif

#define TL_NI_CAT2(a, b) a##_##b
#define TL_NI_CAT(a, b) TL_NI_CAT2(a, b)
#define TL_NI(name) TL_NI_CAT(tl_norm_##name, TL_NORM_ISA)

/* The pre-activation, written once so that the backward's ReLU mask is the
 * forward's own comparison (same expression, same contraction). */
static TL_NORM_ATTR inline float TL_NI(pre)(float x, float scale, float shift) {
    return x * scale + shift;
}

/* s[j] += x - ref[j] and q[j] += (x - ref[j])^2 over `rows` rows (ld values
 * apart) of c channels, ref being one row of the data, so the shifted values
 * are small and exact to float rounding even when the mean is large.  Each
 * TL_NORM_SUM_ROWS rows are summed in float (fs, fq: c floats), then added to
 * the double sums: float vectors hold twice the lanes, which half types, read
 * at twice the rows per byte, need to keep up with memory. */
static inline __attribute__((always_inline)) TL_NORM_ATTR void TL_NI(stats_rows)(
    const float *x, int64_t rows, int64_t c, int64_t ld, const float *ref, double *s, double *q,
    float *fs, float *fq) {
    for (int64_t r0 = 0; r0 < rows; r0 += TL_NORM_SUM_ROWS) {
        const int64_t r1 = r0 + TL_NORM_SUM_ROWS < rows ? r0 + TL_NORM_SUM_ROWS : rows;
        for (int64_t j = 0; j < c; j++) fs[j] = fq[j] = 0.0f;
        for (int64_t r = r0; r < r1; r++) {
            const float *xr = x + r * ld;
            for (int64_t j = 0; j < c; j++) {
                const float v = xr[j] - ref[j];
                fs[j] += v;
                fq[j] += v * v;
            }
        }
        for (int64_t j = 0; j < c; j++) {
            s[j] += fs[j];
            q[j] += fq[j];
        }
    }
}

/* The summing passes where C is a multiple of 32: blocks of at most 128
 * channels (the last 32, 64 or 96), each over the rows in turn, at a width
 * fixed when compiled, their float sums in local arrays, which stay in
 * registers instead of a row of scratch loaded and stored at every row.  Each
 * channel's sums take the same operations in the same order, so the same bits
 * (each pass against a row of scratch: at C = 32 and 64 1.05-1.42x in float32
 * and 1.36-1.89x in the half types, whose rows arrive twice as fast; at
 * C = 96-256 0.97-1.28x and 1.12-1.39x; at C = 16 GCC unrolled it into slower
 * code).  A block of rows is at most TL_NORM_BLOCK values, in L1 for the next
 * channel block.  CALL(C, J, LD, A, B, FIXED): the pass over channels
 * [J, J + C) of rows LD values apart with sums A and B, FIXED where C is a
 * compile-time width (and LD too where one block is the whole row, WHOLE a
 * literal 1: a run-time row stride cost the backward's reduction 0.85-0.99x
 * at C = 32 in the half types).  TL_NORM_FIXED, used only inside
 * TL_NORM_WIDTHS, picks the compiled width W and passes that macro's sums a_
 * and b_. */
#define TL_NORM_FIXED(CALL, W, J, c, WHOLE)                                                 \
    do {                                                                                    \
        if ((W) == 8)                                                                       \
            CALL(8, J, (WHOLE) ? 8 : (c), a_, b_, 1);                                       \
        else if ((W) == 48)                                                                 \
            CALL(48, J, (WHOLE) ? 48 : (c), a_, b_, 1);                                     \
        else if ((W) == 24)                                                                 \
            CALL(24, J, (WHOLE) ? 24 : (c), a_, b_, 1);                                     \
        else if ((W) == 32)                                                                 \
            CALL(32, J, (WHOLE) ? 32 : (c), a_, b_, 1);                                     \
        else if ((W) == 64)                                                                 \
            CALL(64, J, (WHOLE) ? 64 : (c), a_, b_, 1);                                     \
        else if ((W) == 96)                                                                 \
            CALL(96, J, (WHOLE) ? 96 : (c), a_, b_, 1);                                     \
        else                                                                                \
            CALL(128, J, (WHOLE) ? 128 : (c), a_, b_, 1);                                   \
    } while (0)
/* Widths that are a multiple of 8 but not of 32 (C = 24, 40, 48, 72, 80:
 * those of networks of width 0.75 or 1.25) run as blocks of fixed widths
 * too: their multiple of 32 and then the last 8 or 24 channels, or the last
 * 48 where 16 are left (a block of 16 summed slower than a pass at run-time
 * width, 0.67-0.82x at C = 48 and 80), where they summed every channel
 * against a row of scratch: float32 stats 1.0-3.0x and backward reduce
 * 1.3-2.5x at C = 24-80, bf16 1.2-3.3x.  C = 16 alone stays a pass at
 * run-time width (see above), and so do widths that are not a multiple of 8. */
#define TL_NORM_WIDTHS(c, CALL, A, B)                                                       \
    do {                                                                                    \
        float a_[128], b_[128];                                                             \
        if ((c) % 8 || (c) == 0 || (c) == 16)                                               \
            CALL((c), 0, (c), (A), (B), 0);                                                 \
        else if ((c) <= 128 && (c) % 32 == 0)                                               \
            TL_NORM_FIXED(CALL, (c), 0, (c), 1);                                            \
        else                                                                                \
            for (int64_t j_ = 0; j_ < (c); j_ += 128) {                                     \
                const int64_t w_ = (c) - j_ < 128 ? (c) - j_ : 128;                          \
                const int64_t t_ = w_ % 32 == 16 ? 48 : w_ % 32; /* the last block */      \
                if (w_ > t_) TL_NORM_FIXED(CALL, w_ - t_, j_, (c), 0);                      \
                if (t_) TL_NORM_FIXED(CALL, t_, j_ + w_ - t_, (c), (c) == t_);              \
            }                                                                               \
    } while (0)

static TL_NORM_ATTR void TL_NI(stats)(const float *x, int64_t rows, int64_t c, const float *ref,
                                      double *s, double *q, float *fs, float *fq) {
#define TL_STATS(C, J, LD, A, B, FIXED)                                                     \
    TL_NI(stats_rows)(x + (J), rows, C, LD, ref + (J), s + (J), q + (J), A, B)
    TL_NORM_WIDTHS(c, TL_STATS, fs, fq);
#undef TL_STATS
}

static TL_NORM_ATTR void TL_NI(apply)(const float *x, int64_t rows, int64_t c,
                                      const float *scale, const float *shift, int relu,
                                      float *y) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * c;
        float *yr = y + r * c;
        if (relu) {
            for (int64_t j = 0; j < c; j++) {
                const float v = TL_NI(pre)(xr[j], scale[j], shift[j]);
                yr[j] = v < 0.0f ? 0.0f : v; /* NaN stays NaN, as in torch.relu */
            }
        } else {
            for (int64_t j = 0; j < c; j++) yr[j] = TL_NI(pre)(xr[j], scale[j], shift[j]);
        }
    }
}

/* The gradient through the fused ReLU: dy where the pre-activation was
 * positive (torch's threshold_backward of relu's output), else 0.  A select,
 * not a branch, so the loops below stay vectorized; each loop is written
 * once per ReLU setting for the same reason. */
static TL_NORM_ATTR inline float TL_NI(cut)(float g, float x, float scale, float shift) {
    /* g AND an all-ones or all-zeros mask: GCC does not if-convert the reduction's
     * select, but vectorizes this */
    union {
        float f;
        uint32_t u;
    } v = {g};
    v.u &= -(uint32_t)(TL_NI(pre)(x, scale, shift) > 0.0f);
    return v.f;
}

/* sg[j] += g and sgx[j] += g * (x - ref[j]) (ref: the mean rounded to float,
 * which tl_norm.c corrects for), summed in float over TL_NORM_SUM_ROWS rows as
 * in stats (fg, fgx: c floats); through the ReLU, g is cut first: into c floats
 * of scratch, or, where `fused` (a width fixed when compiled, which GCC
 * vectorizes either way), in the same loop (through scratch: 0.77-0.80x at
 * C = 32 and 64 in the half types). */
static inline __attribute__((always_inline)) TL_NORM_ATTR void TL_NI(reduce_rows)(
    int fused, const float *g, const float *x, int64_t rows, int64_t c, int64_t ld,
    const float *scale, const float *shift, int relu, const float *ref, double *sg, double *sgx,
    float *fg, float *fgx, float *cut) {
    for (int64_t r0 = 0; r0 < rows; r0 += TL_NORM_SUM_ROWS) {
        const int64_t r1 = r0 + TL_NORM_SUM_ROWS < rows ? r0 + TL_NORM_SUM_ROWS : rows;
        for (int64_t j = 0; j < c; j++) fg[j] = fgx[j] = 0.0f;
        for (int64_t r = r0; r < r1; r++) {
            const float *gr = g + r * ld, *xr = x + r * ld;
            if (relu && fused) {
                for (int64_t j = 0; j < c; j++) {
                    const float v = TL_NI(cut)(gr[j], xr[j], scale[j], shift[j]);
                    fg[j] += v;
                    fgx[j] += v * (xr[j] - ref[j]);
                }
            } else if (relu) {
                /* the cut row first: GCC vectorizes the two loops, not one */
                for (int64_t j = 0; j < c; j++)
                    cut[j] = TL_NI(cut)(gr[j], xr[j], scale[j], shift[j]);
                for (int64_t j = 0; j < c; j++) {
                    fg[j] += cut[j];
                    fgx[j] += cut[j] * (xr[j] - ref[j]);
                }
            } else {
                for (int64_t j = 0; j < c; j++) {
                    fg[j] += gr[j];
                    fgx[j] += gr[j] * (xr[j] - ref[j]);
                }
            }
        }
        for (int64_t j = 0; j < c; j++) {
            sg[j] += fg[j];
            sgx[j] += fgx[j];
        }
    }
}

static TL_NORM_ATTR void TL_NI(reduce)(const float *g, const float *x, int64_t rows, int64_t c,
                                       const float *scale, const float *shift, int relu,
                                       const float *ref, double *sg, double *sgx, float *fg,
                                       float *fgx, float *cut) {
#define TL_REDUCE(C, J, LD, A, B, FIXED)                                                    \
    TL_NI(reduce_rows)(FIXED, g + (J), x + (J), rows, C, LD, scale + (J), shift + (J), relu,   \
                       ref + (J), sg + (J), sgx + (J), A, B, cut)
    TL_NORM_WIDTHS(c, TL_REDUCE, fg, fgx);
#undef TL_REDUCE
}

/* dx = g * a + x * b + k; b and k NULL (eval) leave out the x term, so a NaN
 * input the ReLU cut gives 0. */
static TL_NORM_ATTR void TL_NI(bapply)(const float *g, const float *x, int64_t rows, int64_t c,
                                       const float *scale, const float *shift, int relu,
                                       const float *a, const float *b, const float *k,
                                       float *dx) {
    for (int64_t r = 0; r < rows; r++) {
        const float *gr = g + r * c, *xr = x + r * c;
        float *dr = dx + r * c;
        if (relu && b) {
            for (int64_t j = 0; j < c; j++)
                dr[j] = TL_NI(cut)(gr[j], xr[j], scale[j], shift[j]) * a[j] + xr[j] * b[j] + k[j];
        } else if (relu) {
            for (int64_t j = 0; j < c; j++)
                dr[j] = TL_NI(cut)(gr[j], xr[j], scale[j], shift[j]) * a[j];
        } else if (b) {
            for (int64_t j = 0; j < c; j++) dr[j] = gr[j] * a[j] + xr[j] * b[j] + k[j];
        } else {
            for (int64_t j = 0; j < c; j++) dr[j] = gr[j] * a[j];
        }
    }
}

#undef TL_NORM_WIDTHS
#undef TL_NORM_FIXED
#undef TL_NI
#undef TL_NI_CAT
#undef TL_NI_CAT2
