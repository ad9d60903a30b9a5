"""The binary contract of torch_lattice._C (ARCHITECTURE.md, "Build")."""

from __future__ import annotations

import ast
import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import torch_lattice

PACKAGE_DIR = Path(torch_lattice.__file__).parent
ROOT = Path(__file__).resolve().parents[2]


def _extension() -> Path:
    found = sorted(PACKAGE_DIR.glob("_C*.so"))
    assert len(found) == 1, f"expected one built _C, found {found}"
    return found[0]


def test_extension_is_abi3() -> None:
    assert _extension().name == "_C.abi3.so"


@pytest.mark.skipif(shutil.which("ldd") is None, reason="ldd is not installed")
def test_extension_does_not_link_torch_or_cxx_runtime() -> None:
    deps = subprocess.run(["ldd", str(_extension())], capture_output=True, text=True).stdout
    for lib in ("libtorch", "libc10", "libstdc++", "libcudart.so", "libpython"):
        assert lib not in deps, f"_C links {lib}:\n{deps}"


def test_extension_imports_without_torch() -> None:
    """Loads _C straight from its file in a fresh interpreter: torch stays unloaded."""
    code = (
        "import importlib.util, sys\n"
        f"path = {str(_extension())!r}\n"
        "spec = importlib.util.spec_from_file_location('torch_lattice._C', path)\n"
        "mod = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(mod)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print(mod.cuda_compiled(), mod.cuda_device_count())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    compiled, devices = out.stdout.split()
    assert compiled in ("True", "False")
    assert int(devices) >= 0


def test_unbuilt_checkout_names_the_missing_extension(tmp_path: Path) -> None:
    """A checkout without _C, imported from the folder above it, says what to do.

    Python puts that folder first on sys.path, so it shadows an installed torch_lattice
    (the repository root after a non-editable ``pip install .``); without the check the
    import failed with "cannot import name '_C' from partially initialized module".
    """
    shutil.copytree(
        PACKAGE_DIR, tmp_path / "torch_lattice", ignore=shutil.ignore_patterns("_C*", "__pycache__")
    )
    # -S and the site-packages folders added as plain paths: torch importable, as after a
    # non-editable install, without the finder of an editable install (which would find
    # the real _C for the copy).
    site = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    code = f"import sys; sys.path += {site!r}; import torch_lattice"
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    expected = "ImportError: torch_lattice._C (the compiled core) is not built in "
    assert last.startswith(expected), out.stderr
    assert str(tmp_path / "torch_lattice") in last
    assert "pip install -e ." in last and "run Python from another folder" in last
    assert "partially initialized" not in out.stderr


def test_only_module_init_is_exported() -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm is not installed")
    out = subprocess.run(
        [nm, "-D", "--defined-only", str(_extension())], capture_output=True, text=True
    ).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert names == {"PyInit__C"}, names


def _gpu_visible() -> bool:
    """setup.py's own probe (device node, driver entry or `nvidia-smi -L`), taken from
    the file alone: running all of setup.py would start a build."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    probe = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_gpu_present"]
    namespace: dict[str, object] = {
        "glob": glob,
        "shutil": shutil,
        "subprocess": subprocess,
        "Path": Path,
    }
    exec(compile(ast.Module(body=probe, type_ignores=[]), "setup.py", "exec"), namespace)
    present = namespace["_gpu_present"]
    assert callable(present)
    return bool(present())


@pytest.mark.skipif(
    os.environ.get("CI") != "true" or shutil.which("nvcc") is None,
    reason="CI with nvcc builds the CUDA sources (.ci/run sets TORCH_LATTICE_CUDA=1)",
)
def test_ci_builds_cuda_sources() -> None:
    """CUDA code must compile in CI even on a runner without a GPU: .ci/run asks for it
    with TORCH_LATTICE_CUDA=1 wherever nvcc exists."""
    assert torch_lattice.ops._runtime._C.cuda_compiled()


def _build_mode() -> str | None:
    """TORCH_LATTICE_CUDA of scripts/setup-env.sh's last build of this venv, if recorded."""
    mode = Path(sys.prefix) / ".torch-lattice-cuda-mode"
    return mode.read_text().strip() if mode.is_file() else None


@pytest.mark.skipif(
    _build_mode() != "auto" or shutil.which("nvcc") is None,
    reason="a default (auto) build by scripts/setup-env.sh with nvcc present",
)
def test_auto_build_compiles_cuda_only_where_a_gpu_is_visible() -> None:
    """TORCH_LATTICE_CUDA=auto with nvcc present compiles csrc/cuda exactly when a GPU is
    visible (issue 25: a GPU-less machine does not pay for the CUDA compile)."""
    assert torch_lattice.ops._runtime._C.cuda_compiled() == _gpu_visible()


def _tracked(under: str) -> set[str]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", under], capture_output=True,
                         text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return set(out.stdout.split())


def test_the_sdist_carries_every_source_header_and_the_license(tmp_path: Path) -> None:
    """Without MANIFEST.in setuptools packed only the .c files setup.py names: an sdist
    with no headers, no CUDA sources and no license, which failed to build."""
    import tarfile

    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True)
    (archive,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    missing = sorted(_tracked("csrc") - names)
    assert not missing, missing
    assert {"LICENSE", "setup.py", "pyproject.toml"} <= names


def test_every_build_compiles() -> None:
    """setuptools skips a build whose extension is newer than its .c files, so a header
    edit or other build settings (TORCH_LATTICE_CUDA, CFLAGS) in a reused tree installed
    the previous binary; the project's build_ext always compiles. Its class is run from
    setup.py's text (importing setup.py would run setup())."""
    from setuptools import Distribution

    tree = ast.parse((ROOT / "setup.py").read_text())
    kept = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
            or (isinstance(n, ast.ClassDef) and n.name == "LatticeBuildExt")]
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=kept, type_ignores=[]), "setup.py", "exec"), namespace)
    command = namespace["LatticeBuildExt"](Distribution())
    command.initialize_options()
    command.finalize_options()
    assert command.force
