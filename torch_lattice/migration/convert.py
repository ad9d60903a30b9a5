"""State-dict conversion from legacy TorchSparse layout to Torch Lattice layout.

For every kernel named in the spec: rows are permuted to z fastest
(``canonical[t] = legacy[perm[t]]``), a 2-D pointwise kernel ``(C_in, C_out)``
becomes ``(1, C_in, C_out)``, ``<module>.kernel`` becomes ``<module>.weight`` and
``<module>.kernel_positions`` (int32 ``(K, 3)``, z fastest) is added, as every Torch
Lattice convolution module stores it. Every other tensor passes through unchanged.
A single module's own state dict converts the same way with an empty module name:
``kernel`` becomes ``weight`` plus ``kernel_positions`` (spec key ``"kernel"``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from torch_lattice.geometry import kernel_positions
from torch_lattice.memory_budget import check_allocation
from torch_lattice.migration.errors import ConversionError
from torch_lattice.migration.kernel_spec import (
    KernelSpec,
    is_legacy_kernel_key,
    load_kernel_spec,
    parse_kernel_spec,
)

__all__ = ["ConversionResult", "ConvertedKernel", "convert_kernel", "convert_state_dict"]


@dataclass(frozen=True)
class ConvertedKernel:
    """One converted kernel, as recorded in the manifest's ``kernels`` list."""

    source_key: str
    target_key: str
    kernel_size: tuple[int, int, int]
    source_layout: str
    row_permutation: tuple[int, ...]
    source_shape: tuple[int, ...]
    positions_key: str


@dataclass(frozen=True)
class ConversionResult(Mapping[str, torch.Tensor]):
    """A converted state dict and what was done to each tensor.

    It reads as the converted state dict itself (a ``Mapping``), so
    ``model.load_state_dict(convert_state_dict(...), strict=True)`` works.

    Attributes:
        state_dict: target tensors (contiguous, CPU, no shared storage), in source
            order with each module's ``kernel_positions`` right after its weight.
        kernels: one record per converted kernel, in source order.
        passthrough: keys copied unchanged.
    """

    state_dict: dict[str, torch.Tensor]
    kernels: tuple[ConvertedKernel, ...]
    passthrough: tuple[str, ...]

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.state_dict[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.state_dict)

    def __len__(self) -> int:
        return len(self.state_dict)


def convert_kernel(spec: KernelSpec, kernel: torch.Tensor) -> tuple[torch.Tensor, ConvertedKernel]:
    """Converts one legacy kernel.

    Args:
        spec: the kernel's size and source row order.
        kernel: ``(K, C_in, C_out)``, or ``(C_in, C_out)`` when ``K == 1``.

    Returns:
        The ``(K, C_in, C_out)`` z-fastest weight and its manifest record.

    Raises:
        TypeError: ``spec`` is not a :class:`KernelSpec` (e.g. the arguments swapped).
        ConversionError: the shape does not match the spec's ``K``.
    """
    if not isinstance(spec, KernelSpec):
        raise TypeError(
            f"convert_kernel(spec, kernel): spec must be a KernelSpec (from "
            f"parse_kernel_spec), got {type(spec).__name__}"
        )
    if not isinstance(kernel, torch.Tensor):
        raise ConversionError(
            f"legacy kernel {spec.key!r} must be a tensor, got {type(kernel).__name__}"
        )
    shape = tuple(kernel.shape)
    if not kernel.is_floating_point():
        raise ConversionError(
            f"legacy kernel {spec.key!r} must be floating point, got {kernel.dtype}"
        )
    value = kernel
    if spec.volume == 1 and kernel.dim() == 2:
        value = kernel.unsqueeze(0)
    if value.dim() != 3 or value.shape[0] != spec.volume:
        expected = "(K, C_in, C_out)" + (" or (C_in, C_out)" if spec.volume == 1 else "")
        raise ConversionError(
            f"legacy kernel {spec.key!r} has shape {shape} but its spec kernel_size "
            f"{list(spec.kernel_size)} needs {spec.volume} rows: expected {expected} with "
            f"K = {spec.volume}"
        )
    perm = spec.permutation()
    rows = torch.tensor(perm, dtype=torch.long, device=value.device)
    weight = value.index_select(0, rows).detach().cpu().contiguous()
    record = ConvertedKernel(
        spec.key,
        spec.target_key,
        spec.kernel_size,
        spec.source_layout,
        tuple(perm),
        shape,
        spec.positions_key,
    )
    return weight, record


# The safetensors header's metadata entry: no tensor may take this name.
_SAFETENSORS_METADATA = "__metadata__"


def _check_entries(state: Mapping[Any, Any], specs: Mapping[str, KernelSpec]) -> None:
    """Refuses non-tensor entries, unlisted kernels and spec keys with no tensor."""
    for key, value in state.items():
        if not isinstance(key, str):
            raise ConversionError(f"model state keys must be strings, got {key!r}")
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: a pickle can hold one, UTF-8 cannot
            raise ConversionError(
                f"model state key {key!r} is not valid Unicode (it holds a lone surrogate), so "
                "safetensors cannot store it; rename that entry before converting"
            ) from None
        if key == _SAFETENSORS_METADATA:
            raise ConversionError(
                f"model state key {key!r} is reserved by the safetensors format (the "
                "header's metadata field), so the converted file could not be loaded; "
                "rename that entry before converting"
            )
        if not isinstance(value, torch.Tensor):
            raise ConversionError(
                f"model state entry {key!r} is a {type(value).__name__}, not a tensor; "
                f"a model state dict holds only tensors"
            )
    total = 0
    for key, value in state.items():
        _check_kind(key, value)
        total += _check_storage(key, value)
    for key, spec in specs.items():
        value = state.get(key)
        if isinstance(value, torch.Tensor):
            total += _check_kernel_rows(key, value, spec)
    # The converted copies (one per tensor) are made before anything is written.
    check_allocation(f"converting {len(state)} checkpoint tensors", total)
    unlisted = [k for k in state if is_legacy_kernel_key(k) and k not in specs]
    absent = [k for k in specs if k not in state]
    problems = []
    if unlisted:
        problems.append(
            f"legacy kernels missing from the kernel spec (every '<module>.kernel' or "
            f"'kernel' must be listed with its [Kx, Ky, Kz]): {', '.join(unlisted)}"
        )
    if absent:
        problems.append(f"kernel spec keys not found in the checkpoint: {', '.join(absent)}")
    if problems:
        raise ConversionError("; ".join(problems) + _single_module_hint(state, unlisted, absent))


def _check_kind(key: str, value: torch.Tensor) -> None:
    """Refuses tensors a safetensors file cannot hold: sparse layouts, quantized values
    and meta tensors (which have no values at all)."""
    kind = ("a sparse tensor" if value.layout != torch.strided
            else "a quantized tensor" if value.is_quantized
            else "a meta tensor (no values)" if value.is_meta else "")
    if kind:
        raise ConversionError(
            f"model state entry {key!r} is {kind} ({value.layout}, {value.dtype}); a "
            "converted checkpoint holds dense tensors with their values"
        )


# Bytes each kernel row costs beyond the weights: its index in the row permutation
# (kept in the manifest record as Python ints), its kernel_positions row and its
# entry in the manifest's text (measured: about 290 bytes a row at 2^24 rows).
_ROW_BYTES = 320


def _check_kernel_rows(key: str, kernel: torch.Tensor, spec: KernelSpec) -> int:
    """What converting ``kernel`` costs per kernel row (its permutation, positions and
    manifest entry); an empty kernel is refused: its spec alone would set that size, so
    a tiny file could ask for gigabytes of permutation and positions."""
    if kernel.numel() == 0:
        raise ConversionError(
            f"legacy kernel {key!r} of shape {tuple(kernel.shape)} holds no weights; a "
            "kernel to convert needs at least one input and one output channel"
        )
    return spec.volume * _ROW_BYTES


def _check_storage(key: str, value: torch.Tensor) -> int:
    """The bytes ``value`` needs once copied; an expanded tensor is refused.

    A 2 KB pickle can hold ``zeros(1).expand(2**31)``: a stride-0 (or overlapping)
    view whose copy is gigabytes of one repeated value. A saved state dict never needs
    one, so it is refused before anything is materialised.
    """
    expanded = any(st == 0 and n > 1 for st, n in zip(value.stride(), value.shape, strict=True))
    nbytes = value.numel() * value.element_size()
    if expanded or nbytes > value.untyped_storage().nbytes():
        raise ConversionError(
            f"model state entry {key!r} of shape {tuple(value.shape)} is an expanded view "
            f"(strides {tuple(value.stride())}) over {value.untyped_storage().nbytes()} stored "
            "bytes; a checkpoint's tensors must hold their own elements"
        )
    return nbytes


def _single_module_hint(state: Mapping[str, Any], unlisted: list[str], absent: list[str]) -> str:
    """Points at a mix-up between a model's keys and a single module's own keys."""
    if "kernel" in unlisted and absent:
        return (
            "; the checkpoint is a single module's own state dict (its kernel key is "
            "'kernel'), so list it as 'kernel'"
        )
    if "kernel" in unlisted:
        return "; a single module's own state dict lists its kernel as 'kernel'"
    if "kernel" in absent:
        kernels = [k for k in state if is_legacy_kernel_key(k)]
        named = f" ({', '.join(kernels)})" if kernels else ""
        return (
            f"; 'kernel' names a single module's own kernel, but the checkpoint's kernels "
            f"carry module names{named}"
        )
    return ""


def _put(out: dict[str, torch.Tensor], key: str, value: torch.Tensor, origin: str) -> None:
    if key in out:
        raise ConversionError(f"conversion maps two tensors to {key!r} (second from {origin!r})")
    out[key] = value


def convert_state_dict(
    state: Mapping[str, torch.Tensor], kernel_spec: Mapping[str, Any] | str | Path
) -> ConversionResult:
    """Converts a legacy TorchSparse model state dict.

    Args:
        state: legacy model state (``<module>.kernel`` and any other tensors), or
            one module's own state (``kernel``, optional ``bias``).
        kernel_spec: ``{"<module>.kernel": [Kx, Ky, Kz] | {"kernel_size": ...,
            "row_order": ...} | KernelSpec}`` naming every legacy kernel (the key is
            ``"kernel"`` for a single module's own state), or the path of a JSON
            file holding it.

    Returns:
        The converted state and per-tensor records; ``state`` is not modified.

    Raises:
        ConversionError: a non-tensor entry, a key named ``__metadata__`` (reserved by
            safetensors), an unlisted kernel, a spec key absent
            from ``state``, a row-count mismatch, or two tensors mapped to one key.
    """
    if not isinstance(state, Mapping):
        raise ConversionError(
            f"model state must be a mapping of names to tensors, got {type(state).__name__}"
        )
    if isinstance(kernel_spec, (str, os.PathLike)):
        specs = load_kernel_spec(kernel_spec)
    else:
        specs = parse_kernel_spec(kernel_spec)
    _check_entries(state, specs)
    if not state:
        raise ConversionError("model state is empty: nothing to convert")
    out: dict[str, torch.Tensor] = {}
    kernels: list[ConvertedKernel] = []
    passthrough: list[str] = []
    for key, value in state.items():
        spec = specs.get(key)
        if spec is None:
            # clone: safetensors refuses tensors that share storage.
            _put(out, key, value.detach().cpu().clone().contiguous(), key)
            passthrough.append(key)
            continue
        weight, record = convert_kernel(spec, value)
        _put(out, record.target_key, weight, key)
        _put(out, record.positions_key, kernel_positions(spec.kernel_size), key)
        kernels.append(record)
    return ConversionResult(out, tuple(kernels), tuple(passthrough))
