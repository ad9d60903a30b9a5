"""Checking a replay against expected outputs (a conformance fixture's ``expected.safetensors``).

Dense outputs are compared with ``torch.allclose``. A sparse output ``out`` is stored
as ``out.coords``, ``out.features`` and ``out.active``; row order is not part of
the exchange contract, so both sides are aligned by sorted coordinates, the
coordinate sets must be equal exactly, and only then are features compared with
the tolerances.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from torch_lattice.artifact.program import SparseOutput

__all__ = ["OutputCheck", "compare_outputs"]


@dataclass(frozen=True)
class OutputCheck:
    """The verdict on one output: ``ok``, the largest feature error and why it failed."""

    name: str
    ok: bool
    max_abs_error: float
    detail: str


def _sorted_rows(coords: torch.Tensor, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    c = coords.to(torch.int64).cpu()
    order = torch.arange(c.shape[0])
    for col in range(c.shape[1] - 1, -1, -1):  # stable sorts, last key first: (b, x, y, z)
        order = order[torch.argsort(c[order, col], stable=True)]
    return c[order], feats.cpu()[order]


def _max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape or a.numel() == 0:
        return 0.0 if a.shape == b.shape else float("inf")
    return float((a.to(torch.float64) - b.to(torch.float64)).abs().max())


def _numbers(name: str, value: torch.Tensor) -> None:
    """Expected values must be real numbers: the comparison casts to float, which drops a
    complex value's imaginary part (1+5j matched 1) and reads True as 1."""
    if value.is_complex() or value.dtype == torch.bool:
        raise ValueError(f"expected {name} must hold real numbers (a floating or integer "
                         f"dtype), got {value.dtype}")


def _check_expected(name: str, coords: torch.Tensor, feats: torch.Tensor,
                    active: torch.Tensor) -> None:
    """A malformed expected file is a bad input, not a mismatch: it raises."""
    for part, value in (("coords", coords), ("features", feats), ("active", active)):
        _numbers(f"{name}.{part}", value)
    if coords.ndim != 2 or coords.shape[1] != 4 or coords.is_floating_point():
        raise ValueError(f"expected {name}.coords must be an integer (N, 4) tensor, got "
                         f"{coords.dtype} {tuple(coords.shape)}")
    if feats.ndim != 2 or feats.shape[0] != coords.shape[0]:
        raise ValueError(f"expected {name}.features must be (N, C) with N = {coords.shape[0]}, "
                         f"got {tuple(feats.shape)}")
    if active.numel() != 1 or active.is_floating_point():
        raise ValueError(f"expected {name}.active must be one integer, got {active.dtype} "
                         f"{tuple(active.shape)}")
    n = int(active.reshape(-1)[0])
    if not 0 <= n <= coords.shape[0]:
        raise ValueError(f"expected {name}.active = {n} is outside [0, {coords.shape[0]}]")


def _check_sparse(name: str, got: SparseOutput, expected: Mapping[str, torch.Tensor],
                  rtol: float, atol: float) -> OutputCheck:
    keys = [f"{name}.coords", f"{name}.features", f"{name}.active"]
    missing = [k for k in keys if k not in expected]
    if missing:
        return OutputCheck(name, False, float("inf"), f"expected file lacks {missing}")
    e_coords, e_feats, e_active = (expected[k] for k in keys)
    _check_expected(name, e_coords, e_feats, e_active)
    n = int(e_active.reshape(-1)[0])
    if int(got.active.reshape(-1)[0]) != n:
        return OutputCheck(name, False, float("inf"),
                           f"active {int(got.active.reshape(-1)[0])} != expected {n}")
    c1, f1 = _sorted_rows(got.coords, got.features)
    c2, f2 = _sorted_rows(e_coords[:n], e_feats[:n])
    if not torch.equal(c1, c2):
        return OutputCheck(name, False, float("inf"), "coordinate sets differ")
    err = _max_error(f1, f2)
    ok = f1.shape == f2.shape and torch.allclose(f1.float(), f2.float(), rtol=rtol, atol=atol)
    return OutputCheck(name, ok, err, f"{n} rows")


def compare_outputs(outputs: Mapping[str, torch.Tensor | SparseOutput],
                    expected: Mapping[str, torch.Tensor], *, rtol: float, atol: float
                    ) -> list[OutputCheck]:
    """One :class:`OutputCheck` per program output."""
    checks = []
    for name, value in outputs.items():
        if isinstance(value, SparseOutput):
            checks.append(_check_sparse(name, value, expected, rtol, atol))
            continue
        if name not in expected:
            checks.append(OutputCheck(name, False, float("inf"), "not in the expected file"))
            continue
        e = expected[name]
        _numbers(name, e)
        got = value.cpu()
        ok = got.shape == e.shape and torch.allclose(got.float(), e.float(), rtol=rtol, atol=atol)
        checks.append(OutputCheck(name, ok, _max_error(got, e), f"shape {tuple(got.shape)}"))
    return checks
