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
from torch_lattice.nn.modules.eager import eager_forward
from torch_lattice.tensor import SparseTensor

__all__ = [
    "NormalizedConvBase",
    "NormalizedConvTranspose3d",
    "NormalizedGenerativeConvTranspose3d",
    "NormalizedSubmConv3d",
]


class NormalizedConvBase(ConvBase):
    """Base of the weight-normalized modules: the base module's arguments plus ``eps``
    (default 1e-8, > 0). The artifact exporter recognises the family by it."""

    def __init__(self, *args: Any, eps: float = 1e-8, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.eps = check_eps(eps)

    def normalized_forward(self, input: SparseTensor, coordinates: Target) -> SparseTensor:
        def conv(x: SparseTensor, w: torch.Tensor) -> SparseTensor:
            return self.conv(x, w, None, coordinates)

        return normalized(conv, input, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", eps={self.eps}"


class NormalizedSubmConv3d(NormalizedConvBase, SubmConv3d):
    """SubmConv3d with weight normalization; same arguments plus ``eps``."""

    @eager_forward
    def forward(self, input: SparseTensor) -> SparseTensor:
        """Weight-normalized submanifold convolution of ``input``.

        Support rule: as :class:`SubmConv3d`, the output rows are exactly
        ``input``'s rows in the same order.  Values (kernels with more than one
        row): ``y = conv(x, W) / sqrt(conv(1, W*W) + eps) + bias``, where
        ``conv(1, W*W)`` runs the same relation over all-ones features;
        pointwise kernels compute ``conv(x, W) + bias``.

        Args:
            input: ``(N, C_in)`` features.

        Returns:
            SparseTensor: ``(N, C_out)`` features on ``input``'s support.
        """
        return self.normalized_forward(input, None)


class _NormalizedTransposed(NormalizedConvBase):
    """Forward of the normalized transposes, inverse or target."""

    stride: tuple[int, int, int]

    def transposed_forward(
        self, input: SparseTensor, coordinates: Target, target: Target
    ) -> SparseTensor:
        # Validate a target once, so that both passes share its kernel map.
        support = Ft.resolve_target(input, pick_target(coordinates, target), self.stride)
        return self.normalized_forward(input, support)


class NormalizedConvTranspose3d(_NormalizedTransposed, ConvTranspose3d):
    """ConvTranspose3d with weight normalization; same arguments plus ``eps``."""

    @eager_forward
    def forward(
        self, input: SparseTensor, coordinates: Target = None, *, target: Target = None
    ) -> SparseTensor:
        """Weight-normalized transposed convolution of ``input``.

        Support rule: as :class:`ConvTranspose3d`: ``up(src)`` returns exactly
        the input support of the ``Conv3d`` with this geometry that produced
        ``src``; ``up(src, target)`` returns exactly the target's rows in
        order.  Values (kernels with more than one row):
        ``y = conv(x, W) / sqrt(conv(1, W*W) + eps) + bias`` over the transpose
        relation, both passes on one support; pointwise kernels skip the
        normalization.

        Args:
            input: ``(N, C_in)`` features on the coarse support.
            coordinates: optional target support (SparseTensor, support or rows).
            target: the same, as a keyword (give one of the two).

        Returns:
            SparseTensor: ``(M, C_out)`` features on the recovered or target support.
        """
        return self.transposed_forward(input, coordinates, target)


class NormalizedGenerativeConvTranspose3d(_NormalizedTransposed, GenerativeConvTranspose3d):
    """GenerativeConvTranspose3d with weight normalization; plus ``eps``."""

    @eager_forward
    def forward(
        self, input: SparseTensor, coordinates: Target = None, *, target: Target = None
    ) -> SparseTensor:
        """Weight-normalized generative transposed convolution of ``input``.

        Support rule: as :class:`GenerativeConvTranspose3d`: without a target,
        ``unique{src[i]*stride + r}`` sorted by ``(b, x, y, z)``, never clipped;
        with a target, exactly the target's rows in order.  Values (kernels
        with more than one row): ``y = conv(x, W) / sqrt(conv(1, W*W) + eps) +
        bias``, both passes on one support; pointwise kernels skip the
        normalization.

        Args:
            input: ``(N, C_in)`` features on the coarse support.
            coordinates: optional target support (SparseTensor, support or rows).
            target: the same, as a keyword (give one of the two).

        Returns:
            SparseTensor: ``(M, C_out)`` features on the generated or target support.
        """
        return self.transposed_forward(input, coordinates, target)
