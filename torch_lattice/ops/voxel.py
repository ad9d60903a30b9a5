"""Voxelization ops: ``lattice::voxelize_coords``, ``lattice::voxel_reduce``,
``lattice::devoxel_map`` and ``lattice::devoxel_gather``.

The C core (csrc/core/tl_voxel.h) quantizes points, finds unique sorted voxel rows,
reduces point features per voxel and builds point-to-voxel maps; torch
allocates every tensor.  Gradients are built from torch index ops.

Each op's body is its CPU kernel; the CUDA kernels (csrc/cuda/tl_cuda_voxel.cu) are
registered by :mod:`torch_lattice.ops.voxel_cuda` and give the same rows, order and
errors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from torch_lattice.memory_budget import check_allocation
from torch_lattice.ops._runtime import (
    _C,
    DTYPE_CODES,
    REDUCTION_CODES,
    check_coords,
    check_non_negative,
    check_size,
    check_tensor,
    one_device,
    optional_ptr,
    ptr,
    require_cpu,
    strided_copy_bytes,
    symbolic_sizes,
    threads,
)

__all__ = [
    "REDUCTIONS",
    "check_axis_values",
    "check_devoxel_gather",
    "check_devoxel_map_memory",
    "check_grid",
    "check_points",
    "check_voxel_reduce",
    "check_voxelize_memory",
    "devoxel_gather",
    "devoxel_map",
    "drop_weightless_corners",
    "point_error",
    "voxel_reduce",
    "voxelize_coords",
]

REDUCTIONS = REDUCTION_CODES  # enum tl_voxel_reduction, by name
_TL_ERR_OVERFLOW = -3


def point_error(
    points: torch.Tensor,
    batch: torch.Tensor | None,
    bad: int,
    st: int,
    voxel_size: list[float],
    origin: list[float],
) -> Exception:
    """The user-facing error for the first point the C core rejected."""
    p = points[bad].tolist()
    if batch is not None and int(batch[bad]) < 0:
        return ValueError(f"batch_indices must be non-negative, found {int(batch[bad])} at {bad}")
    if st == _TL_ERR_OVERFLOW:
        return ValueError(
            f"points[{bad}] = {p} is too far from origin {origin} for voxel_size {voxel_size}: "
            "its voxel index exceeds int32 (or batch_indices does)"
        )
    if not all(v == v and abs(v) != float("inf") for v in p):
        return ValueError(f"points must be finite, points[{bad}] = {p}")
    return ValueError(
        f"points must lie at or above origin {origin} in every axis (voxel indices are "
        f"non-negative): points[{bad}] = {p}; lower origin"
    )


_FLOATS = (torch.float32, torch.float64)


def check_points(op: str, points: torch.Tensor, batch: torch.Tensor | None) -> None:
    """Raises unless ``points`` are ``(P, 3)`` float32 / float64 and ``batch`` is None
    or ``(P,)`` int64 (CPU and CUDA)."""
    check_tensor(op, "points", points, _FLOATS, ("P", 3))
    if batch is not None:
        check_tensor(op, "batch", batch, (torch.int64,), (points.shape[0],))


_F32_TINY = float(torch.finfo(torch.float32).smallest_normal)
_F32_MAX = float(torch.finfo(torch.float32).max)


def check_axis_values(name: str, values: Sequence[float], positive: bool, shown: object,
                      where: str = "") -> None:  # fmt: skip
    """The rule of a grid's three numbers (one per axis): ``voxel_size`` (``positive``)
    finite, > 0 and a normal float32 (points are divided in float32 too: 1e-50 is 0
    there, so every point would land at infinity); ``origin`` finite. Raises
    ``ValueError`` naming ``name`` and showing ``shown`` (the value as given), after the
    ``where`` prefix (an op's ``"lattice::op: "``)."""
    for v in values:
        if not math.isfinite(v) or (positive and v <= 0):
            rule = "finite and > 0" if positive else "finite"
            raise ValueError(f"{where}{name} must be {rule} in every axis, got {shown!r}")
        if positive and not _F32_TINY <= v <= _F32_MAX:
            raise ValueError(
                f"{where}{name} must be a positive finite float32 in every axis (between "
                f"{_F32_TINY:.3g} and {_F32_MAX:.3g}), got {shown!r}"
            )


def check_grid(op: str, voxel_size: Sequence[float], origin: Sequence[float]) -> None:
    """Raises ``ValueError`` unless ``voxel_size`` and ``origin`` are three numbers each
    that keep :func:`check_axis_values`' rules (CPU and CUDA): the C core refused them
    with a bare "invalid argument" (or a short list with a message about a tuple)."""
    for name, values, positive in (("voxel_size", voxel_size, True), ("origin", origin, False)):
        if len(values) != 3:
            raise ValueError(
                f"lattice::{op}: {name} must be 3 numbers (x, y, z), got {list(values)!r}"
            )
        check_axis_values(name, values, positive, list(values), f"lattice::{op}: ")


def _check_float_feats(op: str, feats: torch.Tensor) -> None:
    """The kernels' feature dtypes: float32 or float64 on the CPU (tl.voxelize and
    tl.devoxelize widen half types first), also float16 and bfloat16 on CUDA."""
    kinds = (torch.float32, torch.float64)
    if feats.device.type == "cuda":
        kinds += (torch.float16, torch.bfloat16)
    if feats.dtype not in kinds:
        names = ", ".join(str(k).removeprefix("torch.") for k in kinds)
        raise TypeError(f"lattice::{op}: feats must be {names} on {feats.device.type}, "
                        f"got {feats.dtype}")


def _check_voxel_reduce_args(feats: torch.Tensor, inverse: torch.Tensor,
                             num_voxels: int | torch.SymInt, reduction: str) -> None:  # fmt: skip
    """The dtype, shape and scalar rules of ``lattice::voxel_reduce`` (its fake kernel's
    check; ``num_voxels`` is symbolic there under ``torch.compile``)."""
    op = "voxel_reduce"
    if feats.dim() != 2:
        raise ValueError(f"lattice::{op}: feats must be (P, C), got {tuple(feats.shape)}")
    _check_float_feats(op, feats)
    check_tensor(op, "inverse", inverse, (torch.int64,), (feats.shape[0],))
    if isinstance(num_voxels, bool) or not isinstance(num_voxels, (int, torch.SymInt)):
        raise ValueError(f"lattice::{op}: num_voxels must be an int >= 0, got {num_voxels!r}")
    check_size(num_voxels >= 0,
               lambda: f"lattice::{op}: num_voxels must be an int >= 0, got {num_voxels!r}")
    if reduction not in REDUCTIONS:
        raise ValueError(
            f"lattice::{op}: reduction must be one of {sorted(REDUCTIONS)}, got {reduction!r}"
        )


def check_voxel_reduce(feats: torch.Tensor, inverse: torch.Tensor, num_voxels: int,
                       reduction: str) -> None:  # fmt: skip
    """The argument check of ``lattice::voxel_reduce`` (CPU and CUDA): ``(P, C)``
    features, the ``(P,)`` int64 voxel of each point, ``num_voxels >= 0`` rows out, a
    known reduction; the output and its per-voxel scratch within the memory budget."""
    _check_voxel_reduce_args(feats, inverse, num_voxels, reduction)
    c = int(feats.shape[1])
    # no channels: the C core returns its empty outputs before it counts points per voxel
    per_voxel = (c * feats.element_size() + (c * 8 if reduction == "max" else 0) + 16) if c else 0
    check_allocation(
        f"voxel reduction ({num_voxels} voxels x {c} channels, {reduction})",
        num_voxels * per_voxel + strided_copy_bytes(feats, inverse),
    )


def _hash_bytes(rows: int) -> int:
    """The C core's coordinate hash table over ``rows`` rows: 24-byte slots, the power of
    two at or above ``2 * rows`` (csrc/core/tl_hash.c)."""
    slots = 16
    while slots < 2 * rows:
        slots *= 2
    return slots * 24


def check_voxelize_memory(points: torch.Tensor, batch: torch.Tensor | None) -> None:
    """``lattice::voxelize_coords``'s temporaries within the memory budget, before any
    is allocated: for each of the P points its voxel row, a unique row and its inverse
    (16 + 16 + 8 bytes), the hash table of the rows, and contiguous copies of strided
    points and batch."""
    n = int(points.shape[0])
    check_allocation(f"voxelizing {n} points",
                     n * 40 + _hash_bytes(n) + strided_copy_bytes(points, batch))


def check_devoxel_map_memory(points: torch.Tensor, batch: torch.Tensor | None,
                             voxel_coords: torch.Tensor, k: int) -> None:  # fmt: skip
    """``lattice::devoxel_map``'s outputs and temporaries within the memory budget: for
    each of the P points ``k`` int64 rows and float64 weights, the hash table of the M
    voxels, and contiguous copies of strided operands."""
    n, m = int(points.shape[0]), int(voxel_coords.shape[0])
    check_allocation(
        f"devoxelization map ({n} points x {k} voxels)",
        n * k * 16 + _hash_bytes(m) + strided_copy_bytes(points, batch, voxel_coords),
    )


def check_devoxel_gather(feats: torch.Tensor, idx: torch.Tensor, weight: torch.Tensor) -> None:
    """The argument check of ``lattice::devoxel_gather`` (CPU and CUDA): ``(M, C)``
    features, ``devoxel_map``'s ``(P, k)`` int64 rows and float64 weights."""
    op = "devoxel_gather"
    if feats.dim() != 2:
        raise ValueError(f"lattice::{op}: feats must be (M, C), got {tuple(feats.shape)}")
    _check_float_feats(op, feats)
    check_tensor(op, "idx", idx, (torch.int64,), ("P", "k"))
    check_tensor(op, "weight", weight, (torch.float64,), tuple(idx.shape))
    if symbolic_sizes(feats, idx):  # a fake kernel under torch.compile: the real call checks
        return
    n, c = idx.shape[0], feats.shape[1]
    check_allocation(f"devoxel gather output ({n} points x {c} channels)",
                     n * c * feats.element_size() + strided_copy_bytes(feats, idx, weight))


@torch.library.custom_op("lattice::voxelize_coords", mutates_args=())
def voxelize_coords(
    points: torch.Tensor,
    batch: torch.Tensor | None,
    voxel_size: list[float],
    origin: list[float],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique voxel rows ``(M, 4)`` int32 sorted by (b, x, y, z) and the
    ``(P,)`` int64 row of each point.

    Args:
        points: ``(P, 3)`` float32 or float64.
        batch: ``(P,)`` int64 batch index per point, or None (all 0).
        voxel_size, origin: three floats each: ``voxel_size`` positive, finite and a
            normal float32, ``origin`` finite (:func:`check_grid`).
    """
    require_cpu("voxelize_coords", points, *(() if batch is None else (batch,)))
    check_points("voxelize_coords", points, batch)
    check_grid("voxelize_coords", voxel_size, origin)
    check_voxelize_memory(points, batch)
    points = points.contiguous()
    batch = None if batch is None else batch.contiguous()
    n = points.shape[0]
    rows = torch.empty((n, 4), dtype=torch.int32)
    st, bad = _C.voxel_quantize(
        DTYPE_CODES[points.dtype],
        ptr(points),
        optional_ptr(batch),
        n,
        tuple(voxel_size),
        tuple(origin),
        ptr(rows),
        threads(),
    )
    if st != 0:
        raise point_error(points, batch, bad, st, voxel_size, origin)
    uniq = torch.empty((n, 4), dtype=torch.int32)
    inverse = torch.empty((n,), dtype=torch.int64)
    m = _C.voxel_unique(ptr(rows), n, ptr(uniq), ptr(inverse), threads())
    return uniq[:m].clone(), inverse


@voxelize_coords.register_fake
@one_device("voxelize_coords")
def _(points, batch, voxel_size, origin):
    check_points("voxelize_coords", points, batch)
    check_grid("voxelize_coords", voxel_size, origin)
    m = torch.library.get_ctx().new_dynamic_size()
    return (
        points.new_empty((m, 4), dtype=torch.int32),
        points.new_empty((points.shape[0],), dtype=torch.int64),
    )


@torch.library.custom_op("lattice::voxel_reduce", mutates_args=())
def voxel_reduce(
    feats: torch.Tensor, inverse: torch.Tensor, num_voxels: int, reduction: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-voxel reduction of point features.

    Args:
        feats: ``(P, C)`` float32 or float64.
        inverse: ``(P,)`` int64 voxel of each point, in ``[0, num_voxels)``.
        num_voxels: ``M``.
        reduction: ``"mean"``, ``"sum"`` or ``"max"``.

    Returns:
        ``(M, C)`` reduced features and, for ``"max"``, the ``(M, C)`` int64
        index of the point attaining each maximum (``(0, C)`` otherwise).
    """
    require_cpu("voxel_reduce", feats, inverse)
    check_voxel_reduce(feats, inverse, num_voxels, reduction)
    feats, inverse = feats.contiguous(), inverse.contiguous()
    n, c = feats.shape
    out = torch.empty((num_voxels, c), dtype=feats.dtype)
    is_max = reduction == "max"
    arg = torch.empty((num_voxels if is_max else 0, c), dtype=torch.int64)
    _C.voxel_reduce(
        DTYPE_CODES[feats.dtype],
        REDUCTIONS[reduction],
        ptr(feats),
        n,
        c,
        ptr(inverse),
        num_voxels,
        ptr(out),
        ptr(arg),
        threads(),
    )
    return out, arg


@voxel_reduce.register_fake
@one_device("voxel_reduce")
def _(feats, inverse, num_voxels, reduction):
    _check_voxel_reduce_args(feats, inverse, num_voxels, reduction)
    c = feats.shape[1]
    rows = num_voxels if reduction == "max" else 0
    return feats.new_empty((num_voxels, c)), feats.new_empty((rows, c), dtype=torch.int64)


def _reduce_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    feats, inverse, _num_voxels, reduction = inputs
    ctx.reduction = reduction
    ctx.num_points = feats.shape[0]
    ctx.save_for_backward(inverse, output[1])


def _reduce_backward(ctx: Any, grad: torch.Tensor, _grad_arg: Any) -> tuple[Any, ...]:
    inverse, arg = ctx.saved_tensors
    if ctx.reduction == "max":
        # Each (point, channel) is the argmax of at most one voxel; empty
        # voxels (-1) send their gradient to a discarded extra row.
        n = ctx.num_points
        index = torch.where(arg < 0, n, arg)
        out = grad.new_zeros((n + 1, grad.shape[1])).scatter_add_(0, index, grad)
        return out[:n], None, None, None
    per_point = grad.index_select(0, inverse)
    if ctx.reduction == "mean":
        count = torch.bincount(inverse, minlength=grad.shape[0]).clamp_min(1)
        per_point = per_point / count.index_select(0, inverse).unsqueeze(1).to(grad.dtype)
    return per_point, None, None, None


voxel_reduce.register_autograd(_reduce_backward, setup_context=_reduce_setup)


@torch.library.custom_op("lattice::devoxel_map", mutates_args=())
def devoxel_map(
    points: torch.Tensor,
    batch: torch.Tensor | None,
    voxel_size: list[float],
    origin: list[float],
    voxel_coords: torch.Tensor,
    trilinear: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``(P, k)`` int64 (-1 absent, or of weight 0) and float64 weights ``(P, k)`` of
    each point's voxel (``k = 1``) or 8 surrounding voxel centres (``k = 8``).
    See csrc/core/tl_voxel.h for the exact rule.  ``voxel_size`` and ``origin`` follow
    :func:`check_grid`; ``voxel_coords`` are non-negative ``(M, 4)`` int32 rows."""
    require_cpu("devoxel_map", points, voxel_coords)
    check_points("devoxel_map", points, batch)
    check_grid("devoxel_map", voxel_size, origin)
    check_coords("devoxel_map", "voxel_coords", voxel_coords)
    check_non_negative("devoxel_map", "voxel_coords", voxel_coords)
    check_devoxel_map_memory(points, batch, voxel_coords, 8 if trilinear else 1)
    points, voxel_coords = points.contiguous(), voxel_coords.contiguous()
    batch = None if batch is None else batch.contiguous()
    n, k = points.shape[0], 8 if trilinear else 1
    idx = torch.empty((n, k), dtype=torch.int64)
    w = torch.empty((n, k), dtype=torch.float64)
    st, bad = _C.voxel_devoxel_map(
        DTYPE_CODES[points.dtype],
        ptr(points),
        optional_ptr(batch),
        n,
        tuple(voxel_size),
        tuple(origin),
        ptr(voxel_coords),
        voxel_coords.shape[0],
        int(trilinear),
        ptr(idx),
        ptr(w),
        threads(),
    )
    if st != 0:
        raise point_error(points, batch, bad, st, voxel_size, origin)
    return drop_weightless_corners(idx, w)


def drop_weightless_corners(idx: torch.Tensor, w: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``devoxel_map``'s rows with -1 where a corner's weight is 0 (CPU and CUDA; ``idx`` is
    the kernel's own new output): such a corner contributes nothing, not even 0 * inf =
    NaN from a non-finite voxel beside the one a point sits at the centre of."""
    return idx.masked_fill_(w == 0, -1), w


@devoxel_map.register_fake
@one_device("devoxel_map")
def _(points, batch, voxel_size, origin, voxel_coords, trilinear):
    check_points("devoxel_map", points, batch)
    check_grid("devoxel_map", voxel_size, origin)
    check_coords("devoxel_map", "voxel_coords", voxel_coords)
    k = 8 if trilinear else 1
    n = points.shape[0]
    return (
        points.new_empty((n, k), dtype=torch.int64),
        points.new_empty((n, k), dtype=torch.float64),
    )


@torch.library.custom_op("lattice::devoxel_gather", mutates_args=())
def devoxel_gather(feats: torch.Tensor, idx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``(P, C)``: ``out[p] = sum_j weight[p, j] * feats[idx[p, j]]`` over ``idx >= 0``."""
    require_cpu("devoxel_gather", feats, idx, weight)
    check_devoxel_gather(feats, idx, weight)
    feats, idx, weight = feats.contiguous(), idx.contiguous(), weight.contiguous()
    m, c = feats.shape
    n, k = idx.shape
    out = torch.empty((n, c), dtype=feats.dtype)
    _C.voxel_gather(
        DTYPE_CODES[feats.dtype], ptr(feats), m, c, ptr(idx), ptr(weight), n, k, ptr(out), threads()
    )
    return out


@devoxel_gather.register_fake
@one_device("devoxel_gather")
def _(feats, idx, weight):
    check_devoxel_gather(feats, idx, weight)
    return feats.new_empty((idx.shape[0], feats.shape[1]))


def _gather_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    feats, idx, weight = inputs
    ctx.num_voxels = feats.shape[0]
    ctx.save_for_backward(idx, weight)


def _gather_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    idx, weight = ctx.saved_tensors
    present = idx >= 0
    rows = idx[present]
    contrib = (
        weight[present].to(grad.dtype).unsqueeze(1)
        * grad.unsqueeze(1).expand(-1, idx.shape[1], -1)[present]
    )
    out = grad.new_zeros((ctx.num_voxels, grad.shape[1])).index_add_(0, rows, contrib)
    return out, None, None


devoxel_gather.register_autograd(_gather_backward, setup_context=_gather_setup)
