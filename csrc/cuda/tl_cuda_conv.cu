/* Workspace sizes of the CUDA dataflows (layouts in tl_cuda_gemm.cuh) and the
 * data they derive from a map. */
#include "tl_cuda_gemm.cuh"

extern "C" tl_status tl_cuda_conv_workspace_size(tl_cuda_dataflow df, int weight_grad,
                                                 const tl_conv_desc *d, int64_t n_pairs,
                                                 int derived, size_t *bytes) {
    if (!d || !bytes || n_pairs < 0) return TL_ERR_INVALID;
    /* Gather-scatter runs through torch (tl_cuda_gather_rows and
     * tl_cuda_scatter_add_rows), with no tile-GEMM workspace. */
    if (df != TL_CUDA_IMPLICIT_GEMM && df != TL_CUDA_FETCH_ON_DEMAND) return TL_ERR_INVALID;
    TL_CUDA_RETURN_IF(tl_conv_desc_check(d));
    if (d->dtype != TL_F32 && d->dtype != TL_F16 && d->dtype != TL_BF16)
        return TL_ERR_UNSUPPORTED;
    tl_conv_layout l;
    tl_cuda_ws w = tl_conv_layout_of(NULL, df, weight_grad != 0, d, n_pairs, derived != 0, &l);
    if (w.overflow) return TL_ERR_OVERFLOW;
    *bytes = w.used;
    return TL_OK;
}

extern "C" tl_status tl_cuda_conv_derived_size(tl_cuda_dataflow df, int weight_grad,
                                               const tl_conv_desc *d, size_t *bytes) {
    if (!d || !bytes) return TL_ERR_INVALID;
    if (df != TL_CUDA_IMPLICIT_GEMM && df != TL_CUDA_FETCH_ON_DEMAND) return TL_ERR_INVALID;
    TL_CUDA_RETURN_IF(tl_conv_desc_check(d));
    *bytes = 0;
    if (tl_ig_sorted(df, weight_grad != 0, d))
        *bytes = sizeof(tl_kv) * (size_t)d->n_out;
    else if (df == TL_CUDA_FETCH_ON_DEMAND)
        *bytes = sizeof(long long) * (size_t)(d->k + 1);
    return TL_OK;
}

extern "C" tl_status tl_cuda_conv_derive(const tl_ctx *ctx, tl_cuda_dataflow df, int weight_grad,
                                         const tl_conv_desc *d, const int32_t *nbr,
                                         const tl_cuda_pairs *p, void *workspace,
                                         void *derived) {
    if (!ctx || !d) return TL_ERR_INVALID;
    TL_CUDA_RETURN_IF(tl_conv_desc_check(d));
    if (df == TL_CUDA_IMPLICIT_GEMM)
        return weight_grad ? TL_OK : tl_ig_derive(ctx, d, nbr, workspace, derived);
    if (df == TL_CUDA_FETCH_ON_DEMAND)
        return tl_fod_derive(ctx, weight_grad != 0, d, p, workspace, derived);
    return TL_ERR_INVALID;
}
