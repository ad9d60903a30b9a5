"""Sparse pooling against a direct oracle.

Invariant: for output q (the support Conv3d generates for the same geometry) and the set
S(q) = {i : in[i] == q*stride - padding + r_n*dilation for some kernel row n, same batch},
  sum:  y[q] = sum_{i in S(q)} x[i];  avg: sum / |S(q)|;  max: max_{i in S(q)} x[i].
"""

from __future__ import annotations

import itertools

import pytest
import torch

import torch_lattice as tl
from torch_lattice.geometry import ConvGeometry
from torch_lattice.nn import functional as F
from torch_lattice.nn.functional.relation import kernel_map
from torch_lattice.nn.functional.supports import generated_support
from torch_lattice.ops.pool import pool_avg, pool_max, pool_sum


def random_tensor(n=60, extent=7, channels=3, seed=0, dtype=torch.float64, batches=2):
    g = torch.Generator().manual_seed(seed)
    rows = torch.cat(
        [
            torch.randint(0, batches, (4 * n, 1), generator=g),
            torch.randint(0, extent, (4 * n, 3), generator=g),
        ],
        1,
    )
    coords = torch.unique(rows, dim=0)[torch.randperm(len(torch.unique(rows, dim=0)), generator=g)][
        :n
    ]
    feats = torch.randn(len(coords), channels, generator=g, dtype=dtype)
    return tl.SparseTensor(feats, coords)


def oracle(x, out_coords, geometry, mode):
    table = {tuple(r): i for i, r in enumerate(x.coords.tolist())}
    ks, s, p, d = geometry.as_c()
    out = torch.zeros(len(out_coords), x.feats.shape[1], dtype=x.feats.dtype)
    for o, (b, *q) in enumerate(out_coords.tolist()):
        rows = []
        for r in itertools.product(*(range(k) for k in ks)):
            key = (b, *(q[a] * s[a] - p[a] + r[a] * d[a] for a in range(3)))
            if key in table:
                rows.append(table[key])
        vals = x.feats[rows]
        if rows:
            out[o] = {"sum": vals.sum(0), "avg": vals.mean(0), "max": vals.amax(0)}[mode]
    return out


FUNCS = {"max": F.max_pool3d, "avg": F.avg_pool3d, "sum": F.sum_pool3d}
GEOMS = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(3, 1, 2), stride=(1, 2, 2), dilation=(2, 1, 1)),
    dict(kernel_size=3, stride=1, padding=1),
]


@pytest.mark.parametrize("mode", ["max", "avg", "sum"])
@pytest.mark.parametrize("geom", GEOMS)
def test_pool_matches_oracle_and_conv_support(mode, geom):
    x = random_tensor()
    y = FUNCS[mode](x, **geom)
    stride = geom.get("stride", geom["kernel_size"])
    geometry = ConvGeometry.create(
        geom["kernel_size"], stride, geom.get("padding", 0), geom.get("dilation", 1)
    )
    conv = tl.nn.Conv3d(
        3, 2, geometry.kernel_size, geometry.stride, geometry.padding, geometry.dilation
    ).double()
    z = conv(x)
    assert y.support is z.support  # same cached generated support
    assert y.stride == tuple(s * t for s, t in zip(x.stride, geometry.stride, strict=True))
    torch.testing.assert_close(y.feats, oracle(x, y.coords, geometry, mode), rtol=1e-12, atol=1e-12)


def test_pool_shares_cached_kernel_map_with_conv():
    x = random_tensor(seed=1)
    conv = tl.nn.Conv3d(3, 4, kernel_size=2, stride=2).double()
    conv(x)
    builds = x.coordinate_manager.builds
    pool = tl.nn.MaxPool3d(2)
    y1, y2 = pool(x), tl.nn.AvgPool3d(2, stride=2)(x)
    assert x.coordinate_manager.builds == builds
    assert y1.support is y2.support


def test_pool_spatial_range_and_identity():
    x = random_tensor(seed=2)
    x = tl.SparseTensor(x.feats, x.coords, spatial_range=(2, 9, 9, 9))
    y = tl.nn.SumPool3d(3, stride=2)(x)
    assert y.spatial_range == (2, 4, 4, 4)
    same = tl.nn.MaxPool3d(1, stride=1)(x)
    assert same.support is x.support and torch.equal(same.feats, x.feats)


@pytest.mark.parametrize("mode", ["max", "avg", "sum"])
def test_pool_gradcheck(mode):
    x = random_tensor(n=25, extent=4, channels=2, seed=3)
    feats = x.feats.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda f: FUNCS[mode](x.replace(f), kernel_size=3, stride=2, padding=1).feats, (feats,)
    )


def test_pool_ops_opcheck():
    x = random_tensor(n=30, extent=4, seed=4)
    feats = x.feats.detach().clone().requires_grad_(True)
    geometry = ConvGeometry.create(2, 2)
    target = generated_support(x.support, geometry)
    kmap = kernel_map(x.support, target, geometry)
    for op in (pool_sum, pool_avg, pool_max):
        torch.library.opcheck(op, (feats, kmap.nbr, kmap.rev))


def test_pool_half_and_float32():
    x = random_tensor(seed=5, dtype=torch.float32)
    ref = F.avg_pool3d(x, 2)
    half = F.avg_pool3d(x.half(), 2)
    assert half.feats.dtype == torch.float16
    torch.testing.assert_close(half.feats.float(), ref.feats, rtol=1e-2, atol=1e-2)


def test_max_pool_gradient_goes_to_argmax():
    coords = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1]])
    feats = torch.tensor([[1.0, 5.0], [3.0, 2.0], [3.0, -1.0]], requires_grad=True)
    y = F.max_pool3d(tl.SparseTensor(feats, coords), 2)
    assert y.feats.tolist() == [[3.0, 5.0]]
    y.feats.sum().backward()
    # Ties go to the first kernel row: (1, 0, 0) is row 4, (0, 1, 1) is row 3.
    assert feats.grad.tolist() == [[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]]


def test_global_pools():
    x = random_tensor(seed=6)
    x = tl.SparseTensor(x.feats, x.coords, spatial_range=(3, 7, 7, 7))
    avg = tl.nn.GlobalAvgPool()(x)
    mx = tl.nn.GlobalMaxPool()(x)
    assert avg.shape == (3, 3) and mx.shape == (3, 3)
    for b in range(2):
        rows = x.coords[:, 0] == b
        torch.testing.assert_close(avg[b], x.feats[rows].mean(0))
        torch.testing.assert_close(mx[b], x.feats[rows].amax(0))
    assert (avg[2] == 0).all() and (mx[2] == 0).all()  # empty batch
    feats = x.feats.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda f: F.global_avg_pool(x.replace(f)), (feats,))


def test_pool_errors():
    x = random_tensor(seed=7)
    with pytest.raises(ValueError, match="does not fit"):
        F.max_pool3d(x, kernel_size=9)
    with pytest.raises(ValueError, match="kernel_size"):
        tl.nn.MaxPool3d(0)
    with pytest.raises(ValueError, match="stride"):
        tl.nn.AvgPool3d(2, stride=0)
    with pytest.raises(TypeError, match="SparseTensor"):
        F.sum_pool3d(x.feats, 2)
    with pytest.raises(TypeError, match="SparseTensor"):
        tl.nn.GlobalMaxPool()(x.feats)


def test_outputs_of_expanded_features_are_sized_first() -> None:
    """Features expanded to 2e9 channels from 4 bytes of storage: pooling, its transpose,
    trilinear upsampling and devoxelize refuse the output by the memory budget before
    allocating it (torch's allocator was asked for 16-360 GB)."""
    from torch_lattice.memory_budget import MemoryBudgetError

    x = tl.SparseTensor(torch.zeros(1, 1).expand(2, 2 * 10**9),
                        torch.tensor([[0, 1, 1, 1], [0, 2, 1, 1]]), stride=2)
    calls = {
        "max pooling": lambda: F.max_pool3d(x, 2, 2),
        "pool_transpose3d": lambda: F.pool_transpose3d(x, 2),
        "trilinear_upsample3d": lambda: F.trilinear_upsample3d(x, 2),
        "devoxelize": lambda: tl.devoxelize(torch.rand(3, 3) * 4, x, voxel_size=0.5),
    }
    for op, call in calls.items():
        with pytest.raises(MemoryBudgetError, match=rf"^{op} output \(\d+ (rows|points) x "):
            call()
