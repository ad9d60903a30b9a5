"""Coordinate-aligned algebra across different supports: :func:`reindex_sparse`,
:func:`sparse_cat` and :func:`sparse_binary` (the artifact contract's
``lattice.sparse.reindex``, ``sparse.cat`` and ``sparse.binary``).

Rows are matched by equal ``[batch, x, y, z]`` on one lattice (equal strides).
When both operands have equal supports (see :func:`~torch_lattice.sparse_ops.same_support`)
the result keeps the left operand's support and order.  Otherwise the result's rows are
the join of the two row sets sorted by ``(b, x, y, z)``, exactly as torch-lattice 0.5
orders them, so artifacts written by it replay row for row:

=========  ==================================
join       rows kept
=========  ==================================
inner      in both operands
left       in the left operand
right      in the right operand
outer      in either operand
=========  ==================================
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from torch_lattice.coord_rows import lookup_rows, unique_rows
from torch_lattice.memory_budget import check_output
from torch_lattice.sparse_ops import same_support
from torch_lattice.tensor import SparseTensor, Support, check_same_dtype

__all__ = ["JOINS", "OPS", "reindex_sparse", "sparse_binary", "sparse_cat"]

JOINS = ("inner", "left", "right", "outer")
OPS = ("add", "sub", "mul", "maximum", "minimum")


@dataclass(frozen=True)
class _Alignment:
    """Joined rows and, per row, the row of each operand holding it (-1: absent)."""

    support: Support
    lhs_rows: torch.Tensor
    rhs_rows: torch.Tensor


def _check_sparse(op: str, name: str, x: object) -> SparseTensor:
    if not isinstance(x, SparseTensor):
        raise TypeError(f"{op}: {name} must be a SparseTensor, got {type(x).__name__}")
    return x


def _check_compatible(op: str, a: SparseTensor, b: SparseTensor, names: tuple[str, str]) -> None:
    """Same lattice (stride), device, feature dtype and spatial_range (so batches agree)."""
    first, second = names
    if a.stride != b.stride:
        raise ValueError(f"{op}: {first} stride {a.stride} differs from {second} stride {b.stride}")
    if a.device != b.device or a.coords.device != b.coords.device:
        raise ValueError(f"{op}: {first} is on {a.device} but {second} on {b.device}")
    if a.spatial_range != b.spatial_range:
        raise ValueError(
            f"{op}: {first} spatial_range {a.spatial_range} differs from {second} "
            f"spatial_range {b.spatial_range} (batch counts and extents must agree)"
        )


def _check_join(op: str, join: object) -> str:
    if not isinstance(join, str) or join not in JOINS:
        raise ValueError(f"{op}: join must be one of {JOINS}, got {join!r}")
    return join


def _check_fill(op: str, name: str, fill: object) -> float:
    if isinstance(fill, bool) or not isinstance(fill, int | float):
        raise TypeError(f"{op}: {name} must be a float, got {type(fill).__name__}")
    try:
        value = float(fill)
    except OverflowError:
        raise ValueError(
            f"{op}: {name} must be within the float range (|{name}| <= {sys.float_info.max:.4g}, "
            "or float('inf')), got an int of "
            f"{fill.bit_length()} bits"  # type: ignore[union-attr]
        ) from None
    if math.isnan(value):
        raise ValueError(f"{op}: {name} must not be NaN")
    return value


def _reuse(coords: torch.Tensor, *candidates: SparseTensor) -> Support | None:
    """An operand's support when ``coords`` equals its rows in order (keeps maps cached)."""
    for t in candidates:
        if t.coords.shape == coords.shape and torch.equal(t.coords, coords):
            return t.support
    return None


def _align(lhs: SparseTensor, rhs: SparseTensor, join: str) -> _Alignment:
    """Rows of the ``join`` of both row sets, sorted by (b, x, y, z)."""
    n = lhs.coords.shape[0]
    device = lhs.coords.device
    unique, inverse = unique_rows(torch.cat((lhs.coords, rhs.coords)))
    lhs_rows = torch.full((unique.shape[0],), -1, dtype=torch.long, device=device)
    rhs_rows = torch.full_like(lhs_rows, -1)
    lhs_rows[inverse[:n]] = torch.arange(n, device=device)
    rhs_rows[inverse[n:]] = torch.arange(rhs.coords.shape[0], device=device)
    in_lhs, in_rhs = lhs_rows >= 0, rhs_rows >= 0
    keep = {
        "inner": in_lhs & in_rhs,
        "left": in_lhs,
        "right": in_rhs,
        "outer": in_lhs | in_rhs,
    }[join]
    rows = torch.nonzero(keep).flatten()
    coords = unique[rows].to(torch.int32).contiguous()
    support = _reuse(coords, lhs, rhs)
    if support is None:
        support = lhs.coordinate_manager.new_support(coords, lhs.stride, lhs.spatial_range)
    return _Alignment(support, lhs_rows[rows], rhs_rows[rows])


def _gather(feats: torch.Tensor, rows: torch.Tensor, fill: float) -> torch.Tensor:
    """``feats[rows]`` with ``fill`` where ``rows == -1`` (gradients reach present rows)."""
    if feats.shape[0] == 0:  # nothing to pick; still a result of feats' graph
        return feats.new_full((rows.shape[0], feats.shape[1]), fill) + feats.sum(dim=0)
    picked = feats.index_select(0, rows.clamp_min(0))
    present = (rows >= 0).unsqueeze(1)
    return torch.where(present, picked, picked.new_full((), fill))


def reindex_sparse(input: SparseTensor, target: SparseTensor, fill: float = 0.0) -> SparseTensor:
    """``input``'s features on exactly ``target``'s rows, order, stride and range.

    Row ``t`` of the result holds ``input``'s features at ``target.coords[t]``, or
    ``fill`` in every channel when ``input`` has no such row; ``input`` rows missing
    from ``target`` are dropped. Channels are ``input``'s; the result shares
    ``target``'s support (and its cached kernel maps).

    Raises:
        TypeError: an argument is not a SparseTensor; ``fill`` not a number.
        ValueError: different strides, devices or spatial ranges; ``fill`` is NaN;
            (a ``MemoryBudgetError``) the output (with the gathered rows) beyond the
            memory budget, e.g. of features expanded to billions of channels.
    """
    op = "reindex_sparse"
    x = _check_sparse(op, "input", input)
    t = _check_sparse(op, "target", target)
    _check_compatible(op, x, t, ("input", "target"))
    value = _check_fill(op, "fill", fill)
    if same_support(x, t):
        return SparseTensor.from_support(x.feats, t.support)
    # the gathered rows and the filled result
    check_output(op, len(t), x.feats, 2)
    rows = lookup_rows(x.coords, t.coords)
    return SparseTensor.from_support(_gather(x.feats, rows, value), t.support)


def _cat_pair(lhs: SparseTensor, rhs: SparseTensor, join: str) -> SparseTensor:
    channels = int(lhs.feats.shape[1]) + int(rhs.feats.shape[1])
    if same_support(lhs, rhs):
        check_output("sparse_cat", len(lhs), lhs.feats, channels=channels)
        return SparseTensor.from_support(torch.cat((lhs.feats, rhs.feats), dim=1), lhs.support)
    a = _align(lhs, rhs, join)
    # both gathered operands and their concatenation
    check_output("sparse_cat", int(a.lhs_rows.shape[0]), lhs.feats, 2, channels=channels)
    feats = torch.cat((_gather(lhs.feats, a.lhs_rows, 0.0), _gather(rhs.feats, a.rhs_rows, 0.0)), 1)
    return SparseTensor.from_support(feats, a.support)


def sparse_cat(inputs: Sequence[SparseTensor], join: str = "inner") -> SparseTensor:
    """Channel concatenation of tensors on one lattice, rows aligned by coordinate.

    Folds left: ``cat(cat(x0, x1), x2) ...``; each step keeps the left support when
    the supports are equal, else the ``join`` of both row sets sorted by (b, x, y, z).
    A row absent from an operand gets zeros in that operand's channels.

    Raises:
        TypeError: ``inputs`` is not a list/tuple of SparseTensors; feature dtypes differ.
        ValueError: empty ``inputs``, unknown ``join``, different strides, devices or
            spatial ranges.
    """
    op = "sparse_cat"
    if isinstance(inputs, SparseTensor) or not isinstance(inputs, Sequence):
        raise TypeError(f"{op}: inputs must be a list or tuple of SparseTensors")
    if len(inputs) == 0:
        raise ValueError(f"{op}: inputs must not be empty")
    _check_join(op, join)
    out = _check_sparse(op, "inputs[0]", inputs[0])
    for i, t in enumerate(inputs[1:], start=1):
        t = _check_sparse(op, f"inputs[{i}]", t)
        _check_compatible(op, inputs[0], t, ("inputs[0]", f"inputs[{i}]"))
        check_same_dtype(op, inputs[0], t, ("inputs[0]", f"inputs[{i}]"))
    for t in inputs[1:]:
        out = _cat_pair(out, t, join)
    return out


def _apply(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "maximum":
        return torch.maximum(a, b)
    return torch.minimum(a, b)


def sparse_binary(
    lhs: SparseTensor,
    rhs: SparseTensor,
    op: str,
    join: str = "outer",
    lhs_fill: float = 0.0,
    rhs_fill: float = 0.0,
) -> SparseTensor:
    """Feature-wise ``op`` of two tensors on one lattice, rows aligned by coordinate.

    ``op`` is ``add``, ``sub``, ``mul``, ``maximum`` or ``minimum``, applied as
    ``lhs op rhs`` per row and channel. Equal supports: the result is on ``lhs``'s
    support (fills unused). Otherwise its rows are the ``join`` of both row sets sorted
    by (b, x, y, z), a row absent from ``lhs`` (``rhs``) reading ``lhs_fill``
    (``rhs_fill``) in every channel.

    Raises:
        TypeError: an operand is not a SparseTensor; feature dtypes differ; a fill is not
            a number.
        ValueError: unknown ``op`` or ``join``, different channel counts, strides, devices
            or spatial ranges; a NaN fill; (a ``MemoryBudgetError``) the output (on a join,
            with both gathered operands) beyond the memory budget, e.g. of features
            expanded to billions of channels.
    """
    name = "sparse_binary"
    a = _check_sparse(name, "lhs", lhs)
    b = _check_sparse(name, "rhs", rhs)
    if not isinstance(op, str) or op not in OPS:
        raise ValueError(f"{name}: op must be one of {OPS}, got {op!r}")
    _check_join(name, join)
    fills = (_check_fill(name, "lhs_fill", lhs_fill), _check_fill(name, "rhs_fill", rhs_fill))
    _check_compatible(name, a, b, ("lhs", "rhs"))
    check_same_dtype(name, a, b, ("lhs", "rhs"))
    if a.feats.shape[1] != b.feats.shape[1]:
        raise ValueError(f"{name}: lhs has {a.feats.shape[1]} channels but rhs {b.feats.shape[1]}")
    if same_support(a, b):
        check_output(name, len(a), a.feats)
        return SparseTensor.from_support(_apply(op, a.feats, b.feats), a.support)
    al = _align(a, b, join)
    # both operands gathered onto the joined rows, and the result
    check_output(name, int(al.lhs_rows.shape[0]), a.feats, 3)
    left = _gather(a.feats, al.lhs_rows, fills[0])
    right = _gather(b.feats, al.rhs_rows, fills[1])
    return SparseTensor.from_support(_apply(op, left, right), al.support)
