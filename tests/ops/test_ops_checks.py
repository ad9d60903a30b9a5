"""Each convolution op checks its arguments once, on either device, so a direct caller of
``torch.ops.lattice.*`` with a malformed map gets a Python exception, never a read past a
buffer in C (the functional layer validates user input before any op runs)."""

from __future__ import annotations

import pytest
import torch

import torch_lattice.ops  # noqa: F401  (registers the lattice ops)
from torch_lattice.memory_budget import MemoryBudgetError
from torch_lattice.ops.kmap import reverse_pairs

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


def _i32(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.int32)


def _i64(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.int64)


_GEOM = ([1, 1, 1], [1, 1, 1], [0, 0, 0], [1, 1, 1])

_F64 = torch.ones(8, 1, dtype=torch.float64)
_PT, _ONE, _ZERO = torch.rand(8, 3), [1.0] * 3, [0.0] * 3

# Each once read past its tensor in C (a crash at large sizes): the C core trusts the
# sizes of index and coordinate tensors and checks only their values.
_MALFORMED = {
    "kernel_map 1-D coords": (
        lambda: ops.kernel_map(_i32(16), _i32(4, 4), *_GEOM),
        "in_coords must be a \\(N, 4\\) int32"),
    "kernel_map int16 out_coords": (
        lambda: ops.kernel_map(_i32(4, 4), torch.zeros(4, 4, dtype=torch.int16), *_GEOM),
        "out_coords must be a \\(N, 4\\) int32"),
    "neighbour_table (N, 3) coords": (
        lambda: ops.neighbour_table(_i32(4, 3), _i32(4, 4), *_GEOM),
        "in_coords must be a \\(N, 4\\)"),
    "kernel_pairs int8 table": (
        lambda: ops.kernel_pairs(torch.zeros(4, 4, dtype=torch.int8)),
        "nbr must be a \\(N_out, K\\) int32"),
    "generate_support 1-D coords": (
        lambda: ops.generate_support(_i32(16), [2] * 3, [2] * 3, [0] * 3, [1] * 3, [9] * 3, 1),
        "coords must be a \\(N, 4\\) int32"),
    "generative_support int64 coords": (
        lambda: ops.generative_support(_i64(3, 4), [2] * 3, [2] * 3),
        "coords must be a \\(N, 4\\)"),
    "pool_max int8 rev": (
        lambda: ops.pool_max(torch.zeros(3, 2), _i32(3, 1), torch.zeros(3, 1, dtype=torch.int8)),
        "rev must be a \\(3, 1\\) int32"),
    "pool_sum short rev": (
        lambda: ops.pool_sum(torch.zeros(3, 2), _i32(3, 1), _i32(1, 1)),
        "rev must be a \\(3, 1\\)"),
    "sparse_conv short rev": (
        lambda: ops.sparse_conv(torch.zeros(3, 2), torch.zeros(1, 2, 4), _i32(2, 1), _i32(1, 1)),
        "rev must be a \\(3, 1\\) int32"),
    "sparse_conv int64 rev": (
        lambda: ops.sparse_conv(torch.zeros(3, 2), torch.zeros(1, 2, 4), _i32(2, 1), _i64(3, 1)),
        "rev must be a \\(3, 1\\) int32"),
    "sparse_conv no kernel rows": (
        lambda: ops.sparse_conv(torch.zeros(3, 2), torch.zeros(0, 2, 4), _i32(3, 0), _i32(3, 0)),
        "weight must have at least one kernel row \\(K >= 1\\), got \\(0, 2, 4\\)"),
    "pair_conv no kernel rows": (
        lambda: ops.pair_conv(torch.zeros(3, 2), torch.zeros(0, 2, 4), _i64(1), _i32(0),
                              _i32(0), None, None, None, 5, False),
        "weight must have at least one kernel row"),
    "pool_max_backward short argmax": (
        lambda: ops.pool_max_backward(torch.zeros(8, 1), _i32(1, 1), _i32(1, 1)),
        "argmax must be a \\(8, 1\\) int32"),
    "pool_max_backward int8 rev": (
        lambda: ops.pool_max_backward(torch.zeros(8, 1), torch.zeros(8, 1, dtype=torch.int8),
                                      _i32(8, 1)),
        "rev must be a \\(N_in, K\\) int32"),
    "voxelize_coords (P, 2) points": (
        lambda: ops.voxelize_coords(torch.rand(8, 2), None, _ONE, _ZERO),
        "points must be a \\(P, 3\\) float32 or float64"),
    "voxelize_coords short batch": (
        lambda: ops.voxelize_coords(_PT, _i64(1), _ONE, _ZERO),
        "batch must be a \\(8,\\) int64"),
    "devoxel_map int32 batch": (
        lambda: ops.devoxel_map(_PT, _i32(8), _ONE, _ZERO, _i32(1, 4), False),
        "batch must be a \\(8,\\) int64"),
    "devoxel_map (M, 2) voxel_coords": (
        lambda: ops.devoxel_map(_PT, None, _ONE, _ZERO, _i32(2, 2), True),
        "voxel_coords must be a \\(N, 4\\) int32"),
    "voxel_reduce short inverse": (
        lambda: ops.voxel_reduce(torch.randn(8, 1), _i64(1), 1, "sum"),
        "inverse must be a \\(8,\\) int64"),
    "voxel_reduce int32 inverse": (
        lambda: ops.voxel_reduce(torch.randn(8, 1), _i32(8), 1, "max"),
        "inverse must be a \\(8,\\) int64"),
    "voxel_reduce unknown reduction": (
        lambda: ops.voxel_reduce(torch.randn(8, 1), _i64(8), 1, "median"),
        "reduction must be one of"),
    "voxel_reduce negative num_voxels": (
        lambda: ops.voxel_reduce(torch.randn(8, 1), _i64(8), -1, "sum"),
        "num_voxels must be an int >= 0"),
    "devoxel_gather short weight": (
        lambda: ops.devoxel_gather(torch.randn(1, 1), _i64(8, 1), _F64[:1]),
        "weight must be a \\(8, 1\\) float64"),
    "devoxel_gather float32 weight": (
        lambda: ops.devoxel_gather(torch.randn(1, 1), _i64(8, 1), torch.ones(8, 1)),
        "weight must be a \\(8, 1\\) float64"),
    "devoxel_gather int32 idx": (
        lambda: ops.devoxel_gather(torch.randn(1, 1), _i32(8, 1), _F64),
        "idx must be a \\(P, k\\) int64"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(_MALFORMED))
def test_ops_name_a_malformed_index_or_coordinate_tensor(case: str) -> None:
    call, message = _MALFORMED[case]
    with pytest.raises(ValueError, match=message):
        call()


def test_size_computed_outputs_are_checked_against_the_memory_budget() -> None:
    # A one-row map with a 2.5e8-row kernel asked for 13.6 GB; a reduction of 2**40 voxels.
    from torch_lattice.memory_budget import MemoryBudgetError

    one = _i32(1, 4)
    with pytest.raises(MemoryBudgetError, match="kernel map \\(1 output rows, 1 input rows"):
        ops.kernel_map(one, one.clone(), [1000, 1000, 250], [1] * 3, [0] * 3, [1] * 3)
    with pytest.raises(MemoryBudgetError, match="neighbour table \\(1 output rows, 0 input rows"):
        ops.neighbour_table(one, one.clone(), [1000, 1000, 250], [1] * 3, [0] * 3, [1] * 3)
    with pytest.raises(MemoryBudgetError, match="generative support"):
        ops.generative_support(_i32(4, 4), [1024] * 3, [1] * 3)
    with pytest.raises(MemoryBudgetError, match="voxel reduction"):
        ops.voxel_reduce(torch.randn(10, 4), _i64(10), 2**40, "sum")


def test_voxel_reduce_of_no_channels_allocates_no_per_voxel_scratch() -> None:
    # 2**29 voxels of 0 channels: the C core counted points into 16 bytes a voxel (8.5 GB).
    out, arg = ops.voxel_reduce(torch.randn(10, 0), _i64(10), 2**29, "sum")
    assert out.shape == (2**29, 0) and arg.shape == (0, 0)


# ---- the kernel-map ops' list arguments, num_batches, table entries; pair_conv's n_out
# and reversed pairs: each a ValueError naming the argument, before any allocation ----

_C3 = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [1, 2, 2, 2]], dtype=torch.int32)
_GOOD = {"kernel_size": [3, 3, 3], "stride": [1, 1, 1], "padding": [1, 1, 1],
         "dilation": [1, 1, 1]}  # fmt: skip


@pytest.mark.parametrize("op", ["kernel_map", "neighbour_table"])
@pytest.mark.parametrize(
    ("name", "value", "rule"),
    [
        ("kernel_size", [-3, 3, 3], "three positive ints"),
        ("kernel_size", [3, 3], "three positive ints"),
        ("kernel_size", [3, 3, 3, 3], "three positive ints"),
        ("stride", [1, 0, 1], "three positive ints"),
        ("stride", [1, 1], "three positive ints"),
        ("padding", [0, -1, 0], "three non-negative ints"),
        ("padding", [0, 0], "three non-negative ints"),
        ("dilation", [1, 1, 0], "three positive ints"),
        ("dilation", [1, 1, 1, 1], "three positive ints"),
        ("kernel_size", [3, 3, 2**31], "three positive ints"),
    ],
)
def test_kernel_map_lists_are_checked(op: str, name: str, value: list[int], rule: str) -> None:
    args = {**_GOOD, name: value}
    with pytest.raises(ValueError, match=f"lattice::{op}: {name} must be {rule}"):
        getattr(ops, op)(_C3, _C3, *args.values())


def test_support_ops_lists_are_checked() -> None:
    g = [[2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1]]
    rule = (r"generate_support: out_range must be three non-negative ints "
            r"\(one per axis, at most 2\^31\)")
    for bad in ([3, 3], [-1, 4, 4], [-(2**40), 4, 4], [2**31 + 1, 4, 4]):
        with pytest.raises(ValueError, match=rule):
            ops.generate_support(_C3, *g, bad, 2)
    # 0 is an empty range, 2^31 the whole of int32's coordinates from 0
    assert ops.generate_support(_C3, *g, [0, 4, 4], 2).shape == (0, 4)
    assert ops.generate_support(_C3, *g, [2**31, 4, 4], 2).shape[1] == 4
    with pytest.raises(ValueError, match="generate_support: kernel_size must be three positive"):
        ops.generate_support(_C3, [2, -2, 2], *g[1:], [3, 3, 3], 2)
    with pytest.raises(ValueError, match="generative_support: kernel_size must be three pos"):
        ops.generative_support(_C3, [2, 2, -2], [2, 2, 2])
    with pytest.raises(ValueError, match="generative_support: stride must be three positive"):
        ops.generative_support(_C3, [2, 2, 2], [2, 2])


@pytest.mark.parametrize("num_batches", [0, 1])
def test_generate_support_checks_num_batches(num_batches: int) -> None:
    # batch index 1 needs num_batches >= 2: the output's capacity is sized from it
    g = [[3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1], [3, 3, 3]]
    with pytest.raises(ValueError, match=r"num_batches .* must exceed every batch index"):
        ops.generate_support(_C3, *g, num_batches)
    with pytest.raises(ValueError, match="num_batches must be a non-negative int"):
        ops.generate_support(_C3, *g, -1)
    assert ops.generate_support(_C3, *g, 2).shape[1] == 4


@pytest.mark.parametrize("entry", [-9, -2, -(2**31)])
def test_kernel_pairs_refuses_entries_below_minus_one(entry: int) -> None:
    nbr = torch.tensor([[0, -1], [1, 0]], dtype=torch.int32)
    nbr[1, 1] = entry
    with pytest.raises(ValueError, match="kernel_pairs: every entry of the table nbr must be -1"):
        ops.kernel_pairs(nbr)


def test_pair_conv_checks_n_out() -> None:
    offsets, pair_in, pair_out = _pairs()
    feats, weight = torch.randn(2, 3), torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="pair_conv: n_out must be a non-negative int"):
        ops.pair_conv(feats, weight, offsets, pair_in, pair_out, None, None, None, -1, True)


def test_pair_conv_checks_n_out_against_the_budget() -> None:
    offsets, pair_in, pair_out = _pairs()
    feats, weight = torch.randn(2, 3), torch.randn(2, 3, 4)
    with pytest.raises(MemoryBudgetError, match=r"pair_conv .*1099511627776 output rows"):
        ops.pair_conv(feats, weight, offsets, pair_in, pair_out, None, None, None, 2**40, False)


@pytest.mark.parametrize("given", [(0,), (1,), (2,), (0, 1), (1, 2), (0, 2)])
def test_pair_conv_refuses_some_reversed_pairs(given: tuple[int, ...]) -> None:
    offsets, pair_in, pair_out = _pairs()
    rev = reverse_pairs(offsets, pair_in, pair_out)
    partial = [t if i in given else None for i, t in enumerate(rev)]
    feats = torch.randn(2, 3, requires_grad=True)
    with pytest.raises(ValueError, match="rev_offsets, rev_in and rev_out must be given all"):
        ops.pair_conv(feats, torch.randn(2, 3, 4), offsets, pair_in, pair_out, *partial, 2, True)


def test_pair_conv_checks_the_reversed_pairs() -> None:
    offsets, pair_in, pair_out = _pairs()
    roff, rin, rout = reverse_pairs(offsets, pair_in, pair_out)
    feats, weight = torch.randn(2, 3), torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match="the reversed pairs must have the forward pairs"):
        ops.pair_conv(feats, weight, offsets, pair_in, pair_out, roff, rin[:1], rout, 2, True)
    with pytest.raises(ValueError, match="pair_in and pair_out must be"):
        ops.pair_conv(feats, weight, offsets, pair_in, pair_out, roff, rin, rout.long(), 2, True)
    # all three given: backward runs over them
    feats.requires_grad_()
    y = ops.pair_conv(feats, weight, offsets, pair_in, pair_out, roff, rin, rout, 2, True)
    y.sum().backward()
    assert feats.grad is not None


# ---- the pooling ops' tables: a bad nbr (or, in the backward, rev / argmax) is named with
# its rule, never a bare "invalid argument" ----


@pytest.mark.parametrize("op", ["pool_sum", "pool_avg", "pool_max"])
@pytest.mark.parametrize("entry", [-2, 3, 2**31 - 1], ids=["below-minus-one", "n_in", "huge"])
def test_pool_ops_name_an_out_of_range_nbr_entry(op: str, entry: int) -> None:
    nbr = torch.tensor([[0, -1], [2, 1]], dtype=torch.int32)
    nbr[1, 0] = entry
    rev = torch.full((3, 2), -1, dtype=torch.int32)
    rule = r"every nbr entry must be -1 \(no neighbour\) or an input row in \[0, n_in\)"
    with pytest.raises(ValueError, match=rule):
        getattr(ops, op)(torch.randn(3, 2), nbr, rev)


@pytest.mark.parametrize("op", ["pool_sum", "pool_avg", "pool_max"])
@pytest.mark.parametrize(
    "nbr", [_i64(2, 2), _i32(4), torch.zeros(2, 2)], ids=["int64", "1-D", "float32"]
)
def test_pool_ops_name_a_malformed_nbr(op: str, nbr: torch.Tensor) -> None:
    with pytest.raises(ValueError, match=rf"lattice::{op}: nbr \(the kernel map\) must be an "
                                         r"int32 \(N_out, K\) table"):  # fmt: skip
        getattr(ops, op)(torch.randn(3, 2), nbr, _i32(3, 2))


def test_pool_max_backward_names_rev_and_argmax_rules() -> None:
    grad = torch.randn(2, 1)
    rev = torch.tensor([[0], [5]], dtype=torch.int32)  # output row 5 of 2
    with pytest.raises(ValueError, match=r"every rev entry must be -1 \(no neighbour\) or an "
                                         r"output row in \[0, n_out\)"):  # fmt: skip
        ops.pool_max_backward(grad, rev, _i32(2, 1))
    with pytest.raises(ValueError, match=r"every argmax entry -1 or an input row in \[0, n_in\)"):
        ops.pool_max_backward(grad, _i32(2, 1), torch.tensor([[7], [0]], dtype=torch.int32))


# ---- negative rows and bad grids reach no C core: each is named with its rule ----

_G2 = ([2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], [4, 4, 4])


@pytest.mark.parametrize("column", [0, 1, 3], ids=["batch", "x", "z"])
def test_generate_support_refuses_negative_rows(column: int) -> None:
    # A negative batch raised a bare "invalid argument"; a negative x gave a support.
    coords = torch.tensor([[0, 0, 0, 0], [0, 1, 1, 1]], dtype=torch.int32)
    coords[1, column] = -3
    with pytest.raises(ValueError, match=r"lattice::generate_support: coords must be "
                                         r"non-negative, found -3 \(row 1"):  # fmt: skip
        ops.generate_support(coords, *_G2, 1)


@pytest.mark.parametrize("column", [0, 2])
@pytest.mark.parametrize("trilinear", [False, True])
def test_devoxel_map_refuses_negative_voxel_coords(column: int, trilinear: bool) -> None:
    vc = torch.tensor([[0, 0, 0, 0], [0, 1, 1, 1]], dtype=torch.int32)
    vc[0, column] = -1
    with pytest.raises(ValueError, match=r"lattice::devoxel_map: voxel_coords must be "
                                         r"non-negative, found -1 \(row 0"):  # fmt: skip
        ops.devoxel_map(_PT, None, _ONE, _ZERO, vc, trilinear)


_BAD_GRIDS = [
    ("voxel_size", [0.0, 1.0, 1.0], "finite and > 0 in every axis"),
    ("voxel_size", [1.0, -2.0, 1.0], "finite and > 0 in every axis"),
    ("voxel_size", [1.0, 1.0, float("nan")], "finite and > 0 in every axis"),
    ("voxel_size", [float("inf")] * 3, "finite and > 0 in every axis"),
    ("voxel_size", [1e-50, 1.0, 1.0], "a positive finite float32 in every axis"),
    ("voxel_size", [1.0, 1.0], r"3 numbers \(x, y, z\), got \[1.0, 1.0\]"),
    ("voxel_size", [1.0] * 4, r"3 numbers \(x, y, z\)"),
    ("origin", [0.0, float("nan"), 0.0], "finite in every axis"),
    ("origin", [0.0, float("-inf"), 0.0], "finite in every axis"),
    ("origin", [0.0], r"3 numbers \(x, y, z\)"),
]


@pytest.mark.parametrize("op", ["voxelize_coords", "devoxel_map"])
@pytest.mark.parametrize(("name", "value", "rule"), _BAD_GRIDS)
def test_voxel_ops_name_a_bad_grid(op: str, name: str, value: list[float], rule: str) -> None:
    # Each raised a bare "invalid argument" from C, or a wrong-length list a TypeError
    # about a tuple ("function takes exactly 3 arguments").
    grid = {"voxel_size": _ONE, "origin": _ZERO, name: value}
    call = {
        "voxelize_coords": lambda: ops.voxelize_coords(_PT, None, grid["voxel_size"],
                                                       grid["origin"]),
        "devoxel_map": lambda: ops.devoxel_map(_PT, None, grid["voxel_size"], grid["origin"],
                                               _i32(1, 4), True),
    }[op]  # fmt: skip
    with pytest.raises(ValueError, match=rf"lattice::{op}: {name} must be {rule}"):
        call()


@pytest.mark.parametrize("dtype", [torch.complex64, torch.float64, torch.int32], ids=str)
def test_weight_gradients_refuse_a_grad_out_of_another_dtype(dtype: torch.dtype) -> None:
    # The CPU cast grad_out to the features' dtype (a complex one losing its imaginary
    # part with only a warning); CUDA refused. Both now refuse, naming grad_out.
    nbr = torch.tensor([[0, -1], [1, 0]], dtype=torch.int32)
    offsets, pair_in, pair_out = _pairs()
    feats, grad_out = torch.randn(2, 3), torch.ones(2, 4).to(dtype)
    rule = rf"grad_out \({dtype}\) must have the dtype of feats \(torch.float32\)"
    with pytest.raises(TypeError, match=f"lattice::sparse_conv_weight_grad: {rule}"):
        ops.sparse_conv_weight_grad(feats, grad_out, nbr)
    for gather in (False, True):
        with pytest.raises(TypeError, match=f"lattice::pair_conv_weight_grad: {rule}"):
            ops.pair_conv_weight_grad(feats, grad_out, offsets, pair_in, pair_out, gather)
