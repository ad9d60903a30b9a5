"""Point clouds to sparse voxels and back: :func:`voxelize`, :func:`devoxelize`,
:func:`collate`.

A point ``p`` of batch ``b`` falls in voxel ``(b, floor((p - origin) / voxel_size))``.
Voxel rows are unique and sorted by ``(b, x, y, z)``.  The quantization, the
unique/sort step, the reductions and the devoxelization maps run in the C core
(csrc/core/tl_voxel.c); gradients flow to point features (voxelize) and voxel
features (devoxelize).

Devoxelization rules (see docs/building-blocks.md):

- ``voxels`` of stride ``s`` are read on a grid of edge ``voxel_size * s``
  (their logical coordinate ``q`` covers ``[origin + q*e, origin + (q+1)*e)``).
- ``"nearest"``: each point takes the features of the voxel containing it, or
  zeros when that voxel is absent.
- ``"trilinear"``: each point blends the 8 voxels whose centres
  ``origin + (q + 0.5) * e`` surround it, with the usual trilinear weights;
  absent corners contribute 0 and the weights of present corners are *not*
  renormalized (a point among only absent voxels gets zeros).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from torch_lattice.geometry import check_has_values, is_sequence
from torch_lattice.memory_budget import check_allocation
from torch_lattice.ops._runtime import REDUCTION_CODES, compute_dtype, refuse_function_transforms
from torch_lattice.ops.voxel import (
    check_axis_values,
    devoxel_gather,
    devoxel_map,
    voxel_reduce,
    voxelize_coords,
)
from torch_lattice.tensor import CoordinateManager, SparseTensor, Support, check_strided

__all__ = ["collate", "devoxelize", "voxelize"]

_REDUCTIONS = tuple(REDUCTION_CODES)  # ("mean", "sum", "max")
_INTERPOLATIONS = ("nearest", "trilinear")


def _floats3(name: str, value: Any, positive: bool) -> list[float]:
    # Sized before anything is read or shown: a tensor expanded to 10^9 elements is 4
    # bytes of storage, and its list (or a long list in the message) gigabytes.
    if isinstance(value, torch.Tensor):
        if value.numel() not in (1, 3):
            raise ValueError(f"{name} must be a number or 3 numbers (x, y, z), got a tensor "
                             f"of shape {tuple(value.shape)}")
        check_has_values(name, value)
        value = value.tolist()
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number or 3 numbers, got {value!r}")
    if isinstance(value, (int, float)):
        value = [value] * 3
    if not is_sequence(value):  # str and bytes too: b"\x01\x01\x01" is not (1, 1, 1)
        raise TypeError(
            f"{name} must be a number or 3 numbers (x, y, z), got {type(value).__name__}"
        )
    if len(value) != 3:
        shown = f"a sequence of {len(value)}" if len(value) > 8 else repr(value)
        raise ValueError(f"{name} must be a number or 3 numbers (x, y, z), got {shown}")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name} must contain numbers, got {value!r}")
    out = [_to_float(v) for v in value]
    # An int beyond the float range is shown as the infinity it stands for (its digits
    # could be thousands long).
    beyond = any(isinstance(v, int) and math.isinf(f) for v, f in zip(value, out, strict=True))
    check_axis_values(name, out, positive, out if beyond else value)
    return out


def _to_float(v: float) -> float:
    """``float(v)``, with an int beyond the float range as the infinity of its sign (then
    refused as not finite, naming the argument) instead of an ``OverflowError``."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def _check_points(points: Any) -> torch.Tensor:
    if not isinstance(points, torch.Tensor):
        raise TypeError(f"points must be a torch.Tensor, got {type(points).__name__}")
    check_strided(points, "points")
    if not points.is_floating_point():
        raise TypeError(f"points must be a floating tensor, got {points.dtype}")
    if points.dim() != 2 or points.shape[1] != 3:
        raise ValueError(f"points must have shape (P, 3), got {tuple(points.shape)}")
    if points.device.type not in ("cpu", "cuda"):
        raise ValueError(f"points must be on the CPU or a CUDA device, got {points.device}")
    # Half-precision points are widened exactly; the C core reads float32/64.
    if points.dtype in (torch.float32, torch.float64):
        return points
    check_allocation(f"widening {points.shape[0]} {points.dtype} points to float32",
                     points.shape[0] * 12)
    return points.float()


def _check_batch(batch: Any, points: torch.Tensor) -> torch.Tensor | None:
    if batch is None:
        return None
    if not isinstance(batch, torch.Tensor) or batch.is_floating_point() or batch.is_complex():
        raise TypeError("batch_indices must be an integer tensor of shape (P,)")
    if batch.dtype == torch.bool:
        raise TypeError("batch_indices must be an integer tensor, got bool")
    if batch.shape != (points.shape[0],):
        raise ValueError(
            f"batch_indices must have shape (P,) = ({points.shape[0]},), got {tuple(batch.shape)}"
        )
    if batch.device != points.device:
        raise ValueError(f"batch_indices is on {batch.device}, points on {points.device}")
    if batch.numel() and int(batch.min()) < 0:
        raise ValueError(f"batch_indices must be non-negative, found {int(batch.min())}")
    return batch.long()


def _work_feats(op: str, feats: torch.Tensor) -> torch.Tensor:
    work = compute_dtype(op, feats.dtype)
    if work != feats.dtype:  # a widened copy: checked like the kernels' own allocations
        check_allocation(f"{op}: widening {tuple(feats.shape)} {feats.dtype} features",
                         feats.numel() * work.itemsize)
    return feats.to(work)


def voxelize(
    points: torch.Tensor,
    features: torch.Tensor,
    *,
    batch_indices: torch.Tensor | None = None,
    voxel_size: float | Sequence[float] = 1.0,
    origin: float | Sequence[float] = 0.0,
    reduction: str = "mean",
) -> SparseTensor:
    """Pools point features into unique voxels.

    Args:
        points: ``(P, 3)`` floating positions.
        features: ``(P, C)`` floating features (differentiable).
        batch_indices: ``(P,)`` non-negative integers, or None for one cloud.
        voxel_size: voxel edge, a positive number or 3 of them.
        origin: grid origin, a number or 3 of them; no point may lie below it.
        reduction: ``"mean"``, ``"sum"`` or ``"max"`` over the points of a voxel.

    Returns:
        SparseTensor: stride 1, coords ``(M, 4)`` int32 ``[b, x, y, z]`` unique
        and sorted, feats ``(M, C)`` in ``features.dtype``.

    Raises:
        TypeError: bad types or dtypes.
        ValueError: bad shapes, a point below ``origin`` (named), non-finite
            points, voxel indices beyond int32.
    """
    pts = _check_points(points)
    if not isinstance(features, torch.Tensor) or not features.is_floating_point():
        raise TypeError("features must be a floating torch.Tensor of shape (P, C)")
    if features.dim() != 2 or features.shape[0] != pts.shape[0]:
        raise ValueError(
            f"features must have shape (P, C) with P = {pts.shape[0]}, got {tuple(features.shape)}"
        )
    if features.device != pts.device:
        raise ValueError(f"features are on {features.device}, points on {pts.device}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    batch = _check_batch(batch_indices, pts)
    size = _floats3("voxel_size", voxel_size, positive=True)
    org = _floats3("origin", origin, positive=False)
    coords, inverse = voxelize_coords(pts, batch, size, org)
    refuse_function_transforms("voxelize", features)
    feats, _ = voxel_reduce(_work_feats("voxelize", features), inverse, coords.shape[0], reduction)
    return SparseTensor.from_support(feats.to(features.dtype), _new_support(coords))


def _new_support(coords: torch.Tensor) -> Support:
    # Rows from voxelize_coords are unique and non-negative by construction.
    return CoordinateManager().new_support(coords, (1, 1, 1), None, stable=True)


def devoxelize(
    points: torch.Tensor,
    voxels: SparseTensor,
    *,
    batch_indices: torch.Tensor | None = None,
    voxel_size: float | Sequence[float] = 1.0,
    origin: float | Sequence[float] = 0.0,
    interpolation: str = "nearest",
) -> torch.Tensor:
    """Reads voxel features back at points (see the module docstring for the rules).

    Args:
        points: ``(P, 3)`` floating positions, none below ``origin`` (not
            differentiated: a ``points.grad`` stays None, as in :func:`voxelize`).
        voxels: SparseTensor with ``(M, C)`` features (differentiable); a
            stride-``s`` tensor is read on a grid of edge ``voxel_size * s``.
        batch_indices: ``(P,)`` batch of each point, or None (all 0).
        voxel_size, origin: the grid used by :func:`voxelize`.
        interpolation: ``"nearest"`` or ``"trilinear"``.

    Returns:
        ``(P, C)`` features in ``voxels.dtype``.
    """
    if not isinstance(voxels, SparseTensor):
        raise TypeError(f"voxels must be a SparseTensor, got {type(voxels).__name__}")
    pts = _check_points(points)
    if pts.device != voxels.device:
        raise ValueError(f"points are on {pts.device}, voxels on {voxels.device}")
    if interpolation not in _INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {_INTERPOLATIONS}, got {interpolation!r}")
    batch = _check_batch(batch_indices, pts)
    size = _floats3("voxel_size", voxel_size, positive=True)
    size = [v * s for v, s in zip(size, voxels.stride, strict=True)]
    org = _floats3("origin", origin, positive=False)
    # (features expanded to billions of channels from a few bytes would ask for gigabytes)
    check_allocation(f"devoxelize output ({pts.shape[0]} points x {voxels.feats.shape[1]} "
                     "channels)", int(pts.shape[0]) * int(voxels.feats.shape[1]) * 8)
    # The positions are constants of the map (its rows and trilinear weights): a points
    # tensor that requires grad (say, the output of a learned offset) is read as it is.
    idx, w = devoxel_map(pts.detach(), batch, size, org, voxels.coords,
                         interpolation == "trilinear")
    refuse_function_transforms("devoxelize", voxels.feats, pts)  # trilinear: points too
    out = devoxel_gather(_work_feats("devoxelize", voxels.feats), idx, w)
    return out.to(voxels.dtype)


def collate(
    points: Sequence[torch.Tensor],
    features: Sequence[torch.Tensor],
    *,
    voxel_size: float | Sequence[float] = 1.0,
    origin: float | Sequence[float] = 0.0,
    reduction: str = "mean",
) -> SparseTensor:
    """Voxelizes a list of point clouds into one batched SparseTensor.

    Cloud ``i`` gets batch index ``i``.  The matching ``batch_indices`` for
    :func:`devoxelize` are ``torch.repeat_interleave(torch.arange(len(points)),
    torch.tensor([len(p) for p in points]))``.

    Args:
        points: ``B`` tensors ``(P_i, 3)``.
        features: ``B`` tensors ``(P_i, C)``.
        voxel_size, origin, reduction: as in :func:`voxelize`.

    Returns:
        SparseTensor with batch indices ``0 .. B-1`` and ``spatial_range``
        None.
    """
    if not all(
        isinstance(v, Sequence) and not isinstance(v, torch.Tensor) for v in (points, features)
    ):
        raise TypeError("collate: points and features must be lists of tensors, one per cloud")
    if len(points) == 0 or len(points) != len(features):
        raise ValueError(
            f"collate: need one features tensor per cloud and at least one cloud, got "
            f"{len(points)} points and {len(features)} features"
        )
    for i, (p, f) in enumerate(zip(points, features, strict=True)):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"collate: points[{i}] must be a tensor, got {type(p).__name__}")
        if not isinstance(f, torch.Tensor):
            raise TypeError(f"collate: features[{i}] must be a tensor, got {type(f).__name__}")
        # Every cloud must be on points[0]'s device (below); a meta points[0] would reach
        # torch.repeat_interleave, whose error names no argument.
        if i == 0 and p.device.type not in ("cpu", "cuda"):
            raise ValueError(
                f"collate: points[0] must be on the CPU or a CUDA device, got {p.device}"
            )
        if p.dim() != 2 or p.shape[1] != 3:
            raise ValueError(f"collate: points[{i}] must have shape (P, 3), got {tuple(p.shape)}")
        if f.dim() != 2:
            raise ValueError(f"collate: features[{i}] must have shape (P, C), got {tuple(f.shape)}")
        if f.shape[0] != p.shape[0]:
            raise ValueError(
                f"collate: features[{i}] has {f.shape[0]} rows but points[{i}] "
                f"has {p.shape[0]}: each cloud needs (P_i, C) features"
            )
        c0 = features[0].shape[1]
        if f.shape[1] != c0:
            raise ValueError(
                f"collate: features[{i}] has {f.shape[1]} channels but features[0] has {c0}"
            )
        if p.device != points[0].device or f.device != points[0].device:
            raise ValueError(
                f"collate: points[{i}] and features[{i}] must be on {points[0].device} "
                f"(points[0]'s device), got {p.device} and {f.device}"
            )
    # torch.cat copies every cloud (an expanded view of a few bytes of storage too) and
    # repeat_interleave makes an int64 batch index per point, all before voxelize checks
    # its own work: two expanded clouds of 2^28 rows asked for 10 GiB unchecked.
    rows = sum(int(p.shape[0]) for p in points)
    point_bytes = 3 * max(p.element_size() for p in points)
    feat_bytes = int(features[0].shape[1]) * max(f.element_size() for f in features)
    check_allocation(
        f"collate of {len(points)} clouds ({rows} points x {features[0].shape[1]} channels: "
        "the concatenated points, features and int64 batch indices)",
        rows * (point_bytes + feat_bytes + 8),
    )
    counts = torch.tensor([p.shape[0] for p in points], device=points[0].device)
    batch = torch.repeat_interleave(torch.arange(len(points), device=points[0].device), counts)
    return voxelize(
        torch.cat(list(points)),
        torch.cat(list(features)),
        batch_indices=batch,
        voxel_size=voxel_size,
        origin=origin,
        reduction=reduction,
    )
