"""Weight-normalized convolution modules.

Each keeps the support behaviour of its base and computes, for kernels with
more than one row, ``y = conv(x, W) / sqrt(conv(1, W*W) + eps) + b``
(:func:`torch_lattice.nn.functional.normalized`); pointwise kernels skip the
normalization.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_lattice.nn.functional import conv as Fc
from torch_lattice.nn.functional import conv_transpose as Ft
from torch_lattice.nn.functional.config import ConvConfig
from torch_lattice.nn.functional.normalized import check_eps, normalized
from torch_lattice.nn.modules.conv import SubmConv3d, pick_target
from torch_lattice.nn.modules.conv_transpose import ConvTranspose3d, GenerativeConvTranspose3d
from torch_lattice.tensor import SparseTensor

__all__ = [
    "NormalizedConvTranspose3d",
    "NormalizedGenerativeConvTranspose3d",
    "NormalizedSubmConv3d",
]

Target = SparseTensor | torch.Tensor | None


class NormalizedSubmConv3d(SubmConv3d):
    """SubmConv3d with weight normalization; same arguments plus ``eps``."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int] = 3,
        dilation: int | Sequence[int] = 1,
        bias: bool = False,
        eps: float = 1e-8,
        config: ConvConfig | None = None,
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, dilation, bias, config)
        self.eps = check_eps(eps)

    def forward(self, input: SparseTensor) -> SparseTensor:
        def conv(x: SparseTensor, w: torch.Tensor) -> SparseTensor:
            return Fc.subm_conv3d(x, w, None, self.kernel_size, self.dilation, config=self.config)

        return normalized(conv, input, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", eps={self.eps}"


class NormalizedConvTranspose3d(ConvTranspose3d):
    """ConvTranspose3d with weight normalization; same arguments plus ``eps``."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int] = 3,
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        bias: bool = False,
        eps: float = 1e-8,
        config: ConvConfig | None = None,
    ) -> None:
        super().__init__(
            in_channels, out_channels, kernel_size, stride, padding, dilation, bias, config
        )
        self.eps = check_eps(eps)

    def forward(
        self, input: SparseTensor, coordinates: Target = None, *, target: Target = None
    ) -> SparseTensor:
        coords = Ft.resolve_target(input, pick_target(coordinates, target), self.stride)

        def conv(x: SparseTensor, w: torch.Tensor) -> SparseTensor:
            return Ft.conv_transpose3d(
                x,
                w,
                None,
                self.kernel_size,
                self.stride,
                self.padding,
                self.dilation,
                coordinates=coords,
                config=self.config,
            )

        return normalized(conv, input, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", eps={self.eps}"


class NormalizedGenerativeConvTranspose3d(GenerativeConvTranspose3d):
    """GenerativeConvTranspose3d with weight normalization; plus ``eps``."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int] = 2,
        stride: int | Sequence[int] = 2,
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        bias: bool = False,
        eps: float = 1e-8,
        config: ConvConfig | None = None,
    ) -> None:
        super().__init__(
            in_channels, out_channels, kernel_size, stride, padding, dilation, bias, config
        )
        self.eps = check_eps(eps)

    def forward(
        self, input: SparseTensor, coordinates: Target = None, *, target: Target = None
    ) -> SparseTensor:
        coords = Ft.resolve_target(input, pick_target(coordinates, target), self.stride)

        def conv(x: SparseTensor, w: torch.Tensor) -> SparseTensor:
            return Ft.generative_conv_transpose3d(
                x, w, None, self.kernel_size, self.stride, coordinates=coords, config=self.config
            )

        return normalized(conv, input, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", eps={self.eps}"
