"""Running a cached kernel map forward or transposed, with the configured
dataflow.

Every convolution family ends here: a forward convolution reads the map from
its input support to its output support; a transposed one reads the map of
the matching forward convolution (fine support -> coarse support) the other
way round.
"""

from __future__ import annotations

import torch

from torch_lattice.nn.functional.config import ConvConfig, Dataflow
from torch_lattice.ops.conv import pair_conv, sparse_conv
from torch_lattice.ops.kmap import KernelMap

__all__ = ["apply_kernel_map"]


def apply_kernel_map(
    feats: torch.Tensor,
    weight: torch.Tensor,
    kmap: KernelMap,
    config: ConvConfig,
    *,
    transposed: bool = False,
) -> torch.Tensor:
    """``(N_out, C_out)`` features of the relation ``kmap`` applied to ``feats``.

    Args:
        feats: ``(N_in, C_in)`` rows of the relation's input side (the coarse
            side when ``transposed``).
        weight: ``(K, C_in, C_out)``.
        kmap: map from the forward convolution's input to its output support.
        config: resolved configuration; its dataflow picks the kernels.
        transposed: run it from the output support back onto the input support.
    """
    nbr, rev = (kmap.rev, kmap.nbr) if transposed else (kmap.nbr, kmap.rev)
    tf32 = bool(config.allow_tf32)
    if config.dataflow is Dataflow.ImplicitGEMM:
        return sparse_conv(feats, weight, nbr, rev, tf32)
    # One pair list serves forward, backward and the transposed relation:
    # backward swaps pair_in and pair_out (rev pairs None), so nothing else
    # is built, and no host sync happens beyond the one pair-count readback.
    fwd = kmap.relation_pairs(transposed)
    gather = config.dataflow is Dataflow.GatherScatter
    return pair_conv(feats, weight, *fwd, None, None, None, nbr.shape[0], gather, tf32)
