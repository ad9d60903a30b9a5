"""Feature algebra on equal supports: :func:`cat`, :func:`add`, :func:`to_dense`.

Two tensors have equal supports when they share one :class:`~torch_lattice.Support`
object (the usual case: both derive from the same layer input), or when their
strides match and their coordinate rows are equal and in the same order; their
``spatial_range`` must then agree too.  The result keeps the first tensor's support,
so cached kernel maps stay shared.
``add`` (``a + b``) and ``same_support`` live beside :class:`SparseTensor` in
``tensor.py``; they are exported here with ``cat``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_lattice.memory_budget import check_output
from torch_lattice.tensor import (
    SparseTensor,
    add,
    check_same_support,
    same_support,
)

__all__ = ["add", "cat", "same_support", "to_dense"]


def cat(tensors: Sequence[SparseTensor]) -> SparseTensor:
    """Concatenates features of tensors on one support along channels.

    Args:
        tensors: non-empty sequence of SparseTensors with ``(N, C_i)`` features
            on equal supports (different dtypes promote, as in ``torch.cat``).

    Returns:
        SparseTensor with ``(N, sum C_i)`` features on the first tensor's support.

    Raises:
        TypeError: an element is not a SparseTensor.
        ValueError: empty sequence, different supports or spatial ranges.
    """
    if isinstance(tensors, SparseTensor) or not isinstance(tensors, Sequence):
        raise TypeError("cat: tensors must be a list or tuple of SparseTensors")
    if len(tensors) == 0:
        raise ValueError("cat: tensors must not be empty")
    first = tensors[0]
    if not isinstance(first, SparseTensor):
        raise TypeError(f"cat: argument 0 must be a SparseTensor, got {type(first).__name__}")
    for i, t in enumerate(tensors[1:], start=1):
        check_same_support("cat", first, t, i)
    # features may be expanded (gigabytes of channels from a few bytes): sized first
    dtype = first.dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    channels = sum(int(t.feats.shape[1]) for t in tensors)
    check_output("cat", len(first), first.feats, channels=channels, dtype=dtype)
    feats = torch.cat([t.feats for t in tensors], dim=1)
    return SparseTensor.from_support(feats, first.support)


def to_dense(x: SparseTensor) -> torch.Tensor:
    """``[B, C, X, Y, Z]`` dense tensor of ``x`` (needs ``spatial_range``).

    Functional alias of :meth:`SparseTensor.dense`.
    """
    if not isinstance(x, SparseTensor):
        raise TypeError(f"to_dense: x must be a SparseTensor, got {type(x).__name__}")
    return x.dense()
