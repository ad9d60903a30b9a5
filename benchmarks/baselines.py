"""Baselines the library is timed against, all in the same process on the same data.

- :func:`torch_kernel_map`: the neighbour table built with torch ops only (packed int64
  keys, one sort, ``searchsorted`` per kernel row).
- :func:`gather_scatter_conv`: plain PyTorch gather, mm, scatter (``index_select``,
  ``mm``, ``index_add_``) per kernel row; its backward is torch autograd.
- :func:`dense_subm_conv`: scatter into a dense grid, ``torch.nn.functional.conv3d``,
  gather back; only where the grid fits in memory.
- :func:`mm_proxy`: one ``torch.mm`` with the convolution's FLOPs, the physical-limit proxy.
- :class:`SpconvSubm`: spconv 2.x's CPU build when it is importable (optional extra),
  called with torch at :data:`SPCONV_THREADS` threads (:func:`with_threads`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as tnf

from torch_lattice.geometry import ConvGeometry, kernel_positions

__all__ = [
    "DENSE_MAX_ELEMENTS",
    "SPCONV_THREADS",
    "SpconvSubm",
    "canonical_weight",
    "dense_grid",
    "dense_subm_conv",
    "dense_weight",
    "gather_scatter_conv",
    "mm_proxy",
    "pair_keys",
    "pairs_from_nbr",
    "spconv_pair_keys",
    "spconv_status",
    "spconv_subm_indices",
    "spconv_weight",
    "swap_pairs",
    "torch_kernel_map",
    "torch_threads",
    "with_threads",
]

# Largest dense input grid (elements) the dense baseline allocates: 2**28 float32 is
# 1 GiB for the input, as much again for the output.
DENSE_MAX_ELEMENTS = 2**28

# spconv 2.3.8's CPU forward returns wrong sums when torch runs more than one thread
# (measured here: most calls wrong at 2 threads, none at 1; the thread count of the OpenMP
# runtime spconv bundles makes no difference). It is only timed where it is right.
SPCONV_THREADS = 1

Pairs = list[tuple[torch.Tensor, torch.Tensor]]
T = TypeVar("T")


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """``torch.set_num_threads(n)`` inside the block; the previous count is restored after,
    also when the block raises."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"threads: must be an int >= 1, got {n!r}")
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def with_threads(fn: Callable[[], T], n: int) -> Callable[[], T]:
    """``fn`` run at ``n`` torch threads on each call (for one baseline only)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"threads: must be an int >= 1, got {n!r}")

    def run() -> T:
        with torch_threads(n):
            return fn()

    return run


def _pack(b: torch.Tensor, xyz: torch.Tensor, ext: list[int]) -> torch.Tensor:
    """int64 key ``((b*X + x)*Y + y)*Z + z`` of rows inside ``ext = [B, X, Y, Z]``."""
    return ((b * ext[1] + xyz[:, 0]) * ext[2] + xyz[:, 1]) * ext[3] + xyz[:, 2]


def torch_kernel_map(
    in_coords: torch.Tensor, out_coords: torch.Tensor, geometry: ConvGeometry
) -> torch.Tensor:
    """Neighbour table with torch ops: sorted keys and ``searchsorted``.

    Args:
        in_coords: ``(N_in, 4)`` int32 unique rows.
        out_coords: ``(N_out, 4)`` int32 rows.
        geometry: ``input = output*stride - padding + r*dilation``.

    Returns:
        ``(N_out, K)`` int32, ``nbr[o, n] = i`` or -1: the library's ``nbr`` format.
    """
    inc, outc = in_coords.long(), out_coords.long()
    k = geometry.volume
    nbr = torch.full((outc.shape[0], k), -1, dtype=torch.int32)
    if inc.shape[0] == 0 or outc.shape[0] == 0:
        return nbr
    ext = (inc.amax(dim=0) + 1).tolist()
    keys, order = torch.sort(_pack(inc[:, 0], inc[:, 1:], ext))
    stride = torch.tensor(geometry.stride)
    base = outc[:, 1:] * stride - torch.tensor(geometry.padding)
    offsets = kernel_positions(geometry.kernel_size).long() * torch.tensor(geometry.dilation)
    hi = torch.tensor(ext[1:])
    for n in range(k):
        q = base + offsets[n]
        valid = ((q >= 0) & (q < hi)).all(dim=1) & (outc[:, 0] < ext[0])
        qk = torch.where(valid, _pack(outc[:, 0], q, ext), -1)
        pos = torch.searchsorted(keys, qk).clamp_(max=keys.shape[0] - 1)
        hit = valid & (keys[pos] == qk)
        nbr[:, n] = torch.where(hit, order[pos], -1).to(torch.int32)
    return nbr


def pairs_from_nbr(nbr: torch.Tensor) -> Pairs:
    """Per kernel row ``n``: ``(in_rows, out_rows)`` int64 with ``nbr[out, n] == in``."""
    pairs = []
    for n in range(nbr.shape[1]):
        col = nbr[:, n]
        out_rows = torch.nonzero(col >= 0).squeeze(1)
        pairs.append((col[out_rows].long(), out_rows))
    return pairs


def swap_pairs(pairs: Pairs) -> Pairs:
    """The transposed relation (what a transposed convolution runs)."""
    return [(o, i) for i, o in pairs]


def gather_scatter_conv(
    x: torch.Tensor, weight: torch.Tensor, pairs: Pairs, n_out: int
) -> torch.Tensor:
    """``y[o] = sum_n x[i] @ weight[n]`` over each kernel row's pairs, in plain PyTorch.

    Args:
        x: ``(N_in, C_in)``.
        weight: ``(K, C_in, C_out)``.
        pairs: ``K`` pairs ``(in_rows, out_rows)``.
        n_out: Output rows.

    Returns:
        ``(n_out, C_out)``; differentiable through torch autograd.
    """
    y = x.new_zeros((n_out, weight.shape[2]))
    for n, (i, o) in enumerate(pairs):
        if i.numel():
            y.index_add_(0, o, torch.mm(x.index_select(0, i), weight[n]))
    return y


def dense_weight(weight: torch.Tensor, kernel_size: tuple[int, int, int]) -> torch.Tensor:
    """``(C_out, C_in, Kx, Ky, Kz)`` conv3d weight from ``(K, C_in, C_out)`` (z fastest)."""
    kx, ky, kz = kernel_size
    return weight.reshape(kx, ky, kz, weight.shape[1], weight.shape[2]).permute(4, 3, 0, 1, 2)


def dense_grid(coords: torch.Tensor, channels: int) -> list[int] | None:
    """``[B, X, Y, Z]`` of the dense grid, or None when it exceeds the memory cap."""
    ext = (coords.long().amax(dim=0) + 1).tolist()
    if math.prod(ext) * channels > DENSE_MAX_ELEMENTS:
        return None
    return ext


def dense_subm_conv(
    x: torch.Tensor, coords: torch.Tensor, weight5: torch.Tensor, grid: list[int]
) -> torch.Tensor:
    """Submanifold conv through a dense grid: scatter, ``conv3d``, gather at ``coords``.

    Args:
        x: ``(N, C_in)`` features.
        coords: ``(N, 4)`` int64 rows.
        weight5: ``(C_out, C_in, Kx, Ky, Kz)`` odd kernel.
        grid: ``[B, X, Y, Z]``.
    """
    b, gx, gy, gz = grid
    dense = x.new_zeros((b, gx, gy, gz, x.shape[1]))
    idx = (coords[:, 0], coords[:, 1], coords[:, 2], coords[:, 3])
    dense = dense.index_put(idx, x).permute(0, 4, 1, 2, 3)
    pad = tuple(k // 2 for k in weight5.shape[2:])
    out = tnf.conv3d(dense, weight5, padding=pad)
    return out.permute(0, 2, 3, 4, 1)[idx]


@dataclass(frozen=True)
class MatmulProxy:
    """Operands of one ``torch.mm`` and the FLOPs it performs."""

    a: torch.Tensor
    b: torch.Tensor

    @property
    def flops(self) -> int:
        return 2 * self.a.shape[0] * self.a.shape[1] * self.b.shape[1]

    def run(self) -> torch.Tensor:
        return torch.mm(self.a, self.b)


def mm_proxy(pairs: int, c_in: int, c_out: int, square: bool) -> MatmulProxy:
    """One matmul with ``2 * pairs * c_in * c_out`` FLOPs.

    ``square=False`` is the dense GEMM the convolution would be with its gathers
    removed: ``(pairs, c_in) @ (c_in, c_out)``.  ``square=True`` spends the same FLOPs
    on an ``n x n x n`` product, which runs near the machine's peak.
    """
    if square:
        n = max(1, round((pairs * c_in * c_out) ** (1 / 3)))
        return MatmulProxy(torch.randn(n, n), torch.randn(n, n))
    return MatmulProxy(torch.randn(max(1, pairs), c_in), torch.randn(c_in, c_out))


def spconv_status() -> str | None:
    """None when ``spconv.pytorch`` imports, else why not (shown in the report)."""
    try:
        import spconv.pytorch  # noqa: F401
    except Exception as exc:  # any import failure means "not available"
        return f"not available ({type(exc).__name__}: {exc})"[:160]
    return None


def pair_keys(nbr: torch.Tensor) -> torch.Tensor:
    """Every (output, input) pair of a neighbour table as sorted int64 keys
    ``out * N_in + in``: the relation without the order of its kernel rows, which a
    baseline may number its own way (the coordinates fix each pair's offset)."""
    out, n = torch.nonzero(nbr >= 0, as_tuple=True)
    keys = out.long() * nbr.shape[0] + nbr[out, n].long()
    return torch.sort(keys).values


def spconv_subm_indices(coords: torch.Tensor) -> Callable[[], object]:
    """spconv 2.x's index generation for a 3x3x3 submanifold map (its CPU ``Native``
    algorithm), as a timed callable returning its raw result."""
    import spconv.pytorch.ops as sops
    from spconv.core import ConvAlgo

    c = coords.int().contiguous()
    ext = (c.long().amax(dim=0) + 1).tolist()
    one = [1, 1, 1]
    return lambda: sops.get_indice_pairs(
        c, ext[0], ext[1:], ConvAlgo.Native, [3, 3, 3], one, one, one, [0, 0, 0], True, False
    )


def spconv_strided_indices(
    coords: torch.Tensor, geometry: ConvGeometry
) -> Callable[[], object]:
    """spconv 2.x's index generation for a strided (support-generating) map, its CPU
    ``Native`` algorithm: the output rows and the pairs in one call."""
    import spconv.pytorch.ops as sops
    from spconv.core import ConvAlgo

    c = coords.int().contiguous()
    ext = (c.long().amax(dim=0) + 1).tolist()
    g = geometry
    return lambda: sops.get_indice_pairs(
        c, ext[0], ext[1:], ConvAlgo.Native, list(g.kernel_size), list(g.stride),
        list(g.padding), list(g.dilation), [0, 0, 0], False, False,
    )


def coord_pair_keys(out_coords: torch.Tensor, out_rows: torch.Tensor,
                    in_rows: torch.Tensor, n_in: int) -> torch.Tensor:
    """Sorted int64 keys ``pack(output coordinate) * n_in + input row`` of a relation's
    pairs: the relation without either side's numbering of output rows or kernel rows
    (a generated support is numbered in each library's own order)."""
    oc = out_coords.long()[out_rows.long()]
    ext = [int(v) + 1 for v in out_coords.long().amax(dim=0).tolist()] if oc.numel() else [1] * 4
    return torch.sort(_pack(oc[:, 0], oc[:, 1:], ext) * n_in + in_rows.long()).values


def spconv_strided_pair_keys(result: tuple, n_in: int) -> torch.Tensor:
    """:func:`coord_pair_keys` of spconv's strided result ``(out_coords, pairs, counts)``;
    ``pairs[0, k]`` are input rows, ``pairs[1, k]`` output rows."""
    out_coords, pairs, counts = result
    kept = [pairs[:, k, : int(m)] for k, m in enumerate(counts.tolist()) if m > 0]
    both = torch.cat(kept, dim=1).long() if kept else torch.empty(2, 0, dtype=torch.long)
    return coord_pair_keys(out_coords, both[1], both[0], n_in)


def spconv_pair_keys(result: tuple, n: int) -> torch.Tensor:
    """:func:`pair_keys` of spconv's submanifold result: it lists one pair of each mirror
    pair (``i`` feeds ``o`` through r iff ``o`` feeds ``i`` through -r) and not the
    centre, so both directions and the centre are added back."""
    _, pairs, counts = result
    kept = [pairs[:, k, : int(m)] for k, m in enumerate(counts.tolist()) if m > 0]
    both = torch.cat(kept, dim=1).long() if kept else torch.empty(2, 0, dtype=torch.long)
    rows = torch.arange(n)
    out = torch.cat([both[1], both[0], rows])
    inp = torch.cat([both[0], both[1], rows])
    return torch.sort(out * n + inp).values


def _reads_as_matrix(layer: torch.nn.Module) -> bool:
    """spconv 2.3's pointwise layers multiply by their weight's memory read as a
    ``(C_in, C_out)`` matrix, whatever the declared ``(C_out, 1, 1, 1, C_in)`` shape says."""
    import spconv.pytorch.conv as spconv_conv

    return bool(getattr(layer, "conv1x1", False)) and not spconv_conv.FILTER_HWIO


def spconv_weight(layer: torch.nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """The canonical ``(K, C_in, C_out)`` weight (kernel rows x-major, as spconv's) as
    spconv ``layer``'s weight: spconv 2.x's ``(C_out, kx, ky, kz, C_in)`` layout."""
    _, c_in, c_out = weight.shape
    if _reads_as_matrix(layer):
        return weight.reshape(layer.weight.shape).contiguous()
    kernel = tuple(layer.weight.shape[1:4])
    return weight.reshape(*kernel, c_in, c_out).permute(4, 0, 1, 2, 3).contiguous()


def canonical_weight(layer: torch.nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """spconv ``layer``'s weight (or its gradient) in the canonical ``(K, C_in, C_out)``
    layout."""
    c_out, c_in = weight.shape[0], weight.shape[-1]
    if _reads_as_matrix(layer):
        return weight.reshape(1, c_in, c_out)
    return weight.permute(1, 2, 3, 4, 0).reshape(-1, c_in, c_out)


class SpconvSubm:
    """spconv 2.x ``SubMConv3d`` (no bias) holding the same weight as the library layer.

    spconv's CPU build asserts in eval mode when a bias is present, so the layer is
    built without one. Its index pairs are built on the first call and reused after, as
    the library's kernel map is.
    """

    def __init__(self, coords: torch.Tensor, weight: torch.Tensor) -> None:
        import spconv.pytorch as sp

        _, c_in, c_out = weight.shape
        self.conv = sp.SubMConv3d(c_in, c_out, 3, bias=False, indice_key="bench")
        self.conv.to(device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            self.conv.weight.copy_(spconv_weight(self.conv, weight))
        ext = (coords.long().amax(dim=0) + 1).tolist()
        first = sp.SparseConvTensor(
            torch.zeros(coords.shape[0], c_in, device=weight.device, dtype=weight.dtype),
            coords.int().contiguous(),
            ext[1:],
            ext[0],
        )
        self._primed = self.conv(first)

    def weight_grad(self) -> torch.Tensor | None:
        """The gradient of spconv's weight in the canonical ``(K, C_in, C_out)`` layout."""
        g = self.conv.weight.grad
        return None if g is None else canonical_weight(self.conv, g)

    def tensor(self, feats: torch.Tensor):
        """An input over the primed indices, so the call reuses spconv's index pairs."""
        return self._primed.replace_feature(feats)

    def __call__(self, feats: torch.Tensor) -> torch.Tensor:
        return self.conv(self.tensor(feats)).features
