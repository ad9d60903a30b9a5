"""The bridge to ``torch_lattice._C``: device checks, pointers, threads."""

from __future__ import annotations

import torch

from torch_lattice import _C

# dtype codes of enum tl_dtype in csrc/tl_conv.h
DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}


def require_cpu(op: str, *tensors: torch.Tensor) -> None:
    """Raises for devices this build cannot run ``op`` on."""
    for t in tensors:
        if t.device.type != "cpu":
            raise RuntimeError(
                f"lattice::{op}: tensors on {t.device} are not supported yet; "
                "the CUDA kernels arrive with the dataflows work (move the tensor to CPU)"
            )


def ptr(t: torch.Tensor) -> int:
    """Data pointer of a contiguous tensor (0 when empty)."""
    if not t.is_contiguous():
        raise ValueError("internal error: tensor passed to the C core must be contiguous")
    return t.data_ptr() if t.numel() else 0


def threads() -> int:
    """Threads for one C call: torch's intra-op setting, shared by all work."""
    return max(1, torch.get_num_threads())


__all__ = ["DTYPE_CODES", "_C", "ptr", "require_cpu", "threads"]
