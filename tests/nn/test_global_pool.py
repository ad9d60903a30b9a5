"""F.global_pool: ``(B, C)`` per-batch sum / mean / max, and its agreement with
global_avg_pool / global_max_pool.

Invariant: out[b] = reduce {x[i] : batch(i) == b} for b < B, where B is batch_size, else
spatial_range[0], else max(batch) + 1; an empty batch sums to 0, averages to 0, and has
no maximum (ValueError).
"""

from __future__ import annotations

import pytest
import torch

import torch_lattice as tl
from torch_lattice.nn import functional as F


def scene(seed=0, batches=3, empty=(), dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    coords = torch.unique(torch.randint(0, 6, (80, 4), generator=g), dim=0)
    coords[:, 0] %= batches
    coords = torch.unique(coords, dim=0)
    keep = torch.ones(len(coords), dtype=torch.bool)
    for b in empty:
        keep &= coords[:, 0] != b
    coords = coords[keep][torch.randperm(int(keep.sum()), generator=g)]
    return tl.SparseTensor(torch.randn(len(coords), 4, generator=g, dtype=dtype), coords)


def oracle(x, mode, b):
    out = torch.zeros(b, x.feats.shape[1], dtype=x.feats.dtype)
    for i in range(b):
        rows = x.feats[x.coords[:, 0] == i]
        if len(rows):
            out[i] = {"sum": rows.sum(0), "avg": rows.mean(0), "max": rows.amax(0)}[mode]
    return out


@pytest.mark.parametrize("mode", ["sum", "avg", "max"])
def test_modes_match_oracle(mode):
    x = scene(seed=1)
    y = F.global_pool(x, mode)
    assert y.shape == (3, 4)
    torch.testing.assert_close(y, oracle(x, mode, 3))


def test_default_mode_is_sum_and_batch_size_adds_trailing_batches():
    x = scene(seed=2)
    torch.testing.assert_close(F.global_pool(x), oracle(x, "sum", 3))
    for mode in ("sum", "avg"):
        y = F.global_pool(x, mode, batch_size=5)
        assert y.shape == (5, 4) and (y[3:] == 0).all()
        torch.testing.assert_close(y[:3], oracle(x, mode, 3))


def test_batch_count_from_spatial_range_and_empty_tensor():
    x = scene(seed=3, batches=2)
    ranged = tl.SparseTensor(x.feats, x.coords, spatial_range=(4, 6, 6, 6))
    assert F.global_pool(ranged, "avg").shape == (4, 4)
    empty = tl.SparseTensor(torch.zeros(0, 2), torch.zeros(0, 4, dtype=torch.int32))
    assert F.global_pool(empty).shape == (0, 2)
    assert F.global_pool(empty, "max").shape == (0, 2)
    assert F.global_pool(empty, "avg", batch_size=2).tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_max_over_an_empty_batch_raises_but_global_max_pool_gives_zeros():
    x = scene(seed=4, batches=3, empty=(1,))
    with pytest.raises(ValueError, match="batch 1 of 3 has none"):
        F.global_pool(x, "max")
    with pytest.raises(ValueError, match="batch 3 of 4 has none"):
        F.global_pool(scene(seed=4), "max", batch_size=4)
    legacy = F.global_max_pool(x)
    assert (legacy[1] == 0).all()
    torch.testing.assert_close(legacy, oracle(x, "max", 3))


def test_global_avg_and_max_pool_agree_with_global_pool():
    x = scene(seed=5)
    torch.testing.assert_close(F.global_avg_pool(x), F.global_pool(x, "avg"), rtol=0, atol=0)
    torch.testing.assert_close(F.global_max_pool(x), F.global_pool(x, "max"), rtol=0, atol=0)
    x = scene(seed=5, empty=(1,))
    torch.testing.assert_close(F.global_avg_pool(x), F.global_pool(x, "avg"), rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["sum", "avg", "max"])
def test_gradcheck(mode):
    x = scene(seed=6)
    feats = x.feats.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda v: F.global_pool(x.replace(v), mode), (feats,))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_average_in_float32_rounded_once(dtype):
    # Batch 0: 70k rows of 0.5, batch 1: 30k of 2.5 (the float16 row count and batch 1's
    # sum overflow: they averaged to 0 and inf before), batch 2: 256 ones and a zero (a
    # bfloat16 count of 257 is 256: that averaged to 1.0). The means and the gradient
    # 1/count are float32 values rounded once, as torch's own mean gives them.
    sizes = (70_000, 30_000, 257)
    batch = torch.repeat_interleave(torch.arange(3), torch.tensor(sizes))
    coords = torch.zeros(len(batch), 4, dtype=torch.int32)
    coords[:, 0] = batch
    coords[:, 1] = torch.arange(len(batch)) % 1000
    coords[:, 2] = torch.arange(len(batch)) // 1000
    values = torch.tensor([0.5, 2.5, 1.0])[batch]
    values[-1] = 0.0
    feats = values[:, None].expand(-1, 2).to(dtype).requires_grad_(True)
    x = tl.SparseTensor(feats, coords)
    out = tl.nn.GlobalAvgPool()(x)
    assert out.dtype == dtype
    expected = torch.tensor([0.5, 2.5, 256 / 257])[:, None].expand(-1, 2).to(dtype)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(F.global_pool(x, "avg"), expected, rtol=0, atol=0)
    (grad,) = torch.autograd.grad(out.sum(), feats)
    counts = torch.tensor(sizes, dtype=torch.float32)[batch]
    torch.testing.assert_close(grad[:, 0], (1 / counts).to(dtype), rtol=0, atol=0)
    # Sums too are float32 sums rounded once (75000 is inf in float16, as it must be).
    sums = torch.tensor([35_000.0, 75_000.0, 256.0])[:, None].expand(-1, 2).to(dtype)
    torch.testing.assert_close(F.global_pool(x, "sum").detach(), sums, rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["sum", "avg"])
def test_float32_sums_are_the_float64_sums_rounded_once(mode):
    # 100k rows of 3 + noise: added one row at a time in float32 the mean was 3.7e-5
    # off (torch.mean, pairwise, 2e-7); summed in float64 it is within an ulp of the
    # float64 result, and torch.testing's float32 tolerances hold against torch.mean.
    g = torch.Generator().manual_seed(11)
    n = 100_000
    coords = torch.zeros(n, 4, dtype=torch.int32)
    coords[:, 0] = torch.arange(n) % 2
    coords[:, 1] = torch.arange(n) // 2 % 500
    coords[:, 2] = torch.arange(n) // 1000
    feats = torch.randn(n, 8, generator=g) + 3
    out = F.global_pool(tl.SparseTensor(feats, coords), mode)
    assert out.dtype == torch.float32
    halves = feats.double().view(-1, 2, 8)
    want = halves.sum(0) if mode == "sum" else halves.mean(0)
    torch.testing.assert_close(out.double(), want, rtol=1.2e-7, atol=0)
    if mode == "avg":
        torch.testing.assert_close(out, feats.view(-1, 2, 8).mean(0))


def test_bad_inputs():
    x = scene(seed=7)
    with pytest.raises(ValueError, match="mode must be one of"):
        F.global_pool(x, "mean")
    with pytest.raises(TypeError, match="SparseTensor"):
        F.global_pool(x.feats)
    with pytest.raises(ValueError, match="batch_size 2 is smaller than the input's batch count 3"):
        F.global_pool(x, batch_size=2)
    with pytest.raises(TypeError, match="batch_size must be an int"):
        F.global_pool(x, batch_size=3.0)
    with pytest.raises(TypeError, match="batch_size must be an int"):
        F.global_pool(x, batch_size=True)
