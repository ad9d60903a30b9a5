"""The project's pytest configuration (pyproject.toml, tests/conftest.py): the default
output names why tests were skipped, one line per location and reason (``-rs``) and one
line over all reasons (issue 25: 454 skips came with no reason); and the layout of tests/
that pytest's default import mode needs (tests/conftest.py says why)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = '''\
import pytest

@pytest.mark.parametrize("i", range(3))
def test_needs_a_gpu(i):
    pytest.skip("needs a CUDA GPU")

@pytest.mark.skipif(True, reason="needs torchsparse")
def test_needs_torchsparse():
    pass

def test_runs():
    pass
'''


def test_skip_reasons_are_summarised_by_default(tmp_path: Path) -> None:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", str(probe)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    skipped = [ln for ln in lines if ln.startswith("SKIPPED")]
    assert len(skipped) == 2, result.stdout
    assert skipped[0].startswith("SKIPPED [3] ") and skipped[0].endswith(": needs a CUDA GPU")
    assert skipped[1].startswith("SKIPPED [1] ") and skipped[1].endswith(": needs torchsparse")
    assert "skip reasons: 3 needs a CUDA GPU; 1 needs torchsparse" in lines, result.stdout


def test_test_files_sit_in_folders_with_unique_basenames() -> None:
    tests = ROOT / "tests"
    files = sorted(tests.rglob("test_*.py"))
    assert files, tests
    assert not list(tests.glob("test_*.py")), "test files go in a folder: ops/, nn/, ..."
    names = Counter(f.name for f in files)
    assert not [n for n, k in names.items() if k > 1], names
    assert not list(tests.rglob("__init__.py"))
