"""scripts/setup-env.sh records the torch it installed and refuses a venv whose torch
something else replaced (issue 25: `uv run` in a clone the scripts set up swapped
torch 2.13.0+cpu for a CUDA build, and the set-up carried on).

A stand-in interpreter (the test's Python with a fake ``torch`` package first on its
path) plays the venv's Python, so each case takes well under a second and installs
nothing; one case runs setup-env.sh itself on such a venv.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
HELPER = ROOT / "scripts" / "setup_env_record.py"


def _helper() -> ModuleType:
    spec = importlib.util.spec_from_file_location("setup_env_record", HELPER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_torch(site: Path, version: str, cuda: str | None) -> None:
    """A ``torch`` package that only knows its version, and an empty numpy."""
    (site / "torch").mkdir(parents=True, exist_ok=True)
    (site / "torch" / "__init__.py").write_text(
        "from types import SimpleNamespace\n"
        f"__version__ = {version!r}\n"
        f"version = SimpleNamespace(cuda={cuda!r})\n"
    )
    (site / "numpy").mkdir(exist_ok=True)
    (site / "numpy" / "__init__.py").write_text("")


def _fake_python(tmp_path: Path, version: str, cuda: str | None) -> Path:
    site = tmp_path / "site"
    _fake_torch(site, version, cuda)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return python


def _run(
    action: str, record: Path, python: Path, requirement: str = "torch==2.13.0", **env: str
) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "TORCH_LATTICE_ACCEPT_TORCH"}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, str(HELPER), action, "--record", str(record),
         "--requirement", requirement, "--python", str(python)],
        capture_output=True,
        text=True,
        env=full_env,
    )


def test_record_then_replaced_torch_is_refused_with_the_restore_command(tmp_path: Path) -> None:
    record = tmp_path / "torch-lattice-setup.json"
    python = _fake_python(tmp_path, "2.13.0+cpu", None)
    assert _run("write", record, python).returncode == 0
    entry = json.loads(record.read_text())
    assert (entry["torch"], entry["torch_cuda"], entry["requirement"]) == (
        "2.13.0+cpu",
        None,
        "torch==2.13.0",
    )
    ok = _run("check", record, python)
    assert (ok.returncode, ok.stderr) == (0, "")

    _fake_torch(tmp_path / "site", "2.15.0+cu132", "13.2")  # what `uv run` installed
    refused = _run("check", record, python)
    assert refused.returncode == 3
    lines = refused.stderr.splitlines()
    assert lines[0] == (
        "[setup] STOP: the torch in .venv is not the one scripts/setup-env.sh installed."
    )
    assert "torch 2.13.0+cpu (CPU build)" in refused.stderr
    assert ".venv now holds torch 2.15.0+cu132 (CUDA 13.2 build)" in refused.stderr
    assert "[setup]     rm -rf .venv && scripts/setup-env.sh" in lines
    assert "[setup]     TORCH_LATTICE_ACCEPT_TORCH=1 scripts/setup-env.sh" in lines
    assert json.loads(record.read_text()) == entry  # nothing changed

    accepted = _run("check", record, python, TORCH_LATTICE_ACCEPT_TORCH="1")
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(record.read_text())["torch"] == "2.15.0+cu132"
    assert _run("check", record, python).returncode == 0


@pytest.mark.parametrize(
    ("version", "refused"), [("2.13.0+cpu", False), ("2.13.0", False), ("2.15.0+cu132", True)]
)
def test_without_a_record_the_requirement_decides(
    tmp_path: Path, version: str, refused: bool
) -> None:
    """A venv set up before the record existed (or recreated by uv): a torch that meets
    the requirement is recorded, one that does not is refused and nothing is written."""
    record = tmp_path / "torch-lattice-setup.json"
    result = _run("check", record, _fake_python(tmp_path, version, None))
    assert result.returncode == (3 if refused else 0), result.stderr
    assert record.is_file() == (not refused)
    if refused:
        assert "does not meet its requirement torch==2.13.0" in result.stderr


def test_no_torch_yet_is_left_to_the_install_step(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{tmp_path}/none" exec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    record = tmp_path / "torch-lattice-setup.json"
    result = _run("check", record, python)
    assert (result.returncode, record.exists()) == (0, False)


def test_pin_matching() -> None:
    meets = _helper().meets
    assert meets("torch==2.13.0", "2.13.0+cpu") is True
    assert meets("torch == 2.13", "2.13.0") is True
    assert meets("torch==2.13.0", "2.13.1") is False
    assert meets("torch==2.13.0", "2.15.0+cu132") is False
    assert meets("torch>=2.4", "2.15.0") is None  # not a pin: not judged


def test_setup_env_stops_on_a_replaced_torch(tmp_path: Path) -> None:
    """The whole script on a venv whose torch changed after it was recorded: exit status 3,
    the restore command for that venv, and no build started."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    _fake_torch(site, "2.13.0+cpu", None)
    record = venv / "torch-lattice-setup.json"
    assert _run("write", record, venv / "bin" / "python").returncode == 0
    _fake_torch(site, "2.15.0+cu132", "13.2")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_LATTICE_")}
    env["TORCH_LATTICE_VENV"] = str(venv)
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup-env.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 3, result.stdout + result.stderr
    assert f"[setup]     rm -rf {venv} && TORCH_LATTICE_VENV={venv} scripts/setup-env.sh" in (
        result.stderr.splitlines()
    )
    assert "building torch_lattice" not in result.stdout
    assert not (venv / "build.log").exists() and not (venv / "torch.log").exists()


def test_another_requirement_on_a_recorded_venv_says_to_start_afresh(tmp_path: Path) -> None:
    """TORCH_LATTICE_TORCH changed after the set-up: the old torch is not used silently."""
    record = tmp_path / "torch-lattice-setup.json"
    python = _fake_python(tmp_path, "2.13.0+cpu", None)
    assert _run("write", record, python).returncode == 0
    same = _run("check", record, python, requirement="torch==2.13")
    assert (same.returncode, same.stderr) == (0, "")
    other = _run("check", record, python, requirement="torch==2.11.0")
    assert other.returncode == 3
    fresh = "rm -rf .venv && TORCH_LATTICE_TORCH='torch==2.11.0' scripts/setup-env.sh"
    assert f"[setup]     {fresh}" in other.stderr.splitlines(), other.stderr
    assert "torch 2.13.0+cpu (CPU build) that scripts/setup-env.sh installed" in other.stderr
    # A requirement that is not a plain pin is not judged.
    assert _run("check", record, python, requirement="torch>=2.4").returncode == 0
