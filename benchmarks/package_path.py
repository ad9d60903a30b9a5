"""Which ``torch_lattice`` the benchmarks import when run from the repository root.

``python -m benchmarks`` puts the current folder first on ``sys.path``. From the repository
root that folder holds the package's *source* (``torch_lattice/``), which shadows an
installed copy; after a non-editable install (``pip install .``) the source folder has no
built ``_C`` and importing it fails. :func:`resolve` decides, before anything imports
``torch_lattice``:

- the source folder has a built ``_C`` (``setup.py build_ext --inplace``, an editable
  install): it is used, as before;
- it has none, and another ``sys.path`` entry holds an installed ``torch_lattice``: the
  entries that point at the repository root are dropped, so the installed one is imported
  (``benchmarks`` itself is already imported and keeps working);
- neither: :class:`PackageNotBuilt` says how to build or install it.
"""

from __future__ import annotations

import importlib.machinery
import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["PACKAGE", "PackageNotBuilt", "has_built_extension", "resolve"]

PACKAGE = "torch_lattice"


class PackageNotBuilt(ImportError):
    """The source tree's torch_lattice has no ``_C`` and none is installed elsewhere."""


def has_built_extension(package_dir: Path) -> bool:
    """Whether ``package_dir`` holds a compiled ``_C`` for this interpreter."""
    return any(
        (package_dir / f"_C{suffix}").is_file() for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )


def _points_at(entry: str, root: Path, cwd: Path) -> bool:
    """Whether a ``sys.path`` entry is the repository root ('' and '.' mean the cwd)."""
    path = Path(entry) if entry not in ("", ".") else cwd
    if not path.is_absolute():
        path = cwd / path
    try:
        return os.path.samefile(path, root)
    except OSError:
        return False


def resolve(root: Path, sys_path: Sequence[str], cwd: Path | None = None) -> list[str]:
    """The ``sys.path`` to import ``torch_lattice`` with (a new list; input unchanged).

    Args:
        root: The repository root (the folder holding ``benchmarks/``).
        sys_path: The current ``sys.path``.
        cwd: The current folder ('' and '.' entries); defaults to ``Path.cwd()``.

    Raises:
        PackageNotBuilt: the source package would be imported but has no ``_C``, and no
            other entry of ``sys_path`` holds an installed ``torch_lattice``.
    """
    cwd = Path.cwd() if cwd is None else cwd
    source = root / PACKAGE
    path = list(sys_path)
    shadowing = [e for e in path if _points_at(e, root, cwd)]
    if not source.is_dir() or not shadowing or has_built_extension(source):
        return path
    rest = [e for e in path if e not in shadowing]
    for entry in rest:
        base = Path(entry or ".")
        base = base if base.is_absolute() else cwd / base
        if (base / PACKAGE / "__init__.py").is_file():
            return rest
    raise PackageNotBuilt(
        f"{source} has no built _C and no installed {PACKAGE} was found on sys.path: "
        "run 'pip install .' (or 'python setup.py build_ext --inplace') first"
    )
