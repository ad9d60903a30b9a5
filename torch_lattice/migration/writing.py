"""Atomic output: temporary files beside the targets, then ``os.replace``.

A failure at any point removes the temporary files (and any folder this call
created), so either both outputs appear complete or neither changes. The temporary
files come from :mod:`torch_lattice.atomic_file`, so the outputs get the user's
umask (``0o666 & ~umask``), as any other new file would.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

from torch_lattice.atomic_file import write_beside
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
        if path.exists() and not force:
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
    return lambda p: save_file(tensors, str(p), metadata=metadata)


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
    placed: list[Path] = []
    try:
        temps.append(write_beside(weights_path, _write_tensors(tensors, metadata)))
        temps.append(write_beside(manifest_path, _write_text(manifest)))
        for temp, final in zip(temps, (weights_path, manifest_path), strict=True):
            os.replace(temp, final)
            placed.append(final)
    except BaseException:
        # The manifest's replace failed after the weights' succeeded: take the
        # weights back out so a manifest never goes missing beside them.
        for path in placed:
            path.unlink(missing_ok=True)
        for temp in temps:
            temp.unlink(missing_ok=True)
        for folder in created:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
