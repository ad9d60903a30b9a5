"""The memory budget (issue 21): one documented limit, checked before big allocations.

Each hostile case is a tiny input whose computed allocation is huge; with the budget
fixed at 1 GiB (so the result does not depend on this machine) it must be refused with a
ValueError naming the operation, the size and the limit, and the same operation on a
small input must still run.
"""

from __future__ import annotations

import pytest
import torch

import torch_lattice as tl
from torch_lattice import memory_budget
from torch_lattice.memory_budget import MemoryBudgetError, check_allocation
from torch_lattice.nn import functional as F

GIB = 2**30


@pytest.fixture
def budget_1gib():
    previous = tl.set_memory_budget(GIB)
    yield
    tl.set_memory_budget(previous)


def _one_row(stride: int = 1, channels: int = 1, batch: int = 0) -> tl.SparseTensor:
    coords = torch.tensor([[batch, 5, 5, 5]], dtype=torch.int32)
    return tl.SparseTensor(torch.ones(1, channels), coords, stride=stride)


def test_set_get_and_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(memory_budget.ENV_VAR, raising=False)
    previous = tl.set_memory_budget(12345)
    try:
        assert tl.get_memory_budget() == 12345
        tl.set_memory_budget(None)
        default = tl.get_memory_budget()
        assert default == memory_budget.default_memory_budget() >= 1
        physical = memory_budget._physical_memory()
        if physical is not None:
            assert default <= physical * memory_budget.DEFAULT_FRACTION
    finally:
        tl.set_memory_budget(previous)


def test_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    previous = tl.set_memory_budget(None)
    try:
        for text, value in (("1048576", 2**20), ("512M", 512 * 2**20), ("1.5G", 3 * 2**29),
                            ("2GiB", 2 * GIB), (" 64k ", 64 * 1024)):
            monkeypatch.setenv(memory_budget.ENV_VAR, text)
            assert tl.get_memory_budget() == value, text
        # exact beyond a float's 53 bits (it read 12345678901234567168)
        monkeypatch.setenv(memory_budget.ENV_VAR, "12345678901234567891")
        assert tl.get_memory_budget() == 12345678901234567891
        for bad in ("lots", "-5", "0", "1e9", "5X"):
            monkeypatch.setenv(memory_budget.ENV_VAR, bad)
            with pytest.raises(ValueError, match=memory_budget.ENV_VAR):
                tl.get_memory_budget()
        monkeypatch.setenv(memory_budget.ENV_VAR, "1.1G")  # a fraction of a unit: rounded down
        assert tl.get_memory_budget() == int(1.1 * GIB) == 1181116006
        monkeypatch.setenv(memory_budget.ENV_VAR, "0.3K")
        assert tl.get_memory_budget() == 307
        for bad, rule in (("1.9", "a whole number of bytes without a unit, got '1.9'"),
                          ("0.0003K", r"at least 1 byte, got '0.0003K'"),
                          ("9" * 400, r"a positive byte count of at most 64 characters "
                                      r".* \(400 characters\)")):
            monkeypatch.setenv(memory_budget.ENV_VAR, bad)
            with pytest.raises(ValueError, match=memory_budget.ENV_VAR + " must be " + rule):
                tl.get_memory_budget()
        monkeypatch.setenv(memory_budget.ENV_VAR, "1G")
        tl.set_memory_budget(100)  # the explicit setting wins over the environment
        assert tl.get_memory_budget() == 100
    finally:
        tl.set_memory_budget(previous)


@pytest.mark.parametrize("bad,error", [(0, ValueError), (-1, ValueError), (1.5, TypeError),
                                       (True, TypeError), ("1G", TypeError)])
def test_bad_budgets_are_refused(bad: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="memory budget"):
        tl.set_memory_budget(bad)  # type: ignore[arg-type]


def test_the_error_names_operation_size_and_limit(budget_1gib: None) -> None:
    check_allocation("small thing", GIB)  # at the limit: allowed
    with pytest.raises(MemoryBudgetError) as info:
        check_allocation("big thing", GIB + 1)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "big thing" in message and str(GIB + 1) in message and str(GIB) in message
    assert "set_memory_budget" in message and memory_budget.ENV_VAR in message


def test_dense_on_a_huge_range_is_refused(budget_1gib: None) -> None:
    x = tl.SparseTensor(torch.ones(1, 1), torch.zeros(1, 4, dtype=torch.int32),
                        spatial_range=(1, 2**17, 2**17, 2**16))  # 2^50 cells
    with pytest.raises(ValueError, match=r"dense\(\) of spatial_range .* memory budget"):
        x.dense()
    small = tl.SparseTensor(torch.ones(1, 2), torch.zeros(1, 4, dtype=torch.int32),
                            spatial_range=(1, 2, 2, 2))
    assert small.dense().shape == (1, 2, 2, 2, 2)


def test_global_pool_at_the_last_batch_index_is_refused(budget_1gib: None) -> None:
    x = _one_row(channels=2, batch=2**31 - 1)
    with pytest.raises(ValueError, match=r"global_pool of 2147483648 batches .* memory budget"):
        F.global_pool(x, "sum")
    with pytest.raises(ValueError, match="memory budget"):
        F.global_max_pool(x)
    assert F.global_pool(_one_row(channels=2, batch=3), "sum").shape == (4, 2)


def test_a_generative_transpose_with_the_largest_kernel_is_bounded(budget_1gib: None) -> None:
    """One row runs in pair lists of 2^15 pairs (no 4 GiB neighbour table,
    tests/ops/test_transpose_pairs.py); 1000 rows (2^15 pairs each, 44 bytes a pair) are
    refused before anything is built."""
    w = torch.ones(32**3, 1, 1)
    assert F.generative_conv_transpose3d(_one_row(stride=32), w, None, 32, 32).feats.shape == (
        32**3, 1)
    rows = torch.zeros(1000, 4, dtype=torch.int32)
    rows[:, 1] = torch.arange(1000, dtype=torch.int32)
    many = tl.SparseTensor(torch.ones(1000, 1), rows, stride=32)
    with pytest.raises(ValueError, match=r"transposed pair lists \(1000 source rows x 32768 "
                       r"kernel rows.*kernel_size \(32, 32, 32\).* memory budget"):
        F.generative_conv_transpose3d(many, w, None, 32, 32)
    y = F.generative_conv_transpose3d(_one_row(stride=4), torch.ones(64, 1, 1), None, 4, 4)
    assert y.coords.shape == (64, 4)


def test_a_pooling_transpose_without_target_is_bounded(budget_1gib: None) -> None:
    """One row with a 32^3 kernel averages over 2^15 pairs (no neighbour table,
    tests/ops/test_transpose_pairs.py); 1000 such rows are refused before generating."""
    one = F.pool_transpose3d(_one_row(stride=32), 32, 32, expand_coordinates=True)
    assert one.feats.shape == (32**3, 1)
    rows = torch.zeros(1000, 4, dtype=torch.int32)
    rows[:, 1] = torch.arange(1000, dtype=torch.int32)
    many = tl.SparseTensor(torch.ones(1000, 1), rows, stride=32)
    with pytest.raises(ValueError, match=r"pool_transpose3d without a target .* memory budget"):
        F.pool_transpose3d(many, 32, 32, expand_coordinates=True)
    assert F.pool_transpose3d(_one_row(stride=2), 2, 2, expand_coordinates=True).feats.shape == (
        8, 1)


def test_trilinear_upsampling_with_a_huge_stride_is_refused(budget_1gib: None) -> None:
    """Stride 645: a 1289^3 kernel, 2.1e9 generated rows from one input row."""
    x = _one_row(stride=645)
    with pytest.raises(ValueError, match=r"trilinear_upsample3d without a target .*memory budget"):
        F.trilinear_upsample3d(x, 645)


def test_trilinear_upsampling_grows_with_the_real_pairs(budget_1gib: None) -> None:
    """Stride 40 on one row: 79^3 fine rows, each with one coarse neighbour. The
    relation's (N_fine, 79^3) neighbour table would take 972 GB; the pairs are 79^3."""
    x = _one_row(stride=40)
    y = F.trilinear_upsample3d(x, 40)
    assert y.coords.shape == (79**3, 4) and y.stride == (1, 1, 1)
    assert torch.equal(y.feats, torch.ones(79**3, 1))  # normalized over the one neighbour
    assert x.coordinate_manager.builds == 0  # no neighbour table was built


def test_trilinear_upsampling_with_a_small_stride_runs(budget_1gib: None) -> None:
    y = F.trilinear_upsample3d(_one_row(stride=2), 2)
    assert y.feats.shape == (27, 1) and torch.allclose(y.feats, torch.ones(27, 1))


def test_a_raised_budget_lets_a_big_map_through() -> None:
    x = _one_row(stride=8)
    previous = tl.set_memory_budget(1024)
    try:
        with pytest.raises(ValueError, match="memory budget"):
            F.generative_conv_transpose3d(x, torch.ones(512, 1, 1), None, 8, 8)
        tl.set_memory_budget(64 * 2**20)
        assert F.generative_conv_transpose3d(x, torch.ones(512, 1, 1), None, 8, 8).feats.shape == (
            512, 1)
    finally:
        tl.set_memory_budget(previous)


def test_cpu_support_generation_counts_its_sorting_scratch() -> None:
    """The CPU sorts up to 8 candidates per input row (128 bytes a row) beside the output
    rows (16 bytes each): a budget that holds the outputs but not the scratch refuses the
    generation before it starts, and one that holds both runs it."""
    from torch_lattice.ops.kmap import CPU_GENERATE_SCRATCH, generate_support

    coords = torch.stack(
        torch.meshgrid(torch.zeros(1, dtype=torch.long), *[torch.arange(10)] * 3, indexing="ij"),
        dim=-1,
    ).reshape(-1, 4).int()
    n = coords.shape[0]
    args = ([2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], [5, 5, 5], 1)
    previous = tl.set_memory_budget(n * 16 + n * CPU_GENERATE_SCRATCH // 2)
    try:
        with pytest.raises(MemoryBudgetError, match=r"strided support generation \(1000 input"):
            generate_support(coords, *args)
        tl.set_memory_budget(n * 16 + n * CPU_GENERATE_SCRATCH)
        assert generate_support(coords, *args).shape == (125, 4)
    finally:
        tl.set_memory_budget(previous)


def test_a_pooling_window_over_a_huge_range_is_refused(budget_1gib: None) -> None:
    """One row, a 1000^3 window at stride 1: 10^9 generated output rows (16 GB)."""
    x = tl.SparseTensor(torch.ones(1, 1), torch.tensor([[0, 5, 5, 5]], dtype=torch.int32),
                        spatial_range=(1, 2**20, 2**20, 2**20))
    with pytest.raises(ValueError, match=r"strided support generation .*1000000000 output rows"):
        F.max_pool3d(x, 1000, 1)
    assert F.max_pool3d(x, 2, 2).coords.tolist() == [[0, 2, 2, 2]]
