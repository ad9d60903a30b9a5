"""Sphinx extension: what autodoc needs to show every public name, and a check.

- custom ops (``torch.library.custom_op`` objects) are shown with the
  signature and docstring of the function they wrap;
- constants are shown with the doc written at their definition, even when a
  package re-exports them (``apigen.page_text`` gives both their directives);
- private dataclass fields are left out of class signatures;
- after reading, every name in every public package's ``__all__`` must have
  become a documented Python object, otherwise the build warns (an error
  under ``-W``).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import apigen
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util import logging

logger = logging.getLogger(__name__)


def _split(name: str) -> tuple[str, str] | None:
    """``package.member`` -> (package, member) when package is a public package."""
    package, _, member = name.rpartition(".")
    if package in apigen.public_packages() and member in apigen.public_names(package):
        return package, member
    return None


def _docstring(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """Replaces a custom op's or a constant's inherited docstring with its own."""
    if not (apigen.is_custom_op(obj) or apigen.is_data(obj)):
        return
    parts = _split(name)
    if parts is None:
        return
    lines[:] = apigen.api_docstring(*parts).splitlines()


def _signature(
    app: Sphinx,
    what: str,
    name: str,
    obj: Any,
    options: Any,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str | None, str | None] | None:
    """A custom op's real signature; a dataclass's signature without private fields.

    Private fields (``_lock=<factory>``) are caches with default factories that
    no caller passes.
    """
    if apigen.is_custom_op(obj):
        try:  # the ops modules use postponed annotations: resolve them
            sig = inspect.signature(obj._init_fn, eval_str=True)
        except (NameError, TypeError, SyntaxError):
            sig = inspect.signature(obj._init_fn)
        ret = sig.return_annotation
        text = str(sig.replace(return_annotation=inspect.Signature.empty))
        return text, None if ret is inspect.Signature.empty else inspect.formatannotation(ret)
    if what != "class" or not signature or "_" not in signature:
        return None
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    public = [p for p in sig.parameters.values() if not p.name.startswith("_")]
    if len(public) == len(sig.parameters):
        return None
    text = str(sig.replace(parameters=public, return_annotation=inspect.Signature.empty))
    return text, return_annotation


def _check_coverage(app: Sphinx, env: BuildEnvironment) -> None:
    """Warns for every public name the reference does not document."""
    documented = set(env.get_domain("py").objects)  # type: ignore[attr-defined]
    for package in apigen.public_packages():
        if package not in documented:
            logger.warning("API reference: package %s has no page", package)
        for name in apigen.public_names(package):
            obj = getattr(importlib.import_module(package), name)
            full = obj.__name__ if inspect.ismodule(obj) else f"{package}.{name}"
            if full not in documented:
                logger.warning("API reference: %s.%s is not documented", package, name)
            elif not apigen.api_docstring(package, name):
                logger.warning("API reference: %s.%s has no docstring", package, name)


def setup(app: Sphinx) -> dict[str, Any]:
    # Before napoleon (priority 500), so that it formats the replaced text.
    app.connect("autodoc-process-docstring", _docstring, priority=400)
    app.connect("autodoc-process-signature", _signature)
    app.connect("env-check-consistency", _check_coverage)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
