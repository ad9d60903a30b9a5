"""Activations on sparse features: the torch modules, applied row-wise.

Each class subclasses its ``torch.nn`` namesake (same arguments) and keeps
the input's support.
"""

from __future__ import annotations

from torch import nn

from torch_lattice.nn.modules.eager import eager_forward
from torch_lattice.tensor import SparseTensor

__all__ = ["GELU", "LeakyReLU", "ReLU", "SiLU"]


class _RowWise(nn.Module):
    """Mixin before a ``torch.nn`` activation: runs it on a SparseTensor's features."""

    @eager_forward
    def forward(self, input: SparseTensor) -> SparseTensor:  # type: ignore[override]
        """The activation (see the class) applied to each feature of ``input``.

        Support rule: the output keeps ``input``'s support (rows, order,
        stride, range).

        Returns:
            SparseTensor: ``(N, C)`` features on ``input``'s support.
        """
        if not isinstance(input, SparseTensor):
            raise TypeError(
                f"{type(self).__name__} input must be a SparseTensor, got {type(input).__name__}"
            )
        # The next class in the MRO is the torch activation.
        return input.replace(super().forward(input.feats))


class ReLU(_RowWise, nn.ReLU):
    """``max(x, 0)`` on features."""


class LeakyReLU(_RowWise, nn.LeakyReLU):
    """``x if x > 0 else negative_slope * x`` on features."""


class SiLU(_RowWise, nn.SiLU):
    """``x * sigmoid(x)`` on features."""


class GELU(_RowWise, nn.GELU):
    """Gaussian error linear unit on features (``approximate`` as in torch)."""
