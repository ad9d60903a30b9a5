"""Fuzz target: legacy checkpoint archives through convert-checkpoint's reader.

libFuzzer mutates the bytes of small ``torch.save`` archives (fuzz/corpus/checkpoint/:
plain and wrapped state dicts, an expanded-tensor bomb, an archive with a duplicate
entry). Each input is written to a file and read the way ``convert-checkpoint`` reads it
(``read_legacy_checkpoint``: the regular-file check, the archive's entry names and
CRCs, the weights-only unpickler), then converted with a kernel spec naming every
``*.kernel`` entry. The memory budget is 64 MiB during the call, so no input can make
the converter allocate more. The contract: a bad archive raises ``ValueError`` (a
``ConversionError``) or ``TypeError`` with a message; a converted result holds only
contiguous tensors that own their storage, within the budget. Anything else (a torch
``RuntimeError``, ``MemoryError``, an expanded tensor reaching the output) is a finding.
"""

from __future__ import annotations

import os
import sys
import tempfile

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

import torch_lattice as tl
from fuzz._common import Finding, main, require_clean
from torch_lattice.migration.convert import convert_state_dict
from torch_lattice.migration.loading import read_legacy_checkpoint

CLEAN = (ValueError, TypeError)
BUDGET = 64 * 2**20


def _spec(state: dict[str, object]) -> dict[str, list[int]]:
    """A kernel spec for every legacy kernel: a cube when the row count is one."""
    spec = {}
    for key, value in state.items():
        if key == "kernel" or key.endswith(".kernel"):
            rows = value.shape[0] if isinstance(value, torch.Tensor) and value.dim() else 1
            side = round(rows ** (1 / 3))
            spec[key] = [side] * 3 if side**3 == rows else [max(1, rows), 1, 1]
    return spec


def _convert(path: str) -> None:
    checkpoint = read_legacy_checkpoint(path)
    result = convert_state_dict(checkpoint.state_dict, _spec(checkpoint.state_dict))
    total = 0
    for key, t in result.state_dict.items():
        nbytes = t.numel() * t.element_size()
        if not t.is_contiguous() or t.untyped_storage().nbytes() != nbytes:
            raise Finding(f"converted {key!r} does not own exactly its elements")
        total += nbytes
    if total > BUDGET:
        raise Finding(f"converted {total} bytes past the {BUDGET}-byte budget")


def check(data: bytes) -> None:
    previous = tl.set_memory_budget(BUDGET)
    try:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "legacy.pt")
            with open(path, "wb") as f:
                f.write(data)
            require_clean(lambda: _convert(path), CLEAN)
    finally:
        tl.set_memory_budget(previous)


if __name__ == "__main__":
    main(check)
