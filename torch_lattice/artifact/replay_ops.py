"""One executor per ``lattice.*`` op, each running the op through Torch Lattice.

An executor takes the replay context, the parsed :class:`Operation` and its operand
values (SparseTensor, torch.Tensor or :class:`WeightValue`; an absent optional operand
is simply not in the list) and returns a tuple of result values. Inside the replay every
sparse value is a :class:`~torch_lattice.SparseTensor` with *logical* coordinates;
the physical/logical choice is made only at the boundary (``sparse.make``,
``sparse.decompose`` and the program's outputs). Features run in float32 (the
contract's ``accumulation = "canonical_f32"``); the program casts results to the
dtypes the graph declares.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

import torch_lattice as tl
from torch_lattice.artifact import schema
from torch_lattice.artifact.mlir_parse import Operation
from torch_lattice.artifact.relations import library_padding
from torch_lattice.artifact.replay_weights import WeightValue
from torch_lattice.coord_rows import floor_rows, lookup_rows
from torch_lattice.geometry import ConvGeometry
from torch_lattice.nn import functional as F
from torch_lattice.nn.functional.normalized import check_eps, weight_normalized
from torch_lattice.nn.functional.pooling import pool_over_map
from torch_lattice.nn.functional.relation import kernel_map
from torch_lattice.nn.functional.supports import generated_transposed_support
from torch_lattice.tensor import SparseTensor, Support, multiply_stride

__all__ = ["EXECUTORS", "ReplayContext", "boundary_coords"]


Value = Any
Executor = Callable[["ReplayContext", Operation, list[Value]], tuple[Value, ...]]
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class ReplayContext:
    """What executors share: the bound weights and the coordinate convention."""

    weights: dict[str, WeightValue]  # by weight symbol, already on the program's device
    logical: bool  # True: boundary coordinates are logical; False: physical (IR v2)


def boundary_coords(ctx: ReplayContext, x: SparseTensor, where: str = "output") -> torch.Tensor:
    """``x``'s coordinates as the artifact boundary carries them (int32 ``(N, 4)``).

    Physical coordinates are logical x stride, computed in int64 and checked: a row
    beyond int32 is an error naming the value, never a wrapped coordinate.
    """
    coords = x.coords.to(torch.int32)
    if ctx.logical or x.stride == (1, 1, 1):
        return coords
    scale = torch.tensor((1, *x.stride), dtype=torch.int64, device=coords.device)
    physical = coords.to(torch.int64) * scale
    if physical.numel():
        top = int(physical.max())
        if top > _INT32_MAX:
            row = int((physical > _INT32_MAX).any(dim=1).nonzero()[0, 0])
            raise ValueError(
                f"{where}: physical coordinate {top} (row {row}, logical "
                f"{coords[row].tolist()} x stride {x.stride}) is beyond the int32 limit "
                f"{_INT32_MAX} of the artifact boundary"
            )
    return physical.to(torch.int32)


def _where(op: Operation) -> str:
    return f"graph.mlir line {op.line}: {op.spec.qualified_name}"


def _active(op: Operation, name: str, active: torch.Tensor, rows: int) -> int:
    """The row count an ``active`` operand (int32 ``(1,)``) gives; checked against ``rows``."""
    if active.numel() != 1 or active.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{_where(op)}: {name} must be an int32 tensor of shape (1,)")
    n = int(active.reshape(()).item())
    if not 0 <= n <= rows:
        raise ValueError(f"{_where(op)}: {name} = {n} is outside [0, {rows}] (the rows given)")
    return n


def _sparse_make(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    coords, feats, active = args
    name = f"%{op.operands[0]}"
    if coords.ndim != 2 or coords.shape[1] != 4 or coords.is_floating_point():
        raise ValueError(f"{_where(op)}: {name} must be an integer (N, 4) tensor [b, x, y, z]")
    if feats.ndim != 2 or feats.shape[0] != coords.shape[0]:
        raise ValueError(
            f"{_where(op)}: %{op.operands[1]} must be (N, C) with N = {coords.shape[0]} rows, "
            f"got {tuple(feats.shape)}"
        )
    n = _active(op, f"%{op.operands[2]}", active, coords.shape[0])
    coords, feats = coords[:n].to(torch.int32), feats[:n].to(torch.float32)
    stride = op.attributes["stride"]
    if any(s <= 0 or s > _INT32_MAX for s in stride):
        raise ValueError(f"{_where(op)}: stride must be positive and fit int32 "
                         f"(<= {_INT32_MAX}), got {stride}")
    if not ctx.logical and stride != (1, 1, 1):
        scale = torch.tensor(stride, dtype=torch.int32, device=coords.device)
        bad = (coords[:, 1:] % scale != 0).any(dim=1).nonzero()
        if bad.numel():
            row = int(bad[0, 0])
            raise ValueError(
                f"{_where(op)}: {name} row {row} = {coords[row].tolist()} is not divisible by "
                f"the declared stride {stride}; IR v2 boundary coordinates are physical "
                "(logical x stride). Artifacts written by torch-lattice 0.5 carry logical "
                "coordinates: load them with coordinates='logical'"
            )
        coords = torch.cat([coords[:, :1], coords[:, 1:] // scale], dim=1)
    try:
        x = SparseTensor(feats, coords, stride=stride)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{_where(op)}: {name}: {exc}") from None
    return (x,)


def _sparse_decompose(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    (x,) = args
    active = torch.tensor([x.coords.shape[0]], dtype=torch.int32, device=x.feats.device)
    return (boundary_coords(ctx, x, _where(op)), x.feats, active)


def _with_features(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    x, feats = args
    if feats.ndim != 2 or feats.shape[0] != x.coords.shape[0]:
        raise ValueError(
            f"{_where(op)}: features must be (N, C) with N = {x.coords.shape[0]} rows of the "
            f"sparse input, got {tuple(feats.shape)}"
        )
    return (SparseTensor.from_support(feats.to(torch.float32), x.support),)


def _weight(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    return (ctx.weights[op.symbol],)


# --- convolutions ---------------------------------------------------------------


def _conv_parts(op: Operation, args: list[Value], with_target: bool
                ) -> tuple[SparseTensor, SparseTensor | None, torch.Tensor, torch.Tensor | None]:
    x, rest = args[0], args[1:]
    target = rest.pop(0) if with_target else None
    weight: WeightValue = rest[0]
    bias: WeightValue | None = rest[1] if len(rest) > 1 else None
    if weight.packing.kind != "dense" and op.spec.name not in schema.PACKED_WEIGHT_OPS:
        # MLX Lattice refuses these ("target transpose convolution does not support
        # packed weights."); a replay that ran them would vouch for an unrunnable artifact
        raise ValueError(f"{_where(op)}: packed ({weight.packing.kind}) weights are not run "
                         "by MLX Lattice on this op; store its weight in float")
    ks = op.attributes["kernel_size"]
    w = weight.conv_kernel(f"{_where(op)} weight", int(x.feats.shape[1]), ks)
    b = None if bias is None else bias.dense(f"{_where(op)} bias", (int(w.shape[2]),))
    return x, target, w, b


def _conv_executor(name: str) -> Executor:
    """Executor of conv op ``name``; the name says target, normalized and family."""
    traits = schema.CONV_OPS[name]
    target, normalized, family = traits.target, traits.normalized, traits.family

    def run(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
        x, tgt, w, b = _conv_parts(op, args, target)
        a = op.attributes
        support: SparseTensor | Support | None = tgt
        if family == "conv_transpose3d" and tgt is None:
            # The contract's no-target transpose generates unique{x*s + r*d - p}; it does
            # not look up the conv that made x (the library's inverse route).
            geometry = ConvGeometry.create(a["kernel_size"], a["stride"], a["padding"],
                                           a["dilation"])
            support = _call(op, generated_transposed_support, x, geometry, op.spec.name)

        def conv(inp: SparseTensor, weight: torch.Tensor, bias: torch.Tensor | None = None
                 ) -> SparseTensor:
            if family == "subm_conv3d":
                return F.subm_conv3d(inp, weight, bias, a["kernel_size"], a["dilation"])
            if family == "conv3d":
                out = tgt if tgt is not None else _floor_support(inp, a["stride"])
                return F.conv3d(inp, weight, bias, a["kernel_size"], a["stride"],
                                _forward_padding(a), a["dilation"], coordinates=out)
            if family == "conv_transpose3d":
                return F.conv_transpose3d(inp, weight, bias, a["kernel_size"], a["stride"],
                                          a["padding"], a["dilation"], coordinates=support)
            return F.generative_conv_transpose3d(inp, weight, bias, a["kernel_size"],
                                                 a["stride"])

        if normalized and family != "subm_conv3d" and w.shape[0] == 1:
            return (_call(op, _normalized_pointwise, conv, x, w, b, a["eps"]),)
        if normalized:
            return (_call(op, F.normalized, conv, x, w, b, a["eps"]),)
        return (_call(op, conv, x, w, b),)

    return run


def _normalized_pointwise(conv: Callable[..., SparseTensor], x: SparseTensor, w: torch.Tensor,
                          b: torch.Tensor | None, eps: float) -> SparseTensor:
    """``conv(x, w) / sqrt(conv(1, w*w) + eps) + b`` for a one-row kernel.

    F.normalized skips pointwise kernels (the library's rule, and the contract's for
    normalized_subm_conv3d), but the contract's normalized transposed and generative
    ops normalize at every kernel size.
    """
    y = weight_normalized(conv, x, w, check_eps(eps))
    return y if b is None else y.replace(y.feats + b)


# --- pooling and resampling -----------------------------------------------------


def _call(op: Operation, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Runs one library call, prefixing its errors with the op and line."""
    try:
        return fn(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{_where(op)}: {exc}") from None


def _floor_support(x: SparseTensor, stride: tuple[int, int, int]) -> Support:
    """The contract's no-target ``conv3d``/``pool3d`` output support.

    MLX Lattice's forward relation outputs ``unique(floor(c / stride))`` over the
    input rows (the input rows themselves at stride 1), whatever the kernel size,
    padding and dilation; each output row then reads the contract's centred relation
    (:mod:`torch_lattice.artifact.relations`). The library instead generates every
    reachable cell of ``[0, R_out)``, so the replay always passes this support. At
    stride 1 it is ``x``'s own support (same rows, same order); otherwise the cells are
    sorted by (b, x, y, z), the library's order (row order is not part of the contract).
    """
    if stride == (1, 1, 1):
        return x.support
    cells = floor_rows(x.coords, stride)
    return x.coordinate_manager.new_support(
        cells.to(x.coords.dtype), multiply_stride(x.stride, stride), None
    )


def _forward_padding(attributes: dict[str, Any]) -> tuple[int, int, int]:
    """The library padding of a contract forward relation (centred on odd axes)."""
    return library_padding(attributes["kernel_size"], attributes["padding"],
                           attributes["dilation"])


def _pool3d(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    a = op.attributes
    x: SparseTensor = args[0]
    geometry = _call(op, ConvGeometry.create, a["kernel_size"], a["stride"],
                     _forward_padding(a), a["dilation"])
    target = _floor_support(x, a["stride"])
    kmap = kernel_map(x.support, target, geometry)
    # avg: divided by the input rows that reach it; a row no input reaches is 0 for
    # avg and sum and -inf for max (the consumer's max over nothing)
    y = pool_over_map(x.feats.to(torch.float32), kmap, a["mode"])
    if a["mode"] == "max":
        y = y.masked_fill((kmap.nbr < 0).all(dim=1, keepdim=True), float("-inf"))
    return (SparseTensor.from_support(y, target),)


def _pool_transpose3d(ctx: ReplayContext, op: Operation, args: list[Value]
                      ) -> tuple[Value, ...]:
    a = op.attributes
    target = args[1] if len(args) > 1 else None
    # Without a target the contract generates the fine support; it never reuses the input
    # support of an earlier pooling (the library's own default when one is cached).
    return (_call(op, F.pool_transpose3d, args[0], a["kernel_size"], a["stride"], a["padding"],
                  a["dilation"], target=target, expand_coordinates=target is None),)


def _trilinear(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    target = args[1] if len(args) > 1 else None
    return (_call(op, F.trilinear_upsample3d, args[0], op.attributes["stride"], target=target),)


def _global_pool(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    batch = op.attributes["batch_size"]
    # A negative batch_size asks for the count to be read from the batch column.
    return (_call(op, F.global_pool, args[0], mode=op.attributes["mode"],
                  batch_size=None if batch < 0 else batch),)


# --- coordinate-aligned algebra ---------------------------------------------------


def _reindex(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    return (_call(op, tl.reindex_sparse, args[0], args[1], fill=op.attributes["fill"]),)


def _sparse_cat(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    return (_call(op, tl.sparse_cat, [args[0], args[1]], join=op.attributes["join"]),)


def _sparse_binary(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    a = op.attributes
    return (_call(op, tl.sparse_binary, args[0], args[1], a["op"], join=a["join"],
                  lhs_fill=a["lhs_fill"], rhs_fill=a["rhs_fill"]),)


# --- points --------------------------------------------------------------------------


def _point_rows(op: Operation, points: torch.Tensor, batch: torch.Tensor, active: torch.Tensor,
                active_name: str) -> int:
    if points.ndim != 2 or points.shape[1] != 3 or not points.is_floating_point():
        raise ValueError(f"{_where(op)}: points must be a float (P, 3) tensor")
    if batch.shape != (points.shape[0],) or batch.is_floating_point():
        raise ValueError(f"{_where(op)}: batch_indices must be an integer (P,) tensor")
    return _active(op, active_name, active, points.shape[0])


def _grid_positions(op: Operation, points: torch.Tensor) -> torch.Tensor:
    """``(p - origin) / voxel_size`` in float32, as the contract's runtimes compute it."""
    a = op.attributes
    size = torch.tensor(a["voxel_size"], dtype=torch.float32, device=points.device)
    origin = torch.tensor(a["origin"], dtype=torch.float32, device=points.device)
    return (points.to(torch.float32) - origin) / size


def _voxelize(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    points, feats, batch, active = args
    a = op.attributes
    n = _point_rows(op, points, batch, active, "active_rows")
    # Quantize in float32 here (a float64 division can floor a boundary point the other
    # way), then hand tl.voxelize cell centres on a unit grid: its floor is then exact.
    cells = torch.floor(_grid_positions(op, points[:n])) + 0.5
    x = _call(op, tl.voxelize, cells, feats[:n].to(torch.float32), batch_indices=batch[:n],
              voxel_size=1.0, origin=0.0, reduction=a["reduction"])
    if a["stride"] != (1, 1, 1):
        x = _call(op, SparseTensor, x.feats, x.coords, stride=a["stride"])
    return (x,)


def _find_rows(table: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """Row of each ``(Q, 4)`` query in the unique ``(M, 4)`` ``table``; -1 where absent."""
    return lookup_rows(table.to(torch.int64), queries.to(torch.int64))


def _devoxelize(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    """Contract devoxelize over the active points (one output row each):
    ``nearest`` takes the voxel at ``floor(u + 0.5)``; ``linear`` sums the 8 voxels at
    ``floor(u) + {0, 1}`` with trilinear weights (absent voxels add 0, no
    renormalization); ``u = (p - origin) / voxel_size``; a point with no voxel gets 0."""
    points, voxels, batch, active = args
    n = _point_rows(op, points, batch, active, "point_active_rows")
    finite = torch.isfinite(points[:n]).all(dim=1)
    if not bool(finite.all()):  # NaN has no voxel: refused, as voxelize refuses it
        row = int((~finite).nonzero()[0, 0])
        raise ValueError(f"{_where(op)}: points must be finite, points[{row}] = "
                         f"{points[row].tolist()}")
    u = _grid_positions(op, points[:n]).to(voxels.feats.device)
    b = batch[:n].to(torch.int64).to(u.device).unsqueeze(1)
    out = torch.zeros(n, voxels.feats.shape[1], dtype=torch.float32, device=u.device)
    if op.attributes["interpolation"] == "nearest":
        rows = _find_rows(voxels.coords, torch.cat([b, torch.floor(u + 0.5).long()], dim=1))
        hit = rows >= 0
        out[hit] = voxels.feats[rows[hit]]
        return (out,)
    lower = torch.floor(u)
    frac = u - lower
    corners = [
        torch.tensor([corner & 1, (corner >> 1) & 1, (corner >> 2) & 1], device=u.device)
        for corner in range(8)
    ]
    # One lookup of all 8 corners' rows (one sort of the voxel table, not 8).
    queries = torch.cat([torch.cat([b, lower.long() + d], dim=1) for d in corners])
    found = _find_rows(voxels.coords, queries).reshape(8, n)
    for d, rows in zip(corners, found, strict=True):
        w = torch.where(d.bool(), frac, 1.0 - frac).prod(dim=1)
        hit = rows >= 0
        out[hit] += voxels.feats[rows[hit]] * w[hit].unsqueeze(1)
    return (out,)


# --- dense feature ops ----------------------------------------------------------------


def _linear(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    x, weight = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    if x.ndim != 2:
        raise ValueError(f"{_where(op)}: input must be (N, C), got {tuple(x.shape)}")
    w = weight.linear(f"{_where(op)} weight", int(x.shape[1])).to(x.device)
    b = None if bias is None else bias.dense(f"{_where(op)} bias", (int(w.shape[0]),))
    return (torch.nn.functional.linear(x.to(torch.float32), w, b),)


def _channels(op: Operation, x: torch.Tensor, values: list[WeightValue], names: tuple[str, ...]
              ) -> list[torch.Tensor]:
    if x.ndim != 2:
        raise ValueError(f"{_where(op)}: input must be (N, C), got {tuple(x.shape)}")
    c = int(x.shape[1])
    return [v.dense(f"{_where(op)} {n}", (c,)) for v, n in zip(values, names, strict=True)]


def _norm_eps(op: Operation) -> float:
    """The op's ``eps``; the contract's norms refuse eps <= 0 (0 variance would divide by 0)."""
    return _call(op, check_eps, op.attributes["eps"])


def _batch_norm(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    x = args[0].to(torch.float32)
    scale, bias, mean, var = _channels(op, x, args[1:], ("scale", "bias", "mean", "var"))
    return ((x - mean) * torch.rsqrt(var + _norm_eps(op)) * scale + bias,)


def _layer_norm(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    x = args[0].to(torch.float32)
    scale, bias = _channels(op, x, args[1:], ("scale", "bias"))
    return (torch.nn.functional.layer_norm(x, (x.shape[1],), scale, bias, _norm_eps(op)),)


def _rms_norm(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    x = args[0].to(torch.float32)
    (scale,) = _channels(op, x, args[1:], ("scale",))
    rms = torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + _norm_eps(op))
    return (x * rms * scale,)


def _activation(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    x = args[0].to(torch.float32)
    a = op.attributes
    kind = a["kind"]
    nn = torch.nn.functional
    if kind == "relu":
        y = torch.relu(x)
    elif kind == "sigmoid":
        y = torch.sigmoid(x)
    elif kind == "silu":
        y = nn.silu(x)
    elif kind == "tanh":
        y = torch.tanh(x)
    elif kind == "leaky_relu":
        y = torch.where(x >= 0, x, x * a["alpha"])
    elif kind == "softplus":
        if a["beta"] <= 0:
            raise ValueError(f"{_where(op)}: softplus beta must be positive, got {a['beta']}")
        y = nn.softplus(x, beta=a["beta"], threshold=a["threshold"])
    elif a["approximate"] == "fast":  # gelu
        y = x * torch.sigmoid(1.702 * x)
    else:
        y = nn.gelu(x, approximate="tanh" if a["approximate"] == "tanh" else "none")
    return (y,)


def _elementwise(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    x = args[0].to(torch.float32)
    kind = op.attributes["kind"]
    if kind == "exp":
        return (torch.exp(x),)
    if kind == "round":  # half to even, as torch.round
        return (torch.round(x),)
    raise ValueError(f"{_where(op)}: elementwise kind must be 'exp' or 'round', got {kind!r}")


def _softmax(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    x = args[0].to(torch.float32)
    axis = op.attributes["axis"]
    if axis not in (-1, x.ndim - 1):
        raise ValueError(f"{_where(op)}: softmax supports only the last axis, got axis={axis}")
    return (torch.softmax(x, dim=-1),)


def _embedding(ctx: ReplayContext, op: Operation, args: list[Value]) -> tuple[Value, ...]:
    idx, weight = args
    if idx.is_floating_point():
        raise ValueError(f"{_where(op)}: embedding indices must be integers, got {idx.dtype}")
    table = weight.dense(f"{_where(op)} weight")
    if table.ndim != 2:
        raise ValueError(f"{_where(op)}: embedding weight must be (N, C)")
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= table.shape[0]):
        raise ValueError(
            f"{_where(op)}: embedding indices must lie in [0, {table.shape[0]}), got "
            f"[{int(idx.min())}, {int(idx.max())}]"
        )
    return (table[idx.long()],)



EXECUTORS: dict[str, Executor] = {
    "weight": _weight,
    "sparse.make": _sparse_make,
    "sparse.decompose": _sparse_decompose,
    "sparse.with_features": _with_features,
    "sparse.reindex": _reindex,
    **{name: _conv_executor(name) for name in schema.CONV_OPS},
    "pool3d": _pool3d,
    "pool_transpose3d": _pool_transpose3d,
    "trilinear_upsample3d": _trilinear,
    "global_pool": _global_pool,
    "voxelize": _voxelize,
    "devoxelize": _devoxelize,
    "linear": _linear,
    "embedding_lookup": _embedding,
    "elementwise": _elementwise,
    "softmax": _softmax,
    "activation": _activation,
    "batch_norm": _batch_norm,
    "layer_norm": _layer_norm,
    "rms_norm": _rms_norm,
    "sparse.binary": _sparse_binary,
    "sparse.cat": _sparse_cat,
}
