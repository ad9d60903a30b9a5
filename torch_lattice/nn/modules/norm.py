"""Normalization on sparse features."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torch_lattice.geometry import positive_int
from torch_lattice.nn.functional.norm import batch_norm
from torch_lattice.nn.modules.eager import eager_forward
from torch_lattice.tensor import SparseTensor

__all__ = ["BatchNorm", "BatchNormReLU"]


class BatchNorm(nn.BatchNorm1d):
    """``torch.nn.BatchNorm1d`` over the ``(N, C)`` rows of a SparseTensor.

    Same arguments and state-dict keys as ``BatchNorm1d`` (``weight``,
    ``bias``, ``running_mean``, ``running_var``, ``num_batches_tracked``), so
    legacy checkpoints load unchanged.  Statistics are over all rows of the
    batch; the support is kept.  On the CPU it runs the library's own passes
    (:func:`torch_lattice.nn.functional.batch_norm`), elsewhere torch's.
    ``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` does not apply: it replaces the
    layer with a dense ``SyncBatchNorm``, which cannot take a SparseTensor (see
    docs/distributed.md).
    """

    # max(., 0) after the normalization, in the same pass (BatchNormReLU).
    _relu = False

    def __init__(self, num_features: int, *args: Any, **kwargs: Any) -> None:
        """``nn.BatchNorm1d``'s arguments; ``num_features`` must be a positive int
        (``ValueError`` naming it, not torch's allocation error)."""
        super().__init__(positive_int("num_features", num_features), *args, **kwargs)

    def _normalize(self, feats: torch.Tensor) -> torch.Tensor:
        """``nn.BatchNorm1d.forward``'s bookkeeping (batch counter, momentum, which
        statistics) around the library's batch norm."""
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        keep = not self.training or self.track_running_stats
        return batch_norm(
            feats,
            self.running_mean if keep else None,
            self.running_var if keep else None,
            self.weight,
            self.bias,
            use_batch,
            factor,
            self.eps,
            relu=self._relu,
        )

    @eager_forward
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
            out = self._normalize(input.feats)
        except (RuntimeError, TypeError) as exc:
            # torch's kernels (CUDA) raise RuntimeError, the library's TypeError.
            if "dtype" not in str(exc) and "scalar type" not in str(exc):
                raise
            raise TypeError(
                f"input feats dtype {input.feats.dtype} does not work with BatchNorm's "
                f"parameters ({self.weight.dtype if self.weight is not None else 'none'}): "
                f"{exc}; convert the layer or the features"
            ) from exc
        return input.replace(out)


class BatchNormReLU(BatchNorm):
    """``BatchNorm`` then ``ReLU``, in one pass forward and without the ReLU's own
    tensor and pass backward.

    Same arguments and state-dict keys as ``BatchNorm`` (so ``Sequential(conv,
    BatchNormReLU(c))`` loads a ``Sequential(conv, BatchNorm(c), ReLU())`` checkpoint);
    exported artifacts hold a batch norm and a ReLU.
    """

    _relu = True
