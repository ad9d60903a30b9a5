"""Reading a file the user named, and only a regular one, with its size checked first.

A FIFO would block a reader forever, a device file (``/dev/zero``) never ends, and a
directory is not data; a huge file would be read into memory whole. So every file the
tools read from untrusted paths (replay inputs and expected outputs, fixture manifests,
kernel specs, legacy checkpoints) goes through :func:`read_regular_file`: it opens
without blocking, checks the *opened* file's type (no window between a check and the
open), refuses a size beyond the caller's cap or the memory budget, and reads it.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from torch_lattice.memory_budget import check_allocation

__all__ = ["describe_file_type", "names_a_folder", "parse_json", "read_regular_file"]


def describe_file_type(mode: int) -> str:
    """A short name for a non-regular file type (for error messages)."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def nul_byte_error(path: str | os.PathLike[str], name: str) -> str | None:
    """The refusal of a path that holds a NUL byte, naming it as ``name``, or None.
    ``os`` calls would raise a bare "embedded null byte", or ``Path.exists`` say False."""
    text = os.fsdecode(os.fspath(path))
    if "\0" not in text:
        return None
    return f"{name} {text!r} contains a NUL byte, which no file name can hold"


def names_a_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` ends in a separator: ``Path()`` would drop it and name a file, where
    ``open`` or a rename would find the folder it names."""
    return os.fsdecode(os.fspath(path)).endswith(("/", os.sep))


def read_regular_file(path: str | os.PathLike[str], what: str, *,
                      max_bytes: int | None = None, follow_symlinks: bool = True) -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``max_bytes``.

    Args:
        path: the file.
        what: how error messages name it (e.g. ``"--inputs"``, ``"kernel spec"``).
        max_bytes: a cap of the caller's own; the memory budget applies as well.
        follow_symlinks: ``False`` refuses a symbolic link as the last component.

    Raises:
        ValueError: missing, not a regular file, larger than allowed, unreadable, or a
            path holding a NUL byte; the message names ``what`` and the path.
    """
    if (nul := nul_byte_error(path, what)) is not None:
        raise ValueError(nul)
    name = f"{what} {str(path)!r}"
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
        if Path(path).is_symlink():
            raise ValueError(f"{name} is a symbolic link; only regular files are read")
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ValueError(f"{name} does not exist") from None
    except OSError as exc:
        raise ValueError(f"{name} cannot be opened: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{name} is {describe_file_type(info.st_mode)}; only regular "
                             "files are read")
        if max_bytes is not None and info.st_size > max_bytes:
            raise ValueError(f"{name} is {info.st_size} bytes; at most {max_bytes} are read")
        check_allocation(f"reading {name}", info.st_size)
        chunks = []
        left = info.st_size + 1  # one byte more shows a file that grew while read
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise ValueError(f"{name} grew while it was read")
        return b"".join(chunks)
    except OSError as exc:
        raise ValueError(f"{name} cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


class _RepeatedKeyError(Exception):
    """A JSON object repeats a key (not a ValueError, so parse_json tells it apart)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json``'s object hook: ``json.loads`` keeps the last of repeated keys, which
    would silently drop the first entry (a kernel, a case's tolerance, a choice)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKeyError(key)
        out[key] = value
    return out


def parse_json(data: bytes | str, name: str, failure: str) -> Any:
    """``data`` (UTF-8 bytes, or text already decoded) parsed as JSON whose objects
    name each key once.

    Raises:
        ValueError: ``"{name} {failure}: {why}"`` for bytes that are not UTF-8 (no
            UTF-16/32 guessing, as ``json.loads`` of bytes would do), text that is not
            JSON or an integer past Python's digit limit; ``"{name} nests JSON too
            deeply"`` where the nesting would exhaust Python's stack; ``"{name} gives
            the key ... twice"`` for an object that repeats a key.
    """
    try:
        return json.loads(data.decode("utf-8") if isinstance(data, bytes) else data,
                          object_pairs_hook=_refuse_repeated_keys)
    except _RepeatedKeyError as exc:
        raise ValueError(f"{name} gives the key {exc.key!r} twice; list each key once") from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"{name} {failure}: {exc}") from None
    except RecursionError:  # "[[[[..." nested past Python's stack
        raise ValueError(f"{name} nests JSON too deeply") from None
