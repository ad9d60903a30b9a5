"""Writes the API reference pages: one page per public package.

A package is public when no part of its dotted name starts with ``_`` and it
is not listed in ``INTERNAL``.  Each page is an ``automodule`` with
``:members:``, which documents exactly the package's ``__all__``; a package
added to torch_lattice, or a name added to an ``__all__``, therefore reaches
the reference with no page edit.  ``tests/test_docs_api.py`` checks that every
public name has a docstring and is covered here.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from torch_lattice.atomic_file import atomic_write

ROOT_PACKAGE = "torch_lattice"

# Packages whose public names are all re-exported by their parent, which is
# where users import them from (documenting both would describe each twice).
INTERNAL = frozenset({"torch_lattice.nn.modules"})


def public_packages() -> list[str]:
    """Dotted names of the documented packages, ``torch_lattice`` first."""
    root = importlib.import_module(ROOT_PACKAGE)
    names = [ROOT_PACKAGE]
    for info in pkgutil.walk_packages(root.__path__, prefix=ROOT_PACKAGE + "."):
        parts = info.name.split(".")
        if info.ispkg and not any(p.startswith("_") for p in parts) and info.name not in INTERNAL:
            names.append(info.name)
    return names


def page_text(package: str) -> str:
    """The Markdown source of one package's reference page."""
    # autodoc emits reStructuredText, so the directive runs inside eval-rst.
    return f"# `{package}`\n\n```{{eval-rst}}\n.. automodule:: {package}\n```\n"


def write_pages(folder: Path) -> list[Path]:
    """(Re)writes ``folder/<package>.md`` for every public package.

    Files are rewritten only when their text changes, so that Sphinx does not
    rebuild unchanged pages; pages of packages that no longer exist are removed.
    """
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {folder / f"{name}.md": page_text(name) for name in public_packages()}
    for stale in set(folder.glob("*.md")) - set(wanted):
        stale.unlink()
    for path, text in wanted.items():
        if not path.exists() or path.read_text() != text:
            atomic_write(path, lambda temp, text=text: temp.write_text(text))
    return sorted(wanted)
