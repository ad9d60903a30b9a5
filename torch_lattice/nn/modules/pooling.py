"""Pooling modules: windowed (:class:`MaxPool3d`, :class:`AvgPool3d`,
:class:`SumPool3d`) and global (:class:`GlobalAvgPool`, :class:`GlobalMaxPool`).

They wrap :mod:`torch_lattice.nn.functional.pooling` and hold no parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from torch_lattice.nn.functional import pooling as F
from torch_lattice.nn.modules.eager import eager_forward
from torch_lattice.tensor import SparseTensor

__all__ = ["AvgPool3d", "GlobalAvgPool", "GlobalMaxPool", "MaxPool3d", "SumPool3d"]


class _Pool3d(nn.Module):
    """Geometry shared by the windowed pools (Conv3d's rules; stride defaults to kernel_size)."""

    _fn: Callable[..., SparseTensor]  # the pool's functional, set by each subclass

    def __init__(
        self,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
    ) -> None:
        super().__init__()
        geometry = F.pool_geometry(kernel_size, stride, padding, dilation)
        self.kernel_size = geometry.kernel_size
        self.stride = geometry.stride
        self.padding = geometry.padding
        self.dilation = geometry.dilation

    @eager_forward
    def forward(self, input: SparseTensor) -> SparseTensor:
        """Pooling of ``input`` with the reduction the class names.

        Support rule: that of :class:`Conv3d` with the same kernel_size,
        stride, padding and dilation (every reachable output cell, sorted by
        ``(b, x, y, z)``, stride ``input.stride * stride``); the two share one
        cached support and kernel map.  Each output row reduces, per channel,
        the kernel rows whose input row is present.

        Args:
            input: ``(N, C)`` features.

        Returns:
            SparseTensor: ``(M, C)`` features on the generated support.
        """
        return type(self)._fn(input, self.kernel_size, self.stride, self.padding, self.dilation)

    def extra_repr(self) -> str:
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"dilation={self.dilation}"
        )


class MaxPool3d(_Pool3d):
    """Sparse max pooling; wraps :func:`torch_lattice.nn.functional.max_pool3d`.

    Each output row takes the per-channel maximum over the kernel rows whose
    input row is present.
    """

    _fn = staticmethod(F.max_pool3d)


class AvgPool3d(_Pool3d):
    """Sparse average pooling over present inputs; wraps ``avg_pool3d``.

    Each output row averages over the kernel rows whose input row is present
    (dividing by their number).
    """

    _fn = staticmethod(F.avg_pool3d)


class SumPool3d(_Pool3d):
    """Sparse sum pooling; wraps :func:`torch_lattice.nn.functional.sum_pool3d`.

    Each output row sums over the kernel rows whose input row is present.
    """

    _fn = staticmethod(F.sum_pool3d)


class _GlobalPool(nn.Module):
    """A per-batch reduction of every row to a dense ``(B, C)`` tensor."""

    _fn: Callable[[SparseTensor], torch.Tensor]  # the reduction's functional, per subclass

    @eager_forward
    def forward(self, input: SparseTensor) -> torch.Tensor:
        """Per-batch reduction (the class names it) of ``input``'s features over all its rows.

        Support rule: none; the result is dense, one row per batch index
        ``0 .. B - 1`` (``B`` from ``spatial_range`` when set, else the
        largest batch index + 1); a batch without rows gives zeros.

        Args:
            input: ``(N, C)`` features.

        Returns:
            torch.Tensor: ``(B, C)``.
        """
        return type(self)._fn(input)


class GlobalAvgPool(_GlobalPool):
    """``(B, C)`` per-batch mean; wraps ``global_avg_pool``."""

    _fn = staticmethod(F.global_avg_pool)


class GlobalMaxPool(_GlobalPool):
    """``(B, C)`` per-batch maximum; wraps ``global_max_pool``."""

    _fn = staticmethod(F.global_max_pool)
