"""Convolution modules with canonical ``(K, C_in, C_out)`` weights.

Each module owns ``weight``, optional ``bias`` and a persistent int32
``kernel_positions`` buffer ``(K, 3)`` recording the z-fastest row order, and
calls the functional in :mod:`torch_lattice.nn.functional.conv`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from torch_lattice.geometry import (
    ConvGeometry,
    Triple,
    check_submanifold_kernel_size,
    kernel_positions,
    kernel_volume,
    positive_int,
    triple,
)
from torch_lattice.memory_budget import check_allocation
from torch_lattice.nn.functional import conv as F
from torch_lattice.nn.functional.config import ConvConfig
from torch_lattice.nn.modules.eager import eager_forward
from torch_lattice.tensor import SparseTensor, Support

__all__ = ["Conv3d", "ConvBase", "StridedConv", "SubmConv3d", "Target", "pick_target"]

# A target support: a SparseTensor, its Support, or (M, 4) integer rows.
Target = SparseTensor | Support | torch.Tensor | None


class ConvBase(nn.Module):
    """Weight, bias and kernel_positions shared by every convolution module.

    Subclasses name their functional over a checked geometry (``_over``), how that
    geometry is made from their arguments (``_make_geometry``, which checks them) and
    those arguments (:meth:`functional_geometry`); :meth:`conv` calls it for a given
    weight and bias, which the weight-normalized modules do twice.
    """

    kernel_positions: torch.Tensor
    # Whether a call without a target runs its relation transposed (the autotuner's key,
    # which resolved_dataflow reads).
    transposed_relation = False
    # The functional over a checked geometry, and how the geometry is made and checked.
    _over: Callable[..., SparseTensor]
    _make_geometry: Callable[..., ConvGeometry]

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Triple,
        bias: bool,
        config: ConvConfig | None = None,
        device: torch.device | str | int | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        F.check_config(config)
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating torch.dtype or None, got {dtype!r}")
        self.config = config
        # NumPy integers and one-element integer tensors become ints, as in nn.Conv3d.
        self.in_channels = in_channels = positive_int("in_channels", in_channels)
        self.out_channels = out_channels = positive_int("out_channels", out_channels)
        self.kernel_size = kernel_size
        k = kernel_volume(kernel_size)
        # The weight (float32) and the kernel_positions rows (3 x int32), before either
        # is allocated: kernel_size=128 with 64 channels would ask for 32 GiB.
        check_allocation(
            f"{type(self).__name__} weight ({k} kernel rows x {in_channels} x {out_channels})",
            k * (in_channels * out_channels * 4 + 12),
        )
        # device= and dtype= as torch.nn.Conv3d takes them (kernel_positions stays int32)
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(k, in_channels, out_channels, **factory))
        self.bias = nn.Parameter(torch.empty(out_channels, **factory)) if bias else None
        # written by reset_parameters, as the weight is (and again after to_empty())
        self.register_buffer("kernel_positions",
                             torch.empty(k, 3, dtype=torch.int32, device=device), persistent=True)
        self.reset_parameters()

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        """Refuses a ``kernel_positions`` that is not this kernel's z-fastest rows: a
        checkpoint from another kernel size, or with its rows in another order, would
        otherwise load (its shape can match) and put each weight row at another
        position. Reported like a shape mismatch, through ``load_state_dict``'s errors,
        and this module keeps its own weight and bias."""
        error_msgs: list[str] = args[-1]
        loaded = state_dict.get(prefix + "kernel_positions")
        if isinstance(loaded, torch.Tensor):
            if loaded.is_floating_point() or loaded.is_complex() or loaded.dtype == torch.bool:
                # compared as integers, 0.9 would pass as 0
                error_msgs.append(
                    f"kernel_positions: the checkpoint's rows must be integers, got "
                    f"{loaded.dtype}"
                )
                return
            expected = kernel_positions(self.kernel_size)
            if tuple(loaded.shape) != tuple(expected.shape) or not torch.equal(
                loaded.detach().to("cpu", torch.int64), expected.to(torch.int64)
            ):
                error_msgs.append(
                    f"kernel_positions: the checkpoint's rows are not the z-fastest positions "
                    f"of kernel_size {self.kernel_size} (shape {tuple(loaded.shape)}, "
                    f"expected {tuple(expected.shape)}); it comes from another kernel size or "
                    "lists its weight rows in another order (convert legacy checkpoints with "
                    "convert-checkpoint)"
                )
                return
        super()._load_from_state_dict(state_dict, prefix, *args)

    def reset_parameters(self) -> None:
        """PyTorch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias, with
        ``fan_in = K * C_in`` as ``torch.nn.Conv3d``, and ``K * C_out`` for the transposed
        modules as ``torch.nn.ConvTranspose3d`` (whose ``(C_in, C_out, ...)`` weight
        gives torch's fan-in from ``C_out``) and TorchSparse's transposed convolutions.

        ``kernel_positions`` is written again too, as ``BatchNorm.reset_parameters``
        resets its running statistics: a module made on the meta device and
        materialized with ``to_empty()`` holds uninitialized memory there until then,
        which its ``state_dict`` would save and no module would load back."""
        with torch.no_grad():
            self.kernel_positions.copy_(kernel_positions(self.kernel_size))
        channels = self.weight.shape[2] if self.transposed_relation else self.weight.shape[1]
        fan_in = self.weight.shape[0] * channels
        bound = 1.0 / math.sqrt(fan_in)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def conv(
        self,
        input: SparseTensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        coordinates: Target = None,
    ) -> SparseTensor:
        """This module's convolution with the given weight and bias."""
        # A submanifold functional takes no target: pass one only when given.
        target = {} if coordinates is None else {"coordinates": coordinates}
        return type(self)._over(
            input, weight, bias, self.relation_geometry(), config=self.config, **target
        )

    def relation_geometry(self) -> ConvGeometry:
        """This module's checked :class:`ConvGeometry`, made again only when one of its
        geometry attributes was reassigned (so a forward does not re-check them)."""
        key = self.functional_geometry()
        made = self.__dict__.get("_relation_geometry")
        if made is None or made[0] != key:
            made = (key, type(self)._make_geometry(*key))
            self.__dict__["_relation_geometry"] = made
        return made[1]

    def functional_geometry(self) -> tuple[Triple, ...]:
        """The geometry arguments of the public functional after ``bias``, in order."""
        raise NotImplementedError(f"{type(self).__name__} does not define functional_geometry()")

    def extra_repr(self) -> str:
        return self.geometry_repr()

    def geometry_repr(self) -> str:
        """``extra_repr`` text: channels, kernel and the non-default geometry."""
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"
        for name, default in (("stride", None), ("padding", (0, 0, 0)), ("dilation", (1, 1, 1))):
            value = getattr(self, name, default)
            if value != default:
                s += f", {name}={value}"
        return s + f", bias={self.bias is not None}"


def pick_target(coordinates: Target, target: Target) -> Target:
    """Accepts the target support as ``coordinates`` or ``target`` (not both)."""
    if coordinates is not None and target is not None:
        raise ValueError("pass the target support once: coordinates= or target=, not both")
    return coordinates if coordinates is not None else target


class SubmConv3d(ConvBase):
    """Submanifold convolution: output support = input support, same order.

    Wraps :func:`torch_lattice.nn.functional.subm_conv3d`.

    Args:
        in_channels, out_channels: feature widths.
        kernel_size: odd int or 3-tuple of odd ints.
        dilation: int or 3-tuple.
        bias: add a learnable ``(C_out,)`` bias.
        config: per-module dataflow configuration (``ConvConfig``).
        device, dtype: of ``weight`` and ``bias``, as ``torch.nn.Conv3d`` takes them
            (``kernel_positions`` is int32 on ``device``).
    """

    _over = staticmethod(F.subm_conv3d_over)
    _make_geometry = staticmethod(F.submanifold_geometry)

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int] = 3,
        dilation: int | Sequence[int] = 1,
        bias: bool = False,
        config: ConvConfig | None = None,
        device: torch.device | str | int | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        ks = check_submanifold_kernel_size(kernel_size)
        super().__init__(in_channels, out_channels, ks, bias, config, device, dtype)
        self.dilation = triple("dilation", dilation, 1)
        self.relation_geometry()  # checked once, here

    def functional_geometry(self) -> tuple[Triple, ...]:
        return (self.kernel_size, self.dilation)

    @eager_forward
    def forward(self, input: SparseTensor) -> SparseTensor:
        """Submanifold convolution of ``input``.

        Support rule: the output rows are exactly ``input``'s rows, in the same
        order, with the same stride and ``spatial_range``;
        ``y[q] = bias + sum_n weight[n]^T x[q + (r_n - (K - 1) / 2) * dilation]``
        over the kernel rows whose input row is present (same batch index).

        Args:
            input: ``(N, C_in)`` features on any support.

        Returns:
            SparseTensor: ``(N, C_out)`` features on ``input``'s support.
        """
        return self.conv(input, self.weight, self.bias)


class StridedConv(ConvBase):
    """A convolution with stride, padding and dilation that may be given a
    target support: ``m(x)``, ``m(x, target)`` or ``m(x, coordinates=target)``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int] = 3,
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        bias: bool = False,
        config: ConvConfig | None = None,
        device: torch.device | str | int | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        geometry = ConvGeometry.create(kernel_size, stride, padding, dilation)
        super().__init__(
            in_channels, out_channels, geometry.kernel_size, bias, config, device, dtype
        )
        self.stride = geometry.stride
        self.padding = geometry.padding
        self.dilation = geometry.dilation
        self.relation_geometry()  # checked once, here

    _make_geometry = staticmethod(ConvGeometry.create)

    def functional_geometry(self) -> tuple[Triple, ...]:
        return (self.kernel_size, self.stride, self.padding, self.dilation)

    @eager_forward
    def forward(
        self, input: SparseTensor, coordinates: Target = None, *, target: Target = None
    ) -> SparseTensor:
        """Runs :meth:`conv` with this module's weight and bias (see subclasses)."""
        return self.conv(input, self.weight, self.bias, pick_target(coordinates, target))


class Conv3d(StridedConv):
    """Support-generating sparse convolution, or target-conditioned when
    called as ``conv(x, coordinates=target)``.

    Wraps :func:`torch_lattice.nn.functional.conv3d`.

    Args:
        in_channels, out_channels: feature widths.
        kernel_size, stride, padding, dilation: int or 3-tuple each.
        bias: add a learnable ``(C_out,)`` bias.
        config: per-module dataflow configuration (``ConvConfig``).
    """

    _over = staticmethod(F.conv3d_over)

    @eager_forward
    def forward(
        self, input: SparseTensor, coordinates: Target = None, *, target: Target = None
    ) -> SparseTensor:
        """Strided (support-generating) or target convolution of ``input``.

        Support rule: without a target, the output rows are every ``q`` in
        ``[0, R_out)`` per axis that some present input row reaches
        (``x[q*stride - padding + r*dilation]`` exists for a kernel row ``r``),
        sorted by ``(b, x, y, z)``, with stride ``input.stride * stride`` and
        range ``(B, R_out)`` when ``input`` has one, where
        ``R_out = (R + 2*padding - dilation*(K - 1) - 1) // stride + 1``.  A
        1x1x1, stride-1, padding-0 kernel keeps ``input``'s rows and order.
        With a target, the output rows are exactly the target's rows in its
        order (rows no input reaches get only the bias); the target's stride
        must be ``input.stride * stride``.  Values:
        ``y[q] = bias + sum_n weight[n]^T x[q*stride - padding + r_n*dilation]``.

        Args:
            input: ``(N, C_in)`` features.
            coordinates: optional target support: a SparseTensor, its
                ``support``, or ``(M, 4)`` integer rows.
            target: the same, as a keyword (give one of the two).

        Returns:
            SparseTensor: ``(M, C_out)`` features on the generated support, or
            on the target's rows.
        """
        return self.conv(input, self.weight, self.bias, pick_target(coordinates, target))
