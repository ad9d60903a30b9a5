"""voxelize / devoxelize / collate against plain-torch references.

Invariants:
- voxelize: coords == unique{(b, floor((p - origin) / voxel_size))} sorted by (b, x, y, z);
  feats[v] == reduce{features[p] : voxel(p) == v}.
- devoxelize nearest: out[p] == feats[voxel(p)] or 0 when absent.
- devoxelize trilinear: out[p] == sum over the 8 corners c = floor(u) + d, u = (p - origin)/e - 0.5,
  of prod(frac or 1 - frac) * feats[c], absent corners contributing 0.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import torch_lattice as tl
from torch_lattice.ops.voxel import devoxel_gather, voxel_reduce


def reference_voxelize(points, feats, batch, size, origin, reduction):
    """Plain torch: floor, unique rows, scatter reductions (float64)."""
    size = torch.as_tensor(size, dtype=torch.float64)
    origin = torch.as_tensor(origin, dtype=torch.float64)
    grid = torch.floor((points.double() - origin) / size).long()
    b = torch.zeros(len(points), dtype=torch.long) if batch is None else batch.long()
    rows = torch.cat([b[:, None], grid], dim=1)
    uniq, inverse = torch.unique(rows, dim=0, return_inverse=True)
    index = inverse[:, None].expand_as(feats)
    out = feats.new_zeros((len(uniq), feats.shape[1]))
    reduce = {"mean": "mean", "sum": "sum", "max": "amax"}[reduction]
    out = out.scatter_reduce(0, index, feats, reduce=reduce, include_self=False)
    return uniq.int(), out


def reference_devoxelize(points, coords, feats, batch, size, origin, trilinear):
    table = {tuple(r): i for i, r in enumerate(coords.tolist())}
    size = torch.as_tensor(size, dtype=torch.float64)
    u = (points.double() - torch.as_tensor(origin, dtype=torch.float64)) / size
    out = torch.zeros(len(points), feats.shape[1], dtype=feats.dtype)
    for p in range(len(points)):
        b = 0 if batch is None else int(batch[p])
        if not trilinear:
            row = table.get((b, *torch.floor(u[p]).long().tolist()))
            if row is not None:
                out[p] = feats[row]
            continue
        base = torch.floor(u[p] - 0.5)
        frac = u[p] - 0.5 - base
        for d in itertools.product((0, 1), repeat=3):
            dt = torch.tensor(d, dtype=torch.float64)
            w = torch.prod(torch.where(dt > 0, frac, 1 - frac))
            row = table.get((b, *(base + dt).long().tolist()))
            if row is not None:
                out[p] += w.to(feats.dtype) * feats[row]
    return out


def cloud(n=400, seed=0, scale=6.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    points = (torch.rand(n, 3, generator=g, dtype=torch.float64) * scale).to(dtype)
    feats = torch.randn(n, 3, generator=g, dtype=torch.float64)
    batch = torch.randint(0, 3, (n,), generator=g)
    return points, feats, batch


@pytest.mark.parametrize("reduction", ["mean", "sum", "max"])
@pytest.mark.parametrize("batched", [False, True])
def test_voxelize_matches_reference(reduction, batched):
    points, feats, batch = cloud()
    batch = batch if batched else None
    size, origin = (0.7, 1.1, 0.5), (-0.5, 0.0, -1.25)
    x = tl.voxelize(
        points, feats, batch_indices=batch, voxel_size=size, origin=origin, reduction=reduction
    )
    coords, ref = reference_voxelize(points, feats, batch, size, origin, reduction)
    assert torch.equal(x.coords, coords)
    assert x.coords.dtype == torch.int32 and x.stride == (1, 1, 1)
    torch.testing.assert_close(x.feats, ref, rtol=1e-12, atol=1e-12)


def test_voxelize_exact_boundaries_and_float32():
    # Points exactly on voxel faces belong to the upper voxel (floor).
    points = torch.tensor([[0.0, 0.0, 0.0], [0.5, 1.0, 1.5], [0.49, 0.99, 1.49]])
    x = tl.voxelize(points, torch.ones(3, 1), voxel_size=0.5, reduction="sum")
    assert x.coords.tolist() == [[0, 0, 0, 0], [0, 0, 1, 2], [0, 1, 2, 3]]
    assert x.feats.dtype == torch.float32
    assert x.feats.squeeze(1).tolist() == [1.0, 1.0, 1.0]


def test_voxelize_sorted_unique_large():
    points, feats, batch = cloud(n=5000, seed=3, scale=20.0, dtype=torch.float32)
    x = tl.voxelize(points, feats.float(), batch_indices=batch, voxel_size=0.9)
    coords, _ = reference_voxelize(points, feats.float(), batch, (0.9,) * 3, (0.0,) * 3, "mean")
    assert torch.equal(x.coords, coords)


def test_voxelize_deterministic_across_threads():
    points, feats, batch = cloud(n=3000, seed=4)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a = tl.voxelize(points, feats, batch_indices=batch, voxel_size=0.4)
        torch.set_num_threads(2)
        b = tl.voxelize(points, feats, batch_indices=batch, voxel_size=0.4)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(a.coords, b.coords) and torch.equal(a.feats, b.feats)


@pytest.mark.parametrize("reduction", ["mean", "sum", "max"])
def test_voxelize_gradcheck(reduction):
    points, feats, batch = cloud(n=40, seed=5, scale=2.0)
    feats.requires_grad_(True)

    def fn(f):
        return tl.voxelize(
            points, f, batch_indices=batch, voxel_size=0.8, reduction=reduction
        ).feats

    assert torch.autograd.gradcheck(fn, (feats,))


def test_voxel_ops_opcheck():
    feats = torch.randn(30, 2, dtype=torch.float64, requires_grad=True)
    inverse = torch.randint(0, 7, (30,))
    inverse[:7] = torch.arange(7)
    for reduction in ("mean", "sum", "max"):
        torch.library.opcheck(voxel_reduce, (feats, inverse, 7, reduction))
    idx = torch.randint(-1, 7, (30, 8))
    w = torch.rand(30, 8, dtype=torch.float64)
    vfeats = torch.randn(7, 2, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(devoxel_gather, (vfeats, idx, w))


def test_voxelize_errors():
    points, feats, _ = cloud(n=10)
    with pytest.raises(ValueError, match="origin"):
        tl.voxelize(points - 1.0, feats)
    with pytest.raises(ValueError, match="origin"):
        tl.voxelize(points, feats, origin=3.0)
    bad = points.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        tl.voxelize(bad, feats)
    with pytest.raises(ValueError, match="int32"):
        tl.voxelize(points * 1e12, feats, voxel_size=1e-3)
    with pytest.raises(ValueError, match="reduction"):
        tl.voxelize(points, feats, reduction="median")
    with pytest.raises(ValueError, match="voxel_size"):
        tl.voxelize(points, feats, voxel_size=0.0)
    with pytest.raises(ValueError, match=r"\(P, 3\)"):
        tl.voxelize(points[:, :2], feats)
    with pytest.raises(ValueError, match="features"):
        tl.voxelize(points, feats[:5])
    with pytest.raises(ValueError, match="batch_indices"):
        tl.voxelize(points, feats, batch_indices=-torch.ones(10, dtype=torch.long))
    with pytest.raises(TypeError, match="batch_indices"):
        tl.voxelize(points, feats, batch_indices=torch.zeros(10))
    assert torch.isfinite(points).all()  # inputs untouched


@pytest.mark.parametrize("trilinear", [False, True])
def test_devoxelize_matches_reference(trilinear):
    points, feats, batch = cloud(n=300, seed=6)
    size, origin = (0.6, 0.6, 0.9), (0.0, -0.3, 0.0)
    x = tl.voxelize(points, feats, batch_indices=batch, voxel_size=size, origin=origin)
    # Drop every third voxel so some points and corners are absent.
    keep = torch.arange(len(x)) % 3 != 0
    sub = tl.SparseTensor(x.feats[keep], x.coords[keep])
    mode = "trilinear" if trilinear else "nearest"
    out = tl.devoxelize(
        points, sub, batch_indices=batch, voxel_size=size, origin=origin, interpolation=mode
    )
    ref = reference_devoxelize(points, sub.coords, sub.feats, batch, size, origin, trilinear)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    if not trilinear:
        assert (out[~keep[_voxel_of(points, batch, x, size, origin)]] == 0).all()


def _voxel_of(points, batch, x, size, origin):
    table = {tuple(r): i for i, r in enumerate(x.coords.tolist())}
    grid = torch.floor((points - torch.tensor(origin)) / torch.tensor(size)).long()
    rows = torch.cat([batch[:, None], grid], 1).tolist()
    return torch.tensor([table[tuple(r)] for r in rows])


def test_devoxelize_roundtrip_and_centres():
    points, feats, batch = cloud(n=200, seed=7)
    x = tl.voxelize(points, feats, batch_indices=batch, voxel_size=0.5)
    back = tl.devoxelize(points, x, batch_indices=batch, voxel_size=0.5)
    torch.testing.assert_close(back, x.feats[_voxel_of(points, batch, x, (0.5,) * 3, (0,) * 3)])
    # A point at a voxel centre reads exactly that voxel in trilinear mode.
    centres = (x.coords[:, 1:].double() + 0.5) * 0.5
    tri = tl.devoxelize(
        centres, x, batch_indices=x.coords[:, 0], voxel_size=0.5, interpolation="trilinear"
    )
    torch.testing.assert_close(tri, x.feats, rtol=0, atol=1e-15)
    # exactly, even beside a voxel holding inf or NaN (its weight 0 gave 0 * inf = NaN)
    coords = torch.tensor([[0, 1, 1, 1], [0, 2, 1, 1], [0, 1, 2, 1]], dtype=torch.int32)
    for odd in (math.inf, -math.inf, math.nan):
        v = tl.SparseTensor(torch.tensor([[1.0], [odd], [odd]], dtype=torch.float64), coords)
        got = tl.devoxelize(torch.tensor([[1.5, 1.5, 1.5]], dtype=torch.float64), v,
                            interpolation="trilinear")
        assert got.tolist() == [[1.0]], odd


def test_devoxelize_trilinear_reproduces_linear_field_inside_full_grid():
    # On a full grid the weights sum to 1 and a linear field is reproduced exactly.
    axes = torch.arange(6, dtype=torch.float64)
    grid = torch.stack(torch.meshgrid(axes, axes, axes, indexing="ij"), -1).reshape(-1, 3)
    coords = torch.cat([torch.zeros(len(grid), 1), grid], 1).int()
    field = (grid + 0.5) @ torch.tensor([[1.0], [-2.0], [0.5]], dtype=torch.float64)
    x = tl.SparseTensor(field, coords)
    q = 0.5 + torch.rand(50, 3, dtype=torch.float64) * 5.0
    out = tl.devoxelize(q, x, interpolation="trilinear")
    torch.testing.assert_close(out, q @ torch.tensor([[1.0], [-2.0], [0.5]], dtype=torch.float64))


def test_devoxelize_uses_tensor_stride():
    points = torch.tensor([[0.2, 0.2, 0.2], [1.5, 0.1, 0.1], [2.5, 0.1, 0.1]], dtype=torch.float64)
    coarse = tl.SparseTensor(
        torch.tensor([[1.0], [2.0]], dtype=torch.float64),
        torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0]]),
        stride=2,
    )
    out = tl.devoxelize(points, coarse, voxel_size=1.0)
    assert out.squeeze(1).tolist() == [1.0, 1.0, 2.0]


def test_devoxelize_gradcheck():
    points, feats, batch = cloud(n=30, seed=8, scale=2.0)
    x = tl.voxelize(points, feats, batch_indices=batch, voxel_size=0.7)
    vf = x.feats.detach().clone().requires_grad_(True)
    for mode in ("nearest", "trilinear"):

        def fn(f, mode=mode):
            return tl.devoxelize(
                points, x.replace(f), batch_indices=batch, voxel_size=0.7, interpolation=mode
            )

        assert torch.autograd.gradcheck(fn, (vf,))


def test_devoxelize_errors():
    points, feats, _ = cloud(n=10)
    x = tl.voxelize(points, feats)
    with pytest.raises(ValueError, match="origin"):
        tl.devoxelize(points - 10.0, x)
    with pytest.raises(ValueError, match="interpolation"):
        tl.devoxelize(points, x, interpolation="cubic")
    with pytest.raises(TypeError, match="SparseTensor"):
        tl.devoxelize(points, x.feats)


def test_collate_equals_batched_voxelize():
    clouds = [cloud(n=n, seed=s) for n, s in ((50, 1), (80, 2), (30, 3))]
    pts = [c[0] for c in clouds]
    fts = [c[1] for c in clouds]
    x = tl.collate(pts, fts, voxel_size=0.5, reduction="max")
    batch = torch.cat([torch.full((len(p),), i) for i, p in enumerate(pts)])
    ref = tl.voxelize(
        torch.cat(pts), torch.cat(fts), batch_indices=batch, voxel_size=0.5, reduction="max"
    )
    assert torch.equal(x.coords, ref.coords) and torch.equal(x.feats, ref.feats)
    assert sorted(set(x.coords[:, 0].tolist())) == [0, 1, 2]
    with pytest.raises(ValueError, match="collate"):
        tl.collate(pts, fts[:2])


@pytest.mark.parametrize("interpolation", ["nearest", "trilinear"])
def test_devoxelize_points_that_require_grad(interpolation: str) -> None:
    """Points that require grad (a learned offset, say) are read as positions, not
    differentiated: backward reaches the voxel features, and points.grad stays None (it
    raised "no autograd formula" for lattice.devoxel_map)."""
    g = torch.Generator().manual_seed(5)
    feats = torch.randn(20, 2, generator=g, dtype=torch.float64, requires_grad=True)
    voxels = tl.voxelize(torch.rand(20, 3, generator=g, dtype=torch.float64) * 3, feats)
    points = (torch.rand(6, 3, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    out = tl.devoxelize(points, voxels, interpolation=interpolation)
    want = tl.devoxelize(points.detach(), voxels, interpolation=interpolation)
    assert torch.equal(out, want)
    out.sum().backward()
    assert points.grad is None and feats.grad is not None


@pytest.mark.parametrize("name", ["voxel_size", "origin"])
def test_grid_arguments_are_sized_before_they_are_read(name: str) -> None:
    """A tensor expanded to 10^9 values (4 bytes of storage) or a list of 10^7 is refused
    by its length, before .tolist() or the message would take gigabytes."""
    points, feats = torch.rand(5, 3), torch.randn(5, 2)
    huge = torch.ones(1).expand(10**9)
    with pytest.raises(ValueError, match=rf"{name} must be .* tensor of shape \(1000000000,\)"):
        tl.voxelize(points, feats, **{name: huge})
    with pytest.raises(ValueError, match=rf"{name} must be .* a sequence of 10000000$"):
        tl.voxelize(points, feats, **{name: [1.0] * 10**7})
    voxels = tl.voxelize(points, feats)
    with pytest.raises(ValueError, match=rf"{name} must be .* tensor of shape"):
        tl.devoxelize(points, voxels, **{name: huge})


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float16, torch.bfloat16])
def test_low_level_voxel_ops_name_the_feature_dtype(dtype: torch.dtype) -> None:
    """The CPU kernels take float32 and float64 (tl.voxelize widens half types): others
    are a TypeError naming feats (an int gave KeyError, a half "not supported by this
    build")."""
    feats = torch.ones(3, 2).to(dtype)
    with pytest.raises(TypeError, match=r"voxel_reduce: feats must be float32, float64 on cpu"):
        voxel_reduce(feats, torch.zeros(3, dtype=torch.int64), 1, "mean")
    idx, w = torch.zeros(3, 1, dtype=torch.int64), torch.ones(3, 1, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"devoxel_gather: feats must be float32, float64"):
        devoxel_gather(feats, idx, w)
