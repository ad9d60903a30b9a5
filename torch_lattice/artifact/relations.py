"""The contract's forward relation beside Torch Lattice's, axis by axis.

MLX Lattice (the artifacts' consumer) runs ``conv3d``, ``target_conv3d`` and
``pool3d`` with *centred* offsets on odd kernel axes: output row ``o`` reads input
row ``o*s + (r - k//2)*d - p``; on even axes the offset is ``r``, as in Torch
Lattice and dense convolution (``o*s + r*d - p``).  The two relations are the same
function once the padding absorbs the centring, ``p_library = p_contract +
(k//2)*d`` on odd axes.  Transposes (plain, target, generative, pooling,
trilinear) are never centred.  One place keeps that rule for the replay (contract
padding in, library padding out) and for the exporter (the reverse).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "SupportPlan",
    "centring",
    "contract_padding",
    "exportable_padding",
    "library_padding",
    "planned_rows",
    "support_plan",
]


def centring(kernel_size: Sequence[int], dilation: Sequence[int]) -> tuple[int, int, int]:
    """Per axis, how far the contract's first offset sits below ours: ``(k//2)*d`` on
    odd axes, 0 on even ones."""
    k, d = kernel_size, dilation
    return (
        (k[0] // 2) * d[0] if k[0] % 2 else 0,
        (k[1] // 2) * d[1] if k[1] % 2 else 0,
        (k[2] // 2) * d[2] if k[2] % 2 else 0,
    )


def library_padding(kernel_size: Sequence[int], padding: Sequence[int],
                    dilation: Sequence[int]) -> tuple[int, int, int]:
    """The Torch Lattice padding whose relation is the contract's with ``padding``."""
    c = centring(kernel_size, dilation)
    return (padding[0] + c[0], padding[1] + c[1], padding[2] + c[2])


def contract_padding(kernel_size: Sequence[int], padding: Sequence[int],
                     dilation: Sequence[int]) -> tuple[int, int, int] | None:
    """The contract padding that reproduces Torch Lattice's ``padding``; ``None`` where
    an odd axis has less padding than its centring (the contract would need a negative
    padding, which it does not accept)."""
    c = centring(kernel_size, dilation)
    out = (padding[0] - c[0], padding[1] - c[1], padding[2] - c[2])
    return None if min(out) < 0 else out


# --- generated supports --------------------------------------------------------------


@dataclass(frozen=True)
class SupportPlan:
    """How the contract reproduces the output support an eager forward layer generates.

    Torch Lattice's ``Conv3d``/pooling without a target output every cell ``o`` that
    some input row ``c = o*s + r*d - p`` reaches; the contract's ``conv3d``/``pool3d``
    output ``unique(floor(c / s))``.  Expanding the input rows first by a stride-1
    ``pool_transpose3d`` (rows ``c + r*expand_dilation`` for ``r < expand_kernel``)
    and then flooring by ``stride`` gives the eager set exactly when, per axis,
    ``padding = kernel - stride`` (dilation 1) or, at stride 1, ``padding = (kernel -
    1) * dilation``: the reachable ``o`` form the range ``floor((c + p - k + s) / s)``
    to ``floor((c + p) / s)``, and no generated row falls below zero.
    """

    expand_kernel: tuple[int, int, int]
    expand_dilation: tuple[int, int, int]
    stride: tuple[int, int, int]

    @property
    def expands(self) -> bool:
        return self.expand_kernel != (1, 1, 1)


def support_plan(kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                 dilation: Sequence[int]) -> SupportPlan | None:
    """The plan that regenerates the eager support of this geometry; ``None`` if none does."""
    kernel, dil = [], []
    for k, s, p, d in zip(kernel_size, stride, padding, dilation, strict=True):
        if s == 1 and p == (k - 1) * d:
            kernel.append(k)
            dil.append(d if k > 1 else 1)
        elif s > 1 and k >= s and (d == 1 or k == 1) and p == k - s:
            kernel.append(k - s + 1)
            dil.append(1)
        else:
            return None
    return SupportPlan((kernel[0], kernel[1], kernel[2]), (dil[0], dil[1], dil[2]),
                       (stride[0], stride[1], stride[2]))


def planned_rows(coords: torch.Tensor, plan: SupportPlan) -> torch.Tensor:
    """The rows ``plan`` generates from ``coords`` (``(N, 4)`` logical), unique and sorted."""
    rows = coords.to(torch.int64)
    for axis in range(3):
        k, d = plan.expand_kernel[axis], plan.expand_dilation[axis]
        if k > 1:
            shifted = []
            for r in range(k):
                part = rows.clone()
                part[:, axis + 1] += r * d
                shifted.append(part)
            rows = torch.cat(shifted)
    scale = torch.tensor((1, *plan.stride), dtype=torch.int64)
    return torch.unique(torch.div(rows, scale, rounding_mode="floor"), dim=0)


def exportable_padding(kernel_size: Sequence[int], stride: Sequence[int],
                       dilation: Sequence[int]) -> tuple[int, int, int] | None:
    """The padding with which a no-target forward layer of this kernel, stride and
    dilation exports exactly (support regenerated, centring absorbed), if one exists."""
    pads = []
    for k, s, d in zip(kernel_size, stride, dilation, strict=True):
        if s == 1:
            pads.append((k - 1) * d)
        elif k >= s and (d == 1 or k == 1):
            pads.append(k - s)
        else:
            return None
    out = (pads[0], pads[1], pads[2])
    return out if contract_padding(kernel_size, out, dilation) is not None else None
