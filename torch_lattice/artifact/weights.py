"""Artifact weights: layouts, families, dense or packed storage.

Torch Lattice convolutions hold canonical ``(K, C_in, C_out)`` weights whose
row ``n = (rx*Ky + ry)*Kz + rz`` is kernel position ``(rx, ry, rz)`` (z fastest,
see :mod:`torch_lattice.geometry`).  The contract's ``conv3d_o_xyz_i`` layout is
``(C_out, Kx, Ky, Kz, C_in)``: reshaping the rows to ``(Kx, Ky, Kz)`` in C order
puts position ``(rx, ry, rz)`` at ``[rx, ry, rz]``, so the conversion is a
reshape and a permute.  ``torch.nn.Linear`` weights are already ``(O, I)``
(``linear_o_i``); per-channel vectors are ``channel_c`` or ``bias_c``.
"""

from __future__ import annotations

import torch

from torch_lattice.artifact import schema
from torch_lattice.artifact.errors import ExportError
from torch_lattice.artifact.mlir_text import DENSE_PACKING, ModuleText, Packing, Value
from torch_lattice.artifact.packing import check_packing, pack_weight

__all__ = ["PACKABLE_FAMILIES", "WeightTable", "conv_weight_to_artifact", "dtype_name"]

# Families the contract lets us pack (int4/int8); everything else stays dense.
PACKABLE_FAMILIES = ("conv3d", "linear")

_DTYPES = {torch.float32: "f32", torch.float16: "f16"}
_INDEX_DTYPES = {torch.int32: "i32", torch.int64: "i64"}


def dtype_name(dtype: torch.dtype, what: str, *, index: bool = False) -> str:
    """The MLIR element type of ``dtype`` (``f32``, ``f16``; ``i32``/``i64`` for
    index tensors).

    Raises:
        ExportError: naming ``what``, for float64 and every other dtype.
    """
    table = {**_DTYPES, **_INDEX_DTYPES} if index else _DTYPES
    if dtype not in table:
        raise ExportError(
            f"{what} has dtype {dtype}, which an artifact cannot hold (allowed: "
            f"{', '.join(str(d) for d in table)}); convert the model and inputs, e.g. "
            "model.float()"
        )
    return table[dtype]


def conv_weight_to_artifact(
    weight: torch.Tensor, kernel_size: tuple[int, int, int]
) -> torch.Tensor:
    """Canonical ``(K, C_in, C_out)`` to ``conv3d_o_xyz_i`` ``(C_out, Kx, Ky, Kz, C_in)``."""
    kx, ky, kz = kernel_size
    if weight.ndim != 3 or weight.shape[0] != kx * ky * kz:
        raise ValueError(
            f"conv weight of shape {tuple(weight.shape)} does not match kernel_size {kernel_size}"
        )
    w = weight.detach().reshape(kx, ky, kz, weight.shape[1], weight.shape[2])
    return w.permute(4, 0, 1, 2, 3).contiguous()


class WeightTable:
    """The weights one export declares: ``lattice.weight`` ops and their storage tensors.

    A storage key is declared once; declaring it again (a module called twice)
    returns the same SSA value.
    """

    def __init__(self, text: ModuleText, bits: int | None, group_size: int) -> None:
        if bits is not None:
            check_packing(bits, group_size)
        self._text = text
        self._bits = bits
        self._group_size = group_size
        self._values: dict[str, Value] = {}
        self.tensors: dict[str, torch.Tensor] = {}
        # With packing on: weights kept in float, by storage key, with the reason.
        self.float_weights: dict[str, str] = {}

    @property
    def packing(self) -> bool:
        return self._bits is not None

    def declare(self, key: str, tensor: torch.Tensor, family: str,
                float_reason: str | None = None) -> Value:
        """Stores ``tensor`` (already in the family's layout) under ``key`` and emits its op.

        With packing on, a ``float_reason`` keeps a packable weight in float (an op MLX
        Lattice runs only with float weights); :attr:`float_weights` records it.
        """
        if key in self._values:
            return self._values[key]
        dtype = dtype_name(tensor.dtype, f"weight {key!r}")
        layout = schema.WEIGHT_FAMILY_LAYOUTS[family]
        data = tensor.detach().cpu().contiguous().clone()  # no storage shared between keys
        packing: Packing = DENSE_PACKING
        if self._bits is not None and family in PACKABLE_FAMILIES and float_reason is None:
            # float32 scales for a float32 graph: the consumer's decode is then exact to 6e-7
            scale = torch.float32 if data.dtype == torch.float32 else torch.float16
            try:
                stored = pack_weight(data, bits=self._bits, group_size=self._group_size,
                                     scale_dtype=scale).tensors(key)
            except ValueError as exc:  # name the weight: the message alone does not
                raise ExportError(f"weight {key!r}: {exc}") from None
            packing = Packing(f"int{self._bits}", self._group_size,
                              "f32" if scale == torch.float32 else "f16")
        else:
            if self._bits is not None and family in PACKABLE_FAMILIES and float_reason:
                self.float_weights[key] = float_reason
            stored = {key: data}
        clash = sorted(set(stored) & set(self.tensors))
        if clash:
            raise ExportError(f"weight storage keys {clash} are declared twice")
        self.tensors.update(stored)
        value = self._text.weight(key, layout, packing, family, dtype)
        self._values[key] = value
        return value
