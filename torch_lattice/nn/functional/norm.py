"""Batch normalization of ``(N, C)`` features with an optional fused ReLU.

``batch_norm`` computes what ``torch.nn.functional.batch_norm`` (then
``torch.relu`` when ``relu``) computes, with the same running-statistics
update.  On the CPU, for float32, bfloat16 and float16 features, it runs the
C passes of :mod:`torch_lattice.ops.norm`: two passes over the features
forward (statistics, then normalize + ReLU), two backward (sums, then the
input gradient), float64 sums, the ReLU mask recomputed from the saved input
instead of a separate ReLU pass and tensor.  Elsewhere (CUDA, float64, empty
inputs, fewer than ``C_PASSES_MIN_ELEMENTS`` features) it calls torch's own kernels.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as torch_f

from torch_lattice.ops import norm as norm_ops

__all__ = ["C_PASSES_MIN_ELEMENTS", "batch_norm"]

# Below this many features the C passes' fixed cost (four custom-op calls and the
# per-channel coefficients, about 0.3 ms a training step) exceeds torch's whole kernel;
# from 2^18 up they are faster (2^18 float32: 1.4 vs 1.5 ms forward + backward, 2^20:
# 2.8 vs 4.7 ms, 2 threads).  Empty inputs also go to torch.
C_PASSES_MIN_ELEMENTS = 1 << 18


def batch_norm(
    input: torch.Tensor,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    relu: bool = False,
) -> torch.Tensor:
    """``torch.nn.functional.batch_norm`` of ``(N, C)`` features, then ``max(., 0)``
    when ``relu``.

    ``training`` normalizes with the batch's statistics (biased variance) and, where
    running buffers are given, updates them in place (``(1 - momentum) * running +
    momentum * batch``, the variance unbiased); otherwise the running statistics
    normalize.

    Args:
        input: ``(N, C)`` features.
        running_mean, running_var: ``(C,)`` buffers, or both None (batch statistics).
        weight, bias: ``(C,)`` affine parameters, or None.
        training: use (and fold into the running buffers) the batch statistics.
        momentum: weight of the batch in the running update.
        eps: added to the variance.
        relu: apply ``max(., 0)`` to the result (fused: one pass, no extra tensor).

    Returns:
        torch.Tensor: ``(N, C)``, ``input``'s dtype.

    Raises:
        ValueError: ``input`` is not 2-D, a per-channel tensor is not ``(C,)`` or not on
            ``input``'s device, only one running buffer is given, eval mode without
            running statistics, ``training`` with a single row, ``eps`` is negative (or
            NaN), or ``momentum`` is not in ``[0, 1]`` (NaN included).
        TypeError: ``input`` is not a floating tensor, a per-channel argument is not a
            tensor or None, the parameters' dtype is neither ``input``'s nor float32 for
            float16 / bfloat16 features, or ``momentum`` / ``eps`` is not a number.
    """
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"batch_norm: input must be a torch.Tensor, got {type(input).__name__}")
    if not input.is_floating_point():
        raise TypeError(f"batch_norm: input must be a floating tensor, got {input.dtype}")
    if input.dim() != 2:
        raise ValueError(f"batch_norm: input must be (N, C) features, got {tuple(input.shape)}")
    n, c = input.shape
    for name, t in (("running_mean", running_mean), ("running_var", running_var),
                    ("weight", weight), ("bias", bias)):  # fmt: skip
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"batch_norm: {name} must be a torch.Tensor or None, got {type(t).__name__}"
            )
        if tuple(t.shape) != (c,):
            raise ValueError(f"batch_norm: {name} must have shape ({c},), got {tuple(t.shape)}")
        if t.device != input.device:
            raise ValueError(
                f"batch_norm: {name} must be on input's device ({input.device}), got {t.device}"
            )
    for name, value in (("momentum", momentum), ("eps", eps)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"batch_norm: {name} must be a number, got {type(value).__name__}")
    if not eps >= 0:
        raise ValueError(f"batch_norm: eps must be non-negative, got {eps}")
    if not 0 <= momentum <= 1:
        raise ValueError(f"batch_norm: momentum must be a number in [0, 1], got {momentum}")
    if (running_mean is None) != (running_var is None):
        raise ValueError("batch_norm: give both running_mean and running_var, or neither")
    if not training and running_mean is None:
        raise ValueError("batch_norm: eval mode (training=False) needs running statistics")
    if training and n == 1:
        raise ValueError(
            "batch_norm: training needs more than 1 row per channel (the batch variance of "
            f"one row is 0), got input of shape {tuple(input.shape)}"
        )
    params = [t for t in (weight, bias, running_mean, running_var) if t is not None]
    for t in params:
        if t.dtype != input.dtype and not (
            input.dtype in (torch.float16, torch.bfloat16) and t.dtype == torch.float32
        ):
            raise TypeError(
                f"batch_norm: parameters of dtype {t.dtype} do not mix with {input.dtype} "
                "features (they must match, or be float32 for float16 / bfloat16 features)"
            )
    if (
        input.device.type != "cpu"
        or input.dtype not in norm_ops.NORM_DTYPES
        or n * c < C_PASSES_MIN_ELEMENTS
    ):
        out = torch_f.batch_norm(
            input, running_mean, running_var, weight, bias, training, momentum, eps
        )
        return torch.relu(out) if relu else out
    return _BatchNorm.apply(
        input, weight, bias, running_mean, running_var, training, momentum, eps, relu
    )


def _reference(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    mean: torch.Tensor | None,
    invstd: torch.Tensor | None,
    eps: float,
    relu: bool,
) -> torch.Tensor:
    """The layer in differentiable torch ops (batch statistics when ``mean`` is None),
    for gradients of gradients."""
    xf = x.float()
    if mean is None:
        m = xf.mean(0)
        scale = torch.rsqrt(xf.var(0, unbiased=False) + eps)
    else:
        m, scale = mean.float(), invstd.float()  # type: ignore[union-attr]
    y = (xf - m) * scale
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    return (torch.relu(y) if relu else y).to(x.dtype)


class _BatchNorm(torch.autograd.Function):
    """The C passes with their coefficients; double backward through :func:`_reference`."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        running_mean: torch.Tensor | None,
        running_var: torch.Tensor | None,
        training: bool,
        momentum: float,
        eps: float,
        relu: bool,
    ) -> torch.Tensor:
        n = x.shape[0]
        if training:
            mean, var = norm_ops.batch_norm_stats(x)
            if running_mean is not None and running_var is not None:
                unbiased = var * (n / (n - 1))
                running_mean.copy_(running_mean.double() * (1 - momentum) + mean * momentum)
                running_var.copy_(running_var.double() * (1 - momentum) + unbiased * momentum)
        else:
            assert running_mean is not None and running_var is not None  # by batch_norm
            mean, var = running_mean.double(), running_var.double()
        invstd = torch.rsqrt(var + eps)
        scale = invstd * weight.double() if weight is not None else invstd
        shift = -mean * scale
        if bias is not None:
            shift = shift + bias.double()
        scale32, shift32 = scale.float(), shift.float()
        ctx.save_for_backward(x, weight, bias, mean, invstd, scale, scale32, shift32)
        ctx.training, ctx.eps, ctx.relu = training, eps, relu
        return norm_ops.batch_norm_apply(x, scale32, shift32, relu)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        x, weight, bias, mean, invstd, scale, scale32, shift32 = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        none = (None,) * 6
        if torch.is_grad_enabled():
            # create_graph: differentiable torch ops, so the gradient has a gradient.
            wanted = [t for t, need in ((x, need_x), (weight, need_w), (bias, need_b)) if need]
            with torch.enable_grad():
                y = _reference(
                    x, weight, bias,
                    None if ctx.training else mean, None if ctx.training else invstd,
                    ctx.eps, ctx.relu,
                )  # fmt: skip
            grads = iter(torch.autograd.grad(y, wanted, dy, create_graph=True))
            return (*(next(grads) if need else None for need in (need_x, need_w, need_b)), *none)
        dy = dy.to(x.dtype)
        sum_g = sum_gx = None
        if ctx.training or need_w or need_b:
            sum_g, sum_gx = norm_ops.batch_norm_backward_reduce(
                dy, x, scale32, shift32, mean, ctx.relu
            )
        dx = None
        if need_x:
            b: torch.Tensor | None = None
            k: torch.Tensor | None = None
            if ctx.training:
                assert sum_g is not None and sum_gx is not None
                n = x.shape[0]
                b = -scale * invstd * invstd * sum_gx / n
                k = -scale * sum_g / n - mean * b
            dx = norm_ops.batch_norm_backward_apply(
                dy, x, scale32, shift32, scale32, b, k, ctx.relu
            )
        dw = (sum_gx * invstd).to(weight.dtype) if need_w else None  # type: ignore[operator]
        db = sum_g.to(bias.dtype) if need_b else None  # type: ignore[union-attr]
        return (dx, dw, db, *none)
