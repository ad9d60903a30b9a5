"""Transposed convolution modules: ConvTranspose3d, GenerativeConvTranspose3d.

Weights are canonical ``(K, C_in, C_out)`` with z-fastest rows, as for every
convolution module; the relation is read from the coarse input onto the fine
output (see :mod:`torch_lattice.nn.functional.conv_transpose`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_lattice.geometry import triple
from torch_lattice.nn.functional import conv_transpose as F
from torch_lattice.nn.functional.config import ConvConfig
from torch_lattice.nn.modules.conv import StridedConv, Target
from torch_lattice.tensor import SparseTensor

__all__ = ["ConvTranspose3d", "GenerativeConvTranspose3d"]


class ConvTranspose3d(StridedConv):
    """Transposed sparse convolution.

    ``up(src)`` returns onto the input support of the Conv3d with the same
    geometry in ``src``'s history (its coordinates, order, stride and
    spatial_range); ``up(src, target)`` evaluates exactly on ``target``'s rows,
    in order, with ``target.stride == src.stride / stride``.  Wraps
    :func:`torch_lattice.nn.functional.conv_transpose3d`.
    """

    def conv(
        self,
        input: SparseTensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        coordinates: Target = None,
    ) -> SparseTensor:
        return F.conv_transpose3d(
            input,
            weight,
            bias,
            self.kernel_size,
            self.stride,
            self.padding,
            self.dilation,
            coordinates=coordinates,
            config=self.config,
        )


class GenerativeConvTranspose3d(StridedConv):
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
        for name, value, fixed in (("padding", padding, 0), ("dilation", dilation, 1)):
            if triple(name, value, 0) != (fixed,) * 3:
                raise ValueError(
                    f"{name} must be {fixed} for GenerativeConvTranspose3d, got {value!r}; use "
                    f"ConvTranspose3d(...)(src, target) for a support with {name}"
                )
        super().__init__(in_channels, out_channels, kernel_size, stride, 0, 1, bias, config)

    def conv(
        self,
        input: SparseTensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        coordinates: Target = None,
    ) -> SparseTensor:
        return F.generative_conv_transpose3d(
            input,
            weight,
            bias,
            self.kernel_size,
            self.stride,
            coordinates=coordinates,
            config=self.config,
        )
