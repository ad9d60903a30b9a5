"""Sparse convolution ops: ``lattice::sparse_conv`` and its weight gradient.

``sparse_conv(feats, weight, nbr, rev)`` computes
``y[o] = sum_n feats[nbr[o, n]] @ weight[n]`` over an ``(N_out, K)`` neighbour
table.  Its input gradient is the same op on the transposed relation
(``rev``, ``weight^T``), so backward is built from registered ops only.
Each op's body runs on the CPU; its CUDA kernel is registered beside it with
``register_kernel("cuda")``.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_lattice.ops import _cuda
from torch_lattice.ops._native import (
    _C,
    DTYPE_CODES,
    check_nbr,
    compute_dtype,
    ptr,
    require_cpu,
    threads,
)

__all__ = ["check_conv_args", "sparse_conv", "sparse_conv_weight_grad"]


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


def _forward(feats: torch.Tensor, weight: torch.Tensor, nbr: torch.Tensor) -> torch.Tensor:
    work = compute_dtype("sparse_conv", feats.dtype)
    x = feats.to(work).contiguous()
    w = weight.to(work).contiguous()
    nbr = nbr.contiguous()
    k, cin, cout = w.shape
    y = torch.empty((nbr.shape[0], cout), dtype=work)
    _C.conv_forward(
        DTYPE_CODES[work],
        x.shape[0],
        nbr.shape[0],
        k,
        cin,
        cout,
        ptr(x),
        ptr(w),
        ptr(nbr),
        ptr(y),
        threads(),
    )
    return y.to(feats.dtype)


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
    require_cpu("sparse_conv", feats, weight, nbr, rev)
    check_nbr("sparse_conv", nbr)
    check_conv_args("sparse_conv", feats, weight, nbr.shape[1])
    return _forward(feats, weight, nbr)


@sparse_conv.register_kernel("cuda")
def _(feats, weight, nbr, rev, allow_tf32=False):
    check_nbr("sparse_conv", nbr)
    check_conv_args("sparse_conv", feats, weight, nbr.shape[1])
    return _cuda.conv_forward("implicit_gemm", feats, weight, nbr=nbr, allow_tf32=allow_tf32)


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
    work = compute_dtype("sparse_conv_weight_grad", feats.dtype)
    x = feats.to(work).contiguous()
    dy = grad_out.to(work).contiguous()
    nbr = nbr.contiguous()
    k = nbr.shape[1]
    dw = torch.empty((k, x.shape[1], dy.shape[1]), dtype=work)
    _C.conv_weight_grad(
        DTYPE_CODES[work],
        x.shape[0],
        nbr.shape[0],
        k,
        x.shape[1],
        dy.shape[1],
        ptr(x),
        ptr(dy),
        ptr(nbr),
        ptr(dw),
        threads(),
    )
    return dw.to(feats.dtype)


@sparse_conv_weight_grad.register_kernel("cuda")
def _(feats, grad_out, nbr, allow_tf32=False):
    dataflow = _cuda.weight_grad_dataflow()
    if dataflow == "gather_scatter":  # deterministic algorithms: no atomics (determinism.md)
        pairs = _cuda.kernel_pairs(nbr)
        return _cuda.conv_weight_grad(dataflow, feats, grad_out, pairs=pairs, allow_tf32=allow_tf32)
    return _cuda.conv_weight_grad(dataflow, feats, grad_out, nbr=nbr, allow_tf32=allow_tf32)


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
    if ctx.needs_input_grad[0]:
        wt = weight.transpose(1, 2).contiguous()
        grad_feats = sparse_conv(grad, wt, rev, nbr, ctx.allow_tf32)
    if ctx.needs_input_grad[1]:
        grad_weight = sparse_conv_weight_grad(feats, grad, nbr, ctx.allow_tf32)
    return grad_feats, grad_weight, None, None, None


sparse_conv.register_autograd(_backward, setup_context=_setup_context)
