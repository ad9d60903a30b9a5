"""Functional sparse pooling: windowed (max / average / sum), its transposes
(average-pooling transpose, normalized trilinear upsampling) and global.

Windowed pooling follows :func:`~torch_lattice.nn.functional.conv3d`'s geometry
exactly: the output support is the coordinate manager's generated support for
the same ``(kernel_size, stride, padding, dilation)`` and the relation is its
kernel map, so a pooling layer and a convolution with the same geometry share
one cached support and one cached map.  Each output row pools over the kernel
rows whose input exists (never over absent rows, so an average divides by the
number of present inputs).

The transposes follow the MLX Lattice artifact contract (``lattice.pool_transpose3d``,
``lattice.trilinear_upsample3d``, ``lattice.global_pool``) so that artifacts replay
exactly: see docs/building-blocks.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product

import torch

from torch_lattice.coord_rows import lookup_rows
from torch_lattice.geometry import ConvGeometry, kernel_positions, triple
from torch_lattice.memory_budget import check_allocation, check_output
from torch_lattice.nn.functional.conv_transpose import resolve_target
from torch_lattice.nn.functional.relation import kernel_map, transpose_pairs
from torch_lattice.nn.functional.supports import (
    cached_source_support,
    generated_support,
    generated_transposed_support,
)
from torch_lattice.ops._runtime import compute_dtype, refuse_function_transforms
from torch_lattice.ops.kmap import KernelMap, sparse_table
from torch_lattice.ops.pool import pool_avg, pool_max, pool_sum
from torch_lattice.tensor import SparseTensor, Support

__all__ = [
    "avg_pool3d",
    "global_avg_pool",
    "global_max_pool",
    "global_pool",
    "max_pool3d",
    "pool_geometry",
    "pool_transpose3d",
    "sum_pool3d",
    "trilinear_upsample3d",
]

IntOr3 = int | Sequence[int]


def pool_geometry(
    kernel_size: IntOr3, stride: IntOr3 | None = None, padding: IntOr3 = 0, dilation: IntOr3 = 1
) -> ConvGeometry:
    """Normalizes pooling arguments; ``stride=None`` means ``kernel_size`` (as in torch)."""
    return ConvGeometry.create(
        kernel_size, kernel_size if stride is None else stride, padding, dilation
    )


def _check_sparse(x: object, name: str) -> SparseTensor:
    if not isinstance(x, SparseTensor):
        raise TypeError(f"{name} must be a torch_lattice.SparseTensor, got {type(x).__name__}")
    return x


def pool_over_map(feats: torch.Tensor, kmap: KernelMap, mode: str) -> torch.Tensor:
    """``(N_out, C)``: per output row of ``kmap``, the max (``"max"``), mean (``"avg"``)
    or sum (any other mode) of ``feats`` over its present kernel rows (0 if none)."""
    refuse_function_transforms("pooling", feats)
    # max pooling also keeps an int64 argmax per output value
    check_output(f"{mode} pooling", int(kmap.nbr.shape[0]), feats, 3 if mode == "max" else 1)
    if mode == "max":
        return pool_max(feats, kmap.nbr, kmap.rev)[0]
    if mode == "avg":
        return pool_avg(feats, kmap.nbr, kmap.rev)
    return pool_sum(feats, kmap.nbr, kmap.rev)


def _pool(x: SparseTensor, geometry: ConvGeometry, mode: str) -> SparseTensor:
    _check_sparse(x, "input")
    if geometry.is_identity:
        return SparseTensor.from_support(x.feats, x.support)
    target = generated_support(x.support, geometry)
    kmap = kernel_map(x.support, target, geometry)
    return SparseTensor.from_support(pool_over_map(x.feats, kmap, mode), target)


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


def _transpose_target(
    x: SparseTensor, target: SparseTensor | None, geometry: ConvGeometry
) -> Support | None:
    """``target``'s support, checked: stride ``x.stride / stride``, same device."""
    if target is not None:
        _check_sparse(target, "target")
    return resolve_target(x, target, geometry.stride)


def pool_transpose3d(
    input: SparseTensor,
    kernel_size: IntOr3,
    stride: IntOr3 | None = None,
    padding: IntOr3 = 0,
    dilation: IntOr3 = 1,
    target: SparseTensor | None = None,
    *,
    expand_coordinates: bool = False,
) -> SparseTensor:
    """Sparse average-pooling transpose (``lattice.pool_transpose3d``).

    ``y[t] = mean of x[i] over the rows i with input[i]*stride + r*dilation - padding == t``
    for some kernel position ``r`` (present rows only; 0 where none reaches ``t``).

    Args:
        input: coarse SparseTensor.
        kernel_size, stride, padding, dilation: the pooling geometry (``stride=None``
            means ``kernel_size``); the output stride is ``input.stride / stride``.
        target: the fine support to compute, in its order (stride ``input.stride /
            stride``). None: the input support of the pooling / Conv3d with this
            geometry that produced ``input`` when one is cached (for a 1x1x1 stride-1
            geometry, ``input``'s own rows in order), else the generated support
            ``unique{input*stride + r*dilation - padding}`` sorted by (b, x, y, z).
        expand_coordinates: without a target, always the generated support (the
            artifact contract's no-target route, which never consults a cache).

    Raises:
        TypeError: ``input`` or ``target`` is not a SparseTensor, ``expand_coordinates``
            not a bool.
        ValueError: bad geometry, a stride that does not divide ``input.stride``, a
            target of another stride or device, or a generated coordinate below 0.
    """
    x = _check_sparse(input, "input")
    if not isinstance(expand_coordinates, bool):
        raise TypeError(f"expand_coordinates must be a bool, got {expand_coordinates!r}")
    geometry = pool_geometry(kernel_size, stride, padding, dilation)
    support = _transpose_target(x, target, geometry)
    if support is None and not expand_coordinates and geometry.is_identity:
        # A 1x1x1 stride-1 pooling keeps its support: its input is the input's rows, in
        # order, as conv_transpose3d's identity route returns.
        support = x.support
    if support is None and not expand_coordinates:
        # A recorded derivation has a stride divisible by geometry.stride; without one,
        # generated_transposed_support checks it.
        support = cached_source_support(x, geometry)
    if support is None:
        support = generated_transposed_support(x, geometry, "pool_transpose3d")
        # the sums and their quotient (covers the map route's one block, below)
        check_output("pool_transpose3d", 2 * support.num_rows, x.feats)
        y = _average_onto_generated(x, support, geometry)
        if y is not None:
            return SparseTensor.from_support(y, support)
    else:
        check_output("pool_transpose3d", support.num_rows, x.feats)
    kmap = kernel_map(support, x.support, geometry)
    # The fine -> coarse forward map read backwards: rev lists, per fine row, the
    # coarse rows reaching it, so the average over them is pool_avg on rev.
    refuse_function_transforms("pool_transpose3d", x.feats)
    y = pool_avg(x.feats, kmap.rev, kmap.nbr)
    return SparseTensor.from_support(y, support)


def _average_onto_generated(
    x: SparseTensor, fine: Support, geometry: ConvGeometry
) -> torch.Tensor | None:
    """The pooling transpose onto the support it generated, over pair lists built
    without the ``(N_fine, K)`` table, where that table would be mostly empty
    (``sparse_table``; CPU only, CUDA keeps the kernel-map route); else None.

    Each fine row averages its sources in kernel-row order, as ``pool_avg`` does, and
    autograd differentiates the gather, scatter-add and division directly.
    """
    if x.feats.device.type != "cpu" or not sparse_table(x.support.num_rows, fine.num_rows):
        return None
    _, pair_in, pair_out = transpose_pairs(fine, x.support, geometry)
    work = compute_dtype("pool_transpose3d", x.feats.dtype)
    pairs, channels = int(pair_in.shape[0]), int(x.feats.shape[1])
    check_allocation(
        f"pool_transpose3d over {pairs} pairs x {channels} channels (gathered rows)",
        pairs * (channels * torch.empty((), dtype=work).element_size() + 16),
    )
    rows = pair_out.long()
    count = torch.bincount(rows, minlength=fine.num_rows).clamp_min(1).to(work)
    gathered = x.feats.to(work).index_select(0, pair_in.long())
    y = gathered.new_zeros((fine.num_rows, channels)).index_add(0, rows, gathered)
    return (y / count[:, None]).to(x.feats.dtype)


def upsample_geometry(stride: IntOr3) -> ConvGeometry:
    """The relation of trilinear upsampling by ``stride``: kernel ``2s - 1``,
    padding ``s - 1``, so fine ``t`` meets coarse ``c`` iff ``|t - c*s| < s`` per axis."""
    s = triple("stride", stride, 1)
    return ConvGeometry.create(tuple(2 * v - 1 for v in s), s, tuple(v - 1 for v in s), 1)


def trilinear_weights(geometry: ConvGeometry, like: torch.Tensor) -> torch.Tensor:
    """``(K,)`` weights ``prod_axis(1 - |r - (s - 1)| / s)`` in kernel-row order."""
    r = kernel_positions(geometry.kernel_size).to(torch.float64)
    s = torch.tensor(geometry.stride, dtype=torch.float64)
    w = (1.0 - (r - (s - 1)).abs() / s).prod(dim=1)
    return w.to(dtype=like.dtype, device=like.device)


def trilinear_upsample3d(
    input: SparseTensor, stride: IntOr3, target: SparseTensor | None = None
) -> SparseTensor:
    """Normalized trilinear upsampling (``lattice.trilinear_upsample3d``).

    ``y[t] = sum_n w_n x[c_n] / sum_n w_n`` over the present coarse rows ``c_n`` with
    ``t = c_n*stride + r_n - (stride - 1)``, ``0 <= r_n < 2*stride - 1``, and
    ``w_n = prod_axis(1 - |r_n - (stride - 1)| / stride)``: the weights are renormalized
    over the neighbours present, so missing ones do not fade the result; 0 where none.

    Args:
        input: coarse SparseTensor.
        stride: int or 3-tuple; the output stride is ``input.stride / stride``.
        target: the fine support to compute, in its order; None: the generated support
            ``unique{input*stride + r - (stride - 1)}`` sorted by (b, x, y, z), which
            raises when an input row sits at coordinate 0 on an axis with stride > 1
            (a negative coordinate), so pass the target there.

    Raises:
        TypeError: as :func:`pool_transpose3d`.
        ValueError: as :func:`pool_transpose3d`.
    """
    x = _check_sparse(input, "input")
    geometry = upsample_geometry(stride)
    support = _transpose_target(x, target, geometry)
    if support is None:
        support = generated_transposed_support(x, geometry, "trilinear_upsample3d")
    support.check_unchanged()
    n = support.num_rows
    # Half types weigh, sum and divide in float32, rounded once at the end, as
    # pool_transpose3d and the global pools do (in the half type each step rounded).
    work = compute_dtype("trilinear_upsample3d", x.feats.dtype)
    feats = x.feats.to(work)
    check_output("trilinear_upsample3d", 2 * n, feats)  # the sums and the quotient
    fine, coarse, w = _trilinear_pairs(support, x, geometry.stride, feats)
    check_output("trilinear_upsample3d gathered rows", int(fine.shape[0]), feats, 2)
    num = feats.new_zeros((n, feats.shape[1])).index_add(
        0, fine, feats.index_select(0, coarse) * w[:, None]
    )
    den = w.new_zeros(n).index_add(0, fine, w)
    y = torch.where(den[:, None] > 0, num / den.clamp_min(torch.finfo(w.dtype).tiny)[:, None], num)
    return SparseTensor.from_support(y.to(x.feats.dtype), support)


# The 8 coarse neighbours of a fine row, in kernel-row order (z fastest): kernel row
# r = t - c*s + (s - 1) grows as c shrinks, so the upper neighbour c = floor(t/s) + 1
# comes first on each axis.
_CORNERS = tuple(product((1, 0), repeat=3))


def _trilinear_pairs(fine: Support, x: SparseTensor, stride: tuple[int, int, int],
                     like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(fine row, coarse row, weight)`` of every present pair, fine rows ascending.

    A fine ``t`` meets coarse ``c`` iff ``|t - c*s| < s`` per axis, so ``c`` is
    ``floor(t/s)`` or, when ``s`` does not divide ``t``, ``floor(t/s) + 1``: at most 8
    pairs per fine row. Looking those up grows with the real pairs, where the
    ``(N_fine, (2s - 1)^3)`` neighbour table of the relation grew with the cube of the
    stride (stride 40 asked for 972 GB). The pairs and weights, in the table's
    kernel-row order, are those of that table, so the sums are the same.
    """
    t = fine.coords.to(torch.int64)
    n = t.shape[0]
    # int64 queries, their lookup keys and the per-corner weights, before any is made.
    check_allocation(f"trilinear_upsample3d pairs ({n} fine rows x 8 neighbours)", n * 8 * 120)
    s = torch.tensor(stride, dtype=torch.int64, device=t.device)
    base = torch.div(t[:, 1:], s, rounding_mode="floor")
    rem = t[:, 1:] - base * s
    queries, weights = [], []
    for corner in _CORNERS:
        d = torch.tensor(corner, dtype=torch.int64, device=t.device)
        c = base + d
        # Only c = floor(t/s) + 1 can be out of reach: when t is a multiple of s.
        reach = ((d == 0) | (rem > 0)).all(dim=1)
        queries.append(torch.where(reach[:, None], torch.cat([t[:, :1], c], dim=1), -1))
        gap = (t[:, 1:] - c * s).abs().to(torch.float64) / s.to(torch.float64)
        weights.append((1.0 - gap).prod(dim=1))
    rows = lookup_rows(x.coords.to(torch.int64), torch.stack(queries, dim=1).reshape(-1, 4))
    rows = rows.reshape(n, len(_CORNERS))
    pair_fine, pair_corner = torch.nonzero(rows >= 0, as_tuple=True)
    w = torch.stack(weights, dim=1)[pair_fine, pair_corner].to(dtype=like.dtype,
                                                                device=like.device)
    return pair_fine, rows[pair_fine, pair_corner], w


_GLOBAL_MODES = ("sum", "avg", "max")


def _batch_count(x: SparseTensor, batch_size: int | None) -> int:
    inferred = x.support.num_batches()
    if batch_size is None:
        return inferred
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"batch_size must be an int or None, got {batch_size!r}")
    if batch_size < inferred:
        raise ValueError(
            f"batch_size {batch_size} is smaller than the input's batch count {inferred} "
            "(spatial_range[0], else the largest batch index + 1)"
        )
    return batch_size


def _global(x: SparseTensor, mode: str, batch_size: int | None, empty_max: str) -> torch.Tensor:
    if mode not in _GLOBAL_MODES:
        raise ValueError(f"mode must be one of {_GLOBAL_MODES}, got {mode!r}")
    b = _batch_count(_check_sparse(x, "input"), batch_size)
    feats = x.feats
    # The output has a row per batch index up to the largest: one row at batch
    # 2^31 - 1 asks for 2^31 rows, so the size is checked before anything is made.
    check_allocation(
        f"global_pool of {b} batches x {feats.shape[1]} channels (batch_size, else the "
        "largest batch index + 1)",
        b * (max(1, int(feats.shape[1])) * feats.element_size() + 8),
    )
    batch = x.coords[:, 0].long()
    count = torch.bincount(batch, minlength=b)
    if mode != "max":
        # Half types sum and divide in float32, rounded once at the end: a float16
        # row count or sum overflows past 65504 (a 70k-row batch averaged to 0, or
        # inf / NaN, while its mean is representable). float32 sums in float64: added
        # one row at a time in float32, a 100k-row batch's mean was 3.7e-5 off where
        # torch's pairwise mean is 2e-7 off.
        work = (torch.float64 if feats.dtype == torch.float32
                else compute_dtype("global_pool", feats.dtype))
        if work != feats.dtype:
            rows, channels = int(feats.shape[0]), int(feats.shape[1])
            check_allocation(
                f"global_pool of {rows} rows x {channels} channels, summed in {work}",
                rows * channels * torch.empty((), dtype=work).element_size(),
            )
        sums = feats.new_zeros((b, feats.shape[1]), dtype=work)
        sums = sums.index_add(0, batch, feats.to(work))
        if mode == "avg":
            sums = sums / count.clamp_min(1).to(work).unsqueeze(1)
        return sums.to(feats.dtype)
    if empty_max == "raise" and b and bool((count == 0).any()):
        empty = int(torch.nonzero(count == 0)[0, 0])
        raise ValueError(
            f"global_pool(mode='max') needs a row in every batch; batch {empty} of {b} has none"
        )
    index = batch.unsqueeze(1).expand_as(feats)
    out = feats.new_zeros((b, feats.shape[1]))
    return out.scatter_reduce(0, index, feats, reduce="amax", include_self=False)


def global_pool(
    input: SparseTensor, mode: str = "sum", batch_size: int | None = None
) -> torch.Tensor:
    """``(B, C)`` per-batch reduction of the rows (``lattice.global_pool``).

    Args:
        input: SparseTensor.
        mode: ``"sum"``, ``"avg"`` (sum / row count; 0 for a batch without rows) or
            ``"max"`` (every batch must have a row).
        batch_size: B; None: ``spatial_range[0]`` when set, else ``max(batch) + 1``
            (0 for an empty tensor). Larger values add trailing batches.

    Raises:
        TypeError: ``input`` is not a SparseTensor, ``batch_size`` not an int.
        ValueError: unknown mode, ``batch_size`` below the input's batch count, or
            ``"max"`` over a batch without rows.
    """
    return _global(input, mode, batch_size, empty_max="raise")


def global_avg_pool(input: SparseTensor) -> torch.Tensor:
    """``(B, C)`` mean of each batch's rows: ``global_pool(input, "avg")``.  B is
    ``spatial_range[0]`` when set, else ``max(batch) + 1``; batches without rows give zeros."""
    return _global(input, "avg", None, empty_max="raise")


def global_max_pool(input: SparseTensor) -> torch.Tensor:
    """``(B, C)`` maximum of each batch's rows (B as in :func:`global_avg_pool`):
    ``global_pool(input, "max")`` where that is defined; unlike it, a batch without rows
    gives zeros here (the module's behaviour since 0.1)."""
    return _global(input, "max", None, empty_max="zeros")
