"""Pair-list ops for the fetch-on-demand and gather-scatter dataflows.

``lattice::kernel_pairs`` turns an ``(N_out, K)`` neighbour table into CSR
pair lists (docs/kernel-maps.md); ``lattice::pair_conv`` runs a relation over
them, with autograd: the input gradient is the same op over the reversed
pairs with ``W^T``, the weight gradient ``lattice::pair_conv_weight_grad``.
The reversed pairs default to :func:`reverse_pairs` of the forward pairs, so
no second pair list is built from a neighbour table.

Each op's body runs on the CPU; its CUDA kernel is registered beside it with
``register_kernel("cuda")`` (torch_lattice/ops/_cuda.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from torch_lattice.ops import _cuda
from torch_lattice.ops._native import _C, DTYPE_CODES, compute_dtype, ptr, require_cpu, threads
from torch_lattice.ops.conv import check_conv_args

__all__ = ["PairLists", "kernel_pairs", "pair_conv", "pair_conv_weight_grad", "reverse_pairs"]

# enum tl_pairs_mode in csrc/core/tl_dataflow_pairs.h
FETCH_ON_DEMAND, GATHER_SCATTER = 0, 1


def _flow(gather: bool) -> str:
    return "gather_scatter" if gather else "fetch_on_demand"


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


@torch.library.custom_op("lattice::kernel_pairs", mutates_args=())
def kernel_pairs(nbr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(offsets, pair_in, pair_out)`` of an ``(N_out, K)`` int32 table.

    Pairs of kernel row ``n`` are ``offsets[n]:offsets[n + 1]``, sorted by ``pair_out``.
    """
    require_cpu("kernel_pairs", nbr)
    nbr = nbr.contiguous()
    n_out, k = nbr.shape
    offsets = torch.empty(k + 1, dtype=torch.int64)
    _C.pairs_count(ptr(nbr), n_out, k, ptr(offsets), threads())
    total = int(offsets[-1])
    pair_in = torch.empty(total, dtype=torch.int32)
    pair_out = torch.empty(total, dtype=torch.int32)
    _C.pairs_fill(ptr(nbr), n_out, k, ptr(offsets), ptr(pair_in), ptr(pair_out), threads())
    return offsets, pair_in, pair_out


@kernel_pairs.register_kernel("cuda")
def _(nbr):
    return _cuda.kernel_pairs(nbr)


@kernel_pairs.register_fake
def _(nbr):
    p = torch.library.get_ctx().new_dynamic_size()
    return (
        nbr.new_empty((nbr.shape[1] + 1,), dtype=torch.int64),
        nbr.new_empty((p,)),
        nbr.new_empty((p,)),
    )


def _run(
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
    check_conv_args("pair_conv", feats, weight, offsets.shape[0] - 1)
    work = compute_dtype("pair_conv", feats.dtype)
    x, w = feats.to(work).contiguous(), weight.to(work).contiguous()
    k, cin, cout = w.shape
    y = torch.empty((n_out, cout), dtype=work)
    _run(
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


@pair_conv.register_kernel("cuda")
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
    check_conv_args("pair_conv", feats, weight, offsets.shape[0] - 1)
    return _cuda.conv_forward(
        _flow(gather),
        feats,
        weight,
        pairs=(offsets, pair_in, pair_out),
        n_out=n_out,
        allow_tf32=allow_tf32,
    )


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
    work = compute_dtype("pair_conv_weight_grad", feats.dtype)
    x, dy = feats.to(work).contiguous(), grad_out.to(work).contiguous()
    k = offsets.shape[0] - 1
    dw = torch.empty((k, x.shape[1], dy.shape[1]), dtype=work)
    _run(
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


@pair_conv_weight_grad.register_kernel("cuda")
def _(feats, grad_out, offsets, pair_in, pair_out, gather, allow_tf32=False):
    return _cuda.conv_weight_grad(
        _flow(gather), feats, grad_out, pairs=(offsets, pair_in, pair_out), allow_tf32=allow_tf32
    )


@pair_conv_weight_grad.register_fake
def _(feats, grad_out, offsets, pair_in, pair_out, gather, allow_tf32=False):
    return feats.new_empty((offsets.shape[0] - 1, feats.shape[1], grad_out.shape[1]))


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    feats, weight, *pairs, _n_out, gather, allow_tf32 = inputs
    ctx.gather = gather
    ctx.allow_tf32 = allow_tf32
    ctx.n_in = feats.shape[0]
    ctx.save_for_backward(
        feats if ctx.needs_input_grad[1] else None,
        weight if ctx.needs_input_grad[0] else None,
        *pairs,
    )


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
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


pair_conv.register_autograd(_backward, setup_context=_setup_context)
