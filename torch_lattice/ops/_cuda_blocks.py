"""Torch-side wrappers of the CUDA voxel, pooling and generative kernels (``csrc/cuda``).

Voxelize, voxel reductions, devoxelization maps and gathers, pooling and the
generative support on a CUDA device.  Each function checks the device (and the
feature dtype), allocates outputs and workspace with torch on the tensors'
device and passes raw pointers, the device index and
``torch.cuda.current_stream(device).cuda_stream`` to C.  The op layer
(:mod:`.voxel`, :mod:`.pooling`, :mod:`.kernel_map`) registers these as the
``"cuda"`` kernels of its custom ops; results equal the CPU ops' exactly in
order and integer outputs (see docs/cuda.md, "Building blocks").

Only sizes cross to the host: voxelize, devoxel_map and generative_support
each read back one small record (count and error flags).
"""

from __future__ import annotations

import torch

from torch_lattice.ops._cuda import _call_args, _check_coords, _workspace_alloc, require_cuda
from torch_lattice.ops._native import (
    _C,
    DTYPE_CODES,
    REDUCTION_CODES,
    compute_dtype,
    optional_ptr,
    ptr,
)

__all__ = [
    "devoxel_gather",
    "devoxel_map",
    "generative_support",
    "pool_max",
    "pool_max_backward",
    "pool_sum",
    "voxel_reduce",
    "voxelize",
]

_FEATURE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _feature_code(op: str, dtype: torch.dtype) -> int:
    """dtype code of CUDA features; TypeError naming the dtype otherwise."""
    compute_dtype(op, dtype)  # TypeError for non-floating dtypes, as on the CPU
    if dtype not in _FEATURE_DTYPES:
        raise TypeError(
            f"lattice::{op}: CUDA features must be float32, float64, float16 or bfloat16, "
            f"got {dtype}"
        )
    return DTYPE_CODES[dtype]


def _with_batch(points: torch.Tensor, batch: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    return (points,) if batch is None else (points, batch)


def voxelize(
    points: torch.Tensor,
    batch: torch.Tensor | None,
    voxel_size: list[float],
    origin: list[float],
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Unique voxel rows and inverse map, as ``lattice::voxelize_coords`` on CPU.

    Args:
        points: ``(P, 3)`` float32 or float64 on a CUDA device.
        batch: ``(P,)`` int64 or None.
        voxel_size, origin: three floats each.

    Returns:
        ``(uniq (M, 4) int32, inverse (P,) int64, status, bad)``; a non-zero
        status (a tl_status) names the first rejected point ``bad`` and the
        tensors are then meaningless.
    """
    device = require_cuda("voxelize_coords", *_with_batch(points, batch))
    points = points.contiguous()
    batch = None if batch is None else batch.contiguous()
    n = points.shape[0]
    uniq = torch.empty((n, 4), dtype=torch.int32, device=device)
    inverse = torch.empty((n,), dtype=torch.int64, device=device)
    index, stream = _call_args(device)
    st, bad, m = _C.cuda_voxelize(
        index,
        stream,
        DTYPE_CODES[points.dtype],
        ptr(points),
        optional_ptr(batch),
        n,
        tuple(voxel_size),
        tuple(origin),
        _workspace_alloc(device),
        ptr(uniq),
        ptr(inverse),
    )
    return uniq[:m].clone(), inverse, st, bad


def voxel_reduce(
    feats: torch.Tensor, inverse: torch.Tensor, num_voxels: int, reduction: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-voxel mean / sum / max, as ``lattice::voxel_reduce`` on CPU.

    Returns:
        ``(M, C)`` features in ``feats.dtype`` (fp32 accumulation for half types
        and fp32, fp64 for fp64) and the ``(M, C)`` int64 argmax for ``"max"``
        (``(0, C)`` otherwise).
    """
    device = require_cuda("voxel_reduce", feats, inverse)
    code = _feature_code("voxel_reduce", feats.dtype)
    feats, inverse = feats.contiguous(), inverse.contiguous()
    n, c = feats.shape
    red = REDUCTION_CODES[reduction]
    out = torch.empty((num_voxels, c), dtype=feats.dtype, device=device)
    arg_rows = num_voxels if reduction == "max" else 0
    arg = torch.empty((arg_rows, c), dtype=torch.int64, device=device)
    index, stream = _call_args(device)
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
        _workspace_alloc(device),
        ptr(out),
        ptr(arg),
    )
    return out, arg


def devoxel_map(
    points: torch.Tensor,
    batch: torch.Tensor | None,
    voxel_size: list[float],
    origin: list[float],
    voxel_coords: torch.Tensor,
    trilinear: bool,
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Point-to-voxel rows ``(P, k)`` int64 and float64 weights, as ``lattice::devoxel_map``.

    Returns:
        ``(idx, w, status, bad)``; a non-zero status names the first rejected point.

    Raises:
        ValueError: ``voxel_coords`` repeats a row (as on the CPU).
    """
    device = require_cuda("devoxel_map", *_with_batch(points, batch), voxel_coords)
    points, voxel_coords = points.contiguous(), voxel_coords.contiguous()
    batch = None if batch is None else batch.contiguous()
    n, k, m = points.shape[0], 8 if trilinear else 1, voxel_coords.shape[0]
    idx = torch.empty((n, k), dtype=torch.int64, device=device)
    w = torch.empty((n, k), dtype=torch.float64, device=device)
    index, stream = _call_args(device)
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
        _workspace_alloc(device),
        ptr(idx),
        ptr(w),
    )
    return idx, w, st, bad


def devoxel_gather(feats: torch.Tensor, idx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``(P, C)``: ``out[p] = sum_j weight[p, j] * feats[idx[p, j]]`` over ``idx >= 0``."""
    device = require_cuda("devoxel_gather", feats, idx, weight)
    code = _feature_code("devoxel_gather", feats.dtype)
    feats, idx, weight = feats.contiguous(), idx.contiguous(), weight.contiguous()
    m, c = feats.shape
    n, k = idx.shape
    out = torch.empty((n, c), dtype=feats.dtype, device=device)
    index, stream = _call_args(device)
    _C.cuda_devoxel_gather(
        index, stream, code, ptr(feats), m, c, ptr(idx), ptr(weight), n, k, ptr(out)
    )
    return out


def pool_sum(
    feats: torch.Tensor, nbr: torch.Tensor, rev: torch.Tensor, average: bool
) -> torch.Tensor:
    """``(N_out, C)`` sum (or average) pooling over ``nbr``, as ``lattice::pool_sum``."""
    op = "pool_avg" if average else "pool_sum"
    device = require_cuda(op, feats, nbr, rev)
    code = _feature_code(op, feats.dtype)
    x, nbr = feats.contiguous(), nbr.contiguous()
    y = torch.empty((nbr.shape[0], x.shape[1]), dtype=x.dtype, device=device)
    index, stream = _call_args(device)
    _C.cuda_pool_sum(
        index,
        stream,
        code,
        x.shape[0],
        nbr.shape[0],
        nbr.shape[1],
        x.shape[1],
        ptr(x),
        ptr(nbr),
        int(average),
        ptr(y),
        0,
    )
    return y


def pool_max(
    feats: torch.Tensor, nbr: torch.Tensor, rev: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N_out, C)`` maxima and int32 argmax rows, as ``lattice::pool_max``."""
    device = require_cuda("pool_max", feats, nbr, rev)
    code = _feature_code("pool_max", feats.dtype)
    x, nbr = feats.contiguous(), nbr.contiguous()
    shape = (nbr.shape[0], x.shape[1])
    y = torch.empty(shape, dtype=x.dtype, device=device)
    arg = torch.empty(shape, dtype=torch.int32, device=device)
    index, stream = _call_args(device)
    _C.cuda_pool_max(
        index,
        stream,
        code,
        x.shape[0],
        nbr.shape[0],
        nbr.shape[1],
        x.shape[1],
        ptr(x),
        ptr(nbr),
        0,
        ptr(y),
        ptr(arg),
    )
    return y, arg


def pool_max_backward(grad: torch.Tensor, rev: torch.Tensor, argmax: torch.Tensor) -> torch.Tensor:
    """``(N_in, C)``: each output's gradient sent to the input row of its maximum."""
    device = require_cuda("pool_max_backward", grad, rev, argmax)
    code = _feature_code("pool_max_backward", grad.dtype)
    dy, rev, argmax = grad.contiguous(), rev.contiguous(), argmax.contiguous()
    dx = torch.empty((rev.shape[0], dy.shape[1]), dtype=dy.dtype, device=device)
    index, stream = _call_args(device)
    _C.cuda_pool_max_backward(
        index,
        stream,
        code,
        rev.shape[0],
        dy.shape[0],
        rev.shape[1],
        dy.shape[1],
        ptr(dy),
        ptr(rev),
        0,
        ptr(dx),
        ptr(argmax),
    )
    return dx


def generative_support(
    coords: torch.Tensor, kernel_size: list[int], stride: list[int]
) -> torch.Tensor:
    """``unique{coords * stride + r}`` sorted, as ``lattice::generative_support`` on CPU."""
    device = require_cuda("generative_support", coords)
    coords = _check_coords("generative_support", "coords", coords)
    geom = (tuple(kernel_size), tuple(stride), (0, 0, 0), (1, 1, 1))
    n = coords.shape[0]
    cap = n * kernel_size[0] * kernel_size[1] * kernel_size[2]
    out = torch.empty((cap, 4), dtype=torch.int32, device=device)
    index, stream = _call_args(device)
    alloc = _workspace_alloc(device)
    m = _C.cuda_generative(index, stream, ptr(coords), n, geom, alloc, ptr(out), cap)
    return out[:m].clone()
