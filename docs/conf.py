"""Sphinx configuration for the Torch Lattice documentation site.

Build with ``scripts/docs.sh`` (warnings are errors).  The pages are the
Markdown files of this folder (myst-parser); the API reference is autodoc,
driven by each public package's ``__all__`` (``apigen.py`` writes the pages,
``api_hooks.py`` shows custom ops and constants and fails the build for any
public name left undocumented); the figures of the concepts page are drawn at
build time by ``figures/support_rules.py``, with the library itself computing
every support.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent


def _use_built_package() -> None:
    """Imports the built ``torch_lattice``: ``python -m sphinx`` run from the repository root
    puts the source tree first on ``sys.path``, which after a non-editable ``pip install .``
    has no ``_C``; the same rule as ``python -m benchmarks`` (benchmarks/package_path.py)."""
    path = ROOT / "benchmarks" / "package_path.py"
    spec = importlib.util.spec_from_file_location("_package_path", path)
    assert spec is not None and spec.loader is not None
    package_path = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(package_path)
    sys.path[:] = package_path.resolve(ROOT, sys.path)


_use_built_package()
sys.path.insert(0, str(DOCS))  # apigen and figures live beside this file

import apigen  # noqa: E402
from figures import support_rules  # noqa: E402

import torch_lattice  # noqa: E402

project = "Torch Lattice"
author = "Torch Lattice contributors"
copyright = "2026, Torch Lattice contributors"
release = torch_lattice.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "api_hooks",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Headings get anchors so that in-page links such as (cuda.md#errors) resolve.
myst_heading_anchors = 4

html_theme = "alabaster"
html_title = "Torch Lattice"
html_theme_options = {
    "description": "Exact sparse 3D convolution for PyTorch",
    "fixed_sidebar": True,
    "page_width": "1100px",
}

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
# Bases are not listed: several are private mix-ins; each class's docstring
# names the torch module or functional it builds on.
autodoc_default_options = {"members": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# Nitpicky mode (-n) checks every cross-reference.  Types that belong to
# torch, numpy and the standard library are documented elsewhere and this
# build links offline (no intersphinx), so only those names are exempt.
nitpick_ignore_regex = [
    ("py:class", r"(torch|numpy|np|safetensors)(\..*)?"),
    ("py:class", r"(collections\.abc|typing|os|pathlib|enum|contextvars|argparse|threading)\..*"),
    ("py:class", r"(Tensor|Module|Parameter|dtype|device|Path|PathLike|Enum|ContextVar)"),
    ("py:class", r"(Sequence|Mapping|Iterable|Iterator|Callable|Generator|Any|Literal|Self)"),
    ("py:class", r"(np\.)?(ndarray|random\.Generator)"),
    ("py:class", r"(NoneType|ellipsis)"),
    # A type variable has no page of its own (CoordinateManager.cached returns what
    # its builder returns).
    ("py:class", r"torch_lattice\.tensor\.V"),
]


def _generate(app: object) -> None:
    apigen.write_pages(DOCS / "api")
    support_rules.draw_all(DOCS / "figures" / "_generated")


def setup(app: object) -> None:
    app.connect("builder-inited", _generate)  # type: ignore[attr-defined]
