"""Dense-convolution oracle for the Torch Lattice conformance tests (no tests here).

API.md defines every sparse convolution through a dense equivalent: scatter the
sparse features into a dense ``[B, C, X, Y, Z]`` grid, run
``torch.nn.functional.conv3d`` with the dense weight
``w[o, i, rx, ry, rz] = weight[n(rx, ry, rz), i, o]`` and read the result at the
output support. Everything here uses plain torch and python only, so the oracle stays
independent of the library under test. All tensor helpers are differentiable in
``feats``, ``weight`` and ``bias`` so that backward can be compared as well.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

Triple = tuple[int, int, int]
IntOrTriple = int | Sequence[int]


def triple(value: IntOrTriple) -> Triple:
    """Broadcast an int to a 3-tuple; check that a sequence has three entries."""
    if isinstance(value, int):
        return (value, value, value)
    out = tuple(int(v) for v in value)
    if len(out) != 3:
        raise ValueError(f"expected an int or a 3-tuple, got {value!r}")
    return (out[0], out[1], out[2])


def kernel_offsets(kernel_size: IntOrTriple) -> list[Triple]:
    """Kernel positions in canonical row order: row n = (rx*Ky + ry)*Kz + rz."""
    kx, ky, kz = triple(kernel_size)
    return [(rx, ry, rz) for rx in range(kx) for ry in range(ky) for rz in range(kz)]


def kernel_volume(kernel_size: IntOrTriple) -> int:
    kx, ky, kz = triple(kernel_size)
    return kx * ky * kz


def dense_weight(weight: torch.Tensor, kernel_size: IntOrTriple) -> torch.Tensor:
    """(K, C_in, C_out) sparse weight -> (C_out, C_in, Kx, Ky, Kz) conv3d weight.

    The row index is computed from the documented formula rather than by a reshape so
    the oracle does not silently share a layout assumption with the implementation.
    """
    kx, ky, kz = triple(kernel_size)
    rx = torch.arange(kx).view(kx, 1, 1)
    ry = torch.arange(ky).view(1, ky, 1)
    rz = torch.arange(kz).view(1, 1, kz)
    rows = (rx * ky + ry) * kz + rz  # (Kx, Ky, Kz) -> row n
    return weight[rows].permute(4, 3, 0, 1, 2)  # [rx,ry,rz,i,o] -> [o,i,rx,ry,rz]


def inferred_range(coords: torch.Tensor) -> Triple:
    """R when no spatial_range is given: max(coords[:, 1:]) + 1 per axis."""
    if coords.shape[0] == 0:
        return (0, 0, 0)
    top = coords[:, 1:].long().max(dim=0).values + 1
    return (int(top[0]), int(top[1]), int(top[2]))


def output_range(
    spatial: Sequence[int],
    kernel_size: IntOrTriple,
    stride: IntOrTriple = 1,
    padding: IntOrTriple = 0,
    dilation: IntOrTriple = 1,
) -> Triple:
    """R_out = (R + 2p - d*(K-1) - 1) // s + 1 per axis."""
    k, s, p, d = triple(kernel_size), triple(stride), triple(padding), triple(dilation)
    out = [(spatial[a] + 2 * p[a] - d[a] * (k[a] - 1) - 1) // s[a] + 1 for a in range(3)]
    return (out[0], out[1], out[2])


def scatter_dense(
    feats: torch.Tensor, coords: torch.Tensor, batches: int, extent: Sequence[int]
) -> torch.Tensor:
    """Scatter (N, C) feats at (N, 4) [b, x, y, z] coords into [B, C, X, Y, Z]."""
    c = coords.long()
    grid = feats.new_zeros((batches, extent[0], extent[1], extent[2], feats.shape[1]))
    # Out-of-place index_put keeps the scatter differentiable wrt feats.
    grid = grid.index_put((c[:, 0], c[:, 1], c[:, 2], c[:, 3]), feats)
    return grid.permute(0, 4, 1, 2, 3)


def dense_conv_at(
    feats: torch.Tensor,
    coords: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out_coords: torch.Tensor,
    kernel_size: IntOrTriple,
    stride: IntOrTriple = 1,
    padding: IntOrTriple = 0,
    dilation: IntOrTriple = 1,
) -> torch.Tensor:
    """Dense conv3d of the scattered input, read at ``out_coords`` -> (M, C_out).

    The dense grid is grown until every requested output has a full window; extra
    zero cells change nothing, and this lets targets lie anywhere in [0, R_out).
    """
    k, s, p, d = triple(kernel_size), triple(stride), triple(padding), triple(dilation)
    out = out_coords.long()
    inp = coords.long()
    extent = []
    for a in range(3):
        need = 1
        if inp.shape[0]:
            need = max(need, int(inp[:, a + 1].max()) + 1)
        if out.shape[0]:
            top = int(out[:, a + 1].max())
            need = max(need, top * s[a] - p[a] + d[a] * (k[a] - 1) + 1)
        extent.append(need)
    batches = 1
    for t in (inp, out):
        if t.shape[0]:
            batches = max(batches, int(t[:, 0].max()) + 1)
    grid = scatter_dense(feats, coords, batches, extent)
    dense = F.conv3d(grid, dense_weight(weight, k), bias, stride=s, padding=p, dilation=d)
    dense = dense.permute(0, 2, 3, 4, 1)  # [B, X, Y, Z, C_out]
    return dense[out[:, 0], out[:, 1], out[:, 2], out[:, 3]]


def dense_subm(
    feats: torch.Tensor,
    coords: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    kernel_size: IntOrTriple,
    dilation: IntOrTriple = 1,
) -> torch.Tensor:
    """SubmConv3d oracle: stride 1, padding d*(K-1)/2, read at the input coords."""
    k, d = triple(kernel_size), triple(dilation)
    pad = tuple(d[a] * (k[a] - 1) // 2 for a in range(3))
    return dense_conv_at(feats, coords, weight, bias, coords, k, 1, pad, d)


def expected_conv_support(
    coords: torch.Tensor,
    kernel_size: IntOrTriple,
    stride: IntOrTriple = 1,
    padding: IntOrTriple = 0,
    dilation: IntOrTriple = 1,
    spatial_range: Sequence[int] | None = None,
) -> torch.Tensor:
    """Brute-force generated Conv3d support, (M, 4) int64 sorted by (b, x, y, z).

    q is an output iff 0 <= q < R_out per axis and some kernel position r has the
    input q*s - p + r*d present in the same batch. Enumerated from the inputs: each
    input c and offset r give q = (c + p - r*d) / s when that division is exact.
    """
    k, s, p, d = triple(kernel_size), triple(stride), triple(padding), triple(dilation)
    spatial = (
        tuple(int(v) for v in spatial_range[1:])
        if spatial_range is not None
        else inferred_range(coords)
    )
    r_out = output_range(spatial, k, s, p, d)
    found: set[tuple[int, int, int, int]] = set()
    for b, *c in coords.long().tolist():
        for r in kernel_offsets(k):
            q = []
            for a in range(3):
                num = c[a] + p[a] - r[a] * d[a]
                if num < 0 or num % s[a] or num // s[a] >= r_out[a]:
                    break
                q.append(num // s[a])
            else:
                found.add((b, q[0], q[1], q[2]))
    rows = sorted(found)
    return torch.tensor(rows, dtype=torch.int64).reshape(len(rows), 4)


def random_geometry(
    seed: int,
    batches: int,
    extent: Sequence[int],
    density: float,
    channels: int,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random unique non-negative coords in [0, extent) for each batch, shuffled rows.

    Returns (feats (N, channels) ``dtype``, coords (N, 4) int32). Every batch gets at
    least one point; row order is deliberately not sorted so that tests notice any
    implementation that reorders its input.
    """
    gen = torch.Generator().manual_seed(seed)
    x, y, z = (int(v) for v in extent)
    cells = x * y * z
    per_batch = max(1, round(density * cells))
    parts = []
    for b in range(batches):
        flat = torch.randperm(cells, generator=gen)[:per_batch]
        part = torch.stack(
            [torch.full_like(flat, b), flat // (y * z), (flat // z) % y, flat % z],
            dim=1,
        )
        parts.append(part)
    coords = torch.cat(parts)
    coords = coords[torch.randperm(coords.shape[0], generator=gen)]
    if coords.shape[0] > 1 and is_sorted(coords):
        coords = coords.flip(0)  # a sorted shuffle would hide reordering bugs
    feats = torch.randn(coords.shape[0], channels, generator=gen, dtype=torch.float64)
    return feats.to(dtype), coords.to(torch.int32)


def is_sorted(coords: torch.Tensor) -> bool:
    """True when rows are in ascending lexicographic (b, x, y, z) order."""
    rows = [tuple(r) for r in coords.tolist()]
    return rows == sorted(rows)


# --------------------------------------------------------------------------------------
# Transposed convolution: y[t] = b + sum over (n, i) with src[i]*s + r_n*d - p == t
# --------------------------------------------------------------------------------------


def dense_weight_transposed(weight: torch.Tensor, kernel_size: IntOrTriple) -> torch.Tensor:
    """(K, C_in, C_out) sparse weight -> (C_in, C_out, Kx, Ky, Kz) conv_transpose3d weight."""
    return dense_weight(weight, kernel_size).transpose(0, 1)


def dense_conv_transpose_at(
    feats: torch.Tensor,
    coords: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out_coords: torch.Tensor,
    kernel_size: IntOrTriple,
    stride: IntOrTriple = 1,
    padding: IntOrTriple = 0,
    dilation: IntOrTriple = 1,
) -> torch.Tensor:
    """Dense conv_transpose3d of the scattered coarse input, read at ``out_coords``.

    The coarse grid is grown (extra zero cells change nothing) until torch's dense
    output, ``(N - 1)*s - 2p + d*(K - 1) + 1`` per axis, holds every requested row;
    torch's own ``padding`` argument applies ``p``. Returns (M, C_out).
    """
    k, s, p, d = triple(kernel_size), triple(stride), triple(padding), triple(dilation)
    out = out_coords.long()
    inp = coords.long()
    extent = []
    for a in range(3):
        n = int(inp[:, a + 1].max()) + 1 if inp.shape[0] else 1
        top = int(out[:, a + 1].max()) if out.shape[0] else 0
        while (n - 1) * s[a] - 2 * p[a] + d[a] * (k[a] - 1) + 1 <= max(top, 0):
            n += 1
        extent.append(n)
    batches = 1
    for t in (inp, out):
        if t.shape[0]:
            batches = max(batches, int(t[:, 0].max()) + 1)
    grid = scatter_dense(feats, coords, batches, extent)
    dense = F.conv_transpose3d(
        grid, dense_weight_transposed(weight, k), bias, stride=s, padding=p, dilation=d
    )
    dense = dense.permute(0, 2, 3, 4, 1)  # [B, X, Y, Z, C_out]
    return dense[out[:, 0], out[:, 1], out[:, 2], out[:, 3]]


def transpose_reach(
    coords: torch.Tensor,
    kernel_size: IntOrTriple,
    stride: IntOrTriple = 1,
    padding: IntOrTriple = 0,
    dilation: IntOrTriple = 1,
) -> set[tuple[int, int, int, int]]:
    """Every non-negative fine row ``src*s + r*d - p`` (same batch) by brute force."""
    k, s, p, d = triple(kernel_size), triple(stride), triple(padding), triple(dilation)
    found: set[tuple[int, int, int, int]] = set()
    for b, *c in coords.long().tolist():
        for r in kernel_offsets(k):
            t = [c[a] * s[a] + r[a] * d[a] - p[a] for a in range(3)]
            if min(t) >= 0:
                found.add((b, t[0], t[1], t[2]))
    return found


def expected_generative_support(
    coords: torch.Tensor, kernel_size: IntOrTriple, stride: IntOrTriple
) -> torch.Tensor:
    """Brute-force generative transpose support: unique{src*s + r}, sorted, (M, 4) int64."""
    rows = sorted(transpose_reach(coords, kernel_size, stride))
    return torch.tensor(rows, dtype=torch.int64).reshape(len(rows), 4)
