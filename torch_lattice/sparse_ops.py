"""Feature algebra on equal supports: :func:`cat`, :func:`add`, :func:`to_dense`.

Two tensors have equal supports when they share one :class:`~torch_lattice.Support`
object (the usual case: both derive from the same layer input), or when their
strides match and their coordinate rows are equal and in the same order.  The
result keeps the first tensor's support, so cached kernel maps stay shared.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_lattice.tensor import SparseTensor

__all__ = ["add", "cat", "same_support", "to_dense"]


def same_support(a: SparseTensor, b: SparseTensor) -> bool:
    """True when ``a`` and ``b`` have the same rows, in the same order, on one lattice."""
    if a.support is b.support:
        return True
    if a.stride != b.stride or a.coords.shape != b.coords.shape or a.device != b.device:
        return False
    return bool(torch.equal(a.coords, b.coords))


def _check_pair(op: str, a: object, b: object, index: int) -> None:
    if not isinstance(b, SparseTensor):
        raise TypeError(f"{op}: argument {index} must be a SparseTensor, got {type(b).__name__}")
    assert isinstance(a, SparseTensor)
    if not same_support(a, b):
        raise ValueError(
            f"{op}: argument {index} has a different support ({len(b)} rows, stride {b.stride}) "
            f"than argument 0 ({len(a)} rows, stride {a.stride}); supports must be the same "
            "object or have equal coordinates in the same order"
        )


def cat(tensors: Sequence[SparseTensor]) -> SparseTensor:
    """Concatenates features of tensors on one support along channels.

    Args:
        tensors: non-empty sequence of SparseTensors with ``(N, C_i)`` features
            on equal supports.

    Returns:
        SparseTensor with ``(N, sum C_i)`` features on the first tensor's support.

    Raises:
        TypeError: an element is not a SparseTensor.
        ValueError: empty sequence or different supports.
    """
    if isinstance(tensors, SparseTensor) or not isinstance(tensors, Sequence):
        raise TypeError("cat: tensors must be a list or tuple of SparseTensors")
    if len(tensors) == 0:
        raise ValueError("cat: tensors must not be empty")
    first = tensors[0]
    if not isinstance(first, SparseTensor):
        raise TypeError(f"cat: argument 0 must be a SparseTensor, got {type(first).__name__}")
    for i, t in enumerate(tensors[1:], start=1):
        _check_pair("cat", first, t, i)
    feats = torch.cat([t.feats for t in tensors], dim=1)
    return SparseTensor.from_support(feats, first.support)


def add(a: SparseTensor, b: SparseTensor) -> SparseTensor:
    """``a + b`` feature-wise on equal supports (``(N, C)`` each).

    Raises:
        TypeError: an argument is not a SparseTensor.
        ValueError: different supports or channel counts.
    """
    if not isinstance(a, SparseTensor):
        raise TypeError(f"add: argument 0 must be a SparseTensor, got {type(a).__name__}")
    _check_pair("add", a, b, 1)
    if a.feats.shape[1] != b.feats.shape[1]:
        raise ValueError(f"add: channel counts differ: {a.feats.shape[1]} and {b.feats.shape[1]}")
    return SparseTensor.from_support(a.feats + b.feats, a.support)


def to_dense(x: SparseTensor) -> torch.Tensor:
    """``[B, C, X, Y, Z]`` dense tensor of ``x`` (needs ``spatial_range``).

    Functional alias of :meth:`SparseTensor.dense`.
    """
    if not isinstance(x, SparseTensor):
        raise TypeError(f"to_dense: x must be a SparseTensor, got {type(x).__name__}")
    return x.dense()
