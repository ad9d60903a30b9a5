"""Writes the API reference pages: one page per public package.

A package is public when no part of its dotted name starts with ``_`` and it
is not listed in ``INTERNAL``; a module a public package lists in its
``__all__`` gets a page too.  Each page is an ``automodule`` with
``:members:``, which documents exactly the package's ``__all__``; a package
added to torch_lattice, or a name added to an ``__all__``, therefore reaches
the reference with no page edit.  ``tests/project/test_docs_api.py`` checks that every
public name has a docstring and is covered here.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from torch_lattice.atomic_file import atomic_write

ROOT_PACKAGE = "torch_lattice"

# Packages whose public names are all re-exported by their parent, which is
# where users import them from (documenting both would describe each twice).
INTERNAL = frozenset({"torch_lattice.nn.modules"})


def public_packages() -> list[str]:
    """Dotted names of the documented modules, ``torch_lattice`` first.

    Every package whose dotted name has no part starting with ``_`` (except
    ``INTERNAL``), and every module that such a package lists in its
    ``__all__`` (``torch_lattice.artifact.schema``, say).
    """
    root = importlib.import_module(ROOT_PACKAGE)
    names = [ROOT_PACKAGE]
    for info in pkgutil.walk_packages(root.__path__, prefix=ROOT_PACKAGE + "."):
        parts = info.name.split(".")
        if info.ispkg and not any(p.startswith("_") for p in parts) and info.name not in INTERNAL:
            names.append(info.name)
    for package in list(names):
        module = importlib.import_module(package)
        for name in getattr(module, "__all__", ()):
            member = getattr(module, name, None)
            if inspect.ismodule(member) and member.__name__ not in names:
                names.append(member.__name__)
    return names


def public_names(package: str) -> list[str]:
    """The package's ``__all__`` (a public package must define one)."""
    module = importlib.import_module(package)
    names = getattr(module, "__all__", None)
    if names is None:
        raise ValueError(f"public package {package} defines no __all__")
    return list(names)


def is_custom_op(obj: object) -> bool:
    """A ``torch.library.custom_op`` object: documented through the function it wraps."""
    return callable(obj) and hasattr(obj, "_init_fn") and hasattr(obj, "_name")


def is_data(obj: object) -> bool:
    """A constant (tuple, str, number...): documented by a comment at its definition."""
    return not (inspect.ismodule(obj) or inspect.isclass(obj) or callable(obj))


def attribute_doc(module: ModuleType, name: str) -> str:
    """The doc of a module-level assignment ``name = ...``, else ``""``.

    Either ``#:`` comment lines directly above it or a string literal right
    after it, the two forms Sphinx reads.
    """
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return ""
    lines = source.splitlines()
    body = ast.parse(source).body
    for i, node in enumerate(body):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
            continue
        after = body[i + 1] if i + 1 < len(body) else None
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            if isinstance(after.value.value, str):
                return inspect.cleandoc(after.value.value)
        comments = []
        row = node.lineno - 2
        while row >= 0 and lines[row].lstrip().startswith("#:"):
            comments.insert(0, lines[row].lstrip()[2:].strip())
            row -= 1
        return "\n".join(comments)
    return ""


def defining_module(package: str, name: str, obj: object) -> ModuleType:
    """The torch_lattice module whose source assigns ``name`` (re-exports followed)."""
    own = importlib.import_module(package)
    if attribute_doc(own, name):
        return own
    for mod_name, module in sorted(sys.modules.items()):
        if mod_name.startswith(package + ".") and getattr(module, name, None) is obj:
            if attribute_doc(module, name):
                return module
    return own


def api_docstring(package: str, name: str) -> str:
    """The text the reference shows for ``package.name`` (``""``: undocumented)."""
    obj = getattr(importlib.import_module(package), name)
    if inspect.ismodule(obj):
        return inspect.getdoc(obj) or ""
    if is_custom_op(obj):
        return inspect.getdoc(obj._init_fn) or ""  # type: ignore[attr-defined]
    if is_data(obj):
        return attribute_doc(defining_module(package, name, obj), name)
    doc: Any = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    return inspect.cleandoc(doc) if isinstance(doc, str) else ""


def page_text(package: str) -> str:
    """The Markdown source of one package's reference page.

    autodoc's ``automodule`` documents the classes and functions of
    ``__all__``; constants and custom ops get explicit ``autodata`` /
    ``autofunction`` directives (automodule skips a re-exported constant and
    does not recognise a custom op), and automodule is told to leave them out.
    """
    module = importlib.import_module(package)
    explicit = []
    for name in public_names(package):
        obj = getattr(module, name)
        if is_custom_op(obj):
            explicit.append(("autofunction", name))
        elif is_data(obj):
            explicit.append(("autodata", name))
    # autodoc emits reStructuredText, so the directives run inside eval-rst.
    lines = [f"# `{package}`", "", "```{eval-rst}", f".. automodule:: {package}"]
    if explicit:
        lines.append("   :exclude-members: " + ", ".join(name for _, name in explicit))
    for directive, name in explicit:
        lines += ["", f".. {directive}:: {package}.{name}"]
    return "\n".join([*lines, "```", ""])


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
