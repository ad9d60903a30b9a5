"""CUDA kernels of the voxel ops (``csrc/cuda/tl_cuda_voxel.cu``, ``_C.cuda_*``).

Voxelize, voxel reductions, devoxelization maps and gathers on a CUDA device,
registered here as the ``"cuda"`` kernels of the ops in
:mod:`torch_lattice.ops.voxel`; results equal the CPU ops' exactly in order and
integer outputs (docs/cuda.md).  Each kernel checks the device (and the feature
dtype), allocates outputs and workspace with torch on the tensors' device and
passes raw pointers, the device index and torch's current stream to C.  Only
sizes cross to the host: voxelize and devoxel_map each read back one small
record (count and error flags).
"""

from __future__ import annotations

import torch

from torch_lattice.ops import voxel
from torch_lattice.ops._runtime import (
    _C,
    DTYPE_CODES,
    REDUCTION_CODES,
    call_args,
    check_coords,
    check_non_negative,
    cuda_feature_code,
    optional_ptr,
    ptr,
    require_cuda,
    workspace_alloc,
)

__all__ = ["devoxel_gather", "devoxel_map", "voxel_reduce", "voxelize_coords"]


def _with_batch(points: torch.Tensor, batch: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    return (points,) if batch is None else (points, batch)


@voxel.voxelize_coords.register_kernel("cuda")
def voxelize_coords(
    points: torch.Tensor,
    batch: torch.Tensor | None,
    voxel_size: list[float],
    origin: list[float],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique voxel rows ``(M, 4)`` int32 and the ``(P,)`` int64 inverse map, as
    ``lattice::voxelize_coords`` on CPU, with the same error for a rejected point.

    Args:
        points: ``(P, 3)`` float32 or float64 on a CUDA device.
        batch: ``(P,)`` int64 or None.
        voxel_size, origin: three floats each.
    """
    voxel.check_points("voxelize_coords", points, batch)
    voxel.check_grid("voxelize_coords", voxel_size, origin)
    voxel.check_voxelize_memory(points, batch)
    device = require_cuda("voxelize_coords", *_with_batch(points, batch))
    points = points.contiguous()
    batch = None if batch is None else batch.contiguous()
    n = points.shape[0]
    uniq = torch.empty((n, 4), dtype=torch.int32, device=device)
    inverse = torch.empty((n,), dtype=torch.int64, device=device)
    alloc = workspace_alloc(device)
    index, stream = call_args(device)
    st, bad, m = _C.cuda_voxelize(
        index,
        stream,
        DTYPE_CODES[points.dtype],
        ptr(points),
        optional_ptr(batch),
        n,
        tuple(voxel_size),
        tuple(origin),
        alloc,
        ptr(uniq),
        ptr(inverse),
    )
    if st != 0:
        raise voxel.point_error(points, batch, bad, st, voxel_size, origin)
    return uniq[:m].clone(), inverse


@voxel.voxel_reduce.register_kernel("cuda")
def voxel_reduce(
    feats: torch.Tensor, inverse: torch.Tensor, num_voxels: int, reduction: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-voxel mean / sum / max, as ``lattice::voxel_reduce`` on CPU.

    Returns:
        ``(M, C)`` features in ``feats.dtype`` (fp32 accumulation for half types
        and fp32, fp64 for fp64) and the ``(M, C)`` int64 argmax for ``"max"``
        (``(0, C)`` otherwise).
    """
    voxel.check_voxel_reduce(feats, inverse, num_voxels, reduction)
    device = require_cuda("voxel_reduce", feats, inverse)
    code = cuda_feature_code("voxel_reduce", feats.dtype)
    feats, inverse = feats.contiguous(), inverse.contiguous()
    n, c = feats.shape
    red = REDUCTION_CODES[reduction]
    out = torch.empty((num_voxels, c), dtype=feats.dtype, device=device)
    arg_rows = num_voxels if reduction == "max" else 0
    arg = torch.empty((arg_rows, c), dtype=torch.int64, device=device)
    if c == 0:  # nothing to reduce (as on the CPU: no per-voxel workspace)
        return out, arg
    alloc = workspace_alloc(device)
    index, stream = call_args(device)
    _C.cuda_voxel_reduce(
        index,
        stream,
        code,
        red,
        ptr(feats),
        n,
        c,
        ptr(inverse),
        num_voxels,
        alloc,
        ptr(out),
        ptr(arg),
    )
    return out, arg


@voxel.devoxel_map.register_kernel("cuda")
def devoxel_map(
    points: torch.Tensor,
    batch: torch.Tensor | None,
    voxel_size: list[float],
    origin: list[float],
    voxel_coords: torch.Tensor,
    trilinear: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Point-to-voxel rows ``(P, k)`` int64 and float64 weights, as ``lattice::devoxel_map``.

    Raises:
        ValueError: a rejected point, or ``voxel_coords`` repeats a row (as on the CPU).
    """
    voxel.check_points("devoxel_map", points, batch)
    voxel.check_grid("devoxel_map", voxel_size, origin)
    check_coords("devoxel_map", "voxel_coords", voxel_coords)
    device = require_cuda("devoxel_map", *_with_batch(points, batch), voxel_coords)
    check_non_negative("devoxel_map", "voxel_coords", voxel_coords)
    voxel.check_devoxel_map_memory(points, batch, voxel_coords, 8 if trilinear else 1)
    points, voxel_coords = points.contiguous(), voxel_coords.contiguous()
    batch = None if batch is None else batch.contiguous()
    n, k, m = points.shape[0], 8 if trilinear else 1, voxel_coords.shape[0]
    idx = torch.empty((n, k), dtype=torch.int64, device=device)
    w = torch.empty((n, k), dtype=torch.float64, device=device)
    alloc = workspace_alloc(device)
    index, stream = call_args(device)
    st, bad = _C.cuda_devoxel_map(
        index,
        stream,
        DTYPE_CODES[points.dtype],
        ptr(points),
        optional_ptr(batch),
        n,
        tuple(voxel_size),
        tuple(origin),
        ptr(voxel_coords),
        m,
        int(trilinear),
        alloc,
        ptr(idx),
        ptr(w),
    )
    if st != 0:
        raise voxel.point_error(points, batch, bad, st, voxel_size, origin)
    return voxel.drop_weightless_corners(idx, w)


@voxel.devoxel_gather.register_kernel("cuda")
def devoxel_gather(feats: torch.Tensor, idx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``(P, C)``: ``out[p] = sum_j weight[p, j] * feats[idx[p, j]]`` over ``idx >= 0``."""
    voxel.check_devoxel_gather(feats, idx, weight)
    device = require_cuda("devoxel_gather", feats, idx, weight)
    code = cuda_feature_code("devoxel_gather", feats.dtype)
    feats, idx, weight = feats.contiguous(), idx.contiguous(), weight.contiguous()
    m, c = feats.shape
    n, k = idx.shape
    out = torch.empty((n, c), dtype=feats.dtype, device=device)
    index, stream = call_args(device)
    _C.cuda_devoxel_gather(
        index, stream, code, ptr(feats), m, c, ptr(idx), ptr(weight), n, k, ptr(out)
    )
    return out
