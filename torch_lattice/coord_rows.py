"""Sorted unique coordinate rows, fast.

``torch.unique(rows, dim=0)`` sorts rows lexicographically, i.e. by ``(b, x, y, z)``,
but row-wise it is slow (seconds for a few hundred thousand rows on one CPU thread).
Non-negative rows map to int64 keys ``((b*X + x)*Y + y)*Z + z`` with the mixed radix
``X, Y, Z = max + 1`` per column, which keeps that order, so one 1-D ``unique`` does the
same work; rows whose radix product does not fit int64 take the row-wise path.
"""

from __future__ import annotations

import torch

__all__ = ["floor_rows", "lookup_rows", "unique_rows"]

_KEY_LIMIT = 2**63


def unique_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(unique, inverse)`` of non-negative ``(N, 4)`` integer rows.

    ``unique`` is ``(M, 4)`` in ``rows.dtype`` sorted by ``(b, x, y, z)``, and
    ``inverse`` the ``(N,)`` long index of each row in it: exactly what
    ``torch.unique(rows, dim=0, return_inverse=True)`` returns.
    """
    if rows.shape[0] == 0:
        return rows.new_empty((0, 4)), torch.empty(0, dtype=torch.long, device=rows.device)
    radix = [int(v) + 1 for v in rows.amax(dim=0).tolist()]
    if radix[0] * radix[1] * radix[2] * radix[3] >= _KEY_LIMIT:
        return torch.unique(rows, dim=0, return_inverse=True)
    r = rows.long()
    key = ((r[:, 0] * radix[1] + r[:, 1]) * radix[2] + r[:, 2]) * radix[3] + r[:, 3]
    keys, inverse = torch.unique(key, return_inverse=True)
    cols = []
    for base in (radix[3], radix[2], radix[1]):
        cols.append(keys % base)
        keys = keys // base
    cols.append(keys)
    unique = torch.stack(cols[::-1], dim=1).to(rows.dtype)
    return unique, inverse


def lookup_rows(source: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """``(M,)`` long: the row of ``source`` equal to each ``query`` row, -1 if none.

    ``source`` holds unique non-negative ``(N, 4)`` integer rows; a ``query`` row with a
    negative component matches none (the packed keys assume non-negative rows, where
    ``(0, 1, -1, z)`` would alias ``(0, 0, Y - 1, z)``).
    """
    out = torch.full((query.shape[0],), -1, dtype=torch.long, device=query.device)
    valid = (query >= 0).all(dim=1)
    query = query[valid]
    if source.shape[0] == 0 or query.shape[0] == 0:
        return out
    _, inverse = unique_rows(torch.cat((source, query)))
    table = torch.full((int(inverse.max()) + 1,), -1, dtype=torch.long, device=query.device)
    table[inverse[: source.shape[0]]] = torch.arange(source.shape[0], device=query.device)
    out[valid] = table[inverse[source.shape[0] :]]
    return out


def floor_rows(rows: torch.Tensor, stride: tuple[int, int, int]) -> torch.Tensor:
    """``unique{[b, floor(x / sx), floor(y / sy), floor(z / sz)]}`` of non-negative
    ``(N, 4)`` rows as int64, sorted by ``(b, x, y, z)``: the cells of a coarser lattice
    that hold a row (the artifact contract's no-target strided support)."""
    scale = torch.tensor((1, *stride), dtype=torch.int64, device=rows.device)
    return unique_rows(torch.div(rows.to(torch.int64), scale, rounding_mode="floor"))[0]
