"""The CUDA wrappers' cache of map-derived data (``conv_cuda._derived``), host side.

What implicit GEMM and fetch-on-demand derive from a map alone (the row order, the tile
prefix) is computed by ``_C.cuda_conv_derive`` once per map tensor and kept on it, behind
``TORCH_LATTICE_CUDA_PENDING=1``. The device computation itself is checked on a GPU
(tests/ops/test_cuda_syncs.py, tests/ops/test_cuda_tensor_cores.py); here a stand-in for
``_C`` counts the calls, so the caching rules run on any machine: off by default, one
derivation per map tensor and key, a new one after an in-place change, nothing kept while a
CUDA graph is captured.
"""

from __future__ import annotations

import pytest
import torch

from torch_lattice.ops import conv_cuda

SIZES = (5000, 6000, 27, 32, 32)  # n_in, n_out, k, c_in, c_out


class FakeC:
    """The two entry points ``_derived`` calls, recording their arguments."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.sized: list[tuple[int, ...]] = []
        self.derived: list[tuple[int, ...]] = []

    def cuda_conv_derived_size(self, *args: int) -> int:
        self.sized.append(args)
        return self.size

    def cuda_conv_derive(self, *args: object) -> None:
        self.derived.append(tuple(a for a in args if isinstance(a, int)))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeC:
    stand_in = FakeC(8 * SIZES[1])
    monkeypatch.setattr(conv_cuda, "_C", stand_in)
    monkeypatch.setattr(conv_cuda, "call_args", lambda device: (0, 0))
    monkeypatch.setattr(conv_cuda, "workspace_alloc", lambda device: lambda nbytes: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setenv(conv_cuda.PENDING_ENV, "1")
    return stand_in


def _table() -> torch.Tensor:
    return torch.full((SIZES[1], SIZES[2]), -1, dtype=torch.int32)


def _derive(nbr: torch.Tensor, weight_grad: bool = False, sizes: tuple = SIZES):
    return conv_cuda._derived("implicit_gemm", weight_grad, 1, sizes, nbr, None, 0)


def test_off_by_default(fake: FakeC, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(conv_cuda.PENDING_ENV)
    assert not conv_cuda.pending()
    assert _derive(_table()) is None
    assert fake.sized == [] and fake.derived == []
    monkeypatch.setenv(conv_cuda.PENDING_ENV, "0")
    assert _derive(_table()) is None and fake.derived == []


def test_derived_once_per_map_and_key(fake: FakeC) -> None:
    nbr = _table()
    first = _derive(nbr)
    assert isinstance(first, torch.Tensor) and first.dtype == torch.uint8
    assert first.numel() == fake.size
    assert _derive(nbr) is first
    assert len(fake.derived) == 1
    # another input row count and the other direction are other keys
    other = _derive(nbr, sizes=(4000, *SIZES[1:]))
    assert other is not first and len(fake.derived) == 2
    _derive(nbr, weight_grad=True)
    assert len(fake.derived) == 3
    # another map tensor has its own
    assert _derive(_table()) is not first and len(fake.derived) == 4


def test_in_place_change_derives_again(fake: FakeC) -> None:
    nbr = _table()
    first = _derive(nbr)
    nbr[0, 0] = 3  # the map changed: its order may have
    second = _derive(nbr)
    assert second is not first and len(fake.derived) == 2
    assert _derive(nbr) is second


def test_nothing_to_derive_is_kept_too(fake: FakeC) -> None:
    fake.size = 0
    nbr = _table()
    assert _derive(nbr) is None
    assert _derive(nbr) is None
    assert len(fake.sized) == 1 and fake.derived == []


def test_nothing_kept_during_graph_capture(fake: FakeC, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    nbr = _table()
    assert _derive(nbr) is None
    assert fake.sized == [] and not hasattr(nbr, "_tl_derived")


def test_pair_lists_key_on_offsets(fake: FakeC) -> None:
    offsets = torch.zeros(SIZES[2] + 1, dtype=torch.int64)
    pair_in = torch.zeros(10, dtype=torch.int32)
    pairs = (offsets, pair_in, pair_in.clone())
    a = conv_cuda._derived("fetch_on_demand", False, 1, SIZES, None, pairs, 10)
    b = conv_cuda._derived("fetch_on_demand", False, 1, SIZES, None, pairs, 10)
    assert a is b and len(fake.derived) == 1
    assert offsets._tl_derived[0] == offsets._version
    # the weight gradient's chunks depend on the channels: its own entry
    conv_cuda._derived("fetch_on_demand", True, 1, SIZES, None, pairs, 10)
    conv_cuda._derived("fetch_on_demand", True, 1, (*SIZES[:3], 64, 64), None, pairs, 10)
    assert len(fake.derived) == 3


def test_a_map_made_under_inference_mode_is_kept(fake: FakeC) -> None:
    # An inference tensor has no version counter (reading it raises): the map is taken as
    # unchanged, as the CPU's tile lists do, instead of failing the call.
    with torch.inference_mode():
        nbr = _table()
        first = _derive(nbr)
        assert _derive(nbr) is first
    assert len(fake.derived) == 1
    offsets = torch.zeros(SIZES[2] + 1, dtype=torch.int64)
    with torch.inference_mode():
        ranges = conv_cuda._row_ranges(offsets.clone())
    assert ranges == []
