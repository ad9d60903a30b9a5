/* Workspace sizes of the CUDA dataflows (layouts in tl_cuda_gemm.cuh). */
#include "tl_cuda_gemm.cuh"

extern "C" tl_status tl_cuda_conv_workspace_size(tl_cuda_dataflow df, int weight_grad,
                                                 const tl_conv_desc *d, int64_t n_pairs,
                                                 size_t *bytes) {
    if (!d || !bytes || n_pairs < 0) return TL_ERR_INVALID;
    /* Gather-scatter runs through torch (tl_cuda_gather_rows and
     * tl_cuda_scatter_add_rows), with no tile-GEMM workspace. */
    if (df != TL_CUDA_IMPLICIT_GEMM && df != TL_CUDA_FETCH_ON_DEMAND) return TL_ERR_INVALID;
    TL_CUDA_RETURN_IF(tl_conv_desc_check(d));
    if (d->dtype != TL_F32 && d->dtype != TL_F16 && d->dtype != TL_BF16)
        return TL_ERR_UNSUPPORTED;
    tl_conv_layout l;
    tl_cuda_ws w = tl_conv_layout_of(NULL, df, weight_grad != 0, d, n_pairs, &l);
    if (w.overflow) return TL_ERR_OVERFLOW;
    *bytes = w.used;
    return TL_OK;
}
