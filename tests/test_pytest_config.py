"""The project's pytest configuration (pyproject.toml): the default output names why
tests were skipped, one grouped line per reason (issue 25: 454 skips came with no reason)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = '''\
import pytest

@pytest.mark.parametrize("i", range(3))
def test_needs_a_gpu(i):
    pytest.skip("needs a CUDA GPU")

def test_runs():
    pass
'''


def test_skip_reasons_are_summarised_by_default(tmp_path: Path) -> None:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", str(probe)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    skipped = [ln for ln in result.stdout.splitlines() if ln.startswith("SKIPPED")]
    assert len(skipped) == 1, result.stdout
    assert skipped[0].startswith("SKIPPED [3] ") and skipped[0].endswith(": needs a CUDA GPU")
