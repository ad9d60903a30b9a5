"""Weight normalization over a sparse relation.

``y = conv(x, W) / sqrt(conv(1, W*W) + eps) + b``: the denominator runs the
same relation over all-ones features, so it measures, per output row, the
squared weight mass that actually reaches it.  Both passes use one cached
kernel map, and the denominator stays in the autograd graph.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from torch_lattice.nn.functional.conv import check_bias
from torch_lattice.tensor import SparseTensor

__all__ = ["check_eps", "normalized"]

ConvFn = Callable[[SparseTensor, torch.Tensor], SparseTensor]


def check_eps(eps: float) -> float:
    """Raises ValueError unless ``eps`` is a finite number > 0."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"eps must be a positive number, got {eps!r}")
    if eps == float("inf"):
        raise ValueError("eps must be finite")
    return float(eps)


def normalized(
    conv: ConvFn,
    input: SparseTensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
) -> SparseTensor:
    """Applies ``conv`` (a bias-free convolution of ``input`` with a weight)
    normalized by ``sqrt(conv(1, weight**2) + eps)``, then adds ``bias``.

    Pointwise kernels (``K == 1``) skip the normalization.

    Raises:
        TypeError: ``conv`` is not callable or its result is not a SparseTensor;
            ``input`` is not a SparseTensor; ``weight`` / ``bias`` not tensors.
        ValueError: ``eps`` is not a finite number > 0; ``bias`` not ``(C_out,)``.
    """
    eps = check_eps(eps)
    if not callable(conv):
        raise TypeError(f"conv must be callable (input, weight) -> SparseTensor, got {conv!r}")
    if not isinstance(input, SparseTensor):
        raise TypeError(f"input must be a torch_lattice.SparseTensor, got {type(input).__name__}")
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    check_bias(bias, weight)
    if weight.shape[0] == 1:
        out = _checked(conv(input, weight))
    else:
        out = weight_normalized(conv, input, weight, eps)
    if bias is None:
        return out
    # Features this function made: trusted, not checked again (SparseTensor.replace would).
    return SparseTensor.from_support(out.feats + bias, out.support)


def _checked(result: object) -> SparseTensor:
    """``conv``'s result, which must be a SparseTensor (TypeError naming it)."""
    if not isinstance(result, SparseTensor):
        raise TypeError(
            "conv's result must be a torch_lattice.SparseTensor (conv is called as "
            f"conv(input, weight) -> SparseTensor), got {type(result).__name__}"
        )
    return result


def weight_normalized(
    conv: ConvFn, input: SparseTensor, weight: torch.Tensor, eps: float
) -> SparseTensor:
    """``conv(input, weight) / sqrt(conv(1, weight**2) + eps)`` at any kernel size
    (no bias, no checks: ``eps`` already checked)."""
    num = _checked(conv(input, weight))
    device_type = weight.device.type
    # In float16 squared weights below 6e-8 vanish and eps = 1e-8 rounds to 0 (inf for
    # small weights, NaN for a row nothing reaches): the denominator is summed in float32,
    # for float16 weights and under autocast (whose convolutions run in half precision,
    # with autocast off there). The quotient stays float32 under autocast and is float16
    # for a float16 model, as its other layers' outputs.
    autocast = device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type)
    wide = autocast or weight.dtype == torch.float16
    w = weight.float() if wide else weight
    with torch.autocast(device_type, enabled=False) if autocast else contextlib.nullcontext():
        ones = torch.ones(input.feats.shape, dtype=w.dtype, device=w.device)
        den = _checked(conv(SparseTensor.from_support(ones, input.support), w * w))
    out = num.feats / torch.sqrt(den.feats + eps)
    if not autocast:
        out = out.to(num.feats.dtype)
    return SparseTensor.from_support(out, num.support)
