"""The CPU instruction-set level tests run at (no tests here)."""

from __future__ import annotations

import os

from torch_lattice.ops._runtime import _C


def widest_isa() -> str:
    """The CPU's widest instruction set, whatever TORCH_LATTICE_CPU_ISA says."""
    saved = os.environ.pop("TORCH_LATTICE_CPU_ISA", None)
    try:
        return _C.cpu_isa()
    finally:
        if saved is not None:
            os.environ["TORCH_LATTICE_CPU_ISA"] = saved
