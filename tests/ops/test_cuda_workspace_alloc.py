"""The workspace of a CUDA entry point: one call into C that sizes its workspace itself and
asks Python's ``alloc(nbytes) -> int`` for it (torch_lattice.ops._runtime.workspace_alloc).

Host-only: these run in a CUDA build on a machine without a GPU, where every call stops at
the CUDA runtime after its host-side checks (tests/ops/test_cuda_voxel_pool.py checks the same for
the voxel, pooling and generative wrappers).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from torch_lattice.ops import conv_cuda, kmap_cuda
from torch_lattice.ops._runtime import _C

pytestmark = pytest.mark.skipif(
    not _C.cuda_compiled() or torch.cuda.is_available(),
    reason="needs a CUDA build on a machine where CUDA cannot run",
)

COORDS = torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2]], dtype=torch.int32)
GEOM = ((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1))


def _host_alloc(device: torch.device) -> Callable[[int], int]:
    """Host buffers, 256-byte aligned as the C side checks."""
    held: list[torch.Tensor] = []

    def alloc(nbytes: int) -> int:
        held.append(torch.empty(nbytes + 256, dtype=torch.uint8))
        return held[-1].data_ptr() + (-held[-1].data_ptr()) % 256

    return alloc


def test_wrappers_pass_the_host_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every map and convolution wrapper (kmap_cuda.py, conv_cuda.py) gets as far as the
    CUDA runtime: its arguments, in the order the entry point parses them, pass the host
    checks, and the alloc it passes is called for the workspace."""
    for module in (kmap_cuda, conv_cuda):
        monkeypatch.setattr(module, "require_cuda", lambda op, *t: torch.device("cpu"))
        monkeypatch.setattr(module, "call_args", lambda device: (0, 0))
        monkeypatch.setattr(module, "workspace_alloc", _host_alloc)
    nbr = torch.zeros((2, 27), dtype=torch.int32)
    x, w, y = torch.randn(2, 4), torch.randn(27, 4, 4), torch.zeros(2, 4)
    offsets, rows = torch.zeros(28, dtype=torch.int64), torch.zeros(3, dtype=torch.int32)
    sizes = (2, 2, 27, 4, 4)
    down = ((3, 3, 3), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    calls = [
        lambda: kmap_cuda.generate_support(COORDS, down, (4, 4, 4), 1),
        lambda: kmap_cuda.kernel_map(COORDS, COORDS, GEOM),
        lambda: kmap_cuda.kernel_pairs(nbr),
        lambda: conv_cuda._run("implicit_gemm", False, x, w, sizes, nbr, None, y, False),
        lambda: conv_cuda._run(
            "fetch_on_demand", True, x, y, sizes, None, (offsets, rows, rows), w, False
        ),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="CUDA error in tl_cuda_"):
            call()


def test_alloc_errors_propagate() -> None:
    """What alloc raises (torch's out-of-memory error, say) is the call's exception, and
    a null pointer from it is refused before any CUDA call."""

    def out_of_memory(nbytes: int) -> int:
        raise torch.OutOfMemoryError(f"no room for {nbytes} bytes")

    ptr = COORDS.data_ptr()
    with pytest.raises(torch.OutOfMemoryError, match="no room for"):
        _C.cuda_kmap_build(0, 0, ptr, 2, ptr, 2, GEOM, out_of_memory, 0)
    with pytest.raises(ValueError, match=r"cuda_kmap_build: alloc\(\d+\) returned a null"):
        _C.cuda_kmap_build(0, 0, ptr, 2, ptr, 2, GEOM, lambda nbytes: 0, 0)
