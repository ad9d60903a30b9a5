"""Sparse pooling ops: ``lattice::pool_sum``, ``lattice::pool_avg`` and
``lattice::pool_max`` over a kernel map (see :mod:`.kmap`).

Sum pooling is a convolution with an identity weight per channel, so its
gradient is sum pooling over the transposed table (``rev``).  Average
pooling divides by the number of present neighbours.  Max pooling records
the input row of each maximum and routes the gradient back through it
(``lattice::pool_max_backward``).

Each op's body is its CPU kernel; the CUDA kernels (csrc/cuda/tl_cuda_pool.cu) are
registered by :mod:`torch_lattice.ops.pool_cuda`.  Both walk kernel rows in order per
output row, so sums, maxima and argmax ties agree.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_lattice.ops._runtime import (
    _C,
    DTYPE_CODES,
    check_copies,
    check_tensor,
    compute_dtype,
    one_device,
    ptr,
    require_cpu,
    threads,
)
from torch_lattice.ops.conv import check_nbr

__all__ = [
    "check_pool_args",
    "check_pool_max_backward",
    "pool_avg",
    "pool_max",
    "pool_max_backward",
    "pool_sum",
]


def check_pool_args(op: str, feats: torch.Tensor, table: torch.Tensor, rev: torch.Tensor
                    ) -> None:  # fmt: skip
    """The one argument check of a pooling op (CPU and CUDA): ``(N, C)`` features over
    an int32 ``(N_out, K)`` table, and its reverse, the ``(N, K)`` table the backward
    reads."""
    if feats.dim() != 2:
        raise ValueError(f"lattice::{op}: feats must be (N, C), got {tuple(feats.shape)}")
    check_nbr(op, table)
    check_tensor(op, "rev", rev, (torch.int32,), (feats.shape[0], table.shape[1]))
    # the output in float32 at least (half types are widened) and max pooling's argmax
    check_copies(op, table.shape[0] * feats.shape[1] * 8, feats=feats, nbr=table)


def check_pool_max_backward(grad: torch.Tensor, rev: torch.Tensor, argmax: torch.Tensor
                            ) -> None:  # fmt: skip
    """The argument check of ``lattice::pool_max_backward`` (CPU and CUDA): ``(N_out, C)``
    gradients, the int32 ``(N_in, K)`` reverse table and the int32 ``(N_out, C)`` input
    row of each maximum (``pool_max``'s second output)."""
    op = "pool_max_backward"
    if grad.dim() != 2:
        raise ValueError(f"lattice::{op}: grad must be (N_out, C), got {tuple(grad.shape)}")
    check_tensor(op, "rev", rev, (torch.int32,), ("N_in", "K"))
    check_tensor(op, "argmax", argmax, (torch.int32,), tuple(grad.shape))
    check_copies(op, rev.shape[0] * grad.shape[1] * 8, grad=grad, rev=rev, argmax=argmax)


def _sum(feats: torch.Tensor, nbr: torch.Tensor, average: bool) -> torch.Tensor:
    work = compute_dtype("pool_sum", feats.dtype)
    x, nbr = feats.to(work).contiguous(), nbr.contiguous()
    y = torch.empty((nbr.shape[0], x.shape[1]), dtype=work)
    _C.pool_sum(
        DTYPE_CODES[work],
        x.shape[0],
        nbr.shape[0],
        nbr.shape[1],
        x.shape[1],
        ptr(x),
        ptr(nbr),
        int(average),
        ptr(y),
        0,
        threads(),
    )
    return y.to(feats.dtype)


@torch.library.custom_op("lattice::pool_sum", mutates_args=())
def pool_sum(feats: torch.Tensor, nbr: torch.Tensor, rev: torch.Tensor) -> torch.Tensor:
    """``(N_out, C)``: ``y[o] = sum_n feats[nbr[o, n]]`` over present rows.

    Args:
        feats: ``(N_in, C)`` floating.
        nbr: ``(N_out, K)`` int32 neighbour table.
        rev: ``(N_in, K)`` int32 transpose of ``nbr`` (used by backward), as
            ``lattice::kernel_map`` returns it; trusted, not checked against ``nbr``
            (docs/kernel-maps.md), as by every op that takes both tables.
    """
    require_cpu("pool_sum", feats, nbr, rev)
    check_pool_args("pool_sum", feats, nbr, rev)
    return _sum(feats, nbr, average=False)


@pool_sum.register_fake
@one_device("pool_sum")
def _(feats, nbr, rev):
    check_pool_args("pool_sum", feats, nbr, rev)
    compute_dtype("pool_sum", feats.dtype)
    return feats.new_empty((nbr.shape[0], feats.shape[1]))


def _sum_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    _, nbr, rev = inputs
    ctx.save_for_backward(nbr, rev)


def _sum_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    nbr, rev = ctx.saved_tensors
    return pool_sum(grad.contiguous(), rev, nbr), None, None


pool_sum.register_autograd(_sum_backward, setup_context=_sum_setup)


@torch.library.custom_op("lattice::pool_avg", mutates_args=())
def pool_avg(feats: torch.Tensor, nbr: torch.Tensor, rev: torch.Tensor) -> torch.Tensor:
    """``(N_out, C)``: mean of ``feats[nbr[o, n]]`` over present rows (0 if none)."""
    require_cpu("pool_avg", feats, nbr, rev)
    check_pool_args("pool_avg", feats, nbr, rev)
    return _sum(feats, nbr, average=True)


@pool_avg.register_fake
@one_device("pool_avg")
def _(feats, nbr, rev):
    check_pool_args("pool_avg", feats, nbr, rev)
    compute_dtype("pool_avg", feats.dtype)
    return feats.new_empty((nbr.shape[0], feats.shape[1]))


def _avg_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    nbr, rev = ctx.saved_tensors
    count = (nbr >= 0).sum(dim=1, keepdim=True).clamp_min(1).to(grad.dtype)
    return pool_sum((grad / count).contiguous(), rev, nbr), None, None


pool_avg.register_autograd(_avg_backward, setup_context=_sum_setup)


@torch.library.custom_op("lattice::pool_max", mutates_args=())
def pool_max(
    feats: torch.Tensor, nbr: torch.Tensor, rev: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N_out, C)`` maxima over present rows (0 if none) and the ``(N_out, C)``
    int32 input row of each maximum (-1 if none; first in kernel-row order on ties)."""
    require_cpu("pool_max", feats, nbr, rev)
    check_pool_args("pool_max", feats, nbr, rev)
    work = compute_dtype("pool_max", feats.dtype)
    x, nbr = feats.to(work).contiguous(), nbr.contiguous()
    y = torch.empty((nbr.shape[0], x.shape[1]), dtype=work)
    arg = torch.empty((nbr.shape[0], x.shape[1]), dtype=torch.int32)
    _C.pool_max(
        DTYPE_CODES[work],
        x.shape[0],
        nbr.shape[0],
        nbr.shape[1],
        x.shape[1],
        ptr(x),
        ptr(nbr),
        0,
        ptr(y),
        ptr(arg),
        threads(),
    )
    return y.to(feats.dtype), arg


@pool_max.register_fake
@one_device("pool_max")
def _(feats, nbr, rev):
    check_pool_args("pool_max", feats, nbr, rev)
    compute_dtype("pool_max", feats.dtype)
    shape = (nbr.shape[0], feats.shape[1])
    return feats.new_empty(shape), feats.new_empty(shape, dtype=torch.int32)


@torch.library.custom_op("lattice::pool_max_backward", mutates_args=())
def pool_max_backward(grad: torch.Tensor, rev: torch.Tensor, argmax: torch.Tensor) -> torch.Tensor:
    """``(N_in, C)``: each output's gradient sent to the input row of its maximum."""
    require_cpu("pool_max_backward", grad, rev, argmax)
    check_pool_max_backward(grad, rev, argmax)
    work = compute_dtype("pool_max_backward", grad.dtype)
    dy, rev, argmax = grad.to(work).contiguous(), rev.contiguous(), argmax.contiguous()
    dx = torch.empty((rev.shape[0], dy.shape[1]), dtype=work)
    _C.pool_max_backward(
        DTYPE_CODES[work],
        rev.shape[0],
        dy.shape[0],
        rev.shape[1],
        dy.shape[1],
        ptr(dy),
        ptr(rev),
        0,
        ptr(dx),
        ptr(argmax),
        threads(),
    )
    return dx.to(grad.dtype)


@pool_max_backward.register_fake
@one_device("pool_max_backward")
def _(grad, rev, argmax):
    check_pool_max_backward(grad, rev, argmax)
    compute_dtype("pool_max_backward", grad.dtype)
    return grad.new_empty((rev.shape[0], grad.shape[1]))


def _max_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    _, _, rev = inputs
    ctx.save_for_backward(rev, output[1])


def _max_backward(ctx: Any, grad: torch.Tensor, _grad_arg: Any) -> tuple[Any, ...]:
    rev, argmax = ctx.saved_tensors
    return pool_max_backward(grad, rev, argmax), None, None


pool_max.register_autograd(_max_backward, setup_context=_max_setup)


# Double backward: pool_max_backward is linear in its grad given the argmax, dx[i, c] =
# sum of grad[o, c] over the o whose maximum is row i, so the gradient of grad is the
# incoming gradient read back at each maximum's row (0 where there is none).


def _max_backward_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    _, _, argmax = inputs
    ctx.save_for_backward(argmax)


def _max_backward_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    (argmax,) = ctx.saved_tensors
    rows = argmax.clamp_min(0).long()
    picked = torch.gather(grad, 0, rows) if grad.shape[0] else grad.new_zeros(rows.shape)
    return picked * (argmax >= 0).to(grad.dtype), None, None


pool_max_backward.register_autograd(_max_backward_backward, setup_context=_max_backward_setup)
