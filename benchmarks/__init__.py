"""Benchmarks of Torch Lattice against plain-PyTorch, dense and optional spconv baselines.

Run from the repository root (``python -m`` puts the root on ``sys.path``)::

    .venv/bin/python -m benchmarks run --suite default

The package is imported from the source tree when it is built there (an in-place build or
an editable install) and from site-packages after ``pip install .`` (see
:mod:`benchmarks.package_path`).

Results go to ``docs/benchmarks/`` as ``results.json``, ``results.md`` and PNG plots.
Benchmarks are never part of the test suite's timing: ``tests/project/test_benchmarks.py``
only checks that a tiny run writes its files and that the baselines compute the library's
numbers.
"""

import sys as _sys
from pathlib import Path as _Path

from benchmarks.package_path import resolve as _resolve

if "torch_lattice" not in _sys.modules:  # nothing to choose once it is imported
    _sys.path[:] = _resolve(_Path(__file__).resolve().parent.parent, _sys.path)

__all__: list[str] = []
