"""tests/c/test_core.c, the C core's standalone test, in the ordinary suite.

It links csrc/core/*.c, the torch-free core, without Python and checks the hash
table, the kernel maps of every family, supports, pair lists, convolution,
pooling and voxelize against brute-force references.  Here it is built without
sanitizers, with -Werror.
scripts/sanitize.sh runs it under ASan, UBSan, LeakSanitizer and valgrind
(docs/sanitizers.md).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "csrc" / "core"
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)


def core_sources() -> list[str]:
    """csrc/core/*.c: the C core, which the CPython binding (csrc/python) wraps."""
    return [str(p) for p in sorted(CORE.glob("*.c"))]


def test_core_includes_only_itself_and_the_c_library() -> None:
    """csrc/core stands alone: no Python.h, nothing from csrc/python or csrc/cuda; its own
    headers by bare name, everything else a C, POSIX or OpenMP system header."""
    files = sorted(CORE.glob("*.[ch]"))
    assert files
    own = {p.name for p in files}
    for path in files:
        for name in INCLUDE.findall(path.read_text()):
            local = name.startswith("tl_") or name.startswith(".") or "cuda" in name
            assert "Python" not in name, f"{path.name} includes {name}"
            assert name in own or not local, f"{path.name} includes {name}"


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
@pytest.mark.parametrize("portable", [False, True], ids=["native", "portable"])
def test_c_core(tmp_path: Path, portable: bool) -> None:
    """The core as this machine builds it, and as a build without the x86 vector code
    (ARM, clang: TL_SIMD_PORTABLE) builds it, which nothing else here compiles."""
    exe = tmp_path / "test_core"
    flags = [
        "-std=c11",
        "-O1",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-fopenmp",
        *(["-DTL_SIMD_PORTABLE"] if portable else []),
        f"-I{CORE}",
    ]
    sources = [str(ROOT / "tests" / "c" / "test_core.c"), *core_sources()]
    objects = [str(tmp_path / f"{i}_{Path(src).stem}.o") for i, src in enumerate(sources)]

    def compile_one(src: str, obj: str) -> subprocess.CompletedProcess:
        return subprocess.run(["gcc", *flags, "-c", src, "-o", obj], capture_output=True, text=True)

    # One compiler per core: the kernel files take most of the time.
    with ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0))) as pool:
        for built in pool.map(compile_one, sources, objects):
            assert built.returncode == 0, built.stderr
    built = subprocess.run(
        ["gcc", "-fopenmp", *objects, "-lm", "-o", str(exe)], capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr
    ran = subprocess.run(
        [str(exe)], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"}
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "all checks passed" in ran.stdout
