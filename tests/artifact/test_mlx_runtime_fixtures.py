"""Replay of the outputs recorded from the MLX Lattice runtime (tests/fixtures/mlx_runtime).

The folder is a copy of what MLX Lattice 0.6.3 computed for 48 artifacts (its README
states the consumer's semantics case by case); the replay must reproduce every case in
physical coordinates within the manifest's tolerances, the -inf rows of a max pool
that reads nothing included.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from torch_lattice.artifact.__main__ import main as replay_main
from torch_lattice.artifact.conformance import compare_outputs
from torch_lattice.artifact.program import SparseOutput, load_lattice_program

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "mlx_runtime"
MANIFEST = json.loads((ROOT / "manifest.json").read_text(encoding="utf-8"))
CASES = {case["name"]: case for case in MANIFEST["cases"]}


def test_manifest_lists_every_recorded_case() -> None:
    folders = {p.name for p in ROOT.iterdir() if p.is_dir()}
    assert folders == set(CASES)
    assert len(CASES) == 48


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_replays_within_tolerance(name: str) -> None:
    case = CASES[name]
    program = load_lattice_program(ROOT / name)  # physical: the default
    outputs = program(**load_file(str(ROOT / name / "inputs.safetensors")))
    expected = load_file(str(ROOT / name / "expected.safetensors"))
    assert set(outputs) == set(case["outputs"])
    checks = compare_outputs(outputs, expected, rtol=case["rtol"], atol=case["atol"])
    failed = [f"{c.name}: max|err|={c.max_abs_error:.3g} ({c.detail})" for c in checks if not c.ok]
    assert not failed, failed
    for out_name, spec in case["outputs"].items():
        value = outputs[out_name]
        if isinstance(value, SparseOutput):
            assert value.features.shape == (spec["rows"], spec["channels"])


def test_max_pool_rows_that_read_nothing_are_minus_infinity() -> None:
    # k3 s2 p1 over the floor support: some generated rows have no input in their window.
    name = "pool_max_k3_s2_p1"
    expected = load_file(str(ROOT / name / "expected.safetensors"))["out.features"]
    empty = torch.isneginf(expected).all(dim=1)
    assert int(empty.sum()) > 0
    program = load_lattice_program(ROOT / name)
    out = program(**load_file(str(ROOT / name / "inputs.safetensors")))["out"]
    assert int(torch.isneginf(out.features).all(dim=1).sum()) == int(empty.sum())


def test_cli_replays_the_whole_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert replay_main(["replay", str(ROOT)]) == 0
    assert "48/48 cases match (physical coordinates)" in capsys.readouterr().out


def test_cli_replays_one_case_with_its_manifest_tolerance(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Packed float16 scales put this case ~1e-3 from the record: the default 1e-5 fails it.
    name = "packed_subm_k3_int8_g32"
    assert CASES[name]["atol"] > 1e-3
    assert replay_main(["replay", str(ROOT), "--case", name]) == 0
    assert "1/1 cases match (physical coordinates)" in capsys.readouterr().out
    # The fixtures' README: `replay <this folder>/<case>` takes the manifest's tolerances.
    assert replay_main(["replay", str(ROOT / name)]) == 0
    assert "match (physical coordinates)" in capsys.readouterr().out
