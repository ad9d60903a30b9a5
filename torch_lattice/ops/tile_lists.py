"""Tile lists of neighbour tables, kept with the table (csrc/core/tl_tile_lists.h).

Every implicit-GEMM forward on the CPU lists, for each tile of output rows, each kernel
row's present entries of the ``(N_out, K)`` table. That listing reads the whole table on
every call and does not shrink with the channels: about a quarter of a C = 16 forward on
a LiDAR scan. A table that several calls run over (the layers of a network level, and
the input gradients that run over the reversed table) is listed once instead, from its
second call on, and the lists are kept beside the table for as long as the table lives.
The forward over the lists is bitwise the forward over the table.

Lists are built only where the forward can use them (``_C.conv_list_rows``: float32 and
float64 outputs of at most 128 bytes a row, so C_out <= 32 in float32), for the tile
size of the call (it depends on the thread count; at most two sizes are kept a table).
A table modified in place is listed again; an inference tensor (made under
``torch.inference_mode``) has no version counter, so such a table, like a ``KernelMap``'s
pair lists, must not be modified in place after its first call. Lists cost 8 bytes a
present entry (a LiDAR scan's 3x3x3 submanifold table: 7 MB beside its own 17 MB) and
are dropped with the table, or by :func:`clear_tile_lists`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch
from torch.utils.weak import WeakIdKeyDictionary

from torch_lattice.ops._runtime import _C, ptr, threads

__all__ = ["TileLists", "clear_tile_lists", "kept_tile_lists", "tile_lists"]

# Tile sizes kept per table: one per thread count a process runs at, in practice.
MAX_SIZES = 2


@dataclass(frozen=True)
class TileLists:
    """One table's lists for tiles of ``tile_rows`` output rows.

    Attributes:
        tile_rows: output rows per tile.
        top: the largest input row listed, plus one.
        start: ``(tiles * K + 1,)`` int64: tile ``t``'s kernel row ``n`` lists entries
            ``start[t * K + n]:start[t * K + n + 1]``.
        rows_in: the entries' input rows (int32).
        rows_out: their output rows within the tile (int32).
    """

    tile_rows: int
    top: int
    start: torch.Tensor
    rows_in: torch.Tensor
    rows_out: torch.Tensor


@dataclass
class _Entry:
    version: int
    data_ptr: int
    calls: int = 0
    sizes: dict[int, TileLists] = field(default_factory=dict)


_cache: WeakIdKeyDictionary = WeakIdKeyDictionary()
_lock = threading.Lock()


def _build(nbr: torch.Tensor, tile_rows: int) -> TileLists:
    n_out, k = nbr.shape
    tiles = (n_out + tile_rows - 1) // tile_rows
    start = torch.empty(tiles * k + 1, dtype=torch.int64)
    top = _C.tile_lists_count(ptr(nbr), n_out, k, tile_rows, ptr(start), threads())
    entries = int(start[-1])
    rows_in = torch.empty(entries, dtype=torch.int32)
    rows_out = torch.empty(entries, dtype=torch.int32)
    _C.tile_lists_fill(
        ptr(nbr), n_out, k, tile_rows, ptr(start), ptr(rows_in), ptr(rows_out), threads()
    )
    return TileLists(tile_rows, top, start, rows_in, rows_out)


def _version(t: torch.Tensor) -> int:
    """``t``'s version counter, or -1 for an inference tensor, which has none."""
    return -1 if t.is_inference() else t._version


def tile_lists(nbr: torch.Tensor, tile_rows: int) -> TileLists | None:
    """``nbr``'s lists for tiles of ``tile_rows`` rows, from the table's second call on
    (None on its first, and for a table that is not a contiguous CPU tensor, whose
    every call may be a new copy). ``nbr`` is the int32 ``(N_out, K)`` table the op was
    given, already checked; ``tile_rows`` is ``_C.conv_list_rows`` of the call (> 0)."""
    if nbr.device.type != "cpu" or not nbr.is_contiguous() or tile_rows < 1:
        return None
    version, data = _version(nbr), nbr.data_ptr()
    with _lock:
        entry = _cache.get(nbr)
        if entry is None or entry.version != version or entry.data_ptr != data:
            entry = _Entry(version, data)  # new, or changed in place: listed again
            _cache[nbr] = entry
        entry.calls += 1
        if entry.calls < 2:
            return None  # a table run over once is listed by its call, as before
        hit = entry.sizes.get(tile_rows)
    if hit is not None:
        return hit
    built = _build(nbr, tile_rows)
    with _lock:
        if len(entry.sizes) >= MAX_SIZES:
            entry.sizes.pop(next(iter(entry.sizes)))
        entry.sizes[tile_rows] = built
    return built


def kept_tile_lists(nbr: torch.Tensor, tile_rows: int) -> TileLists | None:
    """``nbr``'s lists for tiles of ``tile_rows`` rows if a forward has built them
    (the weight gradient runs over its forward's), without counting a call."""
    if nbr.device.type != "cpu" or not nbr.is_contiguous() or tile_rows < 1:
        return None
    with _lock:
        entry = _cache.get(nbr)
        if entry is None or entry.version != _version(nbr) or entry.data_ptr != nbr.data_ptr():
            return None
        return entry.sizes.get(tile_rows)


def clear_tile_lists() -> None:
    """Drops every kept list (they are rebuilt on a table's next two calls)."""
    with _lock:
        _cache.clear()
