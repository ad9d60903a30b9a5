"""Replays the fuzz seed corpus (fuzz/corpus/<target>/) through each harness's
pure check function, and pins the C-core bugs the fuzzers found.

No atheris needed: scripts/fuzz.sh runs the real (bounded) fuzzing; this file
keeps the harnesses and their references honest in the normal suite.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from fuzz import _common  # noqa: E402
from fuzz._common import Finding  # noqa: E402
from torch_lattice import _C  # noqa: E402
from torch_lattice.ops.kmap import kernel_map  # noqa: E402

CORPUS = os.path.join(ROOT, "fuzz", "corpus")
TARGETS = sorted(
    f[len("fuzz_") : -len(".py")]
    for f in os.listdir(os.path.join(ROOT, "fuzz"))
    if f.startswith("fuzz_") and f.endswith(".py")
)
SEEDS = [(t, s) for t in TARGETS for s in sorted(os.listdir(os.path.join(CORPUS, t)))]


def _harness(target: str):
    return importlib.import_module(f"fuzz.fuzz_{target}")


def _seed_bytes(target: str, seed: str) -> bytes:
    with open(os.path.join(CORPUS, target, seed), "rb") as f:
        return f.read()


def test_every_target_has_seeds():
    assert TARGETS == sorted(
        ["checkpoint", "generate", "generative", "graph", "hash", "kernel_map", "pairs",
         "pool", "voxelize"]
    )
    for t in TARGETS:
        assert len(os.listdir(os.path.join(CORPUS, t))) >= 3, t


@pytest.mark.parametrize(("target", "seed"), SEEDS, ids=[f"{t}/{s}" for t, s in SEEDS])
def test_seed(target, seed):
    _harness(target).check(_seed_bytes(target, seed))


@pytest.mark.parametrize("target", TARGETS)
def test_short_and_empty_inputs(target):
    check = _harness(target).check
    for data in (b"", b"\x00", b"\xff" * 3, bytes(range(256))):
        check(data)


# ---- the checkers can fail --------------------------------------------------


class _Corrupting:
    """Stands in for _C; one entry point's integer result buffer gets a wrong
    value after a successful call."""

    def __init__(self, name: str, patch):
        self._name, self._patch = name, patch

    def __getattr__(self, attr):
        fn = getattr(_C, attr)
        if attr != self._name:
            return fn

        def wrapped(*args):
            out = fn(*args)
            self._patch(args)
            return out

        wrapped.__name__ = attr
        return wrapped


def _int32_view(addr: int):
    return (ctypes.c_int32 * 1).from_address(addr)


def _poke_int32(addr: int, value: int) -> None:
    ctypes.c_int32.from_address(addr).value = value


def _findings_with(monkeypatch, target: str, entry: str, corrupt) -> int:
    """How many of target's seeds raise Finding when `corrupt(args)` spoils
    the result buffer of `_C.<entry>` after every successful call."""
    harness = _harness(target)
    monkeypatch.setattr(harness, "_C", _Corrupting(entry, corrupt))
    caught = 0
    for seed in sorted(os.listdir(os.path.join(CORPUS, target))):
        try:
            harness.check(_seed_bytes(target, seed))
        except Finding:
            caught += 1
    return caught


def test_kernel_map_checker_catches_a_wrong_table(monkeypatch):
    def corrupt(args):  # nbr[0, 0] of every built table: flip absent <-> row 0
        pnbr, n_out = args[5], args[3]
        if n_out > 0 and pnbr:
            _poke_int32(pnbr, -1 if _int32_view(pnbr)[0] >= 0 else 0)

    caught = _findings_with(monkeypatch, "kernel_map", "kmap_build", corrupt)
    assert caught >= 1


def test_voxelize_checker_catches_a_wrong_row(monkeypatch):
    def corrupt(args):  # rows[0].x += 1 after a successful quantization
        prow, n = args[6], args[3]
        if n > 0:
            _poke_int32(prow + 4, _int32_view(prow + 4)[0] + 1)

    caught = _findings_with(monkeypatch, "voxelize", "voxel_quantize", corrupt)
    assert caught >= 1


def test_guard_detects_a_write_past_the_end():
    g = _common.Guarded((3, 4), np.int32)
    g.full[12] = 0
    with pytest.raises(Finding, match="past the end"):
        g.check("x")


def test_expect_rejects_unclean_errors():
    with pytest.raises(Finding, match="unclean"):
        _common.expect("f", (False, RuntimeError("boom")), ValueError)
    with pytest.raises(Finding, match="without a message"):
        _common.expect("f", (False, ValueError()), ValueError)
    with pytest.raises(Finding, match="reference expects"):
        _common.expect("f", (True, 1), ValueError)


# ---- regressions of bugs the fuzzers found ---------------------------------


def _brute_nbr(coords: torch.Tensor, ks, st, pd, dl) -> torch.Tensor:
    index = {tuple(r): i for i, r in enumerate(coords.tolist())}
    pos = [(a, b, c) for a in range(ks[0]) for b in range(ks[1]) for c in range(ks[2])]
    rows = []
    for q in coords.tolist():
        rows.append(
            [
                index.get((q[0], *(q[a + 1] * st[a] - pd[a] + r[a] * dl[a] for a in range(3))), -1)
                for r in pos
            ]
        )
    return torch.tensor(rows, dtype=torch.int32).reshape(len(rows), len(pos))


@pytest.mark.parametrize(
    ("ks", "pd", "dl"),
    [
        ((2, 1, 1), (1, 0, 0), (2, 1, 1)),
        ((4, 3, 1), (3, 1, 0), (2, 1, 1)),
        ((2, 2, 2), (1, 1, 1), (2, 2, 2)),
        ((3, 3, 3), (1, 1, 1), (1, 1, 1)),  # the odd case keeps its fast path
    ],
)
def test_self_relation_with_even_kernel_size(ks, pd, dl):
    """An input support related to itself with stride 1 and (k-1)*d == 2p: for an
    even kernel size there is no centre kernel row, but the self-submanifold fast
    path wrote every row into kernel row (K-1)/2 (found by fuzz_kernel_map)."""
    g = torch.Generator().manual_seed(3)
    c = torch.unique(torch.randint(0, 6, (120, 4), generator=g), dim=0).to(torch.int32)
    c[:, 0] %= 2
    c = torch.unique(c, dim=0)
    nbr, rev = kernel_map(c, c, list(ks), [1, 1, 1], list(pd), list(dl))
    want = _brute_nbr(c, ks, (1, 1, 1), pd, dl)
    assert torch.equal(nbr, want)
    k = want.shape[1]
    want_rev = torch.full_like(rev, -1)
    for o, row in enumerate(want.tolist()):
        for n, i in enumerate(row):
            if i >= 0:
                want_rev[i, n] = o
    assert rev.shape == (c.shape[0], k)
    assert torch.equal(rev, want_rev)


def test_pairs_fill_refuses_offsets_that_are_not_a_csr():
    """pairs_fill trusted its offsets: a row starting past offsets[k] (or a
    negative start) wrote outside the pair buffers (found by fuzz_pairs)."""
    nbr = np.array([[0, 1], [2, -1], [-1, 3]], dtype=np.int32)
    good = np.zeros(3, dtype=np.int64)
    _C.pairs_count(nbr.ctypes.data, 3, 2, good.ctypes.data, 1)
    assert good.tolist() == [0, 2, 4]
    for bad in ([0, 5, 4], [-2, 0, 4], [1, 2, 4], [0, 3, 2]):
        offsets = np.array(bad, dtype=np.int64)
        total = max(int(offsets[-1]), 0)
        pin = _common.Guarded((total,), np.int32)
        pout = _common.Guarded((total,), np.int32)
        with pytest.raises(ValueError, match="pairs_fill"):
            _C.pairs_fill(nbr.ctypes.data, 3, 2, offsets.ctypes.data, pin.ptr, pout.ptr, 1)
        pin.check("in")
        pout.check("out")
    pin = np.empty(4, dtype=np.int32)
    pout = np.empty(4, dtype=np.int32)
    _C.pairs_fill(nbr.ctypes.data, 3, 2, good.ctypes.data, pin.ctypes.data, pout.ctypes.data, 1)
    assert pin.tolist() == [0, 2, 1, 3] and pout.tolist() == [0, 1, 0, 2]
