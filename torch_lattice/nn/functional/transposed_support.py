"""Supports of the transposed (fine-from-coarse) relations that pooling
transposes and trilinear upsampling use when no target is given.

The artifact contract's generated route: every ``src[i] * stride + r * dilation
- padding`` over every row and kernel position, deduplicated and sorted by
``(b, x, y, z)`` (the order ``torch.unique(dim=0)`` gives, as torch-lattice 0.5 does).
Our coordinates are non-negative, so a candidate below 0 (or beyond int32) is
an error, never dropped: the caller passes a ``target`` instead.
"""

from __future__ import annotations

import torch

from torch_lattice.coord_rows import unique_rows
from torch_lattice.geometry import ConvGeometry, kernel_positions
from torch_lattice.memory_budget import check_allocation
from torch_lattice.tensor import SparseTensor, Support, divide_stride

__all__ = ["cached_source_support", "generated_transposed_support"]

_INT32_MAX = 2**31 - 1


def cached_source_support(src: SparseTensor, geometry: ConvGeometry) -> Support | None:
    """The input support of the most recent pooling / Conv3d with ``geometry``
    that produced ``src``, or None when none is in ``src``'s history."""
    found = [d for d in src.coordinate_manager.derivations(src.support) if d.geometry == geometry]
    return found[-1].source if found else None


def generated_transposed_support(src: SparseTensor, geometry: ConvGeometry, op: str) -> Support:
    """``unique{src[i] * s + r * d - p}`` sorted by (b, x, y, z), stride ``src.stride / s``.

    The range, when ``src`` has one, is ``(R - 1) * s + (K - 1) * d - p + 1`` per axis
    (one past the largest coordinate any row of the range can generate).

    Raises:
        ValueError: a generated coordinate would be negative or beyond int32, or the
            input stride is not divisible by ``stride``.
    """
    stride = divide_stride(src.stride, geometry.stride)
    coords = src.coords
    device = coords.device
    k = geometry.kernel_size[0] * geometry.kernel_size[1] * geometry.kernel_size[2]
    # int64 candidates (spatial, batch and their concatenation) before unique.
    check_allocation(
        f"{op} without a target ({coords.shape[0]} rows x {k} kernel positions generated)",
        int(coords.shape[0]) * k * 8 * 10,
    )
    s = torch.tensor(geometry.stride, dtype=torch.int64, device=device)
    d = torch.tensor(geometry.dilation, dtype=torch.int64, device=device)
    p = torch.tensor(geometry.padding, dtype=torch.int64, device=device)
    offsets = kernel_positions(geometry.kernel_size).to(device=device, dtype=torch.int64) * d - p
    spatial = coords[:, None, 1:].long() * s + offsets[None]
    batch = coords[:, None, :1].long().expand(-1, offsets.shape[0], -1)
    candidates = torch.cat((batch, spatial), dim=2).reshape(-1, 4)
    if candidates.shape[0]:
        lo, hi = int(spatial.min()), int(spatial.max())
        if lo < 0:
            raise ValueError(
                f"{op} without a target generates coordinate {lo} < 0 (input rows * stride "
                f"{geometry.stride} + kernel offsets - padding {geometry.padding}); coordinates "
                "must be non-negative, so pass the fine support explicitly: target=..."
            )
        if hi > _INT32_MAX:
            raise ValueError(
                f"{op} without a target generates coordinate {hi}, beyond the int32 limit "
                f"{_INT32_MAX}"
            )
    out = unique_rows(candidates)[0].to(torch.int32)
    srange = None
    if src.spatial_range is not None:
        b, *r = src.spatial_range
        ext = [
            (ri - 1) * si + (k - 1) * di - pi + 1
            for ri, si, k, di, pi in zip(
                r,
                geometry.stride,
                geometry.kernel_size,
                geometry.dilation,
                geometry.padding,
                strict=True,
            )
        ]
        if min(ext) < 1:
            raise ValueError(
                f"{op}: padding {geometry.padding} leaves no room in the generated range {ext} "
                f"of the input range {src.spatial_range}; pass target=..."
            )
        srange = (b, ext[0], ext[1], ext[2])
    generated = src.coordinate_manager.new_support(out.contiguous(), stride, srange)
    # A transpose onto it (replay's no-target conv_transpose3d) may then run over pair
    # lists instead of the (N_out, K) table.
    src.coordinate_manager.record_expansion(generated, src.support, geometry)
    return generated
