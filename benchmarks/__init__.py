"""Benchmarks of Torch Lattice against plain-PyTorch, dense and optional spconv baselines.

Run from the repository root (the package is not installed, so the root must be on
``sys.path``, which ``python -m`` from there provides)::

    .venv/bin/python -m benchmarks run --suite default

Results go to ``docs/benchmarks/`` as ``results.json``, ``results.md`` and PNG plots.
Benchmarks are never part of the test suite's timing: ``tests/test_benchmarks.py`` only
checks that a tiny run writes its files and that the baselines compute the library's numbers.
"""

__all__: list[str] = []
