"""Sparse average-pooling transpose (F.pool_transpose3d) against two oracles.

Invariant: for a fine row t and S(t) = {i : src[i]*stride + r*dilation - padding == t for
some kernel position r, same batch},
  y[t] = mean_{i in S(t)} x[i]   (0 when S(t) is empty),
on exactly the target's rows in its order; without a target on the support the pooling
with the same geometry came from, else on unique{src*stride + r*dilation - padding} sorted.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import torch_lattice as tl
from torch_lattice.nn import functional as F

try:
    from sparse_tensor_helpers import random_sparse
except ImportError:  # tests/ may become a package; then it is imported through it
    from tests.sparse_tensor_helpers import random_sparse


def dict_oracle(x, fine_coords, ks, s, p, d):
    """Per-row loop over the transposed relation."""
    ks, s, p, d = (tuple(v) if isinstance(v, tuple) else (v,) * 3 for v in (ks, s, p, d))
    reach = {}
    for i, (b, *c) in enumerate(x.coords.tolist()):
        for r in itertools.product(*(range(k) for k in ks)):
            t = (b, *(c[a] * s[a] + r[a] * d[a] - p[a] for a in range(3)))
            reach.setdefault(t, []).append(i)
    out = torch.zeros(len(fine_coords), x.feats.shape[1], dtype=x.feats.dtype)
    for o, row in enumerate(fine_coords.tolist()):
        rows = reach.get(tuple(row), [])
        if rows:
            out[o] = x.feats[rows].mean(0)
    return out


def dense_oracle(x, fine_coords, ks, s, p, d):
    """torch conv_transpose3d with all-ones depthwise weights: sums over the occupancy."""
    ks, s, p, d = (tuple(v) if isinstance(v, tuple) else (v,) * 3 for v in (ks, s, p, d))
    c = x.feats.shape[1]
    top = max(int(x.coords[:, 1:].max()), int(fine_coords[:, 1:].max()))
    side = top + 2 * max(p) + 2  # output side (side-1)*s - 2p + d(K-1) + 1 covers every t
    b = int(x.coords[:, 0].max()) + 1
    grid = torch.zeros(b, c + 1, side, side, side, dtype=x.feats.dtype)
    ci = x.coords.long()
    vals = torch.cat([x.feats, torch.ones(len(ci), 1, dtype=x.feats.dtype)], 1)
    grid[ci[:, 0], :, ci[:, 1], ci[:, 2], ci[:, 3]] = vals
    w = torch.ones(c + 1, 1, *ks, dtype=x.feats.dtype)
    up = torch.nn.functional.conv_transpose3d(
        grid, w, stride=s, padding=p, dilation=d, groups=c + 1
    )
    out = torch.zeros(len(fine_coords), c, dtype=x.feats.dtype)
    for o, (bb, *t) in enumerate(fine_coords.tolist()):
        if bb < b:
            num, den = up[bb, :c, t[0], t[1], t[2]], up[bb, c, t[0], t[1], t[2]]
            if den > 0:
                out[o] = num / den
    return out


GEOMS = [
    dict(kernel_size=2, stride=2, padding=0, dilation=1),
    dict(kernel_size=3, stride=2, padding=1, dilation=1),
    dict(kernel_size=(3, 1, 2), stride=(2, 1, 2), padding=(1, 0, 0), dilation=(1, 1, 2)),
    dict(kernel_size=3, stride=1, padding=1, dilation=1),
]


def geom_args(g):
    return g["kernel_size"], g["stride"], g["padding"], g["dilation"]


@pytest.mark.parametrize("g", GEOMS, ids=str)
def test_target_route_matches_both_oracles_in_target_order(g):
    s = g["stride"] if isinstance(g["stride"], tuple) else (g["stride"],) * 3
    src = random_sparse(25, 4, seed=1, stride=(4, 4, 4))
    fine = random_sparse(80, 9, seed=2, stride=tuple(4 // v for v in s), channels=1)
    y = F.pool_transpose3d(src, *geom_args(g), target=fine)
    assert y.support is fine.support  # exactly the target's rows and order
    assert y.stride == fine.stride
    expected = dict_oracle(src, fine.coords, *geom_args(g))
    torch.testing.assert_close(y.feats, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y.feats, dense_oracle(src, fine.coords, *geom_args(g)))
    assert (y.feats == 0).all(dim=1).any()  # some target rows are reached by no coarse row


def test_hand_example_one_axis():
    # Coarse x = 0 and 1 at stride 2; kernel 3, padding 1: c reaches 2c - 1, 2c, 2c + 1.
    src = tl.SparseTensor(
        torch.tensor([[2.0, -1.0], [4.0, 3.0]]),
        torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0]]),
        (2, 1, 1),
    )
    fine = tl.SparseTensor(
        torch.zeros(4, 1), torch.tensor([[0, 3, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0], [0, 5, 0, 0]])
    )
    y = F.pool_transpose3d(src, (3, 1, 1), (2, 1, 1), (1, 0, 0), 1, target=fine)
    assert y.feats.tolist() == [[4.0, 3.0], [3.0, 1.0], [2.0, -1.0], [0.0, 0.0]]


def test_without_target_returns_to_the_pooled_support():
    x = random_sparse(60, 8, seed=3)
    pooled = F.avg_pool3d(x, 2)
    y = F.pool_transpose3d(pooled, 2)
    assert y.support is x.support  # the cached source: same rows, order, stride, range
    torch.testing.assert_close(y.feats, dict_oracle(pooled, x.coords, 2, 2, 0, 1))
    # every fine row lies in one window, so it reads its window's average
    back = F.pool_transpose3d(pooled, 2, target=x)
    torch.testing.assert_close(back.feats, y.feats)


def test_expand_coordinates_ignores_the_cache():
    x = random_sparse(60, 8, seed=3)
    pooled = F.avg_pool3d(x, 2)
    y = F.pool_transpose3d(pooled, 2, expand_coordinates=True)
    cand = {
        (b, *(c[a] * 2 + r[a] for a in range(3)))
        for b, *c in pooled.coords.tolist()
        for r in itertools.product(range(2), repeat=3)
    }
    assert y.coords.tolist() == sorted(list(t) for t in cand)
    assert len(y) > len(x)  # every child of every window, not only the rows pooled
    torch.testing.assert_close(y.feats, dict_oracle(pooled, y.coords, 2, 2, 0, 1))
    with pytest.raises(TypeError, match="expand_coordinates must be a bool"):
        F.pool_transpose3d(pooled, 2, expand_coordinates=1)


def test_without_history_generates_sorted_unique_support():
    src = random_sparse(30, 5, seed=4, stride=(2, 2, 2))
    src = tl.SparseTensor(src.feats, src.coords, (2, 2, 2), spatial_range=(2, 5, 5, 5))
    y = F.pool_transpose3d(src, 3, 2, 0, 1)
    cand = {
        (b, *(c[a] * 2 + r[a] for a in range(3)))
        for b, *c in src.coords.tolist()
        for r in itertools.product(range(3), repeat=3)
    }
    assert y.coords.tolist() == sorted(list(t) for t in cand)
    assert y.coords.dtype == torch.int32
    assert y.stride == (1, 1, 1)
    assert y.spatial_range == (2, 11, 11, 11)  # (R - 1)*s + (K - 1)*d - p + 1
    torch.testing.assert_close(y.feats, dict_oracle(src, y.coords, 3, 2, 0, 1))


def test_generated_negative_coordinate_raises():
    src = tl.SparseTensor(torch.ones(1, 1), torch.tensor([[0, 0, 3, 3]]), 2)
    with pytest.raises(ValueError, match=r"coordinate -1 < 0.*target"):
        F.pool_transpose3d(src, 3, 2, 1)
    # a coarse row away from 0 generates only non-negative rows
    ok = tl.SparseTensor(torch.ones(1, 1), torch.tensor([[0, 1, 1, 1]]), 2)
    assert len(F.pool_transpose3d(ok, 3, 2, 1)) == 27


@pytest.mark.parametrize("with_target", [True, False])
def test_gradcheck(with_target):
    x = random_sparse(30, 6, seed=5, channels=2)
    pooled = F.avg_pool3d(x, 3, 2, 1)
    fine = random_sparse(40, 9, seed=6, channels=1) if with_target else None
    feats = pooled.feats.detach().clone().requires_grad_(True)

    def f(v):
        return F.pool_transpose3d(pooled.replace(v), 3, 2, 1, target=fine).feats

    assert torch.autograd.gradcheck(f, (feats,))


def test_empty_input_and_target():
    empty = tl.SparseTensor(torch.zeros(0, 2), torch.zeros(0, 4, dtype=torch.int32), 2)
    fine = random_sparse(5, 4, seed=7, channels=1, dtype=torch.float32)
    y = F.pool_transpose3d(empty, 2, target=fine)
    assert y.feats.shape == (5, 2) and (y.feats == 0).all()
    assert len(F.pool_transpose3d(empty, 2)) == 0


def test_bad_inputs():
    src = random_sparse(10, 4, seed=8, stride=2)
    with pytest.raises(TypeError, match=r"input must be a torch_lattice\.SparseTensor"):
        F.pool_transpose3d(src.feats, 2)
    with pytest.raises(TypeError, match=r"target must be a torch_lattice\.SparseTensor"):
        F.pool_transpose3d(src, 2, target=src.coords)
    with pytest.raises(ValueError, match="divisible by the transpose stride"):
        F.pool_transpose3d(src, 3)  # stride defaults to kernel_size; 2 is not divisible by 3
    with pytest.raises(ValueError, match=r"coordinates stride \(2, 2, 2\) must equal \(1, 1, 1\)"):
        F.pool_transpose3d(src, 2, target=src)
    with pytest.raises(ValueError, match="kernel_size"):
        F.pool_transpose3d(src, 0)
    with pytest.raises(ValueError, match="padding"):
        F.pool_transpose3d(src, 2, padding=-1)


def test_conv3d_history_and_identity_geometry():
    x = random_sparse(50, 8, seed=9)
    w = torch.randn(8, 3, 2, dtype=torch.float64)
    down = F.conv3d(x, w, None, 2, 2)
    assert F.pool_transpose3d(down, 2).support is x.support  # as ConvTranspose3d(down)
    # a 1x1x1 stride-1 geometry keeps every support: back onto x's rows, in x's order,
    # as ConvTranspose3d's identity route (with or without a pooling before it)
    order = sorted(range(len(x)), key=lambda i: x.coords[i].tolist())
    assert order != list(range(len(x)))  # x is not sorted: the order is what is checked
    for src in (F.avg_pool3d(x, 1), F.max_pool3d(x, 1), x):
        y = F.pool_transpose3d(src, 1)
        assert y.support is x.support
        assert torch.equal(y.feats, x.feats)
    # the artifact contract's no-target route still generates the sorted support
    y = F.pool_transpose3d(F.avg_pool3d(x, 1), 1, expand_coordinates=True)
    assert y.coords.tolist() == [x.coords[i].tolist() for i in order]
    assert torch.equal(y.feats, x.feats[order])


def test_half_precision_features():
    x = random_sparse(40, 6, seed=10, dtype=torch.float16)
    pooled = F.avg_pool3d(x, 2)
    y = F.pool_transpose3d(pooled, 2)
    assert y.dtype == torch.float16
    want = dict_oracle(pooled.double(), x.coords, 2, 2, 0, 1)
    torch.testing.assert_close(y.feats.double(), want, rtol=1e-3, atol=1e-3)
