"""The bridge to ``torch_lattice._C``: device checks, pointers, threads."""

from __future__ import annotations

import torch

from torch_lattice import _C

# dtype codes of enum tl_dtype in csrc/tl_conv.h
DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}


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


def ptr(t: torch.Tensor) -> int:
    """Data pointer of a contiguous tensor (0 when empty)."""
    if not t.is_contiguous():
        raise ValueError("internal error: tensor passed to the C core must be contiguous")
    return t.data_ptr() if t.numel() else 0


def threads() -> int:
    """Threads for one C call: torch's intra-op setting, shared by all work."""
    return max(1, torch.get_num_threads())


__all__ = ["DTYPE_CODES", "_C", "device_type", "ptr", "require_cpu", "threads"]
