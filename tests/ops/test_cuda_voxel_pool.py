"""CUDA-versus-CPU parity of voxelization, pooling and generative supports
(csrc/cuda/tl_cuda_voxel.cu, tl_cuda_pool.cu, tl_cuda_generative.cu through
torch_lattice.ops.voxel_cuda, pool_cuda and kmap_cuda).

Integer outputs (voxel rows, inverse maps, devoxel rows, argmax, generated supports) must
equal the CPU's exactly, in the same order.  Floating outputs:

- pooling walks kernel rows in the CPU's order with the CPU's accumulator type, so fp32
  and fp64 results are bit-identical, and half types (fp32 accumulation, one rounding)
  equal the CPU path that computes them in fp32 and casts;
- voxel_reduce / devoxel_gather in fp64 add in the CPU's order in double: bit-identical
  (gather up to one rounding: the CPU may order the multiply-adds differently);
- in fp32 the GPU accumulates in fp32 where the CPU uses double: ``rtol = 1e-5``;
- devoxel weights are computed in double with the CPU's operations: ``rtol = 1e-12``.

Errors raised for bad points, duplicate voxel rows and bad generative inputs carry the
same message on both devices.  Tests needing a GPU are skipped without one; the last
tests check the errors raised where CUDA kernels cannot run.
"""

from __future__ import annotations

import copy

import pytest
import torch

import torch_lattice as tl
from torch_lattice.geometry import ConvGeometry
from torch_lattice.ops import kmap, kmap_cuda, pool, pool_cuda, voxel, voxel_cuda
from torch_lattice.ops._runtime import _C

try:
    from cuda_helpers import smooth_activations, workspace_request
except ImportError:  # tests/ may become a package; then it is imported through it
    from tests.cuda_helpers import smooth_activations, workspace_request

pytestmark = pytest.mark.cuda
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
ops = torch.ops.lattice


def _cloud(n: int, seed: int, dtype=torch.float32, extent: float = 8.0, batches: int = 3):
    g = torch.Generator().manual_seed(seed)
    pts = (torch.rand((n, 3), generator=g, dtype=torch.float64) * extent).to(dtype)
    batch = torch.randint(0, batches, (n,), generator=g)
    return pts, batch


def _feats(n: int, c: int, seed: int, dtype=torch.float32, ties: bool = False):
    g = torch.Generator().manual_seed(seed)
    if ties:  # few distinct values: argmax ties everywhere
        return torch.randint(-3, 4, (n, c), generator=g).to(dtype)
    return torch.randn((n, c), generator=g, dtype=torch.float64).to(dtype)


def _cuda(*ts):
    return tuple(None if t is None else t.cuda() for t in ts)


def _error(fn, *args):
    with pytest.raises(Exception) as info:
        fn(*args)
    return type(info.value), str(info.value)


# ---- voxelize ----


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("with_batch", [False, True])
@pytest.mark.parametrize("n", [0, 1, 700, 70_000])
def test_voxelize_coords_matches_cpu(dtype, with_batch, n):
    pts, batch = _cloud(n, seed=n + 1, dtype=dtype)
    batch = batch if with_batch else None
    args = ([0.5, 0.25, 1.0], [-0.5, 0.0, -0.25])
    uniq, inverse = ops.voxelize_coords(pts, batch, *args)
    guniq, ginverse = ops.voxelize_coords(*_cuda(pts, batch), *args)
    assert guniq.is_cuda and ginverse.is_cuda
    assert torch.equal(guniq.cpu(), uniq) and torch.equal(ginverse.cpu(), inverse)


@needs_gpu
def test_voxelize_coords_wide_coordinates():
    # Voxel indices up to ~2^30 and batches up to 300: every radix byte is used.
    g = torch.Generator().manual_seed(7)
    pts = torch.rand((50_000, 3), generator=g, dtype=torch.float64) * 1e9
    pts[:1000] = pts[1000:2000]  # duplicates across blocks
    batch = torch.randint(0, 300, (50_000,), generator=g)
    batch[:1000] = batch[1000:2000]
    uniq, inverse = ops.voxelize_coords(pts, batch, [1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    guniq, ginverse = ops.voxelize_coords(*_cuda(pts, batch), [1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    assert uniq.shape[0] == 49_000
    assert torch.equal(guniq.cpu(), uniq) and torch.equal(ginverse.cpu(), inverse)


@needs_gpu
@pytest.mark.parametrize(
    "bad",
    [
        ("below", lambda p, b: p.__setitem__((5, 1), -3.0)),
        ("nan", lambda p, b: p.__setitem__((9, 2), float("nan"))),
        ("inf", lambda p, b: p.__setitem__((4, 0), float("inf"))),
        ("int32", lambda p, b: p.__setitem__((6, 0), 1e12)),
        ("batch", lambda p, b: b.__setitem__(3, -2)),
        ("batch32", lambda p, b: b.__setitem__(2, 2**31)),
        ("first wins", lambda p, b: (p.__setitem__((7, 0), 1e12), p.__setitem__((8, 1), -1.0))),
    ],
)
def test_voxel_point_errors_match_cpu(bad):
    _, spoil = bad
    pts, batch = _cloud(40, seed=3, dtype=torch.float64)
    spoil(pts, batch)
    args = ([0.5, 0.5, 0.5], [0.0, 0.0, 0.0])
    cpu = _error(ops.voxelize_coords, pts, batch, *args)
    assert cpu == _error(ops.voxelize_coords, *_cuda(pts, batch), *args)
    vox = torch.tensor([[0, 0, 0, 0]], dtype=torch.int32)
    cpu_map = _error(ops.devoxel_map, pts, batch, *args, vox, True)
    assert cpu_map == _error(ops.devoxel_map, *_cuda(pts, batch), *args, vox.cuda(), True)


@needs_gpu
def test_voxel_bad_grid_and_dtype_match_cpu():
    pts, _ = _cloud(10, seed=4)
    for args in (([0.0, 1.0, 1.0], [0.0, 0.0, 0.0]), ([1.0, 1.0, 1.0], [float("nan"), 0.0, 0.0])):
        cpu = _error(ops.voxelize_coords, pts, None, *args)
        assert cpu == _error(ops.voxelize_coords, pts.cuda(), None, *args)
    half = pts.half()
    cpu = _error(ops.voxelize_coords, half, None, [1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    assert cpu == _error(ops.voxelize_coords, half.cuda(), None, [1.0, 1.0, 1.0], [0.0, 0.0, 0.0])


# ---- voxel_reduce ----


def _inverse(n: int, m: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    inv = torch.randint(0, m, (n,), generator=g)
    inv[: min(n, m // 2)] = torch.arange(min(n, m // 2))  # mostly non-empty
    return inv


@needs_gpu
@pytest.mark.parametrize("reduction", ["mean", "sum", "max"])
@pytest.mark.parametrize("n,m,c", [(0, 5, 3), (1, 1, 1), (500, 37, 5), (100_000, 70_000, 3)])
def test_voxel_reduce_float64_exact(reduction, n, m, c):
    feats = _feats(n, c, seed=n, dtype=torch.float64, ties=reduction == "max")
    inv = _inverse(n, m, seed=n + 1)
    out, arg = ops.voxel_reduce(feats, inv, m, reduction)
    gout, garg = ops.voxel_reduce(feats.cuda(), inv.cuda(), m, reduction)
    assert torch.equal(gout.cpu(), out) and torch.equal(garg.cpu(), arg)


@needs_gpu
@pytest.mark.parametrize("reduction", ["mean", "sum", "max"])
def test_voxel_reduce_float32(reduction):
    feats = _feats(20_000, 4, seed=1, ties=reduction == "max")
    inv = _inverse(20_000, 3000, seed=2)
    out, arg = ops.voxel_reduce(feats, inv, 3000, reduction)
    gout, garg = ops.voxel_reduce(feats.cuda(), inv.cuda(), 3000, reduction)
    torch.testing.assert_close(gout.cpu(), out, rtol=1e-5, atol=1e-5)
    assert torch.equal(garg.cpu(), arg)


@needs_gpu
def test_voxel_reduce_max_nan_and_signed_zero():
    feats = torch.tensor([[0.0, 1.0], [-0.0, float("nan")], [0.0, float("nan")], [-1.0, 2.0]])
    inv = torch.tensor([0, 0, 0, 0])
    out, arg = ops.voxel_reduce(feats, inv, 2, "max")
    gout, garg = ops.voxel_reduce(feats.cuda(), inv.cuda(), 2, "max")
    assert torch.equal(garg.cpu(), arg) and arg.tolist() == [[0, 1], [-1, -1]]
    torch.testing.assert_close(gout.cpu(), out, equal_nan=True)
    assert torch.equal(torch.signbit(gout.cpu()), torch.signbit(out))


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "max"])
def test_voxel_reduce_half(dtype, reduction):
    feats = _feats(3000, 4, seed=5, dtype=dtype)
    inv = _inverse(3000, 400, seed=6)
    ref, arg = ops.voxel_reduce(feats.float(), inv, 400, reduction)
    gout, garg = ops.voxel_reduce(feats.cuda(), inv.cuda(), 400, reduction)
    assert gout.dtype == dtype
    tol = 1e-2 if dtype == torch.float16 else 2e-2
    torch.testing.assert_close(gout.cpu().float(), ref.to(dtype).float(), rtol=tol, atol=tol)
    assert torch.equal(garg.cpu(), arg)


@needs_gpu
@pytest.mark.parametrize("reduction", ["mean", "sum", "max"])
def test_voxel_reduce_backward_matches_cpu(reduction):
    feats = _feats(2000, 3, seed=8, dtype=torch.float64, ties=reduction == "max")
    inv = _inverse(2000, 300, seed=9)
    grad = _feats(300, 3, seed=10, dtype=torch.float64)
    grads = []
    for dev in ("cpu", "cuda"):
        f = feats.to(dev).detach().requires_grad_(True)  # a leaf on each device
        out, _ = ops.voxel_reduce(f, inv.to(dev), 300, reduction)
        (out * grad.to(dev)).sum().backward()
        grads.append(f.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-12, atol=1e-12)


# ---- devoxelize ----


@needs_gpu
@pytest.mark.parametrize("trilinear", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_devoxel_map_matches_cpu(trilinear, dtype):
    pts, batch = _cloud(5000, seed=11, dtype=dtype)
    args = ([0.5, 0.5, 0.25], [0.0, 0.0, 0.0])
    vox, _ = ops.voxelize_coords(pts[::3], batch[::3], *args)  # some voxels absent
    idx, w = ops.devoxel_map(pts, batch, *args, vox, trilinear)
    gidx, gw = ops.devoxel_map(*_cuda(pts, batch), *args, vox.cuda(), trilinear)
    assert torch.equal(gidx.cpu(), idx)
    torch.testing.assert_close(gw.cpu(), w, rtol=1e-12, atol=1e-15)
    assert (idx >= 0).any() and (idx < 0).any()


@needs_gpu
def test_devoxel_map_duplicate_rows_match_cpu():
    pts, _ = _cloud(10, seed=12)
    vox = torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2], [0, 1, 1, 1]], dtype=torch.int32)
    args = ([1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    cpu = _error(ops.devoxel_map, pts, None, *args, vox, False)
    assert cpu[0] is ValueError
    assert cpu == _error(ops.devoxel_map, pts.cuda(), None, *args, vox.cuda(), False)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_devoxel_gather_matches_cpu(dtype):
    pts, batch = _cloud(4000, seed=13)
    args = ([0.5, 0.5, 0.5], [0.0, 0.0, 0.0])
    vox, _ = ops.voxelize_coords(pts[::2], batch[::2], *args)
    idx, w = ops.devoxel_map(pts, batch, *args, vox, True)
    feats = _feats(vox.shape[0], 6, seed=14, dtype=dtype)
    ref_in = feats if dtype == torch.float64 else feats.float()
    ref = ops.devoxel_gather(ref_in, idx, w).to(dtype)
    out = ops.devoxel_gather(*_cuda(feats, idx, w))
    assert out.dtype == dtype
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}
    torch.testing.assert_close(out.cpu(), ref, rtol=tol[dtype], atol=tol[dtype])


@needs_gpu
@pytest.mark.parametrize("interpolation", ["nearest", "trilinear"])
@pytest.mark.parametrize("reduction", ["mean", "max"])
def test_voxelize_devoxelize_api_forward_backward(interpolation, reduction):
    pts, batch = _cloud(6000, seed=15, dtype=torch.float64)
    feats = _feats(6000, 4, seed=16, dtype=torch.float64)
    results = []
    for dev in ("cpu", "cuda"):
        f = feats.to(dev).detach().requires_grad_(True)  # a leaf on each device
        kw = {"batch_indices": batch.to(dev), "voxel_size": 0.4, "origin": 0.0}
        v = tl.voxelize(pts.to(dev), f, reduction=reduction, **kw)
        out = tl.devoxelize(pts.to(dev), v, interpolation=interpolation, **kw)
        out.square().sum().backward()
        results.append((v.coords.cpu(), v.feats.detach().cpu(), out.detach().cpu(), f.grad.cpu()))
    (c0, v0, o0, g0), (c1, v1, o1, g1) = results
    assert torch.equal(c1, c0)
    for a, b in ((v1, v0), (o1, o0), (g1, g0)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


# ---- pooling ----


def _pool_case(seed: int, geometry: ConvGeometry, n: int = 3000, extent: int = 24):
    g = torch.Generator().manual_seed(seed)
    rows = torch.cat(
        [
            torch.randint(0, 2, (2 * n, 1), generator=g),
            torch.randint(0, extent, (2 * n, 3), generator=g),
        ],
        1,
    )
    coords = torch.unique(rows, dim=0).to(torch.int32)
    coords = coords[torch.randperm(coords.shape[0], generator=g)][:n]
    ks, s, p, d = (list(v) for v in geometry.as_c())
    rng = list(geometry.output_range((extent, extent, extent)))
    out = ops.generate_support(coords, ks, s, p, d, rng, 2)
    nbr, rev = ops.kernel_map(coords, out, ks, s, p, d)
    return coords, nbr, rev


POOL_GEOMETRIES = [
    ConvGeometry((2, 2, 2), (2, 2, 2)),
    ConvGeometry((3, 3, 3), (2, 2, 2), (1, 1, 1)),
    ConvGeometry((3, 3, 3), (1, 1, 1), (1, 1, 1)),
]


@needs_gpu
@pytest.mark.parametrize("geometry", POOL_GEOMETRIES, ids=["k2s2", "k3s2p1", "k3s1p1"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", ["pool_sum", "pool_avg", "pool_max"])
def test_pool_matches_cpu_exactly(geometry, dtype, op):
    coords, nbr, rev = _pool_case(17, geometry)
    feats = _feats(coords.shape[0], 5, seed=18, dtype=dtype, ties=op == "pool_max")
    ref = getattr(ops, op)(feats, nbr, rev)
    out = getattr(ops, op)(*_cuda(feats, nbr, rev))
    ref, out = (ref, out) if op == "pool_max" else ((ref,), (out,))
    for a, b in zip(out, ref, strict=True):
        assert a.is_cuda and a.dtype == b.dtype
        assert torch.equal(a.cpu(), b)


@needs_gpu
def test_pool_max_nan_ties_and_empty_rows():
    feats = torch.tensor([[1.0, float("nan")], [1.0, 2.0], [float("nan"), float("nan")]])
    nbr = torch.tensor([[1, 0, 2, -1], [-1, -1, -1, -1]], dtype=torch.int32)
    rev = torch.full((3, 4), -1, dtype=torch.int32)
    y, arg = ops.pool_max(feats, nbr, rev)
    gy, garg = ops.pool_max(*_cuda(feats, nbr, rev))
    assert torch.equal(garg.cpu(), arg) and arg.tolist() == [[2, 0], [-1, -1]]
    torch.testing.assert_close(gy.cpu(), y, equal_nan=True)


@needs_gpu
@pytest.mark.parametrize("op", ["pool_sum", "pool_avg", "pool_max"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_pool_backward_matches_cpu(op, dtype):
    coords, nbr, rev = _pool_case(19, POOL_GEOMETRIES[1], n=1500)
    feats = _feats(coords.shape[0], 4, seed=20, dtype=dtype, ties=op == "pool_max")
    grad = _feats(nbr.shape[0], 4, seed=21, dtype=dtype)
    grads = []
    for dev in ("cpu", "cuda"):
        f = feats.to(dev).detach().requires_grad_(True)  # a leaf on each device
        y = getattr(ops, op)(f, nbr.to(dev), rev.to(dev))
        y = y[0] if op == "pool_max" else y
        (y * grad.to(dev)).sum().backward()
        grads.append(f.grad.cpu())
    assert torch.equal(grads[1], grads[0])


@needs_gpu
def test_pool_max_backward_op_matches_cpu():
    coords, nbr, rev = _pool_case(22, POOL_GEOMETRIES[0])
    feats = _feats(coords.shape[0], 3, seed=23, ties=True)
    _, arg = ops.pool_max(feats, nbr, rev)
    dy = _feats(nbr.shape[0], 3, seed=24)
    ref = ops.pool_max_backward(dy, rev, arg)
    assert torch.equal(ops.pool_max_backward(*_cuda(dy, rev, arg)).cpu(), ref)


@needs_gpu
def test_pool_rejects_integer_features():
    nbr = torch.zeros((2, 1), dtype=torch.int32, device="cuda")
    x = torch.zeros((1, 2), dtype=torch.int32, device="cuda")
    with pytest.raises(TypeError, match="int32"):
        ops.pool_sum(x, nbr, nbr)


@needs_gpu
def test_pool_modules_on_cuda():
    x = tl.SparseTensor(_feats(500, 3, seed=25), _pool_case(26, POOL_GEOMETRIES[0], n=500)[0])
    for module in (tl.nn.MaxPool3d(2), tl.nn.AvgPool3d(3, 2, 1), tl.nn.SumPool3d(2)):
        ref = module(x)
        out = module(x.to("cuda"))
        assert torch.equal(out.coords.cpu(), ref.coords)
        assert torch.equal(out.feats.cpu(), ref.feats)


# ---- generative support ----


@needs_gpu
@pytest.mark.parametrize(
    "kernel_size,stride", [([2, 2, 2], [2, 2, 2]), ([3, 3, 3], [2, 2, 2]), ([3, 1, 2], [1, 3, 2])]
)
@pytest.mark.parametrize("n", [0, 1, 5000])
def test_generative_support_matches_cpu(kernel_size, stride, n):
    coords, _, _ = _pool_case(27 + n, POOL_GEOMETRIES[0], n=max(n, 1))
    coords = coords[:n]
    ref = ops.generative_support(coords, kernel_size, stride)
    out = ops.generative_support(coords.cuda(), kernel_size, stride)
    assert out.is_cuda and torch.equal(out.cpu(), ref)


@needs_gpu
def test_generative_support_wide_rows():
    g = torch.Generator().manual_seed(31)
    coords = torch.unique(torch.randint(0, 2**28, (20_000, 4), generator=g), dim=0)
    coords[:, 0] %= 500
    coords = torch.unique(coords, dim=0).to(torch.int32)
    ref = ops.generative_support(coords, [2, 2, 2], [4, 4, 4])
    out = ops.generative_support(coords.cuda(), [2, 2, 2], [4, 4, 4])
    assert torch.equal(out.cpu(), ref)


@needs_gpu
def test_generative_support_errors_match_cpu():
    ok = torch.tensor([[0, 1, 2, 3], [1, 5, 5, 5]], dtype=torch.int32)
    negative = torch.cat([ok, torch.tensor([[0, -1, 0, 0]], dtype=torch.int32)])
    big = torch.cat([ok, torch.tensor([[0, 2**30, 0, 0], [0, -1, 0, 0]], dtype=torch.int32)])
    for coords in (negative, big):
        cpu = _error(ops.generative_support, coords, [2, 2, 2], [2, 2, 2])
        assert cpu == _error(ops.generative_support, coords.cuda(), [2, 2, 2], [2, 2, 2])
    assert issubclass(_error(ops.generative_support, big, [2, 2, 2], [2, 2, 2])[0], ValueError)


# ---- the backbone ----


def _scene(seed: int, n: int = 3000, extent: int = 40):
    g = torch.Generator().manual_seed(seed)
    rows = torch.cat(
        [torch.randint(0, 2, (n, 1), generator=g), torch.randint(0, extent, (n, 3), generator=g)], 1
    )
    coords = torch.unique(rows, dim=0)
    feats = torch.randn((coords.shape[0], 3), generator=g)
    return tl.SparseTensor(feats, coords)


@needs_gpu
def test_sparse_res_unet42_cuda_matches_cpu():
    torch.manual_seed(0)
    net = tl.backbones.SparseResUNet42(3, 5, width=0.25)
    gnet = copy.deepcopy(net).cuda()
    x = _scene(32)
    y = net(x)
    gy = gnet(x.to("cuda"))
    assert gy.feats.is_cuda and torch.equal(gy.coords.cpu(), y.coords)
    scale = float(y.feats.detach().abs().max())
    torch.testing.assert_close(gy.feats.cpu(), y.feats, rtol=1e-3, atol=1e-3 * scale)
    # Gradients through smooth activations: ReLU's would jump with rounding.
    smooth_activations(net)
    smooth_activations(gnet)
    y = net(x)
    gy = gnet(x.to("cuda"))
    target = torch.randn(y.feats.shape, generator=torch.Generator().manual_seed(1))
    (y.feats * target).sum().backward()
    (gy.feats * target.cuda()).sum().backward()
    params = dict(net.named_parameters())
    checked = 0
    for name, p in gnet.named_parameters():
        ref = params[name].grad
        if ref is None or ref.abs().max() == 0:
            continue
        gscale = float(ref.abs().max())
        torch.testing.assert_close(p.grad.cpu(), ref, rtol=1e-3, atol=2e-3 * gscale, msg=name)
        checked += 1
    assert checked > 20


# ---- where CUDA kernels cannot run ----


def test_cuda_kernels_raise_clearly_without_cuda(monkeypatch):
    monkeypatch.setattr(_C, "cuda_compiled", lambda: False)
    pts = torch.zeros((2, 3))
    coords = torch.zeros((1, 4), dtype=torch.int32)
    nbr = torch.zeros((1, 1), dtype=torch.int32)
    # well-formed for pts's 2 rows: rev (N_in, K), argmax the gradient's shape
    rev, argmax = torch.zeros((2, 1), dtype=torch.int32), torch.zeros((2, 3), dtype=torch.int32)
    calls = [
        lambda: voxel_cuda.voxelize_coords(pts, None, [1.0] * 3, [0.0] * 3),
        lambda: voxel_cuda.voxel_reduce(pts, torch.zeros(2, dtype=torch.long), 1, "sum"),
        lambda: voxel_cuda.devoxel_map(pts, None, [1.0] * 3, [0.0] * 3, coords, False),
        lambda: voxel_cuda.devoxel_gather(pts, nbr.long(), nbr.double()),
        lambda: pool_cuda.pool_sum(pts, nbr, rev),
        lambda: pool_cuda.pool_avg(pts, nbr, rev),
        lambda: pool_cuda.pool_max(pts, nbr, rev),
        lambda: pool_cuda.pool_max_backward(pts, rev, argmax),
        lambda: kmap_cuda.generative_support(coords, [2, 2, 2], [2, 2, 2]),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="built without CUDA"):
            call()


@pytest.mark.skipif(not _C.cuda_compiled(), reason="needs a CUDA build")
def test_workspace_sizes_are_measured():
    # Each layout holds at least its coordinate rows / (voxel, point) pairs: what each
    # entry point asks its alloc for (host-only; the recording alloc stops the call).
    one, zero = (1.0, 1.0, 1.0), (0.0, 0.0, 0.0)
    geom = ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    requests = {
        "voxelize": lambda a: _C.cuda_voxelize(0, 0, 0, 0, 0, 1000, one, zero, a, 0, 0),
        "voxel_reduce": lambda a: _C.cuda_voxel_reduce(0, 0, 0, 0, 0, 1000, 1, 0, 10, a, 0, 0),
        "devoxel_map": lambda a: _C.cuda_devoxel_map(
            0, 0, 0, 0, 0, 0, one, zero, 0, 100, 0, a, 0, 0
        ),
        "generative": lambda a: _C.cuda_generative(0, 0, 0, 100, geom, a, 0, 0),
    }
    least = {
        "voxelize": 3 * 1000 * 16,
        "voxel_reduce": 2 * 1000 * 8,
        "devoxel_map": 200 * 4,
        "generative": 3 * 800 * 16,
    }
    for name, call in requests.items():
        assert workspace_request(call) >= least[name], name


@pytest.mark.skipif(
    not _C.cuda_compiled() or torch.cuda.is_available(),
    reason="needs a CUDA build on a machine where CUDA cannot run",
)
def test_wrappers_pass_the_host_checks(monkeypatch):
    """Every wrapper's arguments pass the C entry point's host-side checks, which run
    before any CUDA call: with host tensors, a 256-byte aligned workspace and no
    usable GPU, each call must get as far as the CUDA runtime and fail there."""

    def workspace_alloc(device):
        held = []

        def alloc(nbytes):
            buf = torch.empty(nbytes + 256, dtype=torch.uint8)
            held.append(buf)
            return buf.data_ptr() + (-buf.data_ptr()) % 256

        return alloc

    for module in (voxel_cuda, pool_cuda, kmap_cuda):
        monkeypatch.setattr(module, "require_cuda", lambda op, *t: torch.device("cpu"))
        monkeypatch.setattr(module, "call_args", lambda device: (0, 0))
    for module in (voxel_cuda, kmap_cuda):  # pooling needs no workspace
        monkeypatch.setattr(module, "workspace_alloc", workspace_alloc)
    pts, batch = _cloud(10, seed=40, dtype=torch.float64)
    coords = torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2]], dtype=torch.int32)
    nbr = torch.zeros((2, 8), dtype=torch.int32)
    f = _feats(2, 3, seed=41)
    inv = torch.zeros(10, dtype=torch.long)
    calls = [
        lambda: voxel_cuda.voxelize_coords(pts, batch, [1.0] * 3, [0.0] * 3),
        lambda: voxel_cuda.voxel_reduce(pts.float(), inv, 1, "max"),
        lambda: voxel_cuda.devoxel_map(pts, batch, [1.0] * 3, [0.0] * 3, coords, True),
        lambda: voxel_cuda.devoxel_gather(f, inv.view(10, 1), torch.ones(10, 1).double()),
        lambda: pool_cuda.pool_sum(f, nbr, nbr),
        lambda: pool_cuda.pool_avg(f, nbr, nbr),
        lambda: pool_cuda.pool_max(f, nbr, nbr),
        lambda: pool_cuda.pool_max_backward(f, nbr, torch.zeros((2, 3), dtype=torch.int32)),
        lambda: kmap_cuda.generative_support(coords, [2, 2, 2], [2, 2, 2]),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="CUDA error"):
            call()


def test_cpu_kernels_reject_other_devices():
    # The op bodies are the CPU kernels; any device other than CPU and CUDA is named.
    meta = torch.zeros((2, 3), device="meta")
    with pytest.raises(RuntimeError, match="meta"):
        voxel.voxel_reduce._init_fn(meta, torch.zeros(2, dtype=torch.long, device="meta"), 1, "sum")
    nbr = torch.zeros((1, 1), dtype=torch.int32, device="meta")
    with pytest.raises(RuntimeError, match="meta"):
        pool.pool_sum._init_fn(meta, nbr, nbr)
    with pytest.raises(RuntimeError, match="meta"):
        kmap.generative_support._init_fn(
            torch.zeros((1, 4), dtype=torch.int32, device="meta"), [2, 2, 2], [2, 2, 2]
        )
