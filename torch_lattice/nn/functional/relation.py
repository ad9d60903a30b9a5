"""Running a cached kernel map forward or transposed.

Every convolution family ends here: a forward convolution reads the map from
its input support to its output support; a transposed one reads the map of
the matching forward convolution (fine support -> coarse support) the other
way round.
"""

from __future__ import annotations

import torch

from torch_lattice.ops.conv import sparse_conv
from torch_lattice.ops.kernel_map import KernelMap

__all__ = ["apply_kernel_map"]


def apply_kernel_map(
    feats: torch.Tensor, weight: torch.Tensor, kmap: KernelMap, *, transposed: bool = False
) -> torch.Tensor:
    """``(N_out, C_out)`` features of the relation ``kmap`` applied to ``feats``.

    Args:
        feats: ``(N_in, C_in)`` rows of the relation's input side (the coarse
            side when ``transposed``).
        weight: ``(K, C_in, C_out)``.
        kmap: map from the forward convolution's input to its output support.
        transposed: run it from the output support back onto the input support.
    """
    if transposed:
        return sparse_conv(feats, weight, kmap.rev, kmap.nbr)
    return sparse_conv(feats, weight, kmap.nbr, kmap.rev)
