"""scripts/pending-attribution.sh, which the device check runs where tests failed with
every pending CUDA change on: it reruns just those tests with none and with each change
alone, and says how many fail in each setting. Checked here on a synthetic log and a
throw-away test file whose one test fails only when ``pipelined_wgrad`` is on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from torch_lattice.ops import conv_cuda

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "pending-attribution.sh"

FAKE_TESTS = '''
import os

def _on(change):
    value = os.environ.get("TORCH_LATTICE_CUDA_PENDING", "")
    return value == "1" or change in value.split(",")

def test_fails_with_the_wgrad_change():
    assert not _on("pipelined_wgrad")

def test_passes():
    pass
'''


def _run(tmp_path: Path, log: str, **env: str) -> tuple[str, Path]:
    log_file = tmp_path / "test.log"
    log_file.write_text(log)
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(log_file), str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable, "DEVICE_CHECK_WORKERS": "0", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert (out / "attribution.txt").read_text() == proc.stdout
    return proc.stdout, out


def test_each_change_alone_places_the_failure(tmp_path: Path) -> None:
    tests = tmp_path / "test_fake.py"
    tests.write_text(FAKE_TESTS)
    failed = f"{tests}::test_fails_with_the_wgrad_change"
    log = (
        f"[gw0] [ 50%] PASSED {tests}::test_passes\n"
        f"[gw1] [100%] FAILED {failed} \n"
        f"FAILED {failed} - AssertionError: assert not True\n"  # the -rf summary line
    )
    text, _ = _run(tmp_path, log)
    lines = text.splitlines()
    assert lines[0] == (
        "attribution: 1 failed with every pending change on; again with none, then each alone"
    )
    assert lines[1] == "    TORCH_LATTICE_CUDA_PENDING=0 (the default path): 0 of 1 fail"
    for change, line in zip(conv_cuda.PENDING_CHANGES, lines[2:], strict=True):
        want = "1 of 1 fail" if change == "pipelined_wgrad" else "0 of 1 fail"
        assert line == f"    TORCH_LATTICE_CUDA_PENDING={change}: {want}"


def test_a_log_without_failures_reruns_nothing(tmp_path: Path) -> None:
    text, out = _run(tmp_path, "[gw0] [100%] PASSED tests/x.py::test_a\n")
    assert text.startswith("attribution: no failed tests")
    assert not list(out.glob("pytest-*.log"))


def test_too_many_failures_are_not_rerun(tmp_path: Path) -> None:
    log = "".join(f"[gw0] [{i:3d}%] FAILED tests/x.py::test_{i}[a b]\n" for i in range(5))
    text, out = _run(tmp_path, log, ATTRIBUTION_MAX="4")
    assert text.startswith("attribution: 5 failed tests, more than 4: not rerun")
    assert not list(out.glob("pytest-*.log"))
