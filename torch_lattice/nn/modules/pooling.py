"""Pooling modules: windowed (:class:`MaxPool3d`, :class:`AvgPool3d`,
:class:`SumPool3d`) and global (:class:`GlobalAvgPool`, :class:`GlobalMaxPool`).

They wrap :mod:`torch_lattice.nn.functional.pooling` and hold no parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from torch_lattice.nn.functional import pooling as F
from torch_lattice.tensor import SparseTensor

__all__ = ["AvgPool3d", "GlobalAvgPool", "GlobalMaxPool", "MaxPool3d", "SumPool3d"]


class _Pool3d(nn.Module):
    """Geometry shared by the windowed pools (Conv3d's rules; stride defaults to kernel_size)."""

    _fn = staticmethod(F.max_pool3d)

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

    def forward(self, input: SparseTensor) -> SparseTensor:
        return type(self)._fn(input, self.kernel_size, self.stride, self.padding, self.dilation)

    def extra_repr(self) -> str:
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"dilation={self.dilation}"
        )


class MaxPool3d(_Pool3d):
    """Sparse max pooling; wraps :func:`torch_lattice.nn.functional.max_pool3d`."""

    _fn = staticmethod(F.max_pool3d)


class AvgPool3d(_Pool3d):
    """Sparse average pooling over present inputs; wraps ``avg_pool3d``."""

    _fn = staticmethod(F.avg_pool3d)


class SumPool3d(_Pool3d):
    """Sparse sum pooling; wraps :func:`torch_lattice.nn.functional.sum_pool3d`."""

    _fn = staticmethod(F.sum_pool3d)


class GlobalAvgPool(nn.Module):
    """``(B, C)`` per-batch mean; wraps ``global_avg_pool``."""

    def forward(self, input: SparseTensor) -> torch.Tensor:
        return F.global_avg_pool(input)


class GlobalMaxPool(nn.Module):
    """``(B, C)`` per-batch maximum; wraps ``global_max_pool``."""

    def forward(self, input: SparseTensor) -> torch.Tensor:
        return F.global_max_pool(input)
