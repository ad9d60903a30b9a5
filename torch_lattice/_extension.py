"""Checks, before anything imports it, that the compiled core ``torch_lattice._C`` exists.

Python puts the current folder first on ``sys.path``, so a source checkout whose extension
was never built (a plain clone, or the repository root after a non-editable
``pip install .``, which builds the extension into site-packages only) shadows any installed
``torch_lattice``. Without this check the first ``from torch_lattice import _C`` fails with
a bare "cannot import name '_C' from partially initialized module"; this names the folder
and the ways on.
"""

from __future__ import annotations

import importlib.util

__all__: list[str] = []

_PACKAGE = __name__.rpartition(".")[0]

if importlib.util.find_spec(f"{_PACKAGE}._C") is None:
    _folder = importlib.util.find_spec(_PACKAGE).submodule_search_locations[0]
    raise ImportError(
        f"torch_lattice._C (the compiled core) is not built in {_folder}: Python imported "
        "this source checkout, whose extension was never built, rather than an installed "
        "torch_lattice (the folder Python starts in comes first on sys.path). Build it in "
        "place (pip install -e . or python setup.py build_ext --inplace), or run Python "
        "from another folder to use the installed package",
        name=f"{_PACKAGE}._C",
    )
