"""Batch normalization passes on the CPU, with an optional fused ReLU:
``lattice::batch_norm_stats``, ``lattice::batch_norm_apply``,
``lattice::batch_norm_backward_reduce`` and ``lattice::batch_norm_backward_apply``
(csrc/core/tl_norm.h).

They are the passes over the ``(N, C)`` features only; the per-channel
coefficients between them, the running statistics and autograd live in
:mod:`torch_lattice.nn.functional.norm`.  Features are float32, bfloat16 or
float16; sums are float64, outputs rounded once to the features' dtype.  The
per-channel coefficients (``scale``, ``shift``, ``mean``, ``a``, ``b``, ``k``) are
floating ``(C,)`` tensors, ``C`` the features' channels (another dtype: ``TypeError``;
another shape: ``ValueError``, each naming the coefficient); the passes read them in
float32 (``mean`` in float64).
"""

from __future__ import annotations

import torch

from torch_lattice.ops._runtime import (
    _C,
    DTYPE_CODES,
    check_copies,
    check_size,
    one_device,
    ptr,
    require_cpu,
    threads,
)

__all__ = [
    "NORM_DTYPES",
    "batch_norm_apply",
    "batch_norm_backward_apply",
    "batch_norm_backward_reduce",
    "batch_norm_stats",
]

# Feature dtypes the C passes take.
NORM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check(op: str, feats: torch.Tensor, *others: torch.Tensor) -> None:
    """``feats`` is an (N, C) tensor of a dtype the passes take; ``others`` are
    features of its shape and dtype."""
    if feats.dim() != 2:
        raise ValueError(f"lattice::{op}: features must be (N, C), got {tuple(feats.shape)}")
    if feats.dtype not in NORM_DTYPES:
        raise TypeError(
            f"lattice::{op}: features must be float32, bfloat16 or float16, got {feats.dtype}"
        )
    for t in others:

        def mismatch(t: torch.Tensor = t) -> str:
            return (f"lattice::{op}: gradient and features must match, got {tuple(t.shape)} "
                    f"{t.dtype} and {tuple(feats.shape)} {feats.dtype}")  # fmt: skip

        if t.dim() != 2 or t.dtype != feats.dtype:
            raise ValueError(mismatch())
        check_size(t.shape[0] == feats.shape[0], mismatch)
        check_size(t.shape[1] == feats.shape[1], mismatch)
    # the ops' operands are x and (the backward passes) dy; an output is x's size at most
    check_copies(op, feats.shape[0] * feats.shape[1] * feats.element_size(), x=feats,
                 dy=others[0] if others else None)


def _check_vec(op: str, name: str, t: torch.Tensor, c: int) -> None:
    """Raises unless the per-channel coefficient ``name`` is a real floating ``(C,)``
    tensor, ``C`` being the features' channels (TypeError for another dtype, ValueError
    for another shape)."""
    if not t.is_floating_point():
        raise TypeError(
            f"lattice::{op}: {name} must be a floating (C,) tensor (one coefficient per "
            f"channel), got {t.dtype}"
        )

    def bad_shape() -> str:
        return (f"lattice::{op}: {name} must have shape (C,) = ({c},), one coefficient per "
                f"channel of the features, got {tuple(t.shape)}")  # fmt: skip

    if t.dim() != 1:
        raise ValueError(bad_shape())
    check_size(t.shape[0] == c, bad_shape)


def _check_stats(x: torch.Tensor) -> None:
    """The argument check of ``lattice::batch_norm_stats`` (real and fake kernels)."""
    _check("batch_norm_stats", x)
    check_size(x.shape[0] >= 1, lambda: "lattice::batch_norm_stats: needs at least one row")


def _check_apply(op: str, x: torch.Tensor, coefficients: dict[str, torch.Tensor | None],
                 *others: torch.Tensor) -> None:  # fmt: skip
    """The argument check of a pass over features ``x`` (and ``others`` of its shape and
    dtype) with the per-channel ``coefficients`` given (not None), by name: what the real
    kernels check before reading them and the fake kernels check alone."""
    _check(op, x, *others)
    for name, t in coefficients.items():
        if t is not None:
            _check_vec(op, name, t, x.shape[1])


def _check_backward_apply(dy: torch.Tensor, x: torch.Tensor, scale: torch.Tensor,
                          shift: torch.Tensor, a: torch.Tensor, b: torch.Tensor | None,
                          k: torch.Tensor | None) -> None:  # fmt: skip
    """The argument check of ``lattice::batch_norm_backward_apply`` (real and fake)."""
    op = "batch_norm_backward_apply"
    if (b is None) != (k is None):
        raise ValueError(f"lattice::{op}: give both b and k, or neither")
    _check_apply(op, x, {"scale": scale, "shift": shift, "a": a, "b": b, "k": k}, dy)


def _vec(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A checked per-channel coefficient as the contiguous (C,) vector of ``dtype`` the C
    passes read (float32, the mean float64)."""
    return t.to(dtype).contiguous()


def _call(fn: str, x: torch.Tensor, relu: bool, *pointers: int) -> None:
    n, c = x.shape
    args = list(pointers) + [0] * (9 - len(pointers))
    getattr(_C, fn)(DTYPE_CODES[x.dtype], n, c, int(relu), *args, threads())


@torch.library.custom_op("lattice::batch_norm_stats", mutates_args=())
def batch_norm_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``(C,)`` mean and biased variance of the ``N >= 1`` rows of ``x``."""
    require_cpu("batch_norm_stats", x)
    _check_stats(x)
    x = x.contiguous()
    mean = torch.empty(x.shape[1], dtype=torch.float64)
    var = torch.empty_like(mean)
    _call("batch_norm_stats", x, False, ptr(x), ptr(mean), ptr(var))
    return mean, var


@batch_norm_stats.register_fake
@one_device("batch_norm_stats")
def _(x):
    _check_stats(x)
    return x.new_empty(x.shape[1], dtype=torch.float64), x.new_empty(
        x.shape[1], dtype=torch.float64
    )


@torch.library.custom_op("lattice::batch_norm_apply", mutates_args=())
def batch_norm_apply(
    x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, relu: bool
) -> torch.Tensor:
    """``x * scale + shift`` per channel, then ``max(., 0)`` when ``relu``; in ``x``'s dtype."""
    require_cpu("batch_norm_apply", x, scale, shift)
    _check_apply("batch_norm_apply", x, {"scale": scale, "shift": shift})
    x = x.contiguous()
    s, t = _vec(scale, torch.float32), _vec(shift, torch.float32)
    y = torch.empty_like(x)
    _call("batch_norm_apply", x, relu, ptr(x), ptr(s), ptr(t), ptr(y))
    return y


@batch_norm_apply.register_fake
@one_device("batch_norm_apply")
def _(x, scale, shift, relu):
    _check_apply("batch_norm_apply", x, {"scale": scale, "shift": shift})
    return torch.empty_like(x)


@torch.library.custom_op("lattice::batch_norm_backward_reduce", mutates_args=())
def batch_norm_backward_reduce(
    dy: torch.Tensor,
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    mean: torch.Tensor,
    relu: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``(C,)`` sums of ``g`` and ``g * (x - mean)``, ``g`` being ``dy`` where
    the fused ReLU passed (``x * scale + shift > 0``), or all of ``dy`` without it."""
    require_cpu("batch_norm_backward_reduce", dy, x, scale, shift, mean)
    coefficients = {"scale": scale, "shift": shift, "mean": mean}
    _check_apply("batch_norm_backward_reduce", x, coefficients, dy)
    x, dy = x.contiguous(), dy.contiguous()
    c = x.shape[1]
    s, t, m = _vec(scale, torch.float32), _vec(shift, torch.float32), _vec(mean, torch.float64)
    sum_g = torch.empty(c, dtype=torch.float64)
    sum_gx = torch.empty_like(sum_g)
    _call(
        "batch_norm_backward_reduce", x, relu,
        ptr(dy), ptr(x), ptr(s), ptr(t), ptr(m), ptr(sum_g), ptr(sum_gx),
    )  # fmt: skip
    return sum_g, sum_gx


@batch_norm_backward_reduce.register_fake
@one_device("batch_norm_backward_reduce")
def _(dy, x, scale, shift, mean, relu):
    coefficients = {"scale": scale, "shift": shift, "mean": mean}
    _check_apply("batch_norm_backward_reduce", x, coefficients, dy)
    c = x.shape[1]
    return x.new_empty(c, dtype=torch.float64), x.new_empty(c, dtype=torch.float64)


@torch.library.custom_op("lattice::batch_norm_backward_apply", mutates_args=())
def batch_norm_backward_apply(
    dy: torch.Tensor,
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor | None,
    k: torch.Tensor | None,
    relu: bool,
) -> torch.Tensor:
    """``g * a + x * b + k`` per channel (``g`` as in the reduction), or ``g * a`` when
    ``b`` and ``k`` are None (eval: no ``x`` term, so a NaN the ReLU cut gives 0); in
    ``x``'s dtype."""
    optional = [t for t in (b, k) if t is not None]
    require_cpu("batch_norm_backward_apply", dy, x, scale, shift, a, *optional)
    _check_backward_apply(dy, x, scale, shift, a, b, k)
    x, dy = x.contiguous(), dy.contiguous()
    s, t, va = _vec(scale, torch.float32), _vec(shift, torch.float32), _vec(a, torch.float32)
    pb = pk = 0
    if b is not None and k is not None:
        vb, vk = _vec(b, torch.float32), _vec(k, torch.float32)
        pb, pk = ptr(vb), ptr(vk)
    dx = torch.empty_like(x)
    _call(
        "batch_norm_backward_apply", x, relu,
        ptr(dy), ptr(x), ptr(s), ptr(t), ptr(va), pb, pk, ptr(dx),
    )  # fmt: skip
    return dx


@batch_norm_backward_apply.register_fake
@one_device("batch_norm_backward_apply")
def _(dy, x, scale, shift, a, b, k, relu):
    _check_backward_apply(dy, x, scale, shift, a, b, k)
    return torch.empty_like(x)
