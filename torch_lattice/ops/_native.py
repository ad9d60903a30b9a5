"""The bridge to ``torch_lattice._C``: device checks, pointers, threads."""

from __future__ import annotations

import torch

from torch_lattice import _C

# dtype codes of enum tl_dtype in csrc/core/tl_conv.h
DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}
# enum tl_voxel_reduction in csrc/core/tl_voxel.h
REDUCTION_CODES = {"mean": 0, "sum": 1, "max": 2}


def device_type(op: str, *tensors: torch.Tensor) -> str:
    """``"cpu"`` or ``"cuda"``: the one device all ``tensors`` are on.

    Raises:
        ValueError: tensors on different devices.
        RuntimeError: a device type with no kernels (CUDA kernels are checked
            when called, in :mod:`torch_lattice.ops._cuda`).
    """
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"lattice::{op}: all tensors must be on one device, got {devices}")
    kind = next(iter(devices)).type
    if kind not in ("cpu", "cuda"):
        raise RuntimeError(f"lattice::{op}: no kernels for {kind} tensors (use CPU or CUDA)")
    return kind


def require_cpu(op: str, *tensors: torch.Tensor) -> None:
    """Raises unless every tensor is on the CPU."""
    if device_type(op, *tensors) != "cpu":
        raise RuntimeError(f"lattice::{op}: runs on the CPU only; move the tensors to the CPU")


def compute_dtype(op: str, dtype: torch.dtype) -> torch.dtype:
    """dtype the C core computes ``op`` in: float32/float64 as they are; half
    types in float32 (fp32 accumulation), cast back by the caller.

    Raises:
        TypeError: ``dtype`` is not floating.
    """
    if dtype in (torch.float32, torch.float64):
        return dtype
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    raise TypeError(f"lattice::{op}: features must be floating, got {dtype}")


def check_nbr(op: str, nbr: torch.Tensor) -> None:
    """Raises unless ``nbr`` is an int32 ``(N_out, K)`` neighbour table."""
    if nbr.dtype != torch.int32 or nbr.dim() != 2:
        raise ValueError(
            f"lattice::{op}: kernel map must be an int32 (N_out, K) table; "
            f"got {nbr.dtype} {tuple(nbr.shape)}"
        )


def ptr(t: torch.Tensor) -> int:
    """Data pointer of a contiguous tensor (0 when empty)."""
    if not t.is_contiguous():
        raise ValueError("internal error: tensor passed to the C core must be contiguous")
    return t.data_ptr() if t.numel() else 0


def optional_ptr(t: torch.Tensor | None) -> int:
    """:func:`ptr` of an optional operand (a null pointer for None, e.g. no batch column)."""
    return 0 if t is None else ptr(t)


def threads() -> int:
    """Threads for one C call: torch's intra-op setting, shared by all work."""
    return max(1, torch.get_num_threads())


__all__ = [
    "DTYPE_CODES",
    "REDUCTION_CODES",
    "_C",
    "check_nbr",
    "compute_dtype",
    "device_type",
    "optional_ptr",
    "ptr",
    "require_cpu",
    "threads",
]
