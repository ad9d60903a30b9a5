"""What the converter's refusal tests share: a refusal's shape (exit status 2, one
``error:`` line naming the rule) and a folder's files, to show nothing was written."""

from __future__ import annotations

from pathlib import Path

import pytest

from torch_lattice.migration import cli


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str) -> None:
    """``convert-checkpoint argv`` exits 2 with one ``error:`` line containing
    ``fragment``."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert fragment in lines[0], lines[0]


def files(folder: Path) -> dict[str, bytes]:
    """The regular files directly in ``folder``, by name, with their bytes."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
