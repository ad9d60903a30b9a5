"""Functional sparse convolutions over :class:`~torch_lattice.SparseTensor`.

These hold the support rules of docs/semantics.md ("The relation"); the modules
in :mod:`torch_lattice.nn.modules.conv` own weights and call these.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_lattice.geometry import ConvGeometry, check_kernel_size, triple
from torch_lattice.nn.functional.config import ConvConfig, resolve_config
from torch_lattice.nn.functional.relation import apply_kernel_map
from torch_lattice.tensor import SparseTensor, Support, multiply_stride, validate_coords

__all__ = ["conv3d", "subm_conv3d"]


def check_input(x: SparseTensor, weight: torch.Tensor, geometry: ConvGeometry) -> None:
    if not isinstance(x, SparseTensor):
        raise TypeError(f"input must be a torch_lattice.SparseTensor, got {type(x).__name__}")
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    if not weight.is_floating_point():
        raise TypeError(f"weight must be a floating tensor, got {weight.dtype}")
    if weight.dim() != 3 or weight.shape[0] != geometry.volume:
        raise ValueError(
            f"weight must have shape (K={geometry.volume}, C_in, C_out) for kernel_size "
            f"{geometry.kernel_size}, got {tuple(weight.shape)}"
        )
    if x.feats.shape[1] != weight.shape[1]:
        raise ValueError(
            f"input feats have {x.feats.shape[1]} channels but the layer expects "
            f"in_channels={weight.shape[1]}"
        )
    if x.feats.dtype != weight.dtype:
        raise TypeError(
            f"input feats dtype {x.feats.dtype} does not match weight dtype {weight.dtype}"
        )
    if x.feats.device != weight.device:
        raise ValueError(f"input is on {x.feats.device} but weight is on {weight.device}")


def check_config(config: ConvConfig | None) -> None:
    """``config`` is None or a :class:`ConvConfig`."""
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
    x: SparseTensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: Support,
    geometry: ConvGeometry,
    config: ConvConfig | None,
) -> SparseTensor:
    """Runs the relation from ``x``'s support onto ``target`` and adds bias."""
    kmap = x.coordinate_manager.kernel_map(x.support, target, geometry)
    y = apply_kernel_map(x.feats, weight, kmap, resolve_config(config, device=x.feats.device))
    if bias is not None:
        y = y + bias
    return SparseTensor.from_support(y, target)


def pointwise(x: SparseTensor, weight: torch.Tensor, bias: torch.Tensor | None) -> SparseTensor:
    y = x.feats @ weight[0]
    if bias is not None:
        y = y + bias
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


# Output coordinates are int32: an output range may be at most 2^31 per axis.
_COORD_LIMIT = 2**31


def generated_support(x: SparseTensor, geometry: ConvGeometry) -> Support:
    """The support a strided convolution (or pooling) with ``geometry`` generates
    from ``x`` (cached in its coordinate manager).

    Raises:
        ValueError: the window does not fit the input range (``R_out < 1``), as
            for ``torch.nn.Conv3d``; an empty tensor without a range is allowed.
            Or the output range exceeds 2^31 on some axis (padding past int32).
    """
    src = x.support
    out_range = geometry.output_range(src.grid_range())
    if min(out_range) < 1 and (src.num_rows or src.spatial_range is not None):
        raise ValueError(
            f"kernel_size {geometry.kernel_size} with dilation {geometry.dilation} and padding "
            f"{geometry.padding} does not fit the input range {src.grid_range()}: "
            f"output range would be {out_range}"
        )
    for axis, r in enumerate(out_range):
        if r > _COORD_LIMIT:
            raise ValueError(
                f"padding {geometry.padding} on the input range {src.grid_range()} "
                f"(spatial_range {src.spatial_range}) gives an output range {out_range} whose "
                f"axis {'xyz'[axis]} exceeds 2^31: output coordinates must fit int32; use less "
                "padding or a smaller spatial_range"
            )
    return x.coordinate_manager.generated_support(src, geometry)


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
    check_input(input, weight, geometry)
    check_bias(bias, weight)
    check_config(config)
    if coordinates is not None:
        expected = multiply_stride(input.stride, geometry.stride)
        target = target_support(input, coordinates, expected)
        target.manager.record_derivation(target, input.support, geometry)
        return _apply(input, weight, bias, target, geometry, config)
    if geometry.is_identity:
        return pointwise(input, weight, bias)
    target = generated_support(input, geometry)
    return _apply(input, weight, bias, target, geometry, config)


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
    ks = check_kernel_size(kernel_size)
    if any(k % 2 == 0 for k in ks):
        raise ValueError(f"kernel_size must be odd in every axis for SubmConv3d, got {ks}")
    geometry = ConvGeometry.submanifold(ks, triple("dilation", dilation, 1))
    check_input(input, weight, geometry)
    check_bias(bias, weight)
    check_config(config)
    if geometry.is_identity:
        return pointwise(input, weight, bias)
    return _apply(input, weight, bias, input.support, geometry, config)
