"""tests/c/test_core.c, the C core's standalone test, in the ordinary suite.

It links csrc/*.c without Python and checks the hash table, the kernel maps of
every family, supports, pair lists, convolution, pooling and voxelize against
brute-force references.  Here it is built without sanitizers, with -Werror.
scripts/sanitize.sh runs it under ASan, UBSan, LeakSanitizer and valgrind
(docs/sanitizers.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON_GLUE = ("tl_module.c", "tl_py")


def core_sources() -> list[str]:
    """csrc/*.c without the CPython glue."""
    return [
        str(p) for p in sorted((ROOT / "csrc").glob("*.c")) if not p.name.startswith(PYTHON_GLUE)
    ]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_c_core(tmp_path: Path) -> None:
    exe = tmp_path / "test_core"
    cmd = [
        "gcc",
        "-std=c11",
        "-O1",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-fopenmp",
        f"-I{ROOT / 'csrc'}",
        str(ROOT / "tests" / "c" / "test_core.c"),
        *core_sources(),
        "-lm",
        "-o",
        str(exe),
    ]
    built = subprocess.run(cmd, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    ran = subprocess.run(
        [str(exe)], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"}
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "all checks passed" in ran.stdout
