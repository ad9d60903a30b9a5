"""Normalization on sparse features."""

from __future__ import annotations

from torch import nn

from torch_lattice.tensor import SparseTensor

__all__ = ["BatchNorm"]


class BatchNorm(nn.BatchNorm1d):
    """``torch.nn.BatchNorm1d`` over the ``(N, C)`` rows of a SparseTensor.

    Same arguments and state-dict keys as ``BatchNorm1d`` (``weight``,
    ``bias``, ``running_mean``, ``running_var``, ``num_batches_tracked``), so
    legacy checkpoints load unchanged.  Statistics are over all rows of the
    batch; the support is kept.
    """

    def forward(self, input: SparseTensor) -> SparseTensor:  # type: ignore[override]
        """Batch normalization of ``input``'s ``(N, C)`` features.

        Support rule: the output keeps ``input``'s support (rows, order,
        stride, range).  In training mode the statistics are over all ``N``
        rows of the batch and update the running estimates.

        Returns:
            SparseTensor: ``(N, C)`` features on ``input``'s support.

        Raises:
            TypeError: ``input`` is not a SparseTensor, or its dtype does not
                mix with the layer's parameters.
            ValueError: the channel count is not ``num_features``.
        """
        if not isinstance(input, SparseTensor):
            raise TypeError(f"input must be a SparseTensor, got {type(input).__name__}")
        if input.feats.shape[1] != self.num_features:
            raise ValueError(
                f"input feats have {input.feats.shape[1]} channels but BatchNorm expects "
                f"num_features={self.num_features}"
            )
        try:
            out = super().forward(input.feats)
        except RuntimeError as exc:
            if "dtype" not in str(exc) and "scalar type" not in str(exc):
                raise
            raise TypeError(
                f"input feats dtype {input.feats.dtype} does not work with BatchNorm's "
                f"parameters ({self.weight.dtype if self.weight is not None else 'none'}): "
                f"{exc}; convert the layer or the features"
            ) from exc
        return input.replace(out)
