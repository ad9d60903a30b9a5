"""A small, slow, independent model of legacy TorchSparse semantics (FACTS.md).

Plain torch and Python dicts only; nothing here imports torch_lattice. Tensors use
legacy layout throughout: ``.kernel`` rows in legacy order, logical coordinates
``(N, 4)`` ``[batch, x, y, z]`` (a stride-s tensor's neighbours are 1 apart).

Semantics written down here:

- Legacy row ``n`` of a ``(Kx, Ky, Kz)`` kernel is position ``(ix, iy, iz)`` with
  ``n = ix + Kx*(iy + Ky*iz)`` (x fastest) for odd volume and
  ``n = (ix*Ky + iy)*Kz + iz`` (z fastest) for even volume, unless a row order is
  forced (MinkowskiEngine: x fastest always; v1.2/v1.3 tuple kernels: z fastest).
- Stride-1 conv with K > 1 is submanifold: ``y[q] = sum_n x[q + i_n - (K-1)//2] @ W[n]``
  over the input support.
- Strided conv (v2.1): ``input = out*s - p + i``; the output set is every ``out`` some
  input reaches, sorted.
- Transposed conv reuses the matching downsample's map: each fine row
  ``+= coarse @ W[n]`` for every (fine, coarse, n) of that map.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

Triple = tuple[int, int, int]


def legacy_row_positions(kernel_size: Triple, row_order: str | None = None) -> list[Triple]:
    """Position ``(ix, iy, iz)`` of every legacy row, in legacy row order."""
    kx, ky, kz = kernel_size
    order = row_order or ("x_fastest" if (kx * ky * kz) % 2 else "z_fastest")
    if order == "x_fastest":
        return [(ix, iy, iz) for iz in range(kz) for iy in range(ky) for ix in range(kx)]
    return [(ix, iy, iz) for ix in range(kx) for iy in range(ky) for iz in range(kz)]


def _index(coords: torch.Tensor) -> dict[tuple[int, ...], int]:
    return {tuple(row): i for i, row in enumerate(coords.tolist())}


def _accumulate(
    out: torch.Tensor, feats: torch.Tensor, kernel: torch.Tensor, pairs: dict[int, list]
) -> torch.Tensor:
    """``out[o] += feats[i] @ kernel[n]`` for every ``(i, o)`` in ``pairs[n]``."""
    for n, pl in pairs.items():
        if not pl:
            continue
        src = torch.tensor([p[0] for p in pl])
        dst = torch.tensor([p[1] for p in pl])
        out = out.index_add(0, dst, feats[src] @ kernel[n])
    return out


def subm_conv(
    coords: torch.Tensor,
    feats: torch.Tensor,
    kernel: torch.Tensor,
    kernel_size: Triple,
    bias: torch.Tensor | None = None,
    row_order: str | None = None,
) -> torch.Tensor:
    """Legacy stride-1 conv (K > 1): centered offsets, output on the input support."""
    lookup = _index(coords)
    pairs: dict[int, list] = {}
    for n, pos in enumerate(legacy_row_positions(kernel_size, row_order)):
        off = [p - (k - 1) // 2 for p, k in zip(pos, kernel_size, strict=True)]
        pl = pairs.setdefault(n, [])
        for o, (b, x, y, z) in enumerate(coords.tolist()):
            i = lookup.get((b, x + off[0], y + off[1], z + off[2]))
            if i is not None:
                pl.append((i, o))
    out = torch.zeros(coords.shape[0], kernel.shape[2], dtype=feats.dtype)
    out = _accumulate(out, feats, kernel, pairs)
    return out if bias is None else out + bias


def downsample_map(
    coords: torch.Tensor,
    kernel_size: Triple,
    stride: Triple,
    padding: Triple = (0, 0, 0),
    row_order: str | None = None,
) -> tuple[torch.Tensor, dict[int, list]]:
    """Legacy v2.1 strided map: ``input = out*s - p + i``.

    Returns:
        ``(out_coords, pairs)`` with ``pairs[n]`` a list of ``(input_row, output_row)``.
    """
    positions = legacy_row_positions(kernel_size, row_order)
    hits = []
    for i, (b, *c) in enumerate(coords.tolist()):
        for n, pos in enumerate(positions):
            num = [c[a] + padding[a] - pos[a] for a in range(3)]
            if all(v >= 0 and v % stride[a] == 0 for a, v in enumerate(num)):
                hits.append((i, n, (b, *(num[a] // stride[a] for a in range(3)))))
    out_coords = sorted({h[2] for h in hits})
    lookup = {c: j for j, c in enumerate(out_coords)}
    pairs: dict[int, list] = {n: [] for n in range(len(positions))}
    for i, n, c in hits:
        pairs[n].append((i, lookup[c]))
    return torch.tensor(out_coords, dtype=torch.int64).reshape(-1, 4), pairs


def strided_conv(
    feats: torch.Tensor, kernel: torch.Tensor, out_rows: int, pairs: dict[int, list]
) -> torch.Tensor:
    """Legacy strided conv on a :func:`downsample_map`."""
    out = torch.zeros(out_rows, kernel.shape[2], dtype=feats.dtype)
    return _accumulate(out, feats, kernel, pairs)


def transposed_conv(
    coarse: torch.Tensor, kernel: torch.Tensor, fine_rows: int, pairs: dict[int, list]
) -> torch.Tensor:
    """Legacy transposed conv: the downsample map reversed, ``fine += coarse @ W[n]``."""
    reverse = {n: [(o, i) for i, o in pl] for n, pl in pairs.items()}
    out = torch.zeros(fine_rows, kernel.shape[2], dtype=coarse.dtype)
    return _accumulate(out, coarse, kernel, reverse)


def pointwise(feats: torch.Tensor, kernel: torch.Tensor, bias: torch.Tensor | None = None):
    """Legacy 1x1x1 conv with a 2-D ``(C_in, C_out)`` kernel."""
    out = feats @ kernel
    return out if bias is None else out + bias


def batch_norm(feats: torch.Tensor, state: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    """``torch.nn.BatchNorm1d`` in eval mode on the features."""
    return F.batch_norm(
        feats,
        state[prefix + "running_mean"],
        state[prefix + "running_var"],
        state[prefix + "weight"],
        state[prefix + "bias"],
        training=False,
        eps=1e-5,
    )


def random_batch_norm_state(
    prefix: str, channels: int, gen: torch.Generator, batches_tracked: int
) -> dict[str, torch.Tensor]:
    """Random float64 eval-mode state of a legacy BatchNorm under ``prefix``: the keys
    :func:`batch_norm` reads, plus ``num_batches_tracked``."""
    f64 = torch.float64
    return {
        prefix + "weight": 1 + 0.3 * torch.randn(channels, generator=gen, dtype=f64),
        prefix + "bias": 0.2 * torch.randn(channels, generator=gen, dtype=f64),
        prefix + "running_mean": 0.3 * torch.randn(channels, generator=gen, dtype=f64),
        prefix + "running_var": 0.5 + torch.rand(channels, generator=gen, dtype=f64),
        prefix + "num_batches_tracked": torch.tensor(batches_tracked),
    }
