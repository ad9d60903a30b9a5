"""Activations on sparse features: the torch modules, applied row-wise.

Each class subclasses its ``torch.nn`` namesake (same arguments) and keeps
the input's support.
"""

from __future__ import annotations

from torch import nn

from torch_lattice.tensor import SparseTensor

__all__ = ["GELU", "LeakyReLU", "ReLU", "SiLU"]


def _apply(module: nn.Module, base: type[nn.Module], input: SparseTensor) -> SparseTensor:
    if not isinstance(input, SparseTensor):
        raise TypeError(
            f"{type(module).__name__} input must be a SparseTensor, got {type(input).__name__}"
        )
    return input.replace(base.forward(module, input.feats))


class ReLU(nn.ReLU):
    """``max(x, 0)`` on features."""

    def forward(self, input: SparseTensor) -> SparseTensor:  # type: ignore[override]
        """``max(x, 0)`` applied to each feature of ``input``.

        Support rule: the output keeps ``input``'s support (rows, order,
        stride, range).

        Returns:
            SparseTensor: ``(N, C)`` features on ``input``'s support.
        """
        return _apply(self, nn.ReLU, input)


class LeakyReLU(nn.LeakyReLU):
    """``x if x > 0 else negative_slope * x`` on features."""

    def forward(self, input: SparseTensor) -> SparseTensor:  # type: ignore[override]
        """``x if x > 0 else negative_slope * x`` applied to each feature of ``input``.

        Support rule: the output keeps ``input``'s support (rows, order,
        stride, range).

        Returns:
            SparseTensor: ``(N, C)`` features on ``input``'s support.
        """
        return _apply(self, nn.LeakyReLU, input)


class SiLU(nn.SiLU):
    """``x * sigmoid(x)`` on features."""

    def forward(self, input: SparseTensor) -> SparseTensor:  # type: ignore[override]
        """``x * sigmoid(x)`` applied to each feature of ``input``.

        Support rule: the output keeps ``input``'s support (rows, order,
        stride, range).

        Returns:
            SparseTensor: ``(N, C)`` features on ``input``'s support.
        """
        return _apply(self, nn.SiLU, input)


class GELU(nn.GELU):
    """Gaussian error linear unit on features (``approximate`` as in torch)."""

    def forward(self, input: SparseTensor) -> SparseTensor:  # type: ignore[override]
        """GELU (``approximate`` as set) applied to each feature of ``input``.

        Support rule: the output keeps ``input``'s support (rows, order,
        stride, range).

        Returns:
            SparseTensor: ``(N, C)`` features on ``input``'s support.
        """
        return _apply(self, nn.GELU, input)
