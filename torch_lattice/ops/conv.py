"""Sparse convolution ops, over a neighbour table or over pair lists.

``lattice::sparse_conv(feats, weight, nbr, rev)`` computes
``y[o] = sum_n feats[nbr[o, n]] @ weight[n]`` over an ``(N_out, K)`` neighbour
table (the implicit-GEMM dataflow).  Its input gradient is the same op on the
transposed relation (``rev``, ``weight^T``), so backward is built from
registered ops only; ``lattice::sparse_conv_weight_grad`` is the weight gradient.
On the CPU both run over the tile lists kept beside a table from its second forward on
(:func:`tile_lists`).

``lattice::pair_conv`` runs a relation over CSR pair lists (``lattice::kernel_pairs``,
docs/kernel-maps.md) in the fetch-on-demand or gather-scatter dataflow, with
autograd: the input gradient is the same op over the reversed pairs with ``W^T``,
the weight gradient ``lattice::pair_conv_weight_grad``.  The reversed pairs
default to ``reverse_pairs`` of the forward pairs, so no second pair list is built
from a neighbour table.

Both weight-gradient ops have autograd too (bilinear in features and output gradient:
their gradients are a forward and an input-gradient convolution), so double backward,
as gradient penalties take it, works in every dataflow.

Each op's body is its CPU kernel; the CUDA kernels are registered by
:mod:`torch_lattice.ops.conv_cuda`.  Each op checks shapes and map formats once,
with the ``check_*`` function of its name here, on either device; the functional
layer (``torch_lattice.nn.functional``) validates user input before that.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from torch_lattice.memory_budget import check_allocation, get_memory_budget
from torch_lattice.ops._runtime import (
    _C,
    DTYPE_CODES,
    check_copies,
    check_size,
    check_tensor,
    compute_dtype,
    one_device,
    ptr,
    require_cpu,
    threads,
)
from torch_lattice.ops.kmap import reverse_pairs, reverse_table

__all__ = [
    "TileLists",
    "blocks_are_tiles",
    "check_conv_args",
    "check_n_out",
    "check_nbr",
    "check_pair_conv_operands",
    "check_pair_conv_output",
    "check_pair_conv_weight_grad",
    "check_sparse_conv",
    "check_sparse_conv_weight_grad",
    "clear_tile_lists",
    "keep_tile_lists",
    "kept_tile_lists",
    "pair_conv",
    "pair_conv_weight_grad",
    "pair_dataflow",
    "run_forward",
    "run_weight_grad",
    "sparse_conv",
    "sparse_conv_weight_grad",
    "tile_lists",
]

# enum tl_pairs_mode in csrc/core/tl_dataflow_pairs.h
FETCH_ON_DEMAND, GATHER_SCATTER = 0, 1


def check_nbr(op: str, nbr: torch.Tensor) -> None:
    """Raises unless ``nbr`` is an int32 ``(N_out, K)`` neighbour table (the table the
    convolution and pooling ops read)."""
    if nbr.dtype != torch.int32 or nbr.dim() != 2:
        raise ValueError(
            f"lattice::{op}: nbr (the kernel map) must be an int32 (N_out, K) table; "
            f"got {nbr.dtype} {tuple(nbr.shape)}"
        )


def check_conv_args(op: str, feats: torch.Tensor, weight: torch.Tensor, k: int) -> None:
    """Dtype and shape rules shared by every convolution op."""
    if feats.dtype != weight.dtype:
        raise TypeError(
            f"lattice::{op}: feats ({feats.dtype}) and weight ({weight.dtype}) "
            "must have the same dtype"
        )

    def shapes() -> str:
        return (f"lattice::{op}: weight must be (K, C_in, C_out) with C_in == feats.shape[1]; "
                f"got weight {tuple(weight.shape)}, feats {tuple(feats.shape)}")  # fmt: skip

    if weight.dim() != 3 or feats.dim() != 2:
        raise ValueError(shapes())
    check_size(weight.shape[1] == feats.shape[1], shapes)
    check_size(
        weight.shape[0] == k,
        lambda: f"lattice::{op}: the kernel map has {k} kernel rows but weight has "
        f"{weight.shape[0]}",
    )
    check_size(  # as torch's convolutions, which refuse a kernel of size 0
        weight.shape[0] >= 1,
        lambda: f"lattice::{op}: weight must have at least one kernel row (K >= 1), got "
        f"{tuple(weight.shape)}",
    )


def _check_grad_out(op: str, feats: torch.Tensor, grad_out: torch.Tensor) -> None:
    """A weight gradient's operands: 2-D, of one dtype (as on CUDA: a complex or other
    grad_out is refused, not cast to the features' dtype)."""
    if feats.dim() != 2 or grad_out.dim() != 2:
        raise ValueError(f"lattice::{op}: feats and grad_out must be 2-D (rows, channels)")
    if grad_out.dtype != feats.dtype:
        raise TypeError(
            f"lattice::{op}: grad_out ({grad_out.dtype}) must have the dtype of feats "
            f"({feats.dtype})"
        )


def _check_pairs(
    op: str, offsets: torch.Tensor, pair_in: torch.Tensor, pair_out: torch.Tensor
) -> None:
    def bad_offsets() -> str:
        return (f"lattice::{op}: offsets must be (K + 1,) int64, got {offsets.dtype} "
                f"{tuple(offsets.shape)}")  # fmt: skip

    def bad_pairs() -> str:
        return f"lattice::{op}: pair_in and pair_out must be (P,) int32 of equal length"

    if offsets.dtype != torch.int64 or offsets.dim() != 1:
        raise ValueError(bad_offsets())
    check_size(offsets.shape[0] >= 1, bad_offsets)
    if pair_in.dtype != torch.int32 or pair_out.dtype != torch.int32 or pair_in.dim() != 1 \
            or pair_out.dim() != 1:  # fmt: skip
        raise ValueError(bad_pairs())
    check_size(pair_in.shape[0] == pair_out.shape[0], bad_pairs)


def check_sparse_conv(
    feats: torch.Tensor, weight: torch.Tensor, nbr: torch.Tensor, rev: torch.Tensor
) -> None:
    """The one argument check of ``lattice::sparse_conv`` (CPU and CUDA): ``rev``, which
    only the backward reads, is checked here too, so a wrong one fails at the call that
    passed it, naming it."""
    check_nbr("sparse_conv", nbr)
    check_conv_args("sparse_conv", feats, weight, nbr.shape[1])
    check_tensor("sparse_conv", "rev", rev, (torch.int32,), (feats.shape[0], nbr.shape[1]))
    check_copies("sparse_conv", nbr.shape[0] * weight.shape[2] * feats.element_size(),
                 feats=feats, weight=weight, nbr=nbr)


def check_sparse_conv_weight_grad(
    feats: torch.Tensor, grad_out: torch.Tensor, nbr: torch.Tensor
) -> None:
    """The one argument check of ``lattice::sparse_conv_weight_grad``: the C core reads
    ``grad_out`` row ``o`` for every row of ``nbr``."""
    op = "sparse_conv_weight_grad"
    check_nbr(op, nbr)
    _check_grad_out(op, feats, grad_out)
    check_size(
        grad_out.shape[0] == nbr.shape[0],
        lambda: f"lattice::{op}: nbr has {nbr.shape[0]} output rows but grad_out has "
        f"{grad_out.shape[0]}",
    )
    check_copies(op, feats=feats, grad_out=grad_out, nbr=nbr)


def check_pair_conv_operands(
    feats: torch.Tensor,
    weight: torch.Tensor,
    offsets: torch.Tensor,
    pair_in: torch.Tensor,
    pair_out: torch.Tensor,
    rev: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None],
) -> None:
    """The tensors' part of ``lattice::pair_conv``'s argument check (dtypes and shapes:
    what the op's fake kernel checks too; :func:`check_pair_conv_output` checks the
    rest): the pairs and the reversed pairs ``rev``, all three or none
    (backward reads all three, or derives them)."""
    op = "pair_conv"
    check_conv_args(op, feats, weight, offsets.shape[0] - 1)
    _check_pairs(op, offsets, pair_in, pair_out)
    check_copies(op, feats=feats, weight=weight, offsets=offsets, pair_in=pair_in,
                 pair_out=pair_out)
    given = sum(t is not None for t in rev)
    if given not in (0, 3):
        raise ValueError(
            f"lattice::{op}: rev_offsets, rev_in and rev_out must be given all three (the "
            f"reversed pairs) or all None (derived in backward), got {given} of them"
        )
    if given:
        roff, rin, rout = rev
        assert roff is not None and rin is not None and rout is not None

        def mismatch() -> str:
            return (f"lattice::{op}: the reversed pairs must have the forward pairs' shapes "
                    f"(offsets {tuple(offsets.shape)}, pairs {tuple(pair_in.shape)}), got "
                    f"rev_offsets {tuple(roff.shape)} and rev_in {tuple(rin.shape)}")  # fmt: skip

        for got, want in ((roff, offsets), (rin, pair_in)):
            if got.dim() != 1:
                raise ValueError(mismatch())
            check_size(got.shape[0] == want.shape[0], mismatch)
        _check_pairs(op, roff, rin, rout)


def check_n_out(op: str, n_out: int | torch.SymInt) -> None:
    """Raises ``ValueError`` unless ``n_out`` (the rows of an op's output) is an int >= 0
    (symbolic under ``torch.compile``)."""
    if isinstance(n_out, bool) or not isinstance(n_out, (int, torch.SymInt)):
        raise ValueError(f"lattice::{op}: n_out must be a non-negative int, got {n_out!r}")
    check_size(n_out >= 0, lambda: f"lattice::{op}: n_out must be a non-negative int, "
                                   f"got {n_out!r}")  # fmt: skip


def check_pair_conv_output(feats: torch.Tensor, weight: torch.Tensor, n_out: int) -> None:
    """The rest of ``lattice::pair_conv``'s argument check (CPU and CUDA), after
    :func:`check_pair_conv_operands`: ``n_out``, whose ``(n_out, C_out)`` output is
    checked against the memory budget (it is a caller's number, not the size of a tensor
    it holds)."""
    op = "pair_conv"
    check_n_out(op, n_out)
    # The output, and (half types) the float32 buffer it is accumulated in.
    wide = feats.dtype not in (torch.float32, torch.float64)
    row = weight.shape[2] * (feats.element_size() + (4 if wide else 0))
    check_allocation(f"lattice::{op} ({n_out} output rows x {weight.shape[2]} channels)",
                     n_out * row)  # fmt: skip


def check_pair_conv_weight_grad(
    feats: torch.Tensor,
    grad_out: torch.Tensor,
    offsets: torch.Tensor,
    pair_in: torch.Tensor,
    pair_out: torch.Tensor,
) -> None:
    """The one argument check of ``lattice::pair_conv_weight_grad`` (CPU and CUDA)."""
    _check_pairs("pair_conv_weight_grad", offsets, pair_in, pair_out)
    _check_grad_out("pair_conv_weight_grad", feats, grad_out)
    check_copies("pair_conv_weight_grad", feats=feats, grad_out=grad_out, offsets=offsets,
                 pair_in=pair_in, pair_out=pair_out)


def pair_dataflow(gather: bool) -> str:
    """The dataflow a pair op's ``gather`` flag selects."""
    return "gather_scatter" if gather else "fetch_on_demand"


@torch.library.custom_op("lattice::sparse_conv", mutates_args=())
def sparse_conv(
    feats: torch.Tensor,
    weight: torch.Tensor,
    nbr: torch.Tensor,
    rev: torch.Tensor,
    allow_tf32: bool = False,
) -> torch.Tensor:
    """``(N_out, C_out)``: ``y[o] = sum_n feats[nbr[o, n]] @ weight[n]``.

    Args:
        feats: ``(N_in, C_in)`` floating.
        weight: ``(K, C_in, C_out)``, same dtype.
        nbr: ``(N_out, K)`` int32 neighbour table.
        rev: ``(N_in, K)`` int32 transpose of ``nbr`` (used by backward): exactly the
            ``rev`` that ``lattice::kernel_map`` returned beside ``nbr``. It is trusted:
            the CPU backward range-checks its entries as it reads them, but that it is
            ``nbr``'s transpose is not checked (a pass over both tables, about 15 times
            a C = 16 forward; docs/kernel-maps.md), and any other in-range table gives a
            wrong input gradient.
        allow_tf32: let CUDA use TF32 tensor cores for float32 (ignored on CPU).
    """
    check_sparse_conv(feats, weight, nbr, rev)
    require_cpu("sparse_conv", feats, weight, nbr, rev)
    # Half types run as they are (bfloat16 dot products where the CPU has AVX512_BF16).
    work = compute_dtype("sparse_conv", feats.dtype, halves=True)
    x = feats.contiguous()
    w = weight.contiguous()
    nbr = nbr.contiguous()
    k, cin, cout = w.shape
    y = torch.empty((nbr.shape[0], cout), dtype=work)
    sizes = (DTYPE_CODES[work], x.shape[0], nbr.shape[0], k, cin, cout)
    run_forward(nbr, sizes, (ptr(x), ptr(w), ptr(nbr), ptr(y)), threads())
    return y


def run_forward(
    nbr: torch.Tensor, sizes: tuple[int, ...], pointers: tuple[int, int, int, int], th: int
) -> None:
    """The CPU kernel call of ``lattice::sparse_conv`` on ``th`` threads: ``sizes`` =
    (dtype code, N_in, N_out, K, C_in, C_out), ``pointers`` = those of x, w, ``nbr`` and y
    (contiguous, checked by the op). Over ``nbr``'s tile lists from the table's second call
    on (:func:`tile_lists`), else listing the table."""
    tile_rows = _C.conv_list_rows(*sizes, th)
    lists = tile_lists(nbr, tile_rows)
    x, w, table, y = pointers
    if lists is None:
        _C.conv_forward(*sizes, x, w, table, y, th)
    else:
        _C.conv_forward_listed(*sizes, x, w, table, *lists.args, y, th)


@sparse_conv.register_fake
@one_device("sparse_conv")
def _(feats, weight, nbr, rev, allow_tf32=False):
    check_sparse_conv(feats, weight, nbr, rev)
    work = compute_dtype("sparse_conv", feats.dtype, halves=True)
    return feats.new_empty((nbr.shape[0], weight.shape[2]), dtype=work)


@torch.library.custom_op("lattice::sparse_conv_weight_grad", mutates_args=())
def sparse_conv_weight_grad(
    feats: torch.Tensor, grad_out: torch.Tensor, nbr: torch.Tensor, allow_tf32: bool = False
) -> torch.Tensor:
    """``(K, C_in, C_out)``: ``dw[n] = sum_o feats[nbr[o, n]]^T grad_out[o]``;
    ``grad_out`` ``(N_out, C_out)`` of ``feats``' dtype (another raises ``TypeError``)."""
    require_cpu("sparse_conv_weight_grad", feats, grad_out, nbr)
    check_sparse_conv_weight_grad(feats, grad_out, nbr)
    work = compute_dtype("sparse_conv_weight_grad", feats.dtype, halves=True)
    x = feats.contiguous()
    dy = grad_out.to(work).contiguous()
    nbr = nbr.contiguous()
    dw = torch.empty((nbr.shape[1], x.shape[1], dy.shape[1]), dtype=work)
    sizes = (DTYPE_CODES[work], x.shape[0], nbr.shape[0], nbr.shape[1], x.shape[1], dy.shape[1])
    run_weight_grad(nbr, sizes, (ptr(x), ptr(dy), ptr(nbr), ptr(dw)), threads())
    return dw


def run_weight_grad(
    nbr: torch.Tensor, sizes: tuple[int, ...], pointers: tuple[int, int, int, int], th: int
) -> None:
    """The CPU kernel call of ``lattice::sparse_conv_weight_grad`` on ``th`` threads:
    ``sizes`` as :func:`run_forward`'s, ``pointers`` those of x, dy, ``nbr`` and dw. Over
    the tile lists a forward kept for ``nbr`` where each of the weight gradient's blocks is
    whole tiles (:func:`kept_tile_lists`), else listing the table."""
    block_rows = _C.conv_weight_grad_list_rows(*sizes, th)
    lists = kept_tile_lists(nbr, block_rows)
    x, dy, table, dw = pointers
    if lists is None:
        _C.conv_weight_grad(*sizes, x, dy, table, dw, th)
    else:
        _C.conv_weight_grad_listed(*sizes, x, dy, table, *lists.args, dw, th)


@sparse_conv_weight_grad.register_fake
@one_device("sparse_conv_weight_grad")
def _(feats, grad_out, nbr, allow_tf32=False):
    check_sparse_conv_weight_grad(feats, grad_out, nbr)
    work = compute_dtype("sparse_conv_weight_grad", feats.dtype, halves=True)
    return feats.new_empty((nbr.shape[1], feats.shape[1], grad_out.shape[1]), dtype=work)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    feats, weight, nbr, rev, allow_tf32 = inputs
    ctx.allow_tf32 = allow_tf32
    saved_feats = feats if ctx.needs_input_grad[1] else None
    saved_weight = weight if ctx.needs_input_grad[0] else None
    ctx.save_for_backward(saved_feats, saved_weight, nbr, rev)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    feats, weight, nbr, rev = ctx.saved_tensors
    grad_feats = grad_weight = None
    # Once for both gradients: a loss like y.sum() hands back an expanded (stride 0) grad,
    # which each op would otherwise copy on its own.
    grad = grad.contiguous()
    if ctx.needs_input_grad[0]:
        wt = weight.transpose(1, 2).contiguous()
        grad_feats = sparse_conv(grad, wt, rev, nbr, ctx.allow_tf32)
    if ctx.needs_input_grad[1]:
        grad_weight = sparse_conv_weight_grad(feats, grad, nbr, ctx.allow_tf32)
    return grad_feats, grad_weight, None, None, None


sparse_conv.register_autograd(_backward, setup_context=_setup_context)


# ---- double backward: the weight gradients are bilinear in (feats, grad_out) ----
# dw[n] = sum_o feats[nbr[o, n]]^T dy[o], so for an incoming gradient G of dw the
# gradient of feats is the input-gradient convolution of dy with weights G^T (over the
# reversed relation) and that of dy the forward convolution of feats with weights G.
# Both are the ops above, with autograd, so higher derivatives work too.


def _wgrad_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    feats, grad_out, nbr, allow_tf32 = inputs
    ctx.allow_tf32 = allow_tf32
    ctx.n_in = feats.shape[0]
    ctx.dtypes = (feats.dtype, grad_out.dtype)
    ctx.save_for_backward(
        feats if ctx.needs_input_grad[1] else None,
        grad_out if ctx.needs_input_grad[0] else None,
        nbr,
    )


def _wgrad_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    feats, grad_out, nbr = ctx.saved_tensors
    x_dtype, dy_dtype = ctx.dtypes
    g = grad.to(x_dtype)
    # The reversed table is built here, once: this op is given nbr alone.
    rev = reverse_table(nbr, ctx.n_in)
    grad_feats = grad_dy = None
    if ctx.needs_input_grad[0]:
        gt = g.transpose(1, 2).contiguous()
        grad_feats = sparse_conv(grad_out.to(x_dtype).contiguous(), gt, rev, nbr, ctx.allow_tf32)
    if ctx.needs_input_grad[1]:
        grad_dy = sparse_conv(feats, g.contiguous(), nbr, rev, ctx.allow_tf32).to(dy_dtype)
    return grad_feats, grad_dy, None, None


sparse_conv_weight_grad.register_autograd(_wgrad_backward, setup_context=_wgrad_setup_context)


# ---- tile lists kept beside each table (csrc/core/tl_tile_lists.h) ----
#
# Every implicit-GEMM forward on the CPU lists, for each tile of output rows, each kernel
# row's present entries of the ``(N_out, K)`` table. That listing reads the whole table on
# every call and does not shrink with the channels: about a third of a C = 16 forward on
# a LiDAR scan. A table that several calls run over (the layers of a network level, and
# the input gradients that run over the reversed table) is listed once instead, from its
# second call on, and the lists are kept beside the table for as long as the table lives.
# The forward over the lists is bitwise the forward over the table.
#
# Lists are built only where the forward can use them (``_C.conv_list_rows``: float32 and
# float64 outputs of at most 256 bytes a row, so C_out <= 64 in float32, and bfloat16 and
# float16 at every width), for the tile size of the call (it depends on the thread count;
# at most two sizes are kept a table); the weight gradient reads them where each of its
# blocks (``_C.conv_weight_grad_list_rows`` rows) is whole tiles.
# A table modified in place is listed again; an inference tensor (made under
# ``torch.inference_mode``) has no version counter, so such a table, like a ``KernelMap``'s
# pair lists, must not be modified in place after its first call. Lists cost 8 bytes a
# present entry (a LiDAR scan's 3x3x3 submanifold table: 7 MB beside its own 17 MB) and
# are dropped with the table, or by :func:`clear_tile_lists`.

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
        args: what the ``*_listed`` kernels take for them: ``tile_rows``, ``top`` and
            the three tensors' data pointers.
    """

    tile_rows: int
    top: int
    start: torch.Tensor
    rows_in: torch.Tensor
    rows_out: torch.Tensor
    args: tuple[int, int, int, int, int]


@dataclass
class _Entry:
    """What is kept for one table: its state when seen (a change of any is a new table),
    its forward calls, and its lists by tile size."""

    state: tuple[int, int, tuple[int, ...]]  # version counter, data pointer, shape
    calls: int = 0
    sizes: dict[int, TileLists] = field(default_factory=dict)


_cache: WeakIdKeyDictionary = WeakIdKeyDictionary()
_lock = threading.Lock()


def build_tile_lists(nbr: torch.Tensor, tile_rows: int) -> TileLists:
    """``nbr``'s lists for tiles of ``tile_rows`` rows, built now and not kept (``nbr``:
    a checked contiguous int32 CPU table; ``tile_rows`` >= 1)."""
    n_out, k = nbr.shape
    tiles = (n_out + tile_rows - 1) // tile_rows
    sizes = (ptr(nbr), n_out, k, tile_rows)
    start = torch.empty(tiles * k + 1, dtype=torch.int64)
    top = _C.tile_lists_count(*sizes, ptr(start), threads())
    entries = int(start[-1])
    rows_in = torch.empty(entries, dtype=torch.int32)
    rows_out = torch.empty(entries, dtype=torch.int32)
    _C.tile_lists_fill(*sizes, ptr(start), top, ptr(rows_in), ptr(rows_out), threads())
    args = (tile_rows, top, start.data_ptr(), rows_in.data_ptr(), rows_out.data_ptr())
    return TileLists(tile_rows, top, start, rows_in, rows_out, args)


def _state(t: torch.Tensor) -> tuple[int, int, tuple[int, ...]]:
    """``t``'s version counter (-1 for an inference tensor, which has none), data pointer
    and shape."""
    return (-1 if t.is_inference() else t._version, t.data_ptr(), tuple(t.shape))


# Whether tables keep their tile lists (keep_tile_lists): a process-wide setting.
_keeping = [True]


def keep_tile_lists(keep: bool) -> bool:
    """Turns the use of tile lists on (the default) or off for the process and returns
    the previous setting. Off, every call lists its table as its first call does, and no
    lists are built or read; those kept so far stay until :func:`clear_tile_lists` (or
    their table's end), so a layer can be timed with and without them in turn.

    Raises:
        TypeError: ``keep`` is not a bool.
    """
    if not isinstance(keep, bool):
        raise TypeError(f"keep_tile_lists: keep must be a bool, got {type(keep).__name__}")
    with _lock:
        previous, _keeping[0] = _keeping[0], keep
    return previous


def _keepable(nbr: torch.Tensor, tile_rows: int) -> bool:
    """Whether lists of ``nbr`` may be kept or read now: keeping on, tiles given, and a
    contiguous CPU table (any other is a new copy on every call)."""
    return _keeping[0] and tile_rows > 0 and nbr.device.type == "cpu" and nbr.is_contiguous()


def tile_lists(nbr: torch.Tensor, tile_rows: int) -> TileLists | None:
    """``nbr``'s lists for tiles of ``tile_rows`` rows, from the table's second call on
    (None on its first, for a table that is not a contiguous CPU tensor, whose every call
    may be a new copy, and while keeping is off). ``nbr`` is the int32 ``(N_out, K)``
    table the op was given, already checked; ``tile_rows`` is ``_C.conv_list_rows`` of
    the call (0: none)."""
    if not _keepable(nbr, tile_rows):
        return None
    state = _state(nbr)
    with _lock:
        entry = _cache.get(nbr)
        if entry is None or entry.state != state:
            entry = _Entry(state)  # new, or changed in place: listed again
            _cache[nbr] = entry
        entry.calls += 1
        if entry.calls < 2:
            return None  # a table run over once is listed by its call, as before
        hit = entry.sizes.get(tile_rows)
    if hit is not None:
        return hit
    if 8 * nbr.numel() > get_memory_budget():  # at most 8 bytes an entry: kept within it
        return None
    built = build_tile_lists(nbr, tile_rows)
    with _lock:
        if not _keeping[0]:
            return built  # turned off meanwhile: used once, not kept
        if len(entry.sizes) >= MAX_SIZES:
            entry.sizes.pop(next(iter(entry.sizes)))
        entry.sizes[tile_rows] = built
    return built


def blocks_are_tiles(block_rows: int, tile_rows: int) -> bool:
    """Whether weight-gradient blocks of ``block_rows`` rows (``conv_weight_grad_list_rows``;
    0: it reads no lists) are whole tiles of ``tile_rows`` rows, so the weight gradient can
    run over a forward's lists of those tiles."""
    return block_rows > 0 and tile_rows > 0 and block_rows % tile_rows == 0


def kept_tile_lists(nbr: torch.Tensor, block_rows: int) -> TileLists | None:
    """``nbr``'s lists for tiles whose rows divide ``block_rows`` if a forward has built
    them (the weight gradient runs over its forward's, each of its blocks whole tiles),
    the largest such tiles where several are kept, without counting a call."""
    if not _keepable(nbr, block_rows):
        return None
    with _lock:
        entry = _cache.get(nbr)
        if entry is None or entry.state != _state(nbr):
            return None
        fits = [rows for rows in entry.sizes if blocks_are_tiles(block_rows, rows)]
        return entry.sizes[max(fits)] if fits else None


def clear_tile_lists() -> None:
    """Drops every kept list (they are rebuilt on a table's next two calls)."""
    with _lock:
        _cache.clear()


# ---- over pair lists: fetch-on-demand and gather-scatter ----


def _check_csr(op: str, offsets: torch.Tensor, pairs: int) -> None:
    """The C core reads pairs ``offsets[n]:offsets[n + 1]`` of each kernel row: the
    offsets must start at 0, never decrease and end at the lists' length."""
    if offsets[0] != 0 or offsets[-1] != pairs or bool((offsets.diff() < 0).any()):
        raise ValueError(
            f"lattice::{op}: offsets must start at 0, never decrease and end at the "
            f"{pairs} pairs of pair_in and pair_out, got {offsets.tolist()[:8]}"
            f"{' ...' if offsets.shape[0] > 8 else ''}"
        )


def _run_pairs(
    op: str,
    fn: Any,
    mode: int,
    a: torch.Tensor,
    b: torch.Tensor,
    n_in: int,
    n_out: int,
    k: int,
    cin: int,
    cout: int,
    pairs: tuple[torch.Tensor, ...],
    out: torch.Tensor,
) -> None:
    offsets, pin, pout = (t.contiguous() for t in pairs)
    _check_csr(op, offsets, pin.shape[0])
    try:
        fn(
            mode,
            DTYPE_CODES[out.dtype],
            n_in,
            n_out,
            k,
            cin,
            cout,
            ptr(a),
            ptr(b),
            ptr(offsets),
            ptr(pin),
            ptr(pout),
            ptr(out),
            threads(),
        )
    except ValueError as e:  # the C check of the pairs' values (the sizes are checked above)
        raise ValueError(
            f"lattice::{op}: every pair_in must be in [0, {n_in}) and every pair_out in "
            f"[0, {n_out}), strictly increasing within each kernel row (as kernel_pairs "
            f"and reverse_pairs build them) ({e})"
        ) from e


@torch.library.custom_op("lattice::pair_conv", mutates_args=())
def pair_conv(
    feats: torch.Tensor,
    weight: torch.Tensor,
    offsets: torch.Tensor,
    pair_in: torch.Tensor,
    pair_out: torch.Tensor,
    rev_offsets: torch.Tensor | None,
    rev_in: torch.Tensor | None,
    rev_out: torch.Tensor | None,
    n_out: int,
    gather: bool,
    allow_tf32: bool = False,
) -> torch.Tensor:
    """``(n_out, C_out)``: ``y[pair_out] += feats[pair_in] @ weight[n]`` per pair.

    ``rev_*`` are the pairs of the reversed relation, used by backward; pass
    ``None`` for all three to derive them in backward with
    :func:`reverse_pairs` (only when an input gradient is needed); some but not all
    three is a ``ValueError``.  ``n_out`` (>= 0) sizes the output, checked against the
    memory budget first.  ``gather`` selects
    gather-scatter, else fetch-on-demand; ``allow_tf32`` lets CUDA use TF32
    for float32 (ignored on CPU).
    """
    require_cpu("pair_conv", feats, weight, offsets, pair_in, pair_out)
    check_pair_conv_operands(feats, weight, offsets, pair_in, pair_out,
                             (rev_offsets, rev_in, rev_out))  # fmt: skip
    check_pair_conv_output(feats, weight, n_out)
    work = compute_dtype("pair_conv", feats.dtype)
    x, w = feats.to(work).contiguous(), weight.to(work).contiguous()
    k, cin, cout = w.shape
    y = torch.empty((n_out, cout), dtype=work)
    _run_pairs(
        "pair_conv",
        _C.pairs_forward,
        GATHER_SCATTER if gather else FETCH_ON_DEMAND,
        x,
        w,
        x.shape[0],
        n_out,
        k,
        cin,
        cout,
        (offsets, pair_in, pair_out),
        y,
    )
    return y.to(feats.dtype)


@pair_conv.register_fake
@one_device("pair_conv")
def _(
    feats,
    weight,
    offsets,
    pair_in,
    pair_out,
    rev_offsets,
    rev_in,
    rev_out,
    n_out,
    gather,
    allow_tf32=False,
):
    check_pair_conv_operands(feats, weight, offsets, pair_in, pair_out,
                             (rev_offsets, rev_in, rev_out))  # fmt: skip
    check_n_out("pair_conv", n_out)
    compute_dtype("pair_conv", feats.dtype)
    return feats.new_empty((n_out, weight.shape[2]))


@torch.library.custom_op("lattice::pair_conv_weight_grad", mutates_args=())
def pair_conv_weight_grad(
    feats: torch.Tensor,
    grad_out: torch.Tensor,
    offsets: torch.Tensor,
    pair_in: torch.Tensor,
    pair_out: torch.Tensor,
    gather: bool,
    allow_tf32: bool = False,
) -> torch.Tensor:
    """``(K, C_in, C_out)``: ``dw[n] = sum over pairs feats[in]^T grad_out[out]``;
    ``grad_out`` of ``feats``' dtype (another raises ``TypeError``)."""
    require_cpu("pair_conv_weight_grad", feats, grad_out, offsets, pair_in, pair_out)
    check_pair_conv_weight_grad(feats, grad_out, offsets, pair_in, pair_out)
    work = compute_dtype("pair_conv_weight_grad", feats.dtype)
    x, dy = feats.to(work).contiguous(), grad_out.to(work).contiguous()
    k = offsets.shape[0] - 1
    dw = torch.empty((k, x.shape[1], dy.shape[1]), dtype=work)
    _run_pairs(
        "pair_conv_weight_grad",
        _C.pairs_weight_grad,
        GATHER_SCATTER if gather else FETCH_ON_DEMAND,
        x,
        dy,
        x.shape[0],
        dy.shape[0],
        k,
        x.shape[1],
        dy.shape[1],
        (offsets, pair_in, pair_out),
        dw,
    )
    return dw.to(feats.dtype)


@pair_conv_weight_grad.register_fake
@one_device("pair_conv_weight_grad")
def _(feats, grad_out, offsets, pair_in, pair_out, gather, allow_tf32=False):
    check_pair_conv_weight_grad(feats, grad_out, offsets, pair_in, pair_out)
    compute_dtype("pair_conv_weight_grad", feats.dtype)
    return feats.new_empty((offsets.shape[0] - 1, feats.shape[1], grad_out.shape[1]))


def _pair_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    feats, weight, *pairs, _n_out, gather, allow_tf32 = inputs
    ctx.gather = gather
    ctx.allow_tf32 = allow_tf32
    ctx.n_in = feats.shape[0]
    ctx.save_for_backward(
        feats if ctx.needs_input_grad[1] else None,
        weight if ctx.needs_input_grad[0] else None,
        *pairs,
    )


def _pair_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    feats, weight, off, pin, pout, roff, rin, rout = ctx.saved_tensors
    grad_feats = grad_weight = None
    if ctx.needs_input_grad[0]:
        if roff is None:
            roff, rin, rout = reverse_pairs(off, pin, pout)
        wt = weight.transpose(1, 2).contiguous()
        grad_feats = pair_conv(
            grad, wt, roff, rin, rout, off, pin, pout, ctx.n_in, ctx.gather, ctx.allow_tf32
        )
    if ctx.needs_input_grad[1]:
        grad_weight = pair_conv_weight_grad(feats, grad, off, pin, pout, ctx.gather, ctx.allow_tf32)
    return (grad_feats, grad_weight) + (None,) * 9


pair_conv.register_autograd(_pair_backward, setup_context=_pair_setup_context)


def _pair_wgrad_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    feats, grad_out, offsets, pair_in, pair_out, gather, allow_tf32 = inputs
    ctx.gather, ctx.allow_tf32 = gather, allow_tf32
    ctx.n_in, ctx.n_out = feats.shape[0], grad_out.shape[0]
    ctx.dtypes = (feats.dtype, grad_out.dtype)
    ctx.save_for_backward(
        feats if ctx.needs_input_grad[1] else None,
        grad_out if ctx.needs_input_grad[0] else None,
        offsets,
        pair_in,
        pair_out,
    )


def _pair_wgrad_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    # As _wgrad_backward (bilinear), over the pairs and their reversal.
    feats, grad_out, off, pin, pout = ctx.saved_tensors
    x_dtype, dy_dtype = ctx.dtypes
    g = grad.to(x_dtype)
    roff, rin, rout = reverse_pairs(off, pin, pout)
    grad_feats = grad_dy = None
    if ctx.needs_input_grad[0]:
        gt = g.transpose(1, 2).contiguous()
        dy = grad_out.to(x_dtype).contiguous()
        grad_feats = pair_conv(
            dy, gt, roff, rin, rout, off, pin, pout, ctx.n_in, ctx.gather, ctx.allow_tf32
        )
    if ctx.needs_input_grad[1]:
        grad_dy = pair_conv(
            feats, g.contiguous(), off, pin, pout, roff, rin, rout, ctx.n_out, ctx.gather,
            ctx.allow_tf32,
        ).to(dy_dtype)  # fmt: skip
    return (grad_feats, grad_dy) + (None,) * 5


pair_conv_weight_grad.register_autograd(
    _pair_wgrad_backward, setup_context=_pair_wgrad_setup_context
)
