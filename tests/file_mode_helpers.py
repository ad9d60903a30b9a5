"""The process umask and file permission bits, for the tests that check written files'
modes (``0o666 & ~umask``, what ``open(path, "w")`` gives)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def process_umask(mask: int) -> Iterator[int]:
    """Sets the process umask (inherited by subprocesses) and restores it after."""
    old = os.umask(mask)
    try:
        yield mask
    finally:
        os.umask(old)


def file_mode(path: Path) -> int:
    """The permission bits of path."""
    return stat.S_IMODE(path.stat().st_mode)
