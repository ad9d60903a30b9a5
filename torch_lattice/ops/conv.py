"""Sparse convolution ops, over a neighbour table or over pair lists.

``lattice::sparse_conv(feats, weight, nbr, rev)`` computes
``y[o] = sum_n feats[nbr[o, n]] @ weight[n]`` over an ``(N_out, K)`` neighbour
table (the implicit-GEMM dataflow).  Its input gradient is the same op on the
transposed relation (``rev``, ``weight^T``), so backward is built from
registered ops only; ``lattice::sparse_conv_weight_grad`` is the weight gradient.

``lattice::pair_conv`` runs a relation over CSR pair lists (``lattice::kernel_pairs``,
docs/kernel-maps.md) in the fetch-on-demand or gather-scatter dataflow, with
autograd: the input gradient is the same op over the reversed pairs with ``W^T``,
the weight gradient ``lattice::pair_conv_weight_grad``.  The reversed pairs
default to ``reverse_pairs`` of the forward pairs, so no second pair list is built
from a neighbour table.

Each op's body is its CPU kernel; the CUDA kernels are registered by
:mod:`torch_lattice.ops.conv_cuda`.  Each op checks shapes and map formats once,
with the ``check_*`` function of its name here, on either device; the functional
layer (``torch_lattice.nn.functional``) validates user input before that.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_lattice.ops._runtime import (
    _C,
    DTYPE_CODES,
    compute_dtype,
    ptr,
    require_cpu,
    threads,
)
from torch_lattice.ops.kmap import reverse_pairs
from torch_lattice.ops.tile_lists import kept_tile_lists, tile_lists

__all__ = [
    "check_conv_args",
    "check_nbr",
    "check_pair_conv",
    "check_pair_conv_weight_grad",
    "check_sparse_conv",
    "check_sparse_conv_weight_grad",
    "pair_conv",
    "pair_conv_weight_grad",
    "pair_dataflow",
    "run_forward",
    "run_weight_grad",
    "sparse_conv",
    "sparse_conv_weight_grad",
]

# enum tl_pairs_mode in csrc/core/tl_dataflow_pairs.h
FETCH_ON_DEMAND, GATHER_SCATTER = 0, 1


def check_nbr(op: str, nbr: torch.Tensor) -> None:
    """Raises unless ``nbr`` is an int32 ``(N_out, K)`` neighbour table (the table the
    convolution and pooling ops read)."""
    if nbr.dtype != torch.int32 or nbr.dim() != 2:
        raise ValueError(
            f"lattice::{op}: kernel map must be an int32 (N_out, K) table; "
            f"got {nbr.dtype} {tuple(nbr.shape)}"
        )


def check_conv_args(op: str, feats: torch.Tensor, weight: torch.Tensor, k: int) -> None:
    """Dtype and shape rules shared by every convolution op."""
    if feats.dtype != weight.dtype:
        raise TypeError(
            f"lattice::{op}: feats ({feats.dtype}) and weight ({weight.dtype}) "
            "must have the same dtype"
        )
    if weight.dim() != 3 or feats.dim() != 2 or weight.shape[1] != feats.shape[1]:
        raise ValueError(
            f"lattice::{op}: weight must be (K, C_in, C_out) with C_in == "
            f"feats.shape[1]; got weight {tuple(weight.shape)}, "
            f"feats {tuple(feats.shape)}"
        )
    if weight.shape[0] != k:
        raise ValueError(
            f"lattice::{op}: the kernel map has {k} kernel rows but weight has {weight.shape[0]}"
        )


def _check_grad_out(op: str, feats: torch.Tensor, grad_out: torch.Tensor) -> None:
    if feats.dim() != 2 or grad_out.dim() != 2:
        raise ValueError(f"lattice::{op}: feats and grad_out must be 2-D (rows, channels)")


def _check_pairs(
    op: str, offsets: torch.Tensor, pair_in: torch.Tensor, pair_out: torch.Tensor
) -> None:
    if offsets.dtype != torch.int64 or offsets.dim() != 1 or offsets.shape[0] < 1:
        raise ValueError(
            f"lattice::{op}: offsets must be (K + 1,) int64, got {offsets.dtype} "
            f"{tuple(offsets.shape)}"
        )
    if (
        pair_in.dtype != torch.int32
        or pair_out.dtype != torch.int32
        or (pair_in.shape != pair_out.shape or pair_in.dim() != 1)
    ):
        raise ValueError(f"lattice::{op}: pair_in and pair_out must be (P,) int32 of equal length")


def check_sparse_conv(feats: torch.Tensor, weight: torch.Tensor, nbr: torch.Tensor) -> None:
    """The one argument check of ``lattice::sparse_conv`` (CPU and CUDA)."""
    check_nbr("sparse_conv", nbr)
    check_conv_args("sparse_conv", feats, weight, nbr.shape[1])


def check_sparse_conv_weight_grad(
    feats: torch.Tensor, grad_out: torch.Tensor, nbr: torch.Tensor
) -> None:
    """The one argument check of ``lattice::sparse_conv_weight_grad``: the C core reads
    ``grad_out`` row ``o`` for every row of ``nbr``."""
    op = "sparse_conv_weight_grad"
    check_nbr(op, nbr)
    _check_grad_out(op, feats, grad_out)
    if grad_out.shape[0] != nbr.shape[0]:
        raise ValueError(
            f"lattice::{op}: nbr has {nbr.shape[0]} output rows but grad_out has "
            f"{grad_out.shape[0]}"
        )


def check_pair_conv(
    feats: torch.Tensor,
    weight: torch.Tensor,
    offsets: torch.Tensor,
    pair_in: torch.Tensor,
    pair_out: torch.Tensor,
) -> None:
    """The one argument check of ``lattice::pair_conv`` (CPU and CUDA)."""
    check_conv_args("pair_conv", feats, weight, offsets.shape[0] - 1)
    _check_pairs("pair_conv", offsets, pair_in, pair_out)


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
        rev: ``(N_in, K)`` int32 transpose of ``nbr`` (used by backward).
        allow_tf32: let CUDA use TF32 tensor cores for float32 (ignored on CPU).
    """
    check_sparse_conv(feats, weight, nbr)
    require_cpu("sparse_conv", feats, weight, nbr, rev)
    # Half types run as they are (bfloat16 dot products where the CPU has AVX512_BF16).
    work = compute_dtype("sparse_conv", feats.dtype, halves=True)
    x = feats.contiguous()
    w = weight.contiguous()
    nbr = nbr.contiguous()
    y = torch.empty((nbr.shape[0], w.shape[2]), dtype=work)
    run_forward(x, w, nbr, y, threads())
    return y


def run_forward(
    x: torch.Tensor, w: torch.Tensor, nbr: torch.Tensor, y: torch.Tensor, th: int
) -> None:
    """The CPU kernel call of ``lattice::sparse_conv``: ``y = sum_n x[nbr[:, n]] @ w[n]``
    on ``th`` threads, over ``nbr``'s tile lists from the table's second call on
    (:mod:`torch_lattice.ops.tile_lists`), else listing the table. ``x``, ``w``, ``nbr``
    and ``y`` are contiguous CPU tensors the op has checked, ``y`` of the compute dtype."""
    k, cin, cout = w.shape
    sizes = (DTYPE_CODES[y.dtype], x.shape[0], nbr.shape[0], k, cin, cout)
    tile_rows = _C.conv_list_rows(*sizes, th)
    lists = tile_lists(nbr, tile_rows) if tile_rows > 0 else None
    if lists is None:
        _C.conv_forward(*sizes, ptr(x), ptr(w), ptr(nbr), ptr(y), th)
    else:
        _C.conv_forward_listed(
            *sizes, ptr(x), ptr(w), lists.tile_rows, lists.top, ptr(lists.start),
            ptr(lists.rows_in), ptr(lists.rows_out), ptr(y), th,
        )  # fmt: skip


@sparse_conv.register_fake
def _(feats, weight, nbr, rev, allow_tf32=False):
    torch._check(feats.dtype == weight.dtype)
    torch._check(weight.shape[1] == feats.shape[1])
    torch._check(nbr.shape[1] == weight.shape[0])
    return feats.new_empty((nbr.shape[0], weight.shape[2]))


@torch.library.custom_op("lattice::sparse_conv_weight_grad", mutates_args=())
def sparse_conv_weight_grad(
    feats: torch.Tensor, grad_out: torch.Tensor, nbr: torch.Tensor, allow_tf32: bool = False
) -> torch.Tensor:
    """``(K, C_in, C_out)``: ``dw[n] = sum_o feats[nbr[o, n]]^T grad_out[o]``."""
    require_cpu("sparse_conv_weight_grad", feats, grad_out, nbr)
    check_sparse_conv_weight_grad(feats, grad_out, nbr)
    work = compute_dtype("sparse_conv_weight_grad", feats.dtype, halves=True)
    x = feats.contiguous()
    dy = grad_out.to(work).contiguous()
    nbr = nbr.contiguous()
    dw = torch.empty((nbr.shape[1], x.shape[1], dy.shape[1]), dtype=work)
    run_weight_grad(x, dy, nbr, dw, threads())
    return dw


def run_weight_grad(
    x: torch.Tensor, dy: torch.Tensor, nbr: torch.Tensor, dw: torch.Tensor, th: int
) -> None:
    """The CPU kernel call of ``lattice::sparse_conv_weight_grad``: ``dw[n] = x[nbr[:,
    n]]^T dy`` on ``th`` threads, over the tile lists a forward kept for ``nbr`` where
    their tiles are the weight gradient's blocks (:mod:`torch_lattice.ops.tile_lists`),
    else listing the table. Arguments contiguous CPU tensors the op has checked."""
    k = nbr.shape[1]
    sizes = (DTYPE_CODES[dw.dtype], x.shape[0], nbr.shape[0], k, x.shape[1], dy.shape[1])
    tile_rows = _C.conv_weight_grad_list_rows(*sizes, th)
    lists = kept_tile_lists(nbr, tile_rows) if tile_rows > 0 else None
    if lists is None:
        _C.conv_weight_grad(*sizes, ptr(x), ptr(dy), ptr(nbr), ptr(dw), th)
    else:
        _C.conv_weight_grad_listed(
            *sizes, ptr(x), ptr(dy), ptr(nbr), lists.tile_rows, lists.top, ptr(lists.start),
            ptr(lists.rows_in), ptr(lists.rows_out), ptr(dw), th,
        )  # fmt: skip


@sparse_conv_weight_grad.register_fake
def _(feats, grad_out, nbr, allow_tf32=False):
    return feats.new_empty((nbr.shape[1], feats.shape[1], grad_out.shape[1]))


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
    :func:`reverse_pairs` (only when an input gradient is needed).  ``gather`` selects
    gather-scatter, else fetch-on-demand; ``allow_tf32`` lets CUDA use TF32
    for float32 (ignored on CPU).
    """
    require_cpu("pair_conv", feats, weight, offsets, pair_in, pair_out)
    check_pair_conv(feats, weight, offsets, pair_in, pair_out)
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
    torch._check(feats.dtype == weight.dtype)
    torch._check(weight.shape[1] == feats.shape[1])
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
    """``(K, C_in, C_out)``: ``dw[n] = sum over pairs feats[in]^T grad_out[out]``."""
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
def _(feats, grad_out, offsets, pair_in, pair_out, gather, allow_tf32=False):
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
