"""Functional sparse pooling: windowed (max / average / sum) and global.

Windowed pooling follows :func:`~torch_lattice.nn.functional.conv3d`'s geometry
exactly: the output support is the coordinate manager's generated support for
the same ``(kernel_size, stride, padding, dilation)`` and the relation is its
kernel map, so a pooling layer and a convolution with the same geometry share
one cached support and one cached map.  Each output row pools over the kernel
rows whose input exists (never over absent rows, so an average divides by the
number of present inputs).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_lattice.geometry import ConvGeometry
from torch_lattice.nn.functional.conv import generated_support
from torch_lattice.ops.pooling import pool_avg, pool_max, pool_sum
from torch_lattice.tensor import SparseTensor

__all__ = [
    "avg_pool3d",
    "global_avg_pool",
    "global_max_pool",
    "max_pool3d",
    "pool_geometry",
    "sum_pool3d",
]

IntOr3 = int | Sequence[int]


def pool_geometry(
    kernel_size: IntOr3, stride: IntOr3 | None = None, padding: IntOr3 = 0, dilation: IntOr3 = 1
) -> ConvGeometry:
    """Normalizes pooling arguments; ``stride=None`` means ``kernel_size`` (as in torch)."""
    return ConvGeometry.create(
        kernel_size, kernel_size if stride is None else stride, padding, dilation
    )


def _pool(x: SparseTensor, geometry: ConvGeometry, mode: str) -> SparseTensor:
    if not isinstance(x, SparseTensor):
        raise TypeError(f"input must be a torch_lattice.SparseTensor, got {type(x).__name__}")
    if geometry.is_identity:
        return SparseTensor.from_support(x.feats, x.support)
    target = generated_support(x, geometry)
    kmap = x.coordinate_manager.kernel_map(x.support, target, geometry)
    if mode == "max":
        y, _ = pool_max(x.feats, kmap.nbr, kmap.rev)
    elif mode == "avg":
        y = pool_avg(x.feats, kmap.nbr, kmap.rev)
    else:
        y = pool_sum(x.feats, kmap.nbr, kmap.rev)
    return SparseTensor.from_support(y, target)


def max_pool3d(
    input: SparseTensor,
    kernel_size: IntOr3,
    stride: IntOr3 | None = None,
    padding: IntOr3 = 0,
    dilation: IntOr3 = 1,
) -> SparseTensor:
    """``y[q] = max_n x[q*stride - padding + r_n*dilation]`` per channel over present inputs.

    Output support, order, stride and range are those of ``conv3d`` with the
    same geometry.  Gradients go to the input row of each maximum (the first
    in kernel-row order on ties).
    """
    return _pool(input, pool_geometry(kernel_size, stride, padding, dilation), "max")


def avg_pool3d(
    input: SparseTensor,
    kernel_size: IntOr3,
    stride: IntOr3 | None = None,
    padding: IntOr3 = 0,
    dilation: IntOr3 = 1,
) -> SparseTensor:
    """Mean over the present inputs of each window (support as ``conv3d``)."""
    return _pool(input, pool_geometry(kernel_size, stride, padding, dilation), "avg")


def sum_pool3d(
    input: SparseTensor,
    kernel_size: IntOr3,
    stride: IntOr3 | None = None,
    padding: IntOr3 = 0,
    dilation: IntOr3 = 1,
) -> SparseTensor:
    """Sum over the present inputs of each window (support as ``conv3d``)."""
    return _pool(input, pool_geometry(kernel_size, stride, padding, dilation), "sum")


def _batches(x: SparseTensor) -> tuple[torch.Tensor, int]:
    if not isinstance(x, SparseTensor):
        raise TypeError(f"input must be a torch_lattice.SparseTensor, got {type(x).__name__}")
    return x.coords[:, 0].long(), x.support.num_batches()


def global_avg_pool(input: SparseTensor) -> torch.Tensor:
    """``(B, C)`` mean of each batch's rows; B is ``spatial_range[0]`` when set,
    else ``max(batch) + 1``.  Batches without rows give zeros."""
    batch, b = _batches(input)
    feats = input.feats
    sums = feats.new_zeros((b, feats.shape[1])).index_add(0, batch, feats)
    count = torch.bincount(batch, minlength=b).clamp_min(1).to(feats.dtype)
    return sums / count.unsqueeze(1)


def global_max_pool(input: SparseTensor) -> torch.Tensor:
    """``(B, C)`` maximum of each batch's rows (B as in :func:`global_avg_pool`).
    Batches without rows give zeros."""
    batch, b = _batches(input)
    feats = input.feats
    index = batch.unsqueeze(1).expand_as(feats)
    out = feats.new_zeros((b, feats.shape[1]))
    return out.scatter_reduce(0, index, feats, reduce="amax", include_self=False)
