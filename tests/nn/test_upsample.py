"""Normalized trilinear upsampling (F.trilinear_upsample3d).

Invariant: for a fine row t, over the present coarse rows c with |t - c*s| < s per axis,
  w(c) = prod_axis (1 - |t - c*s| / s),   y[t] = sum w(c) x[c] / sum w(c)   (0 if none),
on exactly the target's rows in its order; without a target on
unique{c*s + r - (s - 1) : 0 <= r < 2s - 1} sorted by (b, x, y, z).
"""

from __future__ import annotations

import itertools

import pytest
import torch

import torch_lattice as tl
from torch_lattice.nn import functional as F
from torch_lattice.nn.functional.pooling import trilinear_weights, upsample_geometry

try:
    from sparse_tensor_helpers import random_sparse
except ImportError:  # tests/ may become a package; then it is imported through it
    from tests.sparse_tensor_helpers import random_sparse


def oracle(x, fine_coords, s):
    table = {tuple(r): i for i, r in enumerate(x.coords.tolist())}
    out = torch.zeros(len(fine_coords), x.feats.shape[1], dtype=x.feats.dtype)
    for o, (b, *t) in enumerate(fine_coords.tolist()):
        num, den = 0.0, 0.0
        ranges = [range((t[a] - s[a]) // s[a], t[a] // s[a] + 2) for a in range(3)]
        for c in itertools.product(*ranges):
            off = [abs(t[a] - c[a] * s[a]) for a in range(3)]
            if any(off[a] >= s[a] for a in range(3)) or (b, *c) not in table:
                continue
            w = 1.0
            for a in range(3):
                w *= 1.0 - off[a] / s[a]
            num = num + w * x.feats[table[(b, *c)]]
            den += w
        if den > 0:
            out[o] = num / den
    return out


@pytest.mark.parametrize("s", [(2, 2, 2), (3, 1, 2), (1, 1, 1)], ids=str)
def test_target_route_matches_oracle_in_target_order(s):
    src = random_sparse(30, 5, seed=1, stride=(6, 6, 6))
    fine = random_sparse(120, 12, seed=2, stride=tuple(6 // v for v in s), channels=1)
    y = F.trilinear_upsample3d(src, s, target=fine)
    assert y.support is fine.support
    torch.testing.assert_close(y.feats, oracle(src, fine.coords, s), rtol=1e-12, atol=1e-12)


def test_weights_per_axis():
    w2 = trilinear_weights(upsample_geometry((2, 1, 1)), torch.zeros(0, dtype=torch.float64))
    assert w2.tolist() == [0.5, 1.0, 0.5]
    w3 = trilinear_weights(upsample_geometry((3, 1, 1)), torch.zeros(0, dtype=torch.float64))
    torch.testing.assert_close(w3, torch.tensor([1, 2, 3, 2, 1], dtype=torch.float64) / 3)
    full = trilinear_weights(upsample_geometry(2), torch.zeros(0, dtype=torch.float64))
    assert full.shape == (27,) and full[13] == 1.0 and full[0] == 0.125  # z fastest, centre 1


def test_hand_example_one_axis():
    # coarse x = 1, 2 at stride 2: fine 2 reads c=1, fine 3 is halfway, fine 1 has only c=1
    # present (c=0 absent: renormalized, not faded), fine 7 reads nothing.
    src = tl.SparseTensor(
        torch.tensor([[1.0], [5.0]]), torch.tensor([[0, 1, 0, 0], [0, 2, 0, 0]]), (2, 1, 1)
    )
    fine = tl.SparseTensor(
        torch.zeros(4, 1), torch.tensor([[0, 3, 0, 0], [0, 2, 0, 0], [0, 1, 0, 0], [0, 7, 0, 0]])
    )
    y = F.trilinear_upsample3d(src, (2, 1, 1), target=fine)
    assert y.feats.flatten().tolist() == [3.0, 1.0, 1.0, 0.0]


def test_linear_field_is_reproduced_inside_a_full_grid():
    s = 2
    grid = torch.tensor(list(itertools.product(range(4), repeat=3)))
    coords = torch.cat([torch.zeros(len(grid), 1, dtype=torch.long), grid], 1)

    def field(pos):  # a linear function of the physical position
        return 0.5 + pos[:, :1] * 1.5 - pos[:, 1:2] * 0.25 + pos[:, 2:] * 2.0

    src = tl.SparseTensor(field(grid.double() * s), coords, s)
    inner = torch.tensor(list(itertools.product(range(0, 7), repeat=3)))
    fine = tl.SparseTensor(
        torch.zeros(len(inner), 1),
        torch.cat([torch.zeros(len(inner), 1, dtype=torch.long), inner], 1),
    )
    y = F.trilinear_upsample3d(src, s, target=fine)
    torch.testing.assert_close(y.feats, field(inner.double()))


def test_generated_support_sorted_and_negative_raises():
    src = random_sparse(20, 5, seed=3, stride=2, lo=1)
    y = F.trilinear_upsample3d(src, 2)
    cand = {
        (b, *(c[a] * 2 + r[a] - 1 for a in range(3)))
        for b, *c in src.coords.tolist()
        for r in itertools.product(range(3), repeat=3)
    }
    assert y.coords.tolist() == sorted(list(t) for t in cand)
    assert y.stride == (1, 1, 1)
    torch.testing.assert_close(y.feats, oracle(src, y.coords, (2, 2, 2)))
    at_zero = tl.SparseTensor(torch.ones(1, 1), torch.tensor([[0, 0, 1, 1]]), 2)
    with pytest.raises(ValueError, match="trilinear_upsample3d without a target generates"):
        F.trilinear_upsample3d(at_zero, 2)
    # stride 1 on the axes at 0: nothing negative
    assert F.trilinear_upsample3d(at_zero, (1, 2, 2)).coords.tolist()[0] == [0, 0, 1, 1]


@pytest.mark.parametrize("with_target", [True, False])
def test_gradcheck(with_target):
    src = random_sparse(15, 4, seed=4, stride=2, channels=2, lo=1)
    fine = random_sparse(40, 8, seed=5, channels=1) if with_target else None
    feats = src.feats.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda v: F.trilinear_upsample3d(src.replace(v), 2, target=fine).feats, (feats,)
    )


def test_float32_and_empty():
    src = random_sparse(10, 4, seed=6, stride=2, dtype=torch.float32)
    fine = random_sparse(30, 8, seed=7, channels=1, dtype=torch.float32)
    y = F.trilinear_upsample3d(src, 2, target=fine)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.feats, oracle(src, fine.coords, (2, 2, 2)).float())
    empty = tl.SparseTensor(torch.zeros(0, 3), torch.zeros(0, 4, dtype=torch.int32), 2)
    assert (F.trilinear_upsample3d(empty, 2, target=fine).feats == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_types_are_the_float32_result_rounded_once(dtype):
    """Half types weigh, sum and divide in float32 and round once, as pool_transpose3d
    does: bitwise the float32 result cast, where rounding each step in the half type
    moved values by an ulp or more (stride 3: weights 1/3, 2/3 are not exact)."""
    src = random_sparse(40, 6, seed=9, stride=3, dtype=torch.float32)
    fine = random_sparse(200, 18, seed=10, channels=1, dtype=torch.float32)
    half = src.replace(src.feats.to(dtype))
    want = F.trilinear_upsample3d(half.replace(half.feats.float()), 3, target=fine).feats
    y = F.trilinear_upsample3d(half, 3, target=fine)
    assert y.dtype == dtype
    assert torch.equal(y.feats, want.to(dtype))


def test_bad_inputs():
    src = random_sparse(10, 4, seed=8, stride=2, lo=1)
    with pytest.raises(TypeError, match="input must be"):
        F.trilinear_upsample3d(src.feats, 2)
    with pytest.raises(ValueError, match="stride must be positive"):
        F.trilinear_upsample3d(src, 0)
    with pytest.raises(ValueError, match="divisible by the transpose stride"):
        F.trilinear_upsample3d(src, 4)
    with pytest.raises(ValueError, match="coordinates stride"):
        F.trilinear_upsample3d(src, 2, target=src)
    with pytest.raises(TypeError, match="target must be"):
        F.trilinear_upsample3d(src, 2, target=src.coords)
