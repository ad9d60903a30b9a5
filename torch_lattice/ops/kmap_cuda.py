"""CUDA kernels of the kernel-map ops (``csrc/cuda``, ``torch_lattice._C.cuda_*``).

Strided and generative supports, neighbour tables and pair lists on a CUDA
device, registered here as the ``"cuda"`` kernels of the ops in
:mod:`torch_lattice.ops.kmap`; the formats are those of docs/kernel-maps.md,
identical to the CPU ops.  Each wrapper checks the device and the coordinate
rows, allocates outputs and workspace with torch on the tensors' device and
passes raw pointers, the device index and torch's current stream to C.  Only
sizes cross to the host (one count per data-dependent output).
"""

from __future__ import annotations

import torch

from torch_lattice.ops import kmap
from torch_lattice.ops._runtime import (
    _C,
    call_args,
    check_coords,
    check_non_negative,
    ptr,
    require_cuda,
    workspace_alloc,
)

__all__ = ["Geom", "generate_support", "generative_support", "kernel_map", "kernel_pairs"]

Geom = tuple[tuple[int, int, int], tuple[int, int, int], tuple[int, int, int], tuple[int, int, int]]


def _check_coords(op: str, name: str, coords: torch.Tensor) -> torch.Tensor:
    check_coords(op, name, coords)
    return coords.contiguous()


def generate_support(
    coords: torch.Tensor, geom: Geom, out_range: tuple[int, int, int], num_batches: int
) -> torch.Tensor:
    """Output support of a strided convolution, as ``lattice::generate_support`` on CPU.

    Args:
        coords: ``(N, 4)`` int32 input rows ``(b, x, y, z)`` on a CUDA device.
        geom: ``(kernel_size, stride, padding, dilation)``, each a 3-tuple.
        out_range: output grid size per axis, each in ``[0, 2^31]`` (checked by the op).
        num_batches: number of batches (bounds the output size).

    Returns:
        ``(M, 4)`` int32, unique rows sorted by ``(b, x, y, z)``, on the same device.
    """
    device = require_cuda("generate_support", coords)
    coords = _check_coords("generate_support", "coords", coords)
    check_non_negative("generate_support", "coords", coords)
    kmap.check_num_batches("generate_support", coords, num_batches)
    rng = tuple(int(r) for r in out_range)
    n = coords.shape[0]
    bound = _C.generate_bound(n, geom, rng, num_batches)
    out = torch.empty((bound, 4), dtype=torch.int32, device=device)
    alloc = workspace_alloc(device)
    index, stream = call_args(device)
    m = _C.cuda_generate(index, stream, ptr(coords), n, geom, rng, alloc, ptr(out), bound)
    return out[:m].clone()


def kernel_map(
    in_coords: torch.Tensor, out_coords: torch.Tensor, geom: Geom
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neighbour tables ``(nbr (N_out, K), rev (N_in, K))`` int32, as ``lattice::kernel_map``.

    Raises:
        ValueError: If an input row repeats or has a negative entry.
    """
    device = require_cuda("kernel_map", in_coords, out_coords)
    in_coords = _check_coords("kernel_map", "in_coords", in_coords)
    out_coords = _check_coords("kernel_map", "out_coords", out_coords)
    k = geom[0][0] * geom[0][1] * geom[0][2]
    n_in, n_out = in_coords.shape[0], out_coords.shape[0]
    nbr = torch.empty((n_out, k), dtype=torch.int32, device=device)
    rev = torch.empty((n_in, k), dtype=torch.int32, device=device)
    alloc = workspace_alloc(device)
    index, stream = call_args(device)
    _C.cuda_kmap_build(
        index, stream, ptr(in_coords), n_in, ptr(out_coords), n_out, geom, alloc, ptr(nbr)
    )
    _C.cuda_kmap_reverse(index, stream, ptr(nbr), n_out, k, n_in, ptr(rev))
    return nbr, rev


def kernel_pairs(nbr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-kernel-row pair lists of a neighbour table (docs/kernel-maps.md).

    Args:
        nbr: ``(N_out, K)`` int32 neighbour table on a CUDA device.

    Returns:
        ``offsets`` ``(K + 1,)`` int64, ``pair_in`` and ``pair_out`` ``(P,)`` int32, all on
        the device; pairs of kernel row ``n`` are ``offsets[n]:offsets[n + 1]``, sorted by
        ``pair_out``.
    """
    device = require_cuda("kernel_pairs", nbr)
    if nbr.dtype != torch.int32 or nbr.dim() != 2:
        raise ValueError(f"kernel_pairs: nbr must be (N_out, K) int32, got {nbr.dtype}")
    nbr = nbr.contiguous()
    n_out, k = nbr.shape
    alloc = workspace_alloc(device)
    index, stream = call_args(device)
    # Only -1 means "no neighbour" (the CPU count refuses others). One pass over the
    # table and one more readback, once per map (kernel_pairs' result is cached with
    # it), so no cached-map forward or backward pays it.
    malformed = (nbr < -1).any()
    count = _C.cuda_pairs_count(index, stream, ptr(nbr), n_out, k, alloc)
    if bool(malformed):
        raise ValueError(kmap.bad_table_entries("kernel_pairs"))
    offsets = torch.empty((k + 1,), dtype=torch.int64, device=device)
    pair_in = torch.empty((count,), dtype=torch.int32, device=device)
    pair_out = torch.empty((count,), dtype=torch.int32, device=device)
    _C.cuda_pairs_build(
        index,
        stream,
        ptr(nbr),
        n_out,
        k,
        alloc,
        count,
        ptr(offsets),
        ptr(pair_in),
        ptr(pair_out),
    )
    return offsets, pair_in, pair_out


@kmap.generative_support.register_kernel("cuda")
def generative_support(
    coords: torch.Tensor, kernel_size: list[int], stride: list[int]
) -> torch.Tensor:
    """``unique{coords * stride + r}`` sorted, as ``lattice::generative_support`` on CPU."""
    kmap.check_geometry("generative_support", kernel_size=kernel_size, stride=stride)
    device = require_cuda("generative_support", coords)
    coords = _check_coords("generative_support", "coords", coords)
    geom = kmap.conv_geom(kernel_size, stride, [0, 0, 0], [1, 1, 1])
    n = coords.shape[0]
    alloc = workspace_alloc(device)
    cap = n * kernel_size[0] * kernel_size[1] * kernel_size[2]
    out = torch.empty((cap, 4), dtype=torch.int32, device=device)
    index, stream = call_args(device)
    m = _C.cuda_generative(index, stream, ptr(coords), n, geom, alloc, ptr(out), cap)
    return out[:m].clone()


# ---- the "cuda" kernels of the ops in kmap.py ----


@kmap.generate_support.register_kernel("cuda")
def _generate_support(coords, kernel_size, stride, padding, dilation, out_range, num_batches):
    kmap.check_geometry("generate_support", kernel_size=kernel_size, stride=stride,
                        padding=padding, dilation=dilation, out_range=out_range)  # fmt: skip
    geom = kmap.conv_geom(kernel_size, stride, padding, dilation)
    rng = tuple(out_range)
    kmap.generate_bound_within_budget(coords.shape[0], geom, rng, num_batches)
    return generate_support(coords, geom, rng, num_batches)


@kmap.kernel_map.register_kernel("cuda")
def _kernel_map(in_coords, out_coords, kernel_size, stride, padding, dilation):
    kmap.check_geometry("kernel_map", kernel_size=kernel_size, stride=stride, padding=padding,
                        dilation=dilation)  # fmt: skip
    kmap.check_table_budget("kernel map", out_coords, in_coords, kernel_size)
    return kernel_map(in_coords, out_coords, kmap.conv_geom(kernel_size, stride, padding, dilation))


@kmap.neighbour_table.register_kernel("cuda")
def _neighbour_table(in_coords, out_coords, kernel_size, stride, padding, dilation):
    kmap.check_geometry("neighbour_table", kernel_size=kernel_size, stride=stride,
                        padding=padding, dilation=dilation)  # fmt: skip
    kmap.check_table_budget("neighbour table", out_coords, in_coords, kernel_size)  # both built
    geom = kmap.conv_geom(kernel_size, stride, padding, dilation)
    return kernel_map(in_coords, out_coords, geom)[0]


kmap.kernel_pairs.register_kernel("cuda")(kernel_pairs)
