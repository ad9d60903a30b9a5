"""Helpers shared by the dense-oracle conformance tests.

Geometry cases and their ids and seeds, float64 modules with seeded weights, sparse
inputs whose features are autograd leaves, and the comparisons of a sparse result with
the dense oracle (values, gradients, supports, gradcheck).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch.func import functional_call

import torch_lattice as tl

try:
    import dense_oracle as oracle
except ImportError:  # tests/ may become a package; then it is imported through it
    from tests import dense_oracle as oracle

F64 = torch.float64
I32 = torch.int32
IntOrTriple = int | tuple[int, int, int]
RefFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


class Geo(NamedTuple):
    """One convolution geometry and input layout; ``in_stride`` is the input stride."""

    kernel: IntOrTriple
    stride: IntOrTriple = 1
    padding: IntOrTriple = 0
    dilation: IntOrTriple = 1
    batches: int = 1
    bias: bool = False
    extent: tuple[int, int, int] = (8, 8, 8)
    in_stride: IntOrTriple = 1
    density: float = 0.15


def coarse_geo(kernel: IntOrTriple, **kwargs: Any) -> Geo:
    """A ``Geo`` whose defaults suit a transposed convolution's coarse source (5^3, 0.2)."""
    kwargs.setdefault("extent", (5, 5, 5))
    kwargs.setdefault("density", 0.2)
    return Geo(kernel, **kwargs)


def geo_id(g: Geo) -> str:
    """Test id of a case; extent and density are left out."""
    return (
        f"k{g.kernel}-s{g.stride}-p{g.padding}-d{g.dilation}-b{g.batches}"
        f"-{'bias' if g.bias else 'nobias'}-is{g.in_stride}"
    ).replace(" ", "")


def strided_kwargs(g: Geo) -> dict[str, IntOrTriple]:
    """Module arguments of a strided case: kernel_size, stride, padding and dilation."""
    return dict(kernel_size=g.kernel, stride=g.stride, padding=g.padding, dilation=g.dilation)


def seed_of(g: Geo, salt: str = "") -> int:
    """Deterministic per-case seed (crc32, since str hashes are randomized)."""
    return zlib.crc32((geo_id(g) + salt).encode()) % 100_000


def mul3(a: IntOrTriple, b: IntOrTriple) -> tuple[int, int, int]:
    ta, tb = oracle.triple(a), oracle.triple(b)
    return (ta[0] * tb[0], ta[1] * tb[1], ta[2] * tb[2])


def div3(a: IntOrTriple, b: IntOrTriple) -> tuple[int, int, int]:
    ta, tb = oracle.triple(a), oracle.triple(b)
    assert all(x % y == 0 for x, y in zip(ta, tb, strict=True))
    return (ta[0] // tb[0], ta[1] // tb[1], ta[2] // tb[2])


def make_conv(
    cls: type[torch.nn.Module], cin: int, cout: int, seed: int, **kwargs: object
) -> torch.nn.Module:
    """Build a float64 module with random weights independent of its initializer."""
    conv = cls(cin, cout, **kwargs).to(F64)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen, dtype=F64))
        if conv.bias is not None:
            conv.bias.copy_(torch.randn(conv.bias.shape, generator=gen, dtype=F64))
    return conv


def sparse_input(
    feats: torch.Tensor,
    coords: torch.Tensor,
    stride: IntOrTriple = 1,
    spatial_range: Sequence[int] | None = None,
) -> tuple[torch.Tensor, tl.SparseTensor]:
    """A sparse tensor over a fresh leaf copy of ``feats``; returns (leaf, tensor)."""
    leaf = feats.clone().requires_grad_(True)
    sr = None if spatial_range is None else tuple(spatial_range)
    return leaf, tl.SparseTensor(leaf, coords, stride=stride, spatial_range=sr)


def total_builds(*tensors: tl.SparseTensor) -> int:
    """Kernel maps built so far over the distinct managers of ``tensors``."""
    managers = {id(t.coordinate_manager): t.coordinate_manager for t in tensors}
    return sum(m.builds for m in managers.values())


def assert_coords_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == I32
    assert actual.shape == expected.shape, f"{actual.shape} != {expected.shape}"
    assert torch.equal(actual.long(), expected.long())


def assert_close_scaled(
    actual: torch.Tensor,
    expected: torch.Tensor,
    what: str,
    *,
    rtol: float = 1e-10,
    atol: float = 1e-12,
) -> None:
    """assert_close in float64 with ``atol`` scaled by the magnitude of the reference."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    scale = max(1.0, float(expected.detach().abs().max())) if expected.numel() else 1.0
    torch.testing.assert_close(
        actual.detach().to(F64),
        expected.detach(),
        rtol=rtol,
        atol=atol * scale,
        msg=lambda m: f"{what}: {m}",
    )


def compare_with_oracle(
    conv: torch.nn.Module,
    leaf: torch.Tensor,
    out_feats: torch.Tensor,
    ref_fn: RefFn,
    *,
    grad_seed: int,
    rtol: float = 1e-10,
    atol: float = 1e-12,
) -> torch.Tensor:
    """Compare forward and backward of a sparse result with the dense oracle.

    ``leaf`` is the input-feature leaf of the sparse call, ``out_feats`` its output;
    ``ref_fn(feats, weight, bias)`` evaluates the oracle in float64 on copies. The
    upstream gradient is drawn from a generator seeded with ``grad_seed``. Gradients
    wrt feats, weight and bias must match too. Returns the oracle output (detached).
    """
    ref_feats = leaf.detach().to(F64, copy=True).requires_grad_(True)
    ref_w = conv.weight.detach().to(F64, copy=True).requires_grad_(True)
    ref_b = None
    if conv.bias is not None:
        ref_b = conv.bias.detach().to(F64, copy=True).requires_grad_(True)
    ref = ref_fn(ref_feats, ref_w, ref_b)

    assert out_feats.dtype == leaf.dtype
    assert_close_scaled(out_feats, ref, "forward", rtol=rtol, atol=atol)

    # A random upstream gradient exercises every output row independently.
    gen = torch.Generator().manual_seed(grad_seed)
    grad = torch.randn(ref.shape, generator=gen, dtype=F64)
    (out_feats * grad.to(out_feats.dtype)).sum().backward()
    (ref * grad).sum().backward()
    assert leaf.grad is not None and conv.weight.grad is not None
    assert_close_scaled(leaf.grad, ref_feats.grad, "grad feats", rtol=rtol, atol=atol)
    assert_close_scaled(conv.weight.grad, ref_w.grad, "grad weight", rtol=rtol, atol=atol)
    if ref_b is not None:
        assert conv.bias.grad is not None
        assert_close_scaled(conv.bias.grad, ref_b.grad, "grad bias", rtol=rtol, atol=atol)
    return ref.detach()


def transpose_target(
    seed: int, src_coords: torch.Tensor, geo: Geo
) -> tuple[torch.Tensor, set[tuple[int, ...]]]:
    """Shuffled fine target of a transpose: about half reachable rows, half unreached.

    Returns (rows (M, 4) int32, the set of rows the source reaches).
    """
    reach = oracle.transpose_reach(src_coords, geo.kernel, geo.stride, geo.padding, geo.dilation)
    gen = torch.Generator().manual_seed(seed)
    reached = sorted(reach)
    n_hit = max(1, len(reached) // 2)
    hit = [reached[i] for i in torch.randperm(len(reached), generator=gen)[:n_hit].tolist()]
    k, s, d = oracle.triple(geo.kernel), oracle.triple(geo.stride), oracle.triple(geo.dilation)
    box = [geo.extent[a] * s[a] + d[a] * (k[a] - 1) + 2 for a in range(3)]
    cand = torch.stack(
        [torch.randint(0, geo.batches, (4 * n_hit,), generator=gen)]
        + [torch.randint(0, box[a], (4 * n_hit,), generator=gen) for a in range(3)],
        dim=1,
    )
    miss: list[tuple[int, ...]] = []
    for row in map(tuple, cand.tolist()):
        if row not in reach and row not in miss and len(miss) < n_hit:
            miss.append(row)
    rows = torch.tensor(hit + miss, dtype=torch.int64)
    rows = rows[torch.randperm(rows.shape[0], generator=gen)]
    if oracle.is_sorted(rows):
        rows = rows.flip(0)
    return rows.to(I32), reach


def gradcheck_module(
    conv: torch.nn.Module, x: tl.SparseTensor, *args: object, rtol: float = 1e-5
) -> None:
    """gradcheck of ``conv(x, *args).feats`` wrt x's feats, the weight and the bias."""

    def f(feats: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        params = {"weight": weight, "bias": bias}
        return functional_call(conv, params, (x.replace(feats), *args)).feats

    inputs = (
        x.feats.detach().clone().requires_grad_(True),
        conv.weight.detach().clone().requires_grad_(True),
        conv.bias.detach().clone().requires_grad_(True),
    )
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=rtol)
