"""torch_lattice.atomic_file: the one atomic-write helper of the project.

Contract: a written file has mode ``0o666 & ~umask`` (what ``open(path, "w")`` gives),
an existing file is replaced only by a complete one, and a failure leaves the target
unchanged with no temporary file beside it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from torch_lattice import atomic_file

try:
    from file_mode_helpers import file_mode as mode
    from file_mode_helpers import process_umask
except ImportError:  # tests/ may become a package; then it is imported through it
    from tests.file_mode_helpers import file_mode as mode
    from tests.file_mode_helpers import process_umask

UMASKS = (0o022, 0o077, 0o002)


@pytest.fixture(params=UMASKS, ids=lambda m: f"umask{m:03o}")
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """Sets the process umask for one test and restores it after."""
    with process_umask(request.param):
        yield request.param


def test_current_umask_reads_the_process_umask(umask: int) -> None:
    assert atomic_file.current_umask() == umask
    assert atomic_file.new_file_mode() == 0o666 & ~umask


def test_current_umask_fallback_restores_the_umask(
    umask: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without /proc the set-and-restore path gives the same answer and leaves the
    umask as it was."""
    monkeypatch.setattr(atomic_file, "_PROC_STATUS", str(tmp_path / "no-such-status"))
    assert atomic_file._umask_from_proc() is None
    assert atomic_file.current_umask() == umask
    assert atomic_file.current_umask() == umask  # the first read restored it


def test_atomic_write_mode_matches_a_plain_open(umask: int, tmp_path: Path) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    target = tmp_path / "out.json"
    atomic_file.atomic_write(target, lambda p: p.write_text("{}"))
    assert target.read_text() == "{}"
    assert mode(target) == 0o666 & ~umask == mode(plain)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "plain.txt"]


def test_atomic_write_replaces_and_resets_the_mode(umask: int, tmp_path: Path) -> None:
    target = tmp_path / "w.bin"
    target.write_bytes(b"old")
    os.chmod(target, 0o600)
    atomic_file.atomic_write(target, lambda p: p.write_bytes(b"new"))
    assert target.read_bytes() == b"new"
    assert mode(target) == 0o666 & ~umask


def test_temporary_name_keeps_the_suffix(tmp_path: Path) -> None:
    """Writers such as matplotlib choose the format from the suffix."""
    seen: list[Path] = []
    atomic_file.atomic_write(tmp_path / "plot.png", lambda p: (seen.append(p), p.write_bytes(b"")))
    assert seen[0].suffix == ".png" and seen[0].name.startswith(".plot.")
    assert seen[0].parent == tmp_path


def test_failed_write_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "w.bin"
    target.write_bytes(b"old")

    def half_written(p: Path) -> None:
        p.write_bytes(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_file.atomic_write(target, half_written)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["w.bin"]


def test_failed_rename_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(src: str, dst: str) -> None:
        raise OSError("rename failed")

    monkeypatch.setattr(atomic_file.os, "replace", refuse)
    with pytest.raises(OSError, match="rename failed"):
        atomic_file.atomic_write(tmp_path / "new.json", lambda p: p.write_text("{}"))
    assert list(tmp_path.iterdir()) == []


def _non_regular(kind: str, path: Path, tmp_path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link":
        (tmp_path / "elsewhere.txt").write_text("kept")
        path.symlink_to(tmp_path / "elsewhere.txt")
    elif kind == "directory":
        path.mkdir()
    else:  # a UNIX socket: no privileges needed, unlike a device node
        import socket

        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.bind(str(path))
        finally:
            sock.close()


@pytest.mark.parametrize("kind", ["fifo", "link", "directory", "socket"])
def test_atomic_write_replaces_only_a_regular_file(kind: str, tmp_path: Path) -> None:
    """A FIFO, a device node (``--out /dev/null`` as root), a socket or a link at the
    path is refused before anything is written, and left as it was: ``os.replace`` would
    put a regular file in its place."""
    target = tmp_path / "report.md"
    _non_regular(kind, target, tmp_path)
    before = os.lstat(target)
    called = []
    with pytest.raises(FileExistsError, match="only a regular file is replaced"):
        atomic_file.atomic_write(target, lambda p: called.append(p.write_text("new")))
    assert called == []
    after = os.lstat(target)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["report.md"] + (["elsewhere.txt"] if kind == "link" else []))
    if kind == "link":
        assert (tmp_path / "elsewhere.txt").read_text() == "kept"


def test_interrupt_while_writing_leaves_nothing(tmp_path: Path) -> None:
    def interrupted(p: Path) -> None:
        p.write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_file.atomic_write(tmp_path / "new.json", interrupted)
    assert list(tmp_path.iterdir()) == []


def test_concurrent_writers_never_see_umask_zero(tmp_path: Path) -> None:
    """Reading the umask must not open a window in which another thread's new file
    gets a different umask (the set-and-restore is only a fallback, for platforms
    without /proc)."""
    with process_umask(0o027):
        stop = threading.Event()

        def reader() -> None:
            while not stop.is_set():
                atomic_file.current_umask()

        threads = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            for i in range(200):
                path = tmp_path / f"f{i}"
                path.write_text("x")
                assert mode(path) == 0o640, oct(mode(path))
        finally:
            stop.set()
            for t in threads:
                t.join()


def test_writer_that_creates_0600_gets_the_umask_mode(umask: int, tmp_path: Path) -> None:
    """A writer may create its file 0600 whatever the umask: safetensors 0.8's save_file
    does (the cause of issue 14's 0600 model.safetensors). The atomic write gives the final
    file the umask's mode all the same."""
    import torch
    from safetensors.torch import save_file

    def private(p: Path) -> None:
        p.write_bytes(b"x")
        os.chmod(p, 0o600)

    for name, write in (
        ("private.bin", private),
        ("model.safetensors", lambda p: save_file({"w": torch.zeros(2)}, str(p))),
    ):
        atomic_file.atomic_write(tmp_path / name, write)
        assert mode(tmp_path / name) == 0o666 & ~umask, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors", "private.bin"]


def _dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_files_a_killed_writer_left_are_removed_by_the_next_write(tmp_path: Path) -> None:
    """SIGKILL leaves the hidden temporary file (partial or whole) for good: its name now
    carries the writer's machine, boot and pid namespace (owner_tag) and pid, and the
    next write to the same path on this machine removes it once that process is gone.
    Only those exact names, regular files, with this owner tag and a dead pid go: a
    folder shared with another host (NFS) or container holds their temporaries too."""
    tag = atomic_file.owner_tag()
    assert tag is not None and len(tag) == 8  # Linux says both
    o = atomic_file.owner_field
    other = "f" * 8 if tag != "f" * 8 else "e" * 8
    seen: list[Path] = []
    atomic_file.atomic_write(tmp_path / "w.json", lambda p: (seen.append(p), p.write_text("1")))
    assert seen[0].name.startswith(f".w.{tag}-{os.getpid()}.")
    assert seen[0].name.endswith(".tmp.json")
    dead = _dead_pid()
    stale = [tmp_path / f".w.{o(dead)}.abc_1234.tmp.json",
             tmp_path / f".w.{o(dead)}.{'f' * 16}.tmp.json"]
    for path in stale:
        path.write_text("partial")
    kept = {
        f".w.{o()}.abcd1234.tmp.json": "a live writer's",
        f".w.{o(dead)}.abcd1234.tmp.txt": "another suffix",
        f".v.{o(dead)}.abcd1234.tmp.json": "another file's",
        f".w.{o(dead)}.abcd12345.tmp.json": "not the random part's length",
        f".w.{tag}-0{dead}.abcd1234.tmp.json": "not a pid",
        f".w.{other}-{dead}.abcd1234.tmp.json": "another machine's, boot's or container's",
        f".w.{dead}.abcd1234.tmp.json": "no owner tag",
        f"w.{o(dead)}.abcd1234.tmp.json": "not hidden",
    }
    for name, text in kept.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "elsewhere").write_text("outside")
    (tmp_path / f".w.{o(dead)}.aaaa1111.tmp.json").symlink_to(tmp_path / "elsewhere")
    (tmp_path / f".w.{o(dead)}.bbbb2222.tmp.json").mkdir()
    atomic_file.atomic_write(tmp_path / "w.json", lambda p: p.write_text("2"))
    assert not any(path.exists() for path in stale)
    for name, text in kept.items():
        assert (tmp_path / name).read_text() == text
    assert (tmp_path / "elsewhere").read_text() == "outside"
    assert (tmp_path / f".w.{o(dead)}.aaaa1111.tmp.json").is_symlink()
    assert (tmp_path / f".w.{o(dead)}.bbbb2222.tmp.json").is_dir()
    assert (tmp_path / "w.json").read_text() == "2"
