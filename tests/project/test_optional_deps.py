"""torch_lattice.optional_deps: matplotlib is an extra, and a missing one is named.

The core (torch_lattice and every subpackage) must import without matplotlib; an entry
point that plots gets an ImportError naming the extra to install. Each case runs in a
fresh interpreter with ``sys.modules['matplotlib'] = None``, which makes every import of
matplotlib fail as if it were not installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torch_lattice import optional_deps

ROOT = Path(__file__).resolve().parents[2]


def _run_without_matplotlib(code: str) -> subprocess.CompletedProcess[str]:
    prelude = f"import sys\nsys.modules['matplotlib'] = None\nsys.path.insert(0, {str(ROOT)!r})\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=300
    )


def test_core_imports_without_matplotlib() -> None:
    code = (
        "import pkgutil, importlib\n"
        "import torch_lattice\n"
        "found = pkgutil.walk_packages(torch_lattice.__path__, 'torch_lattice.')\n"
        "names = [m.name for m in found if not m.name.endswith('__main__')]  # runs a CLI\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "print(len(names))\n"
    )
    done = _run_without_matplotlib(code)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 10  # the walk found the subpackages


@pytest.mark.parametrize("extra", ["demo", "benchmarks", "docs"])
def test_missing_matplotlib_names_the_extra(extra: str) -> None:
    code = (
        "from torch_lattice.optional_deps import require_matplotlib\n"
        "try:\n"
        f"    require_matplotlib({extra!r}, purpose='this report')\n"
        "except ImportError as e:\n"
        "    print(e)\n"
        "else:\n"
        "    print('no error')\n"
    )
    done = _run_without_matplotlib(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"this report needs matplotlib: pip install 'torch-lattice[{extra}]' "
        "(or pip install 'matplotlib>=3.7')"
    )


def test_unknown_extra_is_refused() -> None:
    with pytest.raises(ValueError, match=r"extra must be one of demo, benchmarks, docs, test"):
        optional_deps.require_matplotlib("plots")


def test_returns_pyplot_drawing_to_files() -> None:
    """In a fresh interpreter the backend becomes Agg (no display needed)."""
    code = (
        "from torch_lattice.optional_deps import require_matplotlib\n"
        "plt = require_matplotlib('demo')\n"
        "import matplotlib\n"
        "print(plt.__name__, matplotlib.get_backend().lower())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["matplotlib.pyplot", "agg"]
