"""Folding eval-mode batch norm into the convolution before it, for inference.

In eval mode ``BatchNorm`` is an affine map per channel, ``y = z * s + t`` with
``s = gamma / sqrt(running_var + eps)`` and ``t = beta - running_mean * s``; after a
convolution ``z = conv(x) + b`` it is the same convolution with weight ``w * s`` (scaled
along the output channels of the canonical ``(K, C_in, C_out)`` layout) and bias
``b * s + t``. The folded model skips one full pass over every such layer's output.
"""

from __future__ import annotations

import copy
import itertools

import torch
from torch import nn

from torch_lattice.nn.modules.activation import ReLU
from torch_lattice.nn.modules.conv import ConvBase
from torch_lattice.nn.modules.norm import BatchNorm, BatchNormReLU
from torch_lattice.nn.modules.normalized import NormalizedConvBase

__all__ = ["fold_batch_norm"]


def fold_batch_norm(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` with each ``BatchNorm`` that directly follows a convolution in
    an ``nn.Sequential`` folded into that convolution (replaced by ``nn.Identity``; a
    ``BatchNormReLU`` by ``ReLU``).

    The copy computes what ``model`` computes in eval mode, to float rounding (the
    folding is done in float64 and stored in the parameters' dtype), and is returned in
    eval mode; ``model`` is not changed. Convolutions without a bias get one. Not folded:
    weight-normalized convolutions (their weight is recomputed from ``weight`` on every
    call), batch norms without running statistics, and a batch norm whose channels are
    not the convolution's output channels; those stay as they are. Nor a convolution
    registered more than once in ``model`` (shared, as in ``Sequential(conv, bn, relu,
    conv, bn)``) or whose weight or bias another module also holds: folding would change
    its other uses too. (A convolution that ``forward`` also calls from outside the model's
    own modules cannot be seen: share none such.)

    Args:
        model: A module in eval mode.

    Returns:
        torch.nn.Module: The folded copy, in eval mode.

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``.
        ValueError: ``model`` is in training mode (batch statistics cannot be folded), or
            a batch norm to fold has a negative (or NaN) ``eps``, which
            :func:`torch_lattice.nn.functional.batch_norm` refuses (its folded scale
            would be NaN instead).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"fold_batch_norm: model must be a torch.nn.Module, got {type(model).__name__}"
        )
    if model.training:
        raise ValueError(
            "fold_batch_norm: model is in training mode; call model.eval() first "
            "(training-mode batch norm uses each batch's statistics, which cannot be folded)"
        )
    folded = copy.deepcopy(model)
    shared = _shared(folded)
    for seq in [m for m in folded.modules() if isinstance(m, nn.Sequential)]:
        names = list(seq._modules)
        for conv_name, bn_name in itertools.pairwise(names):
            conv, bn = seq._modules[conv_name], seq._modules[bn_name]
            if _foldable(conv, bn) and not _uses(conv) & shared:  # type: ignore[arg-type]
                _check_eps(bn, bn_name)  # type: ignore[arg-type]
                _fold(conv, bn)  # type: ignore[arg-type]
                # What is left of BatchNormReLU is its ReLU.
                seq._modules[bn_name] = ReLU() if isinstance(bn, BatchNormReLU) else nn.Identity()
    return folded.eval()


def _check_eps(bn: BatchNorm, name: str) -> None:
    """batch_norm's rule for ``eps`` (the model refuses to run with another one)."""
    eps = bn.eps
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(
            f"fold_batch_norm: batch norm {name!r} has eps={eps!r}; eps must be a "
            "non-negative number (the model itself refuses to run with it)"
        )


def _uses(module: nn.Module) -> set[int]:
    """The ids of ``module`` and of its own parameters."""
    return {id(module)} | {id(p) for p in module.parameters(recurse=False)}


def _shared(model: nn.Module) -> set[int]:
    """The ids of the modules and parameters that ``model`` holds in more than one place."""
    seen: set[int] = set()
    twice: set[int] = set()
    held = itertools.chain(model.named_modules(remove_duplicate=False),
                           model.named_parameters(remove_duplicate=False))
    for _, obj in held:
        (twice if id(obj) in seen else seen).add(id(obj))
    return twice


def _foldable(conv: nn.Module | None, bn: nn.Module | None) -> bool:
    return (
        isinstance(conv, ConvBase)
        and not isinstance(conv, NormalizedConvBase)
        and isinstance(bn, BatchNorm)
        and bn.running_mean is not None
        and bn.running_var is not None
        and bn.num_features == conv.out_channels
    )


@torch.no_grad()
def _fold(conv: ConvBase, bn: BatchNorm) -> None:
    assert bn.running_mean is not None and bn.running_var is not None  # by _foldable
    mean, var = bn.running_mean.double(), bn.running_var.double()
    gamma = bn.weight.double() if bn.weight is not None else torch.ones_like(mean)
    beta = bn.bias.double() if bn.bias is not None else torch.zeros_like(mean)
    scale = gamma / torch.sqrt(var + bn.eps)
    bias = conv.bias.double() if conv.bias is not None else torch.zeros_like(mean)
    dtype = conv.weight.dtype
    conv.weight.copy_((conv.weight.double() * scale).to(dtype))
    new_bias = ((bias - mean) * scale + beta).to(dtype)
    if conv.bias is None:
        conv.bias = nn.Parameter(new_bias)
    else:
        conv.bias.copy_(new_bias)
