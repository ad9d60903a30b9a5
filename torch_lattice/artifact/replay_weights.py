"""Artifact weights: checking ``lattice.weight`` bindings and turning them into tensors.

A ``lattice.weight`` names a storage key, a layout and a packing. Dense weights
are one tensor under the key; int4/int8 weights are three (``<key>.weight``,
``.scales``, ``.biases``, see :mod:`torch_lattice.artifact.packing`). Conv weights
arrive as ``conv3d_o_xyz_i`` ``(C_out, Kx, Ky, Kz, C_in)`` and are handed to our
functions as the canonical ``(K, C_in, C_out)``, rows z fastest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from torch_lattice.artifact import schema
from torch_lattice.artifact.mlir_parse import Operation, Packing
from torch_lattice.artifact.packing import PACKED_SUFFIXES, unpack_weight
from torch_lattice.artifact.validation import check_packed

__all__ = ["WeightValue", "check_weight", "storage_keys"]

# Rank of a dense tensor stored under each layout.
_LAYOUT_RANK = {"conv3d_o_xyz_i": 5, "linear_o_i": 2, "channel_c": 1, "bias_c": 1,
                "embedding_n_c": 2}
_PACKABLE = ("conv3d", "linear")
_FLOAT = {"f32": torch.float32, "f16": torch.float16}


@dataclass(frozen=True)
class WeightValue:
    """A bound artifact weight; ``tensors`` holds one dense tensor or the three packed ones."""

    key: str
    family: str
    layout: str
    packing: Packing
    tensors: tuple[torch.Tensor, ...]
    # Unpacked float32 weights by (in_channels, kernel_size): a program unpacks each once,
    # not on every call.
    _unpacked: dict[tuple[int, tuple[int, int, int] | None], torch.Tensor] = field(
        default_factory=dict, compare=False, repr=False
    )

    def dense(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """The float32 tensor of a dense weight (``name`` is the consumer's operand)."""
        if self.packing.kind != "dense":
            raise ValueError(
                f"{name}: weight {self.key!r} is {self.packing.kind}-packed; only conv3d and "
                "linear weights may be packed"
            )
        t = self.tensors[0].to(torch.float32)
        if shape is not None and tuple(t.shape) != shape:
            raise ValueError(
                f"{name}: weight {self.key!r} has shape {tuple(t.shape)}, expected {shape}"
            )
        return t

    def unpacked(self, in_channels: int, kernel_size: tuple[int, int, int] | None) -> torch.Tensor:
        """float32 ``conv3d_o_xyz_i`` (``kernel_size`` given) or ``linear_o_i`` weight."""
        if self.packing.kind == "dense":
            return self.tensors[0].to(torch.float32)
        key = (in_channels, kernel_size)
        if key not in self._unpacked:
            bits = 4 if self.packing.kind == "int4" else 8
            w, scales, biases = self.tensors
            self._unpacked[key] = unpack_weight(
                w, scales, biases, bits=bits, group_size=self.packing.group_size,
                in_channels=in_channels, kernel_size=kernel_size,
            ).to(w.device)
        return self._unpacked[key]

    def _unpacked_for(self, name: str, in_channels: int,
                      kernel_size: tuple[int, int, int] | None) -> torch.Tensor:
        """:meth:`unpacked`, its shape errors prefixed with the file, line and weight."""
        try:
            return self.unpacked(in_channels, kernel_size)
        except ValueError as exc:
            raise ValueError(f"{name}: weight {self.key!r}: {exc}") from None

    def conv_kernel(self, name: str, in_channels: int, kernel_size: tuple[int, int, int]
                    ) -> torch.Tensor:
        """Canonical ``(K, C_in, C_out)`` from a ``conv3d_o_xyz_i`` weight."""
        if self.family != "conv3d":
            raise ValueError(f"{name}: weight {self.key!r} is a {self.family} weight, not conv3d")
        w = self._unpacked_for(name, in_channels, kernel_size)
        kx, ky, kz = kernel_size
        if w.ndim != 5 or tuple(w.shape[1:4]) != (kx, ky, kz) or w.shape[4] != in_channels:
            raise ValueError(
                f"{name}: weight {self.key!r} has shape {tuple(w.shape)}; kernel_size "
                f"{kernel_size} on {in_channels} input channels needs (C_out, {kx}, {ky}, {kz}, "
                f"{in_channels})"
            )
        # (O, Kx, Ky, Kz, I) -> (Kx, Ky, Kz, I, O): flattening Kx, Ky, Kz keeps z fastest.
        return w.permute(1, 2, 3, 4, 0).reshape(kx * ky * kz, in_channels, w.shape[0])

    def linear(self, name: str, in_channels: int) -> torch.Tensor:
        """``(C_out, C_in)`` float32 from a ``linear_o_i`` weight."""
        if self.family != "linear":
            raise ValueError(f"{name}: weight {self.key!r} is a {self.family} weight, not linear")
        w = self._unpacked_for(name, in_channels, None)
        if w.ndim != 2 or w.shape[1] != in_channels:
            raise ValueError(
                f"{name}: weight {self.key!r} has shape {tuple(w.shape)}, expected "
                f"(C_out, {in_channels})"
            )
        return w


def storage_keys(op: Operation) -> tuple[str, ...]:
    """The safetensors keys one ``lattice.weight`` reads."""
    key = op.attributes["storage_key"]
    if op.attributes["packing"].kind == "dense":
        return (key,)
    return tuple(key + suffix for suffix in PACKED_SUFFIXES)


def check_weight(op: Operation, tensors: Mapping[str, torch.Tensor]) -> WeightValue:
    """Checks one ``lattice.weight`` against the stored tensors and returns its binding.

    Raises:
        ValueError: wrong layout for the family, a missing tensor, a bad dtype or rank.
    """
    family = op.result_types[0].family
    dtype = op.result_types[0].dtype
    key = op.attributes["storage_key"]
    layout = op.attributes["layout"]
    packing: Packing = op.attributes["packing"]
    where = f"graph.mlir line {op.line}: weight @{op.symbol} ({key!r})"
    if family not in schema.WEIGHT_FAMILY_LAYOUTS:
        raise ValueError(f"{where}: unknown weight family {family!r}")
    if layout != schema.WEIGHT_FAMILY_LAYOUTS[family]:
        raise ValueError(
            f"{where}: a {family} weight must use layout "
            f"{schema.WEIGHT_FAMILY_LAYOUTS[family]}, got {layout}"
        )
    if dtype not in _FLOAT:
        raise ValueError(f"{where}: weight dtype must be f32 or f16, got {dtype}")
    missing = [k for k in storage_keys(op) if k not in tensors]
    if missing:
        raise ValueError(f"{where}: weights.safetensors has no tensor {', '.join(missing)}")
    if packing.kind == "dense":
        t = tensors[key]
        if t.dtype != _FLOAT[dtype]:
            raise ValueError(f"{where}: stored tensor must be {dtype} as the weight type "
                             f"declares, got {t.dtype}")
        if t.ndim != _LAYOUT_RANK[layout]:
            raise ValueError(
                f"{where}: layout {layout} stores a {_LAYOUT_RANK[layout]}-D tensor, got shape "
                f"{tuple(t.shape)}"
            )
        return WeightValue(key, family, layout, packing, (t,))
    stored = (tensors[k] for k in storage_keys(op))
    return WeightValue(key, family, layout, packing, check_packed(where, family, packing, *stored))
