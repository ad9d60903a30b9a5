"""``convert-checkpoint`` writes its outputs with the user's umask.

Contract: the safetensors file and the manifest each get mode ``0o666 & ~umask``
(what ``open(path, "w")`` gives a new file), through the Python API and the console
script, for new and replaced (``--force``) files; a failure at any step of the atomic
write (writing, flushing, the chmod, either rename) leaves neither outputs, nor
temporary files, nor new folders.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from torch_lattice import atomic_file, migration
from torch_lattice.migration import writing

try:
    from file_mode_helpers import file_mode as mode
    from file_mode_helpers import process_umask
except ImportError:  # tests/ may become a package; then it is imported through it
    from tests.file_mode_helpers import file_mode as mode
    from tests.file_mode_helpers import process_umask

SPEC = {"enc.kernel": [3, 3, 3], "head.kernel": [1, 1, 1]}


@pytest.fixture(params=(0o022, 0o077), ids=lambda m: f"umask{m:03o}")
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """Sets the process umask (inherited by subprocesses) and restores it after."""
    with process_umask(request.param):
        yield request.param


@pytest.fixture
def work(tmp_path: Path) -> Path:
    gen = torch.Generator().manual_seed(0)
    state = {
        "enc.kernel": torch.randn(27, 2, 4, generator=gen),
        "head.kernel": torch.randn(4, 5, generator=gen),
        "head.bias": torch.randn(5, generator=gen),
    }
    torch.save({"model": state}, tmp_path / "legacy.pt")
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    return tmp_path


def test_api_outputs_follow_the_umask(work: Path, umask: int) -> None:
    out, manifest = work / "w.safetensors", work / "sub" / "m.json"
    done = migration.convert_checkpoint(work / "legacy.pt", out, SPEC, manifest=manifest)
    assert (done.output, done.manifest_path) == (out, manifest)
    assert mode(out) == 0o666 & ~umask
    assert mode(manifest) == 0o666 & ~umask
    assert {p.name for p in work.iterdir()} == {"legacy.pt", "spec.json", "w.safetensors", "sub"}
    assert [p.name for p in (work / "sub").iterdir()] == ["m.json"]


def test_cli_outputs_follow_the_umask(work: Path, umask: int) -> None:
    out = work / "w.safetensors"
    console = Path(sys.executable).parent / "convert-checkpoint"
    args = [
        str(console),
        str(work / "legacy.pt"),
        str(out),
        "--kernel-spec",
        str(work / "spec.json"),
    ]
    run = subprocess.run(args, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert mode(out) == 0o666 & ~umask
    assert mode(work / "w.json") == 0o666 & ~umask


def test_forced_replacement_gets_the_umask_mode(work: Path, umask: int) -> None:
    out = work / "w.safetensors"
    for path in (out, work / "w.json"):
        path.write_bytes(b"old")
        os.chmod(path, 0o600 if umask == 0o022 else 0o644)
    migration.convert_checkpoint(work / "legacy.pt", out, SPEC, force=True)
    assert mode(out) == 0o666 & ~umask
    assert mode(work / "w.json") == 0o666 & ~umask
    assert out.read_bytes() != b"old"


def _fail_chmod(path: object, mode: int) -> None:
    raise PermissionError("chmod refused")


def _fail_fsync(fd: int) -> None:
    raise OSError("fsync failed")


@pytest.mark.parametrize(
    ("target", "name", "replacement"),
    [(atomic_file.os, "chmod", _fail_chmod), (atomic_file.os, "fsync", _fail_fsync)],
    ids=["chmod", "fsync"],
)
def test_failure_while_preparing_leaves_nothing(
    work: Path,
    umask: int,
    monkeypatch: pytest.MonkeyPatch,
    target: object,
    name: str,
    replacement: object,
) -> None:
    monkeypatch.setattr(target, name, replacement)
    out = work / "new" / "w.safetensors"
    with pytest.raises(OSError):
        migration.convert_checkpoint(work / "legacy.pt", out, SPEC)
    assert {p.name for p in work.iterdir()} == {"legacy.pt", "spec.json"}


def test_failed_manifest_write_leaves_nothing(
    work: Path, umask: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The weights' temporary file is complete when the manifest fails: both go."""

    def fail(text: str):
        def write(path: Path) -> None:
            path.write_text("partial")
            raise OSError("disk full")

        return write

    monkeypatch.setattr(writing, "_write_text", fail)
    with pytest.raises(OSError, match="disk full"):
        migration.convert_checkpoint(work / "legacy.pt", work / "w.safetensors", SPEC)
    assert {p.name for p in work.iterdir()} == {"legacy.pt", "spec.json"}


def test_a_failure_removes_new_folders_nested_in_each_other(
    work: Path, umask: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manifest's new folder inside the weights' new one: the weights' folder was
    removed first (not empty yet), so it stayed."""

    def fail(text: str):
        def write(path: Path) -> None:
            raise OSError("disk full")

        return write

    monkeypatch.setattr(writing, "_write_text", fail)
    out, manifest = work / "new" / "w.safetensors", work / "new" / "sub" / "deeper" / "m.json"
    with pytest.raises(OSError, match="disk full"):
        migration.convert_checkpoint(work / "legacy.pt", out, SPEC, manifest=manifest)
    assert {p.name for p in work.iterdir()} == {"legacy.pt", "spec.json"}


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "link_or_copy"])
def test_names_near_the_file_name_limit_are_written_and_replaced(
    work: Path, umask: int, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    """The hidden temporary and backup names add up to 22 bytes to an output's: a valid
    name near the 255-byte limit failed with ENAMETOOLONG naming a path the user never
    gave."""
    out = work / ("é" * 100 + "a" * 38 + ".safetensors")  # 250 bytes in UTF-8
    manifest = work / ("m" * 250 + ".json")  # 255 bytes, a suffix of its own
    migration.convert_checkpoint(work / "legacy.pt", out, SPEC, manifest=manifest)
    before = out.read_bytes()
    if not exchange:
        monkeypatch.setattr(writing, "exchange_paths", lambda a, b: False)
        monkeypatch.setattr(writing.os, "link", _no_link)  # the copy, the longest name
    torch.save({"model": {"enc.kernel": torch.ones(27, 2, 4), "head.kernel": torch.ones(4, 5),
                          "head.bias": torch.ones(5)}}, work / "legacy.pt")
    migration.convert_checkpoint(work / "legacy.pt", out, SPEC, manifest=manifest, force=True)
    assert out.read_bytes() != before
    assert mode(out) == 0o666 & ~umask
    assert {p.name for p in work.iterdir()} == {"legacy.pt", "spec.json", out.name,
                                                manifest.name}


def _no_link(*args: object, **kwargs: object) -> None:
    raise OSError(1, "Operation not permitted")


def test_files_of_a_conversion_killed_while_writing_are_removed_by_the_next(
    work: Path, umask: int
) -> None:
    """SIGKILL runs no clean-up: the complete weights and the partial manifest stayed
    beside the outputs for good. The next conversion to them removes both."""
    script = (
        "import os, signal, sys\n"
        "from torch_lattice import migration\n"
        "from torch_lattice.migration import writing\n"
        "def killed(text):\n"
        "    def write(path):\n"
        "        path.write_text(text[: len(text) // 2])\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return write\n"
        "writing._write_text = killed\n"
        f"migration.convert_checkpoint(sys.argv[1], sys.argv[2], {SPEC!r})\n"
    )
    out = work / "w.safetensors"
    done = subprocess.run([sys.executable, "-c", script, str(work / "legacy.pt"), str(out)],
                          check=False)
    assert done.returncode == -9
    left = {p.name for p in work.iterdir()} - {"legacy.pt", "spec.json"}
    assert len(left) == 2 and all(name.startswith(".w.") for name in left)
    migration.convert_checkpoint(work / "legacy.pt", out, SPEC)
    assert {p.name for p in work.iterdir()} == {"legacy.pt", "spec.json", "w.safetensors",
                                                "w.json"}
