"""Feature-wise modules and feature algebra: BatchNorm, activations, cat, add, to_dense."""

from __future__ import annotations

import pytest
import torch

import torch_lattice as tl


def make(n=20, channels=4, seed=0, **kwargs):
    g = torch.Generator().manual_seed(seed)
    coords = torch.cat(
        [
            torch.zeros(n, 1, dtype=torch.long),
            torch.randperm(500, generator=g)[:n].reshape(n, 1).repeat(1, 3)
            % torch.tensor([5, 10, 10]),
        ],
        1,
    )
    coords = torch.unique(coords, dim=0)
    feats = torch.randn(len(coords), channels, generator=g, dtype=torch.float64)
    return tl.SparseTensor(feats, coords, **kwargs)


def test_batchnorm_matches_batchnorm1d_and_keys():
    x = make()
    bn = tl.nn.BatchNorm(4).double()
    ref = torch.nn.BatchNorm1d(4).double()
    with torch.no_grad():
        bn.weight.uniform_()
        bn.bias.uniform_()
    ref.load_state_dict(bn.state_dict(), strict=True)
    assert list(bn.state_dict()) == list(ref.state_dict())
    y = bn(x)
    assert y.support is x.support
    torch.testing.assert_close(y.feats, ref(x.feats))
    torch.testing.assert_close(bn.running_mean, ref.running_mean)
    bn.eval()
    ref.eval()
    torch.testing.assert_close(bn(x).feats, ref(x.feats))
    fresh = tl.nn.BatchNorm(4).double()
    fresh.load_state_dict(ref.state_dict(), strict=True)


@pytest.mark.parametrize(
    ("module", "fn"),
    [
        (tl.nn.ReLU(), torch.relu),
        (tl.nn.LeakyReLU(0.2), lambda t: torch.nn.functional.leaky_relu(t, 0.2)),
        (tl.nn.SiLU(), torch.nn.functional.silu),
        (tl.nn.GELU(), torch.nn.functional.gelu),
        (tl.nn.GELU(approximate="tanh"), lambda t: torch.nn.functional.gelu(t, approximate="tanh")),
    ],
)
def test_activations(module, fn):
    x = make(seed=1)
    y = module(x)
    assert y.support is x.support
    torch.testing.assert_close(y.feats, fn(x.feats))
    with pytest.raises(TypeError, match="SparseTensor"):
        module(x.feats)


def test_inplace_relu_keeps_gradients():
    x = make(seed=2)
    feats = x.feats.clone().requires_grad_(True)
    y = tl.nn.ReLU(inplace=True)(x.replace(feats * 2.0))
    y.feats.sum().backward()
    torch.testing.assert_close(feats.grad, 2.0 * (feats > 0).double())


def test_cat_and_add_on_same_support():
    x = make(seed=3)
    a = x.replace(x.feats * 2)
    y = tl.cat([x, a, x.replace(x.feats[:, :1])])
    assert y.support is x.support and y.feats.shape == (len(x), 9)
    torch.testing.assert_close(y.feats[:, 4:8], 2 * x.feats)
    s = x + a
    assert s.support is x.support
    torch.testing.assert_close(s.feats, 3 * x.feats)


def test_cat_and_add_promote_dtypes_as_torch():
    """``+`` and ``tl.cat`` follow torch's promotion (a bfloat16 autocast output plus a
    float32 skip is float32), where the coordinate joins refuse mixed dtypes."""
    x = make(seed=5)
    for a, b in ((torch.float32, torch.float64), (torch.bfloat16, torch.float32),
                 (torch.bfloat16, torch.float16)):  # fmt: skip
        lo, hi = x.replace(x.feats.to(a)), x.replace(x.feats.to(b))
        want = torch.promote_types(a, b)
        s = lo + hi
        assert s.dtype == want and s.support is x.support
        assert torch.equal(s.feats, lo.feats.to(want) + hi.feats.to(want))
        c = tl.cat([lo, hi])
        assert c.dtype == want
        assert torch.equal(c.feats, torch.cat([lo.feats, hi.feats], 1))
    with pytest.raises(TypeError, match="feature dtypes must match"):
        tl.sparse_binary(x, x.replace(x.feats.float()), "add")


def test_cat_and_add_on_equal_coords_different_objects():
    x = make(seed=4)
    twin = tl.SparseTensor(x.feats.clone(), x.coords.clone())
    assert twin.support is not x.support
    assert torch.equal((x + twin).feats, 2 * x.feats)
    assert tl.cat([x, twin]).support is x.support


def test_cat_and_add_reject_different_supports():
    x = make(seed=5)
    perm = torch.arange(len(x) - 1, -1, -1)
    shuffled = tl.SparseTensor(x.feats[perm], x.coords[perm])
    other = make(seed=6)
    coarse = tl.SparseTensor(x.feats, x.coords, stride=2)
    for bad in (shuffled, other, coarse):
        with pytest.raises(ValueError, match="support"):
            tl.cat([x, bad])
        with pytest.raises(ValueError, match="support"):
            _ = x + bad
    with pytest.raises(ValueError, match="channel"):
        _ = x + x.replace(x.feats[:, :2])
    with pytest.raises(ValueError, match="empty"):
        tl.cat([])
    with pytest.raises(TypeError):
        tl.cat([x, x.feats])
    with pytest.raises(TypeError):
        _ = x + 1.0


def test_cat_add_gradients_flow():
    x = make(seed=7)
    f1 = x.feats.clone().requires_grad_(True)
    f2 = x.feats.clone().requires_grad_(True)
    out = tl.cat([x.replace(f1), x.replace(f2)]) + tl.cat([x.replace(f2), x.replace(f1)])
    out.feats.sum().backward()
    assert torch.equal(f1.grad, torch.full_like(f1, 2.0))


def test_to_dense():
    x = make(seed=8, spatial_range=(1, 5, 10, 10))
    dense = tl.to_dense(x)
    assert torch.equal(dense, x.dense())
    c = x.coords.long()
    torch.testing.assert_close(dense[c[:, 0], :, c[:, 1], c[:, 2], c[:, 3]], x.feats)
    with pytest.raises(ValueError, match="spatial_range"):
        tl.to_dense(make(seed=8))
