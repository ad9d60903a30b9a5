"""Convolution geometry: argument normalization, output ranges, kernel rows.

One place defines how ``kernel_size``, ``stride``, ``padding`` and ``dilation``
are read (an int or a 3-tuple), how the output range of a strided convolution
follows from the input range, and the z-fastest order of kernel rows.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

Triple = tuple[int, int, int]

# Geometry reaches the C core as int32 per axis.
_INT32_MAX = 2**31 - 1


def is_sequence(value: object) -> bool:
    """Whether ``value`` is a sequence of per-axis values: a ``Sequence`` other than text
    (``str``) or bytes (``bytes``, ``bytearray``, ``memoryview``), whose items Python
    also reads as a sequence (``b"\\x03\\x03\\x03"`` would pass as ``(3, 3, 3)``)."""
    return isinstance(value, Sequence) and not isinstance(
        value, (str, bytes, bytearray, memoryview)
    )


def check_has_values(name: str, value: torch.Tensor) -> None:
    """Raises ``TypeError`` naming ``name`` for a meta tensor given as an argument's
    values: it has a shape but no values to read (torch's own error, from ``.item()`` or
    ``.tolist()``, names no argument)."""
    if value.is_meta:
        raise TypeError(
            f"{name} must have values, got a meta tensor of shape {tuple(value.shape)} "
            "(give numbers, or a CPU or CUDA tensor)"
        )


def _as_int(name: str, v: object) -> int | None:
    """``v`` as an int where it is one: a Python or NumPy integer (``numbers.Integral``)
    or a one-element integer tensor, as ``torch.nn.Conv3d`` accepts; None for anything
    else, bools included (``True`` is no more a size than ``tensor(True)``). A meta
    tensor raises, naming ``name``."""
    if isinstance(v, bool):
        return None
    if isinstance(v, numbers.Integral):
        return int(v)
    if (isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_floating_point()
            and not v.is_complex() and v.dtype != torch.bool):
        check_has_values(name, v)
        return int(v.item())
    return None


def positive_int(name: str, value: object) -> int:
    """``value`` as a positive int: a Python or NumPy integer or a one-element integer
    tensor, as ``torch.nn.Conv3d`` takes channel counts (not a bool).

    Raises:
        ValueError: anything else, or below 1, naming ``name``.
    """
    v = _as_int(name, value)
    if v is None or v < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return v


def triple(name: str, value: int | Sequence[int], minimum: int) -> Triple:
    """Reads an int or a 3-sequence of ints, each ``>= minimum`` (NumPy integers and
    one-element integer tensors count as ints).

    Raises:
        TypeError: ``value`` is not an int or a sequence of three ints.
        ValueError: a component is below ``minimum``.
    """
    single = _as_int(name, value)
    if single is not None:
        items: tuple[object, ...] = (single, single, single)
    elif is_sequence(value):
        items = tuple(value)
        if len(items) != 3:
            raise ValueError(f"{name} must have 3 components (x, y, z), got {value!r}")
    else:
        raise TypeError(f"{name} must be an int or a 3-tuple of ints, got {value!r}")
    out = []
    for item in items:
        v = _as_int(name, item)
        if v is None:
            raise TypeError(f"{name} must contain ints, got {value!r}")
        if v < minimum:
            rule = "positive" if minimum == 1 else f">= {minimum}"
            raise ValueError(f"{name} must be {rule} in every axis, got {value!r}")
        if v > _INT32_MAX:
            raise ValueError(
                f"{name} must fit in int32 (<= {_INT32_MAX}) in every axis, got {value!r}"
            )
        out.append(v)
    return (out[0], out[1], out[2])


# Kernel rows are int32 indices in the C core.
MAX_KERNEL_VOLUME = 2**31 - 1


def kernel_volume(kernel_size: Triple) -> int:
    """Number of kernel rows ``K = Kx*Ky*Kz``."""
    kx, ky, kz = kernel_size
    return kx * ky * kz


def check_kernel_size(kernel_size: int | Sequence[int]) -> Triple:
    """Reads ``kernel_size`` and checks its volume fits the kernel-row index."""
    ks = triple("kernel_size", kernel_size, 1)
    volume = kernel_volume(ks)
    if volume > MAX_KERNEL_VOLUME:
        raise ValueError(f"kernel_size {ks} has {volume} rows; at most {MAX_KERNEL_VOLUME}")
    return ks


def check_submanifold_kernel_size(kernel_size: int | Sequence[int]) -> Triple:
    """:func:`check_kernel_size`, and odd in every axis (a submanifold kernel has a centre)."""
    ks = check_kernel_size(kernel_size)
    if any(k % 2 == 0 for k in ks):
        raise ValueError(f"kernel_size must be odd in every axis for SubmConv3d, got {ks}")
    return ks


@dataclass(frozen=True)
class ConvGeometry:
    """Per-axis geometry of a convolution relation.

    The relation is ``input = output * stride - padding + r * dilation`` for
    kernel position ``0 <= r < kernel_size``.
    """

    kernel_size: Triple
    stride: Triple = (1, 1, 1)
    padding: Triple = (0, 0, 0)
    dilation: Triple = (1, 1, 1)
    # Derived once when the geometry is made (read on every convolution call).
    volume: int = field(init=False, compare=False, repr=False)
    is_identity: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Number of kernel rows K; whether the kernel is 1x1x1 with stride 1 and no
        # padding (output support = input).
        object.__setattr__(self, "volume", kernel_volume(self.kernel_size))
        identity = (
            self.kernel_size == (1, 1, 1) and self.stride == (1, 1, 1) and self.padding == (0, 0, 0)
        )
        object.__setattr__(self, "is_identity", identity)

    @staticmethod
    def create(
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
    ) -> ConvGeometry:
        """Validates and normalizes user arguments (errors name the argument)."""
        return ConvGeometry(
            check_kernel_size(kernel_size),
            triple("stride", stride, 1),
            triple("padding", padding, 0),
            triple("dilation", dilation, 1),
        )

    @staticmethod
    def submanifold(kernel_size: Triple, dilation: Triple) -> ConvGeometry:
        """The centered stride-1 relation of SubmConv3d (odd kernels).

        Raises:
            ValueError: the centring padding ``dilation * (kernel_size - 1) / 2``
                exceeds int32 on some axis (the C core's coordinates).
        """
        pad = tuple(d * (k - 1) // 2 for k, d in zip(kernel_size, dilation, strict=True))
        if max(pad) > _INT32_MAX:
            raise ValueError(
                f"kernel_size {kernel_size} with dilation {dilation} reaches "
                f"dilation * (kernel_size - 1) / 2 = {pad} from the centre: it must fit int32 "
                f"(<= {_INT32_MAX}) in every axis"
            )
        return ConvGeometry(kernel_size, (1, 1, 1), (pad[0], pad[1], pad[2]), dilation)

    def as_c(self) -> tuple[Triple, Triple, Triple, Triple]:
        """The tuple layout the C core parses."""
        return (self.kernel_size, self.stride, self.padding, self.dilation)

    def output_range(self, in_range: Sequence[int]) -> Triple:
        """``R_out = (R + 2p - d*(K-1) - 1) // s + 1`` per axis (may be <= 0)."""
        out = [
            (r + 2 * p - d * (k - 1) - 1) // s + 1
            for r, k, s, p, d in zip(
                in_range,
                self.kernel_size,
                self.stride,
                self.padding,
                self.dilation,
                strict=True,
            )
        ]
        return (out[0], out[1], out[2])


def kernel_positions(kernel_size: Triple) -> torch.Tensor:
    """``(K, 3)`` int32 positions ``(rx, ry, rz)`` with z fastest."""
    axes = [torch.arange(k, dtype=torch.int32) for k in kernel_size]
    grid = torch.meshgrid(*axes, indexing="ij")
    return torch.stack([g.reshape(-1) for g in grid], dim=1).contiguous()
