"""Random sparse tensors shared by the pooling, upsampling and join tests (CPU and
CUDA-versus-CPU): the same seed gives the same tensor in every file."""

from __future__ import annotations

import torch

import torch_lattice as tl


def random_sparse(
    n: int,
    extent: int,
    seed: int,
    *,
    stride=1,
    channels: int = 3,
    lo: int = 0,
    dtype: torch.dtype = torch.float64,
    spatial_range=None,
) -> tl.SparseTensor:
    """At most ``n`` unique rows ``(b, x, y, z)``, b in {0, 1} and x, y, z in
    ``[lo, extent)``, shuffled, with standard-normal features."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.cat(
        [
            torch.randint(0, 2, (4 * n, 1), generator=g),
            torch.randint(lo, extent, (4 * n, 3), generator=g),
        ],
        1,
    )
    uniq = torch.unique(rows, dim=0)
    coords = uniq[torch.randperm(len(uniq), generator=g)][:n]
    feats = torch.randn(len(coords), channels, generator=g, dtype=dtype)
    return tl.SparseTensor(feats, coords, stride, spatial_range)
