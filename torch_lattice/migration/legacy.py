"""Legacy TorchSparse coordinates and strided supports, per version (docs/migration.md).

Two helpers let a port reproduce a legacy model exactly:

- :func:`legacy_coords` turns legacy coordinate rows into Torch Lattice's int32
  ``[b, x, y, z]`` logical rows (same row order, so features stay aligned);
- :func:`legacy_strided_support` gives, from Torch Lattice logical input rows, the
  output rows a legacy strided convolution generates, to be passed as
  ``conv(x, coordinates=...)``.

Rules modelled (from the TorchSparse sources; 1.4 also checked by running it):

- **1.4** (``spdownsample``): if every stride is 1 or equals the kernel size on its
  axis, the output is ``floor(c / s)`` deduplicated; otherwise the candidates are
  ``c + o`` for the centred offsets ``o = i - (k-1)//2``, kept when a multiple of
  ``s`` on every axis and ``>=`` the global per-axis minimum of the input (over all
  batches); there is no upper bound.
- **2.0** (``spdownsample``, default ``hashmap`` kernel-map mode): the same floor
  branch; otherwise (CUDA only in 2.0) offsets ``-(k-1)/2 .. (k-1)/2`` for odd ``k``
  and ``0 .. k-1`` for even ``k``, the same multiple-of-``s`` and minimum filters. Its
  kernel ravels candidates with the input's ``max - min + 1`` extents and has no
  upper bound check, so a candidate past the per-axis maximum aliases into another
  row; inputs that produce such a candidate are refused rather than guessed.
- **2.1** (default ``hashmap_on_the_fly``): candidates ``(c + p - j) / s`` for
  ``j = 0 .. k-1``, kept when ``c + p - j`` is a multiple of ``s`` and the quotient lies
  in ``[0, coords_max]``, where ``coords_max = (R + 2p - (k-1) - 1)//s`` from the
  input's ``spatial_range`` ``R`` when given, else ``(max(c) + 2p - (k-1))//s`` with
  the global per-axis maximum.

Complexity: ``O(N*K)`` memory and ``O(N*K log(N*K))`` time for ``N`` rows and kernel
volume ``K`` (the candidates are materialised, then sorted and deduplicated), plain
vectorised torch on the rows' device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_lattice.geometry import is_sequence

__all__ = ["SUPPORTED_VERSIONS", "legacy_coords", "legacy_strided_support"]

SUPPORTED_VERSIONS = ("1.4", "2.0", "2.1")
"""TorchSparse versions whose coordinates and strided supports can be reproduced."""

_INT32_MAX = 2**31 - 1
_AXES = "xyz"


def _version(version: object) -> str:
    """``"1.4"``, ``"1.4.0"`` -> ``"1.4"``; anything else is refused."""
    if not isinstance(version, str):
        raise TypeError(
            f"version must be a str such as '1.4', '2.0' or '2.1', got {type(version).__name__}"
        )
    parts = version.strip().split(".")
    if len(parts) == 3 and parts[2] == "0":
        parts = parts[:2]
    name = ".".join(parts)
    if name not in SUPPORTED_VERSIONS:
        raise ValueError(
            f"version {version!r} is not modelled; supported TorchSparse versions: "
            f"{', '.join(SUPPORTED_VERSIONS)} (a patch suffix '.0' is accepted)"
        )
    return name


def _triple(name: str, value: object, *, minimum: int) -> tuple[int, int, int]:
    """An int or a 3-sequence of ints, each ``>= minimum``."""
    if isinstance(value, int) and not isinstance(value, bool):
        items: list[object] = [value] * 3
    elif is_sequence(value):  # not str or bytes (b"\x03\x03\x03" is not (3, 3, 3))
        items = list(value)
        if len(items) != 3:
            raise ValueError(f"{name} must be an int or 3 ints (x, y, z), got {value!r}")
    else:
        raise TypeError(f"{name} must be an int or 3 ints (x, y, z), got {value!r}")
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must hold ints, got {value!r}")
        if v < minimum:
            raise ValueError(f"{name} must be >= {minimum} on every axis, got {value!r}")
    return (int(items[0]), int(items[1]), int(items[2]))  # type: ignore[call-overload]


def _rows(name: str, coords: object) -> torch.Tensor:
    """An integer ``(N, 4)`` tensor, as int64."""
    if not isinstance(coords, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(coords).__name__}")
    if coords.dtype == torch.bool or coords.dtype.is_floating_point or coords.is_complex():
        raise TypeError(f"{name} must have an integer dtype, got {coords.dtype}")
    if coords.dim() != 2 or coords.shape[1] != 4:
        raise ValueError(f"{name} must have shape (N, 4), got {tuple(coords.shape)}")
    return coords.to(torch.int64)


def _check_int32(name: str, rows: torch.Tensor) -> torch.Tensor:
    if rows.numel() and int(rows.max()) > _INT32_MAX:
        raise ValueError(f"{name} exceed int32 ({int(rows.max())} > {_INT32_MAX})")
    return rows.to(torch.int32)


def legacy_coords(
    coords: torch.Tensor, *, version: str, tensor_stride: int | Sequence[int] = 1
) -> torch.Tensor:
    """Legacy TorchSparse coordinate rows -> Torch Lattice int32 ``[b, x, y, z]`` rows.

    TorchSparse 1.4 and 2.0 hold ``[x, y, z, batch]`` (``sparse_collate`` appends the
    batch) in physical units, a multiple of the tensor stride; 2.1 holds
    ``[batch, x, y, z]`` in logical units, as Torch Lattice does. Rows keep their
    order, so the legacy features stay aligned.

    Args:
        coords: legacy ``(N, 4)`` integer rows of a tensor at ``tensor_stride``.
        version: the TorchSparse version that produced them (``"1.4"``, ``"2.0"``,
            ``"2.1"``).
        tensor_stride: the legacy tensor's stride (``x.s``), an int or 3 ints. For
            1.4/2.0 each spatial coordinate is divided by it; 2.1 rows are already
            logical, so it is only validated there.

    Returns:
        ``(N, 4)`` int32 logical rows ``[b, x, y, z]``.

    Raises:
        TypeError: ``coords`` is not an integer tensor, or an argument has a wrong type.
        ValueError: wrong shape, unknown version, a stride below 1, a 1.4/2.0
            coordinate that is not a multiple of its axis' tensor stride, a negative
            row (Torch Lattice rows are non-negative) or a row beyond int32.
    """
    v = _version(version)
    ts = _triple("tensor_stride", tensor_stride, minimum=1)
    rows = _rows("coords", coords)
    if v == "2.1":
        out = rows.clone()
    else:
        spatial, batch = rows[:, :3], rows[:, 3:]
        step = torch.tensor(ts, dtype=torch.int64, device=rows.device)
        bad = (spatial % step != 0).any(dim=1)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0, 0])
            raise ValueError(
                f"coords row {i} = {rows[i].tolist()} is not a multiple of tensor_stride "
                f"{ts}: TorchSparse {v} stores [x, y, z, batch] in physical units "
                f"(logical x tensor stride); check tensor_stride and the column order"
            )
        out = torch.cat([batch, spatial // step], dim=1)
    if out.numel() and int(out.min()) < 0:
        i = int(torch.nonzero((out < 0).any(dim=1))[0, 0])
        raise ValueError(
            f"coords row {i} gives {out[i].tolist()}: Torch Lattice rows [b, x, y, z] are "
            f"non-negative; shift the legacy coordinates (TorchSparse {v} columns: "
            f"{'[batch, x, y, z]' if v == '2.1' else '[x, y, z, batch]'})"
        )
    return _check_int32("coords", out)


def _offsets(kernel_size: tuple[int, int, int], per_axis) -> torch.Tensor:
    """All ``(K, 3)`` offset triples from per-axis offset lists (order irrelevant)."""
    axes = [torch.tensor(per_axis(k), dtype=torch.int64) for k in kernel_size]
    grid = torch.meshgrid(*axes, indexing="ij")
    return torch.stack([g.reshape(-1) for g in grid], dim=1)


def _spatial_range(value: object) -> tuple[int, int, int, int]:
    if not is_sequence(value) or len(value) != 4:
        raise ValueError(
            f"spatial_range must be None or the input's (B, X, Y, Z) as in TorchSparse 2.1's "
            f"SparseTensor, got {value!r}"
        )
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"spatial_range must hold positive ints (B, X, Y, Z), got {value!r}")
    return tuple(int(v) for v in value)  # type: ignore[return-value]


def legacy_strided_support(
    coords: torch.Tensor,
    *,
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int],
    padding: int | Sequence[int] = 0,
    version: str,
    spatial_range: Sequence[int] | None = None,
) -> torch.Tensor:
    """The output rows TorchSparse ``version`` generates for a strided convolution.

    Port a legacy strided layer as ``conv(x, coordinates=legacy_strided_support(
    x.coords, ...))`` with ``padding=(k-1)//2`` for 1.4/2.0 (centred windows) or the
    layer's padding for 2.1. The rules are in this module's docstring and in
    docs/migration.md.

    Args:
        coords: Torch Lattice logical input rows ``(N, 4)`` ``[b, x, y, z]``
            (non-negative; :func:`legacy_coords` converts legacy rows).
        kernel_size, stride: int or 3 ints; some stride must exceed 1 (a stride-1
            convolution with ``k > 1`` is submanifold in every version).
        padding: 2.1 only (its default 0); 1.4 and 2.0 have no padding argument.
        version: ``"1.4"``, ``"2.0"`` or ``"2.1"``.
        spatial_range: 2.1 only: the input tensor's ``(B, X, Y, Z)``, which clips
            the output to ``[0, (R + 2p - (k-1) - 1)//s]`` per axis.

    Returns:
        ``(M, 4)`` int32 logical rows at the output stride, sorted by (b, x, y, z).

    Raises:
        TypeError, ValueError: a malformed argument (the message names it), a
            padding or spatial_range the version does not have, a negative row, a
            batch index outside ``spatial_range[0]``, or (2.0) an input whose
            candidates alias in 2.0's raveling.
    """
    v = _version(version)
    ks = _triple("kernel_size", kernel_size, minimum=1)
    st = _triple("stride", stride, minimum=1)
    pad = _triple("padding", padding, minimum=0)
    rows = _rows("coords", coords)
    if all(s == 1 for s in st):
        raise ValueError(
            f"stride must exceed 1 on some axis, got {st}: a stride-1 convolution with k > 1 "
            f"is submanifold in every TorchSparse version (output rows = input rows)"
        )
    if v != "2.1" and pad != (0, 0, 0):
        raise ValueError(
            f"padding must be 0 for TorchSparse {v}, got {padding!r}: {v} has no padding; its "
            f"windows are centred (port the layer with padding=(k-1)//2, which this helper "
            f"already assumes)"
        )
    if v != "2.1" and spatial_range is not None:
        raise ValueError(
            f"spatial_range must be None for TorchSparse {v}: its downsampling has no upper "
            f"bound (only TorchSparse 2.1 clips to a spatial_range)"
        )
    srange = None if spatial_range is None else _spatial_range(spatial_range)
    if rows.numel() and int(rows.min()) < 0:
        raise ValueError("coords must be non-negative Torch Lattice rows [b, x, y, z]")
    if srange is not None and rows.numel() and int(rows[:, 0].max()) >= srange[0]:
        raise ValueError(
            f"coords hold batch {int(rows[:, 0].max())} >= spatial_range[0] = {srange[0]} "
            f"(TorchSparse 2.1 would wrap it)"
        )
    if rows.shape[0] == 0:
        return torch.zeros(0, 4, dtype=torch.int32, device=rows.device)

    batch, xyz = rows[:, :1], rows[:, 1:]
    s = torch.tensor(st, dtype=torch.int64, device=rows.device)
    n = rows.shape[0]
    if v in ("1.4", "2.0") and all(st[a] in (1, ks[a]) for a in range(3)):
        out = torch.cat([batch, torch.div(xyz, s, rounding_mode="floor")], dim=1)
        return _check_int32("output rows", torch.unique(out, dim=0))

    if v == "1.4":
        off = _offsets(ks, lambda k: range(-k // 2 + 1, k // 2 + 1))  # get_kernel_offsets
    elif v == "2.0":
        off = _offsets(ks, lambda k: range(0, k) if k % 2 == 0 else range(-(k // 2), k // 2 + 1))
    else:
        off = _offsets(ks, lambda k: range(-(k - 1), 1))
        off = off + torch.tensor(pad, dtype=torch.int64)
    off = off.to(rows.device)
    k = off.shape[0]
    cand = (xyz[:, None, :] + off[None, :, :]).reshape(n * k, 3)
    cb = batch.expand(n, k).reshape(n * k, 1)
    keep = (cand % s == 0).all(dim=1)
    if v in ("1.4", "2.0"):
        lo = xyz.min(dim=0).values
        keep &= (cand >= lo).all(dim=1)
        cand, cb = cand[keep], cb[keep]
        if v == "2.0":
            hi = xyz.max(dim=0).values
            over = (cand > hi).any(dim=1)
            if bool(over.any()):
                raise ValueError(
                    "TorchSparse 2.0 aliases this input: a kept candidate lies past the input's "
                    f"per-axis maximum {hi.tolist()} (e.g. {cand[over][0].tolist()}), and 2.0's "
                    "downsample kernel ravels candidates with the input's (max - min + 1) "
                    "extents, so it lands on another row; this is not modelled, compare with "
                    "the legacy output directly"
                )
        out = torch.cat([cb, cand // s], dim=1)
    else:
        q = torch.div(cand, s, rounding_mode="floor")
        k_t = torch.tensor(ks, dtype=torch.int64, device=rows.device)
        p_t = torch.tensor(pad, dtype=torch.int64, device=rows.device)
        if srange is not None:  # coords_max = new spatial_range - 1
            r = torch.tensor(srange[1:], dtype=torch.int64, device=rows.device)
            hi = torch.div(r + 2 * p_t - (k_t - 1) - 1, s, rounding_mode="floor")
        else:  # coords_max from the global per-axis maximum
            top = xyz.max(dim=0).values
            hi = torch.div(top + 2 * p_t - (k_t - 1), s, rounding_mode="floor")
        keep &= ((q >= 0) & (q <= hi)).all(dim=1)
        out = torch.cat([cb[keep], q[keep]], dim=1)
    return _check_int32("output rows", torch.unique(out, dim=0))
