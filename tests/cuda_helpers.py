"""Inputs shared by the CUDA-versus-CPU tests (tests/*/test_cuda*.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch

import torch_lattice.ops  # noqa: F401  (registers the lattice ops the helpers call)
from torch_lattice.geometry import ConvGeometry
from torch_lattice.ops import conv_cuda

# benchmarks/ sits beside tests/; a plain `pytest` run does not put the root on sys.path.
ROOT = str(Path(__file__).resolve().parent.parent)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.gpu_accuracy import smooth_activations  # noqa: E402

__all__ = [
    "cpu_support",
    "geometry_lists",
    "kernel_ran",
    "kernels_run",
    "patterned_nbr",
    "pending_without",
    "random_coords",
    "smooth_activations",
    "table_reference",
    "workspace_request",
]


def random_coords(n: int, side: int, seed: int, batches: int = 2) -> torch.Tensor:
    """About ``n`` unique int32 rows ``(b, x, y, z)`` in ``[0, side)``, shuffled."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(0, side, (n, 4), generator=g)
    c[:, 0] %= batches
    c = torch.unique(c, dim=0)
    return c[torch.randperm(c.shape[0], generator=g)].to(torch.int32)


def geometry_lists(geometry: ConvGeometry) -> tuple[list[int], ...]:
    """``(kernel_size, stride, padding, dilation)`` as the ops take them."""
    return tuple(list(v) for v in geometry.as_c())


def cpu_support(coords: torch.Tensor, geometry: ConvGeometry, side: int) -> torch.Tensor:
    """Output support on the CPU: the input for stride 1, else the generated one."""
    if geometry.stride == (1, 1, 1):
        return coords
    rng = list(geometry.output_range((side, side, side)))
    return torch.ops.lattice.generate_support(coords, *geometry_lists(geometry), rng, 2)


class _Asked(Exception):
    """Raised by workspace_request's alloc: the entry point stops before any CUDA call."""


def workspace_request(call: Callable[[Callable[[int], int]], object]) -> int:
    """Bytes a CUDA entry point asks its ``alloc`` for, host-only (no GPU needed).

    ``call(alloc)`` runs the entry point with ``alloc``, which records the size and
    raises, so nothing launches. An entry point that needs no workspace never calls
    alloc; given null data pointers, its host checks then refuse it (ValueError)
    before any CUDA call, and the request is 0."""
    asked: list[int] = []

    def alloc(nbytes: int) -> int:
        asked.append(nbytes)
        raise _Asked

    try:
        call(alloc)
    except _Asked:
        return asked[0]
    except ValueError:
        return 0
    raise AssertionError("the entry point ran: pass null data pointers")


def pending_without(*changes: str) -> str:
    """A ``TORCH_LATTICE_CUDA_PENDING`` value that turns on every pending change but
    ``changes``: a baseline that runs the same kernels as ``1`` and differs from it only in
    what ``changes`` do (the device check runs with ``1``, and pending kernels may differ
    from the previous ones in rounding)."""
    return ",".join(c for c in conv_cuda.PENDING_CHANGES if c not in changes)


def kernels_run(fn: Callable[[], object]) -> tuple[object, set[str]]:
    """``fn()`` on the GPU and the names of the CUDA kernels it launched (torch.profiler),
    so that a test meant for one kernel cannot pass on another."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = fn()
        torch.cuda.synchronize()
    return out, {e.name for e in prof.events()}


def kernel_ran(fn: Callable[[], torch.Tensor], kernel: str) -> tuple[torch.Tensor, bool]:
    """``fn()`` on the GPU and whether a kernel whose name holds ``kernel`` ran in it."""
    out, names = kernels_run(fn)
    return out, any(kernel in n for n in names)  # type: ignore[return-value]


def patterned_nbr(n_in: int, n_out: int, k: int, seed: int) -> torch.Tensor:
    """(n_out, k) table whose rows draw their neighbour masks from a few dozen patterns,
    shuffled, plus random rows, rows with no neighbour and rows with all k neighbours."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.rand(40, k, generator=g) < 0.3
    patterns[:, k // 2] = True  # the centre, as in a submanifold convolution
    keep = patterns[torch.randint(0, 40, (n_out,), generator=g)]
    kind = torch.randint(0, 8, (n_out,), generator=g)
    keep[kind == 0] = False  # mask 0: y row must be zero
    keep[kind == 1] = True  # every kernel row
    noisy = kind == 2
    keep[noisy] = torch.rand(int(noisy.sum()), k, generator=g) < 0.5
    nbr = torch.randint(0, n_in, (n_out, k), generator=g, dtype=torch.int32)
    return torch.where(keep, nbr, torch.full_like(nbr, -1))


def table_reference(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, nbr: torch.Tensor):
    """float64 forward and weight gradient from nbr (inputs already storage-rounded)."""
    x, w, dy = x.double(), w.double(), dy.double()
    y = torch.zeros(nbr.shape[0], w.shape[2], dtype=torch.float64)
    dw = torch.zeros_like(w)
    for n in range(nbr.shape[1]):
        rows = torch.nonzero(nbr[:, n] >= 0).flatten()
        if rows.numel() == 0:
            continue
        xi = x[nbr[rows, n].long()]
        y[rows] += xi @ w[n]
        dw[n] = xi.T @ dy[rows]
    return y, dw
