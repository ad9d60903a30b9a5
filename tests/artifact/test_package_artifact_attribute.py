"""``tl.artifact``: reachable from the package, imported only on first use."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import torch_lattice

ROOT = Path(torch_lattice.__file__).parent.parent


def test_artifact_is_loaded_on_first_use_only() -> None:
    # A fresh interpreter: this test process may have imported the exporter already.
    code = (
        "import sys\n"
        "import torch_lattice as tl\n"
        "assert 'torch_lattice.artifact' not in sys.modules, 'artifact imported eagerly'\n"
        "assert 'artifact' in dir(tl) and 'artifact' in tl.__all__\n"
        "save = tl.artifact.save_lattice_model_artifact\n"
        "import torch_lattice.artifact as a\n"
        "assert a is tl.artifact and save is a.save_lattice_model_artifact\n"
        "assert tl.artifact.load_lattice_program is a.load_lattice_program\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr


def test_unknown_attribute_still_raises() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'artifacts'"):
        _ = torch_lattice.artifacts  # type: ignore[attr-defined]
