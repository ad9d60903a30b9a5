"""Kernel specs: the size and source row order of every legacy ``.kernel`` tensor.

A checkpoint does not record how its kernel rows are enumerated, so the converter
never guesses from shapes; the user states each kernel's size. Two JSON forms are
accepted per key::

    {"stem.0.kernel": [3, 3, 3],                                   # volume-parity rule
     "head.kernel": {"kernel_size": [1, 1, 1]},                    # same, object form
     "me.conv.kernel": {"kernel_size": [2, 2, 2], "row_order": "x_fastest"}}

A single module's own state dict (``conv.state_dict()`` of one legacy ``Conv3d``:
``kernel`` plus an optional ``bias``) has no module prefix, so its entry is keyed by
the bare ``"kernel"`` (``{"kernel": [3, 3, 3]}``); it converts to ``weight`` and
``kernel_positions``, the keys of one Torch Lattice convolution module.

Without ``row_order`` the TorchSparse rule applies (docs/migration.md): odd volume rows are
x fastest (``n = ix + Kx*(iy + Ky*iz)``), even volume rows are already z fastest
(``n = (ix*Ky + iy)*Kz + iz``). ``row_order`` overrides it: ``"x_fastest"`` for
MinkowskiEngine kernels of any volume, ``"z_fastest"`` for TorchSparse v1.2/v1.3
models built with a tuple ``kernel_size``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch_lattice.geometry import MAX_KERNEL_VOLUME, Triple, check_kernel_size, kernel_volume
from torch_lattice.memory_budget import check_allocation
from torch_lattice.migration.errors import ConversionError
from torch_lattice.regular_file import parse_json, read_regular_file

# A spec lists one entry per kernel: megabytes of it are never a real network's.
MAX_SPEC_BYTES = 16 * 2**20

__all__ = [
    "LAYOUT_X_FASTEST",
    "LAYOUT_Z_FASTEST",
    "ROW_ORDERS",
    "KernelSpec",
    "is_legacy_kernel_key",
    "load_kernel_spec",
    "parse_kernel_spec",
    "row_permutation",
]

# Source layout names of the published torch-lattice conversion manifest.
LAYOUT_X_FASTEST = "torchsparse_k_i_o_x_fastest"
LAYOUT_Z_FASTEST = "torchsparse_k_i_o_z_fastest"
ROW_ORDERS = {"x_fastest": LAYOUT_X_FASTEST, "z_fastest": LAYOUT_Z_FASTEST}
_ENTRY_FIELDS = {"kernel_size", "row_order"}
_KERNEL = "kernel"


def is_legacy_kernel_key(key: str) -> bool:
    """Whether a state-dict key names a legacy kernel: ``<module>.kernel``, or the
    bare ``kernel`` of a single module's own state dict."""
    return key == _KERNEL or key.endswith("." + _KERNEL)


@dataclass(frozen=True)
class KernelSpec:
    """Size and source row order of one legacy kernel.

    Attributes:
        key: the legacy state-dict key: ``<module>.kernel``, or ``kernel`` for a
            single module's own state dict.
        kernel_size: ``(Kx, Ky, Kz)``, each positive.
        row_order: ``"x_fastest"`` or ``"z_fastest"``; ``None`` applies the
            TorchSparse volume-parity rule.
    """

    key: str
    kernel_size: Triple
    row_order: str | None = None

    @property
    def volume(self) -> int:
        """Number of kernel rows ``K = Kx*Ky*Kz``."""
        return kernel_volume(self.kernel_size)

    @property
    def resolved_row_order(self) -> str:
        """The stated order, else x fastest for odd volume and z fastest for even."""
        if self.row_order is not None:
            return self.row_order
        return "x_fastest" if self.volume % 2 == 1 else "z_fastest"

    @property
    def source_layout(self) -> str:
        """Manifest name of the source row layout."""
        return ROW_ORDERS[self.resolved_row_order]

    @property
    def target_key(self) -> str:
        """``<module>.weight`` for ``<module>.kernel``; ``weight`` for ``kernel``."""
        return self.key[: -len(_KERNEL)] + "weight"

    @property
    def positions_key(self) -> str:
        """``<module>.kernel_positions`` for ``<module>.kernel``; ``kernel_positions``
        for ``kernel``."""
        return self.key[: -len(_KERNEL)] + "kernel_positions"

    def permutation(self) -> list[int]:
        """Row permutation with ``canonical[t] = legacy[perm[t]]`` (t z fastest)."""
        return row_permutation(self.kernel_size, self.resolved_row_order)


# A Python list of ints: an 8-byte pointer and a 28-32 byte int object per row.
_PERMUTATION_ROW_BYTES = 40


def row_permutation(kernel_size: Triple, row_order: str) -> list[int]:
    """Maps z-fastest canonical rows to source rows.

    Args:
        kernel_size: ``(Kx, Ky, Kz)``.
        row_order: how the source enumerates rows, ``"x_fastest"`` or ``"z_fastest"``.

    Returns:
        ``perm`` of length ``K``: canonical row ``t = (rx*Ky + ry)*Kz + rz`` holds
        source row ``perm[t]``.

    Raises:
        TypeError: ``kernel_size`` is not an int or three ints; ``row_order`` not a str.
        ValueError: a size below 1, a volume beyond the kernel-row limit, a list
            beyond the memory budget, or an unknown ``row_order``.
    """
    if not isinstance(row_order, str):
        raise TypeError(f"row_order must be a str, one of {sorted(ROW_ORDERS)}, got "
                        f"{row_order!r}")
    if row_order not in ROW_ORDERS:
        raise ValueError(f"row_order must be one of {sorted(ROW_ORDERS)}, got {row_order!r}")
    kx, ky, kz = check_kernel_size(kernel_size)
    volume = kernel_volume((kx, ky, kz))
    check_allocation(f"row_permutation of kernel_size {(kx, ky, kz)} ({volume} rows)",
                     volume * _PERMUTATION_ROW_BYTES)
    perm = []
    for rx in range(kx):
        for ry in range(ky):
            for rz in range(kz):
                if row_order == "x_fastest":
                    perm.append(rx + kx * (ry + ky * rz))
                else:
                    perm.append((rx * ky + ry) * kz + rz)
    return perm


def _kernel_size(key: str, value: Any) -> Triple:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 3:
        raise ConversionError(
            f"kernel spec for {key!r} must give kernel_size as [Kx, Ky, Kz], got {value!r}"
        )
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value):
        raise ConversionError(
            f"kernel spec for {key!r}: kernel_size must be three positive ints, got {value!r}"
        )
    # Refused here, naming the key: otherwise the first to see the volume is the memory
    # budget, whose message names neither the key nor the kernel-row limit.
    volume = kernel_volume((value[0], value[1], value[2]))
    if volume > MAX_KERNEL_VOLUME:
        raise ConversionError(
            f"kernel spec for {key!r}: kernel_size {list(value)} has {volume} rows; at most "
            f"{MAX_KERNEL_VOLUME}"
        )
    return (value[0], value[1], value[2])


def _entry(key: Any, value: Any) -> KernelSpec:
    if not isinstance(key, str) or not is_legacy_kernel_key(key):
        raise ConversionError(
            f"kernel spec key {key!r} must name a legacy '<module>.kernel', or be 'kernel' "
            f"for a single module's own state dict"
        )
    if key.startswith(".") or ".." in key:
        raise ConversionError(
            f"kernel spec key {key!r} has an empty module name part; a single module's own "
            f"kernel is listed as 'kernel'"
        )
    if not isinstance(value, Mapping):
        return KernelSpec(key, _kernel_size(key, value))
    unknown = sorted(set(value) - _ENTRY_FIELDS)
    if unknown:
        raise ConversionError(
            f"kernel spec for {key!r} has unknown fields {unknown}; allowed: "
            f"{sorted(_ENTRY_FIELDS)}"
        )
    if "kernel_size" not in value:
        raise ConversionError(f"kernel spec for {key!r} must give 'kernel_size'")
    order = value.get("row_order")
    # isinstance first: a list or object (unhashable) would make the lookup raise a bare
    # "unhashable type" TypeError that names neither the key nor the field.
    if order is not None and (not isinstance(order, str) or order not in ROW_ORDERS):
        raise ConversionError(
            f"kernel spec for {key!r}: row_order must be one of {sorted(ROW_ORDERS)}, got {order!r}"
        )
    return KernelSpec(key, _kernel_size(key, value["kernel_size"]), order)


def parse_kernel_spec(raw: Any) -> dict[str, KernelSpec]:
    """Validates a decoded kernel spec (either entry form, see the module docstring).

    Args:
        raw: a mapping from legacy kernel keys (``<module>.kernel``, or ``kernel``
            for a single module's state dict) to ``[Kx, Ky, Kz]`` or to
            ``{"kernel_size": [...], "row_order": ...}``; :class:`KernelSpec`
            values are passed through after checking their key.

    Raises:
        ConversionError: not a mapping, a key that names no legacy kernel, a bad size,
            an unknown field or row order.
    """
    if not isinstance(raw, Mapping):
        raise ConversionError(
            f"kernel spec must be a JSON object mapping '<module>.kernel' (or 'kernel') "
            f"keys to sizes, got {type(raw).__name__}"
        )
    specs: dict[str, KernelSpec] = {}
    for key, value in raw.items():
        if isinstance(value, KernelSpec):
            if value.key != key:
                raise ConversionError(f"kernel spec entry {key!r} describes {value.key!r}")
            value = {"kernel_size": list(value.kernel_size), "row_order": value.row_order}
        specs[key] = _entry(key, value)
    return specs


def load_kernel_spec(path: str | Path) -> dict[str, KernelSpec]:
    """Reads and validates a kernel-spec JSON file.

    Raises:
        ConversionError: the file is missing, unreadable, not JSON, gives a key twice
            (in any object), or is invalid.
    """
    spec_path = Path(path)
    try:
        # A regular file of bounded size: a FIFO would hang, gigabytes of JSON would not fit.
        data = read_regular_file(spec_path, "kernel spec", max_bytes=MAX_SPEC_BYTES)
    except ValueError as exc:
        raise ConversionError(str(exc)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConversionError(f"cannot read kernel spec {str(spec_path)!r}: {exc}") from exc
    try:  # a repeated key is refused there: json keeps the last, dropping a kernel
        raw = parse_json(text, f"kernel spec {str(spec_path)!r}", "is not valid JSON")
    except ValueError as exc:
        raise ConversionError(str(exc)) from None
    return parse_kernel_spec(raw)
