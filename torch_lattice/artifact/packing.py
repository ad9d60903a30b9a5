"""Affine int4 / int8 packing of artifact weights (lattice-contract 0.6.0).

A packed weight is quantized per group of ``group_size`` input channels (the
last axis of ``conv3d_o_xyz_i`` and ``linear_o_i``), each row zero-padded to a
multiple of ``group_size``.  For every group::

    scale = (min - max) / qmax          qmax = 2**bits - 1
    bias  = max
    code  = clamp(round((w - bias) / scale), 0, qmax)     (0 where scale == 0)
    w    ~= code * scale + bias

``32 / bits`` codes share one uint32 word, code ``i`` of a word at bit
``bits * i``.  A weight with ``K`` kernel rows (``K = Kx*Ky*Kz``, x slowest,
z fastest; ``K = 1`` for linear) is stored as three tensors:

- ``<key>.weight``: uint32, ``(K, words, O)`` for ``K > 1``, ``(1, O, words)``
  for ``K = 1``;
- ``<key>.scales`` and ``<key>.biases``: float32 for a float32 weight (the
  graph computes in float32; MLX Lattice then stays within 6e-7 of the exact
  decode), float16 for a half-precision one (up to 8e-4 of the output
  magnitude there), the same arrangement with ``groups`` in place of ``words``.

``words = padded_in_channels * bits / 32`` and ``groups = padded_in_channels /
group_size``; ``group_size`` is 32, 64 or 128, the sizes MLX Lattice runs.  The
codes are computed with the float32 scale and bias; the stored values are what
a reader dequantizes with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from torch_lattice.memory_budget import check_allocation

__all__ = [
    "GROUP_SIZES",
    "PACKED_SUFFIXES",
    "PackedWeight",
    "check_packing",
    "pack_weight",
    "unpack_weight",
]

# The storage keys of one packed weight: "<key>" + suffix.
PACKED_SUFFIXES = (".weight", ".scales", ".biases")
_BITS = (4, 8)
# The group sizes MLX Lattice runs packed weights with (it refuses any other).
GROUP_SIZES = (32, 64, 128)


@dataclass(frozen=True)
class PackedWeight:
    """The three storage tensors of one packed weight (see the module docstring)."""

    weight: torch.Tensor
    scales: torch.Tensor
    biases: torch.Tensor

    def tensors(self, key: str) -> dict[str, torch.Tensor]:
        """``{"<key>.weight": ..., "<key>.scales": ..., "<key>.biases": ...}``."""
        return dict(zip((key + s for s in PACKED_SUFFIXES), self.astuple(), strict=True))

    def astuple(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (self.weight, self.scales, self.biases)


def check_packing(bits: object, group_size: object) -> tuple[int, int]:
    """Validates ``bits`` (4 or 8) and ``group_size`` (32, 64 or 128).

    Raises:
        TypeError: a non-integer ``quantize_bits`` or ``quantize_group_size``.
        ValueError: a value outside the rule above, naming the argument.
    """
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"quantize_bits must be None, 4 or 8, got {bits!r}")
    if bits not in _BITS:
        raise ValueError(f"quantize_bits must be None, 4 or 8, got {bits!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"quantize_group_size must be a positive int, got {group_size!r}")
    if group_size not in GROUP_SIZES:
        raise ValueError(
            "quantize_group_size must be 32, 64 or 128 (the group sizes MLX Lattice runs "
            f"packed weights with), got {group_size}"
        )
    return bits, group_size


def _rows(weight: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """``(K * O, I)`` float32 rows of a ``(O, I)`` or ``(O, Kx, Ky, Kz, I)`` weight, K, O."""
    if weight.ndim == 2:
        return weight.to(torch.float32), 1, int(weight.shape[0])
    if weight.ndim == 5:
        o, kx, ky, kz, i = weight.shape
        k = kx * ky * kz
        rows = weight.to(torch.float32).permute(1, 2, 3, 0, 4).reshape(k * o, i)
        return rows, int(k), int(o)
    raise ValueError(
        "weight must be (O, I) (linear_o_i) or (O, Kx, Ky, Kz, I) (conv3d_o_xyz_i), "
        f"got shape {tuple(weight.shape)}"
    )


def _arrange(flat: torch.Tensor, k: int, o: int) -> torch.Tensor:
    """``(K * O, n)`` rows to the stored ``(K, n, O)`` (K > 1) or ``(1, O, n)`` (K = 1)."""
    out = flat.reshape(k, o, -1)
    return (out.transpose(1, 2) if k > 1 else out).contiguous()


def _rows_of(stored: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """Inverse of :func:`_arrange`: stored tensor to ``(K * O, n)`` rows, K, O."""
    k = int(stored.shape[0])
    if k > 1:
        stored = stored.transpose(1, 2)
    o = int(stored.shape[1])
    return stored.reshape(k * o, -1), k, o


def pack_weight(weight: torch.Tensor, *, bits: int, group_size: int = 32,
                scale_dtype: torch.dtype = torch.float32) -> PackedWeight:
    """Packs a ``linear_o_i`` ``(O, I)`` or ``conv3d_o_xyz_i`` ``(O, Kx, Ky, Kz, I)`` weight.

    Args:
        weight: floating tensor, finite.
        bits: 4 or 8.
        group_size: input channels per quantization group: 32, 64 or 128.
        scale_dtype: torch.float32 or torch.float16, the stored scales and biases.

    Returns:
        :class:`PackedWeight` on the CPU: uint32 codes, scales and biases.

    Raises:
        TypeError: ``weight`` is not a floating tensor.
        ValueError: bad shape, non-finite values, bad ``bits`` / ``group_size`` /
            ``scale_dtype``.
    """
    bits, group_size = check_packing(bits, group_size)
    if scale_dtype not in (torch.float32, torch.float16):
        raise ValueError(f"scale_dtype must be torch.float32 or torch.float16, got {scale_dtype}")
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        raise TypeError(f"weight must be a floating tensor, got {weight!r:.80}")
    rows, k, o = _rows(weight.detach().cpu())
    if not bool(torch.isfinite(rows).all()):
        raise ValueError("weight must be finite to be packed (it holds NaN or inf)")
    width = -(-rows.shape[1] // group_size) * group_size
    rows = torch.nn.functional.pad(rows, (0, width - rows.shape[1]))
    groups = rows.reshape(rows.shape[0], -1, group_size)
    qmax = float((1 << bits) - 1)
    hi = groups.amax(dim=2, keepdim=True)
    scale = (groups.amin(dim=2, keepdim=True) - hi) / qmax
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    codes = torch.where(scale == 0, torch.zeros_like(groups), (groups - hi) / safe)
    codes = codes.round().clamp(0, qmax).to(torch.int64).reshape(rows.shape[0], -1)
    per_word = 32 // bits
    lanes = codes.reshape(codes.shape[0], -1, per_word)
    shifts = torch.arange(per_word, dtype=torch.int64) * bits
    words = (lanes << shifts).sum(dim=2)  # disjoint bit fields: sum == bitwise or
    scales, biases = scale.squeeze(2).to(scale_dtype), hi.squeeze(2).to(scale_dtype)
    # Finite weights can still give an infinite scale: a group's range overflows float32
    # (1.8e38 beside -1.8e38), or a scale or bias beyond float16's 65504.
    for name, values in (("scale", scales), ("bias", biases)):
        if not bool(torch.isfinite(values).all()):
            raise ValueError(
                f"weight cannot be packed: a group's {name} (its range / {int(qmax)} or its "
                f"largest value) is not finite in {scale_dtype}; the largest weight "
                f"magnitude is {float(rows.abs().max()):.4g}"
            )
    return PackedWeight(
        _arrange(words.to(torch.uint32), k, o),
        _arrange(scales, k, o),
        _arrange(biases, k, o),
    )


# Peak bytes per code while unpacking: the int64 codes, their float32 values, the
# scales and biases repeated per code, the product (measured: 22 at 2.8e7 codes).
_UNPACK_BYTES_PER_CODE = 24


def unpack_weight(
    weight: torch.Tensor,
    scales: torch.Tensor,
    biases: torch.Tensor,
    *,
    bits: int,
    group_size: int = 32,
    in_channels: int | None = None,
    kernel_size: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """Dequantizes packed storage back to the logical artifact layout (float32).

    Args:
        weight: uint32 codes ``(K, words, O)`` or ``(1, O, words)``.
        scales, biases: ``(K, groups, O)`` or ``(1, O, groups)``.
        bits, group_size: as packed.
        in_channels: the logical input width (the padding is dropped); ``None``
            keeps the padded width.
        kernel_size: ``(Kx, Ky, Kz)`` to return ``conv3d_o_xyz_i``
            ``(O, Kx, Ky, Kz, I)``; ``None`` returns ``linear_o_i`` ``(O, I)``
            and needs ``K = 1``.

    Raises:
        ValueError: shapes or dtypes that do not fit together, naming the tensor; an
            unpacked size beyond the memory budget (``MemoryBudgetError``).
    """
    bits, group_size = check_packing(bits, group_size)
    for name, t in (("weight", weight), ("scales", scales), ("biases", biases)):
        if not isinstance(t, torch.Tensor) or t.ndim != 3:
            raise ValueError(f"packed {name} must be a 3-D tensor, got {t!r:.80}")
    if weight.dtype not in (torch.uint32, torch.int32):
        raise ValueError(f"packed weight must be uint32, got {weight.dtype}")
    per_word = 32 // bits
    words, k, o = _rows_of(weight.cpu())
    scale_rows, ks, os_ = _rows_of(scales.cpu().to(torch.float32))
    bias_rows, kb, ob = _rows_of(biases.cpu().to(torch.float32))
    width = words.shape[1] * per_word
    if (ks, os_) != (k, o) or (kb, ob) != (k, o) or scale_rows.shape != bias_rows.shape:
        raise ValueError(
            f"packed scales {tuple(scales.shape)} and biases {tuple(biases.shape)} do not "
            f"match weight {tuple(weight.shape)}"
        )
    if scale_rows.shape[1] * group_size != width:
        raise ValueError(
            f"packed weight holds {width} codes per row but scales give "
            f"{scale_rows.shape[1]} groups of {group_size}"
        )
    if in_channels is not None and not 0 < in_channels <= width:
        raise ValueError(f"in_channels must be in [1, {width}], got {in_channels}")
    # Checked before unpacking: 4 or 8 codes per stored word make int64 codes and float32
    # values ~35x the file's bytes (a file within the budget could ask for many times it).
    check_allocation(f"unpacking packed weight {tuple(weight.shape)} ({k * o * width} codes)",
                     k * o * width * _UNPACK_BYTES_PER_CODE)
    shifts = torch.arange(per_word, dtype=torch.int64) * bits
    raw = words.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    codes = ((raw.unsqueeze(2) >> shifts) & ((1 << bits) - 1)).reshape(k * o, width)
    values = codes.to(torch.float32) * scale_rows.repeat_interleave(group_size, dim=1)
    values = values + bias_rows.repeat_interleave(group_size, dim=1)
    values = values[:, : in_channels if in_channels is not None else width]
    if kernel_size is None:
        if k != 1:
            raise ValueError(f"packed weight has {k} kernel rows; pass kernel_size")
        return values.contiguous()
    kx, ky, kz = kernel_size
    if kx * ky * kz != k:
        raise ValueError(f"kernel_size {kernel_size} has {kx * ky * kz} rows, packed has {k}")
    return values.reshape(kx, ky, kz, o, -1).permute(3, 0, 1, 2, 4).contiguous()
