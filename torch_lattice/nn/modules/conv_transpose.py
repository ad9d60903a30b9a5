"""Transposed convolution modules: ConvTranspose3d, GenerativeConvTranspose3d.

Weights are canonical ``(K, C_in, C_out)`` with z-fastest rows, as for every
convolution module; the relation is read from the coarse input onto the fine
output (see :mod:`torch_lattice.nn.functional.conv_transpose`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_lattice.geometry import ConvGeometry, triple
from torch_lattice.nn.functional import conv_transpose as F
from torch_lattice.nn.functional.config import ConvConfig
from torch_lattice.nn.modules.conv import ConvBase, pick_target
from torch_lattice.tensor import SparseTensor

__all__ = ["ConvTranspose3d", "GenerativeConvTranspose3d"]


class ConvTranspose3d(ConvBase):
    """Transposed sparse convolution.

    ``up(src)`` returns onto the input support of the Conv3d with the same
    geometry in ``src``'s history (its coordinates, order, stride and
    spatial_range); ``up(src, target)`` evaluates exactly on ``target``'s rows,
    in order, with ``target.stride == src.stride / stride``.  Wraps
    :func:`torch_lattice.nn.functional.conv_transpose3d`.
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
    ) -> None:
        geometry = ConvGeometry.create(kernel_size, stride, padding, dilation)
        super().__init__(in_channels, out_channels, geometry.kernel_size, bias, config)
        self.stride = geometry.stride
        self.padding = geometry.padding
        self.dilation = geometry.dilation

    def forward(
        self,
        input: SparseTensor,
        coordinates: SparseTensor | torch.Tensor | None = None,
        *,
        target: SparseTensor | torch.Tensor | None = None,
    ) -> SparseTensor:
        return F.conv_transpose3d(
            input,
            self.weight,
            self.bias,
            self.kernel_size,
            self.stride,
            self.padding,
            self.dilation,
            coordinates=pick_target(coordinates, target),
            config=self.config,
        )

    def extra_repr(self) -> str:
        return self.geometry_repr()


class GenerativeConvTranspose3d(ConvBase):
    """Generative transposed convolution: the output support is every
    ``src[i]*stride + r`` (deduplicated, sorted by (b, x, y, z), never
    clipped).  ``gen(src, target)`` is a target transpose.  Padding and
    dilation are fixed at 0 and 1.  Wraps
    :func:`torch_lattice.nn.functional.generative_conv_transpose3d`.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int] = 2,
        stride: int | Sequence[int] = 2,
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        bias: bool = False,
        config: ConvConfig | None = None,
    ) -> None:
        if triple("padding", padding, 0) != (0, 0, 0):
            raise ValueError(
                f"padding must be 0 for GenerativeConvTranspose3d, got {padding!r}; use "
                "ConvTranspose3d(...)(src, target) for padded support"
            )
        if triple("dilation", dilation, 1) != (1, 1, 1):
            raise ValueError(
                f"dilation must be 1 for GenerativeConvTranspose3d, got {dilation!r}; use "
                "ConvTranspose3d(...)(src, target) for dilated support"
            )
        geometry = ConvGeometry.create(kernel_size, stride)
        super().__init__(in_channels, out_channels, geometry.kernel_size, bias, config)
        self.stride = geometry.stride
        self.padding = geometry.padding
        self.dilation = geometry.dilation

    def forward(
        self,
        input: SparseTensor,
        coordinates: SparseTensor | torch.Tensor | None = None,
        *,
        target: SparseTensor | torch.Tensor | None = None,
    ) -> SparseTensor:
        return F.generative_conv_transpose3d(
            input,
            self.weight,
            self.bias,
            self.kernel_size,
            self.stride,
            coordinates=pick_target(coordinates, target),
            config=self.config,
        )

    def extra_repr(self) -> str:
        return self.geometry_repr()
