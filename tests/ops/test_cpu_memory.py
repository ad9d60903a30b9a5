"""tl.reuse_cpu_memory: freed CPU memory is kept and reused (glibc), results do not
change, and its argument is checked. The setting is process-wide: the reuse test runs
in fresh interpreters, the results test puts glibc's default values back."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_lattice as tl

GLIBC = platform.libc_ver()[0] == "glibc"

# Run in a fresh interpreter: the setting is process-wide, and a process whose main
# thread once failed an allocation (as bad-input tests do on purpose) allocates from
# another glibc arena, where blocks over 64 MiB always get their own mmap.
_FAULTS = """
import resource, sys, torch
import torch_lattice as tl

MIB = 2**20

def faults_of_fresh_tensor():
    # A 72 MiB block written and freed, then a 64 MiB one (it fits in the freed block
    # even where small allocations landed above it): minor page faults of the second.
    first = torch.empty(72 * MIB // 4)
    first.fill_(1.0)
    del first
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    second = torch.empty(64 * MIB // 4)
    second.fill_(2.0)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    return after - before

torch.ones(1 << 20).fill_(0.0)  # start the thread pool first
setting = None if sys.argv[1] == "none" else int(sys.argv[1])
print(tl.reuse_cpu_memory(setting), faults_of_fresh_tensor())
"""


def _faults(setting: str) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS, setting], capture_output=True, text=True, check=True
    )
    applied, faults = out.stdout.split()
    return applied == "True", int(faults)


def _thp_always() -> bool:
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return path.exists() and "[always]" in path.read_text()


@pytest.mark.skipif(not GLIBC, reason="reuse_cpu_memory sets glibc's malloc")
def test_freed_memory_is_reused() -> None:
    if not _thp_always():
        # Without it every 4 KiB page of the new block faults (16,384 of them), so the
        # count below measures reuse, not huge pages.
        applied, fresh = _faults("none")
        assert applied and fresh > 64 * 2**20 // 4096 // 2
    applied, faults = _faults(str(1 << 30))
    assert applied
    assert faults < 1000


@pytest.mark.skipif(not GLIBC, reason="reuse_cpu_memory sets glibc's malloc")
def test_results_are_unchanged() -> None:
    coords = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0]], dtype=torch.int32)
    torch.manual_seed(0)
    conv = tl.nn.SubmConv3d(4, 8, 3)
    feats = torch.randn(3, 4)
    want = conv(tl.SparseTensor(feats, coords)).feats
    try:
        assert tl.reuse_cpu_memory(2**31 - 1) is True
        assert torch.equal(conv(tl.SparseTensor(feats, coords)).feats, want)
    finally:
        tl.reuse_cpu_memory(None)


@pytest.mark.parametrize("bad", [True, 1.5, "1G", [1]])
def test_max_block_type(bad: object) -> None:
    with pytest.raises(TypeError, match=r"reuse_cpu_memory: max_block must be an int"):
        tl.reuse_cpu_memory(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, 2**31, 2**64])
def test_max_block_range(bad: int) -> None:
    with pytest.raises(ValueError, match=r"max_block must be in \[1, 2\*\*31 - 1\]"):
        tl.reuse_cpu_memory(bad)
