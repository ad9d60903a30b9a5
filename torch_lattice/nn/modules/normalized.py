"""Weight-normalized convolution modules.

Each keeps the support behaviour of its base and computes, for kernels with
more than one row, ``y = conv(x, W) / sqrt(conv(1, W*W) + eps) + b``
(:func:`torch_lattice.nn.functional.normalized`); pointwise kernels skip the
normalization.  Both passes run the base module's :meth:`conv` on one target
support, so they share one cached kernel map.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_lattice.nn.functional import conv_transpose as Ft
from torch_lattice.nn.functional.normalized import check_eps, normalized
from torch_lattice.nn.modules.conv import ConvBase, SubmConv3d, Target, pick_target
from torch_lattice.nn.modules.conv_transpose import ConvTranspose3d, GenerativeConvTranspose3d
from torch_lattice.tensor import SparseTensor

__all__ = [
    "NormalizedConvTranspose3d",
    "NormalizedGenerativeConvTranspose3d",
    "NormalizedSubmConv3d",
]


class _Normalized(ConvBase):
    """Mixin: the base module's arguments plus ``eps`` (default 1e-8, > 0)."""

    def __init__(self, *args: Any, eps: float = 1e-8, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.eps = check_eps(eps)

    def normalized_forward(self, input: SparseTensor, coordinates: Target) -> SparseTensor:
        def conv(x: SparseTensor, w: torch.Tensor) -> SparseTensor:
            return self.conv(x, w, None, coordinates)

        return normalized(conv, input, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", eps={self.eps}"


class NormalizedSubmConv3d(_Normalized, SubmConv3d):
    """SubmConv3d with weight normalization; same arguments plus ``eps``."""

    def forward(self, input: SparseTensor) -> SparseTensor:
        return self.normalized_forward(input, None)


class _NormalizedTransposed(_Normalized):
    """Forward of the normalized transposes, inverse or target."""

    stride: tuple[int, int, int]

    def forward(
        self, input: SparseTensor, coordinates: Target = None, *, target: Target = None
    ) -> SparseTensor:
        # Validate a target once, so that both passes share its kernel map.
        support = Ft.resolve_target(input, pick_target(coordinates, target), self.stride)
        return self.normalized_forward(input, support)


class NormalizedConvTranspose3d(_NormalizedTransposed, ConvTranspose3d):
    """ConvTranspose3d with weight normalization; same arguments plus ``eps``."""


class NormalizedGenerativeConvTranspose3d(_NormalizedTransposed, GenerativeConvTranspose3d):
    """GenerativeConvTranspose3d with weight normalization; plus ``eps``."""
