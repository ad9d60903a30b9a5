"""Generative transposes over pair lists built without the (N_out, K) table (issue 21).

Invariant: the pair lists of ``build_transpose_pairs(fine, coarse, g)`` equal
``KernelMap.pairs(transposed=True)`` of the same relation, i.e. per kernel row ``n`` the
pairs ``(i, t)`` with ``fine[t] == coarse[i] * stride - padding + r_n * dilation``, sorted
by ``t``; so the pair dataflows give bitwise the same numbers as the kernel-map route, and
implicit GEMM (which switches to gather-scatter beyond ``DENSE_SLOTS_PER_PAIR``) the same
within float rounding.  Memory then grows with ``N_in x K``, not ``N_out x K``.
"""

from __future__ import annotations

import pytest
import torch
from dense_oracle import dense_conv_transpose_at

import torch_lattice as tl
from torch_lattice import nn as tnn
from torch_lattice.geometry import ConvGeometry
from torch_lattice.memory_budget import MemoryBudgetError
from torch_lattice.nn import functional as F
from torch_lattice.nn.functional.config import resolve_config
from torch_lattice.nn.functional.conv_transpose import transpose_onto
from torch_lattice.nn.functional.supports import generated_transposed_support, generative_support
from torch_lattice.ops.kmap import (
    DENSE_SLOTS_PER_PAIR,
    build_kernel_map,
    build_transpose_pairs,
)

GEOMETRIES = [((2, 2, 2), (2, 2, 2)), ((3, 3, 3), (2, 2, 2)), ((2, 3, 1), (2, 1, 3)),
              ((4, 4, 4), (4, 4, 4)), ((5, 4, 3), (3, 3, 3))]


def _input(seed: int, n: int = 30, channels: int = 3, stride=(12, 12, 12)) -> tl.SparseTensor:
    g = torch.Generator().manual_seed(seed)
    rows = torch.cat([torch.randint(0, 2, (3 * n, 1), generator=g),
                      torch.randint(0, 6, (3 * n, 3), generator=g)], dim=1)
    rows = torch.unique(rows, dim=0)[:n]
    rows = rows[torch.randperm(len(rows), generator=g)]  # unsorted input rows
    feats = torch.randn(len(rows), channels, dtype=torch.float64, generator=g)
    return tl.SparseTensor(feats.requires_grad_(), rows.to(torch.int32), stride=stride)


def _run(x: tl.SparseTensor, weight: torch.Tensor, bias: torch.Tensor, g: ConvGeometry,
         flow: F.Dataflow, route: str):
    """Output, input and weight gradients through the public function or the map route."""
    x.feats.grad = None
    weight.grad = None
    cfg = F.ConvConfig(dataflow=flow)
    if route == "public":
        y = F.generative_conv_transpose3d(x, weight, bias, g.kernel_size, g.stride, config=cfg)
        feats, coords = y.feats, y.coords
    else:
        target = generative_support(x.support, g)
        feats = transpose_onto(x, weight, target, g, resolve_config(cfg)) + bias
        coords = target.coords
    torch.manual_seed(7)
    feats.backward(torch.randn_like(feats))
    return feats.detach(), coords, x.feats.grad.clone(), weight.grad.clone()


@pytest.mark.parametrize("ks,stride", GEOMETRIES)
@pytest.mark.parametrize("flow", list(F.Dataflow), ids=lambda f: f.name)
def test_pair_route_matches_kernel_map_route(ks, stride, flow):
    g = ConvGeometry.create(ks, stride)
    for seed in range(3):
        x = _input(seed)
        gw = torch.Generator().manual_seed(100 + seed)
        weight = torch.randn(g.volume, 3, 2, dtype=torch.float64, generator=gw)
        weight.requires_grad_()
        bias = torch.randn(2, dtype=torch.float64, generator=gw)
        new = _run(x, weight, bias, g, flow, "public")
        old = _run(x, weight, bias, g, flow, "map")
        assert torch.equal(new[1], old[1])
        n_in, n_out = len(x), len(new[1])
        switched = n_in + n_out > DENSE_SLOTS_PER_PAIR * n_in
        for a, b in zip((new[0], new[2], new[3]), (old[0], old[2], old[3]), strict=True):
            if flow is F.Dataflow.ImplicitGEMM and switched:
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
            else:
                assert torch.equal(a, b)
        sizes = x.coordinate_manager.cache_sizes()
        # The public route never built the (N_out, K) map unless implicit GEMM kept it.
        pairs_route = flow is not F.Dataflow.ImplicitGEMM or switched
        assert sizes["transpose_pairs"] == int(pairs_route)


def test_pair_lists_equal_the_kernel_maps():
    g = ConvGeometry.create((3, 2, 3), (2, 2, 3))
    x = _input(5)
    fine = generative_support(x.support, g).coords
    want = build_kernel_map(fine, x.coords, g).pairs(transposed=True)
    got = build_transpose_pairs(fine, x.coords, g)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_pair_route_matches_dense_oracle():
    g = ConvGeometry.create((4, 4, 4), (4, 4, 4))  # switches implicit GEMM to the pairs
    x = _input(9, stride=(4, 4, 4))
    weight = torch.randn(g.volume, 3, 2, dtype=torch.float64)
    y = F.generative_conv_transpose3d(x, weight, None, g.kernel_size, g.stride)
    want = dense_conv_transpose_at(x.feats.detach(), x.coords, weight, None, y.coords,
                                   g.kernel_size, g.stride)
    torch.testing.assert_close(y.feats, want, rtol=1e-12, atol=1e-12)


def test_one_row_32_cubed_fits_a_budget_the_table_would_exceed():
    """One row through a 32^3 GenerativeConvTranspose3d: 2^15 pairs; the dense route
    would need (2^15 + 1) x 2^15 x 4 bytes (4 GiB) of tables."""
    previous = tl.set_memory_budget(64 * 2**20)
    try:
        up = tnn.GenerativeConvTranspose3d(2, 3, kernel_size=32, stride=32, bias=True).double()
        feats = torch.randn(1, 2, dtype=torch.float64, requires_grad=True)
        x = tl.SparseTensor(feats, torch.tensor([[0, 1, 2, 3]], dtype=torch.int32), stride=32)
        y = up(x)
        # Fine rows 32 * c + r in z-fastest kernel order: output row n is kernel row n.
        r = torch.stack(torch.meshgrid(*[torch.arange(32)] * 3, indexing="ij"), -1).reshape(-1, 3)
        assert torch.equal(y.coords[:, 1:].long(), r + torch.tensor([32, 64, 96]))
        want = torch.einsum("c,kcd->kd", feats[0].detach(), up.weight.detach()) + up.bias.detach()
        torch.testing.assert_close(y.feats, want, rtol=1e-12, atol=1e-12)
        grad = torch.randn_like(y.feats)
        y.feats.backward(grad)
        torch.testing.assert_close(feats.grad[0], torch.einsum("kcd,kd->c", up.weight.detach(),
                                                               grad), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(up.weight.grad, feats[0].detach()[None, :, None] * grad[:, None],
                                   rtol=1e-12, atol=1e-12)
        assert x.coordinate_manager.cache_sizes()["kernel_maps"] == 0
        target = generative_support(x.support, ConvGeometry.create(32, 32))
        with pytest.raises(MemoryBudgetError, match=r"kernel map \(1 output rows, 32768 input"):
            build_kernel_map(target.coords, x.coords, ConvGeometry.create(32, 32))
    finally:
        tl.set_memory_budget(previous)


@pytest.mark.parametrize("ks,stride", [((4, 4, 4), (4, 4, 4)), ((4, 3, 6), (2, 3, 6))])
def test_pool_transpose_pair_route_matches_kernel_map_route(ks, stride, monkeypatch):
    """pool_transpose3d without a target onto a mostly-empty table: the pair route
    (taken: building a kernel map would fail here) against pool_avg over the kernel map."""
    from torch_lattice.ops import kmap as kmap_module
    from torch_lattice.ops.pool import pool_avg

    def no_map(*args):
        raise AssertionError("the pair route builds no kernel map")

    g = ConvGeometry.create(ks, stride)
    for seed in range(3):
        x = _input(seed)
        with monkeypatch.context() as m:
            m.setattr(kmap_module, "build_kernel_map", no_map)
            y = F.pool_transpose3d(x, ks, stride, expand_coordinates=True)
        torch.manual_seed(seed)
        grad = torch.randn_like(y.feats)
        (dx,) = torch.autograd.grad(y.feats, x.feats, grad)
        kmap = build_kernel_map(y.coords, x.coords, g)
        want = pool_avg(x.feats, kmap.rev, kmap.nbr)
        (want_dx,) = torch.autograd.grad(want, x.feats, grad)
        # The same sums in the same (kernel-row) order: bitwise equal.
        assert torch.equal(y.feats, want)
        assert torch.equal(dx, want_dx)


def test_pool_transpose_32_cubed_fits_a_budget_the_table_would_exceed():
    previous = tl.set_memory_budget(64 * 2**20)
    try:
        feats = torch.randn(1, 2, dtype=torch.float64, requires_grad=True)
        x = tl.SparseTensor(feats, torch.tensor([[0, 1, 2, 3]], dtype=torch.int32), stride=32)
        y = F.pool_transpose3d(x, 32, 32, expand_coordinates=True)
        assert y.feats.shape == (32**3, 2) and torch.equal(y.feats, feats.detach().expand(32**3, 2))
        y.feats.sum().backward()
        assert torch.equal(feats.grad, torch.full((1, 2), float(32**3), dtype=torch.float64))
    finally:
        tl.set_memory_budget(previous)


@pytest.mark.parametrize("ks,stride,padding", [((3, 3, 3), (2, 2, 2), (0, 0, 0)),
                                               ((4, 2, 3), (2, 2, 3), (0, 0, 0))])
def test_transpose_onto_a_generated_target_matches_the_map_route(ks, stride, padding):
    """conv_transpose3d onto generated_transposed_support's rows (replay's no-target
    transpose): the recorded expansion runs over pair lists; the same rows passed as a
    plain tensor take the kernel-map route; bitwise the same (both gather-scatter)."""
    g = ConvGeometry.create(ks, stride, padding)
    x = _input(3)
    target = generated_transposed_support(x, g, "conv_transpose3d")
    weight = torch.randn(g.volume, 3, 2, dtype=torch.float64, requires_grad=True)
    outs = []
    for coords in (target, target.coords.clone()):
        y = F.conv_transpose3d(x, weight, None, ks, stride, padding, coordinates=coords)
        torch.manual_seed(0)
        grads = torch.autograd.grad(y.feats, (x.feats, weight), torch.randn_like(y.feats))
        outs.append((y.feats, *grads))
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)
    sizes = x.coordinate_manager.cache_sizes()
    assert sizes["transient"] == 2  # one pair-list entry and one kernel map, not two maps


def test_transpose_onto_a_generated_32_cubed_target_fits_a_small_budget():
    previous = tl.set_memory_budget(64 * 2**20)
    try:
        g = ConvGeometry.create(32, 32)
        x = tl.SparseTensor(torch.ones(1, 1), torch.tensor([[0, 1, 2, 3]], dtype=torch.int32),
                            stride=32)
        target = generated_transposed_support(x, g, "conv_transpose3d")
        weight = torch.arange(32.0**3).reshape(-1, 1, 1)
        y = F.conv_transpose3d(x, weight, None, 32, 32, coordinates=target)
        assert torch.equal(y.feats[:, 0], weight[:, 0, 0])  # fine row n is kernel row n
        with pytest.raises(MemoryBudgetError, match=r"kernel map"):
            F.conv_transpose3d(x, weight, None, 32, 32, coordinates=target.coords.clone())
    finally:
        tl.set_memory_budget(previous)
