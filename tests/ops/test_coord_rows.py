"""unique_rows equals torch.unique(rows, dim=0, return_inverse=True): rows sorted by
(b, x, y, z), inverse[i] the position of rows[i], on both the packed-key and row-wise paths."""

from __future__ import annotations

import pytest
import torch

from torch_lattice.coord_rows import floor_rows, lookup_rows, unique_rows


@pytest.mark.parametrize("top", [1, 7, 300, 2**31 - 1], ids=str)
def test_matches_torch_unique(top):
    g = torch.Generator().manual_seed(top % 1000)
    rows = torch.randint(0, 4, (500, 4), generator=g)
    rows[:, 1:] = torch.randint(0, top, (500, 3), generator=g)
    rows = torch.cat([rows, rows[:100]])  # repeats
    rows = rows[torch.randperm(len(rows), generator=g)].to(torch.int32)
    want_u, want_i = torch.unique(rows, dim=0, return_inverse=True)
    got_u, got_i = unique_rows(rows)
    assert got_u.dtype == torch.int32
    assert torch.equal(got_u, want_u) and torch.equal(got_i, want_i)
    assert got_u.tolist() == [list(r) for r in sorted(set(map(tuple, rows.tolist())))]


def test_int64_rows_beyond_the_key_range_use_the_row_path():
    rows = torch.tensor([[3, 2**31, 5, 2**31], [0, 1, 2**31, 2**31], [3, 2**31, 5, 2**31]])
    u, i = unique_rows(rows)
    assert u.tolist() == [[0, 1, 2**31, 2**31], [3, 2**31, 5, 2**31]]
    assert i.tolist() == [1, 0, 1]


def test_empty():
    u, i = unique_rows(torch.zeros(0, 4, dtype=torch.int64))
    assert u.shape == (0, 4) and u.dtype == torch.int64 and i.shape == (0,)


def test_lookup_rows_finds_each_query_row_or_minus_one() -> None:
    source = torch.tensor([[0, 1, 2, 3], [1, 0, 0, 0], [0, 0, 0, 5]])
    query = torch.tensor([[0, 0, 0, 5], [0, 9, 9, 9], [0, 1, 2, 3], [1, 0, 0, 0], [0, 0, 0, 5]])
    assert lookup_rows(source, query).tolist() == [2, -1, 0, 1, 2]
    assert lookup_rows(source[:0], query).tolist() == [-1] * 5
    assert lookup_rows(source, query[:0]).shape == (0,)


def test_floor_rows_are_the_sorted_occupied_cells_of_the_coarse_grid() -> None:
    rows = torch.tensor([[0, 5, 0, 1], [0, 4, 1, 0], [1, 0, 0, 0], [0, 1, 3, 3]], dtype=torch.int32)
    assert floor_rows(rows, (2, 2, 2)).tolist() == [[0, 0, 1, 1], [0, 2, 0, 0], [1, 0, 0, 0]]


def test_lookup_rows_never_matches_a_negative_query_row() -> None:
    # Packed keys alias (0, 1, -1, 5) with (0, 0, 3, 5) when 3 is the largest y.
    source = torch.tensor([[0, 0, 3, 5], [0, 1, 0, 0]])
    query = torch.tensor([[0, 1, -1, 5], [0, 1, 0, 0], [-1, 0, 3, 5]])
    assert lookup_rows(source, query).tolist() == [-1, 1, -1]
