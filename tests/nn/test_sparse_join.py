"""reindex_sparse, sparse_cat and sparse_binary against dict-based oracles.

Invariants (rows matched by equal [b, x, y, z] on one stride):
- reindex_sparse(x, t, fill)[k] = x[row of t.coords[k] in x], or fill; rows and order are t's.
- equal supports: cat / binary keep lhs's support and order (join and fills unused);
  otherwise the rows are the join of both row sets, sorted by (b, x, y, z), and an operand
  without the row reads its fill (0 for cat).
"""

from __future__ import annotations

import math

import pytest
import torch

import torch_lattice as tl

try:
    from sparse_tensor_helpers import random_sparse
except ImportError:  # tests/ may become a package; then it is imported through it
    from tests.sparse_tensor_helpers import random_sparse

JOINS = ["inner", "left", "right", "outer"]
OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "maximum": max,
    "minimum": min,
}


def rows_of(x):
    return {tuple(r): x.feats[i] for i, r in enumerate(x.coords.tolist())}


def joined(a, b, join):
    ka, kb = set(rows_of(a)), set(rows_of(b))
    keep = {"inner": ka & kb, "left": ka, "right": kb, "outer": ka | kb}[join]
    return sorted(keep)


def overlapping_pair(seed, channels=(3, 2)):
    a = random_sparse(40, 5, seed=seed, channels=channels[0])
    b = random_sparse(40, 5, seed=seed + 100, channels=channels[1])
    shared = len(set(rows_of(a)) & set(rows_of(b)))
    assert 0 < shared < 40  # both common and private rows
    return a, b


def test_reindex_matches_oracle_in_target_order():
    x, t = overlapping_pair(1, channels=(3, 1))
    y = tl.reindex_sparse(x, t, fill=-0.5)
    assert y.support is t.support and y.feats.shape == (len(t), 3)
    table = rows_of(x)
    for k, row in enumerate(t.coords.tolist()):
        want = table.get(tuple(row), torch.full((3,), -0.5, dtype=torch.float64))
        assert torch.equal(y.feats[k], want)


def test_reindex_hand_example_and_same_support():
    x = tl.SparseTensor(
        torch.tensor([[1.0], [2.0], [3.0]]),
        torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [1, 0, 0, 0]]),
    )
    t = tl.SparseTensor(torch.zeros(3, 4), torch.tensor([[1, 0, 0, 0], [0, 5, 0, 0], [0, 0, 0, 0]]))
    assert tl.reindex_sparse(x, t).feats.flatten().tolist() == [3.0, 0.0, 1.0]
    assert tl.reindex_sparse(x, t, fill=7).feats.flatten().tolist() == [3.0, 7.0, 1.0]
    same = tl.reindex_sparse(x, x.replace(torch.zeros(3, 1)))
    assert same.support is x.support and same.feats is x.feats


def test_reindex_gradient_reaches_present_rows_only():
    x, t = overlapping_pair(2)
    feats = x.feats.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda v: tl.reindex_sparse(x.replace(v), t, fill=1.5).feats, (feats,)
    )
    y = tl.reindex_sparse(x.replace(feats), t)
    y.feats.sum().backward()
    kept = set(map(tuple, t.coords.tolist()))
    for i, row in enumerate(x.coords.tolist()):
        assert feats.grad[i].eq(1.0 if tuple(row) in kept else 0.0).all()


def test_an_empty_operand_stays_in_the_graph():
    """An operand of no rows was answered with a new tensor cut from autograd: a step whose
    only differentiable operand happened to be empty failed in backward()."""
    feats = torch.zeros(0, 2, dtype=torch.float64, requires_grad=True)
    x = tl.SparseTensor(feats, torch.zeros(0, 4, dtype=torch.int32))
    coords = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [0, 2, 0, 0]], dtype=torch.int32)
    target = tl.SparseTensor(torch.ones(3, 2, dtype=torch.float64), coords)
    for y in (tl.reindex_sparse(x, target, fill=-math.inf),
              tl.sparse_binary(x, target, "add", "outer"),
              tl.sparse_cat([x, target], "outer")):
        assert y.feats.requires_grad
        y.feats.sum().backward()
        assert feats.grad is not None and feats.grad.shape == (0, 2)
        feats.grad = None
    assert torch.equal(tl.reindex_sparse(x, target, fill=-math.inf).feats,
                       torch.full((3, 2), -math.inf, dtype=torch.float64))


@pytest.mark.parametrize("join", JOINS)
def test_cat_matches_oracle(join):
    a, b = overlapping_pair(3)
    y = tl.sparse_cat([a, b], join=join)
    keys = joined(a, b, join)
    assert y.coords.tolist() == [list(k) for k in keys]
    assert y.stride == a.stride and y.coords.dtype == torch.int32
    ra, rb = rows_of(a), rows_of(b)
    zero_a, zero_b = torch.zeros(3, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    want = torch.stack([torch.cat([ra.get(k, zero_a), rb.get(k, zero_b)]) for k in keys])
    assert torch.equal(y.feats, want)


def test_cat_equal_supports_keep_lhs_order_other_orders_sort():
    a = random_sparse(20, 5, seed=4)
    b = a.replace(torch.randn(len(a), 2, dtype=torch.float64))
    y = tl.sparse_cat([a, b], join="outer")
    assert y.support is a.support
    assert torch.equal(y.feats, torch.cat([a.feats, b.feats], 1))
    perm = torch.randperm(len(a), generator=torch.Generator().manual_seed(0))
    shuffled = tl.SparseTensor(b.feats[perm], a.coords[perm])
    z = tl.sparse_cat([a, shuffled], join="left")  # same rows, other order: sorted
    order = sorted(range(len(a)), key=lambda i: a.coords[i].tolist())
    assert z.coords.tolist() == [a.coords[i].tolist() for i in order]
    torch.testing.assert_close(z.feats, torch.cat([a.feats, b.feats], 1)[order], rtol=0, atol=0)


def test_cat_reuses_an_operand_support_when_rows_come_out_equal():
    a = random_sparse(20, 5, seed=5)
    order = torch.argsort(
        a.coords[:, 0] * 1000 + a.coords[:, 1] * 100 + a.coords[:, 2] * 10 + a.coords[:, 3]
    )
    sorted_a = tl.SparseTensor(a.feats[order], a.coords[order])
    part = tl.SparseTensor(sorted_a.feats[:5], sorted_a.coords[:5])
    y = tl.sparse_cat([sorted_a, part], join="left")
    assert y.support is sorted_a.support  # kernel maps cached on it stay shared


def test_cat_folds_left_over_three_inputs():
    a, b = overlapping_pair(6)
    c = random_sparse(30, 5, seed=206, channels=1)
    for join in JOINS:
        y = tl.sparse_cat([a, b, c], join=join)
        step = tl.sparse_cat([tl.sparse_cat([a, b], join=join), c], join=join)
        assert torch.equal(y.coords, step.coords) and torch.equal(y.feats, step.feats)
        assert y.feats.shape[1] == 6
    assert tl.sparse_cat([a]).feats is a.feats


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("join", JOINS)
def test_binary_matches_oracle(op, join):
    a, b = overlapping_pair(7, channels=(2, 2))
    y = tl.sparse_binary(a, b, op, join=join, lhs_fill=-1.25, rhs_fill=0.5)
    keys = joined(a, b, join)
    assert y.coords.tolist() == [list(k) for k in keys]
    ra, rb = rows_of(a), rows_of(b)
    for k, key in enumerate(keys):
        left = ra.get(key, torch.full((2,), -1.25, dtype=torch.float64))
        right = rb.get(key, torch.full((2,), 0.5, dtype=torch.float64))
        for ch in range(2):
            assert y.feats[k, ch].item() == OPS[op](left[ch].item(), right[ch].item())


def test_binary_defaults_and_equal_supports():
    a, b = overlapping_pair(8, channels=(2, 2))
    y = tl.sparse_binary(a, b, "sub")  # outer join, zero fills
    ra, rb = rows_of(a), rows_of(b)
    keys = joined(a, b, "outer")
    want = torch.stack(
        [
            ra.get(k, torch.zeros(2, dtype=torch.float64))
            - rb.get(k, torch.zeros(2, dtype=torch.float64))
            for k in keys
        ]
    )
    assert torch.equal(y.feats, want)
    c = a.replace(torch.randn(len(a), 2, dtype=torch.float64))
    z = tl.sparse_binary(a, c, "mul", join="inner", lhs_fill=5.0)
    assert z.support is a.support and torch.equal(z.feats, a.feats * c.feats)


def test_binary_infinite_fill_selects_the_present_side():
    a, b = overlapping_pair(9, channels=(2, 2))
    y = tl.sparse_binary(a, b, "maximum", lhs_fill=-math.inf, rhs_fill=-math.inf)
    assert torch.isfinite(y.feats).all()


@pytest.mark.parametrize("op", list(OPS))
def test_binary_gradcheck(op):
    a, b = overlapping_pair(10, channels=(2, 2))
    fa = a.feats.detach().clone().requires_grad_(True)
    fb = b.feats.detach().clone().requires_grad_(True)

    def f(u, v):
        return tl.sparse_binary(
            a.replace(u), b.replace(v), op, join="outer", lhs_fill=0.3, rhs_fill=-0.2
        ).feats

    assert torch.autograd.gradcheck(f, (fa, fb))


def test_cat_gradcheck():
    a, b = overlapping_pair(11)
    fa = a.feats.detach().clone().requires_grad_(True)
    fb = b.feats.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda u, v: tl.sparse_cat([a.replace(u), b.replace(v)], join="outer").feats, (fa, fb)
    )


def test_empty_operands():
    a = random_sparse(10, 5, seed=12, channels=2)
    empty = tl.SparseTensor(
        torch.zeros(0, 2, dtype=torch.float64), torch.zeros(0, 4, dtype=torch.int32)
    )
    assert len(tl.sparse_cat([a, empty], join="inner")) == 0
    y = tl.sparse_binary(empty, a, "add", join="outer", lhs_fill=1.0)
    keys = sorted(map(tuple, a.coords.tolist()))
    ra = rows_of(a)
    assert torch.equal(y.feats, torch.stack([ra[k] + 1.0 for k in keys]))
    assert (tl.reindex_sparse(empty, a, fill=2.0).feats == 2.0).all()


def test_bad_inputs():
    a, b = overlapping_pair(13, channels=(2, 2))
    with pytest.raises(ValueError, match="join must be one of"):
        tl.sparse_cat([a, b], join="full")
    with pytest.raises(ValueError, match="join must be one of"):
        tl.sparse_binary(a, b, "add", join="cross")
    with pytest.raises(ValueError, match="op must be one of"):
        tl.sparse_binary(a, b, "div")
    with pytest.raises(ValueError, match="lhs has 2 channels but rhs 3"):
        tl.sparse_binary(a, random_sparse(5, 5, seed=14, channels=3), "add")
    strided = random_sparse(5, 5, seed=15, channels=2, stride=2)
    with pytest.raises(ValueError, match=r"stride \(1, 1, 1\) differs from .* \(2, 2, 2\)"):
        tl.sparse_binary(a, strided, "add")
    with pytest.raises(ValueError, match="stride"):
        tl.reindex_sparse(a, strided)
    with pytest.raises(ValueError, match="stride"):
        tl.sparse_cat([a, strided])
    batched = random_sparse(5, 5, seed=16, channels=2, spatial_range=(3, 5, 5, 5))
    with pytest.raises(ValueError, match="spatial_range"):
        tl.sparse_cat([a, batched])
    with pytest.raises(ValueError, match="spatial_range"):
        tl.reindex_sparse(batched, a)
    with pytest.raises(TypeError, match="lhs_fill must be a float"):
        tl.sparse_binary(a, b, "add", lhs_fill="0")
    with pytest.raises(TypeError, match="fill must be a float"):
        tl.reindex_sparse(a, b, fill=True)
    with pytest.raises(ValueError, match="rhs_fill must not be NaN"):
        tl.sparse_binary(a, b, "add", rhs_fill=math.nan)
    with pytest.raises(TypeError, match=r"feats are torch\.float64 but"):
        tl.sparse_binary(a, b.float(), "add")
    with pytest.raises(TypeError, match="must be a SparseTensor"):
        tl.reindex_sparse(a.feats, b)
    with pytest.raises(TypeError, match=r"inputs\[1\] must be a SparseTensor"):
        tl.sparse_cat([a, b.feats])
    with pytest.raises(TypeError, match="list or tuple"):
        tl.sparse_cat(a)
    with pytest.raises(ValueError, match="must not be empty"):
        tl.sparse_cat([])


def test_result_keeps_the_common_spatial_range_and_reuses_rhs_support():
    a = random_sparse(30, 5, seed=17, channels=2, spatial_range=(2, 5, 5, 5))
    b = random_sparse(30, 5, seed=18, channels=2, spatial_range=(2, 5, 5, 5))
    y = tl.sparse_binary(a, b, "add", join="outer")
    assert y.spatial_range == (2, 5, 5, 5) and y.stride == (1, 1, 1)
    order = sorted(range(len(b)), key=lambda i: b.coords[i].tolist())
    sorted_b = tl.SparseTensor(b.feats[order], b.coords[order], 1, (2, 5, 5, 5))
    z = tl.sparse_cat([a, sorted_b], join="right")
    assert z.support is sorted_b.support
