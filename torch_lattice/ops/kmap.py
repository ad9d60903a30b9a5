"""Kernel-map ops: supports, neighbour tables and pair lists.

``lattice::generate_support`` and ``lattice::generative_support`` build output
supports; ``lattice::kernel_map`` and ``lattice::neighbour_table`` the
neighbour tables; ``lattice::kernel_pairs`` the CSR pair lists of the
fetch-on-demand and gather-scatter dataflows (docs/kernel-maps.md).

The neighbour-table format is described in csrc/core/tl_kmap.h: ``nbr`` is
``(N_out, K)`` int32 with the input row feeding each output row through each
kernel row (-1 where absent); ``rev`` is its ``(N_in, K)`` transpose.

Each op's body is its CPU kernel and a fake kernel sits beside it; the CUDA
kernels are registered by :mod:`torch_lattice.ops.kmap_cuda`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from torch_lattice.geometry import ConvGeometry
from torch_lattice.locked_cache import get_or_build
from torch_lattice.memory_budget import check_allocation
from torch_lattice.ops._runtime import (
    _C,
    call_args,
    check_coords,
    check_copies,
    check_non_negative,
    check_size,
    check_tensor,
    one_device,
    ptr,
    require_cpu,
    threads,
)

__all__ = [
    "DENSE_SLOTS_PER_PAIR",
    "KernelMap",
    "PairLists",
    "bad_table_entries",
    "build_kernel_map",
    "build_transpose_pairs",
    "check_geometry",
    "check_num_batches",
    "conv_geom",
    "generate_bound_within_budget",
    "generate_support",
    "generative_support",
    "kernel_map",
    "kernel_pairs",
    "neighbour_table",
    "reverse_pairs",
    "reverse_table",
    "sparse_table",
]


class PairLists(NamedTuple):
    """CSR pair lists: ``offsets (K+1,)`` int64, ``pair_in``/``pair_out`` ``(P,)`` int32."""

    offsets: torch.Tensor
    pair_in: torch.Tensor
    pair_out: torch.Tensor


def reverse_pairs(
    offsets: torch.Tensor, pair_in: torch.Tensor, pair_out: torch.Tensor
) -> PairLists:
    """Pair lists of the reversed relation, from the forward ones, without a host sync.

    A kernel row has the same pairs either way, so ``offsets`` stay and ``pair_in`` and
    ``pair_out`` swap.  On the CPU the pairs of each kernel row are then sorted by their new
    output row (one argsort), because the CPU dataflows check that outputs strictly increase
    within a kernel row; the result equals ``kernel_pairs(rev)``.  The CUDA dataflows take
    any order (they add with atomics), so on CUDA the swap is all.
    """
    if offsets.device.type != "cpu":
        return PairLists(offsets, pair_out, pair_in)
    k = offsets.shape[0] - 1
    rows = torch.repeat_interleave(
        torch.arange(k, dtype=torch.int64), offsets.diff(), output_size=pair_in.shape[0]
    )
    # pair_in < 2**31 and k < 2**31: (row, new output row) packs into one int64 key
    order = torch.argsort((rows << 32) | pair_in.to(torch.int64))
    return PairLists(offsets, pair_out[order], pair_in[order])


def bad_table_entries(op: str, cause: object = None) -> str:
    """The message of a neighbour table ``nbr`` with an entry below -1."""
    why = f" ({cause})" if cause is not None else ""
    return (
        f"lattice::{op}: every entry of the table nbr must be -1 (no neighbour) or an "
        f"input row in [0, N_in){why}"
    )


def _check_reverse_table(nbr: torch.Tensor, n_in: int | torch.SymInt) -> None:
    """``reverse_table``'s argument rules, which its real and fake kernels share."""
    check_tensor("reverse_table", "nbr", nbr, (torch.int32,), ("N_out", "K"))
    rule = f"lattice::reverse_table: n_in must be a non-negative int, got {n_in!r}"
    if isinstance(n_in, bool) or not isinstance(n_in, (int, torch.SymInt)):
        raise ValueError(rule)
    check_size(n_in >= 0, lambda: rule)


@torch.library.custom_op("lattice::reverse_table", mutates_args=())
def reverse_table(nbr: torch.Tensor, n_in: int) -> torch.Tensor:
    """The ``(n_in, K)`` int32 transpose ``rev`` of an ``(N_out, K)`` table, on its
    device (what ``kernel_map`` returns beside ``nbr``), for callers that hold ``nbr``
    alone: the double backward of ``lattice::sparse_conv_weight_grad``. An op (with a
    fake kernel) rather than a plain function, so that backward can be traced with fake
    tensors (``torch.library.opcheck``, AOT autograd), which have no data to read.

    Raises:
        ValueError: (a ``MemoryBudgetError``) the table would exceed the memory budget,
            ``nbr`` is not an int32 ``(N_out, K)`` table, ``n_in`` is negative, or (from
            C) an entry of ``nbr`` is outside ``[-1, n_in)``.
    """
    _check_reverse_table(nbr, n_in)
    n_out, k = nbr.shape
    check_allocation(f"reversed neighbour table ({n_in} rows x {k} kernel rows, int32)",
                     n_in * k * 4)  # fmt: skip
    check_copies("reverse_table", nbr=nbr)
    nbr = nbr.contiguous()
    rev = torch.empty((n_in, k), dtype=torch.int32, device=nbr.device)
    if nbr.device.type == "cuda":
        index, stream = call_args(nbr.device)
        _C.cuda_kmap_reverse(index, stream, ptr(nbr), n_out, k, n_in, ptr(rev))
    else:
        _C.kmap_reverse(ptr(nbr), n_out, k, n_in, ptr(rev), threads())
    return rev


@reverse_table.register_fake
def _(nbr: torch.Tensor, n_in: int) -> torch.Tensor:
    _check_reverse_table(nbr, n_in)
    return nbr.new_empty((n_in, nbr.shape[1]))


@torch.library.custom_op("lattice::kernel_pairs", mutates_args=())
def kernel_pairs(nbr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(offsets, pair_in, pair_out)`` of an ``(N_out, K)`` int32 table.

    Pairs of kernel row ``n`` are ``offsets[n]:offsets[n + 1]``, sorted by ``pair_out``.
    Entries must be -1 (no neighbour) or an input row (>= 0; the row's bound is checked
    by the op that reads the pairs, which knows ``N_in``).
    """
    require_cpu("kernel_pairs", nbr)
    check_tensor("kernel_pairs", "nbr", nbr, (torch.int32,), ("N_out", "K"))
    check_copies("kernel_pairs", nbr=nbr)
    nbr = nbr.contiguous()
    n_out, k = nbr.shape
    offsets = torch.empty(k + 1, dtype=torch.int64)
    try:  # the C count refuses entries below -1 in the pass it makes anyway
        _C.pairs_count(ptr(nbr), n_out, k, ptr(offsets), threads())
    except ValueError as e:
        raise ValueError(bad_table_entries("kernel_pairs", e)) from e
    total = int(offsets[-1])
    check_allocation(f"lattice::kernel_pairs: {total} pairs", total * 8)
    pair_in = torch.empty(total, dtype=torch.int32)
    pair_out = torch.empty(total, dtype=torch.int32)
    _C.pairs_fill(ptr(nbr), n_out, k, ptr(offsets), ptr(pair_in), ptr(pair_out), threads())
    return offsets, pair_in, pair_out


@kernel_pairs.register_fake
@one_device("kernel_pairs")
def _(nbr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    check_tensor("kernel_pairs", "nbr", nbr, (torch.int32,), ("N_out", "K"))
    p = torch.library.get_ctx().new_dynamic_size()
    return (
        nbr.new_empty((nbr.shape[1] + 1,), dtype=torch.int64),
        nbr.new_empty((p,)),
        nbr.new_empty((p,)),
    )


@dataclass(frozen=True)
class KernelMap:
    """Relation between an input support and an output support.

    Attributes:
        nbr: ``(N_out, K)`` int32, ``nbr[o, n] = i`` iff
            ``in[i] == out[o] * stride - padding + r_n * dilation``, else -1.
        rev: ``(N_in, K)`` int32 transpose of ``nbr``.
        geometry: the relation's geometry.
    """

    nbr: torch.Tensor
    rev: torch.Tensor
    geometry: ConvGeometry
    _pairs: dict[bool, PairLists] = field(default_factory=dict, compare=False, repr=False)
    # Guards _pairs: threads sharing a map build each direction's pair lists once.
    _lock: threading.RLock = field(default_factory=threading.RLock, compare=False, repr=False)

    def pairs(self, transposed: bool = False) -> PairLists:
        """CSR pair lists of the relation (built on first use, then cached).

        ``transposed=False`` lists (input, output) pairs sorted by output row;
        ``transposed=True`` the reversed relation's, sorted by input row.
        Each direction is built only when asked for: one ``kernel_pairs``
        call (on CUDA, one readback of the pair count).
        """

        return get_or_build(
            self._pairs, transposed, self._lock,
            lambda: PairLists(*kernel_pairs(self.rev if transposed else self.nbr)),
        )

    def relation_pairs(self, transposed: bool = False) -> PairLists:
        """Pair lists for running the relation in one direction, building as little as possible.

        On the CPU this is :meth:`pairs` of that direction (``kernel_pairs`` of its
        table: 4-9 ms on a 90k- to 158k-voxel submanifold map, where sorting the other
        direction's lists took 30-37 ms). On CUDA it returns :meth:`pairs` of that
        direction when cached; otherwise derives them from the other direction's cached
        lists with ``reverse_pairs`` (a swap, unsorted within a kernel row, which the CUDA
        dataflows accept; not cached); otherwise builds :meth:`pairs` of that direction.
        So on CUDA a map run forward, backward and transposed builds one pair list from a
        neighbour table.
        """
        if self.nbr.device.type == "cpu" or transposed in self._pairs:
            return self.pairs(transposed)
        other = self._pairs.get(not transposed)
        if other is not None:
            return reverse_pairs(*other)  # the CUDA swap is not pairs(transposed): not cached
        return self.pairs(transposed)


# The smallest and largest value of each geometry list: padding may be 0, the others
# are sizes or steps, and every entry must fit the C core's int32 (an output range counts
# the coordinates from 0, so 2^31 of them). Checked here, not through geometry.triple, so
# that a layer call's map build stays within this file (tests/project/test_file_switches.py).
_INT32_MAX = 2**31 - 1
_GEOMETRY_BOUNDS = {"kernel_size": (1, _INT32_MAX), "stride": (1, _INT32_MAX),
                    "padding": (0, _INT32_MAX), "dilation": (1, _INT32_MAX),
                    "out_range": (0, _INT32_MAX + 1)}  # fmt: skip


def check_geometry(op: str, **lists: list[int]) -> None:
    """Raises ``ValueError`` unless each of ``lists`` (named ``kernel_size``, ``stride``,
    ``padding``, ``dilation`` or ``out_range``) holds three ints, at least 1
    (``padding`` and ``out_range``: 0) and at most 2^31 - 1 (``out_range``: 2^31, the
    count of int32 coordinates from 0).

    Checked before the lists' product sizes a tensor: a negative kernel size would
    otherwise reach torch as a negative dimension and a short list ``zip``'s message.
    Under ``torch.compile`` the fake kernels see symbolic ints where dynamo made a size
    dynamic (two layers with different kernel sizes, ``dynamic=True``): their bounds are
    asserted through :func:`check_size`, checked when the graph runs."""
    for name, values in lists.items():
        _check_axes(op, name, values, *_GEOMETRY_BOUNDS[name])


def _check_axes(op: str, name: str, values: object, low: int, high: int) -> None:
    """:func:`check_geometry` of one list, whose values must lie in ``[low, high]``."""
    rule = ("three positive ints" if low else "three non-negative ints") + (
        f" (one per axis, at most {'2^31' if high > _INT32_MAX else '2^31 - 1'})"
    )  # fmt: skip

    def message() -> str:
        return f"lattice::{op}: {name} must be {rule}, got {values!r}"

    if not isinstance(values, (list, tuple)) or len(values) != 3:
        raise ValueError(message())
    for v in values:
        if isinstance(v, torch.SymInt):
            check_size(v >= low, message)
            check_size(v <= high, message)
        elif isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise ValueError(message())


def conv_geom(
    kernel_size: list[int], stride: list[int], padding: list[int], dilation: list[int]
) -> tuple[tuple[int, ...], ...]:
    """The geometry tuple the C entry points take: ``(kernel_size, stride, padding,
    dilation)``, each a 3-tuple."""
    return (tuple(kernel_size), tuple(stride), tuple(padding), tuple(dilation))


# Scratch of the CPU's support generation per input row: up to 8 candidates (kernels
# reaching more take the hash table, whose size follows the outputs) as 8-byte keys,
# and as many again while they are radix-sorted.
CPU_GENERATE_SCRATCH = 8 * 8 * 2


def generate_bound_within_budget(
    n: int, geom: tuple, rng: tuple, num_batches: int, scratch_per_row: int = 0
) -> int:
    """The output-row bound of a strided support, checked against the memory budget:
    it is allocated (int32 x 4 per row; committed at once on a GPU) before the rows
    are known, with ``scratch_per_row`` bytes per input row beside it."""
    bound = int(_C.generate_bound(n, geom, rng, num_batches))
    check_allocation(
        f"strided support generation ({n} input rows, kernel_size {geom[0]}, "
        f"stride {geom[1]}: up to {bound} output rows)",
        bound * 16 + n * scratch_per_row,
    )
    return bound


def check_num_batches(op: str, coords: torch.Tensor, num_batches: int) -> None:
    """Raises ``ValueError`` unless ``num_batches`` is a non-negative int above every
    batch index of ``coords`` (checked ``(N, 4)`` rows): the output's capacity is sized
    from it, so a batch index at or past it would overflow that bound.  One pass over the
    batch column (on CUDA one readback), small beside the generation's own passes."""
    if not isinstance(num_batches, int) or isinstance(num_batches, bool) or num_batches < 0:
        raise ValueError(
            f"lattice::{op}: num_batches must be a non-negative int, got {num_batches!r}"
        )
    largest = int(coords[:, 0].max()) if coords.shape[0] else -1
    if largest >= num_batches:
        raise ValueError(
            f"lattice::{op}: num_batches ({num_batches}) must exceed every batch index of "
            f"coords (the largest is {largest})"
        )


@torch.library.custom_op("lattice::generate_support", mutates_args=())
def generate_support(
    coords: torch.Tensor,
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    out_range: list[int],
    num_batches: int,
) -> torch.Tensor:
    """Output support of a strided convolution: ``(M, 4)`` int32, sorted.

    Every ``q`` in ``[0, out_range)`` per axis with some kernel row mapping it
    onto an input row of the same batch (see docs/semantics.md).  ``coords`` are
    non-negative rows (batch index and coordinates, as a ``SparseTensor``'s);
    ``num_batches`` must exceed every batch index of ``coords`` (it bounds the output's
    size).
    """
    check_geometry("generate_support", kernel_size=kernel_size, stride=stride, padding=padding,
                   dilation=dilation, out_range=out_range)  # fmt: skip
    require_cpu("generate_support", coords)
    check_coords("generate_support", "coords", coords)
    check_non_negative("generate_support", "coords", coords)
    check_num_batches("generate_support", coords, num_batches)
    geom = conv_geom(kernel_size, stride, padding, dilation)
    rng = tuple(out_range)
    check_copies("generate_support", coords=coords)
    coords = coords.contiguous()
    n = coords.shape[0]
    bound = generate_bound_within_budget(n, geom, rng, num_batches, CPU_GENERATE_SCRATCH)
    # Pages of an untouched allocation are never committed, so a loose upper
    # bound costs address space only; the result is copied out compactly.
    out = torch.empty((bound, 4), dtype=torch.int32)
    m = _C.generate(ptr(coords), n, geom, rng, ptr(out), bound)
    return out[:m].clone()


@generate_support.register_fake
@one_device("generate_support")
def _(coords, kernel_size, stride, padding, dilation, out_range, num_batches):
    # The rules of the rows' values (non-negative, num_batches above every batch index)
    # need the data: the real kernels check those.
    check_geometry("generate_support", kernel_size=kernel_size, stride=stride, padding=padding,
                   dilation=dilation, out_range=out_range)  # fmt: skip
    check_coords("generate_support", "coords", coords)
    m = torch.library.get_ctx().new_dynamic_size()
    return coords.new_empty((m, 4))


@torch.library.custom_op("lattice::generative_support", mutates_args=())
def generative_support(
    coords: torch.Tensor, kernel_size: list[int], stride: list[int]
) -> torch.Tensor:
    """Support of a generative transpose: ``unique{coords * stride + r}``,
    ``(M, 4)`` int32 sorted by (b, x, y, z), never clipped.
    """
    check_geometry("generative_support", kernel_size=kernel_size, stride=stride)
    require_cpu("generative_support", coords)
    check_coords("generative_support", "coords", coords)
    check_copies("generative_support", coords=coords)
    coords = coords.contiguous()
    geom = conv_geom(kernel_size, stride, [0, 0, 0], [1, 1, 1])
    k = kernel_size[0] * kernel_size[1] * kernel_size[2]
    n = coords.shape[0]
    check_allocation(
        f"generative support ({n} input rows x {k} kernel rows, kernel_size "
        f"{tuple(kernel_size)}: (rows x 4) int32 before duplicates are removed)",
        n * k * 16 * 2,
    )
    out = torch.empty((n * k, 4), dtype=torch.int32)
    m = _C.generative(ptr(coords), n, geom, ptr(out), n * k)
    return out[:m].clone()


@generative_support.register_fake
@one_device("generative_support")
def _(coords, kernel_size, stride):
    check_geometry("generative_support", kernel_size=kernel_size, stride=stride)
    check_coords("generative_support", "coords", coords)
    m = torch.library.get_ctx().new_dynamic_size()
    return coords.new_empty((m, 4))


def _self_submanifold(in_coords: torch.Tensor, out_coords: torch.Tensor, *geometry: list[int]
                      ) -> bool:
    """Whether a map relates one coordinate tensor (the same memory) with itself through
    a kernel whose offsets are symmetric: ``geometry`` (kernel size, stride, padding,
    dilation) has stride 1 and an odd size centred by its padding on every axis."""
    same = (
        in_coords.data_ptr() == out_coords.data_ptr()
        and in_coords.shape == out_coords.shape
        and in_coords.stride() == out_coords.stride()
    )
    return same and all(
        s == 1 and ks % 2 == 1 and (ks - 1) * d == 2 * p
        for ks, s, p, d in zip(*geometry, strict=True)
    )


@torch.library.custom_op("lattice::kernel_map", mutates_args=())
def kernel_map(
    in_coords: torch.Tensor,
    out_coords: torch.Tensor,
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neighbour tables ``(nbr (N_out, K), rev (N_in, K))``, int32."""
    check_geometry("kernel_map", kernel_size=kernel_size, stride=stride, padding=padding,
                   dilation=dilation)  # fmt: skip
    # A support's submanifold map with itself pairs each offset with its negation (kernel
    # row K-1-n): nbr[o, n] == i iff nbr[i, K-1-n] == o, so rev is nbr with its kernel
    # rows reversed, a copy instead of a scatter.
    mirror = _self_submanifold(in_coords, out_coords, kernel_size, stride, padding, dilation)
    nbr = _nbr_table(
        "kernel_map", in_coords, out_coords, kernel_size, stride, padding, dilation, True
    )
    n_out, k = nbr.shape
    if mirror:
        return nbr, nbr.flip(1)
    rev = torch.empty((in_coords.shape[0], k), dtype=torch.int32)
    _C.kmap_reverse(ptr(nbr), n_out, k, in_coords.shape[0], ptr(rev), threads())
    return nbr, rev


def check_table_budget(what: str, out_coords: torch.Tensor, in_coords: torch.Tensor | None,
                       kernel_size: list[int], scratch: int = 0) -> None:  # fmt: skip
    """Refuses (``MemoryBudgetError``) the ``(N_out, K)`` neighbour table of
    ``out_coords`` (and, given ``in_coords``, the ``(N_in, K)`` one too), with
    ``scratch`` bytes beside them, beyond the memory budget: a one-row input with a 32^3
    kernel would otherwise ask for 32^3 output rows' 4 GiB table.  Reads only the row
    counts (a 0-d tensor counts none: its own check comes after)."""
    n_out, n_in = (int(c.shape[0]) if c is not None and c.dim() else 0
                   for c in (out_coords, in_coords))  # fmt: skip
    k = kernel_size[0] * kernel_size[1] * kernel_size[2]
    check_allocation(
        f"{what} ({n_out} output rows, {n_in} input rows, kernel_size {tuple(kernel_size)}: "
        f"neighbour tables of (rows x {k}) int32)",
        (n_out + n_in) * k * 4 + scratch,
    )


def kmap_scratch_per_kernel_row() -> int:
    """Bytes the CPU's table builders take per kernel row beside the tables: each row's
    offset (3 int32) and its (3 int64) strides, and per thread (the count ``threads()``
    gives the call) one int64 key and one cursor (csrc/core/tl_kmap.c)."""
    return 36 + 16 * max(1, torch.get_num_threads())


def _check_table_args(op: str, in_coords: torch.Tensor, out_coords: torch.Tensor,
                      kernel_size: list[int], stride: list[int], padding: list[int],
                      dilation: list[int]) -> None:  # fmt: skip
    """The dtype, shape and geometry rules of ``kernel_map`` / ``neighbour_table``'s
    arguments (their fake kernels' check; the real ones check the same, the geometry
    first and the memory budget before the coordinates)."""
    check_geometry(op, kernel_size=kernel_size, stride=stride, padding=padding,
                   dilation=dilation)  # fmt: skip
    check_coords(op, "in_coords", in_coords)
    check_coords(op, "out_coords", out_coords)


def _nbr_table(
    what: str,
    in_coords: torch.Tensor,
    out_coords: torch.Tensor,
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    with_rev: bool = False,
) -> torch.Tensor:
    """The output-stationary table ``nbr (N_out, K)`` int32, built on the CPU, its size
    (and, ``with_rev``, that of the ``(N_in, K)`` table the caller builds next) checked
    against the memory budget first."""
    geom = conv_geom(kernel_size, stride, padding, dilation)
    k = kernel_size[0] * kernel_size[1] * kernel_size[2]
    # the budget first: it reads only the row counts, and the checks below are in one file
    check_table_budget(
        what.replace("_", " "), out_coords, in_coords if with_rev else None, kernel_size,
        k * kmap_scratch_per_kernel_row(),
    )  # fmt: skip
    require_cpu(what, in_coords, out_coords)
    check_coords(what, "in_coords", in_coords)
    check_coords(what, "out_coords", out_coords)
    check_copies(what, in_coords=in_coords, out_coords=out_coords)
    in_coords, out_coords = in_coords.contiguous(), out_coords.contiguous()
    n_in, n_out = in_coords.shape[0], out_coords.shape[0]
    nbr = torch.empty((n_out, k), dtype=torch.int32)
    _C.kmap_build(ptr(in_coords), n_in, ptr(out_coords), n_out, geom, ptr(nbr), threads())
    return nbr


@kernel_map.register_fake
@one_device("kernel_map")
def _(in_coords, out_coords, kernel_size, stride, padding, dilation):
    _check_table_args("kernel_map", in_coords, out_coords, kernel_size, stride, padding,
                      dilation)  # fmt: skip
    k = kernel_size[0] * kernel_size[1] * kernel_size[2]
    return (
        out_coords.new_empty((out_coords.shape[0], k)),
        in_coords.new_empty((in_coords.shape[0], k)),
    )


def build_kernel_map(
    in_coords: torch.Tensor, out_coords: torch.Tensor, geometry: ConvGeometry
) -> KernelMap:
    """Builds the :class:`KernelMap` relating two coordinate sets.

    Raises:
        ValueError: (a ``MemoryBudgetError``) the two ``(N, K)`` int32 tables would
            exceed the memory budget (a one-row input with a 32^3 kernel generates
            32^3 output rows and a 4 GiB table).
    """
    ks, s = list(geometry.kernel_size), list(geometry.stride)
    p, d = list(geometry.padding), list(geometry.dilation)
    nbr, rev = kernel_map(in_coords, out_coords, ks, s, p, d)
    return KernelMap(nbr, rev, geometry)


@torch.library.custom_op("lattice::neighbour_table", mutates_args=())
def neighbour_table(
    in_coords: torch.Tensor,
    out_coords: torch.Tensor,
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
) -> torch.Tensor:
    """The output-stationary table ``nbr (N_out, K)`` int32 alone (no ``rev``)."""
    check_geometry("neighbour_table", kernel_size=kernel_size, stride=stride, padding=padding,
                   dilation=dilation)  # fmt: skip
    return _nbr_table(
        "neighbour_table", in_coords, out_coords, kernel_size, stride, padding, dilation
    )


@neighbour_table.register_fake
@one_device("neighbour_table")
def _(in_coords, out_coords, kernel_size, stride, padding, dilation):
    _check_table_args("neighbour_table", in_coords, out_coords, kernel_size, stride, padding,
                      dilation)  # fmt: skip
    k = kernel_size[0] * kernel_size[1] * kernel_size[2]
    return out_coords.new_empty((out_coords.shape[0], k))


# Slots of the dense tables per real pair beyond which a transpose onto a generated
# support runs over pair lists (build_transpose_pairs): a generated support has
# (N_in + N_out) x K table slots for N_in x K pairs, so the ratio is 1 + N_out / N_in
# (K + 1 when kernel <= stride, each fine row with one source).  A 2x2x2 stride-2
# decoder (ratio 9) keeps its tables; a 4^3 stride-4 one (65) and a one-row 32^3 one
# (32769) build no (N_out, K) table.
DENSE_SLOTS_PER_PAIR = 64


def sparse_table(n_in: int, n_out: int) -> bool:
    """Whether the tables of a transpose of ``n_in`` rows onto the ``n_out`` rows it
    generated would hold more than ``DENSE_SLOTS_PER_PAIR`` slots per pair."""
    return n_in + n_out > DENSE_SLOTS_PER_PAIR * n_in


# Bytes per (coarse row, kernel row) slot of build_transpose_pairs: the int32 table
# (4), the forward pair lists (8), their reversal (8 + 8 of int64 kernel rows and
# sort keys, 16 of argsort's values and indices).
TRANSPOSE_PAIR_BYTES = 44


def build_transpose_pairs(
    fine: torch.Tensor, coarse: torch.Tensor, geometry: ConvGeometry
) -> PairLists:
    """Pair lists of a transposed relation (coarse -> fine), grown with the real pairs.

    The forward relation maps ``fine`` onto ``coarse`` (``fine = coarse * stride -
    padding + r * dilation``).  Only its ``(N_coarse, K)`` table is built (at most one
    fine row per (coarse row, kernel row), so at most ``N_coarse x K`` pairs), never the
    ``(N_fine, K)`` one: for a generated fine support that second table is mostly empty
    (a one-row 32^3 generative transpose: 2^15 x 2^15 slots for 2^15 pairs).  The result
    equals ``KernelMap.pairs(transposed=True)`` of the same relation: per kernel row,
    ``pair_in`` coarse rows and ``pair_out`` fine rows sorted by ``pair_out``.

    Raises:
        ValueError: (a ``MemoryBudgetError``) the table and pair lists would exceed the
            memory budget.
    """
    ks, s, p, d = (list(v) for v in geometry.as_c())
    k = ks[0] * ks[1] * ks[2]
    n_coarse = int(coarse.shape[0])
    check_allocation(
        f"transposed pair lists ({n_coarse} source rows x {k} kernel rows onto "
        f"{int(fine.shape[0])} rows, kernel_size {tuple(ks)})",
        n_coarse * k * TRANSPOSE_PAIR_BYTES,
    )
    nbr = neighbour_table(fine, coarse, ks, s, p, d)
    return reverse_pairs(*kernel_pairs(nbr))
