"""Transposed convolution modules: ConvTranspose3d, GenerativeConvTranspose3d.

Weights are canonical ``(K, C_in, C_out)`` with z-fastest rows, as for every
convolution module; the relation is read from the coarse input onto the fine
output (see :mod:`torch_lattice.nn.functional.conv_transpose`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_lattice.geometry import Triple, triple
from torch_lattice.nn.functional import conv_transpose as F
from torch_lattice.nn.functional.config import ConvConfig
from torch_lattice.nn.modules.conv import StridedConv, Target, pick_target
from torch_lattice.nn.modules.eager import eager_forward
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

    transposed_relation = True
    _over = staticmethod(F.conv_transpose3d_over)

    @eager_forward
    def forward(
        self, input: SparseTensor, coordinates: Target = None, *, target: Target = None
    ) -> SparseTensor:
        """Transposed convolution of ``input``, onto a finer support.

        Support rule: ``up(src)`` returns exactly the input support of the
        ``Conv3d`` with this geometry that produced ``src`` (its rows, order,
        stride and ``spatial_range``; no such convolution in ``src``'s history
        raises ``ValueError``).  ``up(src, target)`` returns exactly the
        target's rows in order, whose stride must be ``src.stride / stride``.
        Values:
        ``y[t] = bias + sum over (n, i) with src[i]*stride + r_n*dilation - padding == t``
        of ``weight[n]^T x[i]``.

        Args:
            input: ``(N, C_in)`` features on the coarse support.
            coordinates: optional target support: a SparseTensor, its
                ``support``, or ``(M, 4)`` integer rows.
            target: the same, as a keyword (give one of the two).

        Returns:
            SparseTensor: ``(M, C_out)`` features on the recovered or target support.
        """
        return self.conv(input, self.weight, self.bias, pick_target(coordinates, target))


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
        device: torch.device | str | int | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        # each checked against its own rule first (padding >= 0, dilation >= 1)
        for name, value, fixed in (("padding", padding, 0), ("dilation", dilation, 1)):
            if triple(name, value, fixed) != (fixed,) * 3:
                raise ValueError(
                    f"{name} must be {fixed} for GenerativeConvTranspose3d, got {value!r}; use "
                    f"ConvTranspose3d(...)(src, target) for a support with {name}"
                )
        super().__init__(
            in_channels, out_channels, kernel_size, stride, 0, 1, bias, config, device, dtype
        )

    transposed_relation = True
    _over = staticmethod(F.generative_conv_transpose3d_over)

    def functional_geometry(self) -> tuple[Triple, ...]:
        return (self.kernel_size, self.stride)  # padding 0 and dilation 1 are fixed

    @eager_forward
    def forward(
        self, input: SparseTensor, coordinates: Target = None, *, target: Target = None
    ) -> SparseTensor:
        """Generative transposed convolution of ``input``.

        Support rule: without a target, the output rows are
        ``unique{src[i]*stride + r}`` over every input row and every kernel
        position, sorted by ``(b, x, y, z)`` and never clipped, with stride
        ``input.stride / stride`` (must divide exactly) and range
        ``(B, (R - 1)*stride + K)`` when ``input`` has one.  With a target, the
        output rows are exactly the target's rows in order.  Values follow the
        transpose relation ``y[src[i]*stride + r_n] += weight[n]^T x[i]``, plus
        bias.

        Args:
            input: ``(N, C_in)`` features on the coarse support.
            coordinates: optional target support: a SparseTensor, its
                ``support``, or ``(M, 4)`` integer rows.
            target: the same, as a keyword (give one of the two).

        Returns:
            SparseTensor: ``(M, C_out)`` features on the generated or target support.
        """
        return self.conv(input, self.weight, self.bias, pick_target(coordinates, target))
