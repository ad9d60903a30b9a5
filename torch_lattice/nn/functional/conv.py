"""Functional sparse convolutions over :class:`~torch_lattice.SparseTensor`.

These hold the support rules of docs/semantics.md ("The relation"); the modules
in :mod:`torch_lattice.nn.modules.conv` own weights and call these.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_lattice.geometry import ConvGeometry, check_submanifold_kernel_size, triple
from torch_lattice.memory_budget import check_allocation
from torch_lattice.nn.functional.config import ConvConfig, resolve_config
from torch_lattice.nn.functional.relation import apply_kernel_map, kernel_map
from torch_lattice.nn.functional.supports import generated_support
from torch_lattice.tensor import (
    SparseTensor,
    Support,
    check_strided,
    multiply_stride,
    validate_coords,
)

__all__ = [
    "check_bias",
    "check_call",
    "check_config",
    "check_contiguous_copy",
    "conv3d",
    "conv3d_over",
    "subm_conv3d",
    "subm_conv3d_over",
    "submanifold_geometry",
]


def check_call(
    x: SparseTensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    config: ConvConfig | None,
    geometry: ConvGeometry,
) -> tuple[torch.Tensor, Support]:
    """Every argument check of one convolution call (input, weight, bias, config);
    returns the input's features and support.

    Each public entry runs it once; the helpers it calls after trust the arguments.
    """
    if not isinstance(x, SparseTensor):
        raise TypeError(f"input must be a torch_lattice.SparseTensor, got {type(x).__name__}")
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    check_strided(weight, "weight")
    if not weight.is_floating_point():
        raise TypeError(f"weight must be a floating tensor, got {weight.dtype}")
    volume = geometry.volume
    if weight.dim() != 3 or weight.shape[0] != volume:
        raise ValueError(
            f"weight must have shape (K={volume}, C_in, C_out) for kernel_size "
            f"{geometry.kernel_size}, got {tuple(weight.shape)}"
        )
    feats, support = x.feats, x.support
    if feats.shape[1] != weight.shape[1]:
        raise ValueError(
            f"input feats have {feats.shape[1]} channels but the layer expects "
            f"in_channels={weight.shape[1]}"
        )
    if feats.dtype != weight.dtype:
        raise TypeError(
            f"input feats dtype {feats.dtype} does not match weight dtype {weight.dtype}"
        )
    if feats.device != weight.device:
        raise ValueError(f"input is on {feats.device} but weight is on {weight.device}")
    check_bias(bias, weight)
    check_contiguous_copy("weight", weight)
    if bias is not None:
        check_contiguous_copy("bias", bias)
    check_config(config)
    return feats, support


def check_contiguous_copy(name: str, t: torch.Tensor) -> None:
    """The kernels run on contiguous operands: a strided one (an ``expand``ed view of a
    few bytes of storage) is copied first, so that copy is sized against the memory
    budget before it is made (a ``MemoryBudgetError`` naming ``name``)."""
    if not t.is_contiguous():  # (ops._runtime.strided_copy_bytes, inline: one file here)
        check_allocation(f"contiguous copy of {name} {tuple(t.shape)}",
                         t.numel() * t.element_size())  # fmt: skip


def autocast_operands(
    x: SparseTensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[SparseTensor, torch.Tensor, torch.Tensor | None]:
    """The operands a convolution runs on under ``torch.autocast``: inside an autocast
    region for the features' device type, float32 and half features, weight and bias are
    cast to its dtype (float64 and non-float ones are left alone, as autocast leaves
    them), as torch's own convolutions are, so a layer after an autocast ``Linear``
    takes its bfloat16 output; outside one, the operands as they are. The casts are
    differentiable: float32 parameters get float32 gradients."""
    # The weight's device (check_call requires the features' to be the same): outside
    # autocast nothing else is read, so the common path costs one torch query.
    if not isinstance(weight, torch.Tensor):
        return x, weight, bias  # check_call names what is wrong
    device_type = weight.device.type
    if device_type not in ("cpu", "cuda") or not torch.is_autocast_enabled(device_type):
        return x, weight, bias
    if not isinstance(x, SparseTensor) or x.feats.device != weight.device:
        return x, weight, bias
    dtype = torch.get_autocast_dtype(device_type)

    def cast(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point() and t.dtype not in (torch.float64, dtype):
            return t.to(dtype)
        return t

    feats = cast(x.feats)
    if feats is not x.feats:
        x = x.replace(feats)
    return x, cast(weight), cast(bias) if isinstance(bias, torch.Tensor) else bias


def check_config(config: ConvConfig | None) -> None:
    """``config`` is None or a :class:`ConvConfig` (modules check it at construction)."""
    if config is not None and not isinstance(config, ConvConfig):
        raise TypeError(f"config must be a ConvConfig or None, got {type(config).__name__}")


def check_bias(bias: torch.Tensor | None, weight: torch.Tensor) -> None:
    """``bias`` is None or a ``(C_out,)`` tensor like ``weight`` (no silent broadcast)."""
    if bias is None:
        return
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    c_out = weight.shape[-1]
    if bias.shape != (c_out,):
        raise ValueError(f"bias must have shape (C_out,) = ({c_out},), got {tuple(bias.shape)}")
    if bias.dtype != weight.dtype or bias.device != weight.device:
        raise TypeError(
            f"bias must match weight's dtype and device ({weight.dtype}, {weight.device}), "
            f"got {bias.dtype} on {bias.device}"
        )


def _apply(
    feats: torch.Tensor,
    source: Support,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: Support | None,
    geometry: ConvGeometry,
    config: ConvConfig | None,
) -> SparseTensor:
    """Runs the relation from ``source`` (rows of ``feats``) onto ``target`` (None:
    ``source`` itself) and adds bias."""
    target = source if target is None else target
    cfg = resolve_config(config, device=feats.device)
    y = apply_kernel_map(feats, weight, kernel_map(source, target, geometry), cfg)
    if bias is not None:
        # In place: y is the op's fresh output, and no backward reads it; a new tensor
        # would cost a fresh allocation (page faults) besides the pass.
        y = y.add_(bias)
    return SparseTensor.from_support(y, target)


# The 1x1x1 stride-1 relation: every row onto itself.
IDENTITY = ConvGeometry.submanifold((1, 1, 1), (1, 1, 1))


def pointwise(
    x: SparseTensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    config: ConvConfig | None = None,
) -> SparseTensor:
    """A 1x1x1 stride-1 convolution: one matrix product on the rows, support kept.

    On the CPU it runs as implicit GEMM over the identity map (cached on the support):
    2.3x to 3x torch.mm's speed there at 158k rows and C = 32 to 256, and its gradients
    are the library's too. On CUDA, ``mm`` (tensor cores)."""
    if x.feats.device.type == "cpu":
        return _apply(x.feats, x.support, weight, bias, None, IDENTITY, config)
    y = x.feats @ weight[0]
    if bias is not None:
        y = y.add_(bias)  # in place, as in _apply
    return SparseTensor.from_support(y, x.support)


def target_support(
    x: SparseTensor,
    coordinates: SparseTensor | Support | torch.Tensor,
    expected: tuple[int, int, int],
) -> Support:
    """The support of caller-given ``coordinates``, whose stride must be ``expected``.

    A SparseTensor or Support is used as it is (so its cached maps are
    shared); an ``(M, 4)`` integer tensor is validated like SparseTensor coords.
    """
    if isinstance(coordinates, SparseTensor):
        coordinates = coordinates.support
    if isinstance(coordinates, Support):
        if coordinates.stride != expected:
            raise ValueError(
                f"coordinates stride {coordinates.stride} must equal {expected} "
                f"(input stride {x.stride} and the layer's stride)"
            )
        if coordinates.coords.device != x.device:
            raise ValueError(f"coordinates are on {coordinates.coords.device}, input on {x.device}")
        return coordinates
    coords = validate_coords(coordinates, name="coordinates")
    if coords.device != x.device:
        raise ValueError(f"coordinates are on {coords.device}, input on {x.device}")
    return x.coordinate_manager.new_support(coords, expected, None)


def conv3d(
    input: SparseTensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    kernel_size: int | Sequence[int] = 3,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    *,
    coordinates: SparseTensor | Support | torch.Tensor | None = None,
    config: ConvConfig | None = None,
) -> SparseTensor:
    """Support-generating (or target-conditioned) sparse convolution.

    ``y[q] = bias + sum_n weight[n]^T x[q*stride - padding + r_n*dilation]``.

    Args:
        input: SparseTensor with ``(N, C_in)`` features.
        weight: ``(K, C_in, C_out)``, kernel rows z fastest.
        bias: ``(C_out,)`` or None.
        coordinates: None to generate the output support (every reachable
            ``q`` in ``[0, R_out)``, sorted by (b, x, y, z)), or a target
            SparseTensor, Support or ``(M, 4)`` integer tensor whose rows are computed
            in their order; its stride must be ``input.stride * stride``.
        config: dataflow configuration of this call (see ``config.py``).

    Returns:
        SparseTensor with stride ``input.stride * stride``.
    """
    geometry = ConvGeometry.create(kernel_size, stride, padding, dilation)
    return conv3d_over(input, weight, bias, geometry, coordinates=coordinates, config=config)


def conv3d_over(
    input: SparseTensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    geometry: ConvGeometry,
    *,
    coordinates: SparseTensor | Support | torch.Tensor | None = None,
    config: ConvConfig | None = None,
) -> SparseTensor:
    """:func:`conv3d` over a geometry its caller checked (see :func:`subm_conv3d_over`)."""
    input, weight, bias = autocast_operands(input, weight, bias)
    feats, source = check_call(input, weight, bias, config, geometry)
    if coordinates is not None:
        expected = multiply_stride(source.stride, geometry.stride)
        target = target_support(input, coordinates, expected)
        target.manager.record_derivation(target, source, geometry)
        return _apply(feats, source, weight, bias, target, geometry, config)
    if geometry.is_identity:
        return pointwise(input, weight, bias, config)
    target = generated_support(source, geometry)
    return _apply(feats, source, weight, bias, target, geometry, config)


def subm_conv3d(
    input: SparseTensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    kernel_size: int | Sequence[int] = 3,
    dilation: int | Sequence[int] = 1,
    *,
    config: ConvConfig | None = None,
) -> SparseTensor:
    """Submanifold (support-preserving) sparse convolution, odd kernels.

    ``y[q] = bias + sum_n weight[n]^T x[q + (r_n - (K-1)/2) * dilation]`` on
    exactly the input rows, in their order.
    """
    geometry = submanifold_geometry(kernel_size, dilation)
    return subm_conv3d_over(input, weight, bias, geometry, config=config)


def submanifold_geometry(
    kernel_size: int | Sequence[int], dilation: int | Sequence[int]
) -> ConvGeometry:
    """The checked geometry of ``subm_conv3d(kernel_size=, dilation=)``."""
    ks = check_submanifold_kernel_size(kernel_size)
    return ConvGeometry.submanifold(ks, triple("dilation", dilation, 1))


def subm_conv3d_over(
    input: SparseTensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    geometry: ConvGeometry,
    *,
    config: ConvConfig | None = None,
) -> SparseTensor:
    """:func:`subm_conv3d` over a geometry its caller checked (a module does at
    construction), so a module's forward checks only the call's arguments."""
    input, weight, bias = autocast_operands(input, weight, bias)
    feats, source = check_call(input, weight, bias, config, geometry)
    if geometry.is_identity:
        return pointwise(input, weight, bias, config)
    return _apply(feats, source, weight, bias, None, geometry, config)
