"""Each convolution op checks its arguments once, on either device, so a direct caller of
``torch.ops.lattice.*`` with a malformed map gets a Python exception, never a read past a
buffer in C (the functional layer validates user input before any op runs)."""

from __future__ import annotations

import pytest
import torch

import torch_lattice.ops  # noqa: F401  (registers the lattice ops)

ops = torch.ops.lattice


def _pairs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    nbr = torch.tensor([[0, -1], [1, 0]], dtype=torch.int32)
    return ops.kernel_pairs(nbr)


def test_sparse_conv_weight_grad_checks_grad_rows() -> None:
    nbr = torch.zeros((3, 1), dtype=torch.int32)
    with pytest.raises(ValueError, match="nbr has 3 output rows but grad_out has 2"):
        ops.sparse_conv_weight_grad(torch.randn(2, 4), torch.randn(2, 5), nbr)


def test_sparse_conv_weight_grad_checks_the_table() -> None:
    with pytest.raises(ValueError, match="int32 \\(N_out, K\\) table"):
        ops.sparse_conv_weight_grad(torch.randn(2, 4), torch.randn(2, 5), torch.zeros((2, 1)))


def test_pair_conv_checks_the_pair_lists() -> None:
    offsets, pair_in, pair_out = _pairs()
    feats, weight = torch.randn(2, 3), torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="offsets must be \\(K \\+ 1,\\) int64"):
        ops.pair_conv(feats, weight, offsets.int(), pair_in, pair_out, None, None, None, 2, False)
    with pytest.raises(ValueError, match="pair_in and pair_out must be \\(P,\\) int32"):
        ops.pair_conv(feats, weight, offsets, pair_in.long(), pair_out, None, None, None, 2, False)
    with pytest.raises(ValueError, match="2 kernel rows but weight has 1"):
        ops.pair_conv(feats, weight[:1], offsets, pair_in, pair_out, None, None, None, 2, False)


def test_pair_conv_weight_grad_checks_its_arguments() -> None:
    offsets, pair_in, pair_out = _pairs()
    with pytest.raises(ValueError, match="pair_in and pair_out must be"):
        ops.pair_conv_weight_grad(
            torch.randn(2, 3), torch.randn(2, 4), offsets, pair_in, pair_out[:1], False
        )
    with pytest.raises(ValueError, match="must be 2-D"):
        ops.pair_conv_weight_grad(
            torch.randn(2, 3, 1), torch.randn(2, 4), offsets, pair_in, pair_out, False
        )


def test_checked_ops_still_run() -> None:
    offsets, pair_in, pair_out = _pairs()
    feats, weight = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3, 4).double()
    y = ops.pair_conv(feats, weight, offsets, pair_in, pair_out, None, None, None, 2, True)
    want = torch.stack([feats[0] @ weight[0], feats[1] @ weight[0] + feats[0] @ weight[1]])
    torch.testing.assert_close(y, want)
    dw = ops.pair_conv_weight_grad(feats, y, offsets, pair_in, pair_out, True)
    assert dw.shape == (2, 3, 4)


@pytest.mark.parametrize(
    "offsets",
    [[0, 2, 1 << 40], [0, 2, 4], [0, 2, 2], [1, 2, 3], [0, 3, 2], [-1, 2, 3]],
    ids=["far-past-the-lists", "past-the-lists", "short-of-the-lists", "not-from-0",
         "decreasing", "negative"],
)
def test_pair_ops_check_the_offsets_against_the_lists(offsets: list[int]) -> None:
    # Offsets past the lists once made the C core read past pair_in (a crash at 2**40).
    _, pair_in, pair_out = _pairs()
    off = torch.tensor(offsets)
    feats, weight = torch.randn(2, 3), torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="offsets must start at 0, never decrease and end at"):
        ops.pair_conv(feats, weight, off, pair_in, pair_out, None, None, None, 2, False)
    with pytest.raises(ValueError, match="offsets must start at 0, never decrease and end at"):
        ops.pair_conv_weight_grad(feats, torch.randn(2, 4), off, pair_in, pair_out, False)


@pytest.mark.parametrize("gather", [False, True])
@pytest.mark.parametrize(
    "which, value",
    [("in", -1), ("in", 2), ("out", -1), ("out", 2), ("out", 0)],
    ids=["in-negative", "in-past-n_in", "out-negative", "out-past-n_out", "out-not-increasing"],
)
def test_pair_ops_name_the_rule_of_the_pairs(which: str, value: int, gather: bool) -> None:
    offsets, pair_in, pair_out = _pairs()  # kernel row 0: outputs 0, 1
    pair_in, pair_out = pair_in.clone(), pair_out.clone()
    (pair_in if which == "in" else pair_out)[1] = value
    feats, weight = torch.randn(2, 3), torch.randn(2, 3, 4)
    rule = "every pair_in must be in \\[0, 2\\) and every pair_out in \\[0, 2\\), strictly"
    with pytest.raises(ValueError, match=rule):
        ops.pair_conv(feats, weight, offsets, pair_in, pair_out, None, None, None, 2, gather)
    with pytest.raises(ValueError, match=rule):
        ops.pair_conv_weight_grad(feats, torch.randn(2, 4), offsets, pair_in, pair_out, gather)
