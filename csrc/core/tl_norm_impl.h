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

/* s[j] += x - ref[j] and q[j] += (x - ref[j])^2 over `rows` rows: sums shifted
 * by one row of the data keep the variance accurate when the mean is large. */
static TL_NORM_ATTR void TL_NI(stats)(const float *x, int64_t rows, int64_t c,
                                      const double *ref, double *s, double *q) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * c;
        for (int64_t j = 0; j < c; j++) {
            const double v = (double)xr[j] - ref[j];
            s[j] += v;
            q[j] += v * v;
        }
    }
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
    uint32_t u;
    memcpy(&u, &g, sizeof u);
    u &= -(uint32_t)(TL_NI(pre)(x, scale, shift) > 0.0f);
    memcpy(&g, &u, sizeof g);
    return g;
}

static TL_NORM_ATTR void TL_NI(reduce)(const float *g, const float *x, int64_t rows, int64_t c,
                                       const float *scale, const float *shift, int relu,
                                       const double *mean, double *sg, double *sgx) {
    for (int64_t r = 0; r < rows; r++) {
        const float *gr = g + r * c, *xr = x + r * c;
        if (relu) {
            for (int64_t j = 0; j < c; j++) {
                const double gv = (double)TL_NI(cut)(gr[j], xr[j], scale[j], shift[j]);
                sg[j] += gv;
                sgx[j] += gv * ((double)xr[j] - mean[j]);
            }
        } else {
            for (int64_t j = 0; j < c; j++) {
                const double gv = (double)gr[j];
                sg[j] += gv;
                sgx[j] += gv * ((double)xr[j] - mean[j]);
            }
        }
    }
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

#undef TL_NI
#undef TL_NI_CAT
#undef TL_NI_CAT2
