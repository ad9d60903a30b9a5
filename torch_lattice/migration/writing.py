"""Atomic output: temporary files beside the targets, then each put in place at once.

A failure at any point removes the temporary files (and any folder this call
created) and puts back any output already replaced, so either both outputs appear
complete or neither changes. An existing output is swapped with its new version in
one step (:func:`torch_lattice.atomic_file.exchange_paths`), so the old one is still at
hand, under the temporary name, until the other output is in place too; where the
system cannot swap, a hard link (else a copy) keeps it. The temporary files come
from :mod:`torch_lattice.atomic_file`, so the outputs get the user's umask
(``0o666 & ~umask``), as any other new file would.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

from torch_lattice.atomic_file import exchange_paths, write_beside
from torch_lattice.migration.errors import ConversionError

__all__ = ["check_output_paths", "write_outputs"]


def _same_file(a: Path, b: Path) -> bool:
    """``a`` and ``b`` name one file (same resolved path, or hard links to one inode)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist yet
        return False


def check_output_paths(source: Path, outputs: list[Path], force: bool,
                       inputs: Sequence[tuple[str, Path]] = ()) -> None:
    """Refuses outputs that collide with an input (the source, the kernel spec: never
    overwritten, even with ``force``), each other, a folder, or an existing file
    (unless ``force``)."""
    named_inputs = [("source checkpoint", source), *inputs]
    for i, path in enumerate(outputs):
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
        if path.is_dir():
            raise ConversionError(f"output {str(path)!r} is a directory")
        # lexists: a dangling symbolic link is an existing output too.
        if os.path.lexists(path) and not force:
            raise ConversionError(f"output {str(path)!r} already exists; pass --force to overwrite")


def _make_parents(path: Path) -> list[Path]:
    """Creates missing parent folders; returns those created, deepest first."""
    created = []
    parent = path.parent
    while not parent.exists():
        created.append(parent)
        parent = parent.parent
    path.parent.mkdir(parents=True, exist_ok=True)
    return created


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


def _backup_name(final: Path) -> Path:
    fd, name = tempfile.mkstemp(prefix=f".{final.stem}.", suffix=f".old{final.suffix}",
                                dir=final.parent)
    os.close(fd)
    os.unlink(name)
    return Path(name)


def _place(temp: Path, final: Path) -> _Placed:
    """Moves ``temp`` to ``final``, keeping any previous ``final`` (see _Placed)."""
    if not os.path.lexists(final):
        os.replace(temp, final)
        return _Placed(final, None, False)
    if exchange_paths(temp, final):
        return _Placed(final, temp, True)
    backup = _backup_name(final)
    try:
        os.link(final, backup, follow_symlinks=False)
    except OSError:  # no hard links here: a copy
        shutil.copyfile(final, backup, follow_symlinks=False)
    try:
        os.replace(temp, final)
    except BaseException:
        backup.unlink(missing_ok=True)
        raise
    return _Placed(final, backup, False)


def write_outputs(
    tensors: dict[str, torch.Tensor],
    weights_path: Path,
    manifest: str,
    manifest_path: Path,
    metadata: dict[str, str],
) -> None:
    """Writes the safetensors file and the manifest atomically.

    Existing files at the paths are replaced (callers check ``--force`` first).
    """
    created = _make_parents(weights_path) + _make_parents(manifest_path)
    temps: list[Path] = []
    placed: list[_Placed] = []
    try:
        temps.append(write_beside(weights_path, _write_tensors(tensors, metadata)))
        temps.append(write_beside(manifest_path, _write_text(manifest)))
        for temp, final in zip(temps, (weights_path, manifest_path), strict=True):
            placed.append(_place(temp, final))
    except BaseException:
        # The manifest failed after the weights were placed: put the previous
        # weights back (or take the new ones out), so the pair never mixes.
        for done in reversed(placed):
            with contextlib.suppress(OSError):
                done.undo()
        for temp in temps:
            temp.unlink(missing_ok=True)
        for folder in created:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    for done in placed:
        done.drop_old()
