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

__all__ = ["centring", "contract_padding", "library_padding"]


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
