"""Atomic output: temporary files beside the targets, then each put in place at once.

A failure at any point removes the temporary files (and any folder this call
created) and puts back any output already replaced, so either both outputs appear
complete or neither changes. An existing output is swapped with its new version in
one step (:func:`torch_lattice.atomic_file.exchange_paths`), so the old one is still at
hand, under the temporary name, until the other output is in place too; where the
system cannot swap, a hard link (else a copy) keeps it. The temporary files come
from :mod:`torch_lattice.atomic_file`, so the outputs get the user's umask
(``0o666 & ~umask``), as any other new file would. A process killed outright (SIGKILL,
a power cut) cannot clean up: its hidden files carry its pid, and the next conversion to
the same outputs removes them once that process is gone.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

from torch_lattice.atomic_file import (
    clean_stale_siblings,
    exchange_paths,
    sibling_name,
    write_beside,
)
from torch_lattice.migration.errors import ConversionError
from torch_lattice.regular_file import describe_file_type

try:
    import fcntl
except ImportError:  # not POSIX (Windows): no folder locks
    fcntl = None  # type: ignore[assignment]

__all__ = ["OUTPUT_LABELS", "check_output_paths", "write_outputs"]

# How messages name the weights and the manifest (both functions below take them in
# that order).
OUTPUT_LABELS = ("output", "manifest (--manifest)")


def _same_file(a: Path, b: Path) -> bool:
    """``a`` and ``b`` name one file (same resolved path, or hard links to one inode)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist yet
        return False


def check_output_paths(source: Path, outputs: list[Path], force: bool,
                       inputs: Sequence[tuple[str, Path]] = (),
                       labels: Sequence[str] = OUTPUT_LABELS) -> None:
    """Refuses outputs that collide with an input (the source, the kernel spec: never
    overwritten, even with ``force``), each other, a folder, a new path under a file or
    a dangling link, an existing path that is not a regular file (a symbolic link, a
    FIFO, a device, a socket: never replaced, even with ``force``, as ``save_tuning``
    and the artifact exporter refuse them), or an existing file (unless ``force``).
    ``labels`` names each output in messages (``output`` past their end)."""
    named_inputs = [("source checkpoint", source), *inputs]
    for i, path in enumerate(outputs):
        label = labels[i] if i < len(labels) else "output"
        for what, given in named_inputs:
            if _same_file(path, given):
                raise ConversionError(
                    f"output {str(path)!r} would overwrite the {what} {str(given)!r}; an input "
                    "is never overwritten (not even with --force): choose another output path"
                )
        for other in outputs[:i]:
            if _same_file(path, other):
                raise ConversionError(
                    f"output {str(path)!r} would overwrite another output {str(other)!r}; "
                    "pass --manifest with another path"
                )
        try:
            # lstat: a symbolic link (dangling or not) is judged itself, not its target.
            mode = os.lstat(path).st_mode
        except OSError:  # missing (or unreachable: the write then reports it)
            _check_folder(path, label)
            continue
        if stat.S_ISDIR(mode):
            raise ConversionError(f"{label} {str(path)!r} is a directory")
        if not stat.S_ISREG(mode):
            raise ConversionError(
                f"{label} {str(path)!r} exists and is {describe_file_type(mode)}; --force "
                "replaces only regular files (never a symbolic link, FIFO, device or "
                "socket): choose another path"
            )
        if not force:
            raise ConversionError(
                f"{label} {str(path)!r} already exists; pass --force to overwrite"
            )


def _check_folder(path: Path, label: str) -> None:
    """Refuses a new output whose nearest existing ancestor is not a folder (a file, a
    dangling link): it could never be written, and finding that out while writing would
    come after the other output's new folders were made."""
    parent = path.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    if os.path.lexists(parent) and not parent.is_dir():
        mode = os.lstat(parent).st_mode
        kind = "a file" if stat.S_ISREG(mode) else describe_file_type(mode)
        raise ConversionError(
            f"{label} {str(path)!r} cannot be written: {str(parent)!r} is {kind}, not a "
            "folder"
        )


def _make_parents(path: Path, created: list[Path]) -> None:
    """Creates ``path``'s missing parent folders, adding each to ``created`` as soon as
    it exists (so a failure part-way still removes those made)."""
    missing = []
    parent = path.parent
    while not os.path.lexists(parent):
        missing.append(parent)
        parent = parent.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder)
        except FileExistsError:  # made meanwhile by someone else: theirs, kept
            if not folder.is_dir():
                raise
            continue
        created.append(folder)


def _write_text(text: str) -> Callable[[Path], None]:
    return lambda p: p.write_text(text, encoding="utf-8")


def _write_tensors(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> Callable:
    def write(path: Path) -> None:
        try:
            save_file(tensors, str(path), metadata=metadata)
        except OSError:
            raise
        except Exception as exc:  # e.g. a dtype safetensors has no code for
            raise ConversionError(f"cannot write the converted tensors as safetensors: "
                                  f"{type(exc).__name__}: {exc}") from None
    return write


class _Placed:
    """One output put in place: where its previous file now is (``old``; None where
    there was none), so that it can be put back or, once every output is in place,
    removed."""

    def __init__(self, final: Path, old: Path | None, swapped: bool) -> None:
        self.final, self.old, self.swapped = final, old, swapped

    def undo(self) -> None:
        if self.old is None:
            self.final.unlink(missing_ok=True)
        elif self.swapped:
            exchange_paths(self.old, self.final)  # the new file back at the temporary name
        else:
            os.replace(self.old, self.final)

    def drop_old(self) -> None:
        if self.old is not None:
            self.old.unlink(missing_ok=True)


def _backup(final: Path) -> Path:
    """A second name for ``final``'s current file, beside it, where the system cannot
    swap two paths: a hard link to it (to a link, a link of its own), else a copy
    written into a file made for it. Names are fresh: an existing one is never
    written through."""
    prefix, suffix = sibling_name(final, "old", 16)  # 16: token_hex(8)'s digits
    for _ in range(8):
        name = final.parent / f"{prefix}{secrets.token_hex(8)}{suffix}"
        try:
            os.link(final, name, follow_symlinks=False)
            return name
        except FileExistsError:
            continue  # someone took the name meanwhile: another one
        except OSError:  # no hard links on this file system
            break
    if final.is_symlink():
        name = final.parent / f"{prefix}{secrets.token_hex(8)}{suffix}"
        os.symlink(os.readlink(final), name)  # fails (never follows) where the name exists
        return name
    prefix, suffix = sibling_name(final, "old", 8)  # mkstemp's 8 random characters
    fd, made = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=final.parent)
    try:
        with os.fdopen(fd, "wb") as out, open(final, "rb") as old:
            shutil.copyfileobj(old, out)
    except BaseException:
        os.unlink(made)
        raise
    return Path(made)


def _place(temp: Path, final: Path) -> _Placed:
    """Moves ``temp`` to ``final``, keeping any previous ``final`` (see _Placed)."""
    if not os.path.lexists(final):
        os.replace(temp, final)
        return _Placed(final, None, False)
    if exchange_paths(temp, final):
        return _Placed(final, temp, True)
    backup = _backup(final)
    try:
        os.replace(temp, final)
    except BaseException:
        backup.unlink(missing_ok=True)
        raise
    return _Placed(final, backup, False)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held while outputs are swapped in, put back or their old
    versions removed: an exception raised by a handler between two of those steps would
    leave the pair mixed. Their handlers are swapped for one that notes the signal, and
    a noted signal is raised again on leaving, once the outputs are consistent, so the
    handler the caller had (Ctrl-C's KeyboardInterrupt, the CLI's clean-up, the default
    termination) runs then. (Blocking them with pthread_sigmask would not do: it holds
    only this thread, and the kernel hands the signal to any other, e.g. OpenMP's.)
    Python's handlers belong to the main thread; elsewhere nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: arrived.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            # None: a handler set outside Python, which cannot be put back from here.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for sig in dict.fromkeys(arrived):
            signal.raise_signal(sig)


@contextlib.contextmanager
def _folders_locked(paths: Sequence[Path]) -> Iterator[None]:
    """An exclusive ``flock`` on each folder of ``paths`` (each folder once, in one
    order), held while the outputs are placed: two conversions to the same outputs
    would otherwise interleave their renames and leave one's weights beside the other's
    manifest. Advisory: it orders conversions, nothing else. Without ``fcntl`` (or
    where a folder cannot be opened or locked) nothing is held."""
    fds: dict[tuple[int, int], int] = {}
    try:
        if fcntl is not None:
            for folder in dict.fromkeys(p.parent for p in paths):
                try:
                    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
                except OSError:
                    continue
                info = os.fstat(fd)
                if (info.st_dev, info.st_ino) in fds:  # one folder by two names: once
                    os.close(fd)
                    continue
                fds[(info.st_dev, info.st_ino)] = fd
            for key in sorted(fds):  # one order for every process: no deadlock
                with contextlib.suppress(OSError):  # a file system without locks
                    fcntl.flock(fds[key], fcntl.LOCK_EX)
        yield
    finally:
        for fd in fds.values():
            os.close(fd)  # which releases its lock


def write_outputs(
    tensors: dict[str, torch.Tensor],
    weights_path: Path,
    manifest: str,
    manifest_path: Path,
    metadata: dict[str, str],
    *,
    force: bool = True,
    labels: Sequence[str] = OUTPUT_LABELS,
) -> None:
    """Writes the safetensors file and the manifest atomically.

    Existing files at the paths are replaced when ``force`` (callers check ``--force``
    first); without it an output that appeared since that check (another program or
    conversion wrote it) is refused, a ``ConversionError`` naming it (``labels``).
    """
    created: list[Path] = []
    temps: list[Path] = []
    placed: list[_Placed] = []

    def clean_up() -> None:
        # The manifest failed after the weights were placed: put the previous
        # weights back (or take the new ones out), so the pair never mixes.
        for done in reversed(placed):
            with contextlib.suppress(OSError):
                done.undo()
        for temp in temps:
            temp.unlink(missing_ok=True)
        # Deepest first over both outputs: the manifest's new folder may sit inside the
        # weights' one (out/w.safetensors, out/sub/m.json), which is only empty after it.
        for folder in sorted(created, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                folder.rmdir()

    try:
        _make_parents(weights_path, created)
        _make_parents(manifest_path, created)
        for final in (weights_path, manifest_path):  # what a killed conversion left
            clean_stale_siblings(final, ("tmp", "old"))
        temps.append(write_beside(weights_path, _write_tensors(tensors, metadata)))
        temps.append(write_beside(manifest_path, _write_text(manifest)))
    except BaseException:
        clean_up()
        raise
    finals = (weights_path, manifest_path)
    with contextlib.ExitStack() as stack:
        try:  # waiting for another conversion: Ctrl-C or SIGTERM still cleans up
            stack.enter_context(_folders_locked(finals))
        except BaseException:
            clean_up()
            raise
        with _signals_held():
            try:
                if not force:
                    for label, final in zip(labels, finals, strict=True):
                        if os.path.lexists(final):
                            raise ConversionError(
                                f"{label} {str(final)!r} appeared while converting; pass "
                                "--force to overwrite"
                            )
                for temp, final in zip(temps, finals, strict=True):
                    placed.append(_place(temp, final))
            except BaseException:
                clean_up()
                raise
            for done in placed:
                done.drop_old()
