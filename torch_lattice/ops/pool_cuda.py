"""CUDA kernels of the pooling ops (``csrc/cuda/tl_cuda_pool.cu``, ``_C.cuda_pool_*``).

Registered here as the ``"cuda"`` kernels of the ops in :mod:`torch_lattice.ops.pool`;
they walk kernel rows in order per output row as the CPU does, so sums, maxima and
argmax ties agree.  Each kernel checks the op's arguments once (as the CPU kernel does),
the device and the feature dtype, allocates outputs with torch on the tensors' device
and passes raw pointers, the device index and torch's current stream to C.
"""

from __future__ import annotations

import torch

from torch_lattice.ops import pool
from torch_lattice.ops._runtime import _C, call_args, cuda_feature_code, ptr, require_cuda

__all__ = ["pool_avg", "pool_max", "pool_max_backward", "pool_sum"]


def _sum(op: str, feats: torch.Tensor, nbr: torch.Tensor, rev: torch.Tensor) -> torch.Tensor:
    """``(N_out, C)`` sum (average for ``pool_avg``) pooling over ``nbr``."""
    pool.check_pool_args(op, feats, nbr, rev)
    device = require_cuda(op, feats, nbr, rev)
    code = cuda_feature_code(op, feats.dtype)
    x, nbr = feats.contiguous(), nbr.contiguous()
    y = torch.empty((nbr.shape[0], x.shape[1]), dtype=x.dtype, device=device)
    index, stream = call_args(device)
    _C.cuda_pool_sum(
        index,
        stream,
        code,
        x.shape[0],
        nbr.shape[0],
        nbr.shape[1],
        x.shape[1],
        ptr(x),
        ptr(nbr),
        int(op == "pool_avg"),
        ptr(y),
        0,
    )
    return y


@pool.pool_sum.register_kernel("cuda")
def pool_sum(feats: torch.Tensor, nbr: torch.Tensor, rev: torch.Tensor) -> torch.Tensor:
    """``(N_out, C)`` sum pooling over ``nbr``, as ``lattice::pool_sum`` on CPU."""
    return _sum("pool_sum", feats, nbr, rev)


@pool.pool_avg.register_kernel("cuda")
def pool_avg(feats: torch.Tensor, nbr: torch.Tensor, rev: torch.Tensor) -> torch.Tensor:
    """``(N_out, C)`` average pooling over ``nbr``, as ``lattice::pool_avg`` on CPU."""
    return _sum("pool_avg", feats, nbr, rev)


@pool.pool_max.register_kernel("cuda")
def pool_max(
    feats: torch.Tensor, nbr: torch.Tensor, rev: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N_out, C)`` maxima and int32 argmax rows, as ``lattice::pool_max`` on CPU."""
    pool.check_pool_args("pool_max", feats, nbr, rev)
    device = require_cuda("pool_max", feats, nbr, rev)
    code = cuda_feature_code("pool_max", feats.dtype)
    x, nbr = feats.contiguous(), nbr.contiguous()
    shape = (nbr.shape[0], x.shape[1])
    y = torch.empty(shape, dtype=x.dtype, device=device)
    arg = torch.empty(shape, dtype=torch.int32, device=device)
    index, stream = call_args(device)
    _C.cuda_pool_max(
        index,
        stream,
        code,
        x.shape[0],
        nbr.shape[0],
        nbr.shape[1],
        x.shape[1],
        ptr(x),
        ptr(nbr),
        0,
        ptr(y),
        ptr(arg),
    )
    return y, arg


@pool.pool_max_backward.register_kernel("cuda")
def pool_max_backward(grad: torch.Tensor, rev: torch.Tensor, argmax: torch.Tensor) -> torch.Tensor:
    """``(N_in, C)``: each output's gradient sent to the input row of its maximum."""
    pool.check_pool_max_backward(grad, rev, argmax)
    device = require_cuda("pool_max_backward", grad, rev, argmax)
    code = cuda_feature_code("pool_max_backward", grad.dtype)
    dy, rev, argmax = grad.contiguous(), rev.contiguous(), argmax.contiguous()
    dx = torch.empty((rev.shape[0], dy.shape[1]), dtype=dy.dtype, device=device)
    index, stream = call_args(device)
    _C.cuda_pool_max_backward(
        index,
        stream,
        code,
        rev.shape[0],
        dy.shape[0],
        rev.shape[1],
        dy.shape[1],
        ptr(dy),
        ptr(rev),
        0,
        ptr(dx),
        ptr(argmax),
    )
    return dx
