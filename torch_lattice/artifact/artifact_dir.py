"""Placing an artifact directory: checked, atomic, deleting nothing it did not write.

The rules (docs/artifacts.md, "Writing"):

- The destination is an empty directory, a missing path in an existing folder, or an
  *artifact*: exactly ``graph.mlir`` and ``weights.safetensors``, both regular files
  (no links, no directories), the graph an IR module. Anything else is refused, so a
  folder that merely holds a ``graph.mlir`` and a sub-folder named
  ``weights.safetensors`` is never touched.
- The graph is checked by the loader's own parser before anything is written: an
  artifact the loader would refuse (an output name with a newline, ...) is never
  published.
- Both files are written into a hidden temporary sibling directory named
  ``.<name>.<tag>-<pid>.<token>.tmp`` (``<name>`` cut short where the whole would pass the
  255-byte file-name limit), flushed, then placed. An existing artifact is
  swapped with it in one step by ``renameat2(RENAME_EXCHANGE)`` where the system has
  it (Linux), so the target always holds the old or the new artifact. Elsewhere the
  fallback is two renames (old aside as ``.<name>.<tag>-<pid>.<token>.old``, new in
  place);
  a crash between them leaves the old artifact in that hidden folder, and the next
  export to the same target puts it back before it starts.
- Deletion removes only the two artifact files (and then the folder, when that
  emptied it): the replaced artifact, or the temporary folder of a failed write.
  A temporary folder left by an export that died (its process is gone; ``<tag>``,
  ``atomic_file.owner_tag``, says the pid is one of this machine, boot and pid
  namespace, and where the system gives none nothing is cleaned or put back) is cleaned
  the same way by the next export to that target: its regular files named
  ``graph.mlir`` and ``weights.safetensors`` are deleted, and everything else in it
  stays, together with the folder. Only real directories (never links) named
  exactly ``.<name>.<tag>-<pid>.<8 hex digits>.tmp`` or ``.old`` beside the target are
  considered, and the files are removed through the opened folder, never through a
  link that replaced it meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path

from torch_lattice.artifact import schema
from torch_lattice.artifact.errors import ExportError
from torch_lattice.atomic_file import (
    OWNER_FIELD_BYTES,
    exchange_paths,
    fit_name,
    owner_field,
    owner_pattern,
    pid_alive,
)

__all__ = [
    "check_destination",
    "check_loadable",
    "check_output_names",
    "clean_stale_temporaries",
    "is_artifact",
    "make_temporary",
    "place",
    "remove_artifact_files",
]

ARTIFACT_FILES = (schema.GRAPH_FILE, schema.WEIGHT_FILE)
_GRAPH_PREFIX = "module attributes {"


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def is_artifact(path: Path) -> bool:
    """``path`` holds exactly the two artifact files, regular files, and an IR graph."""
    try:
        names = set(os.listdir(path))
    except OSError:
        return False
    if names != set(ARTIFACT_FILES) or not all(_regular(path / n) for n in ARTIFACT_FILES):
        return False
    with open(path / schema.GRAPH_FILE, encoding="utf-8", errors="replace") as f:
        return f.read(64).startswith(_GRAPH_PREFIX)


def check_destination(target: Path) -> None:
    """Refuses a destination that is not an empty directory, an artifact or new.

    Raises:
        ExportError: the parent folder does not exist.
        FileExistsError: ``target`` is a link, a file, or a directory holding anything
            but an artifact.
    """
    if not target.parent.is_dir():
        raise ExportError(f"artifact_dir's parent folder {str(target.parent)!r} does not exist")
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise FileExistsError(f"artifact_dir {str(target)!r} exists and is not a directory")
    if target.is_dir() and any(target.iterdir()) and not is_artifact(target):
        raise FileExistsError(
            f"artifact_dir {str(target)!r} exists and is not an artifact (exactly "
            f"{schema.GRAPH_FILE} and {schema.WEIGHT_FILE}, regular files); refusing to "
            "replace it"
        )


def check_loadable(graph: str) -> None:
    """Runs the loader's parser and contract checks on ``graph`` before it is written.

    Raises:
        ExportError: the loader would refuse the graph (the message is the loader's).
    """
    from torch_lattice.artifact.validation import load_module

    try:
        load_module(graph)
    except ValueError as exc:
        raise ExportError(
            f"the exported graph would not load (load_lattice_program refuses it): {exc}"
        ) from None


def check_output_names(names: Sequence[str]) -> None:
    """Refuses output names the loader cannot read back.

    graph.mlir holds them as one-line string literals, read with universal newlines:
    a newline, carriage return or other control character would make an artifact
    that ``load_lattice_program`` refuses.

    Raises:
        ExportError: naming the output and the character.
    """
    for name in names:
        bad = next((ch for ch in name if ord(ch) < 32 or ord(ch) == 127), None)
        if bad is not None:
            raise ExportError(
                f"output_names entry {name!r} holds the control character {bad!r}; output "
                "names must be printable (graph.mlir stores each on one line)"
            )


_TOKEN_BYTES = 4  # make_temporary's token: 8 hex digits
# What a temporary name adds to the target's: ".", ".<owner field>."
# (atomic_file.owner_field), "<token>", ".tmp" (or ".old").
_TEMP_ROOM = 1 + (OWNER_FIELD_BYTES + 2) + 2 * _TOKEN_BYTES + 4


def _temp_stem(target: Path) -> str:
    """The target's name in its temporary names, cut so they fit a file name: a target
    named near the 255-byte limit could otherwise never be written."""
    return fit_name(target.name, _TEMP_ROOM)


def _pattern(target: Path, owner: str) -> re.Pattern[str]:
    # Exactly make_temporary's names of this machine, boot and pid namespace (``owner``,
    # atomic_file.owner_pattern): a folder that only resembles one, or another host's, is
    # not this exporter's and is never cleaned.
    return re.compile(rf"\.{re.escape(_temp_stem(target))}\.{owner}\."
                      rf"[0-9a-f]{{{2 * _TOKEN_BYTES}}}\.(tmp|old)")


def make_temporary(target: Path) -> Path:
    """A new hidden, empty directory beside ``target`` named for this process."""
    while True:
        token = secrets.token_hex(_TOKEN_BYTES)
        temp = target.with_name(f".{_temp_stem(target)}.{owner_field()}.{token}.tmp")
        try:
            os.mkdir(temp, 0o700)
            return temp
        except FileExistsError:
            continue


_CAN_UNLINK_AT = (
    {os.stat, os.unlink} <= os.supports_dir_fd
    and os.stat in os.supports_follow_symlinks
    and hasattr(os, "O_DIRECTORY")
    and hasattr(os, "O_NOFOLLOW")
)


def remove_artifact_files(folder: Path) -> bool:
    """Deletes the artifact files in ``folder``, then the folder if that emptied it.

    Only regular files named ``graph.mlir`` and ``weights.safetensors`` are removed;
    anything else stays (and so does the folder). A ``folder`` that is a link is left
    alone: the files are looked up and unlinked relative to the folder opened without
    following links, so a link swapped in after the caller's check leads nowhere.

    Returns:
        True when the folder is gone.
    """
    if _CAN_UNLINK_AT:
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:  # a link, not a directory, or gone
            return False
        try:
            for name in ARTIFACT_FILES:
                with contextlib.suppress(OSError):
                    if stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                        os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)
    else:  # no dir_fd support (Windows): by path, after refusing a link
        if folder.is_symlink():
            return False
        for name in ARTIFACT_FILES:
            if _regular(folder / name):
                with contextlib.suppress(OSError):
                    os.unlink(folder / name)
    try:
        os.rmdir(folder)
    except OSError:
        return False
    return True


def clean_stale_temporaries(target: Path) -> None:
    """Removes this target's hidden folders left by exports whose process is gone.

    Only real directories (not links) beside ``target`` named exactly as
    :func:`make_temporary` names them on this machine, boot and pid namespace
    (``.<name>.<owner tag>-<pid>.<8 hex digits>.tmp``, or ``.old`` for the fallback's;
    see :func:`torch_lattice.atomic_file.owner_tag`) are considered. A leftover
    ``.old`` folder is the previous artifact of a fallback replace that died between its
    two renames: when
    ``target`` is missing and the folder is an artifact it is put back instead.
    Folders of a live process (a concurrent export) are left alone. From any other
    such folder :func:`remove_artifact_files` deletes the regular files named
    ``graph.mlir`` and ``weights.safetensors`` and then the folder if that emptied it;
    anything else it holds stays, and so does the folder.
    """
    owner = owner_pattern()
    if owner is None:  # no way to tell this machine's processes from another's
        return
    pattern = _pattern(target, owner)
    try:
        names = os.listdir(target.parent)
    except OSError:
        return
    for name in names:
        match = pattern.fullmatch(name)
        if match is None or pid_alive(int(match.group(1))):
            continue
        folder = target.parent / name
        if not folder.is_dir() or folder.is_symlink():
            continue
        if match.group(2) == "old" and not os.path.lexists(target) and is_artifact(folder):
            with contextlib.suppress(OSError):
                os.rename(folder, target)
            continue
        remove_artifact_files(folder)


def place(temp: Path, target: Path) -> None:
    """Moves the complete artifact ``temp`` to ``target``; the old artifact is deleted.

    With an existing ``target`` the two are exchanged atomically where the system
    allows (see the module docstring for the fallback). ``temp`` is consumed: on
    success it no longer exists (or, if the replaced folder gained foreign files
    meanwhile, it stays hidden with them rather than deleting them).

    Raises:
        OSError: the final rename failed; ``target`` is then unchanged.
    """
    if not os.path.lexists(target):
        os.rename(temp, target)  # no old artifact: one rename, atomic
        return
    if exchange_paths(temp, target):
        remove_artifact_files(temp)  # temp now holds the replaced artifact
        return
    old = temp.with_name(temp.name[: -len(".tmp")] + ".old")
    os.rename(target, old)
    try:
        os.rename(temp, target)
    except BaseException:
        os.rename(old, target)
        raise
    remove_artifact_files(old)
