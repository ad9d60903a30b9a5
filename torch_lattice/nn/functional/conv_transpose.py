"""Functional transposed sparse convolutions (docs/semantics.md, "The relation").

A transpose with stride ``s`` maps a coarse ``src`` onto a fine support
``t`` through ``t = src * s + r * d - p``: exactly the relation of the
forward convolution from ``t`` to ``src``, read the other way round.  So the
kernel map is the forward one, keyed identically in the coordinate manager:
a decoder reuses its encoder's maps.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_lattice.geometry import ConvGeometry
from torch_lattice.nn.functional.config import ConvConfig, Dataflow, resolve_config
from torch_lattice.nn.functional.conv import (
    autocast_operands,
    check_call,
    pointwise,
    target_support,
)
from torch_lattice.nn.functional.relation import (
    apply_kernel_map,
    backward_pairs,
    kernel_map,
    reversed_transpose_pairs,
    transpose_pairs,
)
from torch_lattice.nn.functional.supports import cached_source_support, generative_support
from torch_lattice.ops._runtime import refuse_function_transforms
from torch_lattice.ops.conv import pair_conv
from torch_lattice.ops.kmap import sparse_table
from torch_lattice.tensor import SparseTensor, Support, divide_stride

__all__ = [
    "conv_transpose3d",
    "conv_transpose3d_over",
    "generative_conv_transpose3d",
    "generative_conv_transpose3d_over",
    "inverse_support",
    "resolve_target",
]


def inverse_support(src: SparseTensor, geometry: ConvGeometry) -> Support:
    """Input support of the Conv3d with ``geometry`` that produced ``src``.

    Raises:
        ValueError: no Conv3d with this geometry is in ``src``'s history, or several
            from different inputs are (ambiguous; see ``cached_source_support``).
    """
    found = cached_source_support(src, geometry)
    if found is None:
        raise ValueError(
            "ConvTranspose3d(src) without a target needs src to be the output of a Conv3d "
            f"with the same geometry (kernel_size={geometry.kernel_size}, "
            f"stride={geometry.stride}, padding={geometry.padding}, "
            f"dilation={geometry.dilation}); none is in src's history. Pass the target "
            "coordinates explicitly: up(src, target)"
        )
    return found


def transpose_onto(
    src: SparseTensor,
    weight: torch.Tensor,
    target: Support,
    geometry: ConvGeometry,
    config: ConvConfig,
) -> torch.Tensor:
    """``(N_target, C_out)`` transposed-relation features (no bias)."""
    kmap = kernel_map(target, src.support, geometry)
    return apply_kernel_map(src.feats, weight, kmap, config, transposed=True)


def generated_transpose(
    src: SparseTensor,
    weight: torch.Tensor,
    target: Support,
    geometry: ConvGeometry,
    config: ConvConfig,
) -> torch.Tensor | None:
    """``(N_target, C_out)`` features of a transpose onto the support it generated, over
    pair lists built without the ``(N_target, K)`` table (docs/limits.md), or None where
    the kernel-map route applies.

    On the CPU the pair dataflows always take this route (the same pair lists, so the
    same numbers as the kernel map's); implicit GEMM takes it, as gather-scatter, when
    the dense tables would hold more than ``DENSE_SLOTS_PER_PAIR`` slots per pair
    (``sparse_table``).  CUDA keeps the kernel-map route.
    """
    if src.feats.device.type != "cpu":
        return None
    n_in, n_out = src.support.num_rows, target.num_rows
    gather = config.dataflow is not Dataflow.FetchOnDemand
    if config.dataflow is Dataflow.ImplicitGEMM and not sparse_table(n_in, n_out):
        return None
    pairs = transpose_pairs(target, src.support, geometry)
    back = backward_pairs(
        src.feats, lambda: reversed_transpose_pairs(target, src.support, geometry)
    )
    refuse_function_transforms("convolution", src.feats, weight)
    return pair_conv(src.feats, weight, *pairs, *back, n_out, gather, bool(config.allow_tf32))


def _finish(y: torch.Tensor, bias: torch.Tensor | None, target: Support) -> SparseTensor:
    return SparseTensor.from_support(y if bias is None else y + bias, target)


def resolve_target(
    src: SparseTensor,
    coordinates: SparseTensor | Support | torch.Tensor | None,
    stride: tuple[int, int, int],
) -> Support | None:
    """Validates a transpose target once, so repeated passes share its maps."""
    if coordinates is None:
        return None
    return target_support(src, coordinates, divide_stride(src.stride, stride))


def conv_transpose3d(
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
    """Transposed sparse convolution, inverse or target-conditioned.

    ``y[t] = bias + sum over (n, i) with src[i]*stride + r_n*dilation - padding == t
    of weight[n]^T x[i]``.

    Args:
        input: coarse SparseTensor ``src``.
        weight: ``(K, C_in, C_out)``, kernel rows z fastest.
        coordinates: None for the inverse support (the input support of the
            Conv3d with the same geometry that produced ``src``), or target
            rows (SparseTensor or ``(M, 4)`` ints) with stride
            ``src.stride / stride``, evaluated in their order.
        config: dataflow configuration; a target transpose runs gather-scatter
            and rejects an explicit request for another dataflow.
    """
    geometry = ConvGeometry.create(kernel_size, stride, padding, dilation)
    return conv_transpose3d_over(
        input, weight, bias, geometry, coordinates=coordinates, config=config
    )


def conv_transpose3d_over(
    input: SparseTensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    geometry: ConvGeometry,
    *,
    coordinates: SparseTensor | Support | torch.Tensor | None = None,
    config: ConvConfig | None = None,
) -> SparseTensor:
    """:func:`conv_transpose3d` over a geometry its caller checked (a module does at
    construction)."""
    input, weight, bias = autocast_operands(input, weight, bias)
    check_call(input, weight, bias, config, geometry)
    cfg = resolve_config(
        config, target_transpose=coordinates is not None, device=input.feats.device
    )
    if coordinates is not None:
        target = resolve_target(input, coordinates, geometry.stride)
        if target is not None and target.manager.is_expansion(target, input.support, geometry):
            # A target generated from this input by this geometry (as the artifact
            # replay's no-target transpose passes): every (row, kernel row) is a pair.
            y = generated_transpose(input, weight, target, geometry, cfg)
            if y is not None:
                return _finish(y, bias, target)
    elif geometry.is_identity:
        return pointwise(input, weight, bias, config)  # a 1x1x1 stride-1 Conv3d kept its support
    else:
        target = inverse_support(input, geometry)
    return _finish(transpose_onto(input, weight, target, geometry, cfg), bias, target)


def generative_conv_transpose3d(
    input: SparseTensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    kernel_size: int | Sequence[int] = 2,
    stride: int | Sequence[int] = 2,
    *,
    coordinates: SparseTensor | Support | torch.Tensor | None = None,
    config: ConvConfig | None = None,
) -> SparseTensor:
    """Generative transposed convolution (padding 0, dilation 1).

    Without ``coordinates`` the output support is ``unique{src[i]*stride + r}``
    over every row and kernel position, sorted by (b, x, y, z), never clipped;
    with them it is a target transpose.
    """
    geometry = ConvGeometry.create(kernel_size, stride)
    return generative_conv_transpose3d_over(
        input, weight, bias, geometry, coordinates=coordinates, config=config
    )


def generative_conv_transpose3d_over(
    input: SparseTensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    geometry: ConvGeometry,
    *,
    coordinates: SparseTensor | Support | torch.Tensor | None = None,
    config: ConvConfig | None = None,
) -> SparseTensor:
    """:func:`generative_conv_transpose3d` over a geometry its caller checked."""
    input, weight, bias = autocast_operands(input, weight, bias)
    check_call(input, weight, bias, config, geometry)
    cfg = resolve_config(
        config, target_transpose=coordinates is not None, device=input.feats.device
    )
    target = resolve_target(input, coordinates, geometry.stride)
    if target is None:
        target = generative_support(input.support, geometry)
        y = generated_transpose(input, weight, target, geometry, cfg)
        if y is not None:
            return _finish(y, bias, target)
    return _finish(transpose_onto(input, weight, target, geometry, cfg), bias, target)
